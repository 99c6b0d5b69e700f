"""The latency gates (pure): a canary's quantile against the baseline's, from histogram buckets.

Quantiles come from histogram buckets and are interpolated inside a bucket as
histogram_quantile does. Each track's quantile is bracketed by interpolating at the ranks
p -/+ z*se (se of a quantile's rank over n samples), so a wide bucket widens the bracket. The canary
fails when even its low estimate exceeds the baseline's high estimate by more than the tolerance,
or when its tail from the baseline's median up is slower by more than the tolerance at a bucket
edge (counts at edges are exact, an interpolated quantile is only a guess inside its bucket),
passes when its high estimate is within the tolerance of the baseline's low estimate, and otherwise
the gate says InsufficientData, naming the bucket edges: a quantile beyond the last finite edge,
or buckets too coarse for the samples so far to tell the tolerance, is never a Pass.

The step stall (vLLM's inter_token_latency_seconds) has one sample per running request per engine
step, so its sample size is the engine's step count (vllm:iteration_tokens_total), not its samples
(step_stall_gate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specgate.gates.common import GateResult, Verdict


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram's bucket increases over a window: cumulative counts per upper bound."""

    bounds: tuple[float, ...]  # ascending `le`, the last is math.inf
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0


def histogram_quantile(h: Histogram, q: float) -> float | None:
    """Prometheus's histogram_quantile: linear inside the bucket, the last finite bound for +Inf."""
    if h.total <= 0 or not 0 <= q <= 1:
        return None
    rank = q * h.total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def _bucket_edges(h: Histogram, q: float) -> tuple[float, float]:
    """The (lower, upper) edges of the bucket that holds quantile q."""
    rank = min(max(q, 0.0), 1.0) * h.total
    lower = 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if count >= rank and count > 0:
            return lower, bound
        lower = bound
    return lower, math.inf


def _bracket(h: Histogram, q: float, z: float) -> tuple[float, float]:
    """(low, high) estimates of quantile q: interpolated at the ranks q -/+ z * se."""
    se = _quantile_se(q, h.total)
    low = histogram_quantile(h, max(q - z * se, 0.0))
    high = histogram_quantile(h, min(q + z * se, 1.0))
    return low or 0.0, high or 0.0


def _edges_ms(h: Histogram, q: float) -> str:
    low, high = _bucket_edges(h, q)
    return f"{low * 1000:g}-{high * 1000:g} ms" if math.isfinite(high) else f"above {low * 1000:g} ms"


def latency_gate(
    baseline: Histogram,
    canary: Histogram,
    *,
    figure: str = "P99 ITL",
    quantile: float = 0.99,
    max_regression: float = 0.10,
    min_count: int = 100,
    z: float = 1.96,
    unit: str = "samples",
    tail_check: bool = True,
) -> GateResult:
    """Pass, Fail or InsufficientData for: the canary's quantile is at most (1 + max_regression)
    times the baseline's (module docstring). `figure` names the histogram in messages, `unit` what
    its counts count; without `tail_check` only the quantiles' brackets decide (step_stall_gate)."""
    samples = min(baseline.total, canary.total)
    if samples < min_count:
        return GateResult(
            Verdict.INSUFFICIENT_DATA, None, None, None, samples,
            f"{samples:.0f} {figure} {unit} on the smaller track, need {min_count}",
        )  # fmt: skip
    canary_q = histogram_quantile(canary, quantile) or 0.0
    base_q = histogram_quantile(baseline, quantile) or 0.0
    canary_low, canary_high = _bracket(canary, quantile, z)
    base_low, base_high = _bracket(baseline, quantile, z)
    se_canary, se_base = (_quantile_se(quantile, h.total) for h in (canary, baseline))
    overflow = [
        track
        for track, h, rank in (
            ("canary", canary, quantile + z * se_canary),
            ("baseline", baseline, quantile - z * se_base),
        )
        if math.isinf(_bucket_edges(h, rank)[1])
    ]
    figures = (
        f"{figure} canary {canary_q * 1000:.1f} ms [{canary_low * 1000:.1f}, {canary_high * 1000:.1f}] vs "
        f"baseline {base_q * 1000:.1f} ms [{base_low * 1000:.1f}, {base_high * 1000:.1f}]"
    )
    tolerance = f"{max_regression:.0%}"
    heavier = _heavier_tail(baseline, canary, quantile, max_regression, z) if tail_check else None
    if heavier is not None:
        return GateResult(
            Verdict.FAIL,
            canary_q,
            canary_low,
            canary_high,
            samples,
            f"{figures}: {heavier} (tolerance {tolerance})",
        )
    if canary_low > base_high * (1 + max_regression):
        return GateResult(
            Verdict.FAIL, canary_q, canary_low, canary_high, samples,
            f"{figures}: more than {tolerance} worse ({canary_low * 1000:.1f} > {base_high * 1000:.1f} ms "
            f"+ {tolerance})",
        )  # fmt: skip
    if overflow:
        return GateResult(
            Verdict.INSUFFICIENT_DATA, canary_q, canary_low, canary_high, samples,
            f"{figures}: the {' and '.join(overflow)} quantile lies beyond the last bucket edge "
            f"({_edges_ms(canary if overflow[0] == 'canary' else baseline, quantile)}); add higher buckets",
        )  # fmt: skip
    if canary_high <= base_low * (1 + max_regression):
        return GateResult(
            Verdict.PASS, canary_q, canary_low, canary_high, samples, f"{figures}: within {tolerance}"
        )
    return GateResult(
        Verdict.INSUFFICIENT_DATA, canary_q, canary_low, canary_high, samples,
        f"{figures}: cannot tell {tolerance} yet with buckets {_edges_ms(canary, quantile)} (canary) and "
        f"{_edges_ms(baseline, quantile)} (baseline) over {samples:.0f} {unit}: more traffic, or finer "
        "buckets (vLLM --custom-histogram-buckets)",
    )  # fmt: skip


