"""Decision benchmark: the operator's acceptance gate against an Argo-Rollouts-style rule, on the
request-level traffic model (bench/traffic.py), each stopping as it would in a cluster.

Cells: 3, 20 and 200 requests per 15-s window (long-run means: bursts, lulls and, at 3, empty
windows), a stationary traffic mix and one that drifts on a minute scale (traffic.DRIFT_SD), and
canaries at gate - 0.10, gate - indifference, gate + indifference and gate + 0.10. The true alpha is
the model's long-run alpha (by quadrature, traffic.for_alpha), not a sample.

- specgate: gates.acceptance_gate with the CRD's defaults over the windows since the analysis
  began, looked at once per window. As rollout._analyzing stops: a Fail at once, a Pass only from
  analysisWindow on (and only if that look still says Pass); at maxAnalysisDuration a test with
  its data (enough drafts and windows) is decided by the estimate's side of the gate
  (gates.decide_at_deadline), and one without stays Inconclusive (rolled back by default). The
  looks are computed with numpy (`verdicts_per_look`) and checked against gates.acceptance_gate
  and gates.decide_at_deadline themselves on sampled looks before any figure is printed.
- fixed (Argo Rollouts AnalysisTemplate as its users write it): interval 1m, count 5,
  failureLimit 1, successCondition `result >= gate` on the pooled ratio of the minute's counters.
  A minute without drafts gives NaN, which fails `NaN >= gate` (a failed measurement).

Wrong: a Pass below the gate or a Fail above it. A bad outcome (issue 37): a wrong Pass, or a
canary above the gate rolled back (Fail or Inconclusive), which costs the user its speedup. Trials per cell grow in batches until the
95 % Wilson interval of the wrong rate is narrower than CI_WIDTH, up to MAX_TRIALS; each trial is
cut from one long stream with GAP windows between trials, so the drift and the requests in flight
of one trial have faded before the next begins.

Last line: the figures issues 16 and 37 ask for, as name=value.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from looks import per_token_variance
from specgate import api
from specgate.gates import (
    HAC_LAGS,
    MIN_WINDOWS,
    AcceptanceWindow,
    Verdict,
    decide_at_deadline,
    fallback_drift,
    judged_windows,
    mix_drift_variance,
    spec_acceptance_gate,
    sprt_log_lr,
    wald_bounds,
)
from traffic import DRIFT_SD, for_alpha, windows

GATES = api.Gates()
ROLLOUT = api.RolloutSpec()
GATE, DELTA, ERROR_RATE = GATES.min_acceptance_rate, GATES.indifference, GATES.error_rate
MIX_DRIFT_SECONDS = api.parse_duration(GATES.mix_drift_timescale)
FIRST_ROLLOUT = fallback_drift(GATES, "a first rollout")  # every cell here: no incumbent history yet
WINDOW_SECONDS = 15.0
ANALYSIS_LOOKS = math.ceil(api.parse_duration(ROLLOUT.analysis_window) / WINDOW_SECONDS)
LOOKS = int(api.parse_duration(ROLLOUT.max_analysis_duration) // WINDOW_SECONDS)
GAP = 40  # windows between trials: 10 min, the drift's correlation e^-3.3 and no request in flight
REQUESTS_PER_WINDOW = (3, 20, 200)
DRIFTS = (0.0, DRIFT_SD)
OFFSETS = (-0.20, -0.10, -DELTA, DELTA, 0.10)
LOW_TRAFFIC = 3  # requests per window
BATCH = 500
MAX_TRIALS = 10_000
CI_WIDTH = 0.01
CHECKED_LOOKS = 60  # per cell: looks recomputed by gates.acceptance_gate itself
FIXED_COUNT, FIXED_FAILURE_LIMIT, FIXED_WINDOWS_PER_MEASUREMENT = 5, 1, 4  # 1m of 15-s windows

PASS, FAIL, NONE = 1, -1, 0
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Outcome:
    verdict: int  # PASS, FAIL or NONE (Inconclusive)
    seconds: float


def verdicts_per_look(counts: FloatArray) -> tuple[IntArray, IntArray]:
    """gates.acceptance_gate's verdict over windows 1..m for every m: the same arithmetic (windows
    without draft tokens left out, Newey-West spread over HAC_LAGS lags, chi-square bound, binomial
    floor, Wald's bounds), for all looks at once; and per look the side of the gate its estimate is
    on where the test has its data (PASS or FAIL, else NONE: what gates.decide_at_deadline takes).
    counts: rows of drafts, draft tokens, accepted."""
    judged = counts[:, 1] > 0
    d, n, a = counts[judged].T
    per_look = np.zeros(len(counts), dtype=np.int64)
    side = np.zeros(len(counts), dtype=np.int64)
    c = len(n)
    if c == 0:
        return per_look, side
    j = np.arange(1, c + 1, dtype=np.float64)  # judged windows in the look
    big_n, big_a, drafts = np.cumsum(n), np.cumsum(a), np.cumsum(d)
    alpha = big_a / big_n
    gamma = np.zeros((HAC_LAGS + 1, c))
    for lag in range(min(HAC_LAGS, c - 1) + 1):
        terms = np.clip(np.arange(1, c + 1) - lag, 0, None)  # products i, i + lag within the look

        def prefix(x: FloatArray, terms: IntArray = terms) -> FloatArray:
            return np.concatenate(([0.0], np.cumsum(x)))[terms]

        aa = prefix(a[: c - lag] * a[lag:])
        an = prefix(a[: c - lag] * n[lag:] + n[: c - lag] * a[lag:])
        nn = prefix(n[: c - lag] * n[lag:])
        gamma[lag] = (aa - alpha * an + alpha**2 * nn) / j
    lags = np.minimum(HAC_LAGS, j - 1)
    lag_index = np.arange(HAC_LAGS + 1)[:, None]
    weights = np.where((lag_index >= 1) & (lag_index <= lags), 1 - lag_index / (lags + 1), 0.0)
    long_run = np.maximum(gamma[0] + 2 * (weights * gamma).sum(axis=0), gamma[0])
    variance = np.where(j >= 2, long_run * j / np.maximum(j - 1, 1), 0.0)
    dof = np.maximum(j - 1, 1)
    s2 = per_token_variance(variance, dof, j, big_n, big_a, ERROR_RATE)
    judged_so_far = np.cumsum(judged)
    looks = np.flatnonzero(judged_so_far > 0)  # looks with a judged window; the rest stay NONE
    at = judged_so_far[looks] - 1  # the look's last judged window
    span = (looks + 1) * WINDOW_SECONDS  # every window of the look, empty ones too
    drift = np.array([mix_drift_variance(GATES.mix_drift, MIX_DRIFT_SECONDS, t) for t in span])
    llr = 2 * DELTA * (alpha[at] - GATE) / (s2[at] / big_n[at] + drift)
    fail_at, pass_at = wald_bounds(ERROR_RATE)
    verdict = np.where(llr >= pass_at, PASS, np.where(llr <= fail_at, FAIL, NONE))
    short = (drafts[at] < GATES.min_drafts) | (j[at] < MIN_WINDOWS)
    verdict[short] = NONE
    per_look[looks] = verdict
    side[looks] = np.where(short, NONE, np.where(alpha[at] >= GATE, PASS, FAIL))
    return per_look, side


def check_against_the_operator(
    counts: FloatArray, per_look: IntArray, side: IntArray, rng: random.Random
) -> None:
    """The vectorized looks give gates.acceptance_gate's verdicts, and at the deadline
    gates.decide_at_deadline's, on sampled looks, or the bench stops (a look whose log-LR sits on a
    bound to rounding is compared by its log-LR alone)."""
    for m in rng.sample(range(1, len(counts) + 1), min(CHECKED_LOOKS, len(counts))):
        looked = [AcceptanceWindow(*map(float, row)) for row in counts[:m]]
        result = spec_acceptance_gate(looked, GATES, FIRST_ROLLOUT, window_seconds=WINDOW_SECONDS)
        at_deadline = decide_at_deadline(result, GATE, DELTA)
        if per_look[m - 1] == NONE and _code(at_deadline.verdict) != side[m - 1]:
            raise SystemExit(
                f"vectorized side {side[m - 1]} != decide_at_deadline {at_deadline.verdict} at look {m}"
            )
        if _code(result.verdict) == per_look[m - 1]:
            continue
        usable = judged_windows(looked)
        drift = mix_drift_variance(GATES.mix_drift, MIX_DRIFT_SECONDS, m * WINDOW_SECONDS)
        llr = sprt_log_lr(usable, GATE, DELTA, ERROR_RATE, drift) if usable else math.nan
        if not any(math.isclose(abs(llr), bound, rel_tol=1e-9) for bound in wald_bounds(ERROR_RATE)):
            raise SystemExit(
                f"vectorized gate {per_look[m - 1]} != acceptance_gate {result.verdict} at look {m}"
            )


def _code(verdict: Verdict) -> int:
    return {Verdict.PASS: PASS, Verdict.FAIL: FAIL}.get(verdict, NONE)


def ours(per_look: IntArray, side: IntArray) -> Outcome:
    """As rollout._analyzing: a Fail stops at once, a Pass from analysisWindow on; at the deadline
    (the last look) the estimate's side where the test has its data, else Inconclusive."""
    for m, verdict in enumerate(per_look, start=1):
        if verdict == FAIL or (verdict == PASS and m >= ANALYSIS_LOOKS):
            return Outcome(int(verdict), m * WINDOW_SECONDS)
    return Outcome(int(side[-1]), len(per_look) * WINDOW_SECONDS)


