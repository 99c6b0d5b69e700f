"""A track's figures as status keeps them (api.Measurement, api.Recommendation, the latency gates'
api.LatencyGateStatus), and the baseline's stored figures read back for the latency gates when it is
not measured beside the canary."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from specgate import gates, planning
from specgate.api import (
    Gates,
    LatencyGateStatus,
    Measurement,
    Recommendation,
    SpeculativeDeploymentSpec,
    StepCost,
    iso,
)
from specgate.gates import Histogram, Load
from specgate.observation import TrackMetrics


def baseline_histogram(
    beside: TrackMetrics | None, stored: Measurement | None, which: str
) -> Histogram | None:
    """A baseline histogram: measured beside the canary now, else the one stored in status."""
    measured: Histogram | None = getattr(beside, which) if beside is not None else None
    if measured is not None or stored is None:
        return measured
    bounds, counts = (
        (stored.itl_bucket_bounds, stored.itl_bucket_counts)
        if which == "itl"
        else (stored.per_token_bucket_bounds, stored.per_token_bucket_counts)
    )
    return Histogram(bounds=(*bounds, math.inf), counts=tuple(counts)) if bounds else None


def baseline_steps(beside: TrackMetrics | None, stored: Measurement | None) -> float | None:
    """The engine steps behind baseline_histogram(beside, stored, "itl"), from the same source."""
    if beside is not None and beside.itl is not None:
        return beside.engine_steps
    return stored.itl_steps if stored is not None else None


def paired_per_token(baseline: TrackMetrics, canary: TrackMetrics) -> list[gates.PerTokenWindow]:
    """The windows both tracks measured (matched by their end), as the speedup gate pairs them."""
    base = {round(end, 3): (total, count) for end, total, count in baseline.per_token_windows}
    return [
        gates.PerTokenWindow(*base[round(end, 3)], total, count, end=end)
        for end, total, count in canary.per_token_windows
        if round(end, 3) in base
    ]


def stored_load(stored: Measurement | None) -> Load | None:
    if stored is None or stored.pods is None:
        return None
    return Load(stored.pods, stored.requests_per_second_per_pod, stored.running_per_pod)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None or not math.isfinite(seconds) else round(seconds * 1000, 3)


def measurement(metrics: TrackMetrics, now: datetime) -> Measurement:
    itl, per_token, load = metrics.itl, metrics.per_token, metrics.load
    return Measurement(
        window_start=iso(metrics.window_start) if metrics.window_start else None,
        window_end=iso(metrics.window_end or now),
        p99_itl_ms=ms(p99(itl)),
        mean_itl_ms=metrics.mean_itl_ms,
        p99_ttft_ms=metrics.p99_ttft_ms,
        per_token_latency_ms=metrics.per_token_latency_ms,
        p99_per_token_latency_ms=ms(p99(per_token)),
        output_tokens_per_second=metrics.output_tokens_per_second,
        requests_per_second=metrics.requests_per_second,
        concurrency=metrics.concurrency,
        pods=load.pods if load else None,
        requests_per_second_per_pod=load.requests_per_second_per_pod if load else None,
        running_per_pod=load.running_per_pod if load else None,
        scrape_interval_seconds=metrics.scrape_interval_seconds,
        acceptance_window_seconds=metrics.acceptance_window_seconds,
        itl_samples=itl.total if itl else None,
        itl_steps=metrics.engine_steps,
        itl_bucket_bounds=_finite_bounds(itl),
        itl_bucket_counts=list(itl.counts) if itl else [],
        per_token_bucket_bounds=_finite_bounds(per_token),
        per_token_bucket_counts=list(per_token.counts) if per_token else [],
    )


def p99(h: Histogram | None) -> float | None:
    return gates.histogram_quantile(h, 0.99) if h is not None else None


def _finite_bounds(h: Histogram | None) -> list[float]:
    return [b for b in h.bounds if math.isfinite(b)] if h else []


def canary_measurement(metrics: TrackMetrics, acceptance: gates.GateResult, now: datetime) -> Measurement:
    judged = gates.judged_windows(metrics.acceptance)
    drafts = sum(w.drafts for w in judged)
    accepted = sum(w.accepted_tokens for w in judged)
    per_position = _per_position(metrics)
    return measurement(metrics, now).model_copy(
        update={
            "alpha": None if acceptance.estimate is None else round(acceptance.estimate, 4),
            "alpha_lower": None if acceptance.lower is None else round(acceptance.lower, 4),
            "alpha_upper": None if acceptance.upper is None else round(acceptance.upper, 4),
            "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
            "acceptance_per_position": per_position,
            "drafts": drafts,
            "acceptance_log_lr": None if acceptance.statistic is None else round(acceptance.statistic, 3),
            "acceptance_bound": None if acceptance.bound is None else round(acceptance.bound, 3),
            "itl_bucket_bounds": [],
            "itl_bucket_counts": [],
            "per_token_bucket_bounds": [],
            "per_token_bucket_counts": [],
        }
    )


def latency_gate_status(result: gates.GateResult, max_regression: float) -> LatencyGateStatus:
    """A latency gate's result as status keeps it: the ratio and its bounds to 4 decimals (an
    unbounded upper one absent: JSON has no infinity), whole samples, so that an unchanged result
    writes an unchanged status."""
    return LatencyGateStatus(
        verdict=result.verdict.value,
        ratio=_ratio(result.estimate),
        ratio_lower=_ratio(result.lower),
        ratio_upper=_ratio(result.upper),
        tolerance=round(1 + max_regression, 6),
        samples=round(result.samples),
        samples_needed=None if result.samples_needed is None else round(result.samples_needed),
    )


def with_latency_gates(
    canary: Measurement | None, per_token: gates.GateResult, stall: gates.GateResult, limits: Gates
) -> Measurement | None:
    """The canary's status with the per-token and step-stall gates' figures."""
    if canary is None:
        return None
    return canary.model_copy(
        update={
            "per_token_latency_gate": latency_gate_status(per_token, limits.max_p99_per_token_regression),
            "step_stall_gate": latency_gate_status(stall, limits.max_p99_itl_regression),
        }
    )


def _ratio(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def cost_config(spec: SpeculativeDeploymentSpec) -> str:
    """What a step cost depends on apart from K: the target, the engine (image) and the draft."""
    s = spec.speculative
    ref = spec.workload_ref
    target = f"{spec.target.name} {spec.image}" if ref is None else f"deployment/{ref.name}"
    return f"{target} {s.method.value} {s.draft_model or '-'}"


def step_cost(
    spec: SpeculativeDeploymentSpec, metrics: TrackMetrics, baseline_mean_itl_ms: float | None, now: datetime
) -> StepCost | None:
    """The canary's step cost at its draft length, where its and the baseline's mean steps are
    known; None for a canary running a K schedule (its steps mix draft lengths)."""
    k = spec.speculative.num_speculative_tokens
    if not (metrics.mean_itl_ms and baseline_mean_itl_ms) or k <= 0:
        return None
    if spec.speculative.num_speculative_tokens_per_batch_size:
        return None
    return StepCost(
        k=k,
        step_ratio=round(metrics.mean_itl_ms / baseline_mean_itl_ms, 4),
        concurrency=_batch(metrics),
        acceptance_per_position=_per_position(metrics),
        config=cost_config(spec),
        measured_at=iso(now),
    )


def with_cost(costs: Sequence[StepCost], config: str, cost: StepCost | None) -> list[StepCost]:
    """The step costs of `config` (another target, engine or draft costs differently; the list stays
    as short as the draft lengths tried), `cost` replacing its K's: the latest measurement stands."""
    kept = [c for c in costs if c.config == config and (cost is None or c.k != cost.k)]
    return sorted([*kept, *([cost] if cost else [])], key=lambda c: c.k)


