"""Draft-length advice judged on GPU physics: a replay of the measured step tables (bench/gpu/*.jsonl),
pure CPU, no engines.

The truth is the table: a step with B running requests at draft length K costs the target's measured
pass over K + 1 new tokens a request plus the EAGLE-3 head's passes (vLLM's proposer: the first over
every verified token, B (K + 1) tokens, read off the head's row at that token count, linearly between
measured rows and along the last two beyond them; then K - 1 passes of B tokens). Speedup at K: (1 +
u_0 + ... + u_{K-1}) x step(B, 0) / step(B, K), u_i = P(positions 0..i accepted). K runs over the
table's (1..5 and 7), batch sizes uniform over its rows.

Acceptance profiles: a constant conditional rate c per position (u_i = c^(i+1)), c in DECAYS.

The advice (measurements.recommendation, what status.recommendation shows) knows only what the
operator knows after one canary at the sample's K: that canary's per-position acceptance and its
step cost (the table's ratio to a plain step times a lognormal measurement noise of NOISE) at the
sample's batch size, and the cost model's defaults. Scored: its K's speedup by the table over the
best K's by the table (k_choice_gpu_replay_ratio). Printed per table and profile: worst, 5th
percentile and mean, and for "after" the share of samples at 0.95 or more. "before" is the advice as
main had it: limited to the K the canary ran, the measured cost always fitted, along the default
H100 8B physics; "after" as rollout.py now asks it: the acceptance extended at the last measured
conditional rate up to planning.ADVICE_K_MAX, the spec's hardware as the physics, and a measured
step within planning.PHYSICS_TOLERANCE of the physics' price read as the physics (one canary at one
K cannot tell which K a smaller difference belongs to).

The Auto schedule (schedule.derive: the cost model for the accelerator, target size and FP8 named
in the spec, no measurement) from the same acceptance, against the best single K over a batch-size
mix (each of the table's batch sizes serving the same number of tokens): k_schedule_gpu_replay_vs_best_static.

The H100 8B table is what the cost model's efficiencies were fitted to; the H200 70B FP8 table is
the out-of-sample check.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from specgate import api, measurements, planning, schedule
from specgate.api import StepCost
from specgate.gates import AcceptanceWindow
from specgate.observation import TrackMetrics

GPU = Path(__file__).resolve().parent / "gpu"
DECAYS = (0.6, 0.7, 0.8, 0.9, 0.95)
NOISE = 0.03  # a mean step time over a window, as status.stepCosts keeps it: a few percent
SAMPLES = 2000  # per table and profile
CONTEXT = 1024


@dataclass(frozen=True)
class Table:
    name: str
    path: Path
    target: str  # the model rows of the target
    head: str  # and of its EAGLE-3 head
    model: str  # a model name the operator reads the size and FP8 from
    gpu_product: str  # the nvidia.com/gpu.product label of its nodes


TABLES = (
    Table(
        "H100 8B",
        GPU / "h100-step-costs.jsonl",
        "target",
        "eagle3_head",
        "meta-llama/Llama-3.1-8B-Instruct",
        "NVIDIA-H100-80GB-HBM3",
    ),
    Table(
        "H200 70B FP8 (out of sample)",
        GPU / "h200-70b-fp8-step-costs.jsonl",
        "target_70b_fp8",
        "eagle3_head_70b",
        "meta-llama/Llama-3.3-70B-Instruct-FP8",
        "NVIDIA-H200",
    ),
)


class Steps:
    """The table's step times: step(B, K) in milliseconds. Monotone: a pass over more new tokens
    costs no less than one over fewer (isotonic in K at each batch size): at small batches the
    table's passes differ by less than its replays' jitter (70B FP8 at batch 2: 23.84 ms over 8 new
    tokens a request, 24.00 over 1), and a longer draft that reads as free there is noise."""

    def __init__(self, table: Table, monotone: bool = True) -> None:
        rows = [json.loads(line) for line in table.path.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if r.get("L") == CONTEXT]
        raw = {(r["B"], r["q"] - 1): r["ms"] for r in rows if r["model"] == table.target}
        self.head = sorted((r["B"] * r["q"], r["ms"]) for r in rows if r["model"] == table.head)
        self.batches = sorted({b for b, _ in raw})
        measured = sorted({k for _, k in raw})
        self.ks = list(range(1, max(measured) + 1))
        self.target = {}
        for b in self.batches:
            row = [raw[(b, k)] for k in measured]
            if monotone:
                row = isotonic(row)
            for k in range(max(measured) + 1):  # K not measured (6): between its neighbours
                lo = max(j for j in measured if j <= k)
                hi = min(j for j in measured if j >= k)
                at = {j: ms for j, ms in zip(measured, row, strict=True)}
                self.target[(b, k)] = (
                    at[lo] if lo == hi else at[lo] + (at[hi] - at[lo]) * (k - lo) / (hi - lo)
                )

    def step(self, batch: int, k: int) -> float:
        if k == 0:
            return self.target[(batch, 0)]
        return self.target[(batch, k)] + self.head_ms(batch * (k + 1)) + (k - 1) * self.head_ms(batch)

    def head_ms(self, tokens: int) -> float:
        pts = self.head
        (t0, m0), (t1, m1) = next(
            ((a, b) for a, b in itertools.pairwise(pts) if tokens <= b[0]), (pts[-2], pts[-1])
        )
        return m0 + (m1 - m0) * (tokens - t0) / (t1 - t0)

    def speedup(self, batch: int, k: int, prefix: Sequence[float]) -> float:
        return (1 + sum(prefix[:k])) * self.step(batch, 0) / self.step(batch, k)

    def best(self, batch: int, prefix: Sequence[float]) -> int:
        return max(self.ks, key=lambda k: self.speedup(batch, k, prefix))


def isotonic(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence in squared error (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def profile(decay: float, k: int) -> list[float]:
    return planning.prefix_from_conditional([decay] * k)


Advice = Callable[[TrackMetrics, list[StepCost], planning.CostModel], int]


def advice_before(metrics: TrackMetrics, costs: list[StepCost], base: planning.CostModel) -> int:
    """The advice as main had it (ced9672): limited to the K the canary ran, its measured cost always
    fitted, along the default (H100 8B) physics whatever the hardware."""
    steps = [planning.MeasuredStep(c.k, c.step_ratio, c.concurrency) for c in costs]
    prefix = costs[0].acceptance_per_position
    advised = planning.recommend_k(prefix, 1.0, planning.CostModel.measured(steps), costs[0].concurrency)
    assert advised is not None
    return advised.k


def advice_after(metrics: TrackMetrics, costs: list[StepCost], base: planning.CostModel) -> int:
    """The advice as rollout.py now asks it: the spec's hardware as the base, positions extended, a
    measured step within planning.PHYSICS_TOLERANCE of the physics read as the physics."""
    advised = measurements.recommendation(metrics, costs, base)
    assert advised is not None
    return advised.num_speculative_tokens


def canary(
    steps: Steps, batch: int, k: int, decay: float, rng: random.Random
) -> tuple[TrackMetrics, StepCost]:
    """What one canary at draft length k and this batch size leaves in status."""
    prefix = profile(decay, k)
    drafts = 10_000.0
    metrics = TrackMetrics(
        acceptance=(AcceptanceWindow(drafts, drafts * k, drafts * sum(prefix)),),
        accepted_per_position=tuple(drafts * u for u in prefix),
        concurrency=float(batch),
    )
    ratio = steps.step(batch, k) / steps.step(batch, 0) * math.exp(rng.gauss(0.0, NOISE))
    cost = StepCost(k=k, step_ratio=round(ratio, 4), concurrency=batch, acceptance_per_position=prefix,
                    config="replay", measured_at="-")  # fmt: skip
    return metrics, cost


def k_choice(table: Table, steps: Steps, decay: float, advice: Advice, rng: random.Random) -> list[float]:
    """Advised speedup over the best, by the table, for SAMPLES (batch, canary K, noise) draws."""
    spec = spec_for(table, steps)
    base = schedule.cost_model(spec, schedule.hardware(spec))
    ratios = []
    truth = profile(decay, max(steps.ks))
    for _ in range(SAMPLES):
        batch, k = rng.choice(steps.batches), rng.choice(steps.ks)
        metrics, cost = canary(steps, batch, k, decay, rng)
        advised = min(advice(metrics, [cost], base), max(steps.ks))
        ratios.append(
            steps.speedup(batch, advised, truth) / steps.speedup(batch, steps.best(batch, truth), truth)
        )
    return ratios


def spec_for(table: Table, steps: Steps) -> api.SpeculativeDeploymentSpec:
    """A spec on this table's GPU and model: what the operator reads the cost model's defaults from."""
    return api.parse_spec({
        "model": {"name": table.model}, "image": "vllm", "nodeSelector": {schedule.GPU_PRODUCT_LABEL: table.gpu_product},
        "speculative": {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": max(steps.ks),
                        "numSpeculativeTokensPerBatchSizePolicy": "Auto"},
        "vllmArgs": ["--max-num-seqs", str(max(steps.batches))],
    })  # fmt: skip


def auto_schedule(table: Table, steps: Steps, decay: float) -> tuple[list[list[int]], dict[int, int]]:
    """schedule.derive's ranges for a spec on this table's GPU and model, from a canary at the
    table's longest K that measured this profile; and its K at each batch size of the table."""
    spec = spec_for(table, steps)
    hw = schedule.hardware(spec)
    ranges = planning.k_schedule(schedule.cost_model(spec, hw), profile(decay, max(steps.ks)), hw.max_batch)
    at = {b: next(k for lo, hi, k in ranges if lo <= b <= hi) for b in steps.batches}
    return [list(r) for r in ranges], at


