"""Speedup-gate benchmark: gates.speedup_gate on simulated request_time_per_output_token windows,
stopping as rollout.py stops, for canaries at known per-token speedups.

The latency model is the latency issue's (issue 58): each request's time per output token is
lognormal with log-sd PACE_LOG_SD (0.3, the wider of its two) at the GPU scale (a baseline P99 of
40 ms); the canary's is the baseline's divided by the cell's speedup (0.90: 10 % slower per token;
1.20: 20 % faster). Arrivals: bench/traffic.py's Poisson process with bursts and lulls, each track
serving REQUESTS a window on average (some windows empty at 3). A drifting mix moves both tracks'
pace together by exp(z), z an Ornstein-Uhlenbeck process of sd MIX_PACE_SD (log units) and
timescale MIX_SECONDS, per window: the mix's longer or harder prompts at the moment.

Each 15-s window gives each track's sum and count of the finished requests' per-token times (a
window's mean of n lognormals: drawn exactly up to EXACT_MAX requests, else normal with the exact
mean and variance). As rollout.py judges: the gate over every window since the analysis began,
looked at once a window; a Fail stops at once, a Pass from analysisWindow (5 min) on; at
maxAnalysisDuration (60 min) gates.decide_speedup_at_deadline: the estimate's side where precise
enough, else Inconclusive (rolled back by default). The looks are computed with numpy and checked
against gates.speedup_gate and gates.decide_speedup_at_deadline on sampled looks before a figure is
printed.

Wrong promote: a Pass below the gate (speedup < minSpeedup - indifference). Bad outcome at 1.05: a
canary 5 % faster rolled back (Fail or Inconclusive). 95 % Wilson bounds beside each rate. Last line:
the figures issue 60 asks for, as name=value.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decisions import wilson
from looks import chi_square_bound, ratio_long_run_variances
from specgate import api
from specgate.gates import (
    MIN_WINDOWS,
    SPEEDUP_INDIFFERENCE,
    PerTokenWindow,
    Verdict,
    decide_speedup_at_deadline,
    speedup_gate,
    sprt_bounds,
    student_t_quantile,
)
from specgate.gates.speedup import MIN_RELATIVE_SPREAD
from traffic import Traffic, _rate_segments

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

ROLLOUT = api.RolloutSpec()
GATE = 1.0  # minSpeedup's default
DELTA = SPEEDUP_INDIFFERENCE
ERROR_RATE = api.Gates().error_rate
WINDOW_SECONDS = 15.0
ANALYSIS_LOOKS = math.ceil(api.parse_duration(ROLLOUT.analysis_window) / WINDOW_SECONDS)
LOOKS = int(api.parse_duration(ROLLOUT.max_analysis_duration) // WINDOW_SECONDS)
SPEEDUPS = (0.90, 0.95, 0.97, 1.00, 1.05, 1.20)
REQUESTS = (3, 20, 200)
LOW_TRAFFIC = 3
PACE_LOG_SD = 0.3
BASELINE_MEDIAN_S = 0.040 / math.exp(2.3263 * PACE_LOG_SD)  # P99 40 ms
MIX_PACE_SD = 0.3  # log units: the mix moves the pace x0.74 to x1.35 (1 sd) over minutes
MIX_SECONDS = 180.0
MIXES = (0.0, MIX_PACE_SD)
EXACT_MAX = 30  # a window's mean of more requests is drawn as a normal (skewness <= 0.17)
TRIALS = 1000
CHECKED_TRIALS, CHECKED_LOOKS = 2, 12  # per cell: looks recomputed by the gates module itself
PASS, NONE, FAIL = 1, 0, -1


@dataclass(frozen=True)
class Outcome:
    verdict: int  # PASS, FAIL, or NONE (Inconclusive)
    seconds: float  # when the rollout acts


def window_counts(requests: float, rng: np.random.Generator) -> FloatArray:
    """Expected requests per track in each window: the traffic model's bursts and lulls."""
    segments = _rate_segments(Traffic(0.5, requests, drift_sd=0.0), 0.0, LOOKS * WINDOW_SECONDS, rng)
    edges = np.arange(LOOKS + 1) * WINDOW_SECONDS
    expected = np.zeros(LOOKS)
    for begin, end, rate in segments:
        overlap = np.clip(np.minimum(edges[1:], end) - np.maximum(edges[:-1], begin), 0.0, None)
        expected += overlap * rate
    return expected


