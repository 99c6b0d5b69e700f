"""Rollouts through a real gateway (issue 41): router GatewayAPI, Traefik splitting the HTTPRoute
specgate writes between the tracks' Services, simulated engines on pod addresses the gateway
reaches (specgate_lab.gateway). The split is measured from the engines' own request counters;
the load goes through the gateway only, so a request the gateway sends to a pod that is gone fails
at the client, as does a stream cut in flight (the lab's Traefik is built without the race that
cuts some of them anyway: hack/build-binaries.sh).

Two rollouts go on past their end for events the operator only reacts to (issue 57): someone deletes
the owned route while Promoted, and the canary's pod goes NotReady (its engine killed, crash-looping)
while the rollout is paused. The requests that fail meanwhile are timed: from the event to the last
failure may take at most two reconcile intervals and the gateway's propagation (PROPAGATION_SECONDS).

Needs `make gateway` and root (the pod range's route)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.conftest import CACHE, Rollouts, side_by_side
from tests.cluster.gateway import (
    GATEWAY,
    GROUP,
    LISTENER,
    PROPAGATION_SECONDS,
    VERSION,
    Poll,
    RouteState,
    Window,
    gateway_lab,
    route_state,
)
from tests.cluster.operator_process import OPERATOR_INTERVAL_SECONDS, live_pods
from tests.cluster.rollouts import (
    SETTLED,
    Rollout,
    history_time,
    patch_rollout,
    pin_to_node,
    report,
    run_rollout,
    settled_as,
    sim_rollout,
)

from specgate import api
from specgate.render import LABEL_TRACK, Track
from specgate.traffic import shares
from specgate_lab.loadgen import LoadResult

pytestmark = [pytest.mark.cluster, pytest.mark.gateway]

REPLICAS, CANARY = 4, 1  # load-matched: the canary's weight is 25 while 3 baseline pods serve beside it
INITIAL = 10  # traffic.initialCanaryWeight of the rollout that starts small
ROUTE = {"router": "GatewayAPI", "httpRoute": {"parentRefs": [{"name": GATEWAY, "sectionName": LISTENER}]}}
# From an event the operator only reacts to until the last request fails: the reconcile that sees it
# comes within one interval, and its route write within another (the reconcile's own reads), then
# the gateway's propagation (tests/cluster/gateway.py says how long Traefik takes, and why).
REACTION_BOUND_SECONDS = 2 * OPERATOR_INTERVAL_SECONDS + PROPAGATION_SECONDS
QUIET_SECONDS = 6.0  # no failure for this long after the operator's repair ends a window
WINDOW_TIMEOUT_SECONDS = 60.0  # a window still open then ends anyway, for the test to fail with its figures


@dataclass
class Sample:
    """One poll (every 2 s): the route's weights as specgate wrote them, and each track's replicas."""

    weights: tuple[int, int] | None  # (baseline, canary) in the HTTPRoute's rule
    replicas: tuple[int, int]  # (baseline, canary) Deployments' spec.replicas
    errors: int  # failed requests at the gateway so far
    failures: dict[str, int]  # what they were
    at: float = field(default_factory=time.time)


@dataclass
class Watched:
    run: Rollout
    samples: list[Sample] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)  # the failures around events the test made
    resumed_at: float | None = None  # time.time() the test unpaused the rollout, where it paused it


def sample(api_client: client.ApiClient, namespace: str, name: str, load: LoadResult) -> Sample:
    apps = client.AppsV1Api(api_client)
    replicas = []
    for track in ("baseline", "canary"):
        found = apps.list_namespaced_deployment(
            namespace, field_selector=f"metadata.name={name}-{track}"
        ).items
        replicas.append(int(found[0].spec.replicas) if found else 0)
    routes = cast(
        dict[str, Any],
        client.CustomObjectsApi(api_client).list_namespaced_custom_object(
            GROUP, VERSION, namespace, "httproutes"
        ),
    )["items"]
    weights = None
    if routes:
        refs = {ref["name"]: ref.get("weight", 1) for ref in routes[0]["spec"]["rules"][0]["backendRefs"]}
        # Relative weights (the Ready pods, issue 57) as the percent split they make.
        split = shares(refs[f"{name}-baseline"], refs[f"{name}-canary"])
        weights = None if split is None else split.pair
    return Sample(weights, (replicas[0], replicas[1]), load.errors, dict(load.failures))


def settled_and_routed(obj: dict[str, Any]) -> bool:
    """Settled, and the route carries what specgate set: Promoted (or RolledBack) is entered once
    the canary (or the baseline) is Ready at full size; the other track's last pods go once the
    Gateway accepted the weights that no longer send it traffic."""
    return obj.get("status", {}).get("phase") in SETTLED and routed(obj)


def routed(obj: dict[str, Any]) -> bool:
    """The Gateways accepted the weights specgate wants (status.traffic)."""
    traffic = obj.get("status", {}).get("traffic") or {}
    return traffic.get("desired") is not None and traffic.get("actual") == traffic.get("desired")


@dataclass
class Scene:
    """What a fault acts on: the rollout's object, its namespace, and the load through the gateway."""

    api_client: client.ApiClient
    namespace: str
    name: str
    load: LoadResult
    monitor: CapacityMonitor
    crash_flag: Path  # while it exists, every canary engine started exits at once (SPECGATE_SIM_EXIT)


