"""Draft-length benchmark: the K specgate recommends against the best K measured on real engines, and
the K schedule per batch size built from that advice against the best single K.

For each calibrated noisy draft of the lab's tiny model (lab/calibration.json) and each
concurrency, real vLLM CPU engines serve the same load plainly and with `draft_model` at K = 1 .. k_max:
each of `concurrency` clients sends `requests` completions of `max_tokens` tokens (greedy,
ignore_eos). The engines of a draft serve at once and the loads go round them in ROUNDS rounds, so
that the host's slow minutes fall on all of them alike. Measured per engine over the rounds:
output tokens per second at its median round (wall clock), the mean step time from vLLM's own ITL
histogram, and the per-position acceptance counters.

The advice is what the operator computes (measurements.recommendation): the per-position counts of
the k_max canary, costed by the ratio of its mean step time to the baseline's (1st: the advice after
one rollout); then, as a user who follows it would see, after a second rollout at the advised K,
whose step cost status.stepCosts keeps beside the first (2nd: two draft lengths tell a step's fixed
extra from a draft pass's). The reference is the best measured throughput over K = 1 .. k_max;
nothing of the planner's cost model enters it. The default-cost advice (the GPU constants, no
measured step times) is scored beside them.

The schedule: the advised K (2nd) at each concurrency, as vLLM's num_speculative_tokens_per_batch_size
(each advised K up to its concurrency, the last carried beyond, as vLLM carries it), served by one
more engine (num_speculative_tokens k_max) under the same loads, side by side with a fresh engine
at the best single K of the first measurement. Its throughput over the whole concurrency mix (all
loads' tokens over all loads' seconds) is compared with that engine's over the same mix, and the
engine's own counters show the mean draft length it ran at each concurrency (draft tokens /
drafts), which is how one sees vLLM honour the schedule.

Last line: k_choice_speedup_ratio=<throughput at the advised K (1st) / best measured> (worst case), the
same after the second rollout and for the default costs, and k_schedule_speedup_vs_best_static=<mix throughput of the schedule /
of the best single K> (worst case over the drafts). --quick: one draft, K = 1 .. 2, fewer requests
(5 engines, at most 3 at once). The full run takes about 20 minutes on 2 cores and 13 GB of memory.

The line before it is the run's resolution: how a perfect advice, one that always names the K
measured best, would score on the same engines if their rounds had come out otherwise (the rounds
resampled, RESAMPLES times): k_choice_resolution_p5 / _p50 (its worst-case share of the best) and
k_choice_resolution_share_095 (how often it reaches 0.95). Where the perfect advice seldom reaches
0.95, a figure near it says nothing of the advice. --rescore FILE scores a run saved with --save
again (table, advice, resolution; no engines, no schedule).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

from prometheus_client.parser import text_string_to_metric_families

from specgate import measurements, vllm_metrics
from specgate.api import StepCost
from specgate.gates import AcceptanceWindow
from specgate.observation import TrackMetrics
from specgate.vllm_metrics import total
from specgate_lab.calibrate import concurrent_completions, real_engine


@dataclass(frozen=True)
class Sizes:
    k_max: int
    concurrency: tuple[int, ...]
    requests: int  # per client
    max_tokens: int
    noises: tuple[str, ...]  # calibrated drafts (lab/calibration.json)


# A load of 6 requests a client lasted about a second, within the noise of one: 24 last 3-5 s.
FULL = Sizes(4, (1, 4), 24, 64, ("0.01", "0.05"))  # alpha about 0.80 and 0.53
QUICK = Sizes(2, (1, 4), 6, 48, ("0.01",))
WARM_UP_REQUESTS = 2  # per client, untimed, before each timed load
# Engines measured one after another differed by 20 % in one configuration (811.6 against 677 tok/s,
# minutes apart), more than the draft lengths differ: every engine of a draft serves at once, and
# the loads go round them. Side by side, two engines of one configuration differ by 2-6 % in their
# median round (2026-11-28, 4 rounds).
ROUNDS = 4
RESAMPLES = 4000

Schedule = list[list[int]]  # vLLM's num_speculative_tokens_per_batch_size: [start, end, K]


@dataclass(frozen=True)
class Run:
    """One engine's loads at one concurrency, summed over the rounds; its time is each round's at
    the median round's (a load the host stalled took 0.55-0.65 of the others' speed, now and then,
    on any engine: a sum would carry it, the median does not)."""

    tokens: float
    round_seconds: tuple[float, ...]
    itl_seconds: float
    itl_count: float
    drafts: float
    draft_tokens: float
    accepted_per_position: tuple[float, ...]

    @property
    def seconds(self) -> float:
        return statistics.median(self.round_seconds) * len(self.round_seconds)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    @property
    def mean_step_ms(self) -> float:
        return 1000 * self.itl_seconds / max(self.itl_count, 1.0)

    @classmethod
    def saved(cls, figures: dict[str, Any]) -> Run:
        """The Run `--save` wrote (as dataclasses.asdict)."""
        run = cls(**figures)
        return replace(
            run,
            round_seconds=tuple(run.round_seconds),
            accepted_per_position=tuple(run.accepted_per_position),
        )

    def resampled(self, rng: random.Random) -> Run:
        """The same loads had the rounds come out otherwise: round times drawn with replacement."""
        return replace(self, round_seconds=tuple(rng.choices(self.round_seconds, k=len(self.round_seconds))))

    def __add__(self, other: Run) -> Run:
        positions = zip(self.accepted_per_position, other.accepted_per_position, strict=True)
        return Run(
            self.tokens + other.tokens,
            self.round_seconds + other.round_seconds,
            self.itl_seconds + other.itl_seconds,
            self.itl_count + other.itl_count,
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            tuple(a + b for a, b in positions),
        )


def serve_args(draft: str | None, k: int, schedule: Schedule | None = None) -> list[str]:
    args = ["specgate/tiny-llama", "--served-model-name", "tiny", "--max-model-len", "512"]
    if draft is None:
        return args
    config: dict[str, object] = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    if schedule is not None:
        config["num_speculative_tokens_per_batch_size"] = schedule
    return [*args, "--speculative-config", json.dumps(config)]


def schedule_from(advised: dict[int, int]) -> Schedule:
    """Each concurrency's advised K from just above the previous concurrency up to it (from 1), equal
    neighbours merged; vLLM carries the last K to larger batches."""
    ranges: Schedule = []
    start = 1
    for concurrency in sorted(advised):
        k = advised[concurrency]
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = concurrency
        else:
            ranges.append([start, concurrency, k])
        start = concurrency + 1
    return ranges


def mix_speed(runs: dict[int, Run]) -> float:
    """Tokens per second over the whole concurrency mix: every load's tokens over every load's time."""
    return sum(r.tokens for r in runs.values()) / sum(r.seconds for r in runs.values())


def scrape(url: str) -> dict[str, float]:
    """Sample name (with its position label, if any) -> value, summed over the other labels."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            position = sample.labels.get("position")
            samples[sample.name if position is None else f"{sample.name}:{position}"] += sample.value
    return samples


