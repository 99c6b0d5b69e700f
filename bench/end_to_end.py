"""End-to-end bench: alpha and latency decide together, as rollout._analyzing combines the gates, and
after promotion the guard's latency check, as rollout._promoted runs it (issue 58).

**The analysis.** Each trial is a first rollout (the spec's mixDrift fallback; re-rollouts are
bench/decisions.py's) whose canary has an alpha at gate - 0.05 or gate + 0.05 (the traffic model of
bench/traffic.py, a steady or a drifting mix, 3 / 20 / 200 requests a 15-s window) and a per-token
latency (bench/latency.py's model: GPU scale log-sd 0.15, CPU scale log-sd 0.3) whose P99 is 1.0x or
1.2x the baseline's, a shift (every request's time x r). Good: alpha >= gate and P99 1.0x; bad:
alpha below the gate or P99 1.2x. A bad outcome is a bad canary promoted or a good one rolled back
(Fail or Inconclusive). Both tracks' per-token histograms are on the ladder specgate renders
(render.latency_ladder), the latency requests Poisson at the same rate on both tracks (independent
of the acceptance model's bursts; the four cells of a latency model and ratio share each trial's
latency draw, those of an alpha and a mix its acceptance draw, and each cell's trials are
independent). At every look (a 15-s window) the acceptance gate's verdict
comes from decisions.verdicts_per_look (checked against gates.acceptance_gate on sampled looks) and
the per-token gate's from gates.latency_gate itself (latency.operator_looks); as rollout combines
them: a Fail of any gate rolls back at once, a Pass needs every gate to pass from analysisWindow
on, and at maxAnalysisDuration the acceptance test takes gates.decide_at_deadline's verdict and the
latency gate its last look (`last_look=True`); a verdict still missing there is Inconclusive
(rolled back by default).

Left out, and why: the step-stall gate (its own figures are bench/latency.py's: a 1.2x step is
within its 50 % tolerance, stall_false_fail_r120_worst), and the speedup gate (gates.speedup_gate,
minSpeedup 1.0). The latency model defines each request's time per output token, so it defines
the mean the speedup gate compares: a shift of 1.0x is a canary whose mean is the baseline's,
S = 1.0 exactly on minSpeedup, inside that test's indifference zone (+-0.03), where either verdict
is by its design acceptable; counting it in would judge the 1.0x canary "good" by a gate that may
rightly roll it back half the time. Its figures at S = 0.95 and 1.05 are bench/speedup.py's.

**The guard.** After promotion rollout._promoted re-runs the latency gates at every reconcile
over guard.window (30 min; its start on the 15-s grid from the promotion) against the baseline
*stored* at promotion (measured beside the canary over its analysis, --analysis-minutes, 10 by
default; the Baseline phase's analysisWindow, 5 min, if longer; the same per-pod load), at
LOOK_Z, and rolls back on any Fail. New scrapes arrive every 15 s, so a look a window is every
look that can differ. Loads: the analysis's requests a window and the first whose stored baseline
bounds its P99. A healthy canary has the baseline's latency distribution; the stored baseline is one
sample per month-long trial (its error is shared by every look of that month), and after a trip
the guard starts again on the same stored baseline (a low baseline trips again: conservative).
A look can Fail only where the stored baseline's P99 is bounded from above by a rank
(gates.latency's bounding_samples: 524 samples at LOOK_Z), and only where the canary's P99 bucket
reaches past (1 + tolerance) x the baseline's upper bracket (`candidates`): every other look is
screened out exactly, and sampled screened-out looks are checked against the operator's gate. False trips per month carry the one-sided 95 % Poisson
upper bound, beside the acceptance guard's budget (guard.falseAlarmsPerMonth); the cost is the
minutes from a change of the canary's P99 to 1.5x (a shift, after a healthy full window) to the
trip, p50 and p95.

Last line: name=value figures for issue 58.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import latency
from decisions import (
    ANALYSIS_LOOKS,
    DELTA,
    FAIL,
    FIRST_ROLLOUT,
    GAP,
    GATE,
    LOOKS,
    NONE,
    PASS,
    WINDOW_SECONDS,
    check_against_the_operator,
    verdicts_per_look,
    wilson,
)
from guard import poisson_upper95, quantile
from specgate import api
from specgate.gates import LOOK_Z, GateResult, Histogram, Verdict, latency_gate
from specgate.gates.guard import MONTH_SECONDS
from specgate.gates.latency import _track_quantile, bounding_samples  # the gate's own bracket
from traffic import DRIFT_SD, for_alpha, windows

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

REQUESTS_PER_WINDOW = latency.REQUESTS_PER_WINDOW
LOW_TRAFFIC = latency.LOW_TRAFFIC
MIXES = {"steady": 0.0, "drift": DRIFT_SD}
LATENCY_MODELS = (("gpu", 0.15), ("cpu", 0.3))
OFFSETS = (-DELTA, DELTA)  # the canary's alpha - gate
P99_RATIOS = (1.0, 1.2)  # the canary's P99 over the baseline's (a shift)
BOUNDS = latency.BUCKETS["fine"]
FIGURE = "P99 per-token latency"
CHECKED_LOOKS = 60  # acceptance looks recomputed by the operator per stream


@dataclass(frozen=True)
class Outcome:
    verdict: int  # PASS (promoted), FAIL (rolled back) or NONE (Inconclusive, rolled back)
    seconds: float


@dataclass
class Cell:
    requests: int
    mix: str
    scale: str
    sigma: float
    offset: float
    ratio: float
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def good(self) -> bool:
        return self.offset >= 0 and self.ratio <= 1.0

    @property
    def trials(self) -> int:
        return len(self.outcomes)

    def rate(self, verdict: int) -> float:
        return sum(o.verdict == verdict for o in self.outcomes) / self.trials

    @property
    def bad_count(self) -> int:
        """A good canary rolled back (Fail or Inconclusive), a bad one promoted."""
        if self.good:
            return sum(o.verdict != PASS for o in self.outcomes)
        return sum(o.verdict == PASS for o in self.outcomes)

    def minutes_p50(self) -> float:
        return sorted(o.seconds / 60 for o in self.outcomes)[self.trials // 2]


class LatencyLooks:
    """One trial's latency verdicts (latency.operator_looks), computed only as far as a rollout
    reads them and kept: the cells of both alphas and both mixes share a trial's latency draw."""

    def __init__(self, looks: Iterator[int]) -> None:
        self._looks = looks
        self._seen: list[int] = []

    def at(self, m: int) -> int:
        """The verdict at look m (1-based)."""
        while len(self._seen) < m:
            self._seen.append(next(self._looks))
        return self._seen[m - 1]


