"""Gate verdicts and their statistics (pure).

Acceptance. Tokens are not independent: one request's drafts share a prompt and drafts accept as a
prefix. So the unit is a time window of the summed counters (drafts, draft tokens, accepted tokens
over e.g. 15 s across all pods), and the spread comes from the windows' residuals
x_i = a_i - gate * n_i (a_i accepted, n_i draft tokens), never from a binomial over tokens.

The question is one-sided with a tolerance: is alpha (sum a / sum n) at least the gate? A canary
within `indifference` (delta) of the gate is as good as at it, so the rule is Wald's sequential
probability ratio test of H1 alpha >= gate + delta against H0 alpha <= gate - delta, which needs far
fewer windows than a two-sided interval that has to shrink until it clears the gate. Windows are
Gaussian in the quasi-likelihood sense, x_i ~ N(+-delta * n_i, s^2 * n_i), so

    log LR = sum 2 * delta * n_i * x_i / (s^2 * n_i) = 2 * delta * (A - gate * N) / s^2

(A, N: the sums). Pass when log LR >= log((1 - e) / e), Fail when it is <= log(e / (1 - e)), with
e = error_rate for both wrong verdicts (a wrong Pass and a wrong Fail cost alike: the guard watches
after promotion, a rollback can be retried); otherwise InsufficientData. The rule is called again
at every reconcile with every window so far, which is what an SPRT is built for.

s^2 is not known: it is re-estimated at each look and taken conservatively, because an SPRT stops
exactly when the spread happens to look small. It is the residuals' long-run (Newey-West) window
variance, since a request outlives a window; raised to a chi-square upper bound, which removes
the overconfidence of a few windows and fades as they grow; and never below the binomial variance
of independent tokens (pseudo-counts keep alpha = 1 with no spread honest). The bound is exceeded
with probability e / 4, a level set by simulation (test_gates): acceptance is skewed (bounded at
1, drafts accept as a prefix), so a spread that looks small comes with a mean that looks high: for
e = 5 %, gate 0.8 and low traffic, wrong Passes at alpha = gate - delta were about 6 % with the
bound at e and 4.5 % at e / 2; at e / 4 about 3 %, for a window or so more to a verdict.

Status also reports an interval for alpha: a normal-mixture confidence sequence (Robbins; Howard
et al. 2021) on the residual sum with the same spread, always valid at level 1 - e. It describes
the estimate; the verdict is the SPRT's and may come before the interval clears the gate.

Latency. P99 ITL comes from histogram buckets, so it is known only to a bucket. The canary fails
only when even a low estimate of its quantile (the bucket edge under its quantile at p - z*se)
exceeds a high estimate of the baseline's (the bucket edge over p + z*se) by more than the
tolerance: a regression smaller than a bucket, or within sampling error, is not a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist

# A spread needs a few windows before it means anything. 2 was tried and changes nothing in
# bench/decisions.py: with one degree of freedom the variance bound is unbounded, so two windows
# could decide only when they agree exactly, and that is no evidence of zero spread.
MIN_WINDOWS = 3
SPREAD_ERROR_SHARE = 0.25  # the spread's upper bound is exceeded with probability error_rate * this
HAC_LAGS = 3  # windows of autocorrelation allowed for (45 s of a long request)
TIGHTEST_AT_WINDOWS = 8.0  # m0 (smaller m0 decides sooner but breaks coverage: see test_gates)


class Verdict(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    INSUFFICIENT_DATA = "InsufficientData"
    METRICS_UNAVAILABLE = "MetricsUnavailable"


@dataclass(frozen=True)
class AcceptanceWindow:
    """Increases over one time window, summed over pods and engines."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float

    def usable(self) -> bool:
        values = (self.drafts, self.draft_tokens, self.accepted_tokens)
        return all(math.isfinite(v) and v >= 0 for v in values) and self.accepted_tokens <= self.draft_tokens


@dataclass(frozen=True)
class GateResult:
    verdict: Verdict
    estimate: float | None
    lower: float | None
    upper: float | None
    samples: float
    message: str


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram's bucket increases over a window: cumulative counts per upper bound."""

    bounds: tuple[float, ...]  # ascending `le`, the last is math.inf
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0