def load(url: str, concurrency: int, sizes: Sizes) -> Run:
    """`concurrency` clients' completions; the figures are the counters' increases over the load.
    The same load, shorter, runs first untimed: an engine compiles its kernels for each batch shape
    the first time it meets it, and a timed load that pays for that measures the compiler (seen: K=4
    faster than K=2 and K=3 on one engine's first loads)."""
    concurrent_completions(url, "tiny", concurrency, WARM_UP_REQUESTS, sizes.max_tokens)
    before = scrape(url)
    start = time.monotonic()
    concurrent_completions(url, "tiny", concurrency, sizes.requests, sizes.max_tokens)
    seconds = time.monotonic() - start
    after = scrape(url)

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    itl = vllm_metrics.INTER_TOKEN_LATENCY
    per_position = tuple(
        grew(f"{total(vllm_metrics.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS)}:{i}") for i in range(sizes.k_max)
    )
    return Run(
        tokens=concurrency * sizes.requests * sizes.max_tokens,
        round_seconds=(seconds,),
        itl_seconds=grew(f"{itl}_sum"),
        itl_count=grew(f"{itl}_count"),
        drafts=grew(total(vllm_metrics.SPEC_DECODE_NUM_DRAFTS)),
        draft_tokens=grew(total(vllm_metrics.SPEC_DECODE_NUM_DRAFT_TOKENS)),
        accepted_per_position=per_position,
    )


Engines = dict[str, str]  # name -> URL, all serving at once


def side_by_side(engines: Engines, sizes: Sizes) -> dict[str, dict[int, Run]]:
    """Each engine's loads at each concurrency, in ROUNDS rounds that take the engines in turn
    (each round starting one engine later), summed over the rounds: a host's slow minutes then fall
    on every engine alike instead of on whichever ran in them."""
    names = list(engines)
    totals: dict[str, dict[int, Run]] = {name: {} for name in names}
    for r in range(ROUNDS):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for c in sizes.concurrency:
                run = load(engines[name], c, sizes)
                totals[name][c] = totals[name][c] + run if c in totals[name] else run
    return totals


def start(stack: ExitStack, draft: str | None, k: int, logs: Path, schedule: Schedule | None = None) -> str:
    """An engine serving until `stack` closes; its URL."""
    name = f"{Path(draft or 'baseline').name}-{k}{'-schedule' if schedule else ''}.log"
    return stack.enter_context(real_engine(serve_args(draft, k, schedule), logs / name))


