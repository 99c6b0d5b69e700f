"""The speedup gate (pure): is the canary faster per output token than the baseline, where it serves?

Alpha and P99 latency do not ask what the user pays for: a canary may accept well and still decode
slower per token at this service's load (a verify step costs more at large batches), and a canary
up to 10 % slower per token passes the P99 gate. This gate compares the tracks' mean time per output
token, from vLLM's request_time_per_output_token histogram: its sum and count per window give each
window's exact per-request mean (each request's decode time over its output tokens, averaged over
the requests that finished in the window; not bucket guesses). Speedup S = baseline's mean over the
canary's: 1.10 is a canary 10 % faster per token.

Windows are paired: both tracks serve the same mix at the same time, so a slow swing of the mix
(longer prompts, longer outputs) moves both means together and cancels in their ratio. The
estimate is a ratio of weighted sums, S = sum w_i b_i / sum w_i c_i (b_i, c_i the window's means,
w_i = 1 / (1 / n_b + 1 / n_c), the inverse of the variance of a difference of means of n_b and n_c
requests), and its spread comes from the windows' residuals r_i = w_i (b_i - S c_i): their long-run
(Newey-West) variance, raised to its chi-square upper bound, exactly as the acceptance test takes
its spread (gates.acceptance), so var(S) = m s^2 / N^2 (m windows, N = sum w_i c_i).

The rule is the acceptance test's: Wald's SPRT of S = gate + indifference against S = gate -
indifference, log LR = 2 delta (S - gate) / var(S), with Siegmund's overshoot-corrected bounds
(gates.sprt_bounds) and a normal-mixture confidence sequence for the interval status shows. At
maxAnalysisDuration an undecided test is decided by the estimate's side of the gate when the
estimate is precise enough to say it (`decide_speedup_at_deadline`: the one-sided Student-t bound
on that side within the indifference zone's far edge, as fixed_sample_acceptance_gate decides a
benchmark), else it stays InsufficientData (Inconclusive).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from specgate.gates.acceptance import (
    MIN_WINDOWS,
    SPREAD_ERROR_SHARE,
    confidence_radius,
    sprt_bounds,
    sprt_verdict,
)
from specgate.gates.common import (
    GateResult,
    Verdict,
    long_run_variance,
    student_t_quantile,
    variance_upper_bound,
)

SPEEDUP_INDIFFERENCE = 0.03  # a canary within 3 % of minSpeedup may get either verdict
# A window's ratio known to better than this (relative) is not believed: engines that report the
# same per-token time in every window (a simulator) would otherwise decide on a zero spread.
MIN_RELATIVE_SPREAD = 1e-3
MEAN_KIND = "per-request mean of request_time_per_output_token"


@dataclass(frozen=True)
class PerTokenWindow:
    """One window's increases of request_time_per_output_token_seconds, summed over each track's pods."""

    baseline_seconds: float  # _sum: the finished requests' per-token times, added up
    baseline_requests: float  # _count
    canary_seconds: float
    canary_requests: float
    end: float | None = field(default=None, compare=False)  # unix seconds, where Prometheus binned it

    def usable(self) -> bool:
        """Finite, with a request and a positive time on both tracks (no pair without both)."""
        values = (self.baseline_seconds, self.baseline_requests, self.canary_seconds, self.canary_requests)
        return all(math.isfinite(v) and v > 0 for v in values) and min(values[1], values[3]) >= 1

    @property
    def weight(self) -> float:
        return 1 / (1 / self.baseline_requests + 1 / self.canary_requests)

    @property
    def baseline_mean(self) -> float:
        return self.baseline_seconds / self.baseline_requests

    @property
    def canary_mean(self) -> float:
        return self.canary_seconds / self.canary_requests


@dataclass(frozen=True)
class SpeedupFit:
    """The estimate and its spread over the usable windows."""

    speedup: float
    windows: int
    weighted_canary: float  # N = sum w_i c_i
    window_variance: float  # s^2: the residuals' long-run variance per window, as estimated
    bounded_variance: float  # s^2 raised to its chi-square upper bound, floored

    def variance(self, bounded: bool = True) -> float:
        """var(S) = m s^2 / N^2."""
        s2 = self.bounded_variance if bounded else self.window_variance
        return self.windows * s2 / self.weighted_canary**2


def fit(windows: Sequence[PerTokenWindow], error_rate: float) -> SpeedupFit:
    """S and its spread (module docstring); `windows` must be usable and at least two."""
    a = sum(w.weight * w.baseline_mean for w in windows)
    n = sum(w.weight * w.canary_mean for w in windows)
    speedup = a / n
    residuals = [w.weight * (w.baseline_mean - speedup * w.canary_mean) for w in windows]
    m = len(windows)
    s2 = long_run_variance(residuals)
    floor = (MIN_RELATIVE_SPREAD * a / m) ** 2
    bounded = max(variance_upper_bound(s2, m - 1, error_rate * SPREAD_ERROR_SHARE), floor)
    return SpeedupFit(speedup, m, n, s2, bounded)


def speedup_gate(
    windows: Sequence[PerTokenWindow],
    min_speedup: float,
    *,
    error_rate: float = 0.05,
    indifference: float = SPEEDUP_INDIFFERENCE,
) -> GateResult:
    """Pass, Fail or InsufficientData for S >= min_speedup over every window seen so far: an SPRT of
    S >= min_speedup + indifference against S <= min_speedup - indifference, a wrong verdict about
    error_rate likely at that zone's edges and less beyond them."""
    usable = [w for w in windows if w.usable()]
    requests = sum(w.canary_requests for w in usable)
    if len(usable) < MIN_WINDOWS:
        return GateResult(
            Verdict.INSUFFICIENT_DATA,
            None,
            None,
            None,
            requests,
            f"speedup: {len(usable)} windows with requests on both tracks, need {MIN_WINDOWS}",
        )
    f = fit(usable, error_rate)
    variance = f.variance()
    llr = 2 * indifference * (f.speedup - min_speedup) / variance
    step_sd = 2 * indifference * f.weighted_canary / (f.windows * math.sqrt(f.bounded_variance))
    fail_at, pass_at = sprt_bounds(error_rate, step_sd)
    radius = confidence_radius(math.sqrt(f.bounded_variance), f.windows, error_rate) / f.weighted_canary
    lower, upper = max(f.speedup - radius, 0.0), f.speedup + radius
    figures = (
        f"speedup {f.speedup:.3f} [{lower:.3f}, {upper:.3f}] per output token ({MEAN_KIND}, baseline's "
        f"over canary's) over {len(usable)} windows, {requests:.0f} canary requests: SPRT log-LR {llr:.1f}"
    )
    zone = f"(gate {min_speedup:g} +/- {indifference:g})"
    verdict, where = sprt_verdict(llr, fail_at, pass_at)
    return GateResult(verdict, f.speedup, lower, upper, requests, f"{figures} {where} {zone}", llr, pass_at)


