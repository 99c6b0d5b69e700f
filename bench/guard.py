"""Guard benchmark: false trips per month of a healthy promoted canary, and how long a real drop
takes to trip, per traffic cell (3 / 20 / 200 requests per 15 s window x steady / drifting mix).

The streams come from the request-level traffic model (bench/traffic.py: per-request acceptance,
heavy-tailed lengths, bursts, lulls, minute-scale drift of the mix) in the guard's blocks (60 s:
a 15 s scrape's four). The guard is the operator's (gates.acceptance_guard with the defaults:
falseAlarmsPerMonth 0.1, a 36 h history), looked at once per block.

A month is 43,200 looks, each over 2,160 blocks, so the looks are computed with numpy
(`statistics_per_look`) and checked against gates.acceptance_guard itself on sampled looks
before any figure is printed: the figures are those of the operator's rule. The looks here have a
full history (the guard's steady state; the operator's first hour after a promotion also bounds
the spread by the rollout's drift, which these months never reach).

- guard_false_trips_per_month_<mix>_<rate>: canaries at alpha = gate + indifference for MONTHS
  months each; a trip restarts the count's history (the operator would roll back; the rate is what
  counts); with its one-sided 95 % Poisson upper bound (_upper95).
- guard_p50_min_ / guard_p95_min_<mix>_drop<size>_<rate>: a healthy history, then the mix shifts
  so that alpha drops by 0.10, 0.15 or 0.25 from gate + indifference; minutes from the shift to the
  look that trips (one block or less of scrape and reconcile delay comes on top in a cluster).
- guard_known_spread_h_<cell> and guard_known_spread_p95_min_<mix>_drop<size>_<rate>: what the
  same CUSUM reaches on the same months and drops when it is told the cell's true long-run spread
  per draft token (from 4 h batch means over all the months) instead of estimating it, with the
  lowest threshold (in steps of KNOWN_SPREAD_H_STEP) whose trips per month stay within the budget
  on these months. No estimate from hours of history can do better than knowing the spread, so
  this is the floor of this design on the traffic model, printed beside what the guard measures.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specgate.api import Guard, parse_duration
from specgate.gates import (
    MAX_AUTOCORRELATION,
    MAX_ERROR_ALLOWANCE,
    MAX_GUARD_LAGS,
    MAX_PREWHITENING,
    MAX_SPREAD_ERROR,
    MIN_GUARD_REFERENCE_BLOCKS,
    MONTH_SECONDS,
    NO_DRIFT,
    SPREAD_ERROR_SCALE,
    AcceptanceWindow,
    acceptance_guard,
    guard_threshold,
)
from traffic import DRIFT_SD, Traffic, for_alpha, shifted_for_alpha, windows

FloatArray = npt.NDArray[np.float64]
GATE, DELTA = 0.55, 0.05
DEFAULTS = Guard()
FALSE_ALARMS_PER_MONTH = DEFAULTS.false_alarms_per_month
BLOCK_SECONDS = 60.0  # prometheus.guard_step at a 15 s scrape
HISTORY = int(parse_duration(DEFAULTS.history) // BLOCK_SECONDS)
REFERENCE = HISTORY * 2 // 3
RATES = (3, 20, 200)  # requests per 15 s window
MIXES = {"steady": 0.0, "drift": DRIFT_SD}
DROPS = (0.10, 0.15, 0.25)
# A month at 3 or 20 requests a window simulates in about 1.3 s, at 200 in 24 s. 100 months left a
# rate of 0.08 (8 trips) with an upper bound of 0.144 over a budget of 0.1; 300 tell 0.05 from 0.1.
MONTHS = {3: 300, 20: 300, 200: 40}
DELAY_TRIALS = 100
MAX_DELAY_BLOCKS = 360  # six hours
CHECKED_LOOKS = 40
# 4 h batch means: far past the drift's timescale, so their variance per token is the long-run one.
SPREAD_BATCH_BLOCKS = 240
KNOWN_SPREAD_H_STEP = 0.5
KNOWN_SPREAD_THRESHOLDS = np.arange(6.0, 24.0 + KNOWN_SPREAD_H_STEP / 2, KNOWN_SPREAD_H_STEP)


@dataclass(frozen=True)
class Cell:
    mix: str
    requests_per_window: int

    @property
    def name(self) -> str:
        return f"{self.mix}_{self.requests_per_window}"

    def traffic(self, alpha: float) -> Traffic:
        return for_alpha(
            alpha,
            self.requests_per_window * BLOCK_SECONDS / 15.0,
            window_seconds=BLOCK_SECONDS,
            drift_sd=MIXES[self.mix],
        )


def _window_sums(values: FloatArray, starts: npt.NDArray[np.int64], length: int) -> FloatArray:
    """Sum of values[s : s + length] for each start s."""
    prefix = np.concatenate(([0.0], np.cumsum(values)))
    result: FloatArray = prefix[starts + length] - prefix[starts]
    return result


def spread_per_look(accepted: FloatArray, tokens: FloatArray) -> tuple[FloatArray, FloatArray]:
    """gates.guard_spread's s^2 per draft token and gates.acceptance_guard's threshold for the look
    over blocks s .. s + HISTORY - 1, for every s at once: the older REFERENCE blocks' prewhitened
    long-run variance (binomial floor), and the threshold for its relative error."""
    m = REFERENCE
    starts = np.arange(len(accepted) - HISTORY + 1)
    n_ref = _window_sums(tokens, starts, m)
    alpha = _window_sums(accepted, starts, m) / np.maximum(n_ref, 1e-12)
    top = min(m - 1, MAX_GUARD_LAGS + 1)
    gamma = np.zeros((top + 1, len(starts)))
    for lag in range(top + 1):
        a0, a1 = accepted[: len(accepted) - lag], accepted[lag:]
        n0, n1 = tokens[: len(tokens) - lag], tokens[lag:]
        aa = _window_sums(a0 * a1, starts, m - lag)
        an = _window_sums(a0 * n1 + n0 * a1, starts, m - lag)
        nn = _window_sums(n0 * n1, starts, m - lag)
        gamma[lag] = (aa - alpha * an + alpha**2 * nn) / m
    safe0 = np.where(gamma[0] > 0, gamma[0], 1.0)
    rho = np.where(gamma[0] > 0, np.clip(gamma[1] / safe0, 0.0, MAX_PREWHITENING), 0.0)
    k = np.arange(top)[:, None]
    whitened = (1 + rho**2) * gamma[:top] - rho * (gamma[np.abs(k - 1)[:, 0]] + gamma[1 : top + 1])
    w0 = np.where(whitened[0] > 0, whitened[0], 1.0)
    rho_e = np.clip(whitened[1] / w0, 0.0, MAX_AUTOCORRELATION)
    plug_in = 4 * rho_e**2 / ((1 - rho_e) ** 2 * (1 + rho_e) ** 2)
    bandwidth = np.minimum(np.maximum(1.1447 * np.cbrt(plug_in * m), 1.0), top)
    lags = np.minimum(np.ceil(bandwidth) - 1, top - 1)
    weights = np.where((k >= 1) & (k <= lags), 1 - k / bandwidth, 0.0)
    variance = whitened[0] + 2 * (weights * whitened).sum(axis=0)
    recoloured = np.maximum(variance / (1 - rho) ** 2, gamma[0])
    lrv = np.where(whitened[0] > 0, recoloured, gamma[0]) * m / (m - 1)
    a_ref = alpha * n_ref
    binomial = (a_ref + 1) / (n_ref + 2) * (n_ref - a_ref + 1) / (n_ref + 2)
    spread: FloatArray = np.maximum(lrv * m / np.maximum(n_ref, 1e-12), binomial)
    error = np.minimum(SPREAD_ERROR_SCALE * np.sqrt((1 + rho) / (1 - rho) / m), MAX_SPREAD_ERROR)
    return spread, threshold_per_look(error)


def threshold_per_look(spread_error: FloatArray) -> FloatArray:
    """gates.guard_threshold at each look's relative spread error (gates.threshold_for_spread_error,
    at most MAX_ERROR_ALLOWANCE above h0)."""
    h0 = guard_threshold(FALSE_ALARMS_PER_MONTH, BLOCK_SECONDS)
    c = np.sqrt(1 + 2 * spread_error**2 * h0)
    result: FloatArray = np.minimum(2 * h0 * np.exp(c - 1) / (1 + c), h0 + MAX_ERROR_ALLOWANCE)
    return result


def ranges_per_look(accepted: FloatArray, tokens: FloatArray) -> FloatArray:
    """At each look t >= HISTORY - 1, how far sum(gate * n - a) over the blocks' suffixes rises above
    its lowest point in blocks t - HISTORY + 1 .. t: the CUSUM in draft tokens, before its 2 delta / s^2."""
    walk = np.concatenate(([0.0], np.cumsum(GATE * tokens - accepted)))
    lowest = sliding_window_view(walk, HISTORY + 1).min(axis=1)
    result: FloatArray = walk[HISTORY:] - lowest
    return result


def statistics_per_look(accepted: FloatArray, tokens: FloatArray) -> tuple[FloatArray, FloatArray]:
    """gates.acceptance_guard's CUSUM and threshold at each look t >= HISTORY - 1 over blocks
    t - HISTORY + 1 .. t."""
    s2, thresholds = spread_per_look(accepted, tokens)
    return cusum(ranges_per_look(accepted, tokens), s2), thresholds


def cusum(ranges: FloatArray, spread: FloatArray | float) -> FloatArray:
    """The CUSUM's log likelihood ratio from its range in draft tokens and s^2 per draft token."""
    result: FloatArray = 2 * DELTA * ranges / spread
    return result


