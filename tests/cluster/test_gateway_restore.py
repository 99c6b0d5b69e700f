"""traffic.existingRoute through the lab's Traefik (issues 41, 57): the operator leaves a rule of the
user's HTTPRoute alone while no baseline pod is Ready (its backends carry the traffic: specgate's
would answer 503), then takes it over, records its backendRefs, and puts them back when the router
goes back to Service and when the object is deleted (kopf's delete handler), by JSON patches the API
server applies with their test ops. A request loop through the gateway on that rule, from before the
first apply to after the deletion, counts every request that failed: none may (every route change
here is one the operator makes). Needs `make gateway` and root (the pod range's route)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.conftest import CACHE
from tests.cluster.figures import report
from tests.cluster.gateway import GATEWAY, GROUP, PROPAGATION_SECONDS, VERSION, gateway_lab, get
from tests.cluster.operator_process import (
    OPERATOR_INTERVAL_SECONDS,
    create_sd,
    custom_objects,
    get_sd,
    operator_process,
    sd_gone,
    wait_for,
)
from tests.cluster.rollouts import Load
from tests.conftest import ROOT, tiny

from specgate import api
from specgate.render import HTTP_PORT, LABEL_ENGINE, LABEL_TRACK
from specgate_lab.bridge import ENGINE_ANNOTATION
from specgate_lab.kube import FAKE_NODE_TAINT, pin_to_node
from specgate_lab.loadgen import LoadResult

pytestmark = [pytest.mark.cluster, pytest.mark.gateway, pytest.mark.usefixtures("crd")]

EXISTING = {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleName": "completions"}}
TRACKS = ["tiny-baseline", "tiny-canary"]
SUCCESS = "vllm:request_success_total{"
SERVED = "tiny"  # the sample's servedName: the user's engine serves the same model name
MIN_SERVED = 10  # requests the tracks serve through the gateway each time they have the rule
AFTER_DELETION_SECONDS = 8  # the load goes on while the tracks' pods go (their preStop is 5 s)


def user_route() -> dict[str, Any]:
    """The user's route on the lab's Gateway: /health and /v1 to their own vLLM, Service vllm; the
    rule `completions` is the one specgate is given."""
    rules = [
        {
            "name": "health",
            "matches": [{"path": {"type": "PathPrefix", "value": "/health"}}],
            "backendRefs": [{"name": "vllm", "port": HTTP_PORT}],
        },
        {
            "name": "completions",
            "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
            "backendRefs": [{"name": "vllm", "port": HTTP_PORT}],
        },
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HTTPRoute",
        "metadata": {"name": "chat"},
        "spec": {"parentRefs": [{"name": GATEWAY}], "rules": rules},
    }


def users_engine(api_client: client.ApiClient, namespace: str, node: str) -> None:
    """The vLLM the user served before specgate: Service vllm and a Deployment of one simulated
    engine on the gateway's node (the bridge runs it on its pod's address, where Traefik reaches it)."""
    labels = {"app": "vllm", LABEL_ENGINE: "vllm"}  # the bridge runs engines for pods with that label
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.32.0",
        "args": ["specgate/tiny-llama", "--served-model-name", SERVED],
        "ports": [{"name": "http", "containerPort": HTTP_PORT}],
        "env": [{"name": "PYTHONPATH", "value": f"{ROOT / 'lab'}:{ROOT / 'operator'}"}],
    }
    toleration = {"key": FAKE_NODE_TAINT, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}
    template = {
        "metadata": {"labels": labels, "annotations": {ENGINE_ANNOTATION: "sim"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [toleration],
            "containers": [container],
        },
    }
    deployment = {
        "metadata": {"name": "vllm"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vllm"}}, "template": template},
    }
    client.AppsV1Api(api_client).create_namespaced_deployment(namespace, deployment)
    port = {"name": "http", "port": HTTP_PORT, "targetPort": "http"}
    service = {"metadata": {"name": "vllm"}, "spec": {"selector": {"app": "vllm"}, "ports": [port]}}
    client.CoreV1Api(api_client).create_namespaced_service(namespace, service)


def served_by_track(namespace: str) -> dict[str, float]:
    """Requests the tracks' engines finished so far, from each engine's own counter (the bridge's
    state names their addresses): the proof that the gateway's traffic reached specgate's pods."""
    state = json.loads((CACHE / "cluster" / "bridge-state.json").read_text())
    served: dict[str, float] = {}
    for key, engine in state.items():
        track = engine["labels"].get(LABEL_TRACK)
        if not key.startswith(f"{namespace}/") or track is None or not engine["ready"]:
            continue
        status, text = get(f"http://{engine['host']}:{engine['port']}/metrics")
        assert status == 200, (key, status)
        counted = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(SUCCESS)]
        served[track] = served.get(track, 0.0) + sum(float(n) for n in counted)
    return served


def served(namespace: str, more_than: float) -> float | None:
    """What the tracks' engines served, once more than `more_than`."""
    total = sum(served_by_track(namespace).values())
    return total if total > more_than else None


