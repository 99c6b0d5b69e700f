"""`make demo`'s last words: the RESULT line and, next to it, what the sample relaxed and why."""

from __future__ import annotations

import itertools
import json

import pytest
from tests.conftest import load_sample

from specgate import api
from specgate_lab import adopt_lab
from specgate_lab.bridge import PIN_CPU_ANNOTATION
from specgate_lab.demo import (
    ADOPT_REPLICAS,
    SCENARIOS,
    Load,
    adopting_sample,
    caveat_lines,
    demo_load_lines,
    gateway_lines,
    result_line,
    route_line,
    routed,
    served_model,
    through_gateway,
)
from specgate_lab.demo_sizing import Calibration, TooSlow, calibrate, size
from specgate_lab.gateway import GATEWAY
from specgate_lab.loadgen import Completion, LoadResult

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
    assert "minSpeedup 0.05, default 1.0" in text and "or NoSpeedup" in text


def test_the_result_line_shows_the_speedup_with_its_interval() -> None:
    """The canary's status.canary.speedup and bounds; where the gate did not run (sequential), the
    ratio of the tracks' mean times per output token, marked as not judged."""
    judged = {
        **STATUS,
        "canary": {**STATUS["canary"], "speedup": 1.3421, "speedupLower": 1.2, "speedupUpper": 1.49},
    }
    assert " speedup=1.34[1.2,1.49] reason=Promoted" in result_line("tiny", judged)
    assert " speedup=- reason=Promoted" in result_line("tiny", STATUS)
    sequential = {
        **STATUS,
        "baseline": {**STATUS["baseline"], "perTokenLatencyMs": 117.303},
        "canary": {**STATUS["canary"], "perTokenLatencyMs": 68.694},
    }  # the heavy demo's figures (2026-11-29): the gate needs the baseline beside the canary
    assert " speedup=1.71(sequential,not_judged) reason=Promoted" in result_line("heavy", sequential)


def test_the_result_line_shows_each_latency_gates_ratio_with_its_interval() -> None:
    """status.canary's perTokenLatencyGate and stepStallGate, written as the speedup is; an upper
    bound no rank gives (absent in status) reads inf, a gate without a ratio '-'."""
    judged = {
        **STATUS,
        "canary": {
            **STATUS["canary"],
            "perTokenLatencyGate": {"ratio": 0.9312, "ratioLower": 0.9011, "ratioUpper": 0.9623},
            "stepStallGate": {"ratio": 1.2049, "ratioLower": 0.0, "ratioUpper": None},
        },
    }
    assert " p99_per_token_ratio=0.93[0.9011,0.9623] p99_stall_ratio=1.20[0.0,inf] speedup=- " in (
        result_line("tiny", judged)
    )
    assert " tok_s=362.0/72.0 p99_per_token_ratio=- p99_stall_ratio=- speedup=- " in result_line(
        "tiny", STATUS
    )


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


def test_the_heavy_samples_pin_their_engines_and_resolve_stalls_up_to_300_ms() -> None:
    """What made `make demo` hold beside a CPU hog (docs/benchmarks.md): each engine pinned to one
    CPU, and stall buckets 10 ms apart up to 300 ms (a 1.38x canary stall in 200-250 ms against a
    baseline's in 160-180 ms could not be told from 1.5x)."""
    for sample in ("heavy-cpu.yaml", "heavy-cpu-low-alpha.yaml"):
        spec = load_sample(sample)["spec"]
        assert spec["podAnnotations"][PIN_CPU_ANNOTATION] == "true"
        args = spec["vllmArgs"]
        bounds = json.loads(args[args.index("--custom-histogram-buckets") + 1])["inter_token_latency"]
        above_200 = [b for b in bounds if 0.2 <= b <= 0.3]
        assert max(round(b - a, 3) for a, b in itertools.pairwise(above_200)) == 0.01


def test_the_adopt_scenario_adopts_the_users_deployment_with_the_gates_at_their_defaults() -> None:
    """The sample's rollout on the lab's Deployment of simulated engines: the CPU relaxations go (the
    simulator's steps meet the latency and speedup gates), the load asks for the Deployment's model."""
    body = adopting_sample(load_sample(SCENARIOS["adopt"].sample))
    spec = api.parse_spec(body["spec"])
    assert spec.workload_ref is not None and spec.workload_ref.name == adopt_lab.NAME
    assert spec.model is None and spec.replicas == ADOPT_REPLICAS
    defaults = api.Gates()
    gates = spec.rollout.gates
    assert (gates.max_p99_itl_regression, gates.max_p99_per_token_regression, gates.min_speedup) == (
        defaults.max_p99_itl_regression, defaults.max_p99_per_token_regression, defaults.min_speedup,
    )  # fmt: skip
    assert served_model(body) == "tiny" == adopt_lab.SERVED_MODEL
    assert served_model(load_sample("tiny-cpu.yaml")) == "tiny"
    deployment = adopt_lab.user_deployment(ADOPT_REPLICAS, {})
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--served-model-name") + 1] == adopt_lab.SERVED_MODEL


def test_every_scenario_names_a_sample_that_exists() -> None:
    for name, scenario in SCENARIOS.items():
        assert load_sample(scenario.sample)["kind"] == "SpeculativeDeployment", name
    assert SCENARIOS["default"].sample == "heavy-cpu.yaml"


