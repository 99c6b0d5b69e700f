"""Decision benchmark: the operator's acceptance gate against an Argo-Rollouts-style rule, on the
request-level traffic model (bench/traffic.py), each stopping as it would in a cluster.

Cells: 3, 20 and 200 requests per 15-s window (long-run means: bursts, lulls and, at 3, empty
windows), a stationary traffic mix and one that drifts on a minute scale (traffic.DRIFT_SD), and
canaries at gate - 0.20, gate - 0.10, gate - indifference, gate + indifference and gate + 0.10. The
true alpha is the model's long-run alpha (by quadrature, traffic.for_alpha), not a sample: the
alpha of the traffic the canary would serve for the next hours.

Each trial's windows are judged twice, as the two kinds of rollout would judge them:
- first: a first rollout, with the spec's mixDrift fallback (gates.fallback_drift);
- re: a re-rollout, with the drift measured (gates.drift_from_history, the operator's function) on
  4 h (mixDriftHistory) of an incumbent config's alpha from the same traffic model, in the 60 s
  blocks the operator's range query reads; each trial takes one of HISTORIES such histories in turn.

- specgate: gates.acceptance_gate with the CRD's defaults over the windows since the analysis
  began, looked at once per window. As rollout._analyzing stops: a Fail at once, a Pass only from
  analysisWindow on (and only if that look still says Pass); at maxAnalysisDuration a test with
  its data (enough drafts and windows) is decided by the estimate's side of the gate
  (gates.decide_at_deadline), and one without stays Inconclusive (rolled back by default). The
  looks are computed with numpy (`verdicts_per_look`) and checked against gates.acceptance_gate
  and gates.decide_at_deadline themselves on sampled looks before any figure is printed.
  Its stopping time is the first look at which the test decides (or the deadline): the
  analysisWindow floor on a Pass is the latency gates' (their look covers a full window), and is
  in the end-to-end time, the look at which the rollout acts.
- fixed window: the estimate's side of the gate after a fixed duration, the shortest that meets
  the rule's bounds in that traffic (<= 5 % wrong at gate +- 0.05 and <= 1 % at gate +- 0.10, every
  duration from it to the trial's end too), calibrated per (requests, mix) on the same trials.
  The stopping-time ratio is the rule's mean stopping time over that duration.
- Argo (Argo Rollouts AnalysisTemplate as its users write it), for reference: interval 1m, count
  5, failureLimit 1, successCondition `result >= gate` on the pooled ratio of the minute's counters.
  A minute without drafts gives NaN, which fails `NaN >= gate` (a failed measurement).

Wrong: a Pass below the gate or a Fail above it. A bad outcome (issue 37): a wrong Pass, or a
canary above the gate rolled back (Fail or Inconclusive), which costs the user its speedup. Trials
per cell grow in batches until the 95 % Wilson interval of the bad-outcome rate is narrower than
CI_WIDTH, up to --max-trials; each trial is cut from one long stream with GAP windows between
trials, so the drift and the requests in flight of one trial have faded before the next begins.

Last line: the figures issue 37 asks for, as name=value.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from looks import per_token_variance, ratio_long_run_variances
from specgate import api
from specgate.gates import (
    MIN_WINDOWS,
    OVERSHOOT,
    AcceptanceWindow,
    MixDrift,
    Verdict,
    decide_at_deadline,
    drift_from_history,
    fallback_drift,
    judged_windows,
    mix_drift_variance,
    spec_acceptance_gate,
    sprt_bounds,
    sprt_log_lr,
    sprt_step_sd,
    wald_bounds,
)
from specgate.prometheus import history_step
from traffic import DRIFT_SD, for_alpha, windows

GATES = api.Gates()
ROLLOUT = api.RolloutSpec()
GATE, DELTA, ERROR_RATE = GATES.min_acceptance_rate, GATES.indifference, GATES.error_rate
FIRST_ROLLOUT = fallback_drift(GATES, "a first rollout")
WINDOW_SECONDS = 15.0
ANALYSIS_LOOKS = math.ceil(api.parse_duration(ROLLOUT.analysis_window) / WINDOW_SECONDS)
LOOKS = int(api.parse_duration(ROLLOUT.max_analysis_duration) // WINDOW_SECONDS)
GAP = 40  # windows between trials: 10 min, the drift's correlation e^-3.3 and no request in flight
REQUESTS_PER_WINDOW = (3, 20, 200)
DRIFTS = (0.0, DRIFT_SD)
OFFSETS = (-0.20, -0.10, -DELTA, DELTA, 0.10)
ROLLOUTS = ("first", "re")
LOW_TRAFFIC = 3  # requests per window
HISTORY_WINDOWS = int(api.parse_duration(GATES.mix_drift_history) // WINDOW_SECONDS)
# Incumbent histories per (requests, mix), taken in turn by the re-rollout trials: with 20, the one
# steady history in 20 that read as a drift set a cell's mean stopping time.
HISTORIES = 60
INCUMBENT_ALPHA = GATE + 0.10  # the promoted config the re-rollout replaces (the drift is the mix's)
BATCH = 300
MAX_TRIALS = 1_200
CI_WIDTH = 0.02
CHECKED_LOOKS = 60  # per cell and rollout: looks recomputed by gates.acceptance_gate itself
FIXED_BOUNDS = ((DELTA, 0.05), (0.10, 0.01))  # (distance from the gate, wrong rate): the rule's bounds
CALIBRATION_WINDOWS = 480  # 2 h: a fixed window longer than maxAnalysisDuration is found on these
CALIBRATION_TRIALS = 300
SHORT_SECONDS = 120.0  # a fixed window under this is a short cell: its stopping time is bound, not its ratio
ARGO_COUNT, ARGO_FAILURE_LIMIT, ARGO_WINDOWS_PER_MEASUREMENT = 5, 1, 4  # 1m of 15-s windows

PASS, FAIL, NONE = 1, -1, 0
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Outcome:
    verdict: int  # PASS, FAIL or NONE (Inconclusive)
    seconds: float  # end to end: when the rollout acts
    decided_seconds: float  # when the acceptance test first decides, or the deadline


_DRIFT_VARIANCES: dict[tuple[float, float], FloatArray] = {}


def drift_variances(drift: MixDrift) -> FloatArray:
    """mix_drift_variance at the span of every look (cached per drift: many trials share one)."""
    key = (drift.sd, drift.timescale_seconds)
    if key not in _DRIFT_VARIANCES:
        spans = np.arange(1, LOOKS + 1) * WINDOW_SECONDS
        _DRIFT_VARIANCES[key] = np.array([mix_drift_variance(*key, t) for t in spans])
    return _DRIFT_VARIANCES[key]


def verdicts_per_look(counts: FloatArray, drift: MixDrift) -> tuple[IntArray, IntArray]:
    """gates.acceptance_gate's verdict over windows 1..m for every m: the same arithmetic (windows
    without draft tokens left out, Newey-West spread over HAC_LAGS lags, chi-square bound, binomial
    floor, the mix's drift, Wald's bounds less the overshoot), for all looks at once; and per look the side of the gate
    its estimate is on where the test has its data (PASS or FAIL, else NONE: what
    gates.decide_at_deadline takes). counts: rows of drafts, draft tokens, accepted."""
    judged = counts[:, 1] > 0
    d, n, a = counts[judged].T
    per_look = np.zeros(len(counts), dtype=np.int64)
    side = np.zeros(len(counts), dtype=np.int64)
    c = len(n)
    if c == 0:
        return per_look, side
    j = np.arange(1, c + 1, dtype=np.float64)  # judged windows in the look
    big_n, big_a, drafts = np.cumsum(n), np.cumsum(a), np.cumsum(d)
    alpha, variance = ratio_long_run_variances(a, n)
    dof = np.maximum(j - 1, 1)
    if drift.design_effect is None:
        s2 = per_token_variance(variance, dof, j, big_n, big_a, ERROR_RATE)
    else:  # gates.residual_variance with a measured design effect: no chi-square allowance
        binomial = (big_a + 1) / (big_n + 2) * (big_n - big_a + 1) / (big_n + 2)
        s2 = np.maximum(np.maximum(drift.design_effect * alpha * (1 - alpha), variance * j / big_n), binomial)
    judged_so_far = np.cumsum(judged)
    looks = np.flatnonzero(judged_so_far > 0)  # looks with a judged window; the rest stay NONE
    at = judged_so_far[looks] - 1  # the look's last judged window
    drift_variance = drift_variances(drift)[looks]  # the span counts every window, empty ones too
    llr = 2 * DELTA * (alpha[at] - GATE) / (s2[at] / big_n[at] + drift_variance)
    step_sd = 2 * DELTA * np.sqrt(big_n[at] / j[at] * s2[at]) / (s2[at] + big_n[at] * drift_variance)
    wald_fail, wald_pass = wald_bounds(ERROR_RATE)
    shift = np.minimum(OVERSHOOT * step_sd, wald_pass / 2)
    fail_at, pass_at = wald_fail + shift, wald_pass - shift
    verdict = np.where(llr >= pass_at, PASS, np.where(llr <= fail_at, FAIL, NONE))
    short = (drafts[at] < GATES.min_drafts) | (j[at] < MIN_WINDOWS)
    verdict[short] = NONE
    per_look[looks] = verdict
    side[looks] = np.where(short, NONE, np.where(alpha[at] >= GATE, PASS, FAIL))
    return per_look, side


def check_against_the_operator(
    counts: FloatArray, drift: MixDrift, per_look: IntArray, side: IntArray, rng: random.Random
) -> None:
    """The vectorized looks give gates.acceptance_gate's verdicts, and at the deadline
    gates.decide_at_deadline's, on sampled looks, or the bench stops (a look whose log-LR sits on a
    bound to rounding is compared by its log-LR alone)."""
    for m in rng.sample(range(1, len(counts) + 1), min(CHECKED_LOOKS, len(counts))):
        looked = [AcceptanceWindow(*map(float, row)) for row in counts[:m]]
        result = spec_acceptance_gate(looked, GATES, drift, window_seconds=WINDOW_SECONDS)
        at_deadline = decide_at_deadline(result, GATE, DELTA)
        if per_look[m - 1] == NONE and _code(at_deadline.verdict) != side[m - 1]:
            raise SystemExit(
                f"vectorized side {side[m - 1]} != decide_at_deadline {at_deadline.verdict} at look {m}"
            )
        if _code(result.verdict) == per_look[m - 1]:
            continue
        usable = judged_windows(looked)
        variance = mix_drift_variance(drift.sd, drift.timescale_seconds, m * WINDOW_SECONDS)
        llr, step_sd = (
            (
                sprt_log_lr(usable, GATE, DELTA, ERROR_RATE, variance, drift.design_effect),
                sprt_step_sd(usable, DELTA, ERROR_RATE, variance, drift.design_effect),
            )
            if usable
            else (math.nan, 0.0)
        )
        if not any(math.isclose(llr, bound, rel_tol=1e-9) for bound in sprt_bounds(ERROR_RATE, step_sd)):
            raise SystemExit(
                f"vectorized gate {per_look[m - 1]} != acceptance_gate {result.verdict} at look {m}"
            )


def _code(verdict: Verdict) -> int:
    return {Verdict.PASS: PASS, Verdict.FAIL: FAIL}.get(verdict, NONE)


def ours(per_look: IntArray, side: IntArray) -> Outcome:
    """As rollout._analyzing: a Fail stops at once, a Pass from analysisWindow on; at the deadline
    (the last look) the estimate's side where the test has its data, else Inconclusive."""
    decided = np.flatnonzero(per_look != NONE)
    decided_seconds = (decided[0] + 1 if len(decided) else len(per_look)) * WINDOW_SECONDS
    for m, verdict in enumerate(per_look, start=1):
        if verdict == FAIL or (verdict == PASS and m >= ANALYSIS_LOOKS):
            return Outcome(int(verdict), m * WINDOW_SECONDS, decided_seconds)
    deadline = len(per_look) * WINDOW_SECONDS
    return Outcome(int(side[-1]), deadline, decided_seconds)


