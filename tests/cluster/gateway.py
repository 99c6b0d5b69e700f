"""The lab's gateway (issue 41) for cluster tests: Traefik v3's kubernetesGateway provider run against
the lab's API server, the Gateway API CRDs, and a pod range the host routes to lo.

kwok gives a pod an address from its node's spec.podCIDR; the API server refuses EndpointSlice
addresses in 127.0.0.0/8 ("may not be in the loopback range"), so pods that a gateway must reach sit
on a node whose podCIDR is in POD_RANGE, a range routed to lo as 127/8 is (root adds the route), and
the bridge binds their engines on those addresses. Traefik reads Services and EndpointSlices (ready
endpoints, the slice's port matched to the Service's by name), never Pods, and needs no kube-proxy.

Needs `make gateway` (Traefik and the CRDs into the cache)."""

from __future__ import annotations

import os
import random
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from tests.cluster.conftest import CACHE
from tests.cluster.operator_process import wait_for
from tests.conftest import tool

from specgate_lab.calibrate import free_port

TRAEFIK = CACHE / "bin" / "traefik"  # hack/build-binaries.sh gateway
CRDS = CACHE / "crds" / "gateway-api"  # Gateway API's standard channel, pinned there too
GROUP, VERSION = "gateway.networking.k8s.io", "v1"
CONTROLLER = "traefik.io/gateway-controller"  # the controllerName Traefik claims GatewayClasses by
KINDS = ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants", "backendtlspolicies")
# RFC 2544's benchmarking range, unused here and valid in an EndpointSlice, unlike 127.0.0.0/8.
POD_RANGE = "198.18.0.0/16"
TEST_LABEL = "specgate.dev/gateway-test"
GATEWAY = "lab"  # the Gateway lab_gateway makes, with one HTTP listener, LISTENER
LISTENER = "web"


def pod_cidr() -> str:
    """A /24 of POD_RANGE for a test's own node (tests run side by side: each takes its own)."""
    return f"198.18.{random.randint(1, 254)}.0/24"


@dataclass
class _SharedRoute:
    """POD_RANGE's route to lo as the tests holding local_pod_range at once share it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    holders: int = 0
    added: bool = False  # by the first holder: the last one removes it


_ROUTE = _SharedRoute()


@contextmanager
def local_pod_range() -> Iterator[str]:
    """POD_RANGE routed to lo, so that a server can bind any address in it and be reached there.
    Rollouts side by side hold it at once: the first adds the route (where missing), the last
    removes what was added here. Fails, naming the command, without root."""
    with _ROUTE.lock:
        if _ROUTE.holders == 0:
            _ROUTE.added = _add_local_route()
        _ROUTE.holders += 1
    try:
        yield POD_RANGE
    finally:
        with _ROUTE.lock:
            _ROUTE.holders -= 1
            if _ROUTE.holders == 0 and _ROUTE.added:
                subprocess.run(["ip", "route", "del", "local", POD_RANGE, "dev", "lo"], check=True)


def _add_local_route() -> bool:
    """Route POD_RANGE to lo unless it is; True when added here."""
    shown = subprocess.run(
        ["ip", "route", "show", "table", "local", "exact", POD_RANGE], capture_output=True, text=True
    )
    if shown.returncode == 0 and "dev lo" in shown.stdout:
        return False
    add = ["ip", "route", "add", "local", POD_RANGE, "dev", "lo"]
    added = subprocess.run(add, capture_output=True, text=True)
    if added.returncode != 0:
        raise AssertionError(
            f"cannot route {POD_RANGE} to lo ({added.stderr.strip()}): as root, `{' '.join(add)}`"
        )
    return True


def install_gateway_api_crds(kubeconfig: str, kubectl: str) -> None:
    """Gateway API's standard CRDs, applied server-side (a no-op where they are) and Established."""
    files = [arg for path in sorted(CRDS.glob("*.yaml")) for arg in ("-f", str(path))]
    if not files:
        raise AssertionError(f"{CRDS} holds no CRDs (run `make gateway`)")
    base = [kubectl, "--kubeconfig", kubeconfig]
    applied = subprocess.run(
        [*base, "apply", "--server-side", "--force-conflicts", *files], capture_output=True, text=True
    )
    assert applied.returncode == 0, applied.stderr
    crds = [f"crd/{kind}.{GROUP}" for kind in KINDS]
    established = subprocess.run(
        [*base, "wait", "--for", "condition=Established", "--timeout", "60s", *crds],
        capture_output=True,
        text=True,
    )
    assert established.returncode == 0, established.stderr


@contextmanager
def traefik(kubeconfig: str, namespace: str, log: Path) -> Iterator[int]:
    """Traefik watching `namespace` and the GatewayClasses labelled with it; its HTTP entrypoint's port."""
    binary = tool(str(TRAEFIK), "make gateway")
    port = free_port()
    args = [
        binary,
        f"--entryPoints.{LISTENER}.address=127.0.0.1:{port}",
        "--providers.kubernetesGateway=true",
        f"--providers.kubernetesGateway.namespaces={namespace}",
        f"--providers.kubernetesGateway.labelSelector={TEST_LABEL}={namespace}",
        "--providers.kubernetesGateway.statusAddress.ip=127.0.0.1",
        "--providers.kubernetesGateway.throttleDuration=0s",
        "--global.checkNewVersion=false",
        "--global.sendAnonymousUsage=false",
        "--log.level=INFO",
        "--accesslog=true",  # beside its log, one JSON line a request: what a failed request met
        f"--accesslog.filepath={log.with_name('traefik-access.log')}",
        "--accesslog.format=json",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(args, env={**os.environ, "KUBECONFIG": kubeconfig}, stdout=out, stderr=out)
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
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
    try:
        yield name
    finally:
        objects.delete_cluster_custom_object(GROUP, VERSION, "gatewayclasses", name)


def lab_gateway(api_client: client.ApiClient, namespace: str, class_name: str, port: int) -> None:
    """Gateway GATEWAY in `namespace` with one HTTP listener on Traefik's entrypoint port (Traefik
    serves a listener on the entrypoint of that port), once Traefik accepted its class and
    programmed it."""
    objects = client.CustomObjectsApi(api_client)
    gateway = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY},
        "spec": {
            "gatewayClassName": class_name,
            "listeners": [{"name": LISTENER, "port": port, "protocol": "HTTP"}],
        },
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "gateways", gateway)

    def accepted_class() -> bool:
        found = cast(
            dict[str, Any], objects.get_cluster_custom_object(GROUP, VERSION, "gatewayclasses", class_name)
        )
        return condition(found.get("status", {}), "Accepted") == "True"

    def programmed() -> bool:
        found = cast(
            dict[str, Any],
            objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "gateways", GATEWAY),
        )
        return condition(found.get("status", {}), "Programmed") == "True"

    wait_for(accepted_class, 60, "Traefik to accept the GatewayClass")
    wait_for(programmed, 60, "Traefik to program the Gateway")


def route_parent(api_client: client.ApiClient, namespace: str, route: str) -> dict[str, Any] | None:
    """Traefik's entry in the HTTPRoute's status.parents, once it wrote one."""
    found = cast(
        dict[str, Any],
        client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "httproutes", route
        ),
    )
    parents: list[dict[str, Any]] = found.get("status", {}).get("parents", [])
    return next((p for p in parents if p.get("controllerName") == CONTROLLER), None)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in obj.get("conditions", []) if c["type"] == kind), None)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