def served(
    request_s: float, step_s: float, count: int, start: float = 100.0, tokens: int = 32
) -> list[Completion]:
    """`count` back-to-back requests at concurrency 1, each `request_s` long, its `tokens` tokens
    `step_s` apart at its end and streamed two to a chunk (as a buffering proxy may)."""
    done = []
    for i in range(count):
        begin = start + i * request_s
        end = begin + request_s
        done.append(Completion(begin, end - (tokens - 1) * step_s, end, tokens // 2, tokens))
    return done


def test_calibration_counts_requests_started_after_ready_and_skips_the_first() -> None:
    before_ready = served(5.0, 0.1, 3, start=80.0)  # ended by 95: served before Ready at 100
    after = served(4.0, 0.125, 4)
    assert calibrate(before_ready + after[:3], since=100.0, max_tokens=32, concurrency=1) is None
    calibration = calibrate(before_ready + after, since=100.0, max_tokens=32, concurrency=1)
    assert calibration is not None
    assert (calibration.requests, calibration.seconds) == (3, 12.0)  # ends at 108, 112, 116 after 104
    assert calibration.step_s == pytest.approx(0.125)
    assert calibration.requests_per_second == pytest.approx(0.25)


def test_the_readme_machine_keeps_the_samples_window_with_shorter_requests() -> None:
    """0.35 requests a second at 32 tokens, 80 ms a token: 16 tokens take 2.86 - 16 x 0.08 = 1.58 s,
    so 100 samples (2 x 50) take 158 s: within the sample's 180 s window, which holds 114."""
    calibration = Calibration(requests=10, seconds=28.6, step_s=0.08, max_tokens=32, concurrency=1)
    sizing = size(calibration, needed=50, window_s=180, max_analysis_s=600)
    assert (sizing.max_tokens, sizing.window_s, sizing.max_analysis_s) == (16, 180, 600)
    assert sizing.expected == pytest.approx(180 / 1.58)
    assert "2.3x the 50" in sizing.explain(calibration)


def test_a_slower_machine_gets_a_longer_window_with_twice_the_samples() -> None:
    """The machine of issue 36: 0.24 requests a second at 32 tokens, 125 ms a token. 16 tokens take
    4.17 - 2.0 = 2.17 s; 100 samples take 217 s, rounded up to 240 s; maxAnalysisDuration keeps the
    sample's 420 s beyond its window."""
    calibration = Calibration(requests=6, seconds=25.0, step_s=0.125, max_tokens=32, concurrency=1)
    sizing = size(calibration, needed=50, window_s=180, max_analysis_s=600)
    assert (sizing.max_tokens, sizing.window_s, sizing.max_analysis_s) == (16, 240, 660)
    assert sizing.expected >= 2 * 50


def test_a_fast_machine_keeps_the_scenarios_requests() -> None:
    """1 s a request at 32 tokens: 100 samples in 100 s, the sample's 180 s floor holds 180."""
    calibration = Calibration(requests=20, seconds=20.0, step_s=0.03, max_tokens=32, concurrency=1)
    sizing = size(calibration, needed=50, window_s=180, max_analysis_s=600)
    assert (sizing.max_tokens, sizing.window_s) == (32, 180)


def test_a_machine_too_slow_for_an_honest_run_is_told_so_with_its_figures() -> None:
    """12 s a request at 32 tokens, 350 ms a token: 16 tokens take 6.4 s, 100 samples 640 s, past
    the 600 s most a window may take."""
    calibration = Calibration(requests=4, seconds=48.0, step_s=0.35, max_tokens=32, concurrency=1)
    with pytest.raises(TooSlow) as told:
        size(calibration, needed=50, window_s=180, max_analysis_s=600)
    message = str(told.value)
    assert "0.083 requests a second at 32 tokens (350 ms a token)" in message
    assert "about 0.156 at 16" in message and "needs 0.167 requests a second" in message
    assert "make demo SCENARIO=tiny" in message


def test_a_demo_short_of_traffic_names_its_own_load() -> None:
    load = Load(SCENARIOS["default"])
    short = {
        "message": "baseline has too little traffic to measure (41 per-token samples, need 50): send traffic"
    }
    assert demo_load_lines({"message": "canary is Ready"}, load) == []
    [line] = demo_load_lines(short, load)
    assert "the demo's own load is that traffic: 1 request(s) in flight of 32 tokens" in line
    assert "SCENARIO=tiny" in line


def test_the_gateway_scenario_routes_simulated_engines_by_gateway_api_at_the_default_latency_gates() -> None:
    body = load_sample(SCENARIOS["gateway"].sample)
    through_gateway(body)
    spec = api.parse_spec(body["spec"])  # as the API server's schema and rules see it
    assert spec.rollout.traffic is not None and spec.rollout.traffic.router == "GatewayAPI"
    assert body["spec"]["rollout"]["traffic"]["httpRoute"]["parentRefs"][0]["name"] == GATEWAY
    assert body["spec"]["podAnnotations"] == {"specgate.dev/lab-engine": "sim"}
    # The simulator's steps meet the default latency gates: no speedup caveat under the result.
    assert "maxP99" not in "\n".join(caveat_lines(body["spec"], STATUS))


def test_the_route_lines_show_both_weights_and_what_the_gateway_served() -> None:
    load = LoadResult(requests=120, errors=3)
    load.failures.update({"HTTP 404": 2, "ClientPayloadError after 3 chunks": 1})
    traffic = {"route": "r", "desired": {"baseline": 75, "canary": 25}}
    assert route_line(traffic, load).endswith(
        "route r weights baseline/canary: desired 75/25, actual -; the gateway served 120 requests, 3 failed"
    )
    assert (
        not routed({"traffic": traffic})
        and routed({})
        and routed({"traffic": {**traffic, "actual": traffic["desired"]}})
    )
    [line] = gateway_lines("http://gw", load, failed_unrouted=2)
    assert "served 120 requests and failed 3: 2 before the route carried weights, 1 after" in line
    assert "HTTP 404: 2, ClientPayloadError after 3 chunks: 1" in line
