"""Benchmark measurement (pure): the driver's arguments, reading its report, and the verdict.

A benchmark Job runs `vllm bench serve` (see bench_driver.py) against one track at each
concurrency point and reports a summary per point. The gates apply at the production concurrency
(gate_point); every point is compared and the break-even concurrency recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from specgate.api import (
    Benchmark,
    BenchmarkPoint,
    BenchmarkStatus,
    Dataset,
    Gates,
    MeasurementMode,
    PointComparison,
    SpeculativeDeploymentSpec,
)
from specgate.gates import (
    MIN_WINDOWS,
    AcceptanceWindow,
    GateResult,
    Verdict,
    fixed_sample_acceptance_gate,
    judged_windows,
)

RESULT_DIR = "/tmp/specgate-bench"
# The benchmark's alpha and Prometheus' may differ by rounding and by the few scrapes at the
# Job's edges; more than this is reported as a disagreement.
ALPHA_TOLERANCE = 0.02


class BenchmarkFailed(Exception):
    """The benchmark produced no usable result; the message says why."""


def driver_config(spec: SpeculativeDeploymentSpec, base_url: str) -> dict[str, Any]:
    """SPECGATE_BENCH_CONFIG for bench_driver: the points and the flags common to them."""
    bench = spec.rollout.benchmark
    args = [
        "--backend", "openai", "--endpoint", "/v1/completions", "--base-url", base_url,
        "--model", spec.served_name, "--tokenizer", spec.target.name,
        "--dataset-name", bench.dataset.value, "--num-prompts", str(bench.num_prompts),
        "--output-len", str(bench.output_len), "--seed", str(bench.seed),
        "--temperature", str(bench.temperature),
        "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
        "--ignore-eos", "--disable-tqdm", "--ready-check-timeout-sec", "120",
        "--save-result", "--result-dir", RESULT_DIR,
    ]  # fmt: skip
    if bench.dataset == Dataset.RANDOM:
        args += ["--input-len", str(bench.input_len)]
    if bench.dataset_path is not None:
        args += ["--dataset-path", bench.dataset_path]
    if bench.request_rate is not None:
        args += ["--request-rate", str(bench.request_rate)]
    return {"points": list(bench.concurrency), "args": args}


def parse_report(message: str | None, expected: list[int]) -> list[BenchmarkPoint]:
    """The points of a finished Job's termination message; BenchmarkFailed if any is missing."""
    if not message:
        raise BenchmarkFailed("the benchmark pod left no termination message")
    try:
        report = json.loads(message)
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
        if report.get("error"):
            raise BenchmarkFailed(f"the benchmark failed: {report['error']}")
        points = [_point(raw) for raw in report.get("points", [])]
    except (ValueError, TypeError, ValidationError) as exc:
        raise BenchmarkFailed(f"unreadable benchmark result ({exc}): {message[:200]!r}") from exc
    missing = sorted(set(expected) - {p.concurrency for p in points})
    if missing:
        raise BenchmarkFailed(f"the benchmark reported no result for concurrency {missing}")
    return points


def _point(raw: dict[str, Any]) -> BenchmarkPoint:
    percent = raw.get("acceptance_rate_percent")  # vLLM reports a percentage
    return BenchmarkPoint.model_validate(
        {
            **{k: v for k, v in raw.items() if k != "acceptance_rate_percent"},
            "acceptance_rate": None if percent is None else round(float(percent) / 100, 4),
        }
    )


def check_failures(points: list[BenchmarkPoint], bench: Benchmark) -> None:
    """BenchmarkFailed when a point lost more requests than max_failed_requests allows."""
    for p in points:
        total = (p.completed or 0) + (p.failed or 0)
        if total == 0 or (p.failed or 0) / total > bench.max_failed_requests:
            raise BenchmarkFailed(
                f"{p.failed or 0} of {total} requests failed at concurrency {p.concurrency} "
                f"(maxFailedRequests {bench.max_failed_requests})"
            )


@dataclass(frozen=True)
class Comparison:
    points: list[PointComparison]
    gate: PointComparison
    break_even: int | None


def compare(
    baseline: list[BenchmarkPoint], canary: list[BenchmarkPoint], bench: Benchmark, limits: Gates
) -> Comparison:
    """Baseline against canary at every point; the latency gates per point."""
    by_concurrency = {p.concurrency: p for p in baseline}
    rows = [_compare_point(by_concurrency[c.concurrency], c, limits) for c in canary]
    rows.sort(key=lambda r: r.concurrency)
    faster = [r.concurrency for r in rows if r.speedup is not None and r.speedup > 1]
    gate = next(r for r in rows if r.concurrency == bench.gate_point())
    return Comparison(rows, gate, max(faster) if faster else None)