def decide_speedup_at_deadline(
    result: GateResult,
    windows: Sequence[PerTokenWindow],
    min_speedup: float,
    *,
    error_rate: float = 0.05,
    indifference: float = SPEEDUP_INDIFFERENCE,
) -> GateResult:
    """A speedup test still undecided at maxAnalysisDuration: decided by the estimate's side of the
    gate when the one-sided (1 - error_rate) Student-t bound on that side, from the windows' plug-in
    spread, stays within the zone's far edge (|S - gate| + indifference), so that a canary at the
    zone's edge gets the wrong side at most error_rate of the time; else left undecided."""
    if result.verdict != Verdict.INSUFFICIENT_DATA or result.estimate is None:
        return result
    usable = [w for w in windows if w.usable()]
    f = fit(usable, error_rate)
    se = math.sqrt(f.variance(bounded=False))
    radius = student_t_quantile(1 - error_rate, f.windows - 1) * se
    where = f"one-sided bound +/-{radius:.3f} at {1 - error_rate:.0%}"
    if radius > abs(f.speedup - min_speedup) + indifference:
        return replace(result, message=f"{result.message}; at maxAnalysisDuration still undecided ({where})")
    above = f.speedup >= min_speedup
    return replace(
        result,
        verdict=Verdict.PASS if above else Verdict.FAIL,
        message=f"{result.message}; decided at maxAnalysisDuration by the estimate's side of the gate "
        f"({'at or above' if above else 'below'} {min_speedup:g}; {where})",
    )