def fixed_window(counts: FloatArray) -> Outcome:
    """Argo Rollouts: a measurement a minute, count 5, failureLimit 1, `result >= gate`."""
    failures = 0
    step = FIXED_WINDOWS_PER_MEASUREMENT
    for i in range(FIXED_COUNT):
        minute = counts[i * step : (i + 1) * step]
        tokens = minute[:, 1].sum()
        result = minute[:, 2].sum() / tokens if tokens > 0 else math.nan
        failures += not result >= GATE
        if failures > FIXED_FAILURE_LIMIT:
            return Outcome(FAIL, (i + 1) * step * WINDOW_SECONDS)
    return Outcome(PASS, FIXED_COUNT * step * WINDOW_SECONDS)


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
    ours: list[Outcome]
    fixed: list[Outcome]

    @property
    def correct(self) -> int:
        return PASS if self.offset > 0 else FAIL

    def wrong(self, outcomes: list[Outcome]) -> int:
        return sum(o.verdict == -self.correct for o in outcomes)

    def bad(self, outcomes: list[Outcome]) -> int:
        """A bad canary promoted, or a good one rolled back (Fail or Inconclusive)."""
        if self.correct == FAIL:
            return sum(o.verdict == PASS for o in outcomes)
        return sum(o.verdict != PASS for o in outcomes)

    def seconds_to_correct(self, outcomes: list[Outcome]) -> list[float]:
        return [o.seconds for o in outcomes if o.verdict == self.correct]


