"""Rollouts through a real gateway (issue 41): router GatewayAPI, Traefik splitting the HTTPRoute
specgate writes between the tracks' Services, simulated engines on pod addresses the gateway
reaches (specgate_lab.gateway). The split is measured from the engines' own request counters;
the load goes through the gateway only, so a request the gateway sends to a pod that is gone fails
at the client, as does a stream cut in flight (the lab's Traefik is built without the race that
cuts some of them anyway: hack/build-binaries.sh).

Needs `make gateway` and root (the pod range's route)."""

from __future__ import annotations

import json
import os
import signal
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.cluster.conftest import CACHE, Rollouts, side_by_side
from tests.cluster.gateway import GROUP, VERSION
from tests.cluster.gateway_rollouts import (
    CANARY,
    REPLICAS,
    Fault,
    check_no_request_failed_once_routed,
    check_recovered_in_time,
    gateway_rollout,
    settled_and_routed,
)
from tests.cluster.rollouts import history_time, patch_rollout, report, settled_as

from specgate import api
from specgate.render import LABEL_TRACK

pytestmark = [pytest.mark.cluster, pytest.mark.gateway]

INITIAL = 10  # traffic.initialCanaryWeight of the rollout that starts small


@dataclass
class RouteDeletion(Fault):
    """Sequence 2: once promoted and routed, someone deletes the owned HTTPRoute; recovered once
    specgate has written it again (another uid) and its Gateway accepted the weights."""

    deleted_uid: str | None = None

    def route(self) -> dict[str, Any] | None:
        try:
            return cast(
                dict[str, Any],
                client.CustomObjectsApi(self.api_client).get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "httproutes", self.name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def cause(self, obj: dict[str, Any]) -> bool:
        route = self.route() if settled_and_routed(obj) else None
        if route is None:
            return False
        self.deleted_uid = route["metadata"]["uid"]
        client.CustomObjectsApi(self.api_client).delete_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "httproutes", self.name
        )
        return True

    def recovered(self, obj: dict[str, Any]) -> bool:
        route = self.route()
        return route is not None and route["metadata"]["uid"] != self.deleted_uid and settled_and_routed(obj)


@dataclass
class CanaryLostWhilePaused(Fault):
    """Sequence 6: analysed at its load-matched weight, the rollout is paused; then the canary's
    engine dies for good (SIGKILL, and every canary engine started after it exits at once), so its
    pod goes NotReady; recovered once the route gives the canary nothing, accepted, still paused."""

    crash_flag: Path = Path()
    paused: bool = False

    def engine_env(self, log_dir: Path) -> dict[str, str]:
        """Canary engines started once the flag exists exit at once."""
        self.crash_flag = log_dir / "canary-exits"
        return {"SPECGATE_SIM_EXIT": f"speculative-if:{self.crash_flag}"}

    def cause(self, obj: dict[str, Any]) -> bool:
        status = obj.get("status", {})
        traffic = status.get("traffic") or {}
        if not self.paused:
            desired = traffic.get("desired") or {}
            if (
                status.get("phase") == "Analyzing"
                and desired.get("canary")
                and traffic.get("actual") == desired
            ):
                patch_rollout(self.api_client, self.namespace, self.name, {"rollout": {"paused": True}})
                self.paused = True
            return False
        if status.get("phase") != "Paused":
            return False
        self.crash_flag.touch()
        state = json.loads((CACHE / "cluster" / "bridge-state.json").read_text())
        for key, engine in state.items():
            if key.startswith(f"{self.namespace}/") and engine["labels"].get(LABEL_TRACK) == "canary":
                os.kill(engine["pid"], signal.SIGKILL)
        return True

    def recovered(self, obj: dict[str, Any]) -> bool:
        status = obj.get("status", {})
        traffic = status.get("traffic") or {}
        away = (traffic.get("desired") or {}).get("canary") == 0 and traffic.get("actual") == traffic[
            "desired"
        ]
        return status.get("phase") == "Paused" and away


rollouts = side_by_side(
    {
        "promote": lambda lab: gateway_rollout(lab, "viagw", "0.8", RouteDeletion),
        "rollback": lambda lab: gateway_rollout(lab, "backgw", "0.3"),
        "initial": lambda lab: gateway_rollout(lab, "smallgw", "0.8", initialCanaryWeight=INITIAL),
        # maxUnavailable 1: the canary's pod lost while paused leaves the baseline's 3 at the floor
        "paused": lambda lab: gateway_rollout(
            lab, "pausegw", "0.8", CanaryLostWhilePaused, {"maxUnavailable": 1}
        ),
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


def test_an_owned_route_deleted_while_promoted_is_written_again_within_two_reconciles(
    rollouts: Rollouts,
) -> None:
    """Issue 57, sequence 2 (on 1be5013 the route stayed deleted while the weights stood still: the
    gateway answered 404 for good): the promoted rollout's route, deleted by someone, is written
    again by the next reconciles; requests fail through the gateway only meanwhile."""
    _, watched = rollouts["promote"].result()
    fault = watched.fault
    assert isinstance(fault, RouteDeletion)
    check_recovered_in_time(watched, "route_deleted")
    assert watched.run.status["traffic"]["actual"] == {"baseline": 0, "canary": 100}


def test_paused_the_weight_leaves_a_canary_whose_pod_goes_not_ready(rollouts: Rollouts) -> None:
    """Issue 57, sequence 6 (on 1be5013 a paused route kept the canary's share on a Service without
    endpoints: 503s for as long as the pause lasted): the canary's engine dies while paused, and
    the route gives its weight to the baseline within two reconciles, still paused."""
    _, watched = rollouts["paused"].result()
    fault = watched.fault
    assert isinstance(fault, CanaryLostWhilePaused)
    check_no_request_failed_once_routed(watched)
    check_recovered_in_time(watched, "paused_canary_lost")
    status = watched.run.status
    assert status["phase"] == "Paused" and status["traffic"]["actual"] == {"baseline": 100, "canary": 0}
    assert watched.samples[-1].replicas == (REPLICAS - CANARY, CANARY)  # paused: replicas stand still


def test_a_rollback_through_the_gateway_moves_the_weight_before_the_canary_goes(rollouts: Rollouts) -> None:
    _, watched = rollouts["rollback"].result()
    status = watched.run.status
    assert settled_as(status) == ("RolledBack", "AcceptanceBelowGate"), status.get("message")
    assert status["traffic"]["actual"] == {"baseline": 100, "canary": 0}
    # The canary Deployment lost its pod only once the route gave the canary no weight.
    served = next(i for i, s in enumerate(watched.samples) if s.replicas[1] >= CANARY)
    gone = next(i for i, s in enumerate(watched.samples) if i > served and s.replicas[1] < CANARY)
    assert any(s.weights == (100, 0) for s in watched.samples[: gone + 1]), watched.samples[: gone + 1]
    check_no_request_failed_once_routed(watched)


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