def stop(acceptance: IntArray, side: IntArray, latency_looks: LatencyLooks) -> Outcome:
    """As rollout._analyzing: the acceptance look first (at the deadline decide_at_deadline's
    verdict: the estimate's side where the test has its data), then the latency gate's look; a
    Fail of either rolls back at once, both Pass from analysisWindow on promotes, and past the
    deadline anything else is Inconclusive. The latency gate is not read once alpha fails."""
    for m in range(1, LOOKS + 1):
        alpha = int(acceptance[m - 1])
        if m == LOOKS and alpha == NONE:
            alpha = int(side[m - 1])
        if alpha == FAIL:
            return Outcome(FAIL, m * WINDOW_SECONDS)
        late = latency_looks.at(m)
        if late == FAIL:
            return Outcome(FAIL, m * WINDOW_SECONDS)
        if alpha == PASS and late == PASS and m >= ANALYSIS_LOOKS:
            return Outcome(PASS, m * WINDOW_SECONDS)
    return Outcome(NONE, LOOKS * WINDOW_SECONDS)


def acceptance_looks(
    requests: int, mix: str, offset: float, trials: int, rng: np.random.Generator, checker: random.Random
) -> list[tuple[IntArray, IntArray]]:
    """Per trial, the acceptance gate's verdict and estimate's side at every look (a first rollout)."""
    traffic = for_alpha(GATE + offset, requests, window_seconds=WINDOW_SECONDS, drift_sd=MIXES[mix])
    stream = windows(traffic, trials * (LOOKS + GAP), rng)
    looks = []
    for t in range(trials):
        counts = stream[t * (LOOKS + GAP) : t * (LOOKS + GAP) + LOOKS]
        per_look, side = verdicts_per_look(counts, FIRST_ROLLOUT)
        if t == 0:
            check_against_the_operator(counts, FIRST_ROLLOUT, per_look, side, checker)
        looks.append((per_look, side))
    return looks


