"""`make demo`: one SpeculativeDeployment rolled out end to end on the local cluster.

The operator runs as a local process (`specgate run`), the sample is served by real vLLM CPU engines
through the bridge, load goes through the Service, and the timeline prints as the status changes.
It ends with the result, and right under it a caveat naming every gate the sample sets away
from its default, with the figures that explain why where a sample relaxes a latency gate (the tiny
sample, where speculation does not pay; the default heavy sample keeps them):

    RESULT: <name> phase=<Promoted|RolledBack> alpha=<x.xx> p99_itl_ms=<baseline>/<canary>
            p99_per_token_ms=<baseline>/<canary> tok_s=<baseline>/<canary>
            p99_per_token_ratio=<x.xx[lower,upper]: the per-token latency gate's canary/baseline P99>
            p99_stall_ratio=<x.xx[lower,upper]: the step-stall gate's>
            speedup=<x.xx[lower,upper] per output token; x.xx(sequential,not_judged) where the tracks
            were measured one after the other: the ratio of their mean times per output token> reason=<Reason>
    CAVEAT: ...

The heavy samples are sized to the machine (demo_sizing): while the baseline warms up, the demo
measures how fast it serves its own load and sets the tokens per request and the analysis windows
so that a window holds twice the per-token samples the latency gates need; a machine too slow for
that is told so in the first minutes. Progress lines show the samples so far and the time left.

The adopt scenario starts from what a user already runs: a plain Deployment of two simulated engines
and the Service that selects them serve the load; a SpeculativeDeployment adopts the Deployment
(spec.workloadRef: its replicas lowered as specgate's pods become Ready), rolls out a canary and
promotes; then it is deleted and hands serving back, and an ADOPT line says what the Service served
and failed throughout.

The gateway scenario sends the load through a real gateway instead of the Service: the lab's Traefik
(`make gateway`) routes the HTTPRoute specgate weights (router GatewayAPI) to simulated engines on
pod addresses it reaches (specgate_lab.gateway; root, for the pod range's route). Lines show the
route's weights as they change, and a GATEWAY line after the result what it served and failed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config

from specgate import api
from specgate.api import parse_duration, parse_status
from specgate.render import LABEL_DEPLOYMENT
from specgate_lab import adopt_lab, checkout
from specgate_lab.bridge import ENGINE_ANNOTATION
from specgate_lab.crds import install_crd
from specgate_lab.demo_sizing import FALLBACK, TOO_SLOW, Sizing, TooSlow, calibrate, size
from specgate_lab.engines import CACHE
from specgate_lab.gateway import GATEWAY, LISTENER, POD_RANGE, GatewaySetupError, gateway_lab
from specgate_lab.kube import pin_to_node, wait_for
from specgate_lab.loadgen import LoadResult, run_load


@dataclass(frozen=True)
class Scenario:
    sample: str  # in the checkout's crds/samples/
    expected_phase: str  # what the story should end in
    concurrency: int  # requests kept in flight through the Service (or the gateway)
    max_tokens: int  # tokens a request (fewer where sizing chooses so)
    sized: bool = True  # fit the tokens a request and the windows to this machine (demo_sizing)
    gateway: bool = False  # load through the lab's gateway, the sample changed by through_gateway
    adopt: bool = False  # adopt a plain Deployment and load its Service (adopted_workload)


SCENARIOS = {
    # Concurrency 1: on the lab's CPU a speculative step's stall grows with the batch (heavy-llama at
    # K=1: 1.26x a plain step at concurrency 1, 1.39x at 2; README, "The local lab"), as on GPUs.
    "default": Scenario("heavy-cpu.yaml", "Promoted", concurrency=1, max_tokens=32),
    "low-alpha": Scenario("heavy-cpu-low-alpha.yaml", "RolledBack", concurrency=1, max_tokens=32),
    # The tiny models serve hundreds of requests a window on any machine: no sizing needed.
    "tiny": Scenario("tiny-cpu.yaml", "Promoted", concurrency=2, max_tokens=48, sized=False),
    # Concurrency 4: the canary gets a quarter of it and still fills a window with samples.
    "gateway": Scenario("tiny-cpu.yaml", "Promoted", concurrency=4, max_tokens=48, sized=False, gateway=True),
    # The tiny sample's rollout, on the user's Deployment of simulated engines.
    "adopt": Scenario("tiny-cpu.yaml", "Promoted", concurrency=4, max_tokens=48, sized=False, adopt=True),
}
ADOPT_REPLICAS = 2
PROGRESS_EVERY_S = 30.0
CALIBRATION_S = 20.0  # measure the baseline this long after Ready at least (its warm-up is 30 s)
CALIBRATION_LIMIT_S = 120.0  # a baseline Ready this long without the requests to size from is too slow
SETTLED = {"Promoted", "RolledBack", "Failed"}
NAMESPACE = "specgate-demo"
GATEWAY_NODE = f"{NAMESPACE}-gateway"  # a fake GPU node of the scenario's own, its pod CIDR routed to lo
GATEWAY_REPLICAS, GATEWAY_CANARY = 4, 1  # load-matched: the canary's weight is 25 beside 3 baseline pods
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
        f"tok_s={baseline.get('outputTokensPerSecond', '-')}/{canary.get('outputTokensPerSecond', '-')} "
        f"p99_per_token_ratio={_latency_ratio(canary, 'perTokenLatencyGate')} "
        f"p99_stall_ratio={_latency_ratio(canary, 'stepStallGate')} speedup={_speedup(baseline, canary)} reason={reason}"
    )


def _latency_ratio(canary: dict[str, Any], gate: str) -> str:
    """A latency gate's canary/baseline P99 ratio and interval, written as the speedup is (an upper
    bound no rank gives reads inf); '-' where status has no ratio of it."""
    figures = canary.get(gate) or {}
    if figures.get("ratio") is None:
        return "-"
    upper = figures.get("ratioUpper")
    return f"{figures['ratio']:.2f}[{figures.get('ratioLower')},{'inf' if upper is None else upper}]"


def _speedup(baseline: dict[str, Any], canary: dict[str, Any]) -> str:
    """The speedup gate's estimate and interval; where the gate did not run (the tracks measured one
    after the other), the ratio of their mean times per output token, marked as not judged; '-'
    without either."""
    if canary.get("speedup") is not None:
        return f"{canary['speedup']:.2f}[{canary.get('speedupLower')},{canary.get('speedupUpper')}]"
    plain, speculative = baseline.get("perTokenLatencyMs"), canary.get("perTokenLatencyMs")
    if not plain or not speculative:
        return "-"
    return f"{plain / speculative:.2f}(sequential,not_judged)"


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


def routed(status: dict[str, Any]) -> bool:
    """The route carries the weights specgate set (router GatewayAPI; always so without a route):
    a settled rollout's last pods of the losing track go once it does."""
    traffic = status.get("traffic")
    return not traffic or traffic.get("actual") == traffic.get("desired")