def mix_path(mix_sd: float, rng: np.random.Generator) -> FloatArray:
    """Stationary OU z per window (exact AR(1) transition)."""
    if mix_sd == 0:
        return np.zeros(LOOKS)
    rho = math.exp(-WINDOW_SECONDS / MIX_SECONDS)
    z = np.empty(LOOKS)
    z[0] = rng.standard_normal() * mix_sd
    noise = rng.standard_normal(LOOKS) * mix_sd * math.sqrt(1 - rho * rho)
    for i in range(1, LOOKS):
        z[i] = rho * z[i - 1] + noise[i]
    return z


def window_sums(counts: IntArray, median: FloatArray, rng: np.random.Generator) -> FloatArray:
    """Sum of `counts` lognormal per-token times (median per window, log-sd PACE_LOG_SD) per window."""
    sums = np.zeros(len(counts))
    exact = (counts > 0) & (counts <= EXACT_MAX)
    if exact.any():
        n = counts[exact]
        draws = np.exp(rng.standard_normal(int(n.sum())) * PACE_LOG_SD)
        starts = np.concatenate(([0], np.cumsum(n)[:-1]))
        sums[exact] = np.add.reduceat(draws, starts) * median[exact]
    big = counts > EXACT_MAX
    if big.any():
        n = counts[big].astype(np.float64)
        mean = math.exp(PACE_LOG_SD**2 / 2)
        sd = math.sqrt((math.exp(PACE_LOG_SD**2) - 1) * math.exp(PACE_LOG_SD**2))
        sums[big] = (n * mean + np.sqrt(n) * sd * rng.standard_normal(len(n))) * median[big]
    return sums


def trial_windows(requests: float, speedup: float, mix_sd: float, rng: np.random.Generator) -> FloatArray:
    """Rows (baseline sum, baseline count, canary sum, canary count) per window."""
    expected = window_counts(requests, rng)
    median = BASELINE_MEDIAN_S * np.exp(mix_path(mix_sd, rng))
    nb, nc = rng.poisson(expected), rng.poisson(expected)
    return np.column_stack((window_sums(nb, median, rng), nb, window_sums(nc, median / speedup, rng), nc))


_T_QUANTILES = np.array([math.nan] + [student_t_quantile(1 - ERROR_RATE, d) for d in range(1, LOOKS + 1)])


def verdicts_per_look(rows: FloatArray) -> tuple[IntArray, IntArray]:
    """gates.speedup_gate's verdict over windows 1..j for every j (the same arithmetic: unusable
    windows left out, weights 1 / (1 / n_b + 1 / n_c), the residuals' Newey-West spread, its
    chi-square bound and floor, Wald's bounds less the overshoot), and per look what
    gates.decide_speedup_at_deadline would make of an undecided one (PASS, FAIL or NONE)."""
    per_look = np.zeros(len(rows), dtype=np.int64)
    deadline = np.zeros(len(rows), dtype=np.int64)
    usable = (rows > 0).all(axis=1) & (rows[:, 1] >= 1) & (rows[:, 3] >= 1)
    sb, nb, sc, nc = rows[usable].T
    c = len(nb)
    if c < MIN_WINDOWS:
        return per_look, deadline
    w = 1 / (1 / nb + 1 / nc)
    p, q = w * sb / nb, w * sc / nc
    speedup, variance = ratio_long_run_variances(p, q)
    m = np.arange(1, c + 1, dtype=np.float64)
    big_a, big_n = np.cumsum(p), np.cumsum(q)
    floor = (MIN_RELATIVE_SPREAD * big_a / m) ** 2
    bounded = np.maximum(chi_square_bound(variance, np.maximum(m - 1, 1), ERROR_RATE), floor)
    llr = 2 * DELTA * (speedup - GATE) / (m * bounded / big_n**2)
    step_sd = 2 * DELTA * big_n / (m * np.sqrt(bounded))
    bounds = np.array([sprt_bounds(ERROR_RATE, s) for s in step_sd])
    verdict = np.where(llr >= bounds[:, 1], PASS, np.where(llr <= bounds[:, 0], FAIL, NONE))
    radius = _T_QUANTILES[np.maximum(m - 1, 1).astype(np.int64)] * np.sqrt(m * variance / big_n**2)
    side = np.where(speedup >= GATE, PASS, FAIL)
    decided = np.where(radius <= np.abs(speedup - GATE) + DELTA, side, NONE)
    verdict[: MIN_WINDOWS - 1] = NONE
    decided[: MIN_WINDOWS - 1] = NONE
    so_far = np.cumsum(usable)
    looks = np.flatnonzero(so_far >= MIN_WINDOWS)
    per_look[looks] = verdict[so_far[looks] - 1]
    deadline[looks] = np.where(per_look[looks] == NONE, decided[so_far[looks] - 1], per_look[looks])
    return per_look, deadline


