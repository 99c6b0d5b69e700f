"""`make demo`'s last words: the RESULT line and, next to it, what the sample relaxed and why."""

from __future__ import annotations

from tests.conftest import load_sample

from specgate_lab.demo import SCENARIOS, caveat_lines, result_line

STATUS = {
    "phase": "Promoted",
    "baseline": {"p99ItlMs": 21.803, "outputTokensPerSecond": 362.0},
    "canary": {"p99ItlMs": 468.667, "outputTokensPerSecond": 72.0, "alpha": 1.0},
    "history": [{"reason": "Promoted"}],
}


def test_the_cpu_samples_say_what_they_relax_next_to_the_result() -> None:
    lines = caveat_lines(load_sample("tiny-cpu.yaml")["spec"], STATUS)
    text = "\n".join(lines)
    assert lines and all(line.startswith("CAVEAT: ") for line in lines)
    assert "maxP99ItlRegression 50 (5000%), default 0.5 (50%)" in text
    assert "maxP99PerTokenRegression 50 (5000%), default 0.1 (10%)" in text
    assert "72.0 tok/s against the baseline's 362.0" in text and "21.5x" in text
    assert "never copy to GPUs" in text
    assert result_line("tiny", STATUS).startswith("RESULT: tiny phase=Promoted alpha=1.00")


def test_a_sample_with_the_default_gates_needs_no_caveat() -> None:
    assert caveat_lines(load_sample("llama-3.1-8b-eagle3.yaml")["spec"], STATUS) == []


def test_the_caveat_holds_without_figures() -> None:
    lines = caveat_lines(load_sample("tiny-cpu.yaml")["spec"], {})
    assert len(lines) == 2 and "speculation does not pay here:" in lines[1]


def test_the_demo_sample_keeps_both_latency_gates_so_no_speedup_caveat() -> None:
    """heavy-cpu.yaml (make demo) lowers only the sample size the lab's ~0.3 requests a second can fill."""
    for sample in ("heavy-cpu.yaml", "heavy-cpu-low-alpha.yaml"):
        lines = caveat_lines(load_sample(sample)["spec"], STATUS)
        assert len(lines) == 1 and "minLatencySamples 50, default 100" in lines[0], lines
        assert "maxP99" not in lines[0]


def test_every_scenario_names_a_sample_that_exists() -> None:
    for name, scenario in SCENARIOS.items():
        assert load_sample(scenario.sample)["kind"] == "SpeculativeDeployment", name
    assert SCENARIOS["default"].sample == "heavy-cpu.yaml"