def latency_trials(
    requests: int, scale: str, sigma: float, ratio: float, trials: int, rng: np.random.Generator
) -> list[LatencyLooks]:
    """Each trial's per-token gate, look by look: both tracks' histograms over the analysis so far."""
    base = latency.baseline_track(scale, sigma)
    canary = latency.Scenario(f"p99x{ratio:g}", ratio).canary(base)
    base_counts = latency.cumulative_histograms(base.probabilities(BOUNDS), requests, trials, rng)
    canary_counts = latency.cumulative_histograms(canary.probabilities(BOUNDS), requests, trials, rng)
    return [
        LatencyLooks(latency.operator_looks(BOUNDS, base_counts[t], canary_counts[t])) for t in range(trials)
    ]


def describe(cell: Cell) -> str:
    low, high = wilson(cell.bad_count, cell.trials)
    rates = " ".join(f"{cell.rate(v):6.3f}" for v in (PASS, FAIL, NONE))
    return (
        f"{cell.requests:>5} {cell.mix:>6} {cell.scale:>4} {cell.sigma:5.2f} {cell.offset:+6.2f} "
        f"{cell.ratio:5.1f}x {'good' if cell.good else 'bad':>4} {cell.trials:>6} | {rates} | "
        f"{cell.bad_count / cell.trials:6.3f} [{low:.3f}, {high:.3f}] | {cell.minutes_p50():5.1f}"
    )


def header() -> str:
    return (
        f"{'req/w':>5} {'mix':>6} {'sc':>4} {'sigma':>5} {'alpha':>6} {'p99':>6} {'kind':>4} {'trials':>6} | "
        f"{'pass':>6} {'fail':>6} {'inc':>6} | {'bad':>6} {'[95 % Wilson]':>14} | p50 min to act"
    )


def worst(cells: list[Cell]) -> str:
    if not cells:
        return "nan"
    cell = max(cells, key=lambda c: c.bad_count / c.trials)
    low, high = wilson(cell.bad_count, cell.trials)
    return f"{cell.bad_count / cell.trials:.4f}[{low:.3f},{high:.3f}]n={cell.trials}"


def analysis_figures(cells: list[Cell]) -> dict[str, str]:
    busy = [c for c in cells if c.requests != LOW_TRAFFIC]
    low = [c for c in cells if c.requests == LOW_TRAFFIC]
    return {
        "end_to_end_bad_outcome_worst": worst(busy),
        "end_to_end_bad_outcome_worst_3": worst(low),
        "end_to_end_good_rolled_back_worst": worst([c for c in busy if c.good]),
        "end_to_end_bad_promoted_worst": worst([c for c in busy if not c.good]),
    }


def run_analysis(trials: int, requests: tuple[int, ...], rng: np.random.Generator) -> dict[str, str]:
    checker = random.Random(58)
    print(
        f"analysis: alpha gate {GATE} +- {DELTA} (first rollout), P99 per-token 1.0x / 1.2x (shift), "
        f"tolerance {latency.TOLERANCE:.0%}, a look every {WINDOW_SECONDS:g} s for {LOOKS * WINDOW_SECONDS / 60:g} min, "
        f"Pass from {ANALYSIS_LOOKS * WINDOW_SECONDS / 60:g} min; {len(BOUNDS)} rendered bucket edges"
    )
    print(header())
    cells = []
    for r in requests:
        latencies = {
            (scale, sigma, ratio): latency_trials(r, scale, sigma, ratio, trials, rng)
            for scale, sigma in LATENCY_MODELS
            for ratio in P99_RATIOS
        }
        for mix in MIXES:
            for offset in OFFSETS:
                acceptance = acceptance_looks(r, mix, offset, trials, rng, checker)
                for (scale, sigma, ratio), looks in latencies.items():
                    cell = Cell(r, mix, scale, sigma, offset, ratio)
                    cell.outcomes = [
                        stop(*alpha, late) for alpha, late in zip(acceptance, looks, strict=True)
                    ]
                    print(describe(cell), flush=True)
                    cells.append(cell)
    return analysis_figures(cells)