def run_cell(
    requests: int,
    drift: float,
    offset: float,
    rng: np.random.Generator,
    checker: random.Random,
    batch: int = BATCH,
    max_trials: int = MAX_TRIALS,
) -> Cell:
    traffic = for_alpha(GATE + offset, requests, window_seconds=WINDOW_SECONDS, drift_sd=drift)
    cell = Cell(requests, drift, offset, [], [])
    while len(cell.ours) < max_trials:
        stream = windows(traffic, batch * (LOOKS + GAP), rng)
        for t in range(batch):
            counts = stream[t * (LOOKS + GAP) : t * (LOOKS + GAP) + LOOKS]
            per_look, side = verdicts_per_look(counts)
            if t == 0 and not cell.ours:
                check_against_the_operator(counts, per_look, side, checker)
            cell.ours.append(ours(per_look, side))
            cell.fixed.append(fixed_window(counts))
        low, high = wilson(cell.wrong(cell.ours), len(cell.ours))
        if high - low < CI_WIDTH:
            break
    return cell


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def describe(cell: Cell) -> str:
    trials = len(cell.ours)
    wrong = cell.wrong(cell.ours)
    low, high = wilson(wrong, trials)
    undecided = sum(o.verdict == NONE for o in cell.ours) / trials
    return (
        f"{cell.requests:>8} {cell.drift:5.2f} {GATE + cell.offset:6.3f} {trials:>6} "
        f"{wrong / trials:8.4f} [{low:.4f},{high:.4f}] {cell.bad(cell.ours) / trials:8.4f} {undecided:9.3f} "
        f"{_median(cell.seconds_to_correct(cell.ours)):7.0f} "
        f"{cell.wrong(cell.fixed) / trials:9.4f} {_median(cell.seconds_to_correct(cell.fixed)):7.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-trials", type=int, default=MAX_TRIALS, help="trials per cell at most")
    parser.add_argument("--batch", type=int, default=BATCH, help="trials per batch (and at least per cell)")
    args = parser.parse_args()
    rng, checker = np.random.default_rng(16), random.Random(16)
    print(
        f"gate {GATE} +/- {DELTA}, errorRate {ERROR_RATE}, minDrafts {GATES.min_drafts}; Pass from "
        f"{ANALYSIS_LOOKS * WINDOW_SECONDS:.0f}s, Inconclusive at {LOOKS * WINDOW_SECONDS:.0f}s; "
        f"{WINDOW_SECONDS:.0f}s windows; the estimate's side at the deadline where the test has its data"
    )
    print(
        f"{'req/win':>8} {'drift':>5} {'alpha':>6} {'trials':>6} {'wrong':>8} {'95% CI':>15} "
        f"{'bad':>8} {'undecided':>9} {'ours_s':>7} {'fixed_wrong':>9} {'fixed_s':>7}"
    )
    cells = []
    for requests in REQUESTS_PER_WINDOW:
        for drift in DRIFTS:
            for offset in OFFSETS:
                cells.append(run_cell(requests, drift, offset, rng, checker, args.batch, args.max_trials))
                print(describe(cells[-1]), flush=True)
    print(" ".join(f"{name}={value}" for name, value in figures(cells).items()))