def check_against_the_operator(
    rows: FloatArray, per_look: IntArray, deadline: IntArray, rng: random.Random
) -> None:
    """The vectorized looks give the gates module's verdicts on sampled looks, or the bench stops
    (a look whose log-LR sits on a bound to rounding is compared by its log-LR alone)."""
    for j in rng.sample(range(1, len(rows) + 1), min(CHECKED_LOOKS, len(rows))):
        windows = [PerTokenWindow(*map(float, row)) for row in rows[:j]]
        result = speedup_gate(windows, GATE, error_rate=ERROR_RATE, indifference=DELTA)
        at_deadline = decide_speedup_at_deadline(
            result, windows, GATE, error_rate=ERROR_RATE, indifference=DELTA
        )
        if _code(at_deadline.verdict) != deadline[j - 1]:
            raise SystemExit(f"vectorized deadline {deadline[j - 1]} != {at_deadline.verdict} at look {j}")
        on_bound = (
            result.statistic is not None
            and result.bound is not None
            and (math.isclose(abs(result.statistic), result.bound, rel_tol=1e-9))
        )
        if _code(result.verdict) != per_look[j - 1] and not on_bound:
            raise SystemExit(
                f"vectorized gate {per_look[j - 1]} != speedup_gate {result.verdict} at look {j}"
            )


def _code(verdict: Verdict) -> int:
    return {Verdict.PASS: PASS, Verdict.FAIL: FAIL}.get(verdict, NONE)


def outcome(per_look: IntArray, deadline: IntArray) -> Outcome:
    """As rollout.py: a Fail stops at once, a Pass from analysisWindow on; at the deadline the
    deadline rule's verdict (NONE: Inconclusive)."""
    for j, verdict in enumerate(per_look, start=1):
        if verdict == FAIL or (verdict == PASS and j >= ANALYSIS_LOOKS):
            return Outcome(int(verdict), j * WINDOW_SECONDS)
    return Outcome(int(deadline[-1]), len(per_look) * WINDOW_SECONDS)


@dataclass
class Cell:
    requests: int
    mix: float
    speedup: float
    outcomes: list[Outcome]

    def share(self, verdict: int) -> float:
        return sum(o.verdict == verdict for o in self.outcomes) / len(self.outcomes)

    def bad(self) -> float:
        """A canary below the zone promoted, or one above it rolled back (Fail or Inconclusive)."""
        if self.speedup < GATE - DELTA - 1e-9:
            return self.share(PASS)
        if self.speedup > GATE + DELTA + 1e-9:
            return 1 - self.share(PASS)
        return 0.0  # inside the zone either verdict is acceptable

    def median_minutes(self) -> float:
        return statistics.median(o.seconds for o in self.outcomes) / 60