def recommendation(
    metrics: TrackMetrics,
    costs: Sequence[StepCost],
    base: planning.CostModel | None = None,
    k_max: int = planning.ADVICE_K_MAX,
) -> Recommendation | None:
    """The draft length with the best expected speedup up to k_max (or the K measured, if longer):
    from the per-position acceptance of the longest draft measured (this canary's, or an earlier
    one's kept with its step cost; positions past it at the last measured conditional rate, as a
    short canary would otherwise cap the advice at its own K), costed by the step costs measured for
    this config (api.StepCost) where there are any, else by the cost model `base` (the accelerator
    and target size the spec names, schedule.cost_model; the default H100 8B one if None), whose
    physics also shapes how the measured costs extend to other K and batch sizes."""
    prefix = max([_per_position(metrics), *(c.acceptance_per_position for c in costs)], key=len)
    cost, costed = priced(costs, base)
    advice = planning.recommend_k(
        prefix, 1.0, cost, concurrency=_batch(metrics), k_max=max(k_max, len(prefix))
    )
    if advice is None:
        return None
    return Recommendation(
        num_speculative_tokens=advice.k,
        expected_speedup=advice.expected_speedup,
        message=f"{advice.message}; {costed}",
    )


def priced(
    costs: Sequence[StepCost], base: planning.CostModel | None
) -> tuple[planning.CostModel | None, str]:
    """The cost model steps are priced by, and how it was chosen: the step costs measured for this
    config where they lie beyond planning.PHYSICS_TOLERANCE of the physics `base` (the spec's
    hardware; the default H100 8B one if None), else `base` itself."""
    if not costs:
        return base, "default GPU step costs"
    steps = [planning.MeasuredStep(c.k, c.step_ratio, c.concurrency) for c in costs]
    ratios = ", ".join(f"K={c.k} {c.step_ratio:.2f}x" for c in costs)
    costed = f"steps measured {ratios} a plain one"
    if planning.within_physics(base or planning.CostModel(), steps):
        return base, f"{costed} (within {planning.PHYSICS_TOLERANCE:.0%} of the physics: priced by it)"
    return planning.CostModel.measured(steps, base), costed


def _per_position(metrics: TrackMetrics) -> list[float]:
    """Accepted tokens per draft at each position, over the judged windows' drafts."""
    drafts = sum(w.drafts for w in gates.judged_windows(metrics.acceptance))
    return [round(a / drafts, 4) for a in metrics.accepted_per_position] if drafts else []


def _batch(metrics: TrackMetrics) -> int:
    return max(round(metrics.concurrency or 1), 1)
