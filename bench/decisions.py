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
  blocks the operator's range query reads. Each trial draws its own history, so the intervals
  include the history-to-history variation: trial t of every cell at one (requests, mix) re-rolls
  out over that traffic's history t (histories GAP windows apart, none shared by two trials of a
  cell). The drifts of all histories are fitted at once with numpy (`looks.history_drifts`) and
  checked against gates.drift_from_history itself on sampled histories before any figure is printed.

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
canary above the gate rolled back (Fail or Inconclusive), which costs the user its speedup. The edge
cells (gate +- indifference) run --edge-trials trials (issue 58: at least 3,000); the others grow in
batches until the 95 % Wilson interval of the bad-outcome rate is narrower than CI_WIDTH, up to
--max-trials. Each trial is cut from one long stream with GAP windows between trials, so the drift
and the requests in flight of one trial have faded before the next begins. The six traffics
(requests, mix) run in --jobs processes, each from its own seed.

Last line: the figures issues 37 and 58 ask for, as name=value.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from looks import HistoryDrifts, history_drifts, per_token_variance, ratio_long_run_variances
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
from traffic import DRIFT_SD, Traffic, for_alpha, windows

GATES = api.Gates()
ROLLOUT = api.RolloutSpec()
GATE, DELTA, ERROR_RATE = GATES.min_acceptance_rate, GATES.indifference, GATES.error_rate
FIRST_ROLLOUT = fallback_drift(GATES, "a first rollout")
NO_HISTORY = fallback_drift(GATES, "the incumbent's history is too short or too sparse")
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
INCUMBENT_ALPHA = GATE + 0.10  # the promoted config the re-rollout replaces (the drift is the mix's)
BATCH = 300
MAX_TRIALS = 1_200
EDGE_TRIALS = 3_000  # per edge cell: a 9 % rate's 95 % interval is then +-1 point, histories included
CI_WIDTH = 0.02
CHECKED_LOOKS = 60  # per cell and rollout: looks recomputed by gates.acceptance_gate itself
CHECKED_HISTORIES = 40  # per traffic: histories whose drift gates.drift_from_history recomputes
SEED = 16
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
        return self.bad_outcomes(outcomes) / len(outcomes)

    def bad_outcomes(self, outcomes: list[Outcome]) -> int:
        if self.correct == FAIL:
            return sum(o.verdict == PASS for o in outcomes)
        return sum(o.verdict != PASS for o in outcomes)

    def bad_count(self) -> int:
        """The bad outcomes of the kind of rollout that has more of them."""
        return max(self.bad_outcomes(outcomes) for outcomes in self.rules.values())

    def undecided(self, outcomes: list[Outcome]) -> float:
        return sum(o.verdict == NONE for o in outcomes) / len(outcomes)


