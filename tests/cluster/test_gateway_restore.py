"""traffic.existingRoute on the real API server (issues 41, 57): the operator leaves a rule of the
user's HTTPRoute alone while no baseline pod is Ready (its backends carry the traffic: specgate's
would answer 503), then takes it over, records its backendRefs, and puts them back when the router
goes back to Service and when the object is deleted (kopf's delete handler), by JSON patches the API
server applies with their test ops. Needs the Gateway API CRDs (`make gateway`), not Traefik: no
Gateway serves the route."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.gateway import GROUP, VERSION, install_gateway_api_crds
from tests.cluster.operator_process import (
    OPERATOR_INTERVAL_SECONDS,
    create_sd,
    custom_objects,
    get_sd,
    operator_process,
    sd_gone,
    wait_for,
)
from tests.conftest import tiny

from specgate import api

pytestmark = [pytest.mark.cluster, pytest.mark.gateway, pytest.mark.usefixtures("crd")]

EXISTING = {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleName": "completions"}}
TRACKS = ["tiny-baseline", "tiny-canary"]


def user_route() -> dict[str, Any]:
    rules = [
        {"name": "health", "backendRefs": [{"name": "probe", "port": 80}]},
        {"name": "completions", "backendRefs": [{"name": "vllm", "port": 8000}]},
    ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HTTPRoute",
        "metadata": {"name": "chat"},
        "spec": {"parentRefs": [{"name": "lab"}], "rules": rules},
    }


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
    api_client: client.ApiClient, namespace: str, kubeconfig: str, kubectl: str, tmp_path: Path
) -> None:
    install_gateway_api_crds(kubeconfig, kubectl)
    # The Service the user's rule sends to (the operator puts a rule back only on backends that exist).
    service = {"metadata": {"name": "vllm"}, "spec": {"selector": {"app": "vllm"}, "ports": [{"port": 8000}]}}
    client.CoreV1Api(api_client).create_namespaced_service(namespace, service)
    objects = custom_objects(api_client)
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "httproutes", user_route())
    before = rules(api_client, namespace)  # as stored: with the API server's defaults
    body = tiny()
    body["spec"]["rollout"]["traffic"] = EXISTING
    body["spec"]["nodeSelector"] = {"specgate.dev/no-such-node": "true"}  # pods stay Pending at first
    create_sd(api_client, namespace, body)
    with operator_process(kubeconfig, tmp_path / "operator.log", "--namespace", namespace):
        wait_for(lambda: phase(api_client, namespace) == "Baseline", 60, "the rollout to begin")
        time.sleep(5 * OPERATOR_INTERVAL_SECONDS)  # reconciles that could have taken the rule over
        assert backends(api_client, namespace) == ["vllm"], "the rule was taken over with no pod Ready"
        assert record(api_client, namespace) is None
        # Schedulable, on simulated engines: the baseline's pod becomes Ready and can carry the rule.
        sim = {"nodeSelector": None, "podAnnotations": {"specgate.dev/lab-engine": "sim"}}
        objects.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, "tiny", {"spec": sim}
        )
        wait_for(lambda: backends(api_client, namespace) == TRACKS, 180, "the rule routed to the tracks")
        original = wait_for(lambda: record(api_client, namespace), 30, "the rule's record in status")
        assert original["backendRefs"] == before[1]["backendRefs"], original

        set_traffic(api_client, namespace, {"router": "Service", "existingRoute": None})
        wait_for(lambda: rules(api_client, namespace) == before, 60, "the rule put back (router Service)")
        wait_for(lambda: "traffic" not in get_sd(api_client, namespace, "tiny")["status"], 30, "no record")

        set_traffic(api_client, namespace, EXISTING)
        wait_for(lambda: backends(api_client, namespace) == TRACKS, 60, "the rule routed to the tracks again")
        wait_for(lambda: record(api_client, namespace), 30, "a record again")
        objects.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "tiny")
        wait_for(lambda: sd_gone(api_client, namespace, "tiny"), 60, "the object deleted")
    assert rules(api_client, namespace) == before
    assert reasons(api_client, namespace).count("RouteRuleRestored") == 2