def check_against_the_operator(accepted: FloatArray, tokens: FloatArray, rng: random.Random) -> None:
    """The vectorized looks (CUSUM and threshold) equal gates.acceptance_guard's on sampled looks, or
    the bench stops."""
    computed, thresholds = statistics_per_look(accepted, tokens)
    for t in rng.sample(range(len(computed)), min(CHECKED_LOOKS, len(computed))):
        history = [
            AcceptanceWindow(0, float(n), float(a))
            for a, n in zip(accepted[t : t + HISTORY], tokens[t : t + HISTORY], strict=True)
        ]
        result = acceptance_guard(
            history,
            GATE,
            indifference=DELTA,
            false_alarms_per_month=FALSE_ALARMS_PER_MONTH,
            block_seconds=BLOCK_SECONDS,
            drift=NO_DRIFT,
        )
        for name, mine, theirs in (
            ("CUSUM", computed[t], result.statistic),
            ("threshold", thresholds[t], result.threshold),
        ):
            if not math.isclose(mine, theirs, rel_tol=1e-6, abs_tol=1e-9):
                raise SystemExit(
                    f"vectorized guard {name} {mine} != gates.acceptance_guard's {theirs} at look {t}"
                )
    assert REFERENCE >= MIN_GUARD_REFERENCE_BLOCKS  # the looks above measured their own spread


