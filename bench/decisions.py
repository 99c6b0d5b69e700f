"""Decision benchmark: specgate's sequential acceptance gate vs an Argo-style fixed-window rule.

Both rules see the same simulated canaries: draft outcomes with a known long-run alpha, produced
by requests whose own acceptance level varies around it (prompts differ) and whose drafts accept
as a prefix (tokens within a draft are correlated). Draft traffic: DRAFTS_PER_SECOND across the
canary. The gate is alpha >= 0.55 for both.

- specgate: gates.acceptance_gate over all 15-s windows so far, looked at every window (as the
  operator does at each reconcile): an SPRT of alpha >= 0.60 against alpha <= 0.50 (indifference
  0.05) with the window spread estimated conservatively, error rate 0.05, minimum 200 drafts and
  3 windows; undecided after 30 min.
- fixed window (Argo Rollouts AnalysisTemplate style): one measurement per minute (alpha of that
  minute) against the same threshold, count 5, failureLimit 1: fails at the 2nd failed
  measurement, passes after 5 measurements with at most 1 failure.

A verdict is wrong when it is on the wrong side of the gate; the summary counts only alphas at least
0.05 (the indifference) from it, where a rule is expected to be right.

Printed: per alpha, median time to verdict and wrong-verdict rates of both; our mean windows against
Wald's expected sample size for an SPRT of the gate against the true alpha with the window spread
known (sprt_win: a floor that no rule estimating the spread from the windows reaches, least of all
within the first few windows); last line the summary the issue asks for.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from specgate.gates import AcceptanceWindow, Verdict, acceptance_gate
from specgate.sim.streams import draft_windows

GATE = 0.55
K = 4
WINDOW_SECONDS = 15
DRAFTS_PER_SECOND = 20
REQUEST_DRAFTS = 60  # drafts per request: one acceptance level for all of them
MAX_SECONDS = 1800
ALPHAS = (0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70)
STREAMS = 150


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict | None  # None: undecided
    seconds: float


def window_stream(alpha: float, rng: random.Random) -> list[AcceptanceWindow]:
    """MAX_SECONDS of 15-s windows of draft outcomes around a long-run alpha."""
    per_window = DRAFTS_PER_SECOND * WINDOW_SECONDS
    count = MAX_SECONDS // WINDOW_SECONDS
    return draft_windows(
        alpha, count, rng, k=K, drafts_per_window=(per_window, per_window), request_drafts=REQUEST_DRAFTS
    )


def ours(windows: list[AcceptanceWindow]) -> Outcome:
    for m in range(1, len(windows) + 1):
        result = acceptance_gate(windows[:m], GATE)
        if result.verdict in (Verdict.PASS, Verdict.FAIL):
            return Outcome(result.verdict, m * WINDOW_SECONDS)
    return Outcome(None, MAX_SECONDS)


def fixed_window(windows: list[AcceptanceWindow], count: int = 5, failure_limit: int = 1) -> Outcome:
    per_minute = 60 // WINDOW_SECONDS
    failures = 0
    for i in range(count):
        minute = windows[i * per_minute : (i + 1) * per_minute]
        alpha = sum(w.accepted_tokens for w in minute) / sum(w.draft_tokens for w in minute)
        failures += alpha < GATE
        if failures > failure_limit:
            return Outcome(Verdict.FAIL, (i + 1) * 60)
    return Outcome(Verdict.PASS, count * 60)


def wrong(outcome: Outcome, alpha: float) -> bool:
    return outcome.verdict == (Verdict.PASS if alpha < GATE else Verdict.FAIL)


def long_run_alpha(alpha: float) -> float:
    windows = window_stream(alpha, random.Random(99))
    return sum(w.accepted_tokens for w in windows) / sum(w.draft_tokens for w in windows)


def wald_windows(truth: float, window_sd: float, window_tokens: float, error: float = 0.05) -> float:
    """Wald's approximate expected sample size (windows) of an SPRT of gate vs truth, Gaussian windows."""
    delta = abs(truth - GATE) * window_tokens
    kl = delta**2 / (2 * window_sd**2)
    a = math.log((1 - error) / error)
    return ((1 - error) * a - error * a) / kl


def main() -> None:
    speedups: list[float] = []
    wrong_ours = wrong_fixed = eligible = 0
    print(
        f"{'alpha':>6} {'ours_s':>7} {'fixed_s':>7} {'ours_wrong':>10} {'fixed_wrong':>11} {'undecided':>9} {'ours_win':>8} {'sprt_win':>8}"
    )
    for alpha in ALPHAS:
        rng = random.Random(int(alpha * 1000))
        truth = long_run_alpha(alpha)
        results = []
        spread: list[float] = []
        for _ in range(STREAMS):
            windows = window_stream(alpha, rng)
            results.append((ours(windows), fixed_window(windows)))
            spread += [w.accepted_tokens - truth * w.draft_tokens for w in windows[:20]]
        decided = [(o, f) for o, f in results if o.verdict is not None]
        speedups += [f.seconds / o.seconds for o, f in decided]
        counts = abs(truth - GATE) >= 0.05
        ow = sum(wrong(o, truth) for o, _ in results)
        fw = sum(wrong(f, truth) for _, f in results)
        if counts:
            eligible += len(results)
            wrong_ours += ow
            wrong_fixed += fw
        tokens = DRAFTS_PER_SECOND * WINDOW_SECONDS * K
        sprt = (
            wald_windows(truth, statistics.pstdev(spread), tokens) if abs(truth - GATE) > 0.01 else math.inf
        )
        our_windows = (
            statistics.fmean(o.seconds / WINDOW_SECONDS for o, _ in decided) if decided else math.nan
        )
        print(
            f"{truth:6.3f} {statistics.median(o.seconds for o, _ in results):7.0f} "
            f"{statistics.median(f.seconds for _, f in results):7.0f} {ow / STREAMS:10.3f} {fw / STREAMS:11.3f} "
            f"{1 - len(decided) / STREAMS:9.3f} {our_windows:8.1f} {sprt:8.1f}"
        )
    print(
        f"decision_speedup_vs_fixed_window={statistics.median(speedups):.2f} "
        f"wrong_verdict_rate={wrong_ours / eligible:.4f} fixed_window_wrong_rate={wrong_fixed / eligible:.4f}"
    )


if __name__ == "__main__":
    main()
