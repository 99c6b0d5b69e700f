"""`make demo`: one SpeculativeDeployment rolled out end to end on the local cluster.

The operator runs as a local process (`specgate run`), the sample is served by real vLLM CPU engines
through the bridge, load goes through the Service, and the timeline prints as the status changes.
It ends with the result, and right under it a caveat naming every gate the sample sets away
from its default, with the figures that explain why where a sample relaxes a latency gate (the tiny
sample, where speculation does not pay; the default heavy sample keeps them):

    RESULT: <name> phase=<Promoted|RolledBack> alpha=<x.xx> p99_itl_ms=<baseline>/<canary>
            p99_per_token_ms=<baseline>/<canary> tok_s=<baseline>/<canary> reason=<Reason>
    CAVEAT: ...

The heavy samples are sized to the machine (demo_sizing): while the baseline warms up, the demo
measures how fast it serves its own load and sets the tokens per request and the analysis windows
so that a window holds twice the per-token samples the latency gates need; a machine too slow for
that is told so in the first minutes. Progress lines show the samples so far and the time left.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config

from specgate import api
from specgate.api import parse_duration, parse_status
from specgate_lab import checkout
from specgate_lab.crds import install_crd
from specgate_lab.demo_sizing import FALLBACK, TOO_SLOW, Sizing, TooSlow, calibrate, size
from specgate_lab.loadgen import LoadResult, run_load


@dataclass(frozen=True)
class Scenario:
    sample: str  # in the checkout's crds/samples/
    expected_phase: str  # what the story should end in
    concurrency: int  # requests kept in flight through the Service
    max_tokens: int  # tokens a request (fewer where sizing chooses so)
    sized: bool = True  # fit the tokens a request and the windows to this machine (demo_sizing)


SCENARIOS = {
    # Concurrency 1: on the lab's CPU a speculative step's stall grows with the batch (heavy-llama at
    # K=1: 1.26x a plain step at concurrency 1, 1.39x at 2; README, "The local lab"), as on GPUs.
    "default": Scenario("heavy-cpu.yaml", "Promoted", concurrency=1, max_tokens=32),
    "low-alpha": Scenario("heavy-cpu-low-alpha.yaml", "RolledBack", concurrency=1, max_tokens=32),
    # The tiny models serve hundreds of requests a window on any machine: no sizing needed.
    "tiny": Scenario("tiny-cpu.yaml", "Promoted", concurrency=2, max_tokens=48, sized=False),
}
PROGRESS_EVERY_S = 30.0
CALIBRATION_S = 20.0  # measure the baseline this long after Ready at least (its warm-up is 30 s)
CALIBRATION_LIMIT_S = 120.0  # a baseline Ready this long without the requests to size from is too slow
SETTLED = {"Promoted", "RolledBack", "Failed"}
NAMESPACE = "specgate-demo"
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"  # kopf's default, which `specgate run` keeps


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def result_line(name: str, status: dict[str, Any]) -> str:
    canary, baseline = status.get("canary") or {}, status.get("baseline") or {}
    alpha = canary.get("alpha")
    history = status.get("history") or [{}]
    reason = history[-1].get("reason", status.get("reason"))  # why the phase was entered
    return (
        f"RESULT: {name} phase={status.get('phase')} alpha={'-' if alpha is None else f'{alpha:.2f}'} "
        f"p99_itl_ms={baseline.get('p99ItlMs', '-')}/{canary.get('p99ItlMs', '-')} "
        f"p99_per_token_ms={baseline.get('p99PerTokenLatencyMs', '-')}/{canary.get('p99PerTokenLatencyMs', '-')} "
        f"tok_s={baseline.get('outputTokensPerSecond', '-')}/{canary.get('outputTokensPerSecond', '-')} reason={reason}"
    )


def demo_load_lines(status: dict[str, Any], load: Load) -> list[str]:
    """Where the operator asks for more traffic, say what the demo's own load was: the demo is the
    traffic, and "send traffic to the Service" is advice for a real cluster."""
    if "too little traffic" not in (status.get("message") or ""):
        return []
    return [
        f"WHY: the demo's own load is that traffic: {load.concurrency} request(s) in flight of "
        f"{load.max_tokens} tokens each; it finished {load.result.requests} requests in all. The machine "
        "served fewer than the run was sized for (something else running on its cores?): stop other "
        "work and run it again, or run `make demo SCENARIO=tiny`."
    ]


def _tolerance(value: float) -> str:
    return f"{value} ({value:.0%})"


def caveat_lines(spec: dict[str, Any], status: dict[str, Any]) -> list[str]:
    """What a reader of the RESULT line must know: the gates this sample relaxes, and why.

    Every gate the sample sets away from its default is named with both values. Where it relaxes a
    latency gate (the tiny samples), the canary's throughput and P99 ITL against the baseline's show
    that speculation does not pay there, so the result shows the acceptance gate and the rollout
    mechanics, not a speedup."""
    gates = (spec.get("rollout") or {}).get("gates") or {}
    defaults = api.Gates().model_dump(by_alias=True)
    changed, relaxed_latency = [], False
    for key, value in gates.items():
        default = defaults.get(key)
        if default is None or value == default:
            continue
        if key.startswith("maxP99"):
            changed.append(f"{key} {_tolerance(value)}, default {_tolerance(default)}")
            relaxed_latency = True
        else:
            changed.append(f"{key} {value}, default {default}")
    if not changed:
        return []
    lines = [
        "CAVEAT: CPU lab only, never copy to GPUs: this sample sets these gates away from their "
        "defaults: " + "; ".join(changed) + "."
    ]
    if not relaxed_latency:
        return lines
    baseline, canary = status.get("baseline") or {}, status.get("canary") or {}
    facts = []
    base_tps, canary_tps = baseline.get("outputTokensPerSecond"), canary.get("outputTokensPerSecond")
    if base_tps and canary_tps is not None:
        facts.append(f"the canary served {canary_tps} tok/s against the baseline's {base_tps}")
    base_itl, canary_itl = baseline.get("p99ItlMs"), canary.get("p99ItlMs")
    if base_itl and canary_itl is not None:
        facts.append(f"its P99 ITL was {canary_itl / base_itl:.1f}x the baseline's")
    per_token, stall = defaults["maxP99PerTokenRegression"], defaults["maxP99ItlRegression"]
    lines.append(
        "CAVEAT: speculation does not pay here"
        + (f" ({', '.join(facts)})" if facts else "")
        + ": on a few CPU cores a speculative step's fixed cost (drafter, rejection sampler) outweighs "
        "the tiny model's ~3 ms forward pass, whatever alpha is. The latency gates are relaxed so that "
        "the demo shows the acceptance gate and the rollout mechanics, not a speedup; the default gates "
        f"(P99 per-token latency at most {per_token:.0%} worse, P99 step stall at most {stall:.0%}) roll "
        "such a canary back as LatencyRegression."
    )
    return lines


def apply(api_client: client.ApiClient, body: dict[str, Any]) -> None:
    objects = client.CustomObjectsApi(api_client)
    name = body["metadata"]["name"]
    body["metadata"]["namespace"] = NAMESPACE
    objects.patch_namespaced_custom_object(
        api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, name, body,
        field_manager="specgate-demo", force=True, _content_type="application/apply-patch+yaml",
    )  # fmt: skip


class Load:
    """The demo's own traffic through the Service, followed as it runs; the tokens a request can
    change while it runs (sizing)."""

    def __init__(self, scenario: Scenario) -> None:
        self.concurrency = scenario.concurrency
        self.max_tokens = scenario.max_tokens
        self.result = LoadResult()

    def start(self, bridge_url: str, service: str, model: str, seconds: float) -> None:
        url = f"{bridge_url}/svc/{NAMESPACE}/{service}"
        load = run_load(
            url, model, concurrency=self.concurrency, duration=seconds,
            max_tokens=lambda: self.max_tokens, result=self.result,
        )  # fmt: skip
        threading.Thread(target=lambda: asyncio.run(load), daemon=True).start()

    def finished_since(self, since: float) -> int:
        return sum(1 for c in list(self.result.completed) if c.end >= since)


def monotonic_at(stamp: str) -> float:
    """A status timestamp (the API server's clock, this machine's) on time.monotonic()'s scale."""
    return time.monotonic() - (time.time() - datetime.fromisoformat(stamp).timestamp())


