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

Guard. After promotion the question changes: not "is alpha above the gate?" asked again and again
(a test repeated at every reconcile, forever, is sure to fail a good canary some day), but "has
alpha dropped?", with false alarms as a budget per unit of time. The guard reads hours of the
promoted config's alpha (guard.history, in blocks of a minute or more) and runs Page's CUSUM of
their log likelihood ratios, of alpha = gate - delta against alpha = gate + delta:

    S_i = max(0, S_(i-1) + 2 * delta * (gate * n_i - a_i) / s^2),   trip when S_i >= h.

For log likelihood ratios Lorden's bound gives an in-control average run length of at least e^h
blocks, so h = log(blocks between false alarms) sets the budget (falseAlarmsPerMonth) when s^2 is
the true long-run spread per token. The traffic's blocks are not independent (long requests span
them; the mix drifts over minutes, which the history's hours show and 30 minutes could not) and
s^2 is estimated, so h carries GUARD_MARGIN, calibrated on the traffic model's months
(bench/guard.py), and s^2 is the older two thirds' long-run variance, AR(1)-prewhitened (a recent
drop must not inflate the spread that should reveal it). Until those older blocks span an hour,
s^2 is at least what the rollout's drift implies. The CUSUM runs over the blocks of the history
(window-limited), so it needs no state across reconciles and restarts as any look does.