STALL_FIGURE = "P99 ITL (step stall)"  # how messages name the step-stall gate's figure


def per_step(h: Histogram, steps: float | None) -> Histogram:
    """`h` with its counts scaled to `steps` samples, its shape (so every quantile) kept: the ITL
    histogram's samples come c at a time, one per running request of an engine step, all alike,
    so a quantile's error is that of `steps` samples, not of c times as many. Unchanged without a
    step count, or where there are fewer samples than steps (each then from a step of its own)."""
    if steps is None or not 0 < steps < h.total:
        return h
    return Histogram(h.bounds, tuple(c * steps / h.total for c in h.counts))


def step_stall_gate(
    baseline: Histogram,
    canary: Histogram,
    baseline_steps: float | None,
    canary_steps: float | None,
    *,
    max_regression: float,
    min_count: int,
) -> GateResult:
    """latency_gate on the ITL histograms counted in engine steps (per_step), where both tracks'
    step counts are known; else on their samples, as if independent, saying so.

    Without the heavier-tail check. tests/unit/test_step_stall.py's histories (8 running, a decode
    and a prefill-chunk mode, a look every 30 s for 10 min, 200 each): counted per sample, with that
    check, 18.5 % of identical canaries failed on 5 % buckets (11 % on vLLM's default ones) and
    about half of those whose steps were uniformly 1.2x longer, under the 1.5x tolerance; counted
    in steps, still 9.5 % (7 %) of the latter, as the check tests each edge from the median up at z,
    at every look, where the prefill mode leaves the distribution flat. The brackets alone failed
    none of either and every stall twice as long, on both kinds of buckets."""
    figure = STALL_FIGURE
    if baseline_steps is None or canary_steps is None:
        result = latency_gate(
            baseline, canary, figure=figure, max_regression=max_regression, min_count=min_count,
            tail_check=False,
        )  # fmt: skip
        missing = " and ".join(
            t for t, n in (("baseline", baseline_steps), ("canary", canary_steps)) if n is None
        )
        why = f"no engine step count for the {missing} (vllm:iteration_tokens_total)"
        return replace(result, message=f"{result.message}; {why}: samples counted as independent")
    return latency_gate(
        per_step(baseline, baseline_steps), per_step(canary, canary_steps), figure=figure,
        max_regression=max_regression, min_count=min_count, unit="samples counted in engine steps",
        tail_check=False,
    )  # fmt: skip


def stall_samples(h: Histogram, steps: float | None) -> float:
    """What step_stall_gate counts of `h` against minLatencySamples."""
    return per_step(h, steps).total


def cdf(h: Histogram, x: float) -> float:
    """The fraction of samples at or below x, linear inside a bucket (histogram_quantile's inverse)."""
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if x <= bound and math.isfinite(bound):
            share = (x - lower_bound) / (bound - lower_bound) if bound > lower_bound else 1.0
            return (lower_count + (count - lower_count) * max(share, 0.0)) / h.total
        lower_bound, lower_count = bound, count
    return lower_count / h.total


def _heavier_tail(
    baseline: Histogram, canary: Histogram, quantile: float, tolerance: float, z: float
) -> str | None:
    """Where, from the baseline's median up to the quantile, the canary is more than `tolerance`
    slower beyond sampling error, read at the canary's bucket edges (exact counts there) against
    the baseline interpolated at edge / (1 + tolerance); None where it nowhere is.

    A quantile interpolated inside a wide bucket can sit near either edge whatever the samples
    did (vLLM's 25-50 ms bucket put a baseline P99 of 33 ms at 48 ms), so comparing P99 alone
    passed 47 % regressions; the counts at the edges below the P99 do not move with that guess."""
    for edge, count in zip(canary.bounds, canary.counts, strict=True):
        if not math.isfinite(edge) or edge / (1 + tolerance) > _last_finite(baseline):
            continue
        level = cdf(baseline, edge / (1 + tolerance))
        if not 0.5 <= level <= quantile:
            continue
        below = count / canary.total
        spread = z * math.sqrt(level * (1 - level) * (1 / canary.total + 1 / baseline.total))
        if below < level - spread:
            return (
                f"{(1 - below):.1%} of the canary's samples exceed {edge * 1000:g} ms, against "
                f"{(1 - level):.1%} of the baseline's above {edge / (1 + tolerance) * 1000:.3g} ms"
            )
    return None


def _last_finite(h: Histogram) -> float:
    return max((b for b in h.bounds if math.isfinite(b)), default=0.0)


def _quantile_se(q: float, n: float) -> float:
    return math.sqrt(q * (1 - q) / n) if n > 0 else 0.0