# --- after promotion: the guard's latency check ---

GUARD = api.Guard()
ROLLOUT = api.RolloutSpec()
GUARD_WINDOWS = round(api.parse_duration(GUARD.window) / WINDOW_SECONDS)
PHASE_WINDOWS = round(api.parse_duration(ROLLOUT.analysis_window) / WINDOW_SECONDS)
# How long a promoted canary's analysis ran: the baseline measured beside it over that span is kept
# at promotion where it counted more than the Baseline phase's window (rollout._baseline_of_the_analysis).
# 10 minutes is the latency gate's own bound on a Pass at 20 requests a window (issue 58); a good
# canary near the acceptance gate took a median 25-34 minutes there (this bench's analysis part).
ANALYSIS_MINUTES = 10.0
MONTH_WINDOWS = round(MONTH_SECONDS / WINDOW_SECONDS)
DAY_WINDOWS = round(24 * 3600 / WINDOW_SECONDS)
TRIP_RATIO = 1.5  # the regression whose time to a trip is the guard's cost
TRIP_HORIZON_WINDOWS = 4 * 3600 // int(WINDOW_SECONDS)  # a trip later than 4 h counts as never
SCREEN_CHECKS = 20  # screened-out looks checked against the operator's gate per trial
EDGES = np.array([*BOUNDS, math.inf])


@dataclass(frozen=True)
class GuardCell:
    scale: str
    sigma: float
    requests: int


def guard_result(stored: Histogram, counts: FloatArray) -> GateResult:
    """gates.latency_gate as rollout._latency_results calls it after promotion (the per-token gate
    on the canary's guard window against the stored baseline, at LOOK_Z)."""
    return latency_gate(
        stored,
        latency.histogram(BOUNDS, counts),
        figure=FIGURE,
        max_regression=latency.TOLERANCE,
        min_count=latency.GATES.min_latency_samples,
    )


def guard_look(stored: Histogram, counts: FloatArray) -> Verdict:
    return guard_result(stored, counts).verdict


def stored_windows(analysis_minutes: float) -> int:
    """The windows the stored baseline spans: the analysis's, or the Baseline phase's if longer."""
    return max(PHASE_WINDOWS, round(analysis_minutes * 60 / WINDOW_SECONDS))


def stored_baseline(cell: GuardCell, rng: np.random.Generator, windows: int) -> Histogram:
    """The baseline measured once, over `windows` at the same per-pod load."""
    track = latency.baseline_track(cell.scale, cell.sigma)
    counts = rng.poisson(cell.requests * windows * track.probabilities(BOUNDS))
    return latency.histogram(BOUNDS, np.cumsum(counts).astype(np.float64))


def first_bounded_requests(windows: int) -> int:
    """The fewest requests a window whose stored baseline of `windows` holds the samples that bound
    its P99 from above (bounding_samples at LOOK_Z): its bracket is widest there, the guard's
    hardest load."""
    return math.ceil(samples_to_fail() / windows)


def samples_to_fail() -> int:
    """The stored baseline's samples a Fail needs: its P99 bounded from above by a rank at LOOK_Z."""
    return max(bounding_samples(latency.QUANTILE, LOOK_Z), latency.GATES.min_latency_samples)


def can_fail(stored: Histogram) -> bool:
    return stored.total >= samples_to_fail()


def window_counts(per_window: IntArray, carried: IntArray | None) -> tuple[FloatArray, IntArray]:
    """Cumulative counts per `le` over the guard window ending at each of `per_window`'s windows
    (the window grows from the promotion until it is guard.window long); and the last
    GUARD_WINDOWS windows, carried into the next chunk."""
    history = per_window if carried is None else np.concatenate([carried, per_window])
    running = np.cumsum(history, axis=0)
    lagged = np.zeros_like(running)
    lagged[GUARD_WINDOWS:] = running[:-GUARD_WINDOWS]
    skip = 0 if carried is None else len(carried)
    cumulative = np.cumsum((running - lagged)[skip:], axis=1).astype(np.float64)
    return cumulative, history[-GUARD_WINDOWS:]