class Watch:
    """Prints each new history entry and status message until the rollout settles; sizes the run
    to the machine while the baseline warms up, and shows the measurement's progress."""

    def __init__(
        self, api_client: client.ApiClient, body: dict[str, Any], scenario: Scenario, load: Load
    ) -> None:
        self.api_client, self.body, self.scenario, self.load = api_client, body, scenario, load
        self.name = body["metadata"]["name"]
        rollout = body["spec"]["rollout"]
        self.needed = int(rollout["gates"].get("minLatencySamples", api.Gates().min_latency_samples))
        self.warmup = parse_duration(rollout["warmup"])
        self.window = int(parse_duration(rollout["analysisWindow"]))
        self.started = time.monotonic()
        self.start_up_s: float | None = None  # apply to baseline Ready: how long an engine takes to start
        self.sizing: Sizing | None = None
        self.printed, self.last_message, self.next_progress = 0, "", 0.0

    def run(self, timeout: float) -> dict[str, Any]:
        objects = client.CustomObjectsApi(self.api_client)
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            obj = cast(
                dict[str, Any],
                objects.get_namespaced_custom_object(
                    api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, self.name
                ),
            )
            status = obj.get("status") or {}
            self._print_news(status)
            if (
                status.get("phase") in SETTLED
                and status.get("observedGeneration") == obj["metadata"]["generation"]
            ):
                break
            if self.scenario.sized:
                self._size(status)
            self._progress(status)
            time.sleep(3)
        for track in ("baseline", "canary"):
            if status.get(track):
                say(f"{track:<8} {api.Measurement.model_validate(status[track]).figures()}")
        return status

    def _print_news(self, status: dict[str, Any]) -> None:
        for entry in parse_status(status).history[self.printed :]:
            say(f"{entry.phase.value:<12} {entry.reason}: {entry.message}")
            self.printed += 1
        message = status.get("message") or ""
        if message and message != self.last_message:
            say(f"  ... {message}")
            self.last_message = message

    def _size(self, status: dict[str, Any]) -> None:
        """Once the baseline has served a few requests after Ready: choose, apply and say the sizing."""
        ready = status.get("readySince")
        if self.sizing is not None or status.get("phase") != "Baseline" or not ready:
            return
        ready_at = monotonic_at(ready)
        self.start_up_s = self.start_up_s or ready_at - self.started
        if time.monotonic() - ready_at < CALIBRATION_S:
            return
        concurrency = self.load.concurrency
        calibration = calibrate(self.load.result.completed, ready_at, self.load.max_tokens, concurrency)
        if calibration is None:
            if time.monotonic() - ready_at > CALIBRATION_LIMIT_S:
                raise TooSlow(
                    f"{TOO_SLOW}: its baseline finished {self.load.finished_since(ready_at)} requests "
                    f"in the {CALIBRATION_LIMIT_S:.0f} s after it became Ready. {FALLBACK}"
                )
            return
        rollout = self.body["spec"]["rollout"]
        self.sizing = size(
            calibration, self.needed, self.window, int(parse_duration(rollout["maxAnalysisDuration"]))
        )
        say(self.sizing.explain(calibration))
        self.load.max_tokens = self.sizing.max_tokens
        self.window = self.sizing.window_s
        rollout |= {
            "analysisWindow": f"{self.window}s",
            "maxAnalysisDuration": f"{self.sizing.max_analysis_s}s",
        }
        apply(self.api_client, self.body)  # the rollout goes on: neither field is in the pods' template

    def _progress(self, status: dict[str, Any]) -> None:
        """Every PROGRESS_EVERY_S: samples so far of those the gates need, the time left in the
        window, and about when a verdict can come."""
        now = time.monotonic()
        phase, since = status.get("phase"), status.get("phaseSince")
        if now < self.next_progress or since is None:
            return
        if phase == "Baseline" and status.get("readySince"):
            begins = monotonic_at(status["readySince"]) + self.warmup
            # After this window the canary starts (about as long as the baseline took), warms up
            # and is measured for a window of its own.
            later = (self.start_up_s or 0) + self.warmup + self.window
            what = "baseline"
        elif phase == "Analyzing":
            begins, later, what = monotonic_at(since), 0.0, "canary"
        else:
            return
        self.next_progress = now + PROGRESS_EVERY_S
        if now < begins:
            say(f"  ... {what} warming up: its window begins in {begins - now:.0f} s")
            return
        left = max(begins + self.window - now, 0)
        samples = self.load.finished_since(max(begins, now - self.window))
        verdict = f"about {(left + later) / 60:.0f} min" if left + later >= 60 else f"{left + later:.0f} s"
        say(
            f"  ... {what} window: {samples} of {self.needed} per-token samples (one a finished request), "
            f"{left:.0f} s left in the {self.window:.0f} s window; a verdict in {verdict} at the earliest"
        )


