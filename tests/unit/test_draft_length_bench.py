"""The draft-length benchmark's pure parts (bench/draft_length.py): the schedule it builds from the
advice per concurrency, which vLLM must accept, and the mix throughput it scores."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from draft_length import Run, mix_speed, schedule_from, serve_args
from specgate import api


def run(tokens: float, seconds: float) -> Run:
    return Run(tokens, seconds, 0.0, 0.0, 0.0, ())


def test_the_schedule_gives_each_concurrency_its_advised_k() -> None:
    assert schedule_from({4: 2, 1: 4}) == [[1, 1, 4], [2, 4, 2]]
    assert schedule_from({1: 3, 4: 3, 16: 1}) == [[1, 4, 3], [5, 16, 1]]


def test_the_schedule_passes_the_checks_vllm_makes() -> None:
    """The operator's rules are vLLM 0.32's (validate_and_normalize_dynamic_sd_schedule)."""
    args = serve_args("d", 4, schedule_from({1: 4, 4: 2, 32: 1}))
    config = json.loads(args[-1])
    ranges = [dict(zip(("minBatchSize", "maxBatchSize", "numSpeculativeTokens"), r, strict=True))
              for r in config["num_speculative_tokens_per_batch_size"]]  # fmt: skip
    speculative = {"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 4}
    speculative["numSpeculativeTokensPerBatchSize"] = ranges
    api.parse_spec({"model": {"name": "m"}, "image": "vllm", "speculative": speculative})


def test_the_mix_is_all_tokens_over_all_seconds_not_a_mean_of_rates() -> None:
    # 100 tok in 1 s and 100 tok in 9 s: 20 tok/s over the mix (the mean of rates would say 55.6)
    assert mix_speed({1: run(100, 1), 4: run(100, 9)}) == 20