def mix_seconds(steps: Steps, ks: dict[int, int], prefix: Sequence[float]) -> float:
    """Time to serve one token's worth at each batch size (the same tokens at each), in plain-step units."""
    return sum(steps.step(b, ks[b]) / (b * (1 + sum(prefix[: ks[b]]))) for b in steps.batches)


def schedule_vs_static(table: Table, steps: Steps, decay: float) -> tuple[float, list[list[int]], int]:
    truth = profile(decay, max(steps.ks))
    ranges, at = auto_schedule(table, steps, decay)
    static = {k: mix_seconds(steps, dict.fromkeys(steps.batches, k), truth) for k in steps.ks}
    best_static = min(static, key=lambda k: static[k])
    return static[best_static] / mix_seconds(steps, at, truth), ranges, best_static


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=SAMPLES)
    args = parser.parse_args()
    globals()["SAMPLES"] = args.samples
    worst = {"before": math.inf, "after": math.inf, "schedule": math.inf}
    print(f"{'table':<30} {'decay':>5} {'before_worst':>12} {'before_p5':>9} {'before_mean':>11} "
          f"{'after_worst':>12} {'after_p5':>9} {'after_mean':>11} {'after_095':>10} {'sched/static':>12}  schedule (best static K)")  # fmt: skip
    for table in TABLES:
        steps = Steps(table)
        for decay in DECAYS:
            cells = []
            for name, advice in (("before", advice_before), ("after", advice_after)):
                ratios = sorted(k_choice(table, steps, decay, advice, random.Random(f"{table.name} {decay}")))
                worst[name] = min(worst[name], ratios[0])
                cells.append(
                    f"{ratios[0]:12.3f} {ratios[len(ratios) // 20]:9.3f} {statistics.fmean(ratios):11.3f}"
                )
            cells.append(f"{sum(r >= 0.95 for r in ratios) / len(ratios):10.3f}")
            ratio, ranges, best_static = schedule_vs_static(table, steps, decay)
            worst["schedule"] = min(worst["schedule"], ratio)
            print(
                f"{table.name:<30} {decay:5.2f} {' '.join(cells)} {ratio:12.3f}  {json.dumps(ranges)} (K={best_static})"
            )
    print(f"k_choice_gpu_replay_ratio_worst_before={worst['before']:.3f} "
          f"k_choice_gpu_replay_ratio_worst={worst['after']:.3f} "
          f"k_schedule_gpu_replay_vs_best_static={worst['schedule']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