def candidates(cumulative: FloatArray, stored: Histogram) -> IntArray:
    """Looks that could Fail: min_count samples, and the canary's P99 bucket's upper edge beyond
    (1 + tolerance) x the stored baseline's upper bracket at LOOK_Z. A Fail needs the ratio's lower
    bound beyond 1 + tolerance, and that bound subtracts at least the baseline's half-width
    log(high / estimate) from the estimates' log ratio, so it needs the canary's estimate beyond
    (1 + tolerance) x high; the estimate never leaves its bucket from min_count samples on."""
    base = _track_quantile(stored, latency.QUANTILE, LOOK_Z, math.log1p(latency.TOLERANCE))
    assert base is not None
    totals = cumulative[:, -1]
    bucket = np.argmax(cumulative >= latency.QUANTILE * totals[:, None], axis=1)
    reach = EDGES[bucket] > (1 + latency.TOLERANCE) * base.high
    return np.flatnonzero(reach & (totals >= latency.GATES.min_latency_samples))


@dataclass
class Month:
    trips: int = 0
    closest: float = 0.0  # the highest lower bound of the ratio at a look the screen kept


def healthy_month(
    cell: GuardCell, stored: Histogram, rng: np.random.Generator, check: random.Random
) -> Month:
    """A month of a healthy canary against `stored`; the guard restarts after each trip."""
    probabilities = latency.baseline_track(cell.scale, cell.sigma).probabilities(BOUNDS)
    month, carried, quiet_until = Month(), None, 0
    for day in range(0, MONTH_WINDOWS, DAY_WINDOWS):
        per_window = rng.poisson(cell.requests * probabilities, size=(DAY_WINDOWS, len(probabilities)))
        cumulative, carried = window_counts(per_window, carried)
        possible = candidates(cumulative, stored)
        for m in possible:
            if day + m < quiet_until:
                continue
            result = guard_result(stored, cumulative[m])
            month.closest = max(month.closest, result.lower or 0.0)
            if result.verdict == Verdict.FAIL:
                month.trips += 1
                quiet_until = day + m + GUARD_WINDOWS  # a fresh guard window after the trip
        screened = np.setdiff1d(np.arange(DAY_WINDOWS), possible)
        for m in check.sample(list(screened), min(SCREEN_CHECKS, len(screened))):
            if guard_look(stored, cumulative[m]) == Verdict.FAIL:
                raise SystemExit(f"a screened-out guard look fails in the operator's gate ({cell})")
    return month


def minutes_to_trip(cell: GuardCell, stored: Histogram, rng: np.random.Generator) -> float:
    """Minutes from the canary's P99 becoming TRIP_RATIO x (after a full healthy window) to the
    guard's first Fail; inf past TRIP_HORIZON_WINDOWS, or where the stored baseline cannot fail."""
    if not can_fail(stored):
        return math.inf
    base = latency.baseline_track(cell.scale, cell.sigma)
    slow = latency.Scenario("p99x150", TRIP_RATIO).canary(base)
    healthy = rng.poisson(cell.requests * base.probabilities(BOUNDS), size=(GUARD_WINDOWS, len(BOUNDS) + 1))
    after = rng.poisson(
        cell.requests * slow.probabilities(BOUNDS), size=(TRIP_HORIZON_WINDOWS, len(BOUNDS) + 1)
    )
    cumulative, _ = window_counts(after, healthy)
    for m in candidates(cumulative, stored):
        if guard_look(stored, cumulative[m]) == Verdict.FAIL:
            return float(m + 1) * WINDOW_SECONDS / 60
    return math.inf