@dataclass
class Months:
    """A cell's healthy months: the guard's trips and monthly maxima, and what the known-spread
    reference needs (each look's CUSUM range, and 4 h batch sums for the true spread)."""

    trips: int
    maxima: list[float]  # the CUSUM over its threshold
    ranges: list[npt.NDArray[np.float32]]
    batch_accepted: list[FloatArray]
    batch_tokens: list[FloatArray]
    thresholds: list[float] = field(default_factory=list)  # each month's median threshold

    def true_spread(self) -> float:
        """The long-run variance per draft token of the months' 4 h batch residuals."""
        accepted, tokens = np.concatenate(self.batch_accepted), np.concatenate(self.batch_tokens)
        alpha = accepted.sum() / tokens.sum()
        return float(((accepted - alpha * tokens) ** 2).sum() / tokens.sum())


def count_trips(statistic: npt.NDArray[np.floating[Any]], threshold: float | FloatArray) -> int:
    """Looks at or over the threshold (one, or each look's), one per history: after a trip the
    history starts afresh."""
    trips, last = 0, -HISTORY
    for look in np.flatnonzero(statistic >= threshold):
        if look >= last + HISTORY:
            trips, last = trips + 1, int(look)
    return trips


def _batch_sums(values: FloatArray) -> FloatArray:
    whole = len(values) // SPREAD_BATCH_BLOCKS * SPREAD_BATCH_BLOCKS
    result: FloatArray = values[:whole].reshape(-1, SPREAD_BATCH_BLOCKS).sum(axis=1)
    return result