def rules(api_client: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    route = custom_objects(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "httproutes", "chat"
    )
    found: list[dict[str, Any]] = route["spec"]["rules"]
    return found


def backends(api_client: client.ApiClient, namespace: str) -> list[str]:
    return [ref["name"] for ref in rules(api_client, namespace)[1].get("backendRefs") or []]


def reasons(api_client: client.ApiClient, namespace: str) -> list[str]:
    return [e.reason for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items]


def record(api_client: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    traffic = get_sd(api_client, namespace, "tiny")["status"].get("traffic") or {}
    original: dict[str, Any] | None = traffic.get("original")
    return original


def phase(api_client: client.ApiClient, namespace: str) -> str | None:
    status: dict[str, Any] = get_sd(api_client, namespace, "tiny").get("status") or {}
    return status.get("phase")


def set_traffic(api_client: client.ApiClient, namespace: str, traffic: dict[str, Any]) -> None:
    patch = {"spec": {"rollout": {"traffic": traffic}}}
    custom_objects(api_client).patch_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "tiny", patch
    )


def test_the_users_rule_is_put_back_when_the_router_changes_and_on_deletion(
    api_client: client.ApiClient, namespace: str, kubeconfig: str, tmp_path: Path
) -> None:
    node = f"gw-{namespace}"
    objects = custom_objects(api_client)
    load = LoadResult()
    with gateway_lab(api_client, kubeconfig, namespace, node, 4, tmp_path / "traefik.log") as port:
        users_engine(api_client, namespace, node)
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "httproutes", user_route())
        before = rules(api_client, namespace)  # as stored: with the API server's defaults
        url = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: get(f"{url}/v1/models")[0] == 200, 90, "the user's engine answering through the gateway"
        )
        body = tiny()
        body["spec"]["rollout"]["traffic"] = EXISTING
        body["spec"]["podAnnotations"] = {ENGINE_ANNOTATION: "sim"}
        body["spec"]["env"] = [{"name": "PYTHONPATH", "value": f"{ROOT / 'lab'}:{ROOT / 'operator'}"}]
        pin_to_node(body, node, namespace)
        body["spec"]["nodeSelector"] = {"specgate.dev/no-such-node": "true"}  # pods stay Pending at first
        # The user's traffic on the rule, through the gateway, from before the first apply to after
        # the deletion: every route change below is the operator's own, so no request may fail.
        with Load([url], SERVED, concurrency=4, duration=900, results=[load]):
            create_sd(api_client, namespace, body)
            with operator_process(kubeconfig, tmp_path / "operator.log", "--namespace", namespace):
                wait_for(lambda: phase(api_client, namespace) == "Baseline", 60, "the rollout to begin")
                time.sleep(5 * OPERATOR_INTERVAL_SECONDS)  # reconciles that could have taken the rule over
                assert backends(api_client, namespace) == ["vllm"], (
                    "the rule was taken over with no pod Ready"
                )
                assert record(api_client, namespace) is None
                # Schedulable on the gateway's node: the baseline's pod becomes Ready and can carry the rule.
                schedulable = {
                    "nodeSelector": {"specgate.dev/no-such-node": None, "kubernetes.io/hostname": node}
                }
                objects.patch_namespaced_custom_object(
                    api.GROUP, api.VERSION, namespace, api.PLURAL, "tiny", {"spec": schedulable}
                )
                wait_for(
                    lambda: backends(api_client, namespace) == TRACKS, 180, "the rule routed to the tracks"
                )
                original = wait_for(lambda: record(api_client, namespace), 30, "the rule's record in status")
                assert original["backendRefs"] == before[1]["backendRefs"], original
                # The gateway's traffic reaches the tracks (Traefik took the change up) before the switch.
                first = wait_for(lambda: served(namespace, MIN_SERVED), 30, "requests served by the tracks")

                set_traffic(api_client, namespace, {"router": "Service", "existingRoute": None})
                wait_for(
                    lambda: rules(api_client, namespace) == before, 60, "the rule put back (router Service)"
                )
                wait_for(
                    lambda: "traffic" not in get_sd(api_client, namespace, "tiny")["status"], 30, "no record"
                )

                time.sleep(PROPAGATION_SECONDS)  # Traefik took the rule put back up: the tracks serve no more
                between = sum(served_by_track(namespace).values())

                set_traffic(api_client, namespace, EXISTING)
                wait_for(
                    lambda: backends(api_client, namespace) == TRACKS,
                    60,
                    "the rule routed to the tracks again",
                )
                wait_for(lambda: record(api_client, namespace), 30, "a record again")
                second = wait_for(
                    lambda: served(namespace, between + MIN_SERVED), 30, "more requests served by the tracks"
                )
                objects.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "tiny")
                wait_for(lambda: sd_gone(api_client, namespace, "tiny"), 60, "the object deleted")
            time.sleep(AFTER_DELETION_SECONDS)
    report(
        test="existing_route_through_traefik",
        gateway_requests=load.requests,
        non_2xx=load.errors,
        # The tracks' engines' own count of requests served, cumulative: once the rule was taken
        # over, once put back by the switch to router Service, and before the deletion.
        tracks_served=f"{first:.0f},{between:.0f},{second:.0f}",
    )
    assert load.errors == 0, dict(load.failures)
    assert rules(api_client, namespace) == before
    assert reasons(api_client, namespace).count("RouteRuleRestored") == 2