# --- acceptance ---


def confidence_radius(
    residual_sd: float, windows: int, error_rate: float, m0: float = TIGHTEST_AT_WINDOWS
) -> float:
    """Half-width of the normal-mixture confidence sequence for the residual sum after `windows`."""
    t = windows + m0
    return residual_sd * math.sqrt(t * math.log(t / (m0 * error_rate**2)))


def long_run_variance(residuals: Sequence[float], max_lag: int = HAC_LAGS) -> float:
    """Per-window variance of the residual sum, autocorrelation included (Newey-West, Bartlett
    weights): a request outlives a window, so neighbouring windows are not independent."""
    m = len(residuals)
    if m < 2:
        return 0.0
    lags = min(max_lag, m - 1)
    gamma = [sum(residuals[i] * residuals[i + lag] for i in range(m - lag)) / m for lag in range(lags + 1)]
    variance = gamma[0] + 2 * sum((1 - lag / (lags + 1)) * gamma[lag] for lag in range(1, lags + 1))
    return max(variance, gamma[0]) * m / (m - 1)


def variance_upper_bound(variance: float, dof: int, exceeded: float) -> float:
    """A one-sided upper confidence bound of a variance estimated from `dof` degrees of freedom,
    exceeded with probability `exceeded` (chi-square, Wilson-Hilferty). With few windows the plug-in
    variance is too often too small, which would make early looks overconfident; the bound removes
    that and fades as windows grow."""
    k = max(dof, 1)
    z = NormalDist().inv_cdf(exceeded)
    quantile = k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
    return variance * k / max(quantile, 1e-9)


def residual_variance(windows: Sequence[AcceptanceWindow], error_rate: float) -> float:
    """s^2: the residuals' variance per draft token (the residual sum over N tokens has variance
    s^2 * N), taken conservatively as the module docstring says. `windows` must hold draft tokens."""
    n = sum(w.draft_tokens for w in windows)
    a = sum(w.accepted_tokens for w in windows)
    m = len(windows)
    alpha = a / n
    residuals = [w.accepted_tokens - alpha * w.draft_tokens for w in windows]
    spread = variance_upper_bound(long_run_variance(residuals), m - 1, error_rate * SPREAD_ERROR_SHARE)
    binomial = (a + 1) / (n + 2) * (n - a + 1) / (n + 2)  # p * (1 - p), no cancellation at p ~ 1
    return max(spread * m / n, binomial)


def acceptance_interval(
    windows: Sequence[AcceptanceWindow], error_rate: float
) -> tuple[float, float, float] | None:
    """(alpha, lower, upper), always valid at level 1 - error_rate; None without draft tokens."""
    n = sum(w.draft_tokens for w in windows)
    a = sum(w.accepted_tokens for w in windows)
    if not (0 < n < math.inf and 0 <= a < math.inf):
        return None
    alpha = a / n
    m = len(windows)
    sd = math.sqrt(residual_variance(windows, error_rate) * n / m)  # of one window's residual
    radius = confidence_radius(sd, m, error_rate) / n
    return alpha, max(alpha - radius, 0.0), min(alpha + radius, 1.0)


def wald_bounds(error_rate: float) -> tuple[float, float]:
    """(Fail at or below, Pass at or above) for the log likelihood ratio: Wald's bounds
    log(beta / (1 - alpha)) and log((1 - beta) / alpha) with alpha = beta = error_rate."""
    return math.log(error_rate / (1 - error_rate)), math.log((1 - error_rate) / error_rate)


def sprt_log_lr(
    windows: Sequence[AcceptanceWindow], gate: float, indifference: float, error_rate: float
) -> float:
    """log LR of alpha = gate + indifference against alpha = gate - indifference (module docstring);
    `windows` must hold draft tokens."""
    n = sum(w.draft_tokens for w in windows)
    a = sum(w.accepted_tokens for w in windows)
    return 2 * indifference * (a - gate * n) / residual_variance(windows, error_rate)


