"""The acceptance guard after promotion (pure).

After promotion the question changes: not "is alpha above the gate?" asked again and again
(a test repeated at every reconcile, forever, is sure to fail a good canary some day), but "has
alpha dropped?", with false alarms as a budget per unit of time. The guard reads hours of the
promoted config's alpha (guard.history, in blocks of a minute or more) and runs Page's CUSUM of
their log likelihood ratios, of alpha = gate - delta against alpha = gate + delta:

    S_i = max(0, S_(i-1) + 2 * delta * (gate * n_i - a_i) / s^2),   trip when S_i >= h.

For log likelihood ratios Lorden's bound gives an in-control average run length of at least e^h
blocks, so h0 = log(blocks between false alarms) sets the budget (falseAlarmsPerMonth) when s^2 is
the true long-run spread per token; h0 carries GUARD_MARGIN for the traffic's heavy-tailed blocks.
s^2 is the older two thirds' long-run variance, AR(1)-prewhitened (a recent drop must not inflate
the spread that should reveal it), and it is estimated: an estimate low by a factor e^-e makes the
CUSUM e^e too large. With e ~ N(0, r^2), r the estimate's relative error (`spread_error`: larger
where the blocks are correlated, a drifting mix, and where the reference is short), the false-alarm
rate e^-h averaged over e is kept at e^-h0: by Laplace's method at the saddle point,
h = 2 h0 e^(c - 1) / (1 + c), c = sqrt(1 + 2 r^2 h0) (`threshold_for_spread_error`), which is h0 at
r = 0 and grows with r. Until the older blocks span an hour, s^2 is at least what the rollout's
drift implies. The CUSUM runs over the blocks of the history (window-limited), so it needs no state
across reconciles and restarts as any look does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specgate.gates.common import AcceptanceWindow, autocovariances, binomial_variance, centred
from specgate.gates.drift import MixDrift

MONTH_SECONDS = 30 * 24 * 3600
MAX_GUARD_LAGS = 40  # the guard's Bartlett horizon at most, in blocks (prewhitened, it needs few)
MAX_AUTOCORRELATION = 0.98  # a lag-1 correlation above this is a trend, not noise: the horizon is capped


# Nats added to log(blocks between false alarms) before the spread's error is allowed for: Lorden's
# bound holds for independent increments, and the traffic's blocks are heavy-tailed (a long request
# spans blocks). With the spread known, bench/guard.py's months need 10.5-14 nats against
# log(432,000) = 12.98; half a nat here and the spread error's allowance on top (about 2.5 nats on
# a steady mix's 8 h) keep the budget there. (A second chart for a drop three times as deep caught such drops sooner on
# paper, but its larger steps made it trip good canaries so much more often that the margin it
# needed cost more than it won: tried on the same months, not kept.)
GUARD_MARGIN = 0.5
# The spread estimate's relative error (sd of log(estimate / truth)) is this many times
# sqrt(tau / blocks), tau = (1 + rho) / (1 - rho) the blocks' autocorrelation time at the lag-1
# correlation rho: measured on bench/guard.py's months at 20 requests a window, 2.6 on the steady mix
# (0.145 at tau 1.46) and 2.9 on the drifting one (0.247 at tau 3.57) over 480 blocks; 3 is what the
# steady mix at 3 requests a window needs to keep its budget (2.75 tripped 7 times in 60 months). A
# Gaussian variance from tau-correlated blocks would have sqrt(2); heavy-tailed blocks have more.
SPREAD_ERROR_SCALE = 3.0
# Past this relative error (a history of minutes) the error stops growing: the rollout's drift
# bounds the spread there (MIN_GUARD_REFERENCE_BLOCKS).
MAX_SPREAD_ERROR = 0.3
# The error's allowance stops here, at the flat 6 nats (with GUARD_MARGIN) the guard had before: on
# a drifting mix the error is read from the same blocks as the spread, so a look whose correlation
# reads low gets a low spread and a low threshold together, and a larger allowance there bought
# slower detection with more false trips (bench/guard.py, 300 months at 20 requests a window: 27
# trips and a drop of 0.25 caught in 51 min at p95 uncapped, against 20 and 48 with the flat 6).
MAX_ERROR_ALLOWANCE = 5.5
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
    spread_error: float | None = None  # the spread's relative error the threshold allows for


def guard_threshold(false_alarms_per_month: float, block_seconds: float, spread_error: float = 0.0) -> float:
    """h for a budget of false alarms and a spread estimated with relative error `spread_error`:
    h0 = log(blocks between false alarms) + GUARD_MARGIN (Lorden's bound, widened for heavy-tailed
    blocks), raised by `threshold_for_spread_error`, by MAX_ERROR_ALLOWANCE at most."""
    h0 = math.log(max(MONTH_SECONDS / (false_alarms_per_month * block_seconds), 1.0)) + GUARD_MARGIN
    return min(threshold_for_spread_error(h0, spread_error), h0 + MAX_ERROR_ALLOWANCE)


def threshold_for_spread_error(h0: float, spread_error: float) -> float:
    """The h whose false-alarm rate e^-(h e^-e), averaged over a log-normal error e ~ N(0, r^2) of
    the spread, is e^-h0 (Laplace's method): the saddle point e* = c - 1, c = sqrt(1 + 2 r^2 h0),
    gives h = e* e^(e*) / r^2 = 2 h0 e^(c - 1) / (1 + c) (written so that r = 0 gives h0)."""
    c = math.sqrt(1 + 2 * spread_error**2 * h0)
    return 2 * h0 * math.exp(c - 1) / (1 + c)


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
    n = sum(w.draft_tokens for w in usable)
    alpha = sum(w.accepted_tokens for w in usable) / n if n > 0 else None
    reference = usable[: max(MIN_GUARD_BLOCKS, len(usable) * 2 // 3)]
    if alpha is None or len(usable) < MIN_GUARD_BLOCKS or sum(w.draft_tokens for w in reference) <= 0:
        message = (
            f"{len(usable)} blocks, {n:.0f} draft tokens: the guard judges from {MIN_GUARD_BLOCKS} "
            "blocks, with drafts in its older part"
        )
        # until the spread is measured, the threshold of a history too short to tell it
        h = guard_threshold(false_alarms_per_month, block_seconds, MAX_SPREAD_ERROR)
        return GuardResult(False, 0.0, h, alpha, len(usable), message)
    s2, source, error = guard_spread(reference, drift, block_seconds)
    h = guard_threshold(false_alarms_per_month, block_seconds, error)
    statistic = 0.0
    for w in usable:
        statistic = max(0.0, statistic + 2 * indifference * (gate * w.draft_tokens - w.accepted_tokens) / s2)
    message = (
        f"alpha {alpha:.3f} over {len(usable)} blocks of {block_seconds:g}s; CUSUM {statistic:.1f}, "
        f"trips at {h:.1f} ({false_alarms_per_month:g} false alarms per month at alpha "
        f"{gate + indifference:g}, a drop to {gate - indifference:g} is caught); spread {source}, "
        f"relative error {error:.0%}"
    )
    return GuardResult(statistic >= h, statistic, h, alpha, len(usable), message, s2, source, error)


def guard_spread(
    reference: Sequence[AcceptanceWindow], drift: MixDrift, block_seconds: float
) -> tuple[float, str, float]:
    """(s^2 per draft token, where it comes from, its relative error) for the guard: the long-run
    variance of the older blocks' residuals (`prewhitened_long_run_variance`), and while they are
    under an hour, at least what the rollout's drift implies (`drift_spread`); the error is that of
    the blocks' own estimate (`spread_error`) either way. Taken over the older part of the history:
    a drop in the recent blocks would otherwise read as spread and hide itself."""
    n, p, residuals = centred(reference)
    measured = max(prewhitened_long_run_variance(residuals) * len(reference) / n, binomial_variance(n, p * n))
    error = spread_error(residuals)
    own = f"measured over {len(reference) * block_seconds / 3600:.1f} h"
    prior = drift_spread(drift, n / len(reference), p, block_seconds)
    if len(reference) < MIN_GUARD_REFERENCE_BLOCKS and prior > measured:
        return prior, f"the rollout's drift until an hour is measured ({drift.source})", error
    return measured, own, error


def spread_error(residuals: Sequence[float]) -> float:
    """The relative error of the long-run variance of `residuals`: SPREAD_ERROR_SCALE
    sqrt(tau / blocks), tau = (1 + rho) / (1 - rho) at the prewhitening's lag-1 correlation rho
    (correlated blocks hold fewer independent ones), at most MAX_SPREAD_ERROR."""
    if len(residuals) < 3:
        return MAX_SPREAD_ERROR
    rho = lag1_correlation(autocovariances(residuals, 1))
    return min(SPREAD_ERROR_SCALE * math.sqrt((1 + rho) / (1 - rho) / len(residuals)), MAX_SPREAD_ERROR)


def lag1_correlation(gamma: Sequence[float]) -> float:
    """The lag-1 correlation the prewhitening takes from gamma_0, gamma_1: in [0, MAX_PREWHITENING]."""
    return min(max(gamma[1] / gamma[0], 0.0), MAX_PREWHITENING) if gamma[0] > 0 else 0.0


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
    gamma = autocovariances(residuals, min(m - 1, MAX_GUARD_LAGS + 1))
    rho = lag1_correlation(gamma)
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
