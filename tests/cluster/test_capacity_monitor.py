"""The capacity monitor itself (tests/cluster/capacity.py): it must catch the drop it exists for, follow
the floor of a SpeculativeDeployment as its replicas change, and stay quiet through a scale-up. Plain
Deployments whose pods kwok marks Ready; no operator."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.capacity import CapacityMonitor, Timeline, sd_floor
from tests.cluster.operator_process import create_sd, wait_for
from tests.cluster.workloads import gpu_deployment
from tests.conftest import tiny

from specgate import api
from specgate.render import LABEL_TRACK
from specgate_lab.crds import install_crd

pytestmark = pytest.mark.cluster

WEB = "web"


def start_web(api_client: client.ApiClient, namespace: str, replicas: int) -> None:
    """Deployment and Service `web`, not engines: kwok marks their pods Ready. The pods carry a track
    label, as the operator's do."""
    deployment = gpu_deployment(WEB, 1, {LABEL_TRACK: "baseline"})
    deployment.spec.replicas = replicas
    client.AppsV1Api(api_client).create_namespaced_deployment(namespace, deployment)
    spec = client.V1ServiceSpec(selector={"app": WEB}, ports=[client.V1ServicePort(port=8000)])
    service = client.V1Service(metadata=client.V1ObjectMeta(name=WEB), spec=spec)
    client.CoreV1Api(api_client).create_namespaced_service(namespace, service)


def scale_web(api_client: client.ApiClient, namespace: str, monitor: CapacityMonitor, replicas: int) -> None:
    """Scale and wait until the monitor sees that many serving pods."""
    scale = {"spec": {"replicas": replicas}}
    client.AppsV1Api(api_client).patch_namespaced_deployment_scale(WEB, namespace, scale)
    wait_for(lambda: monitor.ready(WEB) == replicas, 60, f"{replicas} serving pods")


def test_a_drop_below_the_floor_fails_with_the_pods_that_went(
    api_client: client.ApiClient, namespace: str
) -> None:
    monitor = CapacityMonitor(api_client, namespace, floors={WEB: 2})
    with pytest.raises(AssertionError) as failure, monitor:
        start_web(api_client, namespace, 2)
        monitor.wait_for_floor(WEB, 60)
        scale_web(api_client, namespace, monitor, 0)
    message = str(failure.value)
    assert f"Service {namespace}/{WEB}: 1 Ready serving pods" in message, message
    assert "of its floor 2" in message and "<-- below the floor" in message, message
    assert re.search(rf"-{WEB}-\S+ \(baseline, (terminating|deleted)\)", message), message
    assert monitor.min_ready(WEB) == 0


def test_a_scale_up_keeps_the_floor(api_client: client.ApiClient, namespace: str) -> None:
    with CapacityMonitor(api_client, namespace, floors={WEB: 2}) as monitor:
        start_web(api_client, namespace, 2)
        monitor.wait_for_floor(WEB, 60)
        scale_web(api_client, namespace, monitor, 3)
    assert monitor.min_ready(WEB) == 2


def test_the_floor_follows_the_objects_replicas(api_client: client.ApiClient, namespace: str) -> None:
    """A SpeculativeDeployment named like the Service sets the floor; lowering its replicas lowers
    the floor at once, so the scale-down that follows is no drop, but going below the new floor is."""
    install_crd(api_client)
    body = tiny(WEB)
    body["spec"]["replicas"] = 2
    objects = client.CustomObjectsApi(api_client)
    monitor = CapacityMonitor(api_client, namespace)
    with pytest.raises(AssertionError) as failure, monitor:
        create_sd(api_client, namespace, body)
        start_web(api_client, namespace, 2)
        monitor.wait_for_floor(WEB, 60)
        patch = {"spec": {"replicas": 1}}
        objects.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, WEB, patch)
        wait_for(lambda: monitor.floor(WEB) == 1, 30, "the floor to follow spec.replicas")
        scale_web(api_client, namespace, monitor, 1)
        scale_web(api_client, namespace, monitor, 0)
    message = str(failure.value)
    assert message.count("Ready serving pods at") == 1, message
    assert f"Service {namespace}/{WEB}: 0 Ready serving pods" in message and "of its floor 1" in message


@pytest.mark.parametrize(
    ("steps", "drops"),
    [
        pytest.param([(1, 2), (0, 2), (1, 2)], 0, id="never-reached"),
        pytest.param([(1, 2), (2, 2), (1, 2), (2, 2), (0, 2)], 2, id="two-drops"),
        pytest.param([(2, 2), (2, 1), (1, 1), (0, 1)], 1, id="scale-down-then-below"),
        pytest.param([(1, 1), (1, 3), (2, 3), (1, 3), (3, 3)], 1, id="scale-up-keeps-what-it-reached"),
        pytest.param([(2, 2), (2, 0), (0, 0)], 0, id="deleted"),
    ],
)
def test_drops_count_once_the_floor_was_reached(steps: list[tuple[int, int]], drops: int) -> None:
    """(serving pods, floor) in order; the drops the timeline finds."""
    timeline = Timeline("t")
    for at, (ready, floor) in enumerate(steps):
        timeline.record(float(at), {f"p{i}": "baseline" for i in range(ready)}, floor, lambda _: "gone")
    assert len(timeline.drops()) == drops


@pytest.mark.parametrize(
    ("spec", "floor"),
    [
        ({}, 1),
        ({"replicas": 4}, 4),
        ({"replicas": 4, "rollout": {"maxUnavailable": 1}}, 3),
        ({"replicas": 1, "rollout": {"maxUnavailable": 2}}, 0),
    ],
)
def test_the_floor_is_replicas_minus_max_unavailable(spec: dict[str, Any], floor: int) -> None:
    assert sd_floor({"metadata": {}, "spec": spec}) == floor
    assert sd_floor({"metadata": {"deletionTimestamp": "2025-01-01T00:00:00Z"}, "spec": spec}) == 0