def acceptance_gate(
    windows: Sequence[AcceptanceWindow],
    min_rate: float,
    *,
    min_drafts: int = 200,
    error_rate: float = 0.05,
    indifference: float = 0.05,
) -> GateResult:
    """Pass, Fail or InsufficientData for alpha >= min_rate over every window seen so far: an SPRT of
    alpha >= min_rate + indifference against alpha <= min_rate - indifference: a wrong verdict is
    about error_rate likely at the edges of that zone and less beyond them; inside it either verdict
    is acceptable."""
    usable = [w for w in windows if w.usable() and w.draft_tokens > 0]
    dropped = sum(1 for w in windows if not w.usable())
    note = f" ({dropped} windows with NaN or negative increases dropped)" if dropped else ""
    drafts = sum(w.drafts for w in usable)
    interval = acceptance_interval(usable, error_rate)
    if interval is None or drafts < min_drafts or len(usable) < MIN_WINDOWS:
        return GateResult(
            Verdict.INSUFFICIENT_DATA,
            interval[0] if interval else None,
            None,
            None,
            drafts,
            f"{drafts:.0f} drafts in {len(usable)} windows, need {min_drafts} drafts and {MIN_WINDOWS} windows{note}",
        )
    alpha, lower, upper = interval
    llr = sprt_log_lr(usable, min_rate, indifference, error_rate)
    fail_at, pass_at = wald_bounds(error_rate)
    figures = f"alpha {alpha:.3f} [{lower:.3f}, {upper:.3f}] over {drafts:.0f} drafts: SPRT log-LR {llr:.1f}"
    zone = f"(gate {min_rate:g} +/- {indifference:g}){note}"
    if llr >= pass_at:
        return GateResult(Verdict.PASS, alpha, lower, upper, drafts, f"{figures} >= {pass_at:.1f} {zone}")
    if llr <= fail_at:
        return GateResult(Verdict.FAIL, alpha, lower, upper, drafts, f"{figures} <= {fail_at:.1f} {zone}")
    return GateResult(
        Verdict.INSUFFICIENT_DATA,
        alpha,
        lower,
        upper,
        drafts,
        f"{figures} within ({fail_at:.1f}, {pass_at:.1f}) {zone}",
    )


# --- latency ---


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


def latency_gate(
    baseline: Histogram,
    canary: Histogram,
    *,
    quantile: float = 0.99,
    max_regression: float = 0.10,
    min_count: int = 100,
    z: float = 1.96,
) -> GateResult:
    """Fail only on a regression larger than the tolerance, one bucket and sampling error together."""
    samples = min(baseline.total, canary.total)
    if samples < min_count:
        return GateResult(
            Verdict.INSUFFICIENT_DATA, None, None, None, samples,
            f"{samples:.0f} ITL samples on the smaller track, need {min_count}",
        )  # fmt: skip
    base_q = histogram_quantile(baseline, quantile) or 0.0
    canary_q = histogram_quantile(canary, quantile) or 0.0
    canary_low = _bucket_edges(canary, quantile - z * _quantile_se(quantile, canary.total))[0]
    base_high = _bucket_edges(baseline, quantile + z * _quantile_se(quantile, baseline.total))[1]
    limit = base_high * (1 + max_regression)
    pct = round(quantile * 100)
    figures = f"P{pct} ITL canary {canary_q * 1000:.1f} ms vs baseline {base_q * 1000:.1f} ms"
    if canary_low > limit:
        return GateResult(
            Verdict.FAIL, canary_q, canary_low, None, samples,
            f"{figures}: canary at least {canary_low * 1000:.0f} ms > {limit * 1000:.1f} ms "
            f"(baseline up to {base_high * 1000:.0f} ms + {max_regression:.0%})",
        )  # fmt: skip
    return GateResult(
        Verdict.PASS, canary_q, canary_low, None, samples,
        f"{figures}: within {max_regression:.0%} at bucket resolution",
    )  # fmt: skip


def _quantile_se(q: float, n: float) -> float:
    return math.sqrt(q * (1 - q) / n) if n > 0 else 0.0