def advised_k(runs: dict[int, Run], baseline: Run, concurrency: int, k_max: int) -> tuple[int, int]:
    """The operator's advice (measurements.recommendation) after the k_max canary, and after a
    second rollout at the K it advised: that canary's step cost kept beside the first's, as
    status.stepCosts keeps them."""
    canary = runs[k_max]
    costs = measurements.with_cost([], CONFIG, _cost(canary, baseline, k_max, concurrency))
    first = _advice(_metrics(canary, k_max, concurrency), costs, k_max)
    if first == k_max:
        return first, first
    second = runs[first]
    costs = measurements.with_cost(costs, CONFIG, _cost(second, baseline, first, concurrency))
    return first, _advice(_metrics(second, first, concurrency), costs, k_max)


CONFIG = "bench"  # one target and draft per advice: any name, the same for both rollouts


def _metrics(run: Run, k: int, concurrency: int) -> TrackMetrics:
    return TrackMetrics(
        acceptance=(AcceptanceWindow(run.drafts, run.drafts * k, sum(run.accepted_per_position[:k])),),
        accepted_per_position=run.accepted_per_position[:k],
        mean_itl_ms=run.mean_step_ms,
        concurrency=float(concurrency),
    )


def _cost(run: Run, baseline: Run, k: int, concurrency: int) -> StepCost:
    return StepCost(
        k=k,
        step_ratio=run.mean_step_ms / baseline.mean_step_ms,
        concurrency=concurrency,
        acceptance_per_position=[a / run.drafts for a in run.accepted_per_position[:k]],
        config=CONFIG,
        measured_at="-",
    )


def _advice(metrics: TrackMetrics, costs: list[StepCost], k_max: int) -> int:
    """The advice among the K this run's engines served (positions past the canary's extended)."""
    advice = measurements.recommendation(metrics, costs, k_max=k_max)
    assert advice is not None
    return advice.num_speculative_tokens


Measured = dict[int, dict[int, Run]]  # K (0: plain) -> concurrency -> the engine's loads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one draft, K 1..2, fewer requests (~5 min)")
    parser.add_argument("--save", type=Path, help="write every engine's figures here (JSON) for a later look")
    parser.add_argument("--rescore", type=Path, help="score a run saved with --save again, without engines")
    args = parser.parse_args()
    worst = {"measured": 1.0, "second": 1.0, "default": 1.0, "schedule": float("inf")}
    if args.rescore:
        drafts = load_saved(args.rescore)
        k_max, concurrency = max(max(m) for m in drafts.values()), tuple(next(iter(drafts.values()))[0])
        print_header(k_max)
        for draft, measured in drafts.items():
            advise_each_concurrency(draft, measured, Sizes(k_max, concurrency, 0, 0, ()), worst)
        worst["schedule"] = math.nan  # a saved run holds the engines of each K, not the schedule's
    else:
        drafts = measure(QUICK if args.quick else FULL, args.save, worst)
    p5, p50, share = resolution(drafts, random.Random(16))
    print(
        f"k_choice_resolution_p5={p5:.3f} k_choice_resolution_p50={p50:.3f} k_choice_resolution_share_095={share:.2f}"
    )
    print(
        f"k_choice_speedup_ratio={worst['measured']:.3f} "
        f"k_choice_speedup_ratio_second_rollout={worst['second']:.3f} "
        f"k_choice_speedup_ratio_default_costs={worst['default']:.3f} "
        f"k_schedule_speedup_vs_best_static={worst['schedule']:.3f}"
    )


def print_header(k_max: int) -> None:
    print(f"{'draft':<34} {'conc':>4} {'plain':>7} " + " ".join(f"{'K=' + str(k):>7}" for k in range(1, k_max + 1))
          + f" {'1st_K':>5} {'2nd_K':>5} {'dflt_K':>6} {'best_K':>6} {'1st':>6} {'2nd':>6} {'dflt':>6}")  # fmt: skip


def measure(sizes: Sizes, save: Path | None, worst: dict[str, float]) -> dict[str, Measured]:
    """Each draft's engines side by side, its advice and its schedule against the best single K."""
    logs = Path(tempfile.mkdtemp(prefix="draft-length-"))
    print_header(sizes.k_max)
    drafts: dict[str, Measured] = {}
    for noise in sizes.noises:
        draft = f"specgate/tiny-llama-noise-{noise}"
        with ExitStack() as stack:  # the plain engine and K = 1 .. k_max, side by side
            engines = {str(k): start(stack, draft if k else None, k, logs) for k in range(sizes.k_max + 1)}
            measured = side_by_side(engines, sizes)
        drafts[draft] = {int(k): by_c for k, by_c in measured.items()}
        if save:
            save.write_text(json.dumps({d: {k: {c: asdict(r) for c, r in by_c.items()} for k, by_c in m.items()}
                                        for d, m in drafts.items()}, indent=1))  # fmt: skip
        advised = advise_each_concurrency(draft, drafts[draft], sizes, worst)
        ratio = schedule_against_best_static(draft, advised, drafts[draft], logs, sizes)
        worst["schedule"] = min(worst["schedule"], ratio)
    return drafts