def _within(base: float | None, cand: float | None, tolerance: float) -> bool:
    return base is not None and cand is not None and cand <= base * (1 + tolerance)


def _compare_point(base: BenchmarkPoint, cand: BenchmarkPoint, limits: Gates) -> PointComparison:
    """Pass when the P99 per-token latency (TPOT) and the P99 step stall (ITL) are within their
    tolerances: the benchmark reports exact percentiles, no buckets to allow for."""
    passed = _within(base.p99_tpot_ms, cand.p99_tpot_ms, limits.max_p99_per_token_regression) and _within(
        base.p99_itl_ms, cand.p99_itl_ms, limits.max_p99_itl_regression
    )
    speedup = None
    if base.mean_tpot_ms and cand.mean_tpot_ms:
        speedup = round(base.mean_tpot_ms / cand.mean_tpot_ms, 3)
    return PointComparison(
        concurrency=cand.concurrency,
        baseline_p99_itl_ms=base.p99_itl_ms,
        canary_p99_itl_ms=cand.p99_itl_ms,
        baseline_p99_tpot_ms=base.p99_tpot_ms,
        canary_p99_tpot_ms=cand.p99_tpot_ms,
        baseline_output_throughput=base.output_throughput,
        canary_output_throughput=cand.output_throughput,
        speedup=speedup,
        verdict=(Verdict.PASS if passed else Verdict.FAIL).value,
    )


@dataclass(frozen=True)
class Evaluation:
    """The gates applied to both tracks' benchmarks, and what status records of them."""

    status: BenchmarkStatus
    acceptance: GateResult
    latency: GateResult
    disagreement: str | None  # a Warning when the two alphas differ by more than ALPHA_TOLERANCE


def evaluate(
    spec: SpeculativeDeploymentSpec,
    runs: BenchmarkStatus,
    prometheus: tuple[AcceptanceWindow, ...] | None,
    served: float | None = None,
) -> Evaluation:
    """Gate the canary's benchmark against the baseline's at the production concurrency.

    Alpha is judged over the windows of the canary's Prometheus counters during the Job (all its
    pods), with the spec's gates and errorRate as in traffic mode, but by a fixed-sample test
    (gates.fixed_sample_acceptance_gate): a benchmark is one run, read once when it is done. No more
    windows will come, so a test it leaves undecided is BenchmarkFailed naming what to
    change, not a wait until maxAnalysisDuration. The benchmark's own alpha (one pod's /metrics,
    read through the Service) is one figure per concurrency point, with no per-window counters and
    the same prompts at every point: it has no spread to judge from, so without Prometheus windows
    the acceptance is not judged (BenchmarkFailed); with them it is kept in status, and a
    disagreement is reported, not hidden.
    """
    if runs.baseline is None or runs.canary is None:
        raise ValueError("evaluate needs both tracks' benchmarks")
    _check_only_the_job_served(spec, runs.canary.points, served)
    gates_spec, bench = spec.rollout.gates, spec.rollout.benchmark
    comparison = compare(runs.baseline.points, runs.canary.points, bench, gates_spec)
    bench_alpha = _benchmark_alpha(runs.canary.points)
    windows = prometheus or ()
    judged = len(judged_windows(windows))
    if not judged:
        raise _no_windows(bench_alpha)
    acceptance = _acceptance(windows, judged, gates_spec)
    prom_alpha = round(acceptance.estimate or 0.0, 4)  # a judged window has draft tokens: never None
    point = comparison.gate
    latency = GateResult(
        Verdict(point.verdict),
        point.canary_p99_itl_ms, None, None, 0,
        f"benchmark at concurrency {point.concurrency}: canary P99 per-token latency "
        f"{point.canary_p99_tpot_ms} ms vs baseline {point.baseline_p99_tpot_ms} ms (tolerance "
        f"{gates_spec.max_p99_per_token_regression:.0%}), P99 ITL {point.canary_p99_itl_ms} ms vs "
        f"{point.baseline_p99_itl_ms} ms (tolerance {gates_spec.max_p99_itl_regression:.0%})",
    )  # fmt: skip
    difference = None if bench_alpha is None else round(abs(bench_alpha - prom_alpha), 4)
    disagreement = None
    if difference is not None and difference > ALPHA_TOLERANCE:
        disagreement = (
            f"the benchmark's alpha {bench_alpha:.3f} and Prometheus' {prom_alpha:.3f} differ by "
            f"{difference:.3f} (> {ALPHA_TOLERANCE}); the gate used Prometheus'"
        )
    status = runs.model_copy(
        update={
            "points": comparison.points,
            "gate_concurrency": point.concurrency,
            "break_even_concurrency": comparison.break_even,
            "alpha": prom_alpha,
            "benchmark_alpha": bench_alpha,
            "prometheus_alpha": prom_alpha,
            "alpha_disagreement": difference,
        }
    )
    return Evaluation(status, acceptance, latency, disagreement)