def figures(cells: list[Cell]) -> dict[str, str]:
    """The name=value figures of issues 16 and 37, each the worst over the cells it names."""
    edges = [c for c in cells if math.isclose(abs(c.offset), DELTA)]
    far = [c for c in cells if math.isclose(abs(c.offset), 0.10)]
    busy = [c for c in cells if c.requests != LOW_TRAFFIC]
    quiet = [c for c in cells if c.requests == LOW_TRAFFIC]

    def worst(group: list[Cell], rate: Callable[[Cell], float]) -> str:
        return f"{max(rate(c) for c in group):.4f}"

    def wrong(c: Cell) -> float:
        return c.wrong(c.ours) / len(c.ours)

    def bad(c: Cell) -> float:
        return c.bad(c.ours) / len(c.ours)

    def undecided(c: Cell) -> float:
        return sum(o.verdict == NONE for o in c.ours) / len(c.ours)

    def fixed_wrong(c: Cell) -> float:
        return c.wrong(c.fixed) / len(c.fixed)

    below_far = [c for c in far if c.offset < 0]
    ours_s = [s for c in cells for s in c.seconds_to_correct(c.ours)]
    fixed_s = [s for c in cells for s in c.seconds_to_correct(c.fixed)]
    return {
        "wrong_verdict_rate": worst(edges, wrong),
        "wrong_verdict_rate_far": worst(far, wrong),
        "wrong_pass_far_worst": worst([c for c in below_far if c in busy], wrong),
        "wrong_pass_far_worst_low_traffic": worst([c for c in below_far if c in quiet], wrong),
        "wrong_pass_gross_worst": worst([c for c in cells if c.offset <= -0.20 + 1e-9], wrong),
        "bad_outcome_edge_worst": worst([c for c in edges if c in busy], bad),
        "bad_outcome_edge_worst_low_traffic": worst([c for c in edges if c in quiet], bad),
        "bad_outcome_far_worst": worst([c for c in far if c in busy], bad),
        "inconclusive_steady_edge_worst": worst([c for c in edges if c in busy and c.drift == 0], undecided),
        "inconclusive_rate_worst": worst(cells, undecided),
        "decision_speedup_vs_fixed_window": f"{_median(fixed_s) / _median(ours_s):.2f}",
        "fixed_window_wrong_rate": worst(edges, fixed_wrong),
        "fixed_window_wrong_rate_far": worst(far, fixed_wrong),
    }


if __name__ == "__main__":
    main()
