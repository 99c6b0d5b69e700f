"""The lab's gateway (issue 41): Traefik splits an HTTPRoute's traffic by weight between two Services
whose Pods kwok runs on a node with a local pod CIDR, each pod's address served by a real HTTP
server (specgate_lab.gateway says why the pod range is not 127.0.0.0/8).

Needs `make gateway` (a prerequisite of `make test`) and root for the pod range's route."""

from __future__ import annotations

import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.gateway import (
    CLASS_LABEL,
    GATEWAY,
    GROUP,
    LISTENER,
    VERSION,
    condition,
    gateway_class,
    get,
    install_gateway_api_crds,
    lab_gateway,
    pod_cidr,
    route_parent,
    route_pod_range,
    traefik,
)
from tests.cluster.operator_process import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.gateway]

ENGINE_PORT = 8000  # the pods' containerPort: each server binds it on its own pod's address


class Backend(ThreadingHTTPServer):
    """An HTTP server on a pod's address that answers with its name and counts requests."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.address = address
        self.requests: list[str] = []
        super().__init__((address, ENGINE_PORT), Handler)


class Handler(BaseHTTPRequestHandler):
    server: Backend

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        body = f"{self.server.name} {self.server.address} {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def pod_range() -> str:
    return route_pod_range()


@pytest.fixture
def pod_node(api_client: client.ApiClient, namespace: str, pod_range: str) -> Iterator[str]:
    """A fake node of the test's own, its podCIDR a /24 of the local range, tainted so that only
    this test's pods go there; deleted afterwards."""
    core = client.CoreV1Api(api_client)
    name = f"gateway-{namespace}"
    cidr = pod_cidr()
    resources = {"cpu": "8", "memory": "64Gi", "pods": "110"}
    node = client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={"kwok.x-k8s.io/node": "fake"},
            labels={"kubernetes.io/hostname": name, "type": "kwok", CLASS_LABEL: namespace},
        ),
        spec=client.V1NodeSpec(
            pod_cidr=cidr,
            pod_cidrs=[cidr],
            taints=[client.V1Taint(key=CLASS_LABEL, value=namespace, effect="NoSchedule")],
        ),
        status=client.V1NodeStatus(allocatable=resources, capacity=resources),
    )
    core.create_node(node)
    yield name
    core.delete_node(name)


def engine_pod(api_client: client.ApiClient, namespace: str, node: str, track: str) -> str:
    """A pod of the track on the node, Ready (kwok); its address."""
    core = client.CoreV1Api(api_client)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"{track}-0", labels={"track": track}),
        spec=client.V1PodSpec(
            node_selector={"kubernetes.io/hostname": node},
            tolerations=[client.V1Toleration(key=CLASS_LABEL, operator="Exists", effect="NoSchedule")],
            containers=[
                client.V1Container(
                    name="engine",
                    image="fake",
                    ports=[client.V1ContainerPort(name="http", container_port=ENGINE_PORT)],
                )
            ],
        ),
    )
    core.create_namespaced_pod(namespace, pod)

    def ready_ip() -> str | None:
        status = core.read_namespaced_pod(f"{track}-0", namespace).status
        if status is None or not any(
            c.type == "Ready" and c.status == "True" for c in status.conditions or []
        ):
            return None
        return status.pod_ip

    address: str = wait_for(ready_ip, 60, f"pod {track}-0 Ready with an address")
    return address


def track_service(api_client: client.ApiClient, namespace: str, track: str) -> None:
    port = client.V1ServicePort(name="http", port=80, target_port="http", protocol="TCP")
    spec = client.V1ServiceSpec(selector={"track": track}, ports=[port])
    client.CoreV1Api(api_client).create_namespaced_service(
        namespace, client.V1Service(metadata=client.V1ObjectMeta(name=track), spec=spec)
    )


@pytest.fixture
def backends(api_client: client.ApiClient, namespace: str, pod_node: str) -> Iterator[dict[str, Backend]]:
    """baseline and canary: a Service, a pod and a server on that pod's address, each."""
    servers: dict[str, Backend] = {}
    try:
        for track in ("baseline", "canary"):
            address = engine_pod(api_client, namespace, pod_node, track)
            track_service(api_client, namespace, track)
            servers[track] = Backend(track, address)
            threading.Thread(target=servers[track].serve_forever, daemon=True).start()
        yield servers
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


@pytest.fixture
def gateway(
    api_client: client.ApiClient, kubeconfig: str, kubectl: str, namespace: str, tmp_path: Path
) -> Iterator[tuple[int, Path]]:
    """Traefik for this namespace and a programmed Gateway: its listener's port, and Traefik's log."""
    install_gateway_api_crds(kubeconfig, kubectl)
    log = tmp_path / "traefik.log"
    with traefik(kubeconfig, namespace, log) as port, gateway_class(api_client, namespace) as name:
        lab_gateway(api_client, namespace, name, port)
        yield port, log


def test_traefik_splits_an_httproute_by_weight_between_pods_on_local_addresses(
    api_client: client.ApiClient,
    kubectl: str,
    kubeconfig: str,
    namespace: str,
    backends: dict[str, Backend],
    gateway: tuple[int, Path],
) -> None:
    port, log = gateway
    objects = client.CustomObjectsApi(api_client)
    weights = {"baseline": 3, "canary": 1}
    route = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HTTPRoute",
        "metadata": {"name": "llm"},
        "spec": {
            "parentRefs": [{"name": GATEWAY, "sectionName": LISTENER}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                    "backendRefs": [{"name": t, "port": 80, "weight": w} for t, w in weights.items()],
                }
            ],
        },
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "httproutes", route)

    def both_answer() -> bool:
        return all(server.requests for server in backends.values())

    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        parent = wait_for(
            lambda: route_parent(api_client, namespace, "llm"), 60, "Traefik to write the HTTPRoute's status"
        )
        assert condition(parent, "Accepted") == "True", parent
        assert condition(parent, "ResolvedRefs") == "True", parent
        # Until Traefik has read the EndpointSlices, a request may find no server (503).
        wait_for(lambda: get(url)[0] == 200 and both_answer(), 60, f"both tracks answering at {url}")
    except AssertionError as exc:
        slices = subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig, "-n", namespace, "get", "endpointslices", "-o", "yaml"],
            capture_output=True,
            text=True,
        )
        raise AssertionError(
            f"{exc}\nEndpointSlices:\n{slices.stdout}\nTraefik:\n{log.read_text()[-3000:]}"
        ) from exc

    for server in backends.values():
        server.requests.clear()
    answers = Counter(get(url) for _ in range(200))
    assert {status for status, _ in answers} == {200}, answers
    seen = Counter(body.split()[0] for _, body in answers.elements())
    canary_share = seen["canary"] / 200
    assert abs(canary_share - weights["canary"] / sum(weights.values())) <= 0.03, seen
    # Each answer came from the server on that track's pod address, and each server counted its own.
    for track, server in backends.items():
        assert len(server.requests) == seen[track]
        assert f"{track} {server.address} /v1/completions\n" in {body for _, body in answers}
    # Outside the route's match Traefik answers itself: no server sees the request.
    assert get(f"http://127.0.0.1:{port}/metrics")[0] == 404
    assert sum(len(s.requests) for s in backends.values()) == 200
