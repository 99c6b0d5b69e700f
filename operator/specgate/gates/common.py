"""What every gate shares (pure): verdicts, results, acceptance windows, and the spread
estimators the acceptance test, the drift fit and the guard all use.

Tokens are not independent: one request's drafts share a prompt and drafts accept as a prefix. So
the unit of the acceptance statistics is a time window of the summed counters, and a spread is the
windows' long-run variance (a request outlives a window), never a binomial over tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from statistics import NormalDist

HAC_LAGS = 3  # windows of autocorrelation allowed for (45 s of a long request)


class Verdict(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    INSUFFICIENT_DATA = "InsufficientData"
    METRICS_UNAVAILABLE = "MetricsUnavailable"


def worst(verdicts: Sequence[Verdict]) -> Verdict:
    """Several gates' verdict: Fail, else MetricsUnavailable, else InsufficientData, else Pass."""
    for v in (Verdict.FAIL, Verdict.METRICS_UNAVAILABLE, Verdict.INSUFFICIENT_DATA):
        if v in verdicts:
            return v
    return Verdict.PASS


@dataclass(frozen=True)
class AcceptanceWindow:
    """Increases over one time window, summed over pods and engines."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    end: float | None = field(default=None, compare=False)  # unix seconds, where Prometheus binned it

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
    statistic: float | None = None  # the acceptance test's log-LR, where it ran
    bound: float | None = None  # it passes at +bound and fails at -bound
    samples_needed: float | None = None  # a latency gate's: samples a track needs, where it says


def judged_windows(windows: Sequence[AcceptanceWindow]) -> list[AcceptanceWindow]:
    """The windows acceptance_gate judges (and status.canary reports): usable, with draft tokens."""
    return [w for w in windows if w.usable() and w.draft_tokens > 0]


def long_run_variance(residuals: Sequence[float], max_lag: int = HAC_LAGS) -> float:
    """Per-window variance of the residual sum, autocorrelation included (Newey-West, Bartlett
    weights): a request outlives a window, so neighbouring windows are not independent."""
    m = len(residuals)
    if m < 2:
        return 0.0
    lags = min(max_lag, m - 1)
    gamma = autocovariances(residuals, lags)
    variance = gamma[0] + 2 * sum((1 - lag / (lags + 1)) * gamma[lag] for lag in range(1, lags + 1))
    return max(variance, gamma[0]) * m / (m - 1)


def autocovariances(residuals: Sequence[float], lags: int) -> list[float]:
    """gamma_0 .. gamma_lags of residuals around zero (their own mean is already out of them)."""
    m = len(residuals)
    return [sum(residuals[i] * residuals[i + lag] for i in range(m - lag)) / m for lag in range(lags + 1)]


def variance_upper_bound(variance: float, dof: int, exceeded: float) -> float:
    """A one-sided upper confidence bound of a variance estimated from `dof` degrees of freedom,
    exceeded with probability `exceeded` (chi-square, Wilson-Hilferty). With few windows the plug-in
    variance is too often too small, which would make early looks overconfident; the bound removes
    that and fades as windows grow."""
    k = max(dof, 1)
    z = NormalDist().inv_cdf(exceeded)
    quantile = k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
    return variance * k / max(quantile, 1e-9)


def plug_in_spread(windows: Sequence[AcceptanceWindow]) -> tuple[float, float, float]:
    """(draft tokens, alpha, the residuals' long-run variance per draft token) of `windows` (with
    draft tokens), as estimated, without an allowance for a spread that looks small by chance."""
    n, p, residuals = centred(windows)
    return n, p, long_run_variance(residuals) * len(windows) / n


def centred(windows: Sequence[AcceptanceWindow]) -> tuple[float, float, list[float]]:
    """(draft tokens, alpha, each window's accepted tokens less alpha times its draft tokens)."""
    n = sum(w.draft_tokens for w in windows)
    p = sum(w.accepted_tokens for w in windows) / n
    return n, p, [w.accepted_tokens - p * w.draft_tokens for w in windows]


def binomial_variance(n: float, a: float) -> float:
    """p (1 - p) of a tokens accepted of n, with pseudo-counts: no cancellation at p ~ 1."""
    return (a + 1) / (n + 2) * (n - a + 1) / (n + 2)


def student_t_quantile(p: float, dof: int) -> float:
    """The p-quantile (p >= 0.5) of Student's t with `dof` degrees of freedom, by bisection on its
    closed-form distribution function (Abramowitz and Stegun 26.7.3-4)."""
    low, high = 0.0, 1.0
    while _student_t_cdf(high, dof) < p:
        low, high = high, 2 * high
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _student_t_cdf(mid, dof) < p else (low, mid)
    return (low + high) / 2


def _student_t_cdf(t: float, dof: int) -> float:
    """P(T <= t), t >= 0: (1 + P(|T| <= t)) / 2, the latter a finite sum in cos(theta)^2."""
    theta = math.atan(t / math.sqrt(dof))
    c2 = math.cos(theta) ** 2
    term, total = 1.0, 1.0
    if dof % 2 == 0:
        for k in range(2, dof, 2):  # 1 + c2/2 + 1*3 c2^2/(2*4) + ...
            term *= c2 * (k - 1) / k
            total += term
        inside = math.sin(theta) * total
    elif dof == 1:
        inside = 2 * theta / math.pi
    else:
        for k in range(3, dof, 2):  # 1 + 2 c2/3 + 2*4 c2^2/(3*5) + ...
            term *= c2 * (k - 1) / k
            total += term
        inside = 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    return (1 + inside) / 2
