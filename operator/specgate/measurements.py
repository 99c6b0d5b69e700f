"""A track's figures as status keeps them (api.Measurement, api.Recommendation), and the baseline's
stored figures read back for the latency gates when it is not measured beside the canary."""

from __future__ import annotations

import math
from datetime import datetime

from specgate import gates, planning
from specgate.api import Measurement, Recommendation, iso
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
        window_end=iso(now),
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
    per_position = [round(a / drafts, 4) for a in metrics.accepted_per_position] if drafts else []
    return measurement(metrics, now).model_copy(
        update={
            "alpha": None if acceptance.estimate is None else round(acceptance.estimate, 4),
            "alpha_lower": None if acceptance.lower is None else round(acceptance.lower, 4),
            "alpha_upper": None if acceptance.upper is None else round(acceptance.upper, 4),
            "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
            "acceptance_per_position": per_position,
            "drafts": drafts,
            "itl_bucket_bounds": [],
            "itl_bucket_counts": [],
            "per_token_bucket_bounds": [],
            "per_token_bucket_counts": [],
        }
    )


def recommendation(
    metrics: TrackMetrics, baseline_mean_itl_ms: float | None, k: int
) -> Recommendation | None:
    """The draft length with the best expected speedup, from the canary's per-position acceptance;
    costed by the measured step times (the canary's mean ITL at draft length k over the baseline's)
    where both are known, else by the default GPU cost model."""
    drafts = sum(w.drafts for w in gates.judged_windows(metrics.acceptance))
    concurrency = max(round(metrics.concurrency or 1), 1)
    cost, costed = None, "default GPU step costs"
    if metrics.mean_itl_ms and baseline_mean_itl_ms:
        step_ratio = metrics.mean_itl_ms / baseline_mean_itl_ms
        cost = planning.CostModel.measured(step_ratio, k, concurrency)
        costed = f"a step at K={k} measured {step_ratio:.2f}x a plain one"
    advice = planning.recommend_k(metrics.accepted_per_position, drafts, cost, concurrency=concurrency)
    if advice is None:
        return None
    return Recommendation(
        num_speculative_tokens=advice.k,
        expected_speedup=advice.expected_speedup,
        message=f"{advice.message}; {costed}",
    )