def incumbent_blocks(traffic: Traffic, count: int, rng: np.random.Generator) -> tuple[FloatArray, FloatArray]:
    """`count` fresh histories of mixDriftHistory each of a promoted config in `traffic`, GAP
    windows apart, as (draft tokens, accepted tokens) per history and block of
    prometheus.history_step (60 s at a 15 s scrape: the operator's range query)."""
    per_block = round(history_step(WINDOW_SECONDS) / WINDOW_SECONDS)
    stream = windows(traffic, count * (HISTORY_WINDOWS + GAP), rng)
    histories = stream.reshape(count, HISTORY_WINDOWS + GAP, 3)[:, :HISTORY_WINDOWS]
    blocks = histories.reshape(count, HISTORY_WINDOWS // per_block, per_block, 3).sum(axis=2)
    return blocks[:, :, 1], blocks[:, :, 2]


def mix_drift(drifts: HistoryDrifts, i: int) -> MixDrift:
    """The MixDrift gates.drift_from_history gives history i (its source names only the fallback)."""
    if not drifts.measured[i]:
        return NO_HISTORY
    effect = float(drifts.design_effect[i])
    return MixDrift(
        float(drifts.sd[i]),
        float(drifts.timescale_seconds[i]),
        "measured",
        None if math.isnan(effect) else effect,
    )


def check_histories_against_the_operator(
    tokens: FloatArray, accepted: FloatArray, drifts: HistoryDrifts, checker: random.Random
) -> None:
    """The vectorized drifts are gates.drift_from_history's on sampled histories, or the bench stops."""
    block_seconds = history_step(WINDOW_SECONDS)
    for i in checker.sample(range(len(tokens)), min(CHECKED_HISTORIES, len(tokens))):
        history = [
            AcceptanceWindow(0.0, float(n), float(a), end=(b + 1) * block_seconds)
            for b, (n, a) in enumerate(zip(tokens[i], accepted[i], strict=True))
        ]
        operator = drift_from_history(history, block_seconds, GATES, "the incumbent's")
        ours = mix_drift(drifts, i)
        if not _same_drift(operator, ours):
            raise SystemExit(f"vectorized drift {ours} != drift_from_history {operator} on history {i}")


def _same_drift(operator: MixDrift, ours: MixDrift) -> bool:
    if ("fallback" in operator.source) != (ours is NO_HISTORY):
        return False
    if ours is NO_HISTORY:
        return True
    effects = (operator.design_effect, ours.design_effect)
    return (
        math.isclose(operator.sd, ours.sd, rel_tol=1e-9, abs_tol=1e-12)
        and math.isclose(operator.timescale_seconds, ours.timescale_seconds, rel_tol=1e-9)
        and (effects[0] is None) == (effects[1] is None)
        and (None in effects or math.isclose(*effects, rel_tol=1e-9))  # type: ignore[arg-type]
    )


@dataclass
class Incumbents:
    """Fresh incumbent histories of one traffic, drawn in batches as its cells need them: trial t
    of every cell of that traffic re-rolls out over history t, so no two trials of a cell share one.
    The first batch is checked against the operator's drift_from_history."""

    traffic: Traffic
    rng: np.random.Generator
    checker: random.Random
    drifts: list[MixDrift] = field(default_factory=list)

    def __getitem__(self, trial: int) -> MixDrift:
        while len(self.drifts) <= trial:
            tokens, accepted = incumbent_blocks(self.traffic, BATCH, self.rng)
            drifts = history_drifts(tokens, accepted, history_step(WINDOW_SECONDS))
            if not self.drifts:
                check_histories_against_the_operator(tokens, accepted, drifts, self.checker)
            self.drifts += [mix_drift(drifts, i) for i in range(len(tokens))]
        return self.drifts[trial]

    def summary(self) -> str:
        measured = [d for d in self.drifts if d is not NO_HISTORY]
        sds = [d.sd for d in measured]
        return (
            f"{len(self.drifts)} incumbent histories: measured drift sd median {_median(sds):.3f} "
            f"(min {min(sds, default=math.nan):.3f}, max {max(sds, default=math.nan):.3f}), "
            f"{sum(sd > 0 for sd in sds)} with a drift, timescale median "
            f"{_median([d.timescale_seconds for d in measured]):.0f}s; "
            f"{len(self.drifts) - len(measured)} fell back"
        )


def is_edge(offset: float) -> bool:
    return math.isclose(abs(offset), DELTA)


def run_cell(
    requests: int,
    drift: float,
    offset: float,
    incumbents: Incumbents,
    rng: np.random.Generator,
    checker: random.Random,
    max_trials: int,
    edge_trials: int,
) -> Cell:
    """Batches of trials: an edge cell's edge_trials of them, another's until the Wilson interval
    of its bad-outcome rate is narrower than CI_WIDTH (or max_trials)."""
    traffic = for_alpha(GATE + offset, requests, window_seconds=WINDOW_SECONDS, drift_sd=drift)
    cell = Cell(requests, drift, offset)
    while cell.trials < (edge_trials if is_edge(offset) else max_trials):
        stream = windows(traffic, BATCH * (LOOKS + GAP), rng)
        for t in range(BATCH):
            counts = stream[t * (LOOKS + GAP) : t * (LOOKS + GAP) + LOOKS]
            allowances = {"first": FIRST_ROLLOUT, "re": incumbents[cell.trials]}
            for rollout, allowance in allowances.items():
                per_look, side = verdicts_per_look(counts, allowance)
                if t == 0 and cell.trials == 0:
                    check_against_the_operator(counts, allowance, per_look, side, checker)
                cell.rules[rollout].append(ours(per_look, side))
            cell.argo.append(argo(counts))
            cell.wrong_sides += estimate_sides(counts) != cell.correct
        low, high = wilson(cell.bad_count(), cell.trials)
        if not is_edge(offset) and high - low < CI_WIDTH:
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
        low, high = wilson(cell.bad_outcomes(outcomes), cell.trials)
        columns.append(
            f"{cell.wrong(outcomes):7.4f} {cell.bad(outcomes):7.4f} [{low:.3f},{high:.3f}] "
            f"{cell.undecided(outcomes):6.3f} {_mean(decided) / 60:5.1f} {_median(decided) / 60:5.1f} "
            f"{ratio:5.2f} {_median([o.seconds for o in outcomes]) / 60:5.1f}"
        )
    columns.append(f"{cell.wrong(cell.argo):7.4f} {cell.bad(cell.argo):7.4f}")
    return " | ".join(columns)


def header() -> str:
    rule = (
        f"{'wrong':>7} {'bad':>7} {'bad 95% Wilson':^13} {'undec':>6} {'mean':>5} {'p50':>5} {'ratio':>5} "
        f"{'e2e':>5}"
    )
    columns = [
        f"{'req/win':>7} {'drift':>5} {'alpha':>6} {'trials':>6}",
        rule,
        rule,
        f"{'wrong':>7} {'bad':>7}",
    ]
    titles = [" " * 27, f"{'first rollout (minutes)':^60}", f"{'re-rollout (minutes)':^60}", f"{'Argo':^15}"]
    return " | ".join(titles) + "\n" + " | ".join(columns)


@dataclass
class Traffics:
    """One traffic's (requests, mix) five cells, its fixed window and what its run printed."""

    cells: list[Cell]
    fixed: float | None
    lines: list[str]
    cpu_seconds: float


def run_traffic(requests: int, drift: float, args: argparse.Namespace) -> Traffics:
    """The five cells of one traffic, from a seed of its own (the same whatever --jobs)."""
    started = time.process_time()
    seed = (SEED, requests, DRIFTS.index(drift))
    rng, checker = np.random.default_rng(seed), random.Random(hash(seed))
    incumbent = for_alpha(INCUMBENT_ALPHA, requests, window_seconds=WINDOW_SECONDS, drift_sd=drift)
    incumbents = Incumbents(incumbent, rng, checker)
    group = [
        run_cell(requests, drift, offset, incumbents, rng, checker, args.max_trials, args.edge_trials)
        for offset in OFFSETS
    ]
    fixed = fixed_window_seconds({c.offset: c.wrong_side_rates for c in group})
    if fixed is None:
        fixed = calibrate_fixed_window(requests, drift, rng, args.calibration_trials)
    fixed_text = (
        f"none within {CALIBRATION_WINDOWS * WINDOW_SECONDS / 3600:g} h"
        if fixed is None
        else f"{fixed / 60:.2f} min"
    )
    lines = [
        f"\n{requests} requests per window, mix drift {drift:g} (logit sd): {incumbents.summary()}",
        f"fixed window meeting the rule's bounds here: {fixed_text}",
        header(),
        *(describe(cell, fixed) for cell in group),
    ]
    return Traffics(group, fixed, lines, time.process_time() - started)


def _run(task: tuple[int, float, argparse.Namespace]) -> Traffics:
    return run_traffic(*task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--max-trials",
        type=int,
        default=MAX_TRIALS,
        help="trials per cell at most (edge cells: --edge-trials)",
    )
    parser.add_argument(
        "--edge-trials", type=int, default=EDGE_TRIALS, help="trials per edge cell (gate +- indifference)"
    )
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
    parser.add_argument("--jobs", type=int, default=2, help="processes, one traffic (requests, mix) each")
    args = parser.parse_args()
    if args.max_analysis_duration:
        global LOOKS
        LOOKS = int(api.parse_duration(args.max_analysis_duration) // WINDOW_SECONDS)
    started = time.monotonic()
    print(
        f"gate {GATE} +/- {DELTA}, errorRate {ERROR_RATE}, minDrafts {GATES.min_drafts}; Pass from "
        f"{ANALYSIS_LOOKS * WINDOW_SECONDS / 60:g} min, the estimate's side at "
        f"{LOOKS * WINDOW_SECONDS / 60:g} min where the test has its data, else Inconclusive; "
        f"{WINDOW_SECONDS:.0f}s windows; first rollout: {FIRST_ROLLOUT.source} sd {FIRST_ROLLOUT.sd:g} over "
        f"{FIRST_ROLLOUT.timescale_seconds:g}s; re-rollout: measured on a fresh "
        f"{HISTORY_WINDOWS * WINDOW_SECONDS / 3600:g} h history per trial of a config at alpha {INCUMBENT_ALPHA:g}; "
        f"{args.edge_trials} trials per edge cell; seed {SEED}",
        flush=True,
    )
    tasks = [(requests, drift, args) for requests in args.requests for drift in DRIFTS]
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            # the busiest traffics first, so that the processes finish together
            order = sorted(range(len(tasks)), key=lambda i: -tasks[i][0])
            done = dict(zip(order, pool.map(_run, [tasks[i] for i in order], chunksize=1), strict=True))
            traffics = [done[i] for i in range(len(tasks))]
    else:
        traffics = [_run(task) for task in tasks]
    for traffic in traffics:
        print("\n".join(traffic.lines))
    cells = [c for t in traffics for c in t.cells]
    fixed = {(t.cells[0].requests, t.cells[0].drift): t.fixed for t in traffics}
    cpu = sum(t.cpu_seconds for t in traffics)
    print(
        f"\nrun time {(time.monotonic() - started) / 60:.1f} min with {args.jobs} processes "
        f"({cpu / 60:.1f} CPU minutes in the cells; per traffic: "
        + ", ".join(f"{t.cells[0].requests}/{t.cells[0].drift:g} {t.cpu_seconds / 60:.1f}" for t in traffics)
        + ")"
    )
    print(" ".join(f"{name}={value}" for name, value in figures(cells, fixed).items()))


def figures(cells: list[Cell], fixed: dict[tuple[int, float], float | None]) -> dict[str, str]:
    """The name=value figures of issues 37 and 58, each the worst over the cells it names, over both
    kinds of rollout unless the name says re-rollout."""
    edges = [c for c in cells if is_edge(c.offset)]
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

    def worst_upper(group: list[Cell]) -> float:
        """The 95 % Wilson upper bound of the worst cell and rollout's bad-outcome rate."""
        if not group:
            return math.nan
        worst_cell, rollout = max(
            ((c, r) for c in group for r in ROLLOUTS), key=lambda cr: cr[0].bad(cr[0].rules[cr[1]])
        )
        return wilson(worst_cell.bad_outcomes(worst_cell.rules[rollout]), worst_cell.trials)[1]

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
        "bad_outcome_edge_worst_wilson_upper": f"{worst_upper([c for c in edges if c in busy]):.4f}",
        "edge_trials_min": str(min((c.trials for c in edges), default=0)),
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
