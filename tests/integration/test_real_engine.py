"""The real vLLM CPU engine with tiny models: counters and alpha (engines come from conftest)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.engines import SPEC_FAMILIES, metric_families, real_engine, scrape, spec_args

from specgate.api import SpeculativeSpec
from specgate.render import speculative_config
from specgate.vllm_metrics import (
    INTER_TOKEN_LATENCY,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
    SPEC_DECODE_NUM_DRAFT_TOKENS,
    SPEC_DECODE_NUM_DRAFTS,
    total,
)
from specgate_lab.calibrate import (
    CALIBRATION,
    K,
    concurrent_completions,
    counter,
    cpu_model,
    draft_for_alpha,
    measured_alpha,
)

pytestmark = pytest.mark.engine


def test_self_draft_accepts_every_token(engines: dict[str, str]) -> None:
    url = engines["self"]
    drafts = counter(url, total(SPEC_DECODE_NUM_DRAFTS))
    assert drafts > 0
    draft_tokens = counter(url, total(SPEC_DECODE_NUM_DRAFT_TOKENS))
    assert counter(url, total(SPEC_DECODE_NUM_ACCEPTED_TOKENS)) == draft_tokens
    assert draft_tokens == 4 * drafts


def test_speculation_off_has_no_spec_counters(engines: dict[str, str]) -> None:
    families = metric_families(scrape(engines["off"]))
    assert INTER_TOKEN_LATENCY in families
    assert not SPEC_FAMILIES & set(families)


def test_a_noisy_drafts_counters_agree_with_each_other(tmp_path: Path) -> None:
    """What the operator reads from a real engine holds on any CPU: K draft tokens per draft, the
    per-position counts summing to the accepted tokens and falling along the draft (a draft is
    accepted as a prefix), and the noisy draft accepting some tokens but not all (between the
    self-draft's alpha 1 and a random head's 0). Its alpha itself is the CPU's (the calibration's
    tiny logit margins): printed beside the calibrated one, not asserted."""
    draft, calibrated = draft_for_alpha(0.6)
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": K}
    with real_engine(spec_args(config), tmp_path / "noise.log") as url:
        alpha = measured_alpha(url, "tiny")
        counts = {name: counter(url, total(name)) for name in COUNTERS}
        per_position = accepted_per_position(url)
    drafts, draft_tokens, accepted = (counts[name] for name in COUNTERS)
    calibration = json.loads(CALIBRATION.read_text())
    print(json.dumps({"draft": draft, "alpha": alpha, "cpu": cpu_model(), "calibrated": calibrated,
                      "calibrated_on": calibration["cpu"]}))  # fmt: skip
    assert drafts > 0 and draft_tokens == K * drafts, counts
    assert len(per_position) == K and sum(per_position) == accepted, (per_position, counts)
    assert per_position == sorted(per_position, reverse=True), per_position
    assert 0 < accepted < draft_tokens, counts


LONG_TOKENS = 240  # with the prompt, within the lab engines' --max-model-len 512
COUNTERS = (SPEC_DECODE_NUM_DRAFTS, SPEC_DECODE_NUM_DRAFT_TOKENS, SPEC_DECODE_NUM_ACCEPTED_TOKENS)


def accepted_per_position(url: str) -> list[float]:
    """The engine's accepted-token counter by draft position, position 0 first."""
    by_position: dict[int, float] = defaultdict(float)
    for family in text_string_to_metric_families(scrape(url)):
        for sample in family.samples:
            if sample.name == total(SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS):
                by_position[int(sample.labels["position"])] += sample.value  # summed over engines
    return [by_position[i] for i in sorted(by_position)]


def test_vllm_runs_the_rendered_k_schedule_at_each_batch_size(tmp_path: Path) -> None:
    """numSpeculativeTokensPerBatchSize as the operator renders it (render.speculative_config),
    served by the lab's vLLM CPU 0.32: vLLM's own counters show the draft length changing with the
    batch. The target drafts for itself, so every draft is accepted and each step's K shows whole:
    one request at a time runs at K = 1 (draft tokens / drafts exactly 1); four at once run mostly
    at K = 3 (above 2: only the steps where fewer than two are left in the batch run at K = 1). The
    four are long (LONG_TOKENS each, sent at once): at 48 tokens a request lasts a fraction of a
    second on the tiny model, and a loaded run's clients, starting a little apart, ran alone for
    half their steps (1.90)."""
    spec = SpeculativeSpec.model_validate(
        {
            "method": "draft_model",
            "draftModel": "specgate/tiny-llama",
            "numSpeculativeTokens": 3,
            "numSpeculativeTokensPerBatchSize": [
                {"minBatchSize": 1, "maxBatchSize": 1, "numSpeculativeTokens": 1},
                {"minBatchSize": 2, "maxBatchSize": 8, "numSpeculativeTokens": 3},
            ],
        }
    )
    config = speculative_config(spec)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 1], [2, 8, 3]]
    with real_engine(spec_args(config), tmp_path / "schedule.log") as url:
        alone = draft_length_over(url, concurrency=1)
        together = draft_length_over(url, concurrency=4, requests=1, max_tokens=LONG_TOKENS)
    assert alone == 1.0
    assert 2.0 < together <= 3.0, together


def draft_length_over(url: str, concurrency: int, requests: int = 2, max_tokens: int = 48) -> float:
    """Draft tokens per draft over `concurrency` clients' requests, `requests` each one after another."""
    before = [counter(url, total(name)) for name in (SPEC_DECODE_NUM_DRAFTS, SPEC_DECODE_NUM_DRAFT_TOKENS)]

    concurrent_completions(url, "tiny", concurrency, requests=requests, max_tokens=max_tokens)
    drafts, draft_tokens = (
        counter(url, total(name)) - b
        for name, b in zip((SPEC_DECODE_NUM_DRAFTS, SPEC_DECODE_NUM_DRAFT_TOKENS), before, strict=True)
    )
    return draft_tokens / drafts
