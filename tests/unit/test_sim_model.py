"""The simulator's behaviour model: acceptance converges to the profile's, cost grows with B and K."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import pytest

import specgate_lab.sim.__main__ as sim_module
from specgate.planning import expected_accepted
from specgate.vllm_metrics import (
    INTER_TOKEN_LATENCY,
    ITERATION_TOKENS,
    REQUEST_TIME_PER_OUTPUT_TOKEN,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    SPEC_DECODE_NUM_DRAFT_TOKENS,
    total,
)
from specgate_lab.sim.metrics import EngineMetrics
from specgate_lab.sim.model import (
    PROFILES,
    Knobs,
    Speculation,
    conditional_rates,
    knobs_at,
    parse_script,
    sample_accepted,
    step_seconds,
)
from specgate_lab.sim.server import Request, SimEngine

sim_main = sim_module.main

EAGLE3_K4 = Speculation(method="eagle3", k=4)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_sampled_alpha_converges_to_the_profile(profile: str) -> None:
    rates = conditional_rates(Knobs(profile=profile), EAGLE3_K4)
    rng = random.Random(7)
    drafts = 20_000
    accepted = sum(sample_accepted(rates, rng) for _ in range(drafts))
    expected = expected_accepted(rates) / EAGLE3_K4.k
    assert accepted / (drafts * EAGLE3_K4.k) == pytest.approx(expected, abs=0.01)


def test_alpha_override_is_what_the_counters_show() -> None:
    rates = conditional_rates(Knobs(alpha=0.45), EAGLE3_K4)
    rng = random.Random(1)
    accepted = sum(sample_accepted(rates, rng) for _ in range(20_000))
    assert accepted / (20_000 * 4) == pytest.approx(0.45, abs=0.01)


def test_acceptance_falls_along_the_draft() -> None:
    rates = conditional_rates(Knobs(profile="chat"), EAGLE3_K4)
    assert rates == sorted(rates, reverse=True)


def test_ngram_accepts_less_than_eagle3_on_chat() -> None:
    ngram = conditional_rates(Knobs(profile="chat"), Speculation("ngram", 4))
    assert expected_accepted(ngram) < expected_accepted(conditional_rates(Knobs(profile="chat"), EAGLE3_K4))


def test_step_cost_grows_with_batch_and_k() -> None:
    knobs = Knobs()
    by_batch = [step_seconds(knobs, EAGLE3_K4, b, 0) for b in (1, 8, 32, 64)]
    assert by_batch == sorted(by_batch) and by_batch[0] < by_batch[-1]
    by_k = [step_seconds(knobs, Speculation("eagle3", k), 16, 0) for k in (1, 2, 4, 8)]
    assert by_k == sorted(by_k) and by_k[0] < by_k[-1]
    assert step_seconds(knobs, None, 16, 0) < by_k[0]


def _tokens_per_second(knobs: Knobs, spec: Speculation | None, batch: int) -> float:
    per_step = 1 + (expected_accepted(conditional_rates(knobs, spec)) if spec else 0)
    return batch * per_step / step_seconds(knobs, spec, batch, 0)


def test_speculation_helps_at_low_concurrency_and_hurts_at_high() -> None:
    knobs = Knobs(profile="chat")
    spec = Speculation("draft_model", 4)
    assert _tokens_per_second(knobs, spec, 1) > _tokens_per_second(knobs, None, 1)
    assert _tokens_per_second(knobs, spec, 256) < _tokens_per_second(knobs, None, 256)


def no_file(_: str) -> bool:
    return False


def test_script_changes_knobs_over_time() -> None:
    script = parse_script("0s:alpha=0.8;120s:alpha=0.3,step_ms=20")
    base = Knobs()
    assert knobs_at(base, script, 5, no_file).alpha == 0.8
    late = knobs_at(base, script, 121, no_file)
    assert (late.alpha, late.step_ms) == (0.3, 20)


@pytest.mark.parametrize(
    "text",
    ["0s:alpha=0.85;if:{flag}:alpha=0.15", "if:{flag}:alpha=0.15;0s:alpha=0.85"],
    ids=["after", "before"],
)
def test_a_file_step_applies_while_its_file_exists_over_the_time_script(text: str, tmp_path: Path) -> None:
    """Wherever it is written, a file step overrides the time script from the moment the file exists
    (the guard's drift test drifts the engines once it has seen the promotion, on any machine)."""
    flag = tmp_path / "a:colon" / "drift"  # a path may hold a colon
    script = parse_script(text.format(flag=flag))
    assert knobs_at(Knobs(), script, 3600, os.path.exists).alpha == 0.85
    flag.parent.mkdir()
    flag.touch()
    assert knobs_at(Knobs(), script, 0, os.path.exists).alpha == 0.15
    assert knobs_at(Knobs(), script, 3600, os.path.exists).alpha == 0.15


def test_a_running_engine_drifts_once_the_file_exists(tmp_path: Path) -> None:
    """The server looks for the file at every step: one request before, one after it appears."""
    flag = tmp_path / "drift"
    engine = SimEngine(
        served_name="tiny",
        knobs=Knobs(step_ms=0.1, token_ms=0.01),
        spec=EAGLE3_K4,
        script=parse_script(f"0s:alpha=0.9;if:{flag}:alpha=0.1"),
        metrics=EngineMetrics.create(speculative=True),
    )

    def counted() -> tuple[float, float]:
        registry, labels = engine.metrics.registry, engine.labels
        names = (total(SPEC_DECODE_NUM_ACCEPTED_TOKENS), total(SPEC_DECODE_NUM_DRAFT_TOKENS))
        accepted, drafted = (registry.get_sample_value(name, labels) or 0.0 for name in names)
        return accepted, drafted

    async def alpha_of_one_request() -> float:
        (accepted0, drafted0), request = counted(), Request(1, 2000, time.monotonic())
        engine.submit(request)
        while await request.queue.get() is not None:
            pass
        accepted1, drafted1 = counted()
        return (accepted1 - accepted0) / (drafted1 - drafted0)

    async def before_and_after() -> tuple[float, float]:
        loop = asyncio.create_task(engine.loop())
        before = await alpha_of_one_request()
        flag.touch()
        after = await alpha_of_one_request()
        loop.cancel()
        return before, after

    before, after = asyncio.run(before_and_after())
    assert before == pytest.approx(0.9, abs=0.05) and after == pytest.approx(0.1, abs=0.05)


@pytest.mark.parametrize("text", ["if::alpha=0.1", "soon:alpha=0.1", "alpha=0.1"])
def test_a_script_step_must_say_when(text: str) -> None:
    with pytest.raises(ValueError, match="a time in seconds"):
        parse_script(text)


def test_script_rejects_unknown_knobs() -> None:
    with pytest.raises(ValueError, match="unknown knob"):
        parse_script("10s:temperature=1")


def test_exit_speculative_fails_only_an_engine_with_a_speculative_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SPECGATE_SIM_EXIT=speculative crashes the canary (it alone gets --speculative-config)."""
    monkeypatch.setenv("SPECGATE_SIM_EXIT", "speculative")
    with pytest.raises(SystemExit, match="SPECGATE_SIM_EXIT=speculative"):
        sim_main(["m", "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}'])
    started: list[object] = []
    monkeypatch.setattr(sim_module.web, "run_app", lambda app, **_: started.append(app))
    sim_main(["m"])
    assert len(started) == 1


def test_exit_speculative_if_a_file_exists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A canary that serves, then crash-loops once the test creates the file and kills its engine."""
    flag = tmp_path / "crash"
    monkeypatch.setenv("SPECGATE_SIM_EXIT", f"speculative-if:{flag}")
    started: list[object] = []
    monkeypatch.setattr(sim_module.web, "run_app", lambda app, **_: started.append(app))
    canary = ["m", "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}']
    sim_main(canary)
    flag.touch()
    with pytest.raises(SystemExit, match="speculative-if"):
        sim_main(canary)
    sim_main(["m"])
    assert len(started) == 2


def test_the_engine_counts_its_steps_as_vllm_does() -> None:
    """Four requests of 10 tokens, no speculation: one step prefills them all (each a first token,
    no ITL), nine more give each its next token. So 10 steps in vllm:iteration_tokens_total (4 x 3
    prompt tokens and 4 generated in the first, 4 in each other: 16 + 9 x 4 = 52 tokens) and 4 x 9
    = 36 ITL samples, one per running request per step."""
    engine = SimEngine(
        served_name="tiny",
        knobs=Knobs(step_ms=0.1, token_ms=0.01),
        spec=None,
        script=[],
        metrics=EngineMetrics.create(speculative=False),
    )

    async def serve() -> None:
        loop = asyncio.create_task(engine.loop())
        requests = [Request(3, 10, time.monotonic()) for _ in range(4)]
        for request in requests:
            engine.submit(request)
        for request in requests:
            while await request.queue.get() is not None:
                pass
        loop.cancel()

    asyncio.run(serve())
    registry, labels = engine.metrics.registry, engine.labels
    steps = registry.get_sample_value(f"{ITERATION_TOKENS}_count", labels)
    tokens = registry.get_sample_value(f"{ITERATION_TOKENS}_sum", labels)
    samples = registry.get_sample_value(f"{INTER_TOKEN_LATENCY}_count", labels)
    assert (steps, tokens, samples) == (10.0, 52.0, 36.0)


def test_custom_histogram_buckets_set_the_itl_and_per_token_buckets_as_vllm_does() -> None:
    """vLLM 0.32's --custom-histogram-buckets '{"inter_token_latency": [...]}' sets both the ITL and
    the per-token histograms; without it they keep vLLM's defaults (10, 25, 50 ms, ...)."""
    ladder = [0.01, 0.0105, 0.011]
    args = sim_module.parse_args(["m", "--custom-histogram-buckets", f'{{"inter_token_latency": {ladder}}}'])
    metrics = EngineMetrics.create(speculative=False, itl_buckets=sim_module.itl_buckets(args))
    metrics.itl.labels("m", "0").observe(0.0102)
    metrics.per_token.labels("m", "0").observe(0.0102)
    for family in (INTER_TOKEN_LATENCY, REQUEST_TIME_PER_OUTPUT_TOKEN):
        labels = {"model_name": "m", "engine": "0"}
        read = metrics.registry.get_sample_value
        assert read(f"{family}_bucket", {**labels, "le": "0.01"}) == 0.0
        assert read(f"{family}_bucket", {**labels, "le": "0.0105"}) == 1.0
        assert read(f"{family}_bucket", {**labels, "le": "0.025"}) is None  # no default edge
    default = sim_module.itl_buckets(sim_module.parse_args(["m"]))
    assert default[:3] == (0.01, 0.025, 0.05)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("not json", "not JSON"),
        ("[0.01]", "a JSON object"),
        ('{"inter_token_latency": [0.02, 0.01]}', "strictly ascending"),
        ('{"inter_token_latency": []}', "strictly ascending"),
    ],
)
def test_bad_custom_histogram_buckets_name_the_flag_and_the_fix(
    value: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        sim_module.parse_args(["m", "--custom-histogram-buckets", value])
    assert error in capsys.readouterr().err