def run_guard(
    months: int, delay_trials: int, requests: tuple[int, ...], seed: int, analysis_minutes: float
) -> dict[str, str]:
    budget = GUARD.false_alarms_per_month
    windows = stored_windows(analysis_minutes)
    print(
        f"guard (the per-token gate after promotion, z {LOOK_Z}): a healthy canary against a stored baseline "
        f"of {windows} windows (an analysis of {analysis_minutes:g} min), a look every {WINDOW_SECONDS:g} s over guard.window {GUARD.window}, "
        f"{months} months a cell; budget {budget} a month (the acceptance guard's, guard.falseAlarmsPerMonth); "
        f"minutes to trip on a P99 {TRIP_RATIO}x over {delay_trials} trials; bounded: months whose stored "
        f"baseline bounds its P99 ({bounding_samples(latency.QUANTILE, LOOK_Z)} samples, else no look can fail); "
        f"closest: the highest lower bound of the ratio at a look the screen kept (fails above "
        f"{1 + latency.TOLERANCE:.2f})"
    )
    print(
        f"{'scale':>5} {'sigma':>5} {'req/w':>5} | {'months':>6} {'bounded':>7} {'trips':>5} {'per month':>9} "
        f"{'upper95':>7} {'closest':>7} | minutes to trip p50 p95"
    )
    out: dict[str, str] = {}
    rates: list[tuple[float, float]] = []
    check = random.Random(seed)
    for scale, sigma in LATENCY_MODELS:
        for r in sorted({*requests, first_bounded_requests(windows)}):
            cell = GuardCell(scale, sigma, r)
            rng = np.random.default_rng([seed, r, round(sigma * 100)])
            stored = [stored_baseline(cell, rng, windows) for _ in range(months)]
            bounded = [healthy_month(cell, s, rng, check) for s in stored if can_fail(s)]
            trips = sum(m.trips for m in bounded)
            closest = max((m.closest for m in bounded), default=0.0)
            delays = sorted(
                minutes_to_trip(cell, stored_baseline(cell, rng, windows), rng) for _ in range(delay_trials)
            )
            rate, upper = trips / months, poisson_upper95(trips, months)
            rates.append((rate, upper))
            p50, p95 = quantile(delays, 0.5), quantile(delays, 0.95)
            print(
                f"{scale:>5} {sigma:5.2f} {r:>5} | {months:>6} {len(bounded):>7} {trips:>5} {rate:9.3f} "
                f"{upper:7.3f} {closest:7.3f} | {p50:6.1f} {p95:6.1f}",
                flush=True,
            )
            name = f"{scale}_{r}"
            out[f"guard_latency_minutes_to_trip_p99x150_p50_{name}"] = f"{p50:.1f}"
            out[f"guard_latency_minutes_to_trip_p99x150_p95_{name}"] = f"{p95:.1f}"
    out["guard_latency_false_trips_per_month_worst"] = f"{max(r for r, _ in rates):.3f}"
    out["guard_latency_false_trips_per_month_upper95_worst"] = f"{max(u for _, u in rates):.3f}"
    out["guard_false_alarms_per_month_budget"] = f"{budget:g}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="analysis trials per cell")
    # 60: one trip in 30 months has a 95 % upper bound of 0.158, over the 0.15 the budget is held to
    parser.add_argument("--months", type=int, default=60, help="guard: month-long trials per cell")
    parser.add_argument("--delay-trials", type=int, default=100, help="guard: trials of a 1.5x P99")
    parser.add_argument("--requests", type=int, nargs="+", default=REQUESTS_PER_WINDOW, help="cells to run")
    parser.add_argument(
        "--analysis-minutes",
        type=float,
        default=ANALYSIS_MINUTES,
        help="guard: the promoted canary's analysis",
    )
    parser.add_argument("--part", choices=("both", "analysis", "guard"), default="both", help="what to run")
    args = parser.parse_args()
    started = time.monotonic()
    requests = tuple(args.requests)
    out = {}
    if args.part in ("both", "analysis"):
        out.update(run_analysis(args.trials, requests, np.random.default_rng(58)))
    if args.part in ("both", "guard"):
        out.update(
            run_guard(
                args.months, args.delay_trials, requests, seed=58, analysis_minutes=args.analysis_minutes
            )
        )
    print(f"run time {time.monotonic() - started:.0f} s")
    print(" ".join(f"{name}={value}" for name, value in out.items()))


if __name__ == "__main__":
    main()
