"""The local lab itself: real scheduler and controllers, fake GPU nodes, bridge engines, Prometheus."""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.operator_process import wait_for
from tests.cluster.workloads import gpu_deployment

from specgate.vllm_metrics import NUM_REQUESTS_RUNNING
from specgate_lab.bridge import PIN_CPU_ANNOTATION

pytestmark = pytest.mark.cluster

# A pod's engine started by the bridge and scraped once: seconds on a quiet lab, past a minute on a
# slower CI machine with every line running (a CPU hog taking half the cores: over 60 s).
ENGINE_SCRAPED_SECONDS = 180


def prom_query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}") as resp:
        result: list[dict[str, Any]] = json.load(resp)["data"]["result"]
        return result


def prom_targets(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/targets") as resp:
        targets: list[dict[str, Any]] = json.load(resp)["data"]["activeTargets"]
        return targets


def test_gpu_pod_is_scheduled_on_a_fake_gpu_node_and_becomes_ready(
    api_client: client.ApiClient, namespace: str
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, gpu_deployment("one-gpu", 1))
    wait_for(
        lambda: apps.read_namespaced_deployment("one-gpu", namespace).status.ready_replicas == 1, 60, "Ready"
    )
    pod = core.list_namespaced_pod(namespace, label_selector="app=one-gpu").items[0]
    node = core.read_node(pod.spec.node_name)
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert any(t.key == "kwok.x-k8s.io/node" for t in node.spec.taints)


def test_asking_for_more_gpus_than_exist_stays_pending(api_client: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, gpu_deployment("too-big", 9))

    def unschedulable() -> bool:
        events = core.list_namespaced_event(namespace).items
        return any(e.reason == "FailedScheduling" and "nvidia.com/gpu" in (e.message or "") for e in events)

    wait_for(unschedulable, 60, "a FailedScheduling event about nvidia.com/gpu")
    pod = core.list_namespaced_pod(namespace, label_selector="app=too-big").items[0]
    assert pod.status.phase == "Pending" and pod.spec.node_name is None


def test_bridge_engine_is_scraped_with_pod_labels_and_removed_with_the_pod(
    api_client: client.ApiClient, namespace: str, prometheus_url: str, bridge_url: str
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    labels = {
        "specgate.dev/engine": "vllm",
        "specgate.dev/deployment": "demo",
        "specgate.dev/track": "canary",
        "specgate.dev/method": "eagle3",
    }
    spec_config = json.dumps(
        {"method": "eagle3", "model": "specgate/tiny-llama-eagle3", "num_speculative_tokens": 3}
    )
    args = [
        "specgate/tiny-llama",
        "--port",
        "8000",
        "--served-model-name",
        "tiny",
        "--speculative-config",
        spec_config,
    ]
    apps.create_namespaced_deployment(namespace, gpu_deployment("engine", 1, labels, args))
    pod = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector="app=engine").items, 60, "pod")[
        0
    ]
    selector = f'{{namespace="{namespace}",pod="{pod.metadata.name}",specgate_dev_track="canary"}}'
    series = wait_for(
        lambda: prom_query(prometheus_url, f"{NUM_REQUESTS_RUNNING}{selector}"),
        ENGINE_SCRAPED_SECONDS,
        "series",
    )
    assert series[0]["metric"]["specgate_dev_deployment"] == "demo"
    assert series[0]["metric"]["specgate_dev_method"] == "eagle3"

    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)

    def target_gone() -> bool:
        return not any(t["labels"].get("pod") == pod.metadata.name for t in prom_targets(prometheus_url))

    wait_for(target_gone, 60, "the deleted pod's target to leave Prometheus")
    # The Deployment replaces the pod; the bridge serves the new one in its place.
    new_pod = wait_for(
        lambda: [
            p
            for p in core.list_namespaced_pod(namespace, label_selector="app=engine").items
            if p.metadata.name != pod.metadata.name
        ],
        60,
        "the replacement pod",
    )[0]
    new_selector = f'{{namespace="{namespace}",pod="{new_pod.metadata.name}"}}'
    wait_for(
        lambda: prom_query(prometheus_url, f"{NUM_REQUESTS_RUNNING}{new_selector}"),
        ENGINE_SCRAPED_SECONDS,
        "new series",
    )


@pytest.mark.cluster_wide  # which CPU is the fewest pinned engines use depends on every engine running
def test_engines_asking_for_a_pinned_cpu_run_on_the_cpu_fewest_pinned_engines_use(
    api_client: client.ApiClient, namespace: str, bridge_url: str
) -> None:
    """The lab annotation specgate.dev/lab-pin-cpu (the demo's samples): each engine's process is
    pinned to one CPU, a different one for each of two such engines where the bridge has two."""
    apps = client.AppsV1Api(api_client)
    pinned = gpu_deployment(
        "pinned", 1, {"specgate.dev/engine": "vllm"}, replicas=2, annotations={PIN_CPU_ANNOTATION: "true"}
    )
    apps.create_namespaced_deployment(namespace, pinned)

    def engines() -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{bridge_url}/state") as resp:
            state: dict[str, dict[str, Any]] = json.load(resp)
        mine = [e for key, e in state.items() if key.startswith(f"{namespace}/pinned-")]
        return mine if len(mine) == 2 and all(e["ready"] for e in mine) else []

    started = wait_for(engines, 120, "two Ready engines")
    for engine in started:
        allowed = Path(f"/proc/{engine['pid']}/status").read_text().split("Cpus_allowed_list:")[1].split()[0]
        assert allowed == str(engine["cpu"])
    assert len({e["cpu"] for e in started}) == min(2, len(os.sched_getaffinity(0)))


def test_service_router_spreads_traffic_over_ready_pods(
    api_client: client.ApiClient, namespace: str, bridge_url: str
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    args = ["specgate/tiny-llama", "--served-model-name", "tiny"]
    deployment = gpu_deployment("routed", 1, {"specgate.dev/engine": "vllm"}, args, replicas=2)
    apps.create_namespaced_deployment(namespace, deployment)
    core.create_namespaced_service(
        namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="routed"),
            spec=client.V1ServiceSpec(selector={"app": "routed"}, ports=[client.V1ServicePort(port=8000)]),
        ),
    )

    def served_by() -> set[str]:
        pods = set()
        for _ in range(6):
            request = urllib.request.Request(
                f"{bridge_url}/svc/{namespace}/routed/v1/completions",
                data=json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    pods.add(resp.headers["X-Specgate-Pod"])
            except OSError:
                return set()
        return pods

    # Once both engines are Ready, neither may stop being so while they serve traffic.
    with CapacityMonitor(api_client, namespace, floors={"routed": 2}) as monitor:
        assert len(wait_for(lambda: len(served_by()) == 2 and served_by(), 90, "both pods to serve")) == 2
        # The bridge routes to an engine once its own probe passes; the pod's Ready condition reaches
        # the API server a little later (a loaded CI-like run left the block before the monitor saw it).
        monitor.wait_for_floor("routed", 90)
        assert len(served_by()) == 2


def test_garbage_collector_deletes_children_of_a_deleted_owner(
    api_client: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="child", owner_references=[ref]))
    )
    core.delete_namespaced_config_map("owner", namespace)

    def child_gone() -> bool:
        names = [c.metadata.name for c in core.list_namespaced_config_map(namespace).items]
        return "child" not in names

    wait_for(child_gone, 60, "the garbage collector to delete the child")