Latency. Quantiles come from histogram buckets and are interpolated inside a bucket as
histogram_quantile does. Each track's quantile is bracketed by interpolating at the ranks
p -/+ z*se (se of a quantile's rank over n samples), so a wide bucket widens the bracket. The canary
fails when even its low estimate exceeds the baseline's high estimate by more than the tolerance,
or when its tail from the baseline's median up is slower by more than the tolerance at a bucket
edge (counts at edges are exact, an interpolated quantile is only a guess inside its bucket),
passes when its high estimate is within the tolerance of the baseline's low estimate, and otherwise
the gate says InsufficientData, naming the bucket edges: a quantile beyond the last finite edge,
or buckets too coarse for the samples so far to tell the tolerance, is never a Pass.

Latency is compared only at comparable load: a pod serving half the requests of another has a
shorter tail whatever it runs (see comparable_load).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from statistics import NormalDist

from specgate.api import Gates, parse_duration

# A spread needs a few windows before it means anything. 2 was tried and changes nothing in
# bench/decisions.py: with one degree of freedom the variance bound is unbounded, so two windows
# could decide only when they agree exactly, and that is no evidence of zero spread.
MIN_WINDOWS = 3
SPREAD_ERROR_SHARE = 0.25  # the spread's upper bound is exceeded with probability error_rate * this
HAC_LAGS = 3  # windows of autocorrelation allowed for (45 s of a long request)
# Acceptance is judged per window of at least this many seconds: windows, not single tokens, are
# the units the statistics count (tokens within a request are correlated).
MIN_ACCEPTANCE_WINDOW_SECONDS = 15.0
MONTH_SECONDS = 30 * 24 * 3600
MAX_GUARD_LAGS = 40  # the guard's Bartlett horizon at most, in blocks (prewhitened, it needs few)
MAX_AUTOCORRELATION = 0.98  # a lag-1 correlation above this is a trend, not noise: the horizon is capped
# Siegmund's rho (1985): a Gaussian random walk stopped on crossing a level ends beyond it by about
# rho times the sd of one step (rho = -zeta(1/2) / sqrt(2 pi) = 0.5826).
OVERSHOOT = 0.5826
TIGHTEST_AT_WINDOWS = 8.0  # m0 (smaller m0 decides sooner but breaks coverage: see test_gates)


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
    gamma = _autocovariances(residuals, lags)
    variance = gamma[0] + 2 * sum((1 - lag / (lags + 1)) * gamma[lag] for lag in range(1, lags + 1))
    return max(variance, gamma[0]) * m / (m - 1)


def _autocovariances(residuals: Sequence[float], lags: int) -> list[float]:
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
    n, p, own = _plug_in_spread(windows)
    return max(design_effect * p * (1 - p), own, _binomial(n, p * n))


def _plug_in_spread(windows: Sequence[AcceptanceWindow]) -> tuple[float, float, float]:
    """(draft tokens, alpha, the residuals' long-run variance per draft token) of `windows` (with
    draft tokens), as estimated, without an allowance for a spread that looks small by chance."""
    n, p, residuals = _centred(windows)
    return n, p, long_run_variance(residuals) * len(windows) / n


def _centred(windows: Sequence[AcceptanceWindow]) -> tuple[float, float, list[float]]:
    """(draft tokens, alpha, each window's accepted tokens less alpha times its draft tokens)."""
    n = sum(w.draft_tokens for w in windows)
    p = sum(w.accepted_tokens for w in windows) / n
    return n, p, [w.accepted_tokens - p * w.draft_tokens for w in windows]


def _per_token_variance(windows: Sequence[AcceptanceWindow], error_rate: float) -> float:
    """The residuals' long-run variance per window (m - 1 degrees of freedom), raised to its
    chi-square upper bound, per draft token, never below the binomial variance of independent tokens."""
    n, p, residuals = _centred(windows)
    m = len(windows)
    spread = variance_upper_bound(long_run_variance(residuals), m - 1, error_rate * SPREAD_ERROR_SHARE)
    return max(spread * m / n, _binomial(n, p * n))


def _binomial(n: float, a: float) -> float:
    """p (1 - p) of a tokens accepted of n, with pseudo-counts: no cancellation at p ~ 1."""
    return (a + 1) / (n + 2) * (n - a + 1) / (n + 2)


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


def mix_drift_variance(drift_sd: float, timescale_seconds: float, span_seconds: float) -> float:
    """Variance of the mean alpha over `span_seconds` that a traffic mix swinging with sd `drift_sd`
    (Ornstein-Uhlenbeck, correlation time `timescale_seconds`) adds: a swing slower than the windows
    seen so far moves them all together, so no spread estimated from them can show it."""
    if drift_sd <= 0:
        return 0.0
    x = max(span_seconds, 0.0) / timescale_seconds
    share = 1 - x / 3 if x < 1e-4 else 2 * (x - 1 + math.exp(-x)) / x**2  # of the stationary variance
    return drift_sd**2 * share


@dataclass(frozen=True)
class MixDrift:
    """The traffic mix's drift the acceptance gate allows for (Ornstein-Uhlenbeck: sd in alpha,
    correlation time), and where it comes from, for status and messages; with it, where a history
    measured it, that traffic's design effect (`history_design_effect`)."""

    sd: float
    timescale_seconds: float
    source: str
    design_effect: float | None = None


# Drift is measured on blocks of at least this long: long enough that a request (median 6 s, p99
# about a minute of decode) rarely spans two blocks apart, so the sampling noise of blocks two or
# more apart is independent and only the mix's drift correlates them.
DRIFT_BLOCK_SECONDS = 60.0
DRIFT_MIN_LAG_BLOCKS = 2
DRIFT_MAX_LAG_SECONDS = 1800.0  # the covariances fitted: out to a maxAnalysisDuration
# Timescales tried by the fit, from a block up: a shorter swing barely reaches two blocks, where a
# long request spanning blocks looks the same; one above an eighth of the history is not told
# apart from a level.
DRIFT_TIMESCALES = tuple(DRIFT_BLOCK_SECONDS * 1.1**i for i in range(73))
MIN_DRIFT_HISTORY_SECONDS = 3600.0  # below an hour the covariances hold too few swings to fit
DRIFT_SIGNIFICANCE = 4.0  # standard errors a fitted drift variance must clear to count (one-sided; see below)
MIN_DRIFT_SD = 0.001  # a tenth of a point of alpha is no drift for any gate (and no rounding error either)
MIN_DESIGN_WINDOWS = 120  # a design effect from fewer windows is as uncertain as the canary's own


def measure_mix_drift(
    windows: Sequence[AcceptanceWindow], window_seconds: float
) -> tuple[float, float] | None:
    """(sd, timescale seconds) of the mix's drift in a config's own alpha history, fitted as an
    Ornstein-Uhlenbeck process; None for a history too short or too empty to tell.

    The windows are summed into blocks of DRIFT_BLOCK_SECONDS and each block's alpha (A / N) taken.
    Blocks k >= DRIFT_MIN_LAG_BLOCKS apart share no request, so their covariance is the drift's
    alone, whatever the traffic's sampling noise: for an OU of variance sd^2 and timescale tau,
    averaged over blocks of b seconds, sd^2 (tau / b)^2 (1 - r)^2 r^(k - 1) with r = e^(-b / tau).
    The covariances are taken around the history's own mean, which the drift moves too: each is
    low by that mean's variance, sd^2 times mix_drift_variance's share over the history (a few
    percent at tau = 3 min in 4 h, a third of the slowest swings'), so the shape fitted has it
    subtracted. Least squares over those lags, tau on a grid, sd^2 in closed form.

    On a steady mix the covariances are sampling noise (and long requests spanning blocks), and the
    fit finds some timescale they happen to suit: at a short one the drift barely reaches two
    blocks, so a little noise reads as a large sd (0.21 in one 4 h steady history of
    bench/decisions.py), which would make a rollout on that traffic wait as if it drifted. So no
    timescale under a block is tried, and a variance fitted within DRIFT_SIGNIFICANCE standard
    errors of zero (the covariances' own noise, from the spread of the products behind each: a
    block one long request dominates makes heavy tails; carried through the fit) is no drift: sd 0.
    Those errors treat the lags as independent, but a request spanning neighbouring blocks
    correlates them, so the errors are somewhat too small: at 3 standard errors 5 % of steady 4 h
    histories of bench/traffic.py's model (20 requests a window, alpha 0.65) still read as a drift
    (one-sided 3 sd would be 0.1 %), at 4 about 2 % (0 of 300 at alpha 0.6), while 82-85 % of its
    drifting histories are found (96 % at 3). (An error with the lags' covariance per block
    instead was tried: it counts the drift's own persistence as noise and found 2-30 %.)"""
    blocks = _drift_blocks(windows, window_seconds)
    block_seconds = max(window_seconds, window_seconds * round(DRIFT_BLOCK_SECONDS / window_seconds))
    history_seconds = len(blocks) * block_seconds
    seen = [b for b in blocks if b is not None]
    if history_seconds < MIN_DRIFT_HISTORY_SECONDS or len(seen) < len(blocks) / 2:
        return None
    mean = sum(seen) / len(seen)
    centred = [None if b is None else b - mean for b in blocks]
    lags = range(DRIFT_MIN_LAG_BLOCKS, min(int(DRIFT_MAX_LAG_SECONDS // block_seconds), len(blocks) // 4) + 1)
    if not lags:
        return None
    covariances, noises = zip(*(_lag_covariance(centred, k) for k in lags), strict=True)
    fits = []  # (squared error, variance, tau, the variance's standard error under no drift)
    for tau in (t for t in DRIFT_TIMESCALES if t <= history_seconds / 8):
        r = math.exp(-block_seconds / tau)
        averaged = (tau / block_seconds * (1 - r)) ** 2
        of_mean = mix_drift_variance(1.0, tau, history_seconds)
        shape = [averaged * r ** (k - 1) - of_mean for k in lags]
        squares = sum(f * f for f in shape)
        variance = sum(c * f for c, f in zip(covariances, shape, strict=True)) / squares
        error = sum((c - variance * f) ** 2 for c, f in zip(covariances, shape, strict=True))
        noise = math.sqrt(sum(f * f * v for f, v in zip(shape, noises, strict=True)))
        fits.append((error, variance, tau, noise / squares))
    if not fits:
        return None
    _, variance, tau, standard_error = min(fits)
    drifts = variance > DRIFT_SIGNIFICANCE * standard_error and variance >= MIN_DRIFT_SD**2
    return (math.sqrt(variance) if drifts else 0.0), tau


def _drift_blocks(windows: Sequence[AcceptanceWindow], window_seconds: float) -> list[float | None]:
    """Each block's alpha (None without draft tokens), the windows placed on their time grid (a
    missing scrape leaves a hole, not a shift) and summed DRIFT_BLOCK_SECONDS at a time."""
    usable = [w for w in windows if w.usable()]
    if not usable:
        return []
    per_block = max(1, round(DRIFT_BLOCK_SECONDS / window_seconds))
    first = usable[0].end
    tokens: dict[int, float] = defaultdict(float)
    accepted: dict[int, float] = defaultdict(float)
    for i, w in enumerate(usable):
        at = i if w.end is None or first is None else round((w.end - first) / window_seconds)
        tokens[at // per_block] += w.draft_tokens
        accepted[at // per_block] += w.accepted_tokens
    return [accepted[j] / tokens[j] if tokens[j] > 0 else None for j in range(max(tokens) + 1)]


def _lag_covariance(centred: Sequence[float | None], lag: int) -> tuple[float, float]:
    """The mean product of blocks `lag` apart where both have an alpha, and that mean's variance
    were the blocks independent, from the products' own spread: a block a single long request
    dominates makes heavy tails, which c0^2 / pairs would miss. (0, 0) with no such pair."""
    products = [
        x * y for x, y in zip(centred, centred[lag:], strict=False) if x is not None and y is not None
    ]
    if not products:
        return 0.0, 0.0
    return sum(products) / len(products), sum(p * p for p in products) / len(products) ** 2


def history_design_effect(windows: Sequence[AcceptanceWindow]) -> float | None:
    """The windows' spread per draft token over the binomial p (1 - p) of independent tokens, on a
    history whose mix does not drift; None without MIN_DESIGN_WINDOWS windows.

    The traffic's requests (their lengths, how much their prompts differ, how long they outlive a
    window) set most of this ratio, the config that serves them little of it (560-700 between alpha
    0.45 and 0.65 in bench/traffic.py's model), so hours of the promoted config's windows tell the
    next canary's spread far better than its own first windows can: with it the test needs no
    chi-square allowance for a spread that looks small by chance, and where the canary's own
    windows spread more, residual_variance takes theirs."""
    usable = judged_windows(windows)
    if len(usable) < MIN_DESIGN_WINDOWS:
        return None
    _, p, spread = _plug_in_spread(usable)
    return max(spread / (p * (1 - p)), 1.0) if 0 < p < 1 else None


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


def judged_windows(windows: Sequence[AcceptanceWindow]) -> list[AcceptanceWindow]:
    """The windows acceptance_gate judges (and status.canary reports): usable, with draft tokens."""
    return [w for w in windows if w.usable() and w.draft_tokens > 0]


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
    if llr >= pass_at:
        verdict, where = Verdict.PASS, f">= {pass_at:.1f}"
    elif llr <= fail_at:
        verdict, where = Verdict.FAIL, f"<= {fail_at:.1f}"
    else:
        verdict, where = Verdict.INSUFFICIENT_DATA, f"within ({fail_at:.1f}, {pass_at:.1f})"
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


NO_DRIFT = MixDrift(0.0, 180.0, "none")


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
    n, alpha, spread = _plug_in_spread(usable)
    se = math.sqrt(max(spread, _binomial(n, alpha * n)) / n)
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


def fallback_drift(limits: Gates, why: str) -> MixDrift:
    """The spec's mixDrift and mixDriftTimescale, with why no measured drift replaces them."""
    return MixDrift(
        limits.mix_drift, parse_duration(limits.mix_drift_timescale), f"spec mixDrift (fallback: {why})"
    )


def drift_from_history(
    history: Sequence[AcceptanceWindow], window_seconds: float, limits: Gates, whose: str
) -> MixDrift:
    """The drift measured in `whose` alpha history (measure_mix_drift), else the spec's fallback."""
    measured = measure_mix_drift(history, window_seconds)
    hours = len(history) * window_seconds / 3600
    if measured is None:
        return fallback_drift(limits, f"{whose} history of {hours:.1f} h is too short or too sparse")
    sd, tau = measured
    # Where the mix drifts, the drift's share of the windows' spread rests on its fitted timescale
    # and swamps the sampling spread at high traffic: the design effect is taken on steady mixes only.
    effect = history_design_effect(history) if sd == 0 else None
    spread = "" if effect is None else f", design effect {effect:.0f}"
    return MixDrift(
        sd, tau, f"measured over {hours:.1f} h of {whose} alpha ({window_seconds:g}s windows{spread})", effect
    )


# --- guard ---

# Nats added to log(blocks between false alarms): Lorden's bound holds for independent increments
# and a known spread; the traffic's blocks are neither (a long request spans blocks, the mix drifts
# over minutes, the spread is estimated), and bench/guard.py's months on the traffic model need
# this much more to keep falseAlarmsPerMonth. (A second chart for a drop three times as deep
# caught such drops sooner on paper, but its larger steps made it trip good canaries so much more
# often that the margin it needed cost more than it won: tried on the same months, not kept.)
GUARD_MARGIN = 6.0
MIN_GUARD_BLOCKS = 8  # the CUSUM judges from this many blocks
# Until the older part of the history holds this many blocks (an hour of 60 s blocks), the spread
# is at least the one the rollout's drift implies: a spread from a few blocks is often too small.
MIN_GUARD_REFERENCE_BLOCKS = 60
MAX_PREWHITENING = 0.9  # a lag-1 correlation above this is a trend, not the drift's noise


@dataclass(frozen=True)
class GuardResult:
    tripped: bool
    statistic: float  # the CUSUM now
    threshold: float  # it trips at this
    alpha: float | None  # over the blocks it saw
    windows: int
    message: str
    spread: float | None = None  # s^2 per draft token the CUSUM used
    spread_source: str = ""


def guard_threshold(false_alarms_per_month: float, block_seconds: float) -> float:
    """h = log(blocks between false alarms) + GUARD_MARGIN (Lorden's bound, widened for what the
    traffic model shows it misses)."""
    blocks_between_alarms = MONTH_SECONDS / (false_alarms_per_month * block_seconds)
    return math.log(max(blocks_between_alarms, 1.0)) + GUARD_MARGIN


def acceptance_guard(
    blocks: Sequence[AcceptanceWindow],
    gate: float,
    *,
    indifference: float,
    false_alarms_per_month: float,
    block_seconds: float,
    drift: MixDrift,
) -> GuardResult:
    """Page's CUSUM over the guard's history (module docstring): tripped when alpha has dropped
    from gate + indifference to gate - indifference or below, with false alarms at most
    `false_alarms_per_month` while alpha holds at gate + indifference or above. `drift` (the
    rollout's, measured or its fallback) bounds the spread until the history can tell its own."""
    # A block without drafts stays in: quiet minutes are part of the traffic, and add 0.
    usable = [w for w in blocks if w.usable()]
    h = guard_threshold(false_alarms_per_month, block_seconds)
    n = sum(w.draft_tokens for w in usable)
    alpha = sum(w.accepted_tokens for w in usable) / n if n > 0 else None
    reference = usable[: max(MIN_GUARD_BLOCKS, len(usable) * 2 // 3)]
    if alpha is None or len(usable) < MIN_GUARD_BLOCKS or sum(w.draft_tokens for w in reference) <= 0:
        message = (
            f"{len(usable)} blocks, {n:.0f} draft tokens: the guard judges from {MIN_GUARD_BLOCKS} "
            "blocks, with drafts in its older part"
        )
        return GuardResult(False, 0.0, h, alpha, len(usable), message)
    s2, source = guard_spread(reference, drift, block_seconds)
    statistic = 0.0
    for w in usable:
        statistic = max(0.0, statistic + 2 * indifference * (gate * w.draft_tokens - w.accepted_tokens) / s2)
    message = (
        f"alpha {alpha:.3f} over {len(usable)} blocks of {block_seconds:g}s; CUSUM {statistic:.1f}, "
        f"trips at {h:.1f} ({false_alarms_per_month:g} false alarms per month at alpha "
        f"{gate + indifference:g}, a drop to {gate - indifference:g} is caught); spread {source}"
    )
    return GuardResult(statistic >= h, statistic, h, alpha, len(usable), message, s2, source)


def guard_spread(
    reference: Sequence[AcceptanceWindow], drift: MixDrift, block_seconds: float
) -> tuple[float, str]:
    """(s^2 per draft token, where it comes from) for the guard: the long-run variance of the older
    blocks' residuals (`prewhitened_long_run_variance`), and while they are under an hour, at least
    what the rollout's drift implies (`drift_spread`). Taken over the older part of the history: a
    drop in the recent blocks would otherwise read as spread and hide itself."""
    n, p, residuals = _centred(reference)
    measured = max(prewhitened_long_run_variance(residuals) * len(reference) / n, _binomial(n, p * n))
    own = f"measured over {len(reference) * block_seconds / 3600:.1f} h"
    prior = drift_spread(drift, n / len(reference), p, block_seconds)
    if len(reference) < MIN_GUARD_REFERENCE_BLOCKS and prior > measured:
        return prior, f"the rollout's drift until an hour is measured ({drift.source})"
    return measured, own


def drift_spread(drift: MixDrift, tokens_per_block: float, p: float, block_seconds: float) -> float:
    """s^2 per draft token that a drift of `drift` implies on blocks of `tokens_per_block`: the
    sampling spread (its design effect, else binomial) plus the drift's long-run variance, 2 sd^2
    tau per second of an Ornstein-Uhlenbeck mix, tokens_per_block / block_seconds tokens a second."""
    sampling = (drift.design_effect or 1.0) * p * (1 - p)
    return sampling + 2 * drift.sd**2 * drift.timescale_seconds * tokens_per_block / block_seconds


def prewhitened_long_run_variance(residuals: Sequence[float]) -> float:
    """Per-block long-run variance of `residuals` (mean 0), AR(1)-prewhitened (Andrews and Monahan
    1992): rho from the lag-1 autocorrelation, the Bartlett estimate (Andrews' bandwidth) of
    e_i = r_i - rho r_(i-1), recoloured by 1 / (1 - rho)^2. A drifting mix makes the residuals an
    AR(1) plus noise, whose slow tail a plain Bartlett estimate cuts short (about 0.6 of the truth
    on bench/traffic.py's drifting mix, against 0.8 prewhitened). e's autocovariances are taken
    from r's, so that bench/guard.py computes the same figure for every look at once."""
    m = len(residuals)
    if m < 3:
        return 0.0
    gamma = _autocovariances(residuals, min(m - 1, MAX_GUARD_LAGS + 1))
    rho = min(max(gamma[1] / gamma[0], 0.0), MAX_PREWHITENING) if gamma[0] > 0 else 0.0
    whitened = [
        (1 + rho**2) * gamma[k] - rho * (gamma[abs(k - 1)] + gamma[k + 1]) for k in range(len(gamma) - 1)
    ]
    if whitened[0] <= 0:
        return gamma[0] * m / (m - 1)
    rho_e = min(max(whitened[1] / whitened[0], 0.0), MAX_AUTOCORRELATION) if len(whitened) > 1 else 0.0
    plug_in = 4 * rho_e**2 / ((1 - rho_e) ** 2 * (1 + rho_e) ** 2)
    bandwidth = min(max(1.1447 * math.cbrt(plug_in * m), 1.0), len(whitened))
    lags = min(math.ceil(bandwidth) - 1, len(whitened) - 1)
    variance = whitened[0] + 2 * sum((1 - lag / bandwidth) * whitened[lag] for lag in range(1, lags + 1))
    return max(variance / (1 - rho) ** 2, gamma[0]) * m / (m - 1)


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
) -> GateResult:
    """Pass, Fail or InsufficientData for: the canary's quantile is at most (1 + max_regression)
    times the baseline's (module docstring). `figure` names the histogram in messages."""
    samples = min(baseline.total, canary.total)
    if samples < min_count:
        return GateResult(
            Verdict.INSUFFICIENT_DATA, None, None, None, samples,
            f"{samples:.0f} {figure} samples on the smaller track, need {min_count}",
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
    heavier = _heavier_tail(baseline, canary, quantile, max_regression, z)
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
        f"{_edges_ms(baseline, quantile)} (baseline) over {samples:.0f} samples: more traffic, or finer "
        "buckets (vLLM --custom-histogram-buckets)",
    )  # fmt: skip


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


# --- load ---


@dataclass(frozen=True)
class Load:
    """What one track's pods carried over a window."""

    pods: int
    requests_per_second_per_pod: float | None
    running_per_pod: float | None

    def __str__(self) -> str:
        rate = "?" if self.requests_per_second_per_pod is None else f"{self.requests_per_second_per_pod:.2f}"
        running = "?" if self.running_per_pod is None else f"{self.running_per_pod:.2f}"
        return f"{rate} req/s and {running} running per pod ({self.pods} pods)"


def _relative_difference(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    larger = max(a, b)
    return abs(a - b) / larger if larger > 0 else 0.0


def comparable_load(canary: Load, baseline: Load, tolerance: float) -> str | None:
    """None when the pods carried comparable load, else why not, naming both loads. Comparable:
    the request rate per pod (open-loop traffic, split evenly) or the running requests per pod
    (closed-loop clients, where a faster pod finishes more) within `tolerance` of each other.
    Loads not measured on either side are not held against the comparison."""
    differences = [
        d
        for d in (
            _relative_difference(canary.requests_per_second_per_pod, baseline.requests_per_second_per_pod),
            _relative_difference(canary.running_per_pod, baseline.running_per_pod),
        )
        if d is not None
    ]
    if not differences or min(differences) <= tolerance:
        return None
    return f"loads differ by more than {tolerance:.0%}: canary {canary}, baseline {baseline}"


def _quantile_se(q: float, n: float) -> float:
    return math.sqrt(q * (1 - q) / n) if n > 0 else 0.0