def false_trips(cell: Cell, months: int, seed: int) -> Months:
    """The guard over `months` months of a healthy canary."""
    rng, checker = np.random.default_rng(seed), random.Random(seed)
    traffic = cell.traffic(GATE + DELTA)
    per_month = int(MONTH_SECONDS // BLOCK_SECONDS)
    result = Months(0, [], [], [], [])
    for month in range(months):
        counts = windows(traffic, per_month + HISTORY - 1, rng)
        accepted, tokens = counts[:, 2], counts[:, 1]
        if month == 0:
            check_against_the_operator(accepted, tokens, checker)
        ranges = ranges_per_look(accepted, tokens)
        spread, thresholds = spread_per_look(accepted, tokens)
        statistic = cusum(ranges, spread)
        result.trips += count_trips(statistic, thresholds)
        result.maxima.append(float((statistic / thresholds).max()))
        result.thresholds.append(float(np.median(thresholds)))
        result.ranges.append(ranges.astype(np.float32))
        result.batch_accepted.append(_batch_sums(accepted))
        result.batch_tokens.append(_batch_sums(tokens))
    return result


def known_spread_threshold(months: Months, spread: float) -> float:
    """The lowest threshold of KNOWN_SPREAD_THRESHOLDS whose trips per month, with s^2 = `spread`,
    are within the budget on these months (inf if none is). The CUSUM reaches h where its range
    reaches h s^2 / (2 delta): the months' ranges are compared with that, not rescaled."""
    for h in KNOWN_SPREAD_THRESHOLDS:
        in_tokens = float(h) * spread / (2 * DELTA)
        trips = sum(count_trips(ranges, in_tokens) for ranges in months.ranges)
        if trips <= FALSE_ALARMS_PER_MONTH * len(months.ranges):
            return float(h)
    return math.inf


def first_trip_minutes(statistic: FloatArray, threshold: float | FloatArray) -> float:
    """Minutes from the shift to the look that trips (inf: none). Look k ends at block
    k + HISTORY - 1; the shift is at the start of block HISTORY."""
    if not np.isscalar(threshold):
        threshold = threshold[1:]
    after = np.flatnonzero(statistic[1:] >= threshold)
    return float((after[0] + 1) * BLOCK_SECONDS / 60) if len(after) else math.inf


def detection_minutes(
    cell: Cell, drop: float, seed: int, known_spread: tuple[float, float]
) -> tuple[list[float], list[float]]:
    """Sorted minutes from the shift to the tripping look (inf: not within MAX_DELAY_BLOCKS): the
    guard's, and the same CUSUM's with known_spread = (s^2, its threshold)."""
    rng = np.random.default_rng(seed)
    healthy = cell.traffic(GATE + DELTA)
    shift = shifted_for_alpha(healthy, GATE + DELTA - drop)
    t0 = HISTORY * BLOCK_SECONDS
    dropped: Callable[[np.ndarray], np.ndarray] = lambda t: np.where(t >= t0, shift, 0.0)  # noqa: E731
    spread, known_threshold = known_spread
    guard, known = [], []
    for _ in range(DELAY_TRIALS):
        counts = windows(healthy, HISTORY + MAX_DELAY_BLOCKS, rng, mu_shift=dropped)
        accepted, tokens = counts[:, 2], counts[:, 1]
        ranges = ranges_per_look(accepted, tokens)
        estimated, thresholds = spread_per_look(accepted, tokens)
        guard.append(first_trip_minutes(cusum(ranges, estimated), thresholds))
        known.append(first_trip_minutes(cusum(ranges, spread), known_threshold))
    return sorted(guard), sorted(known)


def poisson_upper95(count: int, exposure: float) -> float:
    """One-sided 95 % upper bound of a Poisson rate from `count` events in `exposure` (bisection on
    P(X <= count; mu) = 0.05)."""
    low, high = 0.0, 10.0 * (count + 3)
    for _ in range(100):
        mu = (low + high) / 2
        cdf = sum(math.exp(-mu + k * math.log(mu) - math.lgamma(k + 1)) for k in range(count + 1))
        low, high = (mu, high) if cdf > 0.05 else (low, mu)
    return high / exposure


def quantile(values: list[float], q: float) -> float:
    return values[math.ceil(q * len(values)) - 1]


def run_cell(cell: Cell, months: int, seed: int) -> dict[str, str]:
    healthy = false_trips(cell, months, seed)
    spread = healthy.true_spread()
    known_threshold = known_spread_threshold(healthy, spread)
    maxima = sorted(healthy.maxima)
    figures = {
        f"guard_false_trips_per_month_{cell.name}": f"{healthy.trips / months:.3f}",
        f"guard_false_trips_per_month_upper95_{cell.name}": f"{poisson_upper95(healthy.trips, months):.3f}",
        f"guard_monthly_max_over_threshold_p50_p90_max_{cell.name}": "/".join(
            f"{v:.2f}" for v in (quantile(maxima, 0.5), quantile(maxima, 0.9), maxima[-1])
        ),
        f"guard_threshold_p50_{cell.name}": f"{float(np.median(healthy.thresholds)):.2f}",
        f"guard_true_spread_{cell.name}": f"{spread:.1f}",
        f"guard_known_spread_h_{cell.name}": f"{known_threshold:.1f}",
    }
    for i, drop in enumerate(DROPS):
        guard, known = detection_minutes(cell, drop, seed + 1000 * (i + 1), (spread, known_threshold))
        tag = f"{cell.mix}_drop{round(drop * 100):03d}_{cell.requests_per_window}"
        figures[f"guard_p50_min_{tag}"] = f"{quantile(guard, 0.5):.0f}"
        figures[f"guard_p95_min_{tag}"] = f"{quantile(guard, 0.95):.0f}"
        figures[f"guard_known_spread_p95_min_{tag}"] = f"{quantile(known, 0.95):.0f}"
    print(
        f"{cell.name}: {healthy.trips} trips in {months} months; "
        + " ".join(f"{k}={v}" for k, v in figures.items()),
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--months-scale", type=float, default=1.0, help="fewer months (e.g. 0.1) for a quick look"
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=16, help="the first cell's seed (the others follow it)")
    args = parser.parse_args()
    cells = [Cell(mix, rate) for rate in reversed(RATES) for mix in MIXES]
    print(
        f"guard threshold {guard_threshold(FALSE_ALARMS_PER_MONTH, BLOCK_SECONDS):.2f} with the spread "
        f"known, {guard_threshold(FALSE_ALARMS_PER_MONTH, BLOCK_SECONDS, 0.15):.2f} / "
        f"{guard_threshold(FALSE_ALARMS_PER_MONTH, BLOCK_SECONDS, 0.25):.2f} at its relative error 0.15 / 0.25 "
        f"({BLOCK_SECONDS:g}s blocks, history {HISTORY} blocks, seed {args.seed})",
        flush=True,
    )
    with ProcessPoolExecutor(args.jobs) as pool:
        jobs = [
            pool.submit(
                run_cell,
                cell,
                max(1, round(MONTHS[cell.requests_per_window] * args.months_scale)),
                args.seed + i,
            )
            for i, cell in enumerate(cells)
        ]
        figures: dict[str, str] = {}
        for job in jobs:
            figures.update(job.result())
    uppers = {
        mix: max(float(figures[f"guard_false_trips_per_month_upper95_{mix}_{r}"]) for r in RATES)
        for mix in MIXES
    }
    summary = {
        "guard_false_trips_per_month_upper95": f"{max(uppers.values()):.3f}",
        **{f"guard_false_trips_per_month_upper95_{mix}": f"{v:.3f}" for mix, v in uppers.items()},
        **{k: figures[k] for k in (
            "guard_p95_min_steady_drop010_20", "guard_p95_min_steady_drop010_200",
            "guard_p95_min_drift_drop025_20", "guard_p95_min_drift_drop015_20", "guard_p95_min_drift_drop010_20",
            "guard_known_spread_p95_min_steady_drop010_20", "guard_known_spread_p95_min_drift_drop025_20",
        )},
    }  # fmt: skip
    print(" ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
