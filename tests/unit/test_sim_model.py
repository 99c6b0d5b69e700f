"""The simulator's behaviour model: acceptance converges to the profile's, cost grows with B and K."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import specgate_lab.sim.__main__ as sim_module
from specgate.planning import expected_accepted
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


def test_script_changes_knobs_over_time() -> None:
    script = parse_script("0s:alpha=0.8;120s:alpha=0.3,step_ms=20")
    base = Knobs()
    assert knobs_at(base, script, 5).alpha == 0.8
    late = knobs_at(base, script, 121)
    assert (late.alpha, late.step_ms) == (0.3, 20)


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