def start_operator(
    kubeconfig: str, namespace: str, prometheus_url: str, log: Path
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "specgate.cli", "run", "--namespace", namespace, "--prometheus-url", prometheus_url,
         "--interval", "3", "--metrics-port", "0"],
        env={**os.environ, "KUBECONFIG": kubeconfig}, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip


def stop_operator(operator: subprocess.Popen[bytes], api_client: client.ApiClient, namespace: str) -> None:
    """Stop the demo's operator and take kopf's finalizer off the objects it watched: with no
    operator left to remove it, `kubectl delete sd` on a cluster kept with KEEP=1 would hang. The
    children need no finalizer: they go with their owner by garbage collection."""
    operator.terminate()
    operator.wait(timeout=30)
    objects = client.CustomObjectsApi(api_client)
    listed = objects.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)
    for item in cast(dict[str, Any], listed)["items"]:
        finalizers = item["metadata"].get("finalizers") or []
        if KOPF_FINALIZER in finalizers:
            kept = [f for f in finalizers if f != KOPF_FINALIZER] or None
            objects.patch_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, item["metadata"]["name"],
                {"metadata": {"finalizers": kept, "resourceVersion": item["metadata"]["resourceVersion"]}},
            )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="default")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--prometheus-url", default="http://127.0.0.1:19090")
    parser.add_argument("--bridge-url", default="http://127.0.0.1:18080")
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args()

    api_client = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    core = client.CoreV1Api(api_client)
    namespaces: list[Any] = core.list_namespace().items
    if NAMESPACE not in {n.metadata.name for n in namespaces}:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    scenario = SCENARIOS[args.scenario]
    sample = Path("crds") / "samples" / scenario.sample
    body = yaml.safe_load((checkout() / sample).read_text())
    name = body["metadata"]["name"]
    say(
        f"scenario {args.scenario}: {sample} ({body['spec']['speculative']['method']}), load at "
        f"concurrency {scenario.concurrency}"
    )
    log = Path(os.environ.get("SPECGATE_CACHE", Path.home() / ".cache" / "specgate")) / "demo-operator.log"
    operator = start_operator(args.kubeconfig, NAMESPACE, args.prometheus_url, log)
    say(f"operator running (log: {log}); applying {name} and sending load through its Service")
    try:
        install_crd(api_client)
        apply(api_client, body)
        served = body["spec"]["model"].get("servedName", name)
        load = Load(scenario)
        load.start(args.bridge_url, name, served, args.timeout)
        status = Watch(api_client, body, scenario, load).run(args.timeout)
    except TooSlow as slow:
        say(f"STOPPED: {slow}.")
        sys.exit(2)
    finally:
        stop_operator(operator, api_client, NAMESPACE)
    print(result_line(name, status), flush=True)
    for line in demo_load_lines(status, load):
        print(line, flush=True)
    for line in caveat_lines(body["spec"], status):
        print(line, flush=True)
    expected = scenario.expected_phase
    if status.get("phase") != expected:
        say(
            f"expected phase {expected}: see the operator log {log} and engine logs under $SPECGATE_CACHE/cluster"
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