MORE_DRAFTS = "raise rollout.benchmark.numPrompts or outputLen"


def _acceptance(windows: tuple[AcceptanceWindow, ...], judged: int, limits: Gates) -> GateResult:
    """The acceptance gate's Pass or Fail over the Job's windows (`judged` of them have drafts), a
    fixed sample read once; BenchmarkFailed saying why when it cannot decide."""
    result = fixed_sample_acceptance_gate(windows, limits)
    if result.verdict != Verdict.INSUFFICIENT_DATA:
        return replace(result, message=f"Prometheus counters over the Job: {result.message}")
    if result.samples < limits.min_drafts:
        raise BenchmarkFailed(
            f"only {result.samples:.0f} drafts in the canary's benchmark (minDrafts {limits.min_drafts}): "
            f"{MORE_DRAFTS}"
        )
    if judged < MIN_WINDOWS:
        raise BenchmarkFailed(
            f"the canary's benchmark drafted in only {judged} windows of its counters and the acceptance "
            f"statistics need {MIN_WINDOWS} (a window, not a token, is their unit): {MORE_DRAFTS} for a "
            "longer run"
        )
    raise BenchmarkFailed(
        f"the benchmark's {result.samples:.0f} drafts over {judged} windows cannot tell alpha "
        f"{result.estimate:.3f} [{result.lower:.3f}, {result.upper:.3f}] from the gate "
        f"{limits.min_acceptance_rate:g} +/- {limits.indifference:g} at errorRate {limits.error_rate:g}, "
        f"and a benchmark brings no more windows: {MORE_DRAFTS} (or widen gates.indifference)"
    )


def _no_windows(bench_alpha: float | None) -> BenchmarkFailed:
    """Why there is nothing to judge: no alpha at all, or only the benchmark's, which has no spread."""
    if bench_alpha is None:
        return BenchmarkFailed(
            "no acceptance rate: the canary's Prometheus counters had no drafts over the Job and the "
            "benchmark reported none (vLLM before 0.11 does not)"
        )
    return BenchmarkFailed(
        f"the benchmark reported alpha {bench_alpha:.3f}, but the canary's Prometheus counters over the "
        "Job had no drafts; the benchmark's own figure, one per concurrency point "
        "with no per-window counters, has no spread to judge the acceptance gate from: give the operator "
        "a Prometheus that scrapes the canary (rollout.metrics.prometheusUrl or --prometheus-url)"
    )


# Requests a benchmark sends besides the ones it reports: vLLM's test prompt before each run.
UNREPORTED_REQUESTS_PER_POINT = 2


def _check_only_the_job_served(
    spec: SpeculativeDeploymentSpec, points: list[BenchmarkPoint], served: float | None
) -> None:
    """In measurement `benchmark` the canary's alpha must be the Job's: BenchmarkFailed when the
    canary's pods finished clearly more requests over the Job's run than the Job sent (production
    traffic reached them, and its drafts are in the counters too). `both` leaves the Job out of the
    traffic windows instead, and does not need this."""
    if spec.rollout.measurement != MeasurementMode.BENCHMARK or served is None:
        return
    sent = sum((p.completed or 0) + (p.failed or 0) for p in points)
    allowance = UNREPORTED_REQUESTS_PER_POINT * len(points)
    if served > sent + allowance:
        raise BenchmarkFailed(
            f"the canary finished {served:.0f} requests during its benchmark, which sent {sent}: other "
            "traffic reached the canary, so its alpha is not the benchmark's; keep production traffic "
            "off the Service while benchmarking, or use measurement: both (the traffic windows leave "
            "the Job out)"
        )


def _benchmark_alpha(points: list[BenchmarkPoint]) -> float | None:
    """Alpha over all points, weighted by their drafts where the benchmark counted them."""
    rated = [p for p in points if p.acceptance_rate is not None]
    if not rated:
        return None
    drafts = sum(p.drafts or 0 for p in rated)
    if drafts:
        return round(sum(p.acceptance_rate * (p.drafts or 0) for p in rated if p.acceptance_rate) / drafts, 4)
    return round(sum(p.acceptance_rate or 0.0 for p in rated) / len(rated), 4)
