"""Rollouts through a real gateway (issue 41): router GatewayAPI, Traefik splitting the HTTPRoute
specgate writes between the tracks' Services, simulated engines on pod addresses the gateway
reaches (specgate_lab.gateway). The split is measured from the engines' own request counters;
the load goes through the gateway only, so a request the gateway sends to a pod that is gone fails
at the client, as does a stream cut in flight (the lab's Traefik is built without the race that
cuts some of them anyway: hack/build-binaries.sh).

Needs `make gateway` and root (the pod range's route)."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from tests.cluster.conftest import Rollouts, side_by_side
from tests.cluster.gateway import GATEWAY, GROUP, LISTENER, VERSION, gateway_lab
from tests.cluster.rollouts import (
    SETTLED,
    Rollout,
    history_time,
    pin_to_node,
    report,
    run_rollout,
    settled_as,
    sim_rollout,
)

from specgate import api
from specgate.traffic import shares
from specgate_lab.loadgen import LoadResult

pytestmark = [pytest.mark.cluster, pytest.mark.gateway]

REPLICAS, CANARY = 4, 1  # load-matched: the canary's weight is 25 while 3 baseline pods serve beside it
INITIAL = 10  # traffic.initialCanaryWeight of the rollout that starts small
ROUTE = {"router": "GatewayAPI", "httpRoute": {"parentRefs": [{"name": GATEWAY, "sectionName": LISTENER}]}}


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
    failed_at_gateway: list[str] = field(default_factory=list)  # Traefik's access log, status >= 500


def gateway_5xx_lines(access_log: Path) -> list[str]:
    """The requests Traefik answered 5xx (or passed on a backend's 5xx), as when, which service
    and which server: where a failure came from, for the assertion's message."""
    lines = access_log.read_text().splitlines() if access_log.exists() else []
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    return [
        f"{e.get('StartUTC')} {e.get('DownstreamStatus')} {e.get('ServiceName')} {e.get('ServiceAddr', '-')}"
        for e in entries
        if int(e.get("DownstreamStatus", 0)) >= 500
    ]


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
    """Settled, the route carries what specgate set, and the other track's last pods are gone:
    Promoted (or RolledBack) is entered once the canary (or the baseline) is Ready at full size;
    the other track's last pods go traffic.scaleDownDelay after the Gateway accepted the weights
    that no longer send it traffic (status.replicas counts both tracks' pods)."""
    status = obj.get("status", {})
    traffic = status.get("traffic") or {}
    routed = traffic.get("desired") is not None and traffic.get("actual") == traffic.get("desired")
    alone = status.get("replicas") == obj["spec"]["replicas"]
    return status.get("phase") in SETTLED and routed and alone


def gateway_rollout(lab: dict[str, Any], name: str, alpha: str, **traffic: Any) -> Watched:
    """A rollout of REPLICAS simulated engines at `alpha`, routed by Traefik, load through it."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    body = sim_rollout(name, {"SPECGATE_SIM_ALPHA": alpha}, traffic={**ROUTE, **traffic})
    body["spec"]["replicas"] = REPLICAS
    body["spec"]["rollout"]["canaryReplicas"] = CANARY
    load = LoadResult()
    samples: list[Sample] = []
    node = f"gw-{namespace}"
    log = lab["log_dir"] / "traefik.log"
    with gateway_lab(api_client, lab["kubeconfig"], namespace, node, REPLICAS + 1, log) as port:
        pin_to_node(body, node, namespace)
        run = run_rollout(
            body=body,
            until=settled_and_routed,
            load_url=f"http://127.0.0.1:{port}",
            load_result=load,
            during=lambda _: samples.append(sample(api_client, namespace, name, load)),
            **lab,
        )
    return Watched(run, samples, gateway_5xx_lines(log.with_name("traefik-access.log")))


rollouts = side_by_side(
    {
        "promote": lambda lab: gateway_rollout(lab, "viagw", "0.8"),
        "rollback": lambda lab: gateway_rollout(lab, "backgw", "0.3"),
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
    none was sent to a pod that had gone (502, 503, a refused connection), none was cut in flight."""
    samples = watched.samples
    routed = next(s for s in samples if s.weights and s.weights[1] > 0)
    last = samples[-1]
    failed = {kind: n - routed.failures.get(kind, 0) for kind, n in last.failures.items()}
    report(gateway_failed_requests=last.errors - routed.errors)
    around = [s for s in samples if s.at >= routed.at]
    assert last.errors == routed.errors, (
        {kind: n for kind, n in failed.items() if n},
        watched.failed_at_gateway,
        around,
    )


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
