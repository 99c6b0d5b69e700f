"""Draft-length benchmark: the K specgate recommends against the best K measured on real engines.

For each calibrated noisy draft of the lab's tiny model (lab/calibration.json) and each
concurrency, real vLLM CPU engines serve the same load plainly and with `draft_model` at K = 1 .. K_MAX:
CONCURRENCY[i] clients each send REQUESTS_PER_CLIENT completions of MAX_TOKENS tokens (greedy,
ignore_eos). Measured per engine: output tokens per second over the load (wall clock), the mean
step time from vLLM's own ITL histogram, and at K_MAX the per-position acceptance counters.

The advice is what the operator computes (measurements.recommendation): the per-position counts of
the K_MAX canary, costed by the ratio of its mean step time to the baseline's. The reference is the
best measured throughput over K = 1 .. K_MAX; nothing of the planner's cost model enters it. The
default-cost advice (the GPU constants, no measured step times) is scored beside it.
Last line: k_choice_speedup_ratio=<throughput at the advised K / best measured> (worst case) and
the same for the default costs.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

from prometheus_client.parser import text_string_to_metric_families

from specgate import vllm_metrics
from specgate.gates import AcceptanceWindow
from specgate.measurements import recommendation
from specgate.observation import TrackMetrics
from specgate.vllm_metrics import total
from specgate_lab.calibrate import PROMPTS, complete, real_engine

K_MAX = 4
CONCURRENCY = (1, 4)
REQUESTS_PER_CLIENT = 6
MAX_TOKENS = 64
NOISES = ("0.01", "0.05")  # calibrated alpha about 0.80 and 0.53 (lab/calibration.json)


@dataclass(frozen=True)
class Run:
    tokens_per_second: float
    mean_step_ms: float
    drafts: float
    accepted_per_position: tuple[float, ...]


def serve_args(draft: str | None, k: int) -> list[str]:
    args = ["specgate/tiny-llama", "--served-model-name", "tiny", "--max-model-len", "512"]
    if draft is None:
        return args
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    return [*args, "--speculative-config", json.dumps(config)]


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


def load(url: str, concurrency: int) -> Run:
    """CONCURRENCY clients' completions; the figures are the counters' increases over the load."""
    complete(url, "tiny", PROMPTS[0], max_tokens=8)  # warm the engine's first-request paths
    before = scrape(url)

    def client(index: int) -> None:
        for r in range(REQUESTS_PER_CLIENT):
            complete(url, "tiny", PROMPTS[(index + r) % len(PROMPTS)], max_tokens=MAX_TOKENS)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - start
    after = scrape(url)

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    itl = vllm_metrics.INTER_TOKEN_LATENCY
    per_position = tuple(
        grew(f"{total(vllm_metrics.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS)}:{i}") for i in range(K_MAX)
    )
    return Run(
        tokens_per_second=concurrency * REQUESTS_PER_CLIENT * MAX_TOKENS / seconds,
        mean_step_ms=1000 * grew(f"{itl}_sum") / max(grew(f"{itl}_count"), 1.0),
        drafts=grew(total(vllm_metrics.SPEC_DECODE_NUM_DRAFTS)),
        accepted_per_position=per_position,
    )


def measure(draft: str | None, k: int, logs: Path) -> dict[int, Run]:
    """One engine, each concurrency's load in turn."""
    with real_engine(serve_args(draft, k), logs / f"{Path(draft or 'baseline').name}-{k}.log") as url:
        return {c: load(url, c) for c in CONCURRENCY}


def advised_k(canary: Run, baseline: Run | None, concurrency: int) -> int:
    """The operator's recommendation from the K_MAX canary's figures (and the baseline's step time)."""
    metrics = TrackMetrics(
        acceptance=(
            AcceptanceWindow(canary.drafts, canary.drafts * K_MAX, sum(canary.accepted_per_position)),
        ),
        accepted_per_position=canary.accepted_per_position,
        mean_itl_ms=canary.mean_step_ms,
        concurrency=float(concurrency),
    )
    advice = recommendation(metrics, baseline.mean_step_ms if baseline else None, K_MAX)
    assert advice is not None
    return advice.num_speculative_tokens


def main() -> None:
    logs = Path(tempfile.mkdtemp(prefix="draft-length-"))
    baseline = measure(None, 0, logs)
    worst = {"measured": 1.0, "default": 1.0}
    print(f"{'draft':<34} {'conc':>4} {'plain':>7} " + " ".join(f"{'K=' + str(k):>7}" for k in range(1, K_MAX + 1))
          + f" {'ours_K':>6} {'dflt_K':>6} {'best_K':>6} {'ratio':>6} {'dflt':>6}")  # fmt: skip
    for noise in NOISES:
        draft = f"specgate/tiny-llama-noise-{noise}"
        runs = {k: measure(draft, k, logs) for k in range(1, K_MAX + 1)}
        for c in CONCURRENCY:
            speed = {k: runs[k][c].tokens_per_second for k in runs}
            best = max(speed, key=lambda k: speed[k])
            ours = advised_k(runs[K_MAX][c], baseline[c], c)
            default = advised_k(runs[K_MAX][c], None, c)
            ratio, default_ratio = speed[ours] / speed[best], speed[default] / speed[best]
            worst = {
                "measured": min(worst["measured"], ratio),
                "default": min(worst["default"], default_ratio),
            }
            steps = " ".join(f"{speed[k]:7.1f}" for k in runs)
            print(f"{draft:<34} {c:>4} {baseline[c].tokens_per_second:7.1f} {steps} {ours:>6} {default:>6} "
                  f"{best:>6} {ratio:6.3f} {default_ratio:6.3f}", flush=True)  # fmt: skip
            print(f"  mean step ms: plain {baseline[c].mean_step_ms:.1f}, "
                  + ", ".join(f"K={k} {runs[k][c].mean_step_ms:.1f}" for k in runs))  # fmt: skip
    print(
        f"k_choice_speedup_ratio={worst['measured']:.3f} k_choice_speedup_ratio_default_costs={worst['default']:.3f}"
    )


if __name__ == "__main__":
    main()