def run_cell(
    requests: int, mix: float, speedup: float, trials: int, seed: int, checker: random.Random
) -> Cell:
    rng = np.random.default_rng(seed)
    outcomes = []
    for t in range(trials):
        rows = trial_windows(requests, speedup, mix, rng)
        per_look, deadline = verdicts_per_look(rows)
        if t < CHECKED_TRIALS:
            check_against_the_operator(rows, per_look, deadline, checker)
        outcomes.append(outcome(per_look, deadline))
    return Cell(requests, mix, speedup, outcomes)


def describe(cell: Cell) -> str:
    n = len(cell.outcomes)
    low, high = wilson(round(cell.bad() * n), n)
    return (
        f"{cell.requests:>7} {cell.mix:5.2f} {cell.speedup:7.2f} {n:>6} {cell.share(PASS):6.3f} "
        f"{cell.share(FAIL):6.3f} {cell.share(NONE):6.3f} {cell.bad():6.3f} [{low:.3f}, {high:.3f}] "
        f"{cell.median_minutes():6.1f}"
    )


def figures(cells: list[Cell]) -> dict[str, str]:
    def worst(group: list[Cell]) -> str:
        cell = max(group, key=Cell.bad)
        n = len(cell.outcomes)
        return f"{cell.bad():.4f}", f"{wilson(round(cell.bad() * n), n)[1]:.4f}"

    def minutes(speedup: float, busy: bool) -> str:
        group = [c for c in cells if math.isclose(c.speedup, speedup) and (c.requests != LOW_TRAFFIC) == busy]
        return f"{max((c.median_minutes() for c in group), default=math.nan):.1f}"

    at = {s: [c for c in cells if math.isclose(c.speedup, s)] for s in SPEEDUPS}
    busy_105 = [c for c in at[1.05] if c.requests != LOW_TRAFFIC]
    quiet_105 = [c for c in at[1.05] if c.requests == LOW_TRAFFIC]
    out: dict[str, str] = {}
    for name, group in (
        ("speedup_wrong_promote_090_worst", at[0.90]),
        ("speedup_wrong_promote_095_worst", at[0.95]),
        ("speedup_bad_outcome_105_worst", busy_105),
        ("speedup_bad_outcome_105_worst_low_traffic", quiet_105),
        ("speedup_bad_outcome_120_worst", at[1.20]),
    ):
        if group:
            out[name], out[f"{name}_wilson_upper"] = worst(group)
    for s in (1.05, 1.20):
        out[f"speedup_median_minutes_{round(s * 100)}_worst"] = minutes(s, True)
        out[f"speedup_median_minutes_{round(s * 100)}_worst_low_traffic"] = minutes(s, False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=TRIALS, help="trials per cell")
    parser.add_argument("--requests", type=int, nargs="+", default=REQUESTS, help="cells to run")
    args = parser.parse_args()
    print(
        f"minSpeedup {GATE} +/- {DELTA}, errorRate {ERROR_RATE}; Pass from {ANALYSIS_LOOKS * WINDOW_SECONDS / 60:g} "
        f"min, the deadline rule at {LOOKS * WINDOW_SECONDS / 60:g} min; {WINDOW_SECONDS:.0f}s windows; per-token "
        f"times lognormal (log-sd {PACE_LOG_SD}, baseline median {BASELINE_MEDIAN_S * 1000:.1f} ms); drifting mix: "
        f"pace x exp(z), z OU sd {MIX_PACE_SD} over {MIX_SECONDS:g}s"
    )
    print(f"{'req/win':>7} {'mix':>5} {'speedup':>7} {'trials':>6} {'pass':>6} {'fail':>6} {'incon':>6} "
          f"{'bad':>6} {'95% Wilson':>14} {'p50 min':>7}")  # fmt: skip
    checker = random.Random(60)
    cells = []
    for requests in args.requests:
        for mix in MIXES:
            for i, speedup in enumerate(SPEEDUPS):
                cell = run_cell(
                    requests,
                    mix,
                    speedup,
                    args.trials,
                    60_000 + 100 * requests + 10 * i + int(mix > 0),
                    checker,
                )
                print(describe(cell), flush=True)
                cells.append(cell)
    print(" ".join(f"{name}={value}" for name, value in figures(cells).items()))


if __name__ == "__main__":
    main()