def _split(weights: dict[str, int] | None) -> str:
    return "-" if weights is None else f"{weights['baseline']}/{weights['canary']}"


def route_line(traffic: dict[str, Any], load: LoadResult) -> str:
    return (
        f"  ... route {traffic['route']} weights baseline/canary: desired {_split(traffic.get('desired'))}, "
        f"actual {_split(traffic.get('actual'))}; the gateway served {load.requests} requests, "
        f"{load.errors} failed"
    )


def gateway_lines(url: str, load: LoadResult, failed_unrouted: int | None) -> list[str]:
    """What the gateway served and failed, the failures before the route carried weights apart:
    until then the gateway has nothing to send a request to (404, 503)."""
    before = load.errors if failed_unrouted is None else failed_unrouted
    kinds = ", ".join(f"{kind}: {n}" for kind, n in load.failures.most_common()) or "none"
    return [
        f"GATEWAY: {url} served {load.requests} requests and failed {load.errors}: {before} before the "
        f"route carried weights, {load.errors - before} after (all failures by kind: {kinds})"
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
        else:
            changed.append(f"{key} {value}, default {default}")
        relaxed_latency |= key.startswith("maxP99") or key == "minSpeedup"
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
        f"(P99 per-token latency at most {per_token:.0%} worse, P99 step stall at most {stall:.0%}, "
        "at least as fast per output token as the baseline) roll such a canary back as LatencyRegression "
        "or NoSpeedup."
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
    """The demo's own traffic through the Service (or the gateway), followed as it runs; the tokens
    a request can change while it runs (sizing)."""

    def __init__(self, scenario: Scenario) -> None:
        self.concurrency = scenario.concurrency
        self.max_tokens = scenario.max_tokens
        self.result = LoadResult()

    def start(self, url: str, model: str, seconds: float) -> None:
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
        self.last_weights: tuple[Any, Any] | None = None
        self.failed_unrouted: int | None = None  # requests failed before the route carried weights

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
            self._print_route(status)
            if (
                status.get("phase") in SETTLED
                and status.get("observedGeneration") == obj["metadata"]["generation"]
                and routed(status)
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

    def _print_route(self, status: dict[str, Any]) -> None:
        """A line each time the route's weights change (router GatewayAPI), with what the gateway
        has served so far."""
        traffic = status.get("traffic")
        if not traffic or (traffic.get("desired"), traffic.get("actual")) == self.last_weights:
            return
        self.last_weights = (traffic.get("desired"), traffic.get("actual"))
        if self.failed_unrouted is None and traffic.get("actual"):
            self.failed_unrouted = self.load.result.errors
        say(route_line(traffic, self.load.result))

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
        # Through a gateway the track gets its weight's share of the load.
        weights = (status.get("traffic") or {}).get("actual") or {what: 100}
        samples = round(self.load.finished_since(max(begins, now - self.window)) * weights[what] / 100)
        verdict = f"about {(left + later) / 60:.0f} min" if left + later >= 60 else f"{left + later:.0f} s"
        say(
            f"  ... {what} window: {samples} of {self.needed} per-token samples (one a finished request), "
            f"{left:.0f} s left in the {self.window:.0f} s window; a verdict in {verdict} at the earliest"
        )


def through_gateway(body: dict[str, Any]) -> None:
    """The tiny sample as the gateway scenario serves it: simulated engines (a few minutes on any
    machine; their steps, unlike the tiny model's on CPU, meet the default latency gates), and
    enough replicas that the route's weights move in steps, routed by the lab's Gateway."""
    spec, rollout = body["spec"], body["spec"]["rollout"]
    body["metadata"]["name"] = "tiny-gateway"
    spec["replicas"] = GATEWAY_REPLICAS
    spec["podAnnotations"] = {ENGINE_ANNOTATION: "sim"}
    spec["env"] = [{"name": "SPECGATE_SIM_ALPHA", "value": "0.8"}]
    # A separate draft model's passes cost the simulated canary more step stall than the default
    # gate allows; an EAGLE-3 head's do not.
    spec["speculative"] = {
        "method": "eagle3", "draftModel": "specgate/tiny-llama-eagle3", "numSpeculativeTokens": 3,
    }  # fmt: skip
    rollout["canaryReplicas"] = GATEWAY_CANARY
    rollout["traffic"] = {
        "router": "GatewayAPI",
        "httpRoute": {"parentRefs": [{"name": GATEWAY, "sectionName": LISTENER}]},
    }
    for relaxed in ("maxP99ItlRegression", "maxP99PerTokenRegression"):
        del rollout["gates"][relaxed]


@contextmanager
def demo_gateway(
    api_client: client.ApiClient, kubeconfig: str, body: dict[str, Any], keep: bool
) -> Iterator[str]:
    """The lab's gateway for the object (pinned to its node here); the URL to send load to. Unless
    `keep`, the object goes at the end, then its pods, then what the gateway needed."""
    log = CACHE / "demo-gateway" / "traefik.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with gateway_lab(
        api_client, kubeconfig, NAMESPACE, GATEWAY_NODE, GATEWAY_REPLICAS + 1, log, keep
    ) as port:
        pin_to_node(body, GATEWAY_NODE, NAMESPACE)
        say(
            f"gateway: Traefik on 127.0.0.1:{port} (log {log}), Gateway {GATEWAY}, the pods on node "
            f"{GATEWAY_NODE} with addresses in {POD_RANGE} (routed to lo)"
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            if not keep:
                remove_rollout(api_client, body["metadata"]["name"])
    made = f"node {GATEWAY_NODE}, Gateway {GATEWAY} and its GatewayClass"
    say(f"kept {body['metadata']['name']}, {made} (Traefik stopped)" if keep else f"removed {made}")


def remove_rollout(api_client: client.ApiClient, name: str) -> None:
    """Delete the object and wait for its pods to go (their engines hold addresses of the node's)."""
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, name
    )
    core = client.CoreV1Api(api_client)
    wait_for(
        lambda: not core.list_namespaced_pod(NAMESPACE, label_selector=f"{LABEL_DEPLOYMENT}={name}").items,
        120,
        f"the pods of {name} to go",
    )
    say(f"removed {name} and its pods")


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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="default")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--prometheus-url", default="http://127.0.0.1:19090")
    parser.add_argument("--bridge-url", default="http://127.0.0.1:18080")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument(
        "--keep", action="store_true", help="keep what the gateway or adopt scenario set up (KEEP=1)"
    )
    return parser.parse_args()