def argo(counts: FloatArray) -> Outcome:
    """Argo Rollouts: a measurement a minute, count 5, failureLimit 1, `result >= gate`."""
    failures = 0
    step = ARGO_WINDOWS_PER_MEASUREMENT
    for i in range(ARGO_COUNT):
        minute = counts[i * step : (i + 1) * step]
        tokens = minute[:, 1].sum()
        result = minute[:, 2].sum() / tokens if tokens > 0 else math.nan
        failures += not result >= GATE
        if failures > ARGO_FAILURE_LIMIT:
            seconds = (i + 1) * step * WINDOW_SECONDS
            return Outcome(FAIL, seconds, seconds)
    seconds = ARGO_COUNT * step * WINDOW_SECONDS
    return Outcome(PASS, seconds, seconds)


def estimate_sides(counts: FloatArray) -> IntArray:
    """The side of the gate of the estimate over windows 1..m for every m (NONE before any draft
    token): a fixed-window test of each duration."""
    tokens, accepted = np.cumsum(counts[:, 1]), np.cumsum(counts[:, 2])
    above = accepted >= GATE * tokens
    return np.where(tokens > 0, np.where(above, PASS, FAIL), NONE).astype(np.int64)


def wilson(wrong: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    p = wrong / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(centre - half, 0.0), min(centre + half, 1.0)


@dataclass
class Cell:
    requests: int
    drift: float
    offset: float
    rules: dict[str, list[Outcome]] = field(default_factory=lambda: {r: [] for r in ROLLOUTS})
    argo: list[Outcome] = field(default_factory=list)
    wrong_sides: FloatArray = field(default_factory=lambda: np.zeros(LOOKS))  # per fixed duration

    @property
    def wrong_side_rates(self) -> FloatArray:
        rates: FloatArray = self.wrong_sides / self.trials
        return rates

    @property
    def correct(self) -> int:
        return PASS if self.offset > 0 else FAIL

    @property
    def trials(self) -> int:
        return len(self.argo)

    def wrong(self, outcomes: list[Outcome]) -> float:
        return sum(o.verdict == -self.correct for o in outcomes) / len(outcomes)

    def bad(self, outcomes: list[Outcome]) -> float:
        """A bad canary promoted, or a good one rolled back (Fail or Inconclusive)."""
        if self.correct == FAIL:
            return sum(o.verdict == PASS for o in outcomes) / len(outcomes)
        return sum(o.verdict != PASS for o in outcomes) / len(outcomes)

    def undecided(self, outcomes: list[Outcome]) -> float:
        return sum(o.verdict == NONE for o in outcomes) / len(outcomes)


def incumbent_drifts(requests: int, drift: float, rng: np.random.Generator) -> list[MixDrift]:
    """The drift a re-rollout measures: gates.drift_from_history on HISTORIES histories of
    mixDriftHistory each, of a promoted config at INCUMBENT_ALPHA in the same traffic, in the blocks
    of prometheus.history_step that the operator's range query returns (60 s at a 15 s scrape)."""
    traffic = for_alpha(INCUMBENT_ALPHA, requests, window_seconds=WINDOW_SECONDS, drift_sd=drift)
    per_block = round(history_step(WINDOW_SECONDS) / WINDOW_SECONDS)
    stream = windows(traffic, HISTORIES * HISTORY_WINDOWS, rng)
    blocks = stream.reshape(-1, per_block, 3).sum(axis=1)
    block_seconds = per_block * WINDOW_SECONDS
    return [
        drift_from_history(
            [
                AcceptanceWindow(0.0, n, a, end=(i + 1) * block_seconds)
                for i, (_, n, a) in enumerate(history.tolist())
            ],
            block_seconds,
            GATES,
            "the incumbent's",
        )
        for history in np.split(blocks, HISTORIES)
    ]


def run_cell(
    requests: int,
    drift: float,
    offset: float,
    incumbents: list[MixDrift],
    rng: np.random.Generator,
    checker: random.Random,
    batch: int,
    max_trials: int,
) -> Cell:
    traffic = for_alpha(GATE + offset, requests, window_seconds=WINDOW_SECONDS, drift_sd=drift)
    cell = Cell(requests, drift, offset)
    while cell.trials < max_trials:
        stream = windows(traffic, batch * (LOOKS + GAP), rng)
        for t in range(batch):
            counts = stream[t * (LOOKS + GAP) : t * (LOOKS + GAP) + LOOKS]
            allowances = {"first": FIRST_ROLLOUT, "re": incumbents[cell.trials % len(incumbents)]}
            for rollout, allowance in allowances.items():
                per_look, side = verdicts_per_look(counts, allowance)
                if t == 0 and cell.trials == 0:
                    check_against_the_operator(counts, allowance, per_look, side, checker)
                cell.rules[rollout].append(ours(per_look, side))
            cell.argo.append(argo(counts))
            cell.wrong_sides += estimate_sides(counts) != cell.correct
        bad = max(round(cell.bad(outcomes) * cell.trials) for outcomes in cell.rules.values())
        low, high = wilson(bad, cell.trials)
        if high - low < CI_WIDTH:
            break
    return cell


def fixed_window_seconds(wrong_rates: dict[float, FloatArray]) -> float | None:
    """The shortest duration whose estimate's side meets FIXED_BOUNDS at every offset (one traffic,
    one mix: offset -> wrong rate per duration), and every longer duration up to the trials' end;
    None if none does."""
    meets = np.ones(len(next(iter(wrong_rates.values()))), dtype=bool)
    for distance, bound in FIXED_BOUNDS:
        for offset, rates in wrong_rates.items():
            if math.isclose(abs(offset), distance):
                meets &= rates <= bound
    failing = np.flatnonzero(~meets)
    first = failing[-1] + 1 if len(failing) else 0
    return None if first >= len(meets) else (first + 1) * WINDOW_SECONDS


def calibrate_fixed_window(
    requests: int, drift: float, rng: np.random.Generator, trials: int
) -> float | None:
    """fixed_window_seconds on `trials` streams of CALIBRATION_WINDOWS at each bound's offsets, for a
    traffic whose fixed window is longer than the rule's trials (a drifting mix)."""
    rates = {}
    for distance, _ in FIXED_BOUNDS:
        for offset in (-distance, distance):
            traffic = for_alpha(GATE + offset, requests, window_seconds=WINDOW_SECONDS, drift_sd=drift)
            stream = windows(traffic, trials * (CALIBRATION_WINDOWS + GAP), rng)
            correct = PASS if offset > 0 else FAIL
            wrong = np.zeros(CALIBRATION_WINDOWS)
            for t in range(trials):
                start = t * (CALIBRATION_WINDOWS + GAP)
                wrong += estimate_sides(stream[start : start + CALIBRATION_WINDOWS]) != correct
            rates[offset] = wrong / trials
    return fixed_window_seconds(rates)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def describe(cell: Cell, fixed: float | None) -> str:
    columns = [f"{cell.requests:>7} {cell.drift:5.2f} {GATE + cell.offset:6.3f} {cell.trials:>6}"]
    for rollout in ROLLOUTS:
        outcomes = cell.rules[rollout]
        decided = [o.decided_seconds for o in outcomes]
        ratio = _mean(decided) / fixed if fixed else math.nan
        columns.append(
            f"{cell.wrong(outcomes):7.4f} {cell.bad(outcomes):7.4f} {cell.undecided(outcomes):6.3f} "
            f"{_mean(decided) / 60:5.1f} {_median(decided) / 60:5.1f} {ratio:5.2f} "
            f"{_median([o.seconds for o in outcomes]) / 60:5.1f}"
        )
    columns.append(f"{cell.wrong(cell.argo):7.4f} {cell.bad(cell.argo):7.4f}")
    return " | ".join(columns)


def header() -> str:
    rule = f"{'wrong':>7} {'bad':>7} {'undec':>6} {'mean':>5} {'p50':>5} {'ratio':>5} {'e2e':>5}"
    columns = [
        f"{'req/win':>7} {'drift':>5} {'alpha':>6} {'trials':>6}",
        rule,
        rule,
        f"{'wrong':>7} {'bad':>7}",
    ]
    titles = [" " * 27, f"{'first rollout (minutes)':^46}", f"{'re-rollout (minutes)':^46}", f"{'Argo':^15}"]
    return " | ".join(titles) + "\n" + " | ".join(columns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-trials", type=int, default=MAX_TRIALS, help="trials per cell at most")
    parser.add_argument("--batch", type=int, default=BATCH, help="trials per batch (and at least per cell)")
    parser.add_argument(
        "--max-analysis-duration", help="maxAnalysisDuration to judge with (default: the CRD's)"
    )
    parser.add_argument(
        "--calibration-trials",
        type=int,
        default=CALIBRATION_TRIALS,
        help="trials per offset of a fixed window longer than maxAnalysisDuration",
    )
    parser.add_argument("--requests", type=int, nargs="+", default=REQUESTS_PER_WINDOW, help="cells to run")
    args = parser.parse_args()
    if args.max_analysis_duration:
        global LOOKS
        LOOKS = int(api.parse_duration(args.max_analysis_duration) // WINDOW_SECONDS)
    rng, checker = np.random.default_rng(16), random.Random(16)
    print(
        f"gate {GATE} +/- {DELTA}, errorRate {ERROR_RATE}, minDrafts {GATES.min_drafts}; Pass from "
        f"{ANALYSIS_LOOKS * WINDOW_SECONDS / 60:g} min, the estimate's side at "
        f"{LOOKS * WINDOW_SECONDS / 60:g} min where the test has its data, else Inconclusive; "
        f"{WINDOW_SECONDS:.0f}s windows; first rollout: {FIRST_ROLLOUT.source} sd {FIRST_ROLLOUT.sd:g} over "
        f"{FIRST_ROLLOUT.timescale_seconds:g}s; re-rollout: measured on {HISTORY_WINDOWS * WINDOW_SECONDS / 3600:g} h "
        f"of a config at alpha {INCUMBENT_ALPHA:g}"
    )
    cells: list[Cell] = []
    fixed: dict[tuple[int, float], float | None] = {}
    for requests in args.requests:
        for drift in DRIFTS:
            incumbents = incumbent_drifts(requests, drift, rng)
            measured = [d.sd for d in incumbents]
            print(
                f"\n{requests} requests per window, mix drift {drift:g} (logit sd): measured drift sd "
                f"median {_median(measured):.3f} (min {min(measured):.3f}, max {max(measured):.3f}), "
                f"timescale median {_median([d.timescale_seconds for d in incumbents]):.0f}s; "
                f"{sum('fallback' in d.source for d in incumbents)} of {HISTORIES} histories fell back"
            )
            group = [
                run_cell(requests, drift, offset, incumbents, rng, checker, args.batch, args.max_trials)
                for offset in OFFSETS
            ]
            fixed[requests, drift] = fixed_window_seconds({c.offset: c.wrong_side_rates for c in group})
            if fixed[requests, drift] is None:
                fixed[requests, drift] = calibrate_fixed_window(requests, drift, rng, args.calibration_trials)
            seconds = fixed[requests, drift]
            fixed_text = (
                f"none within {CALIBRATION_WINDOWS * WINDOW_SECONDS / 3600:g} h"
                if seconds is None
                else f"{seconds / 60:.2f} min"
            )
            print(f"fixed window meeting the rule's bounds here: {fixed_text}")
            print(header())
            for cell in group:
                print(describe(cell, fixed[requests, drift]), flush=True)
            cells += group
    print(" ".join(f"{name}={value}" for name, value in figures(cells, fixed).items()))


def figures(cells: list[Cell], fixed: dict[tuple[int, float], float | None]) -> dict[str, str]:
    """The name=value figures of issue 37, each the worst over the cells it names, over both kinds
    of rollout unless the name says re-rollout."""
    edges = [c for c in cells if math.isclose(abs(c.offset), DELTA)]
    far = [c for c in cells if math.isclose(abs(c.offset), 0.10)]
    busy = [c for c in cells if c.requests != LOW_TRAFFIC]
    quiet = [c for c in cells if c.requests == LOW_TRAFFIC]
    below_far = [c for c in far if c.offset < 0]

    def worst(group: list[Cell], rate: Callable[[Cell, list[Outcome]], float]) -> str:
        return f"{max((rate(c, c.rules[r]) for c in group for r in ROLLOUTS), default=math.nan):.4f}"

    def fixed_of(c: Cell) -> float:
        return fixed[c.requests, c.drift] or CALIBRATION_WINDOWS * WINDOW_SECONDS  # none within: at least

    def ratio(c: Cell) -> float:
        return _mean([o.decided_seconds for o in c.rules["re"]]) / fixed_of(c)

    long_edges = [c for c in edges if fixed_of(c) >= SHORT_SECONDS]
    long_far = [c for c in far if fixed_of(c) >= SHORT_SECONDS]
    short = [c for c in edges + far if fixed_of(c) < SHORT_SECONDS]
    decided = [
        o.decided_seconds for c in cells for r in ROLLOUTS for o in c.rules[r] if o.verdict == c.correct
    ]
    argo_s = [o.seconds for c in cells for o in c.argo if o.verdict == c.correct]
    return {
        "wrong_pass_far_worst": worst([c for c in below_far if c in busy], Cell.wrong),
        "wrong_pass_far_worst_low_traffic": worst([c for c in below_far if c in quiet], Cell.wrong),
        "wrong_pass_gross_worst": worst([c for c in cells if c.offset <= -0.20 + 1e-9], Cell.wrong),
        "bad_outcome_edge_worst": worst([c for c in edges if c in busy], Cell.bad),
        "bad_outcome_edge_worst_low_traffic": worst([c for c in edges if c in quiet], Cell.bad),
        "bad_outcome_far_worst": worst([c for c in far if c in busy], Cell.bad),
        "stopping_time_ratio_edge_worst": f"{max(map(ratio, long_edges), default=math.nan):.2f}",
        "stopping_time_ratio_far_worst": f"{max(map(ratio, long_far), default=math.nan):.2f}",
        "stopping_time_short_cells_max_min": (
            f"{max((_mean([o.decided_seconds for o in c.rules['re']]) / 60 for c in short), default=math.nan):.2f}"
        ),
        "inconclusive_steady_edge_worst": worst(
            [c for c in edges if c in busy and c.drift == 0], Cell.undecided
        ),
        "inconclusive_rate_worst": worst(cells, Cell.undecided),
        "argo_wrong_rate_edge": f"{max(c.wrong(c.argo) for c in edges):.4f}",
        "argo_wrong_rate_far": f"{max(c.wrong(c.argo) for c in far):.4f}",
        "decision_speedup_vs_argo": f"{_median(argo_s) / _median(decided):.2f}",
    }


if __name__ == "__main__":
    main()
