"""The lab's bridge runs an engine pod's engine on the pod's own address where this host can bind it
(issue 41): a pod on a node whose podCIDR is in the routed pod range (specgate_lab.gateway) gets
its simulated engine on <pod IP>:8000, the rendered "http" containerPort its EndpointSlice names,
and Prometheus and the bridge's Service router reach it there.

Needs root (the pod range's route); no gateway, but marked `gateway` with the tests that need it."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.conftest import CACHE
from tests.cluster.gateway import get, pod_cidr, route_pod_range
from tests.cluster.operator_process import wait_for
from tests.cluster.rollouts import fake_gpu_node, pin_to_node, sim_rollout

from specgate import api, render
from specgate.render import Owner, Track
from specgate.vllm_metrics import NUM_REQUESTS_RUNNING, SPEC_DECODE_NUM_DRAFT_TOKENS

pytestmark = [pytest.mark.cluster, pytest.mark.gateway]

NAME = "podaddr"
POD = f"{NAME}-0"
ENGINE_PORT = 8000  # render's HTTP_PORT, the containerPort named "http"


def engine_pod(namespace: str, node: str) -> dict[str, Any]:
    """A bare Pod of the canary's rendered template for a simulated tiny model, pinned to `node`
    (no Deployment: its owner would be a SpeculativeDeployment that does not exist)."""
    body = sim_rollout(NAME, {})
    pin_to_node(body, node, namespace)
    owner = Owner(NAME, namespace, "no-uid")
    template = render.deployment(api.parse_spec(body["spec"]), owner, Track.CANARY, 1)["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, **template["metadata"]},
        "spec": template["spec"],
    }


def bridge_state(bridge_url: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(f"{bridge_url}/state", timeout=5) as resp:
        state: dict[str, dict[str, Any]] = json.load(resp)
    return state


def targets(namespace: str) -> list[Path]:
    """The Prometheus file_sd files the bridge wrote for the pod (one, in its interval's directory)."""
    return sorted((CACHE / "cluster" / "targets").glob(f"*/{namespace}_{POD}.json"))


def test_the_bridge_runs_an_engine_on_its_pods_address_and_containerport(
    api_client: client.ApiClient, namespace: str, bridge_url: str, prometheus_url: str
) -> None:
    core = client.CoreV1Api(api_client)
    node = f"addr-{namespace}"
    route_pod_range()
    with fake_gpu_node(api_client, node, 1, namespace, pod_cidr=pod_cidr()) as node:
        core.create_namespaced_pod(namespace, engine_pod(namespace, node))

        def ready_ip() -> str | None:
            status = core.read_namespaced_pod(POD, namespace).status
            ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
            return status.pod_ip if ready else None  # the bridge's /health check makes it Ready

        pod_ip: str = wait_for(ready_ip, 60, f"{POD} Ready (its engine's /health answering)")
        address = f"{pod_ip}:{ENGINE_PORT}"
        assert pod_ip.startswith("198.18."), pod_ip
        engine = bridge_state(bridge_url)[f"{namespace}/{POD}"]
        assert (engine["host"], engine["port"]) == (pod_ip, ENGINE_PORT)

        status, metrics = get(f"http://{address}/metrics")
        assert status == 200
        assert NUM_REQUESTS_RUNNING in metrics and SPEC_DECODE_NUM_DRAFT_TOKENS in metrics

        (target,) = targets(namespace)
        assert [group["targets"] for group in json.loads(target.read_text())] == [[address]]

        def scraped() -> bool:
            with urllib.request.urlopen(f"{prometheus_url}/api/v1/targets?state=active", timeout=5) as resp:
                active = json.load(resp)["data"]["activeTargets"]
            return any(t["scrapeUrl"] == f"http://{address}/metrics" and t["health"] == "up" for t in active)

        wait_for(scraped, 60, f"Prometheus scraping {address}")

        # The Service router goes to the pod's address too.
        service = render.service(Owner(NAME, namespace, "no-uid"))
        service["metadata"].pop("ownerReferences")
        core.create_namespaced_service(namespace, service)
        routed = f"{bridge_url}/svc/{namespace}/{NAME}/v1/models"
        wait_for(lambda: get(routed)[0] == 200, 30, f"the bridge routing {routed}")
        with urllib.request.urlopen(routed, timeout=5) as resp:
            assert resp.headers["X-Specgate-Pod"] == POD

        # The engine goes with its pod (before its node and the route do).
        core.delete_namespaced_pod(POD, namespace, grace_period_seconds=0)
        wait_for(
            lambda: POD not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items},
            60,
            f"{POD} gone",
        )
        wait_for(
            lambda: not targets(namespace) and f"{namespace}/{POD}" not in bridge_state(bridge_url),
            30,
            "the engine stopped",
        )
