"""Guard benchmark: false trips per month of a healthy canary, and how long a real drop takes to trip.

The streams come from the request-level traffic model (bench/traffic.py: per-request acceptance,
heavy-tailed lengths, bursts, lulls, minute-scale drift of the mix). The guard is the operator's
(gates.acceptance_guard with the defaults: falseAlarmsPerMonth 0.1, a 30 min history), looked at
once per acceptance window, as the operator sees each window once.

A month is 172,800 looks at 15-s windows, each over 120 windows, so the looks are computed with
numpy (`statistics_per_look`) and checked against gates.acceptance_guard itself on sampled looks
before any figure is printed: the figures are those of the operator's rule.

- guard_false_trips_per_month: canaries at alpha = gate + indifference for MONTHS months each; a
  trip restarts the guard's history (the operator would roll back; the rate is what counts).
- guard_detection_delay_p50_s / _p95_s: a healthy 30 min, then the mix shifts so that alpha is
  gate - indifference; seconds from the shift to the look that trips (one window or less of
  scrape and reconcile delay comes on top in a cluster).
Both at 15-s windows and at the 30-s windows a 30-s scrape forces, at the same request rate.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from looks import per_token_variance
from specgate.gates import (
    MAX_AUTOCORRELATION,
    MIN_GUARD_WINDOWS,
    AcceptanceWindow,
    acceptance_guard,
    guard_threshold,
)
from traffic import Traffic, for_alpha, shifted_for_alpha, windows

GATE, DELTA, ERROR_RATE = 0.55, 0.05, 0.05
FALSE_ALARMS_PER_MONTH = 0.1
HISTORY_SECONDS = 30 * 60
MONTH_SECONDS = 30 * 24 * 3600
REQUESTS_PER_SECOND = 20 / 15  # the middle cell: 20 requests per 15-s window
MONTHS = 40
DELAY_TRIALS = 200
MAX_DELAY_SECONDS = 3600
CHECKED_LOOKS = 200


@dataclass(frozen=True)
class Cell:
    window_seconds: float

    @property
    def history(self) -> int:
        return int(HISTORY_SECONDS // self.window_seconds)

    @property
    def reference(self) -> int:
        return max(MIN_GUARD_WINDOWS, self.history * 2 // 3)

    def traffic(self, alpha: float) -> Traffic:
        return for_alpha(alpha, REQUESTS_PER_SECOND * self.window_seconds, window_seconds=self.window_seconds)


def _window_sums(values: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """Sum of values[s : s + length] for each start s."""
    prefix = np.concatenate(([0.0], np.cumsum(values)))
    return prefix[starts + length] - prefix[starts]


def statistics_per_look(accepted: np.ndarray, tokens: np.ndarray, cell: Cell) -> np.ndarray:
    """The guard's CUSUM at each look t >= history - 1 over windows t - history + 1 .. t: the same
    arithmetic as gates.acceptance_guard (spread over the older two thirds, data-driven Bartlett
    horizon, chi-square bound, binomial floor), for every look at once."""
    h, r = cell.history, cell.reference
    looks = len(accepted) - h + 1
    starts = np.arange(looks)
    n_ref = _window_sums(tokens, starts, r)
    alpha = _window_sums(accepted, starts, r) / np.maximum(n_ref, 1e-12)
    max_lag = r - 1
    gamma = np.zeros((max_lag + 1, looks))
    for lag in range(max_lag + 1):
        a0, a1 = accepted[: len(accepted) - lag], accepted[lag:]
        n0, n1 = tokens[: len(tokens) - lag], tokens[lag:]
        aa = _window_sums(a0 * a1, starts, r - lag)
        an = _window_sums(a0 * n1 + n0 * a1, starts, r - lag)
        nn = _window_sums(n0 * n1, starts, r - lag)
        gamma[lag] = (aa - alpha * an + alpha**2 * nn) / r
    rho = np.where(
        gamma[0] > 0, np.clip(gamma[1] / np.where(gamma[0] > 0, gamma[0], 1), 0, MAX_AUTOCORRELATION), 0
    )
    plug_in = 4 * rho**2 / ((1 - rho) ** 2 * (1 + rho) ** 2)
    bandwidth = np.minimum(np.maximum(1.1447 * (plug_in * r) ** (1 / 3), 1.0), r / 2)
    lags = np.minimum(np.ceil(bandwidth) - 1, r - 1)
    lag_index = np.arange(max_lag + 1)[:, None]
    weights = np.where((lag_index >= 1) & (lag_index <= lags), 1 - lag_index / bandwidth, 0.0)
    variance = np.maximum(gamma[0] + 2 * (weights * gamma).sum(axis=0), gamma[0]) * r / (r - 1)
    dof = np.maximum(1, np.minimum(r - 1, np.round(1.5 * r / bandwidth)))
    s2 = per_token_variance(variance, dof, r, n_ref, alpha * n_ref, ERROR_RATE)
    walk = np.concatenate(([0.0], np.cumsum(GATE * tokens - accepted)))
    lowest = sliding_window_view(walk, h + 1).min(axis=1)
    return 2 * DELTA * (walk[h:] - lowest) / s2


def check_against_the_operator(
    accepted: np.ndarray, tokens: np.ndarray, cell: Cell, rng: random.Random
) -> None:
    """The vectorized looks equal gates.acceptance_guard's on sampled looks, or the bench stops."""
    computed = statistics_per_look(accepted, tokens, cell)
    h = cell.history
    for t in rng.sample(range(len(computed)), min(CHECKED_LOOKS, len(computed))):
        history = [
            AcceptanceWindow(0, float(n), float(a))
            for a, n in zip(accepted[t : t + h], tokens[t : t + h], strict=True)
        ]
        expected = acceptance_guard(
            history,
            GATE,
            indifference=DELTA,
            error_rate=ERROR_RATE,
            false_alarms_per_month=FALSE_ALARMS_PER_MONTH,
            window_seconds=cell.window_seconds,
        ).statistic
        if not math.isclose(computed[t], expected, rel_tol=1e-6, abs_tol=1e-9):
            raise SystemExit(
                f"vectorized guard {computed[t]} != gates.acceptance_guard {expected} at look {t}"
            )


