"""The lab's gateway (issue 41): Traefik v3's kubernetesGateway provider, run against the lab's API
server, routes an HTTPRoute to a Service whose EndpointSlice holds a loopback address where a real
HTTP server listens. Traefik reads Services and EndpointSlices (ready endpoints only), never Pods.

Needs `make gateway` (Traefik and the Gateway API CRDs, not built by `make binaries` yet) and is not
collected by `make test`: run it with `make test-gateway` (pytest's `--gateway`)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import threading
import urllib.error
import urllib.request
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


class Backend(ThreadingHTTPServer):
    """An HTTP server on a loopback address that answers with that address and counts requests."""

    def __init__(self, address: str) -> None:
        self.requests: list[str] = []
        super().__init__((address, 0), Handler)

    @property
    def address(self) -> str:
        return str(self.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class Handler(BaseHTTPRequestHandler):
    server: Backend

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        body = f"backend {self.server.address}:{self.server.port} {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def gateway_api_crds(kubeconfig: str, kubectl: str) -> None:
    """Gateway API's standard CRDs, applied server-side (a no-op where they are) and Established."""
    if not sorted(CRDS.glob("*.yaml")):
        pytest.fail(f"{CRDS} holds no CRDs (run `make gateway`)", pytrace=False)
    base = [kubectl, "--kubeconfig", kubeconfig]
    applied = subprocess.run(
        [*base, "apply", "--server-side", "--force-conflicts", "-f", str(CRDS)],
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
def backend() -> Iterator[Backend]:
    """A server on a loopback address other than 127.0.0.1, as a lab pod's would be."""
    server = Backend(f"127.{random.randint(64, 127)}.{random.randint(0, 255)}.{random.randint(1, 254)}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
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
        f"--providers.kubernetesGateway.labelSelector=specgate.dev/gateway-test={namespace}",
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
        "metadata": {"name": name, "labels": {"specgate.dev/gateway-test": namespace}},
        "spec": {"controllerName": CONTROLLER},
    }
    objects.create_cluster_custom_object(GROUP, VERSION, "gatewayclasses", body)
    yield name
    objects.delete_cluster_custom_object(GROUP, VERSION, "gatewayclasses", name)


def loopback_service(api_client: client.ApiClient, namespace: str, name: str, backend: Backend) -> None:
    """A Service without a selector and the EndpointSlice a controller would write for one ready pod
    at the backend's address (the lab's kwok pods would get such addresses, issue 41)."""
    core, discovery = client.CoreV1Api(api_client), client.DiscoveryV1Api(api_client)
    port = client.V1ServicePort(name="http", port=80, target_port=backend.port, protocol="TCP")
    service = client.V1Service(
        metadata=client.V1ObjectMeta(name=name), spec=client.V1ServiceSpec(ports=[port])
    )
    core.create_namespaced_service(namespace, service)
    labels = {
        "kubernetes.io/service-name": name,
        "endpointslice.kubernetes.io/managed-by": "specgate.dev/gateway-test",
    }
    endpoint_slice = client.V1EndpointSlice(
        metadata=client.V1ObjectMeta(name=f"{name}-loopback", labels=labels),
        address_type="IPv4",
        # Traefik matches the slice's port to the Service's by name and skips an endpoint whose
        # ready condition is unset (not only false).
        endpoints=[
            client.V1Endpoint(addresses=[backend.address], conditions=client.V1EndpointConditions(ready=True))
        ],
        ports=[client.DiscoveryV1EndpointPort(name="http", port=backend.port, protocol="TCP")],
    )
    discovery.create_namespaced_endpoint_slice(namespace, endpoint_slice)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in obj.get("conditions", []) if c["type"] == kind), None)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.usefixtures("gateway_api_crds")
def test_an_httproute_through_traefik_reaches_a_server_on_a_loopback_endpoint(
    api_client: client.ApiClient,
    namespace: str,
    backend: Backend,
    traefik: tuple[int, Path],
    gateway_class: str,
) -> None:
    port, log = traefik
    objects = client.CustomObjectsApi(api_client)
    loopback_service(api_client, namespace, "engine", backend)
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
    route = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HTTPRoute",
        "metadata": {"name": "engine"},
        "spec": {
            "parentRefs": [{"name": "lab", "sectionName": "web"}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                    "backendRefs": [{"name": "engine", "port": 80}],
                }
            ],
        },
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "gateways", gateway)
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "httproutes", route)

    def why() -> str:
        return log.read_text()[-3000:]

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
            objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "httproutes", "engine"),
        )
        parents: list[dict[str, Any]] = found.get("status", {}).get("parents", [])
        return next((p for p in parents if p.get("controllerName") == CONTROLLER), None)

    try:
        wait_for(accepted_class, 60, "Traefik to accept the GatewayClass")
        wait_for(programmed_gateway, 60, "Traefik to program the Gateway")
        parent = wait_for(route_parent, 60, "Traefik to write the HTTPRoute's status")
        assert condition(parent, "Accepted") == "True", parent
        assert condition(parent, "ResolvedRefs") == "True", parent
        url = f"http://127.0.0.1:{port}/v1/models"
        _, body = wait_for(lambda: (r := get(url))[0] == 200 and r, 60, f"a 200 from {url}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nTraefik's log:\n{why()}") from exc
    assert body == f"backend {backend.address}:{backend.port} /v1/models\n"
    assert backend.requests[-1] == "/v1/models"
    # Outside the route's match, Traefik answers itself: the request reaches no backend.
    seen = len(backend.requests)
    assert get(f"http://127.0.0.1:{port}/other")[0] == 404
    assert len(backend.requests) == seen
