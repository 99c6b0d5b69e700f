"""The lab's gateway (issue 41), for the demo and the cluster tests: Traefik v3's kubernetesGateway
provider run against the lab's API server, the Gateway API CRDs, and a pod range the host routes to lo.

kwok gives a pod an address from its node's spec.podCIDR; the API server refuses EndpointSlice
addresses in 127.0.0.0/8 ("may not be in the loopback range"), so pods that a gateway must reach sit
on a node whose podCIDR is in POD_RANGE, a range routed to lo as 127/8 is (root adds the route), and
the bridge binds their engines on those addresses. Traefik reads Services and EndpointSlices (ready
endpoints, the slice's port matched to the Service's by name), never Pods, and needs no kube-proxy.

Needs `make gateway` (Traefik and the CRDs into the cache)."""

from __future__ import annotations

import os
import random
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, cast

from kubernetes import client

from specgate_lab.calibrate import free_port
from specgate_lab.engines import CACHE
from specgate_lab.kube import create_fake_gpu_node, wait_for

TRAEFIK = CACHE / "bin" / "traefik"  # hack/build-binaries.sh gateway
CRDS = CACHE / "crds" / "gateway-api"  # Gateway API's standard channel, pinned there too
KUBECTL = CACHE / "bin" / "kubectl"  # make cluster-up
GROUP, VERSION = "gateway.networking.k8s.io", "v1"
CONTROLLER = "traefik.io/gateway-controller"  # the controllerName Traefik claims GatewayClasses by
KINDS = ("gatewayclasses", "gateways", "httproutes", "grpcroutes", "referencegrants", "backendtlspolicies")
# RFC 2544's benchmarking range, unused here and valid in an EndpointSlice, unlike 127.0.0.0/8.
POD_RANGE = "198.18.0.0/16"
ROUTE_COMMAND = ("ip", "route", "add", "local", POD_RANGE, "dev", "lo")
# On the GatewayClasses a lab Traefik serves, valued with the namespace it watches.
CLASS_LABEL = "specgate.dev/gateway-test"
GATEWAY = "lab"  # the Gateway lab_gateway makes, with one HTTP listener, LISTENER
LISTENER = "web"
FIELD_MANAGER = "specgate-lab"
_INSTALL_LOCK = threading.Lock()  # the tests' rollouts set up their gateways from threads at once
APPLY_ATTEMPTS = 3
BUNDLE_VERSION = re.compile(r"^\s+gateway\.networking\.k8s\.io/bundle-version: (\S+)$", re.MULTILINE)


class GatewaySetupError(RuntimeError):
    """The lab's gateway cannot start here; the message names the command that fixes it."""


def pod_cidr() -> str:
    """A /24 of POD_RANGE for a node of its own (rollouts run side by side: each takes its own)."""
    return f"198.18.{random.randint(1, 254)}.0/24"


def route_pod_range() -> str:
    """POD_RANGE routed to lo, so that a server can bind any address in it and be reached there. The
    route is the lab's, as its cluster is: added where missing, removed by hack/cluster-down.sh, never
    by a test or the demo (two processes side by side would take it from each other). Fails, naming
    the command, without root."""
    shown = subprocess.run(
        ["ip", "route", "show", "table", "local", "exact", POD_RANGE], capture_output=True, text=True
    )
    if shown.returncode == 0 and "dev lo" in shown.stdout:
        return POD_RANGE
    added = subprocess.run(ROUTE_COMMAND, capture_output=True, text=True)
    if added.returncode != 0 and "File exists" not in added.stderr:  # added beside us meanwhile
        raise GatewaySetupError(
            f"cannot route {POD_RANGE} to lo ({added.stderr.strip()}): as root, `{' '.join(ROUTE_COMMAND)}`"
        )
    return POD_RANGE


def traefik_binary() -> str:
    if not os.access(TRAEFIK, os.X_OK):
        raise GatewaySetupError(f"{TRAEFIK} is missing (run `make gateway`)")
    return str(TRAEFIK)


