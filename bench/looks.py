"""Vectorized twin of gates.acceptance._per_token_variance for the benches, which compute every look at once;
each bench checks its looks against the gates module itself before printing a figure."""

from __future__ import annotations

import statistics

import numpy as np
import numpy.typing as npt

from specgate.gates import SPREAD_ERROR_SHARE

FloatArray = npt.NDArray[np.float64]


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
    z = statistics.NormalDist().inv_cdf(error_rate * SPREAD_ERROR_SHARE)
    quantile = dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3
    spread = variance * dof / np.maximum(quantile, 1e-9)
    binomial = (accepted + 1) / (tokens + 2) * (tokens - accepted + 1) / (tokens + 2)
    result: FloatArray = np.maximum(spread * windows / np.maximum(tokens, 1e-12), binomial)
    return result
