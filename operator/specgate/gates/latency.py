"""The latency gates (pure): a canary's quantile against the baseline's, from histogram buckets.

The rule is a non-inferiority test on the log ratio of the two tracks' quantiles (P99 by default):
Pass when the ratio's upper bound is within (1 + tolerance), Fail when its lower bound is beyond it,
InsufficientData otherwise, saying about how many samples a track would need.

- **Each track's quantile** is read from its buckets on normal probability paper: inside the bucket
  that holds it, the quantile is interpolated where the line through the bucket's two edges, on the
  axes (log latency, probit of the share at or below), reaches the quantile's level. The counts at
  the edges are exact, so the estimate never leaves its bucket; between them a smooth, heavy-tailed
  shape is assumed instead of Prometheus's flat one (histogram_quantile). On vLLM's default buckets
  (25-50 ms around a GPU P99 of 40 ms) a flat bucket read a 1.2x regression and a 30 % gain alike;
  a line on probability paper follows the counts at both edges. A share of 0 or 1 at an edge (no
  sample beyond it) reads as half a sample.
- **Its sampling error** is Woodruff's: the quantiles read at the ranks q -/+ z * se (se of a rank
  over n samples) bracket it; a wide bucket or few samples widen that bracket. Below
  bounding_samples (524 for a P99 at LOOK_Z) no rank bounds it from above: on buckets no wider than
  the tolerance the top bucket's line is extended to the probit of that level (a Pass may rest on
  it, a Fail never does), on coarser ones the bound stays open. A quantile beyond the last finite
  edge is never a Pass ("add higher buckets").
- **Both tracks' errors combine** on the log ratio: its upper bound adds the canary's upper and the
  baseline's lower half-widths in quadrature (and the reverse for its lower bound).
- **Repeated looks**: the gate is read at every reconcile over the analysis, so its bounds are at
  LOOK_Z (not 1.96): bench/latency.py measures the resulting wrong verdicts over a look every 15 s
  for an hour. At maxAnalysisDuration the gate is read at FINAL_Z (`last_look`: one look, not one
  of many), at COARSE_FINAL_Z where a bucket holding either quantile is wider than the tolerance.

The step stall (vLLM's inter_token_latency_seconds) has one sample per running request per engine
step, so its sample size is the engine's step count (vllm:iteration_tokens_total), not its samples
(step_stall_gate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

from specgate.gates.common import GateResult, Verdict

LOOK_Z = 2.3  # the bound at each look of the analysis (bench/latency.py)
FINAL_Z = NormalDist().inv_cdf(0.95)  # the one last look at maxAnalysisDuration
COARSE_FINAL_Z = NormalDist().inv_cdf(0.975)  # that look where a bucket is wider than the tolerance
_PROBIT = NormalDist()


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


def _bucket(h: Histogram, level: float) -> tuple[float, float, float, float]:
    """(lower edge, upper edge, share at or below each) of the bucket that holds `level`."""
    rank = min(max(level, 0.0), 1.0) * h.total
    lower, lower_count = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts, strict=True):
        if count >= rank and count > lower_count:
            return lower, bound, lower_count / h.total, count / h.total
        lower, lower_count = bound, count
    return lower, math.inf, lower_count / h.total, 1.0


def probit_quantile(h: Histogram, level: float) -> float | None:
    """The quantile at `level` on normal probability paper inside its bucket (module docstring);
    None beyond the last finite edge. Above the slowest sample's edge (a level no rank reaches),
    the line of the top bucket is extended: the tail assumed no heavier than it was below. Linear in
    the first bucket (its lower edge is 0)."""
    if h.total <= 0 or not 0 < level < 1:
        return None
    lower, upper, below, at_upper = _bucket(h, level)
    if math.isinf(upper):
        return None
    if lower <= 0:
        return upper * min(level / at_upper, 1.0)
    half = 0.5 / h.total  # no sample beyond an edge reads as half a sample
    z_low = _PROBIT.inv_cdf(min(max(below, half), 1 - half))
    z_high = _PROBIT.inv_cdf(min(max(at_upper, half), 1 - half))
    if z_high <= z_low:
        return upper
    share = max((_PROBIT.inv_cdf(level) - z_low) / (z_high - z_low), 0.0)
    quantile: float = lower * (upper / lower) ** (share if at_upper >= 1 else min(share, 1.0))
    return quantile


@dataclass(frozen=True)
class TrackQuantile:
    """A track's quantile and its bracket at some z, in seconds. `high` is a rank's (inf where no
    rank reaches it); `extended` is `high`, or where no rank reaches, the top bucket's line extended
    (a Pass may rest on it, a Fail never does)."""

    estimate: float
    low: float
    high: float
    extended: float


def _track_quantile(h: Histogram, q: float, z: float, max_width: float) -> TrackQuantile | None:
    """The quantile and its Woodruff bracket; None where the quantile itself is beyond the last edge.
    The line is extended only across buckets no wider than `max_width` (a log ratio): across a
    coarser one it guesses, not measures."""
    estimate = probit_quantile(h, q)
    if estimate is None or estimate <= 0:
        return None
    se = _quantile_se(q, h.total)
    low = min(probit_quantile(h, max(q - z * se, 0.0)) or 0.0, estimate)
    if q + z * se < 1:
        high = max(probit_quantile(h, q + z * se) or math.inf, estimate)
        return TrackQuantile(estimate, low, high, high)
    top = _probit_level(q, z, h.total)
    extended = None if _any_wider(max_width, top, h) else probit_quantile(h, top)
    return TrackQuantile(estimate, low, math.inf, math.inf if extended is None else max(extended, estimate))


def _probit_level(q: float, z: float, n: float) -> float:
    """The level z standard errors of quantile q's rank above it on the probit scale (the delta
    method), a level below 1 where q + z * se is not."""
    centre = _PROBIT.inv_cdf(q)
    return _PROBIT.cdf(centre + z * _quantile_se(q, n) / _PROBIT.pdf(centre))


def bounding_samples(q: float, z: float) -> int:
    """The fewest samples whose ranks bound quantile q from above at z: q + z * se < 1."""
    return math.floor(z * z * q / (1 - q)) + 1


@dataclass(frozen=True)
class Ratio:
    """The canary's quantile over the baseline's, and its bounds (log half-widths in quadrature)."""

    estimate: float
    lower: float
    upper: float


def _ratio(canary: TrackQuantile, baseline: TrackQuantile) -> Ratio:
    log_ratio = math.log(canary.estimate / baseline.estimate)

    def half(high: float, estimate: float) -> float:
        return math.log(high / estimate) if high > 0 and math.isfinite(high) else math.inf

    up = math.hypot(half(canary.extended, canary.estimate), half(baseline.estimate, baseline.low))
    down = math.hypot(half(canary.estimate, canary.low), half(baseline.high, baseline.estimate))
    return Ratio(math.exp(log_ratio), math.exp(log_ratio - down), math.exp(log_ratio + up))


def latency_gate(
    baseline: Histogram,
    canary: Histogram,
    *,
    figure: str = "P99 ITL",
    quantile: float = 0.99,
    max_regression: float = 0.10,
    min_count: int = 100,
    unit: str = "samples",
    last_look: bool = False,
) -> GateResult:
    """Pass, Fail or InsufficientData for: the canary's quantile is at most (1 + max_regression)
    times the baseline's (module docstring). `figure` names the histogram in messages, `unit` what
    its counts count. The result's estimate and bounds are the ratio's. `last_look`: at
    maxAnalysisDuration, where the bounds are read at FINAL_Z (a single last look, not one of
    many), or at COARSE_FINAL_Z where a bucket holding either quantile is wider than the tolerance
    (its interpolation, not the samples, would otherwise decide a verdict too often)."""
    width = math.log1p(max_regression)
    z = LOOK_Z
    if last_look:
        z = COARSE_FINAL_Z if _any_wider(width, quantile, baseline, canary) else FINAL_Z
    samples = min(baseline.total, canary.total)
    if samples < min_count:
        return GateResult(
            Verdict.INSUFFICIENT_DATA, None, None, None, samples,
            f"{samples:.0f} {figure} {unit} on the smaller track, need {min_count}", samples_needed=min_count,
        )  # fmt: skip
    tracks = {
        name: _track_quantile(h, quantile, z, width)
        for name, h in (("canary", canary), ("baseline", baseline))
    }
    beyond = [name for name, t in tracks.items() if t is None]
    c, b = tracks["canary"], tracks["baseline"]
    if c is None or b is None:
        return GateResult(
            Verdict.INSUFFICIENT_DATA, None, None, None, samples,
            f"{figure}: the {' and '.join(beyond)} quantile lies beyond the last bucket edge "
            f"({_last_finite(canary if beyond[0] == 'canary' else baseline) * 1000:g} ms); add higher buckets",
        )  # fmt: skip
    ratio = _ratio(c, b)
    limit = 1 + max_regression
    figures = (
        f"{figure} canary {c.estimate * 1000:.1f} ms vs baseline {b.estimate * 1000:.1f} ms: ratio "
        f"{ratio.estimate:.3f} [{ratio.lower:.3f}, {_bound(ratio.upper)}] over {samples:.0f} {unit}"
    )
    tolerance = f"{max_regression:.0%}"
    needed: float | None = None
    if ratio.lower > limit:
        verdict, why = Verdict.FAIL, f"more than {tolerance} worse"
    elif ratio.upper <= limit:
        verdict, why = Verdict.PASS, f"within {tolerance}"
    elif math.isinf(ratio.upper):
        needed = _rank_samples_needed(canary, quantile, z)
        verdict, why = Verdict.INSUFFICIENT_DATA, _unbounded(canary, quantile, needed)
    else:
        verdict = Verdict.INSUFFICIENT_DATA
        needed = _samples_needed(ratio, limit, samples)
        told = "" if needed is None else f": at most about {needed:.0f} samples a track tell it at this ratio"
        why = f"cannot tell {tolerance} yet{told}{_coarse(baseline, canary, quantile, width)}"
    at = f" (at maxAnalysisDuration, a last look at {z:.2f} sd)" if last_look else ""
    message = f"{figures}: {why}{at}"
    return GateResult(
        verdict, ratio.estimate, ratio.lower, ratio.upper, samples, message, samples_needed=needed
    )


def _any_wider(width: float, quantile: float, *tracks: Histogram) -> bool:
    """Whether a bucket holding the quantile of any of `tracks` is wider than `width` (a log ratio)."""
    return any(_log_width(h, quantile) > width for h in tracks)


def _coarse(baseline: Histogram, canary: Histogram, quantile: float, width: float) -> str:
    """The buckets, where wider than the tolerance, named for the message ("" where neither is)."""
    if not _any_wider(width, quantile, baseline, canary):
        return ""
    coarse = [f"{name} {_edges_ms(h, quantile)}" for name, h in (("canary", canary), ("baseline", baseline))]
    return f"; buckets wider than the tolerance ({', '.join(coarse)}): finer ones (vLLM --custom-histogram-buckets) tell it sooner"


def _rank_samples_needed(canary: Histogram, quantile: float, z: float) -> int | None:
    """The samples a rank needs to bound the canary's quantile from above, where it has fewer."""
    needed = bounding_samples(quantile, z)
    return needed if canary.total < needed else None


