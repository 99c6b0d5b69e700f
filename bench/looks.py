"""Vectorized twins of the gates' spread arithmetic for the benches, which compute every look at
once: the residuals' Newey-West variance (gates.long_run_variance), its chi-square bound
(gates.variance_upper_bound) and the acceptance test's per-token variance
(gates.acceptance._per_token_variance). Each bench checks its looks against the gates module itself
before printing a figure."""

from __future__ import annotations

import statistics

import numpy as np
import numpy.typing as npt

from specgate.gates import HAC_LAGS, SPREAD_ERROR_SHARE

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
