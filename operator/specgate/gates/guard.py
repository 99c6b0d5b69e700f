"""The acceptance guard after promotion (pure).

After promotion the question changes: not "is alpha above the gate?" asked again and again
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
    n, p, residuals = centred(reference)
    measured = max(prewhitened_long_run_variance(residuals) * len(reference) / n, binomial_variance(n, p * n))
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
    gamma = autocovariances(residuals, min(m - 1, MAX_GUARD_LAGS + 1))
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
