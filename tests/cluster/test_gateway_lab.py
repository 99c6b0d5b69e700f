"""The lab's gateway (issue 41): Traefik v3's kubernetesGateway provider, run against the lab's API
server, splits an HTTPRoute's traffic by weight between two Services whose Pods kwok runs on a node
with a local pod CIDR, each pod's address served by a real HTTP server.

What it shows about the lab: kwok gives a pod an address from its node's spec.podCIDR; the API
server refuses EndpointSlice addresses in 127.0.0.0/8 ("may not be in the loopback range"), so the
pod range is another one that the host routes to lo (a `local` route, as 127/8 has): POD_RANGE.
Traefik reads Services and EndpointSlices (ready endpoints, the slice's port matched to the
Service's by name), never Pods, and needs no kube-proxy.

Needs `make gateway` (Traefik and the Gateway API CRDs, not built by `make binaries` yet) and root
for the route (added here where missing, and removed after); not collected by `make test`: run it
with `make test-gateway` (pytest's `--gateway`)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from tests.cluster.conftest import CACHE
from tests.cluster.operator_process import wait_for
from tests.conftest import tool

pytestmark = [pytest.mark.cluster, pytest.mark.gateway]

TRAEFIK = CACHE / "bin" / "traefik"  # hack/build-binaries.sh gateway
CRDS = CACHE / "crds" / "gateway-api"  # Gateway API's standard channel, pinned there too
GROUP, VERSION = "gateway.networking.k8s.io", "v1"
CONTROLLER = "traefik.io/gateway-controller"  # the controllerName Traefik claims GatewayClasses by
KINDS = ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants", "backendtlspolicies")
# RFC 2544's benchmarking range, unused here and valid in an EndpointSlice, unlike 127.0.0.0/8.
POD_RANGE = "198.18.0.0/16"
ENGINE_PORT = 8000  # the pods' containerPort: each server binds it on its own pod's address
TEST_LABEL = "specgate.dev/gateway-test"


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
def local_pod_range() -> Iterator[str]:
    """POD_RANGE routed to lo, so that a server can bind any address in it and be reached there."""
    shown = subprocess.run(
        ["ip", "route", "show", "table", "local", "exact", POD_RANGE], capture_output=True, text=True
    )
    if shown.returncode == 0 and "dev lo" in shown.stdout:
        yield POD_RANGE
        return
    add = ["ip", "route", "add", "local", POD_RANGE, "dev", "lo"]
    added = subprocess.run(add, capture_output=True, text=True)
    if added.returncode != 0:
        pytest.fail(f"cannot route {POD_RANGE} to lo ({added.stderr.strip()}): as root, `{' '.join(add)}`")
    try:
        yield POD_RANGE
    finally:
        subprocess.run(["ip", "route", "del", "local", POD_RANGE, "dev", "lo"], check=True)


@pytest.fixture(scope="module")
def gateway_api_crds(kubeconfig: str, kubectl: str) -> None:
    """Gateway API's standard CRDs, applied server-side (a no-op where they are) and Established."""
    files = [arg for path in sorted(CRDS.glob("*.yaml")) for arg in ("-f", str(path))]
    if not files:
        pytest.fail(f"{CRDS} holds no CRDs (run `make gateway`)", pytrace=False)
    base = [kubectl, "--kubeconfig", kubeconfig]
    applied = subprocess.run(
        [*base, "apply", "--server-side", "--force-conflicts", *files],
        capture_output=True,
        text=True,
    )
    assert applied.returncode == 0, applied.stderr
    crds = [f"crd/{kind}.{GROUP}" for kind in KINDS]
    established = subprocess.run(
        [*base, "wait", "--for", "condition=Established", "--timeout", "60s", *crds],
        capture_output=True,
        text=True,
    )
    assert established.returncode == 0, established.stderr


