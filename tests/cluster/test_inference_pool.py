"""traffic.backend InferencePool on the real API server (issue 59), with the Gateway API Inference
Extension's InferencePool CRD (v1, GIE v1.6.0) installed from the shared folder beside the checkout.

The operator creates InferencePools <name>-baseline and <name>-canary by server-side apply and
points its HTTPRoute's rule at them; the API server's validation of both CRDs is the check of what
it writes. No gateway in the lab implements InferencePool, so the test writes the route's and the
pools' status as a gateway would, and checks that the weights count as carried
(status.traffic.actual) only once the route and both pools report Accepted and ResolvedRefs.

cluster_wide: it installs a CRD every namespace sees (left installed, as the Gateway API CRDs are:
no other test depends on its absence; InferencePoolCRDMissing is a unit test). Simulated engines."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.cluster.gateway import GROUP as GATEWAY_GROUP
from tests.cluster.gateway import VERSION as GATEWAY_VERSION
from tests.cluster.gateway import install_gateway_api_crds
from tests.cluster.operator_process import (
    OPERATOR_INTERVAL_SECONDS,
    create_sd,
    custom_objects,
    get_sd,
    operator_process,
    wait_for,
)
from tests.conftest import ROOT, tiny

from specgate import kube
from specgate_lab.crds import install_crd

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.gateway,  # the Gateway API CRDs from `make gateway`'s cache (no gateway runs)
    pytest.mark.cluster_wide,
    pytest.mark.usefixtures("crd"),
]

GIE_CRD = ROOT.parent / "shared" / "gie" / "inference.networking.k8s.io_inferencepools.yaml"
POOL_GROUP, POOL_VERSION = "inference.networking.k8s.io", "v1"
PARENT = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": "lab"}  # no such Gateway runs: status is ours
PICKERS = {
    "baseline": {"name": "tiny-epp", "port": 9002},
    "canary": {"name": "tiny-canary-epp", "port": 9002},
}
TRAFFIC = {
    "router": "GatewayAPI",
    "httpRoute": {"parentRefs": [{"name": "lab"}]},
    "backend": "InferencePool",
    "inferencePool": {"endpointPicker": PICKERS},
}
POOLS = ("tiny-baseline", "tiny-canary")


def group_version(plural: str) -> tuple[str, str]:
    return (POOL_GROUP, POOL_VERSION) if plural == "inferencepools" else (GATEWAY_GROUP, GATEWAY_VERSION)


def read(api_client: client.ApiClient, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
    group, version = group_version(plural)
    try:
        found = custom_objects(api_client).get_namespaced_custom_object(
            group, version, namespace, plural, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return cast(dict[str, Any], found)


def report(
    api_client: client.ApiClient, namespace: str, plural: str, name: str, resolved: str = "True"
) -> None:
    """Write the object's status.parents as Gateway `lab`'s controller would: Accepted True, and
    ResolvedRefs `resolved`, for the object's generation as read now."""
    obj = read(api_client, namespace, plural, name)
    assert obj is not None, f"{plural} {name} is gone"
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {
            "type": kind,
            "status": status,
            "reason": kind if status == "True" else "Refused",
            "message": "written by the test as a gateway would",
            "observedGeneration": obj["metadata"]["generation"],
            "lastTransitionTime": now,
        }
        for kind, status in (("Accepted", "True"), ("ResolvedRefs", resolved))
    ]
    parent: dict[str, Any] = {"parentRef": PARENT, "conditions": conditions}
    if plural == "httproutes":
        parent["controllerName"] = "specgate.dev/test-gateway"
    group, version = group_version(plural)
    custom_objects(api_client).patch_namespaced_custom_object_status(
        group, version, namespace, plural, name, {"status": {"parents": [parent]}}
    )


def carried(api_client: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    traffic = get_sd(api_client, namespace, "tiny").get("status", {}).get("traffic") or {}
    return cast(dict[str, Any] | None, traffic.get("actual"))


def stays_uncarried(api_client: client.ApiClient, namespace: str, why: str) -> None:
    time.sleep(3 * OPERATOR_INTERVAL_SECONDS)  # reconciles that could have counted the weights
    assert carried(api_client, namespace) is None, f"weights counted as carried with {why}"


def applied_by_specgate(obj: dict[str, Any]) -> bool:
    """Written by the operator's server-side apply (a field manager entry, not a dry run)."""
    return any(
        entry.get("manager") == kube.FIELD_MANAGER and entry.get("operation") == "Apply"
        for entry in obj["metadata"].get("managedFields") or []
    )


def test_the_route_weights_two_pools_and_counts_them_once_both_pools_are_accepted(
    api_client: client.ApiClient, namespace: str, kubeconfig: str, kubectl: str, tmp_path: Path
) -> None:
    if not GIE_CRD.exists():
        pytest.fail(f"{GIE_CRD} is missing: the shared folder beside the checkout holds it", pytrace=False)
    install_gateway_api_crds(kubeconfig, kubectl)
    install_crd(api_client, GIE_CRD)
    body = tiny()
    body["spec"]["podAnnotations"] = {"specgate.dev/lab-engine": "sim"}
    body["spec"]["rollout"]["traffic"] = TRAFFIC
    create_sd(api_client, namespace, body)
    with operator_process(kubeconfig, tmp_path / "operator.log", "--namespace", namespace):
        route = wait_for(lambda: read(api_client, namespace, "httproutes", "tiny"), 120, "the owned route")
        pools = [read(api_client, namespace, "inferencepools", name) for name in POOLS]
        refs = route["spec"]["rules"][0]["backendRefs"]
        assert [(r["group"], r["kind"], r["name"], r["weight"]) for r in refs] == [
            (POOL_GROUP, "InferencePool", "tiny-baseline", 1),  # the baseline's one Ready pod
            (POOL_GROUP, "InferencePool", "tiny-canary", 0),
        ]
        for pool, track in zip(pools, ("baseline", "canary"), strict=True):
            assert pool is not None and applied_by_specgate(pool), pool
            assert pool["spec"]["selector"]["matchLabels"]["specgate.dev/track"] == track
            assert pool["spec"]["targetPorts"] == [{"number": 8000}]
            assert pool["spec"]["endpointPickerRef"]["name"] == PICKERS[track]["name"]
        assert applied_by_specgate(route)

        report(api_client, namespace, "httproutes", "tiny")
        stays_uncarried(api_client, namespace, "the route accepted and neither pool")
        report(api_client, namespace, "inferencepools", "tiny-baseline")
        report(api_client, namespace, "inferencepools", "tiny-canary", resolved="False")
        stays_uncarried(api_client, namespace, "the canary's pool not ResolvedRefs")
        report(api_client, namespace, "inferencepools", "tiny-canary")
        actual = wait_for(lambda: carried(api_client, namespace), 30, "the weights counted as carried")
        assert actual == {"baseline": 100, "canary": 0}