class Fault:
    """A fault a rollout through the gateway goes on past its end for; `until` drives it from
    run_rollout's poll (every 2 s) and says when the rollout is over."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.window: Window | None = None
        self.resumed_at: float | None = None

    def until(self, obj: dict[str, Any]) -> bool:
        raise NotImplementedError

    def window_over(self, poll: Poll[Any]) -> bool:
        """The window ends QUIET_SECONDS after the repair and the last failure, or at its timeout."""
        window, failed_at = self.window, self.scene.load.failed_at
        assert window is not None
        if window.ended_at is not None:
            return True
        now = time.monotonic()
        over = now - window.made_at >= WINDOW_TIMEOUT_SECONDS or (
            window.repaired_at is not None and now - window.quiet_since(failed_at) >= QUIET_SECONDS
        )
        if over:
            poll.stop()
            window.end(failed_at)
        return over


class RouteDeletedWhilePromoted(Fault):
    """Promoted, the Gateway routing all to the canary: someone deletes the owned HTTPRoute (as
    `kubectl delete httproute` would); the operator applies it again on a reconcile (RouteRepaired)."""

    def __init__(self, scene: Scene) -> None:
        super().__init__(scene)
        self.poll: Poll[RouteState | None] | None = None
        self.deleted: str | None = None  # the deleted route's uid

    def until(self, obj: dict[str, Any]) -> bool:
        scene = self.scene
        if self.window is None:
            if obj.get("status", {}).get("phase") != "Promoted" or not routed(obj):
                return False
            state = route_state(scene.api_client, scene.namespace, scene.name)
            assert state is not None, "Promoted and routed without a route"
            self.deleted = state.uid
            self.poll = Poll(lambda: route_state(scene.api_client, scene.namespace, scene.name)).start()
            made = time.monotonic()
            client.CustomObjectsApi(scene.api_client).delete_namespaced_custom_object(
                GROUP, VERSION, scene.namespace, "httproutes", scene.name
            )
            self.window = Window("owned route deleted while Promoted", made, event_at=made)
            return False
        assert self.poll is not None
        if self.window.repaired_at is None:
            self.window.repaired_at = self.poll.first(
                lambda state: state is not None and state.uid != self.deleted, after=self.window.made_at
            )
        # Over once the Gateway accepted the repaired route again, as the test reads the status.
        return self.window_over(self.poll) and routed(obj)


class CanaryNotReadyWhilePaused(Fault):
    """Routed to the canary (Canary or Analyzing): the rollout is paused (spec.rollout.paused), then
    the canary's only engine is killed and crash-loops (SPECGATE_SIM_EXIT while crash_flag exists),
    so its pod turns NotReady (the bridge follows the engine's /health, as a readinessProbe). Paused,
    the operator moves the weight away from the canary. Then the flag goes, the engine starts again,
    Ready, and the rollout is unpaused to finish as it would have."""

    def __init__(self, scene: Scene) -> None:
        super().__init__(scene)
        self.state = "routing"
        self.ready: Poll[int] | None = None
        self.route: Poll[RouteState | None] | None = None
        self.waited_since = time.monotonic()

    def canary_ready(self) -> int:
        pods = live_pods(self.scene.api_client, self.scene.namespace, self.scene.name, Track.CANARY)
        return sum(
            any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])) for p in pods
        )

    def canary_weight(self, state: RouteState | None) -> int | None:
        return None if state is None else state.weights.get(f"{self.scene.name}-canary", 0)

    def until(self, obj: dict[str, Any]) -> bool:
        scene, status = self.scene, obj.get("status", {})
        phase = status.get("phase")
        if self.state == "routing":
            desired = (status.get("traffic") or {}).get("desired") or {}
            if phase in ("Canary", "Analyzing") and routed(obj) and desired.get("canary", 0) > 0:
                patch_rollout(scene.api_client, scene.namespace, scene.name, {"rollout": {"paused": True}})
                self.state = "pausing"
            return False
        if self.state == "pausing":
            assert phase in ("Canary", "Analyzing", "Paused"), f"{phase} before the pause took: {status}"
            if phase == "Paused":
                self.kill_the_canary()
                self.state = "faulted"
            return False
        if self.state == "faulted":
            window, ready, route = self.window, self.ready, self.route
            assert window is not None and ready is not None and route is not None
            window.event_at = window.event_at or ready.first(lambda n: n == 0, after=window.made_at)
            if window.event_at is not None and window.repaired_at is None:
                window.repaired_at = route.first(
                    lambda state: self.canary_weight(state) == 0, after=window.made_at
                )
            if self.window_over(route):
                ready.stop()
                scene.crash_flag.unlink()  # the engine's next start serves again
                self.state, self.waited_since = "recovering", time.monotonic()
            return False
        if self.state == "recovering":
            if self.canary_ready() == 0:
                assert time.monotonic() - self.waited_since < 90, "the canary's engine did not come back"
                return False
            patch_rollout(scene.api_client, scene.namespace, scene.name, {"rollout": {"paused": False}})
            self.resumed_at, self.state = time.time(), "resumed"
            return False
        return phase != "Paused" and settled_and_routed(obj)

    def kill_the_canary(self) -> None:
        scene = self.scene
        state = json.loads((CACHE / "cluster" / "bridge-state.json").read_text())
        canary = [
            (key, engine)
            for key, engine in state.items()
            if key.startswith(f"{scene.namespace}/")
            and engine["labels"].get(LABEL_TRACK) == Track.CANARY.value
        ]
        assert len(canary) == CANARY, canary
        key, engine = canary[0]
        self.ready = Poll(self.canary_ready).start()
        self.route = Poll(lambda: route_state(scene.api_client, scene.namespace, scene.name)).start()
        scene.crash_flag.touch()  # every canary engine started from now on exits at once
        scene.monitor.fault(scene.name, key.split("/", 1)[1])  # the test's fault, not a rollout's
        made = time.monotonic()
        os.kill(engine["pid"], signal.SIGKILL)
        self.window = Window("canary NotReady while Paused", made)


def gateway_rollout(
    lab: dict[str, Any],
    name: str,
    alpha: str,
    fault: Callable[[Scene], Fault] | None = None,
    **traffic: Any,
) -> Watched:
    """A rollout of REPLICAS simulated engines at `alpha`, routed by Traefik, load through it;
    with a `fault`, it goes on as the fault says (Fault.until) instead of ending once settled."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    crash_flag = lab["log_dir"] / "crash"
    env = {"SPECGATE_SIM_ALPHA": alpha, "SPECGATE_SIM_EXIT": f"speculative-if:{crash_flag}"}
    body = sim_rollout(name, env, traffic={**ROUTE, **traffic})
    body["spec"]["replicas"] = REPLICAS
    body["spec"]["rollout"]["canaryReplicas"] = CANARY
    load = LoadResult()
    samples: list[Sample] = []
    node = f"gw-{namespace}"
    log = lab["log_dir"] / "traefik.log"
    monitor = CapacityMonitor(api_client, namespace)
    made = fault(Scene(api_client, namespace, name, load, monitor, crash_flag)) if fault else None
    with gateway_lab(api_client, lab["kubeconfig"], namespace, node, REPLICAS + 1, log) as port:
        pin_to_node(body, node, namespace)
        run = run_rollout(
            body=body,
            until=made.until if made else settled_and_routed,
            load_url=f"http://127.0.0.1:{port}",
            load_result=load,
            during=lambda _: samples.append(sample(api_client, namespace, name, load)),
            monitor=monitor,
            **lab,
        )
    windows = [made.window] if made and made.window else []
    return Watched(run, samples, windows, made.resumed_at if made else None)


rollouts = side_by_side(
    {
        "promote": lambda lab: gateway_rollout(lab, "viagw", "0.8", RouteDeletedWhilePromoted),
        "rollback": lambda lab: gateway_rollout(lab, "backgw", "0.3", CanaryNotReadyWhilePaused),
        "initial": lambda lab: gateway_rollout(lab, "smallgw", "0.8", initialCanaryWeight=INITIAL),
    }
)


def requests_by_track(prometheus_url: str, namespace: str, start: float, end: float) -> dict[str, float]:
    """Requests each track's engines finished between start and end, from their own counters."""
    promql = (
        f'sum by (specgate_dev_track) (increase(vllm:request_success_total{{namespace="{namespace}"}}'
        f"[{round(end - start)}s]))"
    )
    query = urllib.parse.urlencode({"query": promql, "time": end})
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/query?{query}", timeout=10) as resp:
        result = json.load(resp)["data"]["result"]
    return {r["metric"]["specgate_dev_track"]: float(r["value"][1]) for r in result}


def check_no_request_failed_once_routed(watched: Watched) -> None:
    """From the first poll where the route gave the canary weight (before, the gateway answers 404
    or 503 while it has no route or no endpoint yet) to the end, no request failed at the gateway:
    none was sent to a pod that had gone (502, 503, a refused connection), none was cut in flight;
    those in the window of a fault the test made are its own (check_window bounds them)."""
    samples = watched.samples
    routed = next(s for s in samples if s.weights and s.weights[1] > 0)
    last = samples[-1]
    failed = {kind: n - routed.failures.get(kind, 0) for kind, n in last.failures.items()}
    faults = sum(len(window.failures) for window in watched.windows)
    report(gateway_failed_requests=last.errors - routed.errors - faults)
    assert last.errors - routed.errors == faults, {kind: n for kind, n in failed.items() if n}


def check_window(watched: Watched, event: str) -> Window:
    """The operator repaired the route after the fault, and from the event it reacts to the last
    request failed within REACTION_BOUND_SECONDS; the figures go to the summary."""
    window = next(w for w in watched.windows if w.event == event)
    figures = window.figures()
    report(**{"gateway_window": "", **figures, "bound_s": f"{REACTION_BOUND_SECONDS:.1f}"})
    assert window.ended_at is not None, figures
    assert window.event_at is not None, f"the event was not seen: {figures}"
    assert window.repaired_at is not None, f"the operator did not move the route: {figures}"
    after = window.after_event()
    assert after is not None and after <= REACTION_BOUND_SECONDS, figures
    return window


def test_a_rollout_through_the_gateway_splits_by_load_matched_weight_and_promotes(rollouts: Rollouts) -> None:
    lab, watched = rollouts["promote"].result()
    status = watched.run.status
    assert settled_as(status) == ("Promoted", "Promoted"), status.get("message")
    traffic = status["traffic"]
    assert traffic["route"] == "viagw"
    assert traffic["desired"] == traffic["actual"] == {"baseline": 0, "canary": 100}
    # While the canary was analysed, its weight was its share of Ready pods, and the engines' own
    # counters show the gateway sent it that share: from the first poll that saw that weight written
    # (a reconcile after the canary's pod was Ready) and one more for Traefik to take it up.
    weighted = CANARY * 100 // REPLICAS
    start = next(s.at for s in watched.samples if s.weights and s.weights[1] == weighted) + 2
    end = history_time(status, "Promoting").timestamp()
    counted = requests_by_track(lab["prometheus_url"], lab["namespace"], start, end)
    share = counted.get("canary", 0.0) / sum(counted.values())
    report(
        gateway_canary_share=f"{share:.3f}",
        gateway_weight=f"{CANARY / REPLICAS:.3f}",
        requests=f"{sum(counted.values()):.0f}",
    )
    assert abs(share - CANARY / REPLICAS) <= 0.03, counted
    check_no_request_failed_once_routed(watched)
    assert watched.run.load is not None and watched.run.load.requests > 0


def test_the_owned_route_deleted_while_promoted_is_repaired_within_two_reconciles(rollouts: Rollouts) -> None:
    """Someone deletes the owned HTTPRoute of the promoted rollout above: the gateway answers 404
    until the operator applies the route again, at most two reconcile intervals and Traefik's
    propagation after the deletion."""
    lab, watched = rollouts["promote"].result()
    check_window(watched, "owned route deleted while Promoted")
    events = client.CoreV1Api(lab["api_client"]).list_namespaced_event(lab["namespace"]).items
    assert any(e.reason == "RouteRepaired" for e in events), sorted({str(e.reason) for e in events})


def test_a_rollback_through_the_gateway_moves_the_weight_before_the_canary_goes(rollouts: Rollouts) -> None:
    _, watched = rollouts["rollback"].result()
    status = watched.run.status
    assert settled_as(status) == ("RolledBack", "AcceptanceBelowGate"), status.get("message")
    assert status["traffic"]["actual"] == {"baseline": 100, "canary": 0}
    # The canary Deployment lost its pod only once the route gave the canary no weight (once the
    # rollout was resumed after the pause below).
    assert watched.resumed_at is not None
    after = [s for s in watched.samples if s.at > watched.resumed_at]
    served = next(i for i, s in enumerate(after) if s.replicas[1] >= CANARY)
    gone = next(i for i, s in enumerate(after) if i > served and s.replicas[1] < CANARY)
    assert any(s.weights == (100, 0) for s in after[: gone + 1]), after[: gone + 1]
    check_no_request_failed_once_routed(watched)


def test_the_canary_going_not_ready_while_paused_loses_its_weight_within_two_reconciles(
    rollouts: Rollouts,
) -> None:
    """Paused while the canary has its weight, the canary's pod goes NotReady (its engine killed,
    crash-looping): its share fails (refused, then 503 with no endpoint) until the operator moves
    the weight to the baseline, at most two reconcile intervals and Traefik's propagation after the
    pod turned NotReady. (Before that, the probe's own delay: as under any router.)"""
    _, watched = rollouts["rollback"].result()
    window = check_window(watched, "canary NotReady while Paused")
    assert window.failures, "killing the canary's engine failed no request: the fault did not happen"


def test_a_small_first_step_routes_its_weight_then_the_load_matched_one(rollouts: Rollouts) -> None:
    """initialCanaryWeight: the canary surges beside the 4 baseline pods at 10 % while alpha alone is
    judged, then gets its load-matched 25 % (the baseline back to 3) for the full analysis, and
    promotes; the engines' counters show each weight's split."""
    lab, watched = rollouts["initial"].result()
    status = watched.run.status
    assert settled_as(status) == ("Promoted", "Promoted"), status.get("message")
    initial = [s for s in watched.samples if s.weights == (100 - INITIAL, INITIAL)]
    assert initial and all(s.replicas == (REPLICAS, CANARY) for s in initial), watched.samples
    passed = api.parse_time(status["initialStepPassed"])
    assert passed is not None
    weighted = CANARY * 100 // REPLICAS
    steps = {
        "initial": (initial[0].at + 2, passed.timestamp(), INITIAL / 100),
        "load_matched": (
            next(s.at for s in watched.samples if s.weights and s.weights[1] == weighted) + 2,
            history_time(status, "Promoting").timestamp(),
            CANARY / REPLICAS,
        ),
    }
    for step, (start, end, weight) in steps.items():
        counted = requests_by_track(lab["prometheus_url"], lab["namespace"], start, end)
        share = counted.get("canary", 0.0) / sum(counted.values())
        report(
            **{
                f"gateway_{step}_share": f"{share:.3f}",
                f"gateway_{step}_requests": f"{sum(counted.values()):.0f}",
            }
        )
        assert abs(share - weight) <= 0.03, (step, counted)
    check_no_request_failed_once_routed(watched)
