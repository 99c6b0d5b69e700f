"""Draft-length benchmark: the K specgate recommends vs the best K found by trying every K.

For each workload profile of the simulator (chat, code, translation) and concurrency, one canary
run at K_MAX gives per-position acceptance counts; planning.recommend_k picks K from them. Then the
simulator's own model (acceptance sampling and step cost, as its server runs them) measures the
decode throughput of every K from 1 to K_MAX; the best of those is the reference.
Last line: k_choice_speedup_ratio=<throughput at our K / best throughput> (worst case over cases).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

from specgate.planning import CostModel, recommend_k
from specgate_lab.sim.model import (
    Knobs,
    Speculation,
    conditional_rates,
    sample_accepted,
    step_seconds,
)

K_MAX = 8
STEPS = 4000
CONCURRENCY = (1, 8, 32)
PROFILES = ("chat", "code", "translation")
METHOD = "eagle3"


def run(profile: str, k: int, batch: int, seed: int) -> tuple[float, list[int], int]:
    """(tokens per second, accepted count per position, drafts) of a simulated steady batch."""
    knobs = Knobs(profile=profile)
    spec = Speculation(METHOD, k)
    rates = conditional_rates(knobs, spec)
    rng = random.Random(seed)
    per_position = [0] * k
    tokens = 0
    for _ in range(STEPS):
        for _ in range(batch):
            accepted = sample_accepted(rates, rng)
            tokens += 1 + accepted
            for i in range(accepted):
                per_position[i] += 1
    seconds = STEPS * step_seconds(knobs, spec, batch, 0)
    return tokens / seconds, per_position, STEPS * batch


def main() -> None:
    worst = 1.0
    print(
        f"{'profile':<12} {'conc':>4} {'ours_K':>6} {'best_K':>6} {'ours_tok/s':>10} {'best_tok/s':>10} {'ratio':>6}"
    )
    for profile in PROFILES:
        for batch in CONCURRENCY:
            _, counts, drafts = run(profile, K_MAX, batch, seed=1)
            knobs = Knobs(profile=profile)
            cost = CostModel(knobs.step_ms, knobs.token_ms, 0.6)  # the operator's default draft cost
            advice = recommend_k(counts, drafts, cost, concurrency=batch)
            assert advice is not None
            measured = {k: run(profile, k, batch, seed=2)[0] for k in range(1, K_MAX + 1)}
            best_k = max(measured, key=lambda k: measured[k])
            ratio = measured[advice.k] / measured[best_k]
            worst = min(worst, ratio)
            print(
                f"{profile:<12} {batch:>4} {advice.k:>6} {best_k:>6} {measured[advice.k]:>10.0f} "
                f"{measured[best_k]:>10.0f} {ratio:>6.3f}"
            )
    print(f"k_choice_speedup_ratio={worst:.3f}")


if __name__ == "__main__":
    main()
