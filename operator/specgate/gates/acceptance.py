"""The acceptance gate (pure): is alpha at least the gate on the canary's traffic?

Tokens are not independent: one request's drafts share a prompt and drafts accept as a
prefix. So the unit is a time window of the summed counters (drafts, draft tokens, accepted tokens
over e.g. 15 s across all pods), and the spread comes from the windows' residuals
x_i = a_i - gate * n_i (a_i accepted, n_i draft tokens), never from a binomial over tokens.

The question is one-sided with a tolerance: is alpha (sum a / sum n) at least the gate? A canary
within `indifference` (delta) of the gate is as good as at it, so the rule is Wald's sequential
probability ratio test of H1 alpha >= gate + delta against H0 alpha <= gate - delta, which needs far
fewer windows than a two-sided interval that has to shrink until it clears the gate. Windows are
Gaussian in the quasi-likelihood sense, x_i ~ N(+-delta * n_i, s^2 * n_i), so

    log LR = sum 2 * delta * n_i * x_i / (s^2 * n_i) = 2 * delta * (A - gate * N) / s^2

(A, N: the sums). Pass when log LR >= log((1 - e) / e) - o, Fail when it is <= log(e / (1 - e)) + o,
with e = error_rate for both wrong verdicts (a wrong Pass and a wrong Fail cost alike: the guard
watches after promotion, a rollback can be retried); otherwise InsufficientData. o is the log LR's
expected overshoot, 0.5826 times the sd of one window's step (Siegmund's corrected boundaries, at
most half of Wald's bound): the test looks once a window, so it stops beyond the bound it crosses,
and Wald's bounds alone give errors well under e (sprt_bounds). The rule is called again at every
reconcile with every window so far, which is what an SPRT is built for.

s^2 is not known: it is re-estimated at each look and taken conservatively, because an SPRT stops
exactly when the spread happens to look small. It is the residuals' long-run (Newey-West) window
variance, since a request outlives a window; raised to a chi-square upper bound, which removes
the overconfidence of a few windows and fades as they grow; and never below the binomial variance
of independent tokens (pseudo-counts keep alpha = 1 with no spread honest). The bound is exceeded
with probability e / 4, a level set by simulation (test_gates): acceptance is skewed (bounded at
1, drafts accept as a prefix), so a spread that looks small comes with a mean that looks high: for
e = 5 %, gate 0.8 and low traffic, wrong Passes at alpha = gate - delta were about 6 % with the
bound at e and 4.5 % at e / 2; at e / 4 about 3 %, for a window or so more to a verdict.
Where hours of the same traffic are at hand (a re-rollout over a steady mix), the spread is not
re-estimated from the canary's first windows but taken from that history's design effect
(history_design_effect: spread per token over p (1 - p)), with no chi-square bound; the canary's own
spread counts where larger. In bench/decisions.py that halves the time to a verdict at 20 windows,
for wrong verdicts at the zone's edges of up to 6.8 % at 3 requests a window (4.1 % from 20 up).

The traffic's mix drifts: the share of easy and hard prompts moves alpha by several points over
minutes. A swing slower than the windows seen so far moves them all together, so no spread
estimated from them can show it, and an SPRT at high traffic decides on the level of the moment:
in bench/decisions.py a drifting mix (alpha +-0.09 over 3 minutes) got 20-30 % wrong verdicts at
the zone's edges. So the variance of the estimate of alpha is s^2 / N plus the variance that an
Ornstein-Uhlenbeck drift of sd `mixDrift` and correlation time `mixDriftTimescale` leaves in an
average over the span seen (`mix_drift_variance`: the full drift at first, 2 tau / T of it after
T >> tau), and the log LR is 2 * delta * (A / N - gate) / that. Near the gate the test then
waits for several swings; far from it the drift does not matter. A benchmark replays a fixed
dataset and has no such drift; it is one sample, read once, so it is judged by a fixed-sample test
instead (fixed_sample_acceptance_gate: a Student t on the windows, no bound for optional stopping).

Status also reports an interval for alpha: a normal-mixture confidence sequence (Robbins; Howard
et al. 2021) on the residual sum with the same spread, always valid at level 1 - e. It describes
the estimate; the verdict is the SPRT's and may come before the interval clears the gate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from specgate.api import Gates
from specgate.gates.common import (
    AcceptanceWindow,
    GateResult,
    Verdict,
    binomial_variance,
    centred,
    judged_windows,
    long_run_variance,
    plug_in_spread,
    student_t_quantile,
    variance_upper_bound,
)
from specgate.gates.drift import MixDrift, mix_drift_variance

# A spread needs a few windows before it means anything. 2 was tried and changes nothing in
# bench/decisions.py: with one degree of freedom the variance bound is unbounded, so two windows
# could decide only when they agree exactly, and that is no evidence of zero spread.
MIN_WINDOWS = 3
SPREAD_ERROR_SHARE = 0.25  # the spread's upper bound is exceeded with probability error_rate * this
# Acceptance is judged per window of at least this many seconds: windows, not single tokens, are
# the units the statistics count (tokens within a request are correlated).
MIN_ACCEPTANCE_WINDOW_SECONDS = 15.0
# Siegmund's rho (1985): a Gaussian random walk stopped on crossing a level ends beyond it by about
# rho times the sd of one step (rho = -zeta(1/2) / sqrt(2 pi) = 0.5826).
OVERSHOOT = 0.5826
TIGHTEST_AT_WINDOWS = 8.0  # m0 (smaller m0 decides sooner but breaks coverage: see test_gates)


def confidence_radius(
    residual_sd: float, windows: int, error_rate: float, m0: float = TIGHTEST_AT_WINDOWS
) -> float:
    """Half-width of the normal-mixture confidence sequence for the residual sum after `windows`."""
    t = windows + m0
    return residual_sd * math.sqrt(t * math.log(t / (m0 * error_rate**2)))


def residual_variance(
    windows: Sequence[AcceptanceWindow], error_rate: float, design_effect: float | None = None
) -> float:
    """s^2: the residuals' variance per draft token (the residual sum over N tokens has variance
    s^2 * N), taken conservatively as the module docstring says; with a traffic's measured design
    effect, the larger of that effect's spread and the windows' own without the chi-square allowance
    (a canary whose requests spread more than the history's still shows it in its windows).
    `windows` must hold draft tokens."""
    if design_effect is None:
        return _per_token_variance(windows, error_rate)
    n, p, own = plug_in_spread(windows)
    return max(design_effect * p * (1 - p), own, binomial_variance(n, p * n))


def _per_token_variance(windows: Sequence[AcceptanceWindow], error_rate: float) -> float:
    """The residuals' long-run variance per window (m - 1 degrees of freedom), raised to its
    chi-square upper bound, per draft token, never below the binomial variance of independent tokens."""
    n, p, residuals = centred(windows)
    m = len(windows)
    spread = variance_upper_bound(long_run_variance(residuals), m - 1, error_rate * SPREAD_ERROR_SHARE)
    return max(spread * m / n, binomial_variance(n, p * n))


def acceptance_interval(
    windows: Sequence[AcceptanceWindow],
    error_rate: float,
    drift_variance: float = 0.0,
    design_effect: float | None = None,
) -> tuple[float, float, float] | None:
    """(alpha, lower, upper) at level 1 - error_rate over all looks while the spread holds (the mix's
    drift included); None without draft tokens."""
    n = sum(w.draft_tokens for w in windows)
    a = sum(w.accepted_tokens for w in windows)
    if not (0 < n < math.inf and 0 <= a < math.inf):
        return None
    alpha = a / n
    m = len(windows)
    sd = n * math.sqrt(mean_variance(windows, error_rate, drift_variance, design_effect) / m)  # one window's
    radius = confidence_radius(sd, m, error_rate) / n
    return alpha, max(alpha - radius, 0.0), min(alpha + radius, 1.0)


def wald_bounds(error_rate: float) -> tuple[float, float]:
    """(Fail at or below, Pass at or above) for the log likelihood ratio: Wald's bounds
    log(beta / (1 - alpha)) and log((1 - beta) / alpha) with alpha = beta = error_rate."""
    return math.log(error_rate / (1 - error_rate)), math.log((1 - error_rate) / error_rate)


def sprt_verdict(llr: float, fail_at: float, pass_at: float) -> tuple[Verdict, str]:
    """The sequential test's verdict for a log-LR against its bounds, and where it stands."""
    if llr >= pass_at:
        return Verdict.PASS, f">= {pass_at:.1f}"
    if llr <= fail_at:
        return Verdict.FAIL, f"<= {fail_at:.1f}"
    return Verdict.INSUFFICIENT_DATA, f"within ({fail_at:.1f}, {pass_at:.1f})"


def sprt_bounds(error_rate: float, step_sd: float) -> tuple[float, float]:
    """Wald's bounds, each moved towards 0 by the log LR's expected overshoot (Siegmund's corrected
    boundaries): Wald's errors hold for a log LR that stops exactly on a bound, but the test looks
    once a window, and a walk whose steps have sd `step_sd` ends beyond the bound it crosses by
    about OVERSHOOT * step_sd, so Wald's bounds give errors well under error_rate (0.7 and 2.6 % at
    the zone's edges at 20 requests a window in bench/decisions.py) and wait longer than the
    errors need. The shift is at most half a bound: the correction is for steps small beside it."""
    fail_at, pass_at = wald_bounds(error_rate)
    shift = min(OVERSHOOT * step_sd, pass_at / 2)
    return fail_at + shift, pass_at - shift


def span_seconds(windows: Sequence[AcceptanceWindow], window_seconds: float) -> float:
    """Seconds from the start of the first window to the end of the last."""
    if windows and windows[0].end is not None and windows[-1].end is not None:
        return windows[-1].end - windows[0].end + window_seconds
    return len(windows) * window_seconds


def mean_variance(
    windows: Sequence[AcceptanceWindow],
    error_rate: float,
    drift_variance: float,
    design_effect: float | None = None,
) -> float:
    """Variance of the estimate of alpha (sum a / sum n) over `windows` (with draft tokens): the
    windows' own spread (s^2 / N) plus what the mix's slow drift adds."""
    n = sum(w.draft_tokens for w in windows)
    return residual_variance(windows, error_rate, design_effect) / n + drift_variance


def sprt_log_lr(
    windows: Sequence[AcceptanceWindow],
    gate: float,
    indifference: float,
    error_rate: float,
    drift_variance: float = 0.0,
    design_effect: float | None = None,
) -> float:
    """log LR of alpha = gate + indifference against alpha = gate - indifference (module docstring),
    the estimate's variance widened by the mix's drift; `windows` must hold draft tokens."""
    n = sum(w.draft_tokens for w in windows)
    a = sum(w.accepted_tokens for w in windows)
    # 2 delta (A/N - gate) / (s^2/N + drift), multiplied through by N: s^2 never underflows to 0
    spread = residual_variance(windows, error_rate, design_effect)
    return 2 * indifference * (a - gate * n) / (spread + n * drift_variance)


def sprt_step_sd(
    windows: Sequence[AcceptanceWindow],
    indifference: float,
    error_rate: float,
    drift_variance: float = 0.0,
    design_effect: float | None = None,
) -> float:
    """The sd of one window's step of sprt_log_lr: a window of the windows' mean draft tokens n_w
    adds 2 delta (a_w - gate n_w) over the same denominator, whose numerator has variance n_w s^2."""
    n = sum(w.draft_tokens for w in windows)
    spread = residual_variance(windows, error_rate, design_effect)
    return 2 * indifference * math.sqrt(n / len(windows) * spread) / (spread + n * drift_variance)


def acceptance_gate(
    windows: Sequence[AcceptanceWindow],
    min_rate: float,
    *,
    min_drafts: int = 200,
    error_rate: float = 0.05,
    indifference: float = 0.05,
    mix_drift: float = 0.0,
    mix_drift_seconds: float = 180.0,
    design_effect: float | None = None,
    window_seconds: float = MIN_ACCEPTANCE_WINDOW_SECONDS,
) -> GateResult:
    """Pass, Fail or InsufficientData for alpha >= min_rate over every window seen so far: an SPRT of
    alpha >= min_rate + indifference against alpha <= min_rate - indifference: a wrong verdict is
    about error_rate likely at the edges of that zone and less beyond them, on traffic whose mix
    swings by at most `mix_drift` (sd, in alpha) over `mix_drift_seconds`; inside the zone either
    verdict is acceptable."""
    usable = judged_windows(windows)
    dropped = sum(1 for w in windows if not w.usable())
    note = f" ({dropped} windows with NaN or negative increases dropped)" if dropped else ""
    drafts = sum(w.drafts for w in usable)
    drift = mix_drift_variance(mix_drift, mix_drift_seconds, span_seconds(windows, window_seconds))
    interval = acceptance_interval(usable, error_rate, drift, design_effect)
    if interval is None or drafts < min_drafts or len(usable) < MIN_WINDOWS:
        return _too_little(interval[0] if interval else None, drafts, len(usable), min_drafts, note)
    alpha, lower, upper = interval
    llr = sprt_log_lr(usable, min_rate, indifference, error_rate, drift, design_effect)
    step_sd = sprt_step_sd(usable, indifference, error_rate, drift, design_effect)
    fail_at, pass_at = sprt_bounds(error_rate, step_sd)
    figures = f"alpha {alpha:.3f} [{lower:.3f}, {upper:.3f}] over {drafts:.0f} drafts: SPRT log-LR {llr:.1f}"
    drifting = f"; mix drift sd {mix_drift:g} over {mix_drift_seconds:g}s" if mix_drift > 0 else ""
    zone = f"(gate {min_rate:g} +/- {indifference:g}{drifting}){note}"
    verdict, where = sprt_verdict(llr, fail_at, pass_at)
    return GateResult(verdict, alpha, lower, upper, drafts, f"{figures} {where} {zone}", llr, pass_at)


def _too_little(
    estimate: float | None, drafts: float, windows: int, min_drafts: int, note: str = ""
) -> GateResult:
    """InsufficientData for an acceptance test that has not the drafts or windows it judges from."""
    wanted = f"need {min_drafts} drafts and {MIN_WINDOWS} windows{note}"
    return GateResult(
        Verdict.INSUFFICIENT_DATA,
        estimate,
        None,
        None,
        drafts,
        f"{drafts:.0f} drafts in {windows} windows, {wanted}",
    )


def decide_at_deadline(result: GateResult, min_rate: float, indifference: float) -> GateResult:
    """An acceptance test still undecided at maxAnalysisDuration, with the data it needs (the SPRT
    ran: enough drafts and windows), is decided by the estimate's side of the gate. Inside the
    indifference zone either verdict is acceptable, and rolling back a canary that pays costs the
    user the speedup as surely as a wrong Fail would (DESIGN §2, "What a verdict is judged against").
    Outside the zone only the mix's drift allowance kept it undecided, and the estimate's side is the
    likelier truth. Too little or unusable data stays InsufficientData (Inconclusive)."""
    if result.verdict != Verdict.INSUFFICIENT_DATA or result.estimate is None or result.lower is None:
        return result
    above = result.estimate >= min_rate
    where = "inside" if abs(result.estimate - min_rate) <= indifference else "outside"
    return replace(
        result,
        verdict=Verdict.PASS if above else Verdict.FAIL,
        message=f"{result.message}; decided at maxAnalysisDuration by the estimate's side of the gate "
        f"({'at or above' if above else 'below'} {min_rate:g}, {where} the indifference zone)",
    )


def spec_acceptance_gate(
    windows: Sequence[AcceptanceWindow],
    limits: Gates,
    drift: MixDrift,
    *,
    window_seconds: float = MIN_ACCEPTANCE_WINDOW_SECONDS,
) -> GateResult:
    """acceptance_gate with a spec's gates (minAcceptanceRate, minDrafts, errorRate, indifference)
    and the mix's drift: the sequential test of traffic, looked at every reconcile."""
    result = acceptance_gate(
        windows,
        limits.min_acceptance_rate,
        min_drafts=limits.min_drafts,
        error_rate=limits.error_rate,
        indifference=limits.indifference,
        mix_drift=drift.sd,
        mix_drift_seconds=drift.timescale_seconds,
        design_effect=drift.design_effect,
        window_seconds=window_seconds,
    )
    measured = drift.sd > 0 or drift.design_effect is not None
    return replace(result, message=f"{result.message}; drift: {drift.source}") if measured else result


def fixed_sample_acceptance_gate(windows: Sequence[AcceptanceWindow], limits: Gates) -> GateResult:
    """Pass, Fail or InsufficientData for alpha >= minAcceptanceRate over one complete sample that
    no later look extends (a benchmark Job's windows): the side of the gate the estimate is on,
    decided when the one-sided Student-t bound on that side (m - 1 degrees of freedom, m windows)
    stays within the indifference zone's far edge. A wrong verdict at the zone's edges is then at
    most errorRate likely, as the SPRT's, but an SPRT pays for looking at every window: its spread
    is raised to a chi-square bound fit for optional stopping (from 4 windows, 32 times the
    per-window variance), and a fixed sample, read once, needs only the t quantile (2.4 at 3
    degrees of freedom). A benchmark replays a fixed dataset: no mix drift."""
    usable = judged_windows(windows)
    drafts = sum(w.drafts for w in usable)
    m = len(usable)
    gate, zone, error_rate = limits.min_acceptance_rate, limits.indifference, limits.error_rate
    if drafts < limits.min_drafts or m < MIN_WINDOWS:
        return _too_little(None, drafts, m, limits.min_drafts)
    n, alpha, spread = plug_in_spread(usable)
    se = math.sqrt(max(spread, binomial_variance(n, alpha * n)) / n)
    radius = student_t_quantile(1 - error_rate, m - 1) * se
    lower, upper = max(alpha - radius, 0.0), min(alpha + radius, 1.0)
    figures = (
        f"alpha {alpha:.3f}, one-sided bounds at {1 - error_rate:.0%} [{lower:.3f}, {upper:.3f}] over "
        f"{drafts:.0f} drafts in {m} windows (gate {gate:g} +/- {zone:g})"
    )
    if radius > abs(alpha - gate) + zone:
        return GateResult(Verdict.INSUFFICIENT_DATA, alpha, lower, upper, drafts, f"{figures}: undecided")
    verdict = Verdict.PASS if alpha >= gate else Verdict.FAIL
    return GateResult(verdict, alpha, lower, upper, drafts, figures)