def scenario_body(name: str, scenario: Scenario) -> dict[str, Any]:
    """The scenario's object, said in a line."""
    sample = Path("crds") / "samples" / scenario.sample
    body: dict[str, Any] = yaml.safe_load((checkout() / sample).read_text())
    if scenario.gateway:
        through_gateway(body)
    if scenario.adopt:
        body = adopting_sample(body)
        say(
            f"scenario {name}: Deployment and Service {adopt_lab.NAME} ({ADOPT_REPLICAS} simulated engines) "
            f"serve; {body['metadata']['name']} adopts the Deployment with {sample}'s rollout "
            f"({body['spec']['speculative']['method']}), load through Service {adopt_lab.NAME} at "
            f"concurrency {scenario.concurrency}"
        )
        return body
    say(
        f"scenario {name}: {sample}{' through the gateway, simulated engines' if scenario.gateway else ''} "
        f"({body['spec']['speculative']['method']}), load at concurrency {scenario.concurrency}"
    )
    return body


def adopting_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """The object of the adopt scenario: the sample's rollout, its gates at their defaults but for
    the sample sizes (the simulator's steps meet the latency and speedup gates), on the user's
    Deployment (spec.workloadRef)."""
    rollout = sample["spec"]["rollout"]
    for relaxed in ("maxP99ItlRegression", "maxP99PerTokenRegression", "minSpeedup"):
        del rollout["gates"][relaxed]
    return adopt_lab.adopting("adopt", ADOPT_REPLICAS, rollout)


