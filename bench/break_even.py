"""The acceptance gate's threshold judged on GPU physics: the fixed minAcceptanceRate (0.55) against
the break-even gate (minAcceptanceRatePolicy BreakEven), replayed on the measured step tables
(bench/gpu/*.jsonl, as bench/draft_length_gpu.py reads them), pure CPU, no engines.

The truth is the table: a canary at draft length K with vLLM acceptance alpha (accepted / draft
tokens) serving B running requests per pod emits 1 + K alpha tokens a step, at step(B, K) against a
plain step(B, 0): speedup (1 + K alpha) step(B, 0) / step(B, K). Every cell of a grid is one service:
each batch size of the table, K 1..5 and 7, alpha 0.10 to 0.95 in steps of 0.05.

Each policy's verdict on a cell is its threshold's, as if alpha were measured exactly (the
sequential test's own error is bench/decisions.py's): promote where alpha >= the gate. Fixed: the
default 0.55 everywhere. BreakEven: the gate the operator derives for that K at B (gates/breakeven.py
through measurements.priced, as rollout.py does): the spec's hardware as the physics, or the
canary's measured step ratio (the table's, times a lognormal noise of NOISE, DRAWS draws a cell)
where it lies off the physics, plus the default margin 0.05.

Scored per table over the grid's cells: wrong promotions (promoted, speedup below 1: the service got
slower), missed gains (rolled back, speedup 1.10 or more), and the mean speedup of what each policy
serves (a rolled-back cell serves the plain config, 1.0). The H100 8B table is what the cost model's
efficiencies were fitted to; the H200 70B FP8 table is the out-of-sample check.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from dataclasses import dataclass

from draft_length_gpu import TABLES, Steps, Table, spec_for
from specgate import gates, measurements, schedule
from specgate.api import StepCost

ALPHAS = [round(0.10 + 0.05 * i, 2) for i in range(18)]
NOISE = 0.03  # a mean step time over a window, as status.stepCosts keeps it
DRAWS = 5
FIXED = 0.55
SLOWER, PAYS = 1.0, 1.10


@dataclass
class Score:
    cells: int = 0
    wrong_promotions: int = 0
    missed_gains: int = 0
    served: float = 0.0  # the sum of the speedups the verdicts serve

    def add(self, promoted: bool, speedup: float) -> None:
        self.cells += 1
        self.wrong_promotions += promoted and speedup < SLOWER
        self.missed_gains += not promoted and speedup >= PAYS
        self.served += speedup if promoted else 1.0

    def line(self) -> str:
        return (
            f"{self.wrong_promotions / self.cells:8.3f} {self.missed_gains / self.cells:8.3f} "
            f"{self.served / self.cells:8.3f}"
        )


def gate(table: Table, steps: Steps, batch: int, k: int, rng: random.Random) -> float:
    """The break-even gate the operator derives after a canary at K measured its step at this batch."""
    spec = spec_for(table, steps)
    limits = spec.rollout.gates
    ratio = steps.step(batch, k) / steps.step(batch, 0) * math.exp(rng.gauss(0.0, NOISE))
    measured = StepCost(k=k, step_ratio=round(ratio, 4), concurrency=batch, acceptance_per_position=[],
                        config="replay", measured_at="-")  # fmt: skip
    cost, priced_by = measurements.priced([measured], schedule.cost_model(spec, schedule.hardware(spec)))
    assert cost is not None
    derived = gates.break_even_gate(
        cost, k, batch, limits.break_even_margin, limits.indifference, priced_by, "bench"
    )
    return derived.min_acceptance_rate


def score(table: Table, steps: Steps) -> tuple[Score, Score, list[float]]:
    fixed, break_even, gates_seen = Score(), Score(), []
    rng = random.Random(table.name)
    for batch in steps.batches:
        for k in steps.ks:
            if k == 6:  # not measured: the table interpolates it
                continue
            for _ in range(DRAWS):
                threshold = gate(table, steps, batch, k, rng)
                gates_seen.append(threshold)
                for alpha in ALPHAS:
                    speedup = (1 + k * alpha) * steps.step(batch, 0) / steps.step(batch, k)
                    fixed.add(alpha >= FIXED, speedup)
                    break_even.add(alpha >= threshold, speedup)
    return fixed, break_even, gates_seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    print(f"{'table':<30} {'policy':<10} {'wrong':>8} {'missed':>8} {'served':>8}  gates (min/median/max)")
    worst = {"Fixed": [0.0, 0.0], "BreakEven": [0.0, 0.0]}
    for table in TABLES:
        steps = Steps(table)
        fixed, break_even, seen = score(table, steps)
        spread = f"{min(seen):.2f}/{statistics.median(seen):.2f}/{max(seen):.2f}"
        for name, result in (("Fixed", fixed), ("BreakEven", break_even)):
            print(f"{table.name:<30} {name:<10} {result.line()}  {spread if name == 'BreakEven' else FIXED}")
            worst[name][0] = max(worst[name][0], result.wrong_promotions / result.cells)
            worst[name][1] = max(worst[name][1], result.missed_gains / result.cells)
    print(
        f"break_even_wrong_promotions_worst={worst['BreakEven'][0]:.3f} "
        f"fixed_wrong_promotions_worst={worst['Fixed'][0]:.3f} "
        f"break_even_missed_gains_worst={worst['BreakEven'][1]:.3f} "
        f"fixed_missed_gains_worst={worst['Fixed'][1]:.3f}"
    )


if __name__ == "__main__":
    main()
