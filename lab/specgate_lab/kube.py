"""The lab's Kubernetes helpers that the demo and the cluster tests share: waiting on the API server,
and fake GPU nodes (kwok) of a rollout's own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

FAKE_NODE_TAINT = "specgate.dev/test-node"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
    """Poll until predicate() is truthy (an object not found yet counts as not yet, as does a poll
    the API server answers 5xx, or whose answer it cut off mid-body: a loaded lab's watch cache
    answers a LIST 504 "Too large resource version" while it catches up); fail with what was
    awaited. AssertionError: the cluster tests catch it to add what they saw."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except ApiException as exc:
            if exc.status != 404 and exc.status < 500:
                raise
            last_error = exc
        except urllib3.exceptions.ProtocolError as cut:  # IncompleteRead: the next poll reads again
            last_error = cut
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} ({last_error or 'no match'})")


def create_fake_gpu_node(
    api_client: client.ApiClient, name: str, gpus: int, taint: str, pod_cidr: str | None = None
) -> str:
    """A kwok node with `gpus` GPUs that only pods tolerating `taint` (see pin_to_node) may use,
    once Ready; kwok gives its pods addresses from `pod_cidr` where set (specgate_lab.gateway)."""
    core = client.CoreV1Api(api_client)
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": str(gpus)}
    core.create_node(
        client.V1Node(
            metadata=client.V1ObjectMeta(
                name=name,
                annotations={"kwok.x-k8s.io/node": "fake"},
                labels={"kubernetes.io/hostname": name, "type": "kwok"},
            ),
            spec=client.V1NodeSpec(
                taints=[client.V1Taint(key=FAKE_NODE_TAINT, value=taint, effect="NoSchedule")],
                pod_cidr=pod_cidr,
                pod_cidrs=[pod_cidr] if pod_cidr else None,
            ),
            status=client.V1NodeStatus(allocatable=capacity, capacity=capacity),
        )
    )
    try:
        wait_for(lambda: _ready(core.read_node(name)), 60, f"node {name} Ready")
    except BaseException:
        core.delete_node(name)
        raise
    return name


def _ready(node: client.V1Node) -> bool:
    conditions = node.status.conditions if node.status else None
    return any(c.type == "Ready" and c.status == "True" for c in conditions or [])


@contextmanager
def fake_gpu_node(
    api_client: client.ApiClient, name: str, gpus: int, taint: str, pod_cidr: str | None = None
) -> Iterator[str]:
    """create_fake_gpu_node, deleted afterwards."""
    create_fake_gpu_node(api_client, name, gpus, taint, pod_cidr)
    try:
        yield name
    finally:
        client.CoreV1Api(api_client).delete_node(name)


def pin_to_node(body: dict[str, Any], node: str, taint: str) -> None:
    """Schedule the object's pods on the fake_gpu_node `node` only."""
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    toleration = {"key": FAKE_NODE_TAINT, "operator": "Equal", "value": taint, "effect": "NoSchedule"}
    body["spec"]["tolerations"].append(toleration)
