"""Vectorized twins of the gates' spread arithmetic for the benches, which compute every look at
once: the residuals' Newey-West variance (gates.long_run_variance), its chi-square bound
(gates.variance_upper_bound) and the acceptance test's per-token variance
(gates.acceptance._per_token_variance); and, for many incumbent histories at once, the mix's drift
fitted on each (gates.measure_mix_drift) and its design effect (gates.history_design_effect), what
gates.drift_from_history gives a re-rollout. Each bench checks its looks and its histories against
the gates module itself before printing a figure."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specgate.gates import HAC_LAGS, SPREAD_ERROR_SHARE
from specgate.gates.drift import (
    DRIFT_BLOCK_SECONDS,
    DRIFT_MAX_LAG_SECONDS,
    DRIFT_MIN_LAG_BLOCKS,
    DRIFT_SIGNIFICANCE,
    DRIFT_TIMESCALES,
    MIN_DESIGN_WINDOWS,
    MIN_DRIFT_HISTORY_SECONDS,
    MIN_DRIFT_SD,
    mix_drift_variance,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def ratio_long_run_variances(a: FloatArray, n: FloatArray) -> tuple[FloatArray, FloatArray]:
    """For each look j (windows 1..j): the ratio R = sum a / sum n and the Newey-West variance per
    window (HAC_LAGS lags, Bartlett weights, never below gamma_0, times j / (j - 1); 0 at one window)
    of the residuals a_i - R n_i, as gates.long_run_variance computes it, by prefix sums of the
    lagged products (a residual product expands into a a', a n' + n a' and n n' terms)."""
    c = len(n)
    j = np.arange(1, c + 1, dtype=np.float64)
    ratio = np.cumsum(a) / np.cumsum(n)
    gamma = np.zeros((HAC_LAGS + 1, c))
    for lag in range(min(HAC_LAGS, c - 1) + 1):
        terms = np.clip(np.arange(1, c + 1) - lag, 0, None)  # products i, i + lag within the look

        def prefix(x: FloatArray, terms: IntArray = terms) -> FloatArray:
            return np.concatenate(([0.0], np.cumsum(x)))[terms]

        aa = prefix(a[: c - lag] * a[lag:])
        an = prefix(a[: c - lag] * n[lag:] + n[: c - lag] * a[lag:])
        nn = prefix(n[: c - lag] * n[lag:])
        gamma[lag] = (aa - ratio * an + ratio**2 * nn) / j
    lags = np.minimum(HAC_LAGS, j - 1)
    lag_index = np.arange(HAC_LAGS + 1)[:, None]
    weights = np.where((lag_index >= 1) & (lag_index <= lags), 1 - lag_index / (lags + 1), 0.0)
    long_run = np.maximum(gamma[0] + 2 * (weights * gamma).sum(axis=0), gamma[0])
    variance: FloatArray = np.where(j >= 2, long_run * j / np.maximum(j - 1, 1), 0.0)
    return ratio, variance


def chi_square_bound(variance: FloatArray, dof: FloatArray, error_rate: float) -> FloatArray:
    """The variance raised to its chi-square upper bound, exceeded with probability error_rate x
    SPREAD_ERROR_SHARE (Wilson-Hilferty, as gates.variance_upper_bound)."""
    z = statistics.NormalDist().inv_cdf(error_rate * SPREAD_ERROR_SHARE)
    quantile = dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3
    bound: FloatArray = variance * dof / np.maximum(quantile, 1e-9)
    return bound


def per_token_variance(
    variance: FloatArray,
    dof: FloatArray,
    windows: FloatArray | float,
    tokens: FloatArray,
    accepted: FloatArray,
    error_rate: float,
) -> FloatArray:
    """s^2 per draft token of each look: the per-window variance raised to its chi-square upper
    bound (Wilson-Hilferty, as gates.variance_upper_bound), per token, never below the binomial
    variance of independent tokens."""
    spread = chi_square_bound(variance, dof, error_rate)
    binomial = (accepted + 1) / (tokens + 2) * (tokens - accepted + 1) / (tokens + 2)
    result: FloatArray = np.maximum(spread * windows / np.maximum(tokens, 1e-12), binomial)
    return result


@dataclass(frozen=True)
class HistoryDrifts:
    """gates.drift_from_history's figures for each of many histories: the drift's sd and timescale
    (NaN where measure_mix_drift finds none: the spec's fallback), and the design effect (NaN where
    history_design_effect gives None or the mix drifts)."""

    sd: FloatArray
    timescale_seconds: FloatArray
    design_effect: FloatArray

    @property
    def measured(self) -> npt.NDArray[np.bool_]:
        result: npt.NDArray[np.bool_] = ~np.isnan(self.sd)
        return result


def history_drifts(tokens: FloatArray, accepted: FloatArray, block_seconds: float) -> HistoryDrifts:
    """gates.drift_from_history on every row of `tokens` and `accepted` (histories x blocks: the
    draft and accepted tokens of consecutive blocks of DRIFT_BLOCK_SECONDS, every block present, as
    the operator's range query returns them), with the same arithmetic: the blocks' alphas centred on
    their mean, the mean products `lag` blocks apart over the pairs where both have draft tokens and
    their noise, the OU shape fitted in closed form at each timescale, the best fit kept where it
    clears DRIFT_SIGNIFICANCE standard errors; on a steady history its design effect."""
    if not math.isclose(block_seconds, DRIFT_BLOCK_SECONDS):
        raise ValueError(
            f"block_seconds must be DRIFT_BLOCK_SECONDS ({DRIFT_BLOCK_SECONDS:g}), got {block_seconds:g}"
        )
    blocks = tokens.shape[1]
    history_seconds = blocks * block_seconds
    seen = tokens > 0
    alpha = np.where(seen, accepted / np.where(seen, tokens, 1.0), 0.0)
    count = seen.sum(axis=1)
    mean = alpha.sum(axis=1) / np.maximum(count, 1)
    centred = np.where(seen, alpha - mean[:, None], 0.0)
    last_lag = min(int(DRIFT_MAX_LAG_SECONDS // block_seconds), blocks // 4)
    lags = np.arange(DRIFT_MIN_LAG_BLOCKS, last_lag + 1)
    covariances, noises = _lag_covariances(centred, seen, lags)
    taus = np.array([t for t in DRIFT_TIMESCALES if t <= history_seconds / 8])
    r = np.exp(-block_seconds / taus)[:, None]
    averaged = (taus[:, None] / block_seconds * (1 - r)) ** 2
    of_mean = np.array([mix_drift_variance(1.0, t, history_seconds) for t in taus])[:, None]
    shape = averaged * r ** (lags[None, :] - 1) - of_mean  # timescales x lags
    squares = (shape**2).sum(axis=1)
    variance = covariances @ shape.T / squares  # histories x timescales
    error = ((covariances[:, None, :] - variance[:, :, None] * shape[None, :, :]) ** 2).sum(axis=2)
    standard_error = np.sqrt(noises @ (shape**2).T) / squares
    best = np.argmin(error, axis=1)
    rows = np.arange(len(tokens))
    fitted, se = variance[rows, best], standard_error[rows, best]
    drifts = (fitted > DRIFT_SIGNIFICANCE * se) & (fitted >= MIN_DRIFT_SD**2)
    measured = (history_seconds >= MIN_DRIFT_HISTORY_SECONDS) & (count >= blocks / 2) & (len(lags) > 0)
    sd = np.where(measured, np.where(drifts, np.sqrt(np.maximum(fitted, 0.0)), 0.0), np.nan)
    effect = np.where(measured & (sd == 0), design_effects(tokens, accepted), np.nan)
    return HistoryDrifts(sd, np.where(measured, taus[best], np.nan), effect)


def _lag_covariances(
    centred: FloatArray, seen: npt.NDArray[np.bool_], lags: IntArray
) -> tuple[FloatArray, FloatArray]:
    """Per history and lag: the mean product of blocks `lag` apart where both have an alpha, and
    that mean's variance from the products' own spread (0 and 0 without such a pair), as
    gates.drift._lag_covariance."""
    covariances = np.zeros((len(centred), len(lags)))
    noises = np.zeros_like(covariances)
    for i, lag in enumerate(lags):
        products = centred[:, :-lag] * centred[:, lag:]
        pairs = (seen[:, :-lag] & seen[:, lag:]).sum(axis=1)
        some = np.maximum(pairs, 1)
        covariances[:, i] = np.where(pairs > 0, products.sum(axis=1) / some, 0.0)
        noises[:, i] = np.where(pairs > 0, (products**2).sum(axis=1) / some**2, 0.0)
    return covariances, noises


def design_effects(tokens: FloatArray, accepted: FloatArray) -> FloatArray:
    """gates.history_design_effect of every row: over the blocks with draft tokens (moved to the
    front of the row, the rest zero, so that a lag's products skip the empty blocks as the gate's
    list does), the residuals' Newey-West variance per token over p (1 - p), at least 1; NaN with
    fewer than MIN_DESIGN_WINDOWS such blocks or p at 0 or 1."""
    judged = tokens > 0
    order = np.argsort(~judged, axis=1, kind="stable")
    n, a = np.take_along_axis(tokens, order, axis=1), np.take_along_axis(accepted, order, axis=1)
    m = judged.sum(axis=1).astype(np.float64)
    total = n.sum(axis=1)
    p = a.sum(axis=1) / np.maximum(total, 1e-300)
    residuals = a - p[:, None] * n  # zero in the padding: a = n = 0 there
    lags = np.minimum(HAC_LAGS, np.maximum(m - 1, 0))
    gamma0 = (residuals**2).sum(axis=1) / np.maximum(m, 1)
    variance = gamma0.copy()
    for lag in range(1, HAC_LAGS + 1):
        gamma = (residuals[:, :-lag] * residuals[:, lag:]).sum(axis=1) / np.maximum(m, 1)
        variance += np.where(lag <= lags, 2 * (1 - lag / (lags + 1)) * gamma, 0.0)
    long_run = np.where(m >= 2, np.maximum(variance, gamma0) * m / np.maximum(m - 1, 1), 0.0)
    spread = long_run * m / np.maximum(total, 1e-300)
    inside = (p > 0) & (p < 1) & (m >= MIN_DESIGN_WINDOWS)
    result: FloatArray = np.where(
        inside, np.maximum(spread / np.where(inside, p * (1 - p), 1.0), 1.0), np.nan
    )
    return result