@pytest.fixture
def pod_node(api_client: client.ApiClient, namespace: str, local_pod_range: str) -> Iterator[str]:
    """A fake node of the test's own, its podCIDR a /24 of the local range, tainted so that only
    this test's pods go there; deleted afterwards."""
    core = client.CoreV1Api(api_client)
    name = f"gateway-{namespace}"
    cidr = f"198.18.{random.randint(1, 254)}.0/24"
    resources = {"cpu": "8", "memory": "64Gi", "pods": "110"}
    node = client.V1Node(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={"kwok.x-k8s.io/node": "fake"},
            labels={"kubernetes.io/hostname": name, "type": "kwok", TEST_LABEL: namespace},
        ),
        spec=client.V1NodeSpec(
            pod_cidr=cidr,
            pod_cidrs=[cidr],
            taints=[client.V1Taint(key=TEST_LABEL, value=namespace, effect="NoSchedule")],
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
            tolerations=[client.V1Toleration(key=TEST_LABEL, operator="Exists", effect="NoSchedule")],
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def traefik(kubeconfig: str, namespace: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """Traefik watching this test's namespace and GatewayClasses labelled with it: its HTTP
    entrypoint's port, and its log."""
    binary = tool(str(TRAEFIK), "make gateway")
    port, log = free_port(), tmp_path / "traefik.log"
    args = [
        binary,
        f"--entryPoints.web.address=127.0.0.1:{port}",
        "--providers.kubernetesGateway=true",
        f"--providers.kubernetesGateway.namespaces={namespace}",
        f"--providers.kubernetesGateway.labelSelector={TEST_LABEL}={namespace}",
        "--providers.kubernetesGateway.statusAddress.ip=127.0.0.1",
        "--providers.kubernetesGateway.throttleDuration=0s",
        "--global.checkNewVersion=false",
        "--global.sendAnonymousUsage=false",
        "--log.level=INFO",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(args, env={**os.environ, "KUBECONFIG": kubeconfig}, stdout=out, stderr=out)
    try:
        yield port, log
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def gateway_class(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """A GatewayClass for Traefik, named and labelled after the test's namespace, deleted after it."""
    objects = client.CustomObjectsApi(api_client)
    name = f"traefik-{namespace}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GatewayClass",
        "metadata": {"name": name, "labels": {TEST_LABEL: namespace}},
        "spec": {"controllerName": CONTROLLER},
    }
    objects.create_cluster_custom_object(GROUP, VERSION, "gatewayclasses", body)
    yield name
    objects.delete_cluster_custom_object(GROUP, VERSION, "gatewayclasses", name)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in obj.get("conditions", []) if c["type"] == kind), None)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.usefixtures("gateway_api_crds")
def test_traefik_splits_an_httproute_by_weight_between_pods_on_local_addresses(
    api_client: client.ApiClient,
    kubectl: str,
    kubeconfig: str,
    namespace: str,
    backends: dict[str, Backend],
    traefik: tuple[int, Path],
    gateway_class: str,
) -> None:
    port, log = traefik
    objects = client.CustomObjectsApi(api_client)
    gateway = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Gateway",
        "metadata": {"name": "lab"},
        "spec": {
            "gatewayClassName": gateway_class,
            # Traefik serves a listener on the entrypoint with the listener's port.
            "listeners": [{"name": "web", "port": port, "protocol": "HTTP"}],
        },
    }
    weights = {"baseline": 3, "canary": 1}
    route = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HTTPRoute",
        "metadata": {"name": "llm"},
        "spec": {
            "parentRefs": [{"name": "lab", "sectionName": "web"}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                    "backendRefs": [{"name": t, "port": 80, "weight": w} for t, w in weights.items()],
                }
            ],
        },
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "gateways", gateway)
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "httproutes", route)

    def accepted_class() -> bool:
        found = cast(
            dict[str, Any], objects.get_cluster_custom_object(GROUP, VERSION, "gatewayclasses", gateway_class)
        )
        return condition(found.get("status", {}), "Accepted") == "True"

    def programmed_gateway() -> bool:
        found = cast(
            dict[str, Any], objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "gateways", "lab")
        )
        return condition(found.get("status", {}), "Programmed") == "True"

    def route_parent() -> dict[str, Any] | None:
        found = cast(
            dict[str, Any],
            objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "httproutes", "llm"),
        )
        parents: list[dict[str, Any]] = found.get("status", {}).get("parents", [])
        return next((p for p in parents if p.get("controllerName") == CONTROLLER), None)

    def both_answer() -> bool:
        return all(server.requests for server in backends.values())

    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        wait_for(accepted_class, 60, "Traefik to accept the GatewayClass")
        wait_for(programmed_gateway, 60, "Traefik to program the Gateway")
        parent = wait_for(route_parent, 60, "Traefik to write the HTTPRoute's status")
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