def load_saved(path: Path) -> dict[str, Measured]:
    """A --save file's engines per draft, the plain one as K 0."""
    saved = json.loads(path.read_text())
    return {
        draft: {int(k): {int(c): Run.saved(r) for c, r in by_c.items()} for k, by_c in by_k.items()}
        for draft, by_k in saved.items()
    }


def resolution(drafts: dict[str, Measured], rng: random.Random) -> tuple[float, float, float]:
    """(p5, p50, share >= 0.95) over RESAMPLES of the rounds of the worst-case share of the best
    that naming, in every draft and concurrency, the K measured best would score."""
    cells = [
        {k: by_c[c] for k, by_c in measured.items() if k > 0}
        for measured in drafts.values()
        for c in next(iter(measured.values()))
    ]
    named = [max(runs, key=lambda k: runs[k].tokens_per_second) for runs in cells]
    worst = []
    for _ in range(RESAMPLES):
        shares = []
        for runs, k in zip(cells, named, strict=True):
            speed = {j: run.resampled(rng).tokens_per_second for j, run in runs.items()}
            shares.append(speed[k] / max(speed.values()))
        worst.append(min(shares))
    worst.sort()
    return worst[len(worst) // 20], worst[len(worst) // 2], sum(w >= 0.95 for w in worst) / len(worst)


def advise_each_concurrency(
    draft: str, measured: Measured, sizes: Sizes, worst: dict[str, float]
) -> dict[int, int]:
    """The advice at each concurrency against the best measured K, printed and folded into `worst`;
    the K advised after the second rollout, per concurrency."""
    baseline = measured[0]
    runs = {k: by_c for k, by_c in measured.items() if k > 0}
    advised: dict[int, int] = {}
    for c in sizes.concurrency:
        speed = {k: runs[k][c].tokens_per_second for k in runs}
        best = max(speed, key=lambda k: speed[k])
        at_c = {k: runs[k][c] for k in runs}
        first, second = advised_k(at_c, baseline[c], c, sizes.k_max)
        advised[c] = second
        default = _advice(_metrics(at_c[sizes.k_max], sizes.k_max, c), [], sizes.k_max)  # no step times
        ratios = {
            name: speed[k] / speed[best]
            for name, k in (("measured", first), ("second", second), ("default", default))
        }
        for name, ratio in ratios.items():
            worst[name] = min(worst[name], ratio)
        steps = " ".join(f"{speed[k]:7.1f}" for k in runs)
        print(f"{draft:<34} {c:>4} {baseline[c].tokens_per_second:7.1f} {steps} {first:>5} {second:>5} {default:>6} "
              f"{best:>6} {ratios['measured']:6.3f} {ratios['second']:6.3f} {ratios['default']:6.3f}", flush=True)  # fmt: skip
        print(f"  mean step ms: plain {baseline[c].mean_step_ms:.1f}, "
              + ", ".join(f"K={k} {runs[k][c].mean_step_ms:.1f}" for k in runs))  # fmt: skip
    return advised


def schedule_against_best_static(
    draft: str, advised: dict[int, int], measured: Measured, logs: Path, sizes: Sizes
) -> float:
    """The advised schedule's throughput over the concurrency mix over the best single K's (chosen
    on the first measurement), both served afresh side by side."""
    static = {k: mix_speed(by_c) for k, by_c in measured.items() if k > 0}
    best_static = max(static, key=lambda k: static[k])
    schedule = schedule_from(advised)
    with ExitStack() as stack:
        engines = {
            "schedule": start(stack, draft, sizes.k_max, logs, schedule),
            "static": start(stack, draft, best_static, logs),
        }
        pair = side_by_side(engines, sizes)
    ratio = mix_speed(pair["schedule"]) / mix_speed(pair["static"])
    mean_k = ", ".join(
        f"concurrency {c}: {r.draft_tokens / r.drafts:.2f}" if r.drafts else f"concurrency {c}: no drafts"
        for c, r in pair["schedule"].items()
    )
    print(f"  schedule {json.dumps(schedule)}: {mix_speed(pair['schedule']):.1f} tok/s over the mix against "
          f"K={best_static}'s {mix_speed(pair['static']):.1f} (best single K, side by side): {ratio:.3f}; "
          f"mean draft length run by vLLM, {mean_k}", flush=True)  # fmt: skip
    return ratio


if __name__ == "__main__":
    main()
