"""The break-even acceptance gate (pure; rollout.gates.minAcceptanceRatePolicy BreakEven).

Speculation pays when the tokens a step emits, 1 + K alpha, outgrow what the step costs over a plain
one at the batch it serves. That break-even alpha is low where a step is memory-bound (an H100
verifying 3 drafts for one request costs little more than a plain step) and high where it is
compute-bound (large batches), so a fixed 0.55 rolls back drafts that pay at low load and promotes
ones that barely break even at high load. The gate here is the cost model's break-even alpha at the
service's concurrency and K, plus a margin for the model's own error; the acceptance test then
judges alpha against it like against minAcceptanceRate.
"""

from __future__ import annotations

from dataclasses import dataclass

from specgate import planning


@dataclass(frozen=True)
class BreakEvenGate:
    min_acceptance_rate: float
    source: str  # how it was derived, for status and messages


def break_even_gate(
    cost: planning.CostModel,
    k: int,
    concurrency: float,
    margin: float,
    indifference: float,
    priced_by: str,
    measured_where: str,
) -> BreakEvenGate:
    """The gate for draft length k at `concurrency` running requests per pod (rounded, at least 1):
    the break-even alpha plus `margin`, kept where the sequential test has room around it (its
    indifference zone on either side, within (0, 1)); where even alpha 1 loses, the highest such gate
    (such a draft cannot pay; the speedup gate says so where it runs)."""
    batch = max(round(concurrency), 1)
    lowest, highest = 2 * indifference, 1 - 2 * indifference
    alpha = planning.break_even_alpha_for(cost, k, batch)
    ratio = cost.step(batch, k) / cost.step(batch, 0)
    at = f"K={k} at {batch} running per pod ({measured_where}), a step {ratio:.2f}x a plain one ({priced_by})"
    if alpha is None:
        return BreakEvenGate(highest, f"even alpha 1 does not break even with {at}: gate {highest:.2f}")
    gate = min(max(alpha + margin, lowest), highest)
    bounded = "" if gate == alpha + margin else f", held within [{lowest:.2f}, {highest:.2f}]"
    return BreakEvenGate(
        round(gate, 4), f"break-even alpha {alpha:.3f} with {at} + margin {margin:g} = {gate:.3f}{bounded}"
    )