def false_trips(cell: Cell, rng: np.random.Generator, checker: random.Random) -> tuple[int, float]:
    """(trips, months) for healthy canaries at gate + indifference."""
    traffic = cell.traffic(GATE + DELTA)
    threshold = guard_threshold(FALSE_ALARMS_PER_MONTH, cell.window_seconds)
    per_month = int(MONTH_SECONDS // cell.window_seconds)
    trips = 0
    for month in range(MONTHS):
        counts = windows(traffic, per_month + cell.history, rng)
        accepted, tokens = counts[:, 2], counts[:, 1]
        if month == 0:
            check_against_the_operator(accepted, tokens, cell, checker)
        tripped = np.flatnonzero(statistics_per_look(accepted, tokens, cell) >= threshold)
        last = -cell.history
        for look in tripped:  # after a trip the history starts afresh
            if look >= last + cell.history:
                trips, last = trips + 1, look
    return trips, float(MONTHS)


def detection_delays(cell: Cell, rng: np.random.Generator) -> list[float]:
    """Seconds from the shift to gate - indifference to the tripping look (inf: not within an hour)."""
    healthy = cell.traffic(GATE + DELTA)
    shift = shifted_for_alpha(healthy, GATE - DELTA)
    t0 = HISTORY_SECONDS
    dropped: Callable[[np.ndarray], np.ndarray] = lambda t: np.where(t >= t0, shift, 0.0)  # noqa: E731
    threshold = guard_threshold(FALSE_ALARMS_PER_MONTH, cell.window_seconds)
    count = cell.history + int(MAX_DELAY_SECONDS // cell.window_seconds)
    delays = []
    for _ in range(DELAY_TRIALS):
        counts = windows(healthy, count, rng, mu_shift=dropped)
        s = statistics_per_look(counts[:, 2], counts[:, 1], cell)
        # look k ends at (k + history) windows; the shift is at the end of the first history
        after = np.flatnonzero(s[1:] >= threshold)
        delays.append(float((after[0] + 1) * cell.window_seconds) if len(after) else math.inf)
    return delays


def main() -> None:
    rng, checker = np.random.default_rng(16), random.Random(16)
    figures: dict[str, str] = {}
    for cell in (Cell(15.0), Cell(30.0)):
        trips, months = false_trips(cell, rng, checker)
        delays = sorted(detection_delays(cell, rng))
        p50, p95 = delays[len(delays) // 2], delays[math.ceil(0.95 * len(delays)) - 1]
        suffix = "" if cell.window_seconds == 15 else f"_{cell.window_seconds:g}s"
        figures[f"guard_false_trips_per_month{suffix}"] = f"{trips / months:.3f}"
        figures[f"guard_false_trips{suffix}"] = f"{trips}/{months:g}months"
        figures[f"guard_detection_delay_p50_s{suffix}"] = f"{p50:.0f}"
        figures[f"guard_detection_delay_p95_s{suffix}"] = f"{p95:.0f}"
        print(
            f"windows {cell.window_seconds:g}s history {cell.history}: false trips {trips} in {months:g} months; "
            f"delay after a drop to {GATE - DELTA:g}: p50 {p50:.0f}s p95 {p95:.0f}s",
            flush=True,
        )
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
