"""Latency bench: the operator's per-token latency gate on simulated vLLM histograms, stopping as
rollout._analyzing stops (issue 58).

The model (fixed by issue 58, so that its figures are not set by construction): each request's time
per output token is lognormal with log-sd 0.15 or 0.3, at a GPU scale (the baseline's P99 40 ms) or a
CPU-lab scale (median 120 ms). Requests arrive Poisson at 3, 20 or 200 per 15-s window on each
track (both tracks at the same load, as the gate compares them only then). A canary is identical,
10 % or 30 % faster (every request's time x 0.9, x 0.7), or its P99 is 1.2x or 1.5x the baseline's,
either as a shift (every request x r) or tail-only (the median kept, the log-sd raised so that the
P99 is x r). Both tracks' histograms are vLLM's default `inter_token_latency` buckets (read from
vLLM 0.32's source: vllm/v1/metrics/buckets.py, which the per-token histogram shares) or a fine
ladder specgate renders where spec.latencyBuckets is unset (render.latency_ladder: 8 % apart).

As rollout feeds the gate (measurement_window in Analyzing, the canary strategy): both tracks'
histograms over the analysis so far, looked at every 15 s for maxAnalysisDuration; a Fail rolls back
at once, a Pass promotes from analysisWindow on, and at maxAnalysisDuration (the last look) the
verdict of the deadline rule decides, anything else there is Inconclusive (rolled back by default).
Bucket counts per window are Poisson(rate x the bucket's probability), exact for Poisson arrivals.

Figures: a good canary (identical, faster) rolled back (Fail or Inconclusive) is a bad outcome; a
canary whose P99 is 1.2x or 1.5x is a wrong pass when promoted. Each is the worst over its cells
with its trial count and 95 % Wilson bounds; the last line is name=value for issue 58.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decisions import wilson
from specgate import api, render
from specgate.gates import Histogram, Verdict, latency_gate, step_stall_gate

GATES = api.Gates()
ROLLOUT = api.RolloutSpec()
TOLERANCE = GATES.max_p99_per_token_regression
WINDOW_SECONDS = 15.0
ANALYSIS_LOOKS = math.ceil(api.parse_duration(ROLLOUT.analysis_window) / WINDOW_SECONDS)
LOOKS = int(api.parse_duration(ROLLOUT.max_analysis_duration) // WINDOW_SECONDS)
QUANTILE = 0.99
Z99 = NormalDist().inv_cdf(QUANTILE)
# vLLM 0.32's INTER_TOKEN_LATENCY_BUCKETS (vllm/v1/metrics/buckets.py), seconds, and +Inf.
VLLM_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LADDER = api.LatencyBuckets()  # the ladder specgate renders where spec.latencyBuckets is unset
REQUESTS_PER_WINDOW = (3, 20, 200)
SIGMAS = (0.15, 0.3)
LOW_TRAFFIC = 3
GOOD = {"identical": 1.0, "faster10": 0.9, "faster30": 0.7}  # every request's time x r
BAD = (1.2, 1.5)  # the canary's P99 x r, as a shift or tail-only

PASS, FAIL, NONE = 1, -1, 0
FloatArray = npt.NDArray[np.float64]


BUCKETS = {"fine": render.latency_ladder(LADDER), "default": VLLM_BUCKETS}


@dataclass(frozen=True)
class Track:
    """A lognormal time per output token: log-median mu, log-sd sigma."""

    mu: float
    sigma: float

    def p99(self) -> float:
        return math.exp(self.mu + Z99 * self.sigma)

    def probabilities(self, bounds: tuple[float, ...]) -> FloatArray:
        """Each bucket's probability (the last one is +Inf's)."""
        cdf = [NormalDist(self.mu, self.sigma).cdf(math.log(b)) for b in bounds]
        return np.diff(np.array([0.0, *cdf, 1.0]))


@dataclass(frozen=True)
class Scenario:
    name: str
    ratio: float  # the canary's P99 over the baseline's
    tail_only: bool = False

    @property
    def good(self) -> bool:
        return self.ratio <= 1.0

    def canary(self, base: Track) -> Track:
        if self.tail_only:  # the median kept: the log-sd carries the whole P99 ratio
            return Track(base.mu, base.sigma + math.log(self.ratio) / Z99)
        return Track(base.mu + math.log(self.ratio), base.sigma)


SCENARIOS = (
    *(Scenario(name, r) for name, r in GOOD.items()),
    *(Scenario(f"p99x{round(r * 100)}", r, tail) for r in BAD for tail in (False, True)),
)


def baseline_track(scale: str, sigma: float) -> Track:
    """GPU: the baseline's P99 40 ms; CPU lab: its median 120 ms."""
    mu = math.log(0.040) - Z99 * sigma if scale == "gpu" else math.log(0.120)
    return Track(mu, sigma)