def install_gateway_api_crds(kubeconfig: str, kubectl: str) -> None:
    """Gateway API's standard CRDs, applied server-side and Established; nothing to do where the
    lab's KINDS are Established at the files' bundle version already. The apply of these large
    schemas, three at once beside real engines, ran past the API server's 60 s request timeout
    though it changed nothing: one install at a time here, and a timed-out apply is tried again."""
    files = [arg for path in sorted(CRDS.glob("*.yaml")) for arg in ("-f", str(path))]
    if not files:
        raise GatewaySetupError(f"{CRDS} holds no CRDs (run `make gateway`)")
    base = [kubectl, "--kubeconfig", kubeconfig]
    crds = [f"crd/{kind}.{GROUP}" for kind in KINDS]
    with _INSTALL_LOCK:
        if _installed(base, crds) == {_bundle_version()}:
            return
        apply = [*base, "apply", "--server-side", "--force-conflicts", *files]
        wait = [*base, "wait", "--for", "condition=Established", "--timeout", "60s", *crds]
        for command, attempts in ((apply, APPLY_ATTEMPTS), (wait, 1)):
            done = _run_retrying_timeouts(command, attempts)
            if done.returncode != 0:
                raise GatewaySetupError(
                    f"{' '.join(command[3:5])} of the Gateway API CRDs failed: {done.stderr}"
                )


def _bundle_version() -> str:
    """The Gateway API release the cached CRD files are (their bundle-version annotation)."""
    versions: set[str] = {m for path in CRDS.glob("*.yaml") for m in BUNDLE_VERSION.findall(path.read_text())}
    if len(versions) != 1:
        raise GatewaySetupError(f"{CRDS} holds CRDs of versions {sorted(versions)} (run `make gateway`)")
    return versions.pop()


def _installed(base: list[str], crds: list[str]) -> set[str]:
    """The bundle versions of `crds` where every one of them is Established, else the empty set."""
    template = (
        '{range .items[*]}{.status.conditions[?(@.type=="Established")].status} '
        '{.metadata.annotations.gateway\\.networking\\.k8s\\.io/bundle-version}{"\\n"}{end}'
    )
    done = subprocess.run(
        [*base, "get", *crds, "--ignore-not-found", "-o", f"jsonpath={template}"],
        capture_output=True,
        text=True,
    )
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or len(rows) != len(crds) or any(len(r) != 2 or r[0] != "True" for r in rows):
        return set()
    return {r[1] for r in rows}


def _run_retrying_timeouts(command: list[str], attempts: int) -> subprocess.CompletedProcess[str]:
    """`command`, run again (up to `attempts` in all) while the API server answers it with a timeout."""
    for _ in range(attempts - 1):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0 or "Timeout" not in done.stderr:
            return done
    return subprocess.run(command, capture_output=True, text=True)


@contextmanager
def traefik(kubeconfig: str, namespace: str, log: Path) -> Iterator[int]:
    """Traefik watching `namespace` and the GatewayClasses labelled with it; its HTTP entrypoint's
    port. Each request is a JSON line in traefik-access.log beside `log`: what a failed request met."""
    port = free_port()
    args = [
        traefik_binary(),
        f"--entryPoints.{LISTENER}.address=127.0.0.1:{port}",
        "--providers.kubernetesGateway=true",
        f"--providers.kubernetesGateway.namespaces={namespace}",
        f"--providers.kubernetesGateway.labelSelector={CLASS_LABEL}={namespace}",
        "--providers.kubernetesGateway.statusAddress.ip=127.0.0.1",
        "--providers.kubernetesGateway.throttleDuration=0s",
        "--global.checkNewVersion=false",
        "--global.sendAnonymousUsage=false",
        "--log.level=INFO",
        "--accesslog=true",
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


def _apply(api_client: client.ApiClient, plural: str, body: dict[str, Any], namespace: str | None) -> None:
    """Server-side apply: creates the object, or updates one an earlier run kept (the demo's KEEP=1)."""
    objects = client.CustomObjectsApi(api_client)
    name = body["metadata"]["name"]
    kwargs: dict[str, Any] = {
        "field_manager": FIELD_MANAGER,
        "force": True,
        "_content_type": "application/apply-patch+yaml",
    }
    if namespace is None:
        objects.patch_cluster_custom_object(GROUP, VERSION, plural, name, body, **kwargs)
    else:
        objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, body, **kwargs)


