"""Issue 61: rollout.measurement switched after the baseline was measured, through the real decide()
and handlers.step: it measures again or goes on, and never raises."""

from __future__ import annotations

import json

import pytest
from tests.unit.handler_fakes import FakeKube, reconcile_step
from tests.unit.rollout_driver import Run, edit, make_spec, metrics, ready

from specgate import kube
from specgate.api import BenchmarkRun, BenchmarkStatus, Phase
from specgate.gates import AcceptanceWindow
from specgate.observation import BenchmarkJob, TrackState
from specgate.rollout import Reason

BENCHMARK = {"concurrency": [1, 8], "numPrompts": 50}


def report(alpha: float | None = None) -> str:
    """A driver's report of both points (the figures of test_benchmark's passing runs)."""
    rate = {} if alpha is None else {"acceptance_rate_percent": alpha * 100, "drafts": 400}
    points = [
        {"concurrency": c, "completed": 50, "failed": 0, "p99_itl_ms": 21.0, "mean_itl_ms": 10.0,
         "p99_tpot_ms": 15.0, "mean_tpot_ms": 10.0, "p99_ttft_ms": 80.0, "output_throughput": 100.0, **rate}
        for c in (1, 8)
    ]  # fmt: skip
    return json.dumps({"points": points})


def finished(name: str, message: str) -> BenchmarkJob:
    return BenchmarkJob(name, exists=True, finished=True, report=message, start=Run().now, end=Run().now)


def windows(alpha: float) -> tuple[AcceptanceWindow, ...]:
    return tuple(AcceptanceWindow(100, 300, 300 * alpha) for _ in range(4))


GONE = TrackState(exists=True)  # a Deployment scaled to 0


# --- defect 1: rollout.measurement switched to benchmark during the analysis ---


def test_a_benchmark_asked_for_mid_analysis_measures_the_baseline_again_and_converges() -> None:
    """traffic -> benchmark in Analyzing, the canary's Job already done: on 1be5013 every reconcile
    raised "evaluate needs both tracks' benchmarks" (the baseline was never benchmarked) and the
    object stayed in Analyzing. The measurement starts over from Baseline instead: the canary goes,
    the baseline's Job (named for the edit's generation) runs, the canary comes back and is judged
    on its own Job, and the rollout promotes."""
    run = Run(make_spec(measurement="traffic", benchmark=BENCHMARK))
    run.to_analyzing()
    edit(run, measurement="benchmark")
    stale = finished("llama-bench-canary-1", report(0.8))
    d = run.step(baseline=ready(1), canary=ready(1), canary_job=stale, canary_job_acceptance=windows(0.8))
    assert (run.phase, run.status.reason) == (Phase.BASELINE, Reason.MEASUREMENT_CHANGED)
    assert "rollout.measurement is benchmark" in (run.status.message or "")
    assert (d.baseline_replicas, d.canary_replicas) == (2, 1)  # the canary goes once the baseline is Ready
    assert run.status.benchmark is None and run.status.rollout_generation == 2
    d = run.step(baseline=ready(2), canary=ready(1))
    assert (d.baseline_replicas, d.canary_replicas) == (2, 0)
    run.step(baseline=ready(2), canary=GONE)  # Ready, no canary pod: the warm-up begins
    d = run.step(
        after=35, baseline=ready(2), canary=GONE, baseline_job=BenchmarkJob("llama-bench-baseline-2")
    )
    assert (d.benchmark_track, run.status.reason) == ("baseline", Reason.RUNNING_BENCHMARK)
    run.step(baseline=ready(2), canary=GONE, baseline_job=finished("llama-bench-baseline-2", report()))
    run.expect(Phase.CANARY)
    run.step(baseline=ready(1), canary=ready(1))
    run.expect(Phase.ANALYZING)
    d = run.step(
        after=40, baseline=ready(1), canary=ready(1), canary_job=BenchmarkJob("llama-bench-canary-2")
    )
    assert (d.benchmark_track, run.phase) == ("canary", Phase.ANALYZING)
    run.step(
        baseline=ready(1),
        canary=ready(1),
        canary_job=finished("llama-bench-canary-2", report(0.8)),
        canary_job_acceptance=windows(0.8),
    )
    assert run.phase == Phase.PROMOTING, run.status.message


@pytest.mark.parametrize("phase", [Phase.CANARY, Phase.ANALYZING])
def test_a_switch_to_both_before_the_verdict_measures_the_baseline_again(phase: Phase) -> None:
    """traffic -> both in Canary or Analyzing lacks the baseline's benchmark just the same."""
    run = Run(make_spec(measurement="traffic", benchmark=BENCHMARK))
    run.to_canary() if phase == Phase.CANARY else run.to_analyzing()
    edit(run, measurement="both")
    run.step(baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8))
    assert (run.phase, run.status.reason) == (Phase.BASELINE, Reason.MEASUREMENT_CHANGED)


def test_a_switch_from_benchmark_to_traffic_goes_on_with_the_analysis() -> None:
    """benchmark -> traffic needs no restart: the baseline is measured beside the canary, and the
    traffic gates decide (the Jobs are no longer read)."""
    run = Run(make_spec(measurement="benchmark", benchmark=BENCHMARK))
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))
    run.step(after=35, baseline=ready(2), baseline_job=BenchmarkJob("llama-bench-baseline-1"))
    run.step(baseline=ready(2), baseline_job=finished("llama-bench-baseline-1", report()))
    run.step(baseline=ready(1), canary=ready(1))
    run.expect(Phase.ANALYZING)
    edit(run, measurement="traffic")
    run.step(
        after=100, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8)
    )
    run.expect(Phase.PROMOTING)


def test_an_object_wedged_by_an_older_operator_reconciles_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The status 1be5013 left: Analyzing in benchmark mode with the canary's run and no baseline's.
    handlers.step returns (no exception), measures again under the edit's generation, and deletes
    every benchmark Job but that generation's (the old canary Job is not read again)."""
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}).install(monkeypatch)
    monkeypatch.setattr(kube, "benchmark_job", lambda owner, name: BenchmarkJob(name))
    run = Run(make_spec(measurement="traffic", benchmark=BENCHMARK))
    run.to_analyzing()
    edit(run, measurement="benchmark")
    canary_only = BenchmarkStatus(canary=BenchmarkRun(job="llama-bench-canary-1", points=[]))
    run.status = run.status.model_copy(update={"benchmark": canary_only, "observed_generation": 2})
    decision = reconcile_step(run, after=10)
    assert (decision.status.phase, decision.status.reason) == (Phase.BASELINE, Reason.MEASUREMENT_CHANGED)
    assert ("delete jobs but", frozenset({"llama-bench-baseline-2", "llama-bench-canary-2"})) in fake.calls
    # The baseline grows back first; the canary keeps its pod until the baseline's new one is Ready.
    assert fake.calls[:2] == [("apply", "Deployment", "llama-baseline", 2), ("scale", "llama-canary", 1)]