@contextmanager
def adopted_workload(api_client: client.ApiClient, keep: bool) -> Iterator[str]:
    """The user's Deployment and Service, serving before the demo's object exists; the Service's
    name (the bridge routes to its Ready pods). Unless `keep`, both go at the end."""
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    deployment = adopt_lab.user_deployment(ADOPT_REPLICAS, {"SPECGATE_SIM_ALPHA": "0.8"})
    # The client takes a manifest as a dict as well as its model classes.
    apps.create_namespaced_deployment(NAMESPACE, cast(client.V1Deployment, deployment))
    core.create_namespaced_service(NAMESPACE, cast(client.V1Service, adopt_lab.user_service()))
    try:
        wait_for(
            lambda: _ready_replicas(apps) >= ADOPT_REPLICAS,
            180,
            f"Deployment {adopt_lab.NAME}'s pods to be Ready",
        )
        say(
            f"Deployment {adopt_lab.NAME}: {ADOPT_REPLICAS} of {ADOPT_REPLICAS} Ready, Service {adopt_lab.NAME} serving"
        )
        yield adopt_lab.NAME
    finally:
        if not keep:
            apps.delete_namespaced_deployment(adopt_lab.NAME, NAMESPACE)
            core.delete_namespaced_service(adopt_lab.NAME, NAMESPACE)
            say(f"removed Deployment and Service {adopt_lab.NAME}")


def _ready_replicas(apps: client.AppsV1Api) -> int:
    status = apps.read_namespaced_deployment(adopt_lab.NAME, NAMESPACE).status
    return (status.ready_replicas if status else None) or 0