def apply_gateway_class(api_client: client.ApiClient, namespace: str) -> str:
    """A GatewayClass for the Traefik watching `namespace`, named and labelled after it; its name."""
    name = f"traefik-{namespace}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GatewayClass",
        "metadata": {"name": name, "labels": {CLASS_LABEL: namespace}},
        "spec": {"controllerName": CONTROLLER},
    }
    _apply(api_client, "gatewayclasses", body, None)
    return name


def delete_gateway_class(api_client: client.ApiClient, name: str) -> None:
    client.CustomObjectsApi(api_client).delete_cluster_custom_object(GROUP, VERSION, "gatewayclasses", name)


@contextmanager
def gateway_class(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """apply_gateway_class, deleted after the block."""
    name = apply_gateway_class(api_client, namespace)
    try:
        yield name
    finally:
        delete_gateway_class(api_client, name)


def lab_gateway(api_client: client.ApiClient, namespace: str, class_name: str, port: int) -> None:
    """Gateway GATEWAY in `namespace` with one HTTP listener on Traefik's entrypoint port (Traefik
    serves a listener on the entrypoint of that port), once Traefik accepted its class and
    programmed this generation of it."""
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
    _apply(api_client, "gateways", gateway, namespace)

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
        generation = found["metadata"]["generation"]
        return any(
            c["type"] == "Programmed" and c["status"] == "True" and c.get("observedGeneration") == generation
            for c in found.get("status", {}).get("conditions", [])
        )

    wait_for(accepted_class, 60, "Traefik to accept the GatewayClass")
    wait_for(programmed, 60, "Traefik to program the Gateway")


def delete_lab_gateway(api_client: client.ApiClient, namespace: str) -> None:
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "gateways", GATEWAY
    )


def condition(obj: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in obj.get("conditions", []) if c["type"] == kind), None)


@contextmanager
def gateway_lab(
    api_client: client.ApiClient,
    kubeconfig: str,
    namespace: str,
    node: str,
    gpus: int,
    log: Path,
    keep: bool = False,
) -> Iterator[int]:
    """What a rollout in `namespace` through the lab's gateway needs: the Gateway API CRDs, the pod
    range routed to lo, a fake GPU node `node` with a pod CIDR in it (pin the object's pods there:
    specgate_lab.kube.pin_to_node, taint `namespace`), Traefik (its log at `log`) and Gateway
    GATEWAY; yields the gateway's port. Traefik stops after the block; the rest goes too unless
    `keep` (the demo's KEEP=1: the pods on the node keep their engines' addresses)."""
    traefik_binary()  # before anything is set up that would need undoing
    install_gateway_api_crds(kubeconfig, str(KUBECTL))
    with ExitStack() as stack:
        undo: Callable[..., Any] = (lambda *_: None) if keep else stack.callback
        route_pod_range()
        create_fake_gpu_node(api_client, node, gpus, namespace, pod_cidr=pod_cidr())
        undo(client.CoreV1Api(api_client).delete_node, node)
        port = stack.enter_context(traefik(kubeconfig, namespace, log))
        class_name = apply_gateway_class(api_client, namespace)
        undo(delete_gateway_class, api_client, class_name)
        lab_gateway(api_client, namespace, class_name, port)
        undo(delete_lab_gateway, api_client, namespace)
        yield port