@dataclass(frozen=True)
class Outcome:
    verdict: int  # PASS, FAIL or NONE (Inconclusive at the deadline)
    seconds: float  # when the rollout acts


@dataclass
class Cell:
    scale: str
    sigma: float
    requests: int
    buckets: str
    scenario: Scenario
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def trials(self) -> int:
        return len(self.outcomes)

    def rate(self, verdicts: set[int]) -> float:
        return sum(o.verdict in verdicts for o in self.outcomes) / self.trials

    @property
    def bad(self) -> float:
        """A good canary rolled back (Fail or Inconclusive), a bad one promoted."""
        return self.rate({FAIL, NONE}) if self.scenario.good else self.rate({PASS})

    def pass_minutes_p50(self) -> float:
        """The median minutes to a Pass, a canary never passed counted as never (inf)."""
        times = sorted(o.seconds / 60 if o.verdict == PASS else math.inf for o in self.outcomes)
        return times[len(times) // 2]


def cumulative_histograms(
    probabilities: FloatArray, requests: int, trials: int, rng: np.random.Generator
) -> FloatArray:
    """(trials, looks, buckets) cumulative counts per `le` over the analysis so far, at each look."""
    per_window = rng.poisson(requests * probabilities, size=(trials, LOOKS, len(probabilities)))
    cumulative: FloatArray = np.cumsum(np.cumsum(per_window, axis=1), axis=2).astype(np.float64)
    return cumulative


def histogram(bounds: tuple[float, ...], counts: FloatArray) -> Histogram:
    return Histogram((*bounds, math.inf), tuple(float(c) for c in counts))


def operator_looks(bounds: tuple[float, ...], base: FloatArray, canary: FloatArray) -> Iterator[int]:
    """gates.latency_gate as rollout._latency_results calls it (the CRD's defaults), look by look; at
    the last look (maxAnalysisDuration) as rollout._decided_at_deadline decides it."""
    for m in range(LOOKS):
        result = latency_gate(
            histogram(bounds, base[m]),
            histogram(bounds, canary[m]),
            figure="P99 per-token latency",
            max_regression=TOLERANCE,
            min_count=GATES.min_latency_samples,
            last_look=m == LOOKS - 1,
        )
        yield {Verdict.PASS: PASS, Verdict.FAIL: FAIL}.get(result.verdict, NONE)


def stop(looks: Iterator[int]) -> Outcome:
    """As rollout._analyzing: a Fail at once, a Pass from analysisWindow on; at maxAnalysisDuration
    a latency verdict still missing is Inconclusive."""
    for m, verdict in enumerate(looks, start=1):
        if verdict == FAIL or (verdict == PASS and m >= ANALYSIS_LOOKS):
            return Outcome(verdict, m * WINDOW_SECONDS)
    return Outcome(NONE, LOOKS * WINDOW_SECONDS)


def run_cell(cell: Cell, trials: int, rng: np.random.Generator) -> None:
    bounds = BUCKETS[cell.buckets]
    base = baseline_track(cell.scale, cell.sigma)
    canary = cell.scenario.canary(base)
    base_counts = cumulative_histograms(base.probabilities(bounds), cell.requests, trials, rng)
    canary_counts = cumulative_histograms(canary.probabilities(bounds), cell.requests, trials, rng)
    for t in range(trials):
        cell.outcomes.append(stop(operator_looks(bounds, base_counts[t], canary_counts[t])))


def describe(cell: Cell) -> str:
    low, high = wilson(round(cell.bad * cell.trials), cell.trials)
    counts = " ".join(f"{cell.rate({v}):6.3f}" for v in (PASS, FAIL, NONE))
    return (
        f"{cell.scale:>4} {cell.sigma:5.2f} {cell.requests:>5} {cell.buckets:>8} {cell.scenario.name:>14}"
        f"{' tail' if cell.scenario.tail_only else '     '} {cell.trials:>6} | {counts} | "
        f"{cell.bad:6.3f} [{low:.3f}, {high:.3f}] | {cell.pass_minutes_p50():6.1f}"
    )


def header() -> str:
    return (
        f"{'scale':>4} {'sigma':>5} {'req/w':>5} {'buckets':>8} {'canary':>14}      {'trials':>6} | "
        f"{'pass':>6} {'fail':>6} {'inc':>6} | {'bad':>6} {'[95 % Wilson]':>14} | p50 min to pass"
    )


def worst(cells: list[Cell], rate: Callable[[Cell], float], count: Callable[[Cell], int]) -> str:
    """The worst rate over `cells`, with its trials and Wilson bounds."""
    if not cells:
        return "nan"
    cell = max(cells, key=rate)
    low, high = wilson(count(cell), cell.trials)
    return f"{rate(cell):.4f}[{low:.3f},{high:.3f}]n={cell.trials}"


def figures(cells: list[Cell]) -> dict[str, str]:
    """Issue 58's figures: the worst over the cells each names (fine buckets unless it says
    default_buckets; from 20 requests a window unless it ends in _3)."""

    def pick(names: set[str], buckets: str, busy: bool | None) -> list[Cell]:
        return [
            c
            for c in cells
            if c.scenario.name in names
            and c.buckets == buckets
            and (busy is None or (c.requests != LOW_TRAFFIC) == busy)
        ]

    def bad(c: Cell) -> float:
        return c.bad

    def bad_n(c: Cell) -> int:
        return round(c.bad * c.trials)

    def fails(c: Cell) -> float:
        return c.rate({FAIL})

    def fails_n(c: Cell) -> int:
        return round(c.rate({FAIL}) * c.trials)

    out: dict[str, str] = {}
    for name, names, buckets in (
        ("latency_bad_outcome_faster10_worst", {"faster10"}, "fine"),
        ("latency_bad_outcome_equal_worst", {"identical"}, "fine"),
        ("latency_wrong_pass_p99x120_worst", {"p99x120"}, "fine"),
    ):
        out[name] = worst(pick(names, buckets, True), bad, bad_n)
        out[f"{name}_3"] = worst(pick(names, buckets, False), bad, bad_n)
    out["latency_false_fail_identical_worst"] = worst(pick({"identical"}, "fine", None), fails, fails_n)
    out["latency_false_fail_identical_default_buckets_worst"] = worst(
        pick({"identical"}, "default", None), fails, fails_n
    )
    out["latency_wrong_pass_p99x150_worst"] = worst(
        pick({"p99x150"}, "fine", None) + pick({"p99x150"}, "default", None), bad, bad_n
    )
    out["latency_wrong_pass_p99x120_default_buckets_worst"] = worst(
        pick({"p99x120"}, "default", None), bad, bad_n
    )
    out["latency_bad_outcome_faster30_default_buckets_worst"] = worst(
        pick({"faster30"}, "default", None), bad, bad_n
    )
    twenty = [c for c in pick({"faster10"}, "fine", True) if c.requests == 20]
    out["latency_minutes_to_pass_p50_faster10_20"] = (
        f"{max(c.pass_minutes_p50() for c in twenty):.2f}" if twenty else "nan"
    )
    return out


# --- the step stall (vLLM's inter_token_latency_seconds, counted in engine steps) ---

# The model of tests/unit/test_step_stall.py: a step is a decode step or, 3 % of them, one that
# carries a prefill chunk (a flat stretch of the distribution below its P99); every step of the
# canary is `slower` times the baseline's. Each step is recorded once per running request.
DECODE, PREFILL, PREFILL_SHARE = (0.030, 0.15), (0.090, 0.20), 0.03
STALL_TOLERANCE = GATES.max_p99_itl_regression
STALL_LOADS = {"busy": (470, 8), "light": (50, 1)}  # (steps a 15-s window, requests running)
STALL_SLOWER = (1.0, 1.2, 2.0)


def step_shares(bounds: tuple[float, ...], slower: float) -> FloatArray:
    """Each bucket's share of steps (the last is +Inf's)."""

    def below(x: float) -> float:
        modes = ((1 - PREFILL_SHARE, DECODE), (PREFILL_SHARE, PREFILL))
        return sum(w * NormalDist(math.log(slower * m), sd).cdf(math.log(x)) for w, (m, sd) in modes)

    return np.diff(np.array([0.0, *(below(b) for b in bounds), 1.0]))


def stall_outcome(
    bounds: tuple[float, ...], base: FloatArray, canary: FloatArray, steps: FloatArray, running: int
) -> Outcome:
    """step_stall_gate as rollout._latency_results calls it, look by look, stopped as stop() does."""

    def looks() -> Iterator[int]:
        for m in range(LOOKS):
            result = step_stall_gate(
                histogram(bounds, base[m] * running),
                histogram(bounds, canary[m] * running),
                float(steps[m, 0]),
                float(steps[m, 1]),
                max_regression=STALL_TOLERANCE,
                min_count=GATES.min_latency_samples,
                last_look=m == LOOKS - 1,
            )
            yield {Verdict.PASS: PASS, Verdict.FAIL: FAIL}.get(result.verdict, NONE)

    return stop(looks())


def stall_figures(trials: int, rng: np.random.Generator) -> dict[str, str]:
    """stall_false_fail_r120_worst (steps 1.0x and 1.2x, under the 1.5x tolerance, failed) and
    stall_missed_r200_worst (steps 2x, not failed), each the worst over buckets and loads."""
    rows: list[tuple[float, Cell]] = []
    for buckets, bounds in BUCKETS.items():
        for load, (steps_per_window, running) in STALL_LOADS.items():
            base_shares = step_shares(bounds, 1.0)
            for slower in STALL_SLOWER:
                within = slower <= 1 + STALL_TOLERANCE  # a good canary (its "bad" is a roll-back)
                scenario = Scenario(f"stall x{slower:g} {load}", 1.0 if within else slower)
                cell = Cell("step", slower, steps_per_window, buckets, scenario)
                canary_shares = step_shares(bounds, slower)
                for _ in range(trials):
                    counts = [
                        np.cumsum(
                            np.cumsum(rng.multinomial(steps_per_window, shares, size=LOOKS), axis=0), axis=1
                        )
                        for shares in (base_shares, canary_shares)
                    ]
                    base, canary = (c.astype(np.float64) for c in counts)
                    steps = np.stack([base[:, -1], canary[:, -1]], axis=1)
                    cell.outcomes.append(stall_outcome(bounds, base, canary, steps, running))
                print(describe(cell), flush=True)
                rows.append((slower, cell))
    fails = [c for r, c in rows if r <= 1.2]
    missed = [c for r, c in rows if r >= 2.0]
    return {
        "stall_false_fail_r120_worst": worst(
            fails, lambda c: c.rate({FAIL}), lambda c: round(c.rate({FAIL}) * c.trials)
        ),
        "stall_missed_r200_worst": worst(
            missed, lambda c: 1 - c.rate({FAIL}), lambda c: round((1 - c.rate({FAIL})) * c.trials)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="trials per cell")
    parser.add_argument("--requests", type=int, nargs="+", default=REQUESTS_PER_WINDOW, help="cells to run")
    args = parser.parse_args()
    started = time.monotonic()
    rng = np.random.default_rng(58)
    print(
        f"per-token gate: tolerance {TOLERANCE:.0%}, minLatencySamples {GATES.min_latency_samples}; a look "
        f"every {WINDOW_SECONDS:g}s for {LOOKS * WINDOW_SECONDS / 60:g} min, Pass from "
        f"{ANALYSIS_LOOKS * WINDOW_SECONDS / 60:g} min; fine: the ladder specgate renders, "
        f"{LADDER.ratio - 1:.0%} apart ({len(BUCKETS['fine'])} edges {LADDER.lowest}-{LADDER.highest}), default: vLLM's "
        f"{len(VLLM_BUCKETS)} inter_token_latency edges"
    )
    print(header())
    cells: list[Cell] = []
    for scale in ("gpu", "cpu"):
        for sigma in SIGMAS:
            for requests in args.requests:
                for buckets in BUCKETS:
                    for scenario in SCENARIOS:
                        cell = Cell(scale, sigma, requests, buckets, scenario)
                        run_cell(cell, args.trials, rng)
                        print(describe(cell), flush=True)
                        cells.append(cell)
    print(
        f"step-stall gate: tolerance {STALL_TOLERANCE:.0%}, counted in engine steps; steps of a decode and a "
        f"prefill-chunk mode ({PREFILL_SHARE:.0%}), every canary step x 1.0 / 1.2 / 2.0; busy: "
        f"{STALL_LOADS['busy'][0]} steps a window of 8 running, light: {STALL_LOADS['light'][0]} of 1"
    )
    stall = stall_figures(args.trials, rng)
    print(f"run time {time.monotonic() - started:.0f} s")
    print(" ".join(f"{name}={value}" for name, value in {**figures(cells), **stall}.items()))


if __name__ == "__main__":
    main()