def hand_back(api_client: client.ApiClient, name: str) -> list[str]:
    """Delete the adopting object (the operator still running: its finalizer hands serving back) and
    say where serving went."""
    objects, apps = client.CustomObjectsApi(api_client), client.AppsV1Api(api_client)
    objects.delete_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, name)
    say(f"deleted {name}: handing serving back to Deployment {adopt_lab.NAME}")

    def gone() -> bool:
        listed = objects.list_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL)
        return not cast(dict[str, Any], listed)["items"]

    wait_for(gone, 300, f"{name} to hand back and go")
    time.sleep(10)  # requests on the Deployment's pods alone
    replicas = apps.read_namespaced_deployment(adopt_lab.NAME, NAMESPACE).spec
    return [
        f"HANDED BACK: Deployment {adopt_lab.NAME} at {replicas.replicas if replicas else '?'} replicas, "
        f"{_ready_replicas(apps)} Ready, serves Service {adopt_lab.NAME} again; its template untouched"
    ]


def roll_out(
    args: argparse.Namespace,
    api_client: client.ApiClient,
    body: dict[str, Any],
    load: Load,
    url: str,
    then: Callable[[], list[str]] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Run the operator, apply the object and send the load to `url` until the rollout settles:
    its status, and the lines that tell the result (written then: the load goes on until the demo
    ends, and meets the pods going); `then`, with the operator still running, adds its lines."""
    log = CACHE / "demo-operator.log"
    operator = start_operator(args.kubeconfig, NAMESPACE, args.prometheus_url, log)
    name = body["metadata"]["name"]
    say(f"operator running (log: {log}); applying {name} and sending load to {url}")
    try:
        install_crd(api_client)
        apply(api_client, body)
        load.start(url, served_model(body), args.timeout)
        watch = Watch(api_client, body, SCENARIOS[args.scenario], load)
        status = watch.run(args.timeout)
        after = then() if then is not None and status.get("phase") in SETTLED else []
    finally:
        stop_operator(operator, api_client, NAMESPACE)
    lines = [result_line(name, status), *demo_load_lines(status, load), *after]
    if SCENARIOS[args.scenario].gateway:
        lines += gateway_lines(url, load.result, watch.failed_unrouted)
    if SCENARIOS[args.scenario].adopt:
        lines.append(adopt_line(load.result))
    return status, [*lines, *caveat_lines(body["spec"], status)]


def served_model(body: dict[str, Any]) -> str:
    """The model name the load asks for: the sample's, or the adopted Deployment's."""
    spec = body["spec"]
    if "workloadRef" in spec:
        return adopt_lab.SERVED_MODEL
    return str(spec["model"].get("servedName", body["metadata"]["name"]))


def adopt_line(result: LoadResult) -> str:
    """What the user's Service served from before the object existed until after it was gone."""
    failures = ", ".join(f"{why}: {n}" for why, n in result.failures.most_common()) or "none"
    return (
        f"ADOPT: Service {adopt_lab.NAME} served {result.requests} requests through the hand-over, the "
        f"rollout and the hand-back, {result.errors} failed ({failures})"
    )


def main() -> None:
    args = parse_args()
    api_client = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    core = client.CoreV1Api(api_client)
    namespaces: list[Any] = core.list_namespace().items
    if NAMESPACE not in {n.metadata.name for n in namespaces}:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    scenario = SCENARIOS[args.scenario]
    body = scenario_body(args.scenario, scenario)
    try:
        with ExitStack() as lab:
            service, then = body["metadata"]["name"], None
            if scenario.adopt:
                service = lab.enter_context(adopted_workload(api_client, args.keep))
                then = partial(hand_back, api_client, body["metadata"]["name"])
            url = f"{args.bridge_url}/svc/{NAMESPACE}/{service}"
            if scenario.gateway:
                url = lab.enter_context(demo_gateway(api_client, args.kubeconfig, body, args.keep))
            status, lines = roll_out(args, api_client, body, Load(scenario), url, then)
    except (TooSlow, GatewaySetupError) as stopped:
        say(f"STOPPED: {stopped}.")
        sys.exit(2)
    for line in lines:
        print(line, flush=True)
    if status.get("phase") != scenario.expected_phase:
        say(
            f"expected phase {scenario.expected_phase}: see the operator log {CACHE / 'demo-operator.log'} "
            "and engine logs under $SPECGATE_CACHE/cluster"
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
