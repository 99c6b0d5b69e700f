"""The draft-length benchmark's pure parts (bench/draft_length.py): the schedule it builds from the
advice per concurrency, which vLLM must accept, and the mix throughput it scores."""

from __future__ import annotations

import json
import random
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from draft_length import Run, mix_speed, resolution, schedule_from, serve_args
from specgate import api


def run(tokens: float, seconds: float) -> Run:
    return Run(tokens, (seconds,), 0.0, 0.0, 0.0, 0.0, ())


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


def test_rounds_add_up_counters_and_time_each_round_at_the_median_rounds() -> None:
    """Three rounds of one engine's load, the second stalled by the host: tokens and counters add,
    the time is three rounds at the median round's 2 s (not the 10 s they took); the step time is
    the ITL histogram's sum over its count across all (2.5 s / 175 = 14.3 ms), not a mean of means."""
    first = Run(640, (2.0,), 0.01 * 100, 100, 10, 30, (8.0, 6.0, 4.0))
    stalled = Run(640, (6.0,), 0.04 * 25, 25, 5, 15, (4.0, 2.0, 1.0))
    third = Run(640, (1.5,), 0.01 * 50, 50, 5, 15, (4.0, 3.0, 1.0))
    rounds = first + stalled + third
    assert (rounds.tokens, rounds.drafts, rounds.draft_tokens) == (1920, 20, 60)
    assert rounds.accepted_per_position == (16.0, 11.0, 6.0)
    assert rounds.seconds == 6.0 and rounds.tokens_per_second == 320
    assert rounds.mean_step_ms == pytest.approx(1000 * 2.5 / 175)


def test_the_resolution_is_how_often_naming_the_measured_best_k_would_reach_095() -> None:
    """K=1 ran its four rounds in 1, 1, 1 and 3 s (median 1: measured best), K=2 in 1.1 s each.
    Resampled, K=1's median stays 1 unless two or more of its four rounds are the 3 s one (median 2
    or 3: a share of 0.55 or 0.37), which happens with probability 1 - 0.75^4 - 4 * 0.25 * 0.75^3
    = 0.262; so naming K=1 reaches 0.95 in 0.738 of the resamples, and in the median one."""
    rounds = {1: (1.0, 1.0, 1.0, 3.0), 2: (1.1,) * 4}
    measured = {k: {1: Run(100.0, r, 0.0, 0.0, 0.0, 0.0, ())} for k, r in rounds.items()}
    measured[0] = {1: run(100.0, 4.0)}
    p5, p50, share = resolution({"d": measured}, random.Random(1))
    assert share == pytest.approx(0.738, abs=0.03)
    assert p50 == 1.0 and p5 < 0.6


def test_a_saved_run_reads_back_as_it_was_measured() -> None:
    measured = Run(640.0, (2.0, 1.5), 1.0, 100.0, 10.0, 30.0, (8.0, 6.0, 4.0))
    assert Run.saved(json.loads(json.dumps(asdict(measured)))) == measured


def test_the_gpu_replay_reads_steps_as_monotone_in_k_and_interpolates_k_6() -> None:
    """bench/draft_length_gpu.py: pool adjacent violators by hand ([1, 3, 2, 4] -> 3 and 2 pooled
    to 2.5); the 70B FP8 table at batch 2 read 23.84 ms over 8 new tokens and 24.00 over 1, and
    the monotone reading never lets a longer draft cost less."""
    from draft_length_gpu import TABLES, Steps, isotonic

    assert isotonic([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    steps = Steps(TABLES[1])
    row = [steps.target[(2, k)] for k in range(8)]
    assert row == sorted(row)
    raw = Steps(TABLES[1], monotone=False)
    assert raw.target[(2, 7)] == 23.8448 and raw.target[(2, 0)] == 23.9992
    h100 = Steps(TABLES[0], monotone=False)  # K=6 halfway between q=6 (K=5) and q=8 (K=7)
    assert h100.target[(1, 6)] == pytest.approx((7.9672 + 8.0687) / 2)