def _unbounded(canary: Histogram, quantile: float, needed: int | None) -> str:
    if needed is not None:
        return f"no rank of {canary.total:.0f} samples bounds a P{quantile * 100:g} from above, need {needed}"
    return f"the canary's bound lies beyond the last bucket edge ({_last_finite(canary) * 1000:g} ms): add higher buckets"


def _bound(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "inf"


def _samples_needed(ratio: Ratio, limit: float, samples: float) -> float | None:
    """How many samples a track needs for a verdict at most, the bracket shrinking as 1/sqrt(n)
    (near the quantile's first rank bound it shrinks faster: an upper estimate); None at the limit."""
    log_ratio, log_limit = math.log(ratio.estimate), math.log(limit)
    distance = abs(log_limit - log_ratio)
    bound = ratio.upper if log_ratio < log_limit else ratio.lower
    if distance <= 0 or not 0 < bound < math.inf:
        return None
    half = abs(math.log(bound / ratio.estimate))
    return samples * (half / distance) ** 2


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
    last_look: bool = False,
) -> GateResult:
    """latency_gate on the ITL histograms counted in engine steps (per_step), where both tracks'
    step counts are known; else on their samples, as if independent, saying so."""
    figure = STALL_FIGURE
    limits = {"max_regression": max_regression, "min_count": min_count, "last_look": last_look}
    if baseline_steps is None or canary_steps is None:
        result = latency_gate(baseline, canary, figure=figure, **limits)  # type: ignore[arg-type]
        missing = " and ".join(
            t for t, n in (("baseline", baseline_steps), ("canary", canary_steps)) if n is None
        )
        why = f"no engine step count for the {missing} (vllm:iteration_tokens_total)"
        return replace(result, message=f"{result.message}; {why}: samples counted as independent")
    return latency_gate(
        per_step(baseline, baseline_steps), per_step(canary, canary_steps), figure=figure,
        unit="samples counted in engine steps", **limits,  # type: ignore[arg-type]
    )  # fmt: skip


def stall_samples(h: Histogram, steps: float | None) -> float:
    """What step_stall_gate counts of `h` against minLatencySamples."""
    return per_step(h, steps).total


def _log_width(h: Histogram, q: float) -> float:
    """How wide, as a log ratio, the bucket holding quantile q is."""
    lower, upper, _, _ = _bucket(h, q)
    return math.log(upper / lower) if lower > 0 else math.inf


def _edges_ms(h: Histogram, q: float) -> str:
    lower, upper, _, _ = _bucket(h, q)
    return f"{lower * 1000:g}-{upper * 1000:g} ms" if math.isfinite(upper) else f"above {lower * 1000:g} ms"


def _last_finite(h: Histogram) -> float:
    return max((b for b in h.bounds if math.isfinite(b)), default=0.0)


def _quantile_se(q: float, n: float) -> float:
    return math.sqrt(q * (1 - q) / n) if n > 0 else 0.0
