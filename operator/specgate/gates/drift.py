"""The traffic mix's drift (pure): its sd and timescale fitted on a config's alpha history,
the variance it leaves in an average, and a steady history's design effect.

A swing of the mix slower than the windows seen so far moves them all together, so no spread
estimated from them can show it; how the acceptance test allows for it: gates/acceptance.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from specgate.api import Gates, parse_duration
from specgate.gates.common import AcceptanceWindow, judged_windows, plug_in_spread


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
    _, p, spread = plug_in_spread(usable)
    return max(spread / (p * (1 - p)), 1.0) if 0 < p < 1 else None


NO_DRIFT = MixDrift(0.0, 180.0, "none")


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
