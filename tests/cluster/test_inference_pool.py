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
    sd_gone,
    wait_for,
)
from tests.conftest import ROOT, tiny

from specgate import api, kube
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


USERS_POOL = {
    "apiVersion": f"{POOL_GROUP}/{POOL_VERSION}",
    "kind": "InferencePool",
    "metadata": {"name": "chat-pool"},
    "spec": {
        "selector": {"matchLabels": {"app": "vllm"}},
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {"name": "chat-epp", "port": {"number": 9002}},
    },
}
USERS_ROUTE = {
    "apiVersion": f"{GATEWAY_GROUP}/{GATEWAY_VERSION}",
    "kind": "HTTPRoute",
    "metadata": {"name": "chat"},
    "spec": {
        "parentRefs": [{"name": "lab"}],
        "rules": [
            {
                "name": "completions",
                "backendRefs": [{"group": POOL_GROUP, "kind": "InferencePool", "name": "chat-pool"}],
            }
        ],
    },
}
ON_USERS_POOL = {
    **TRAFFIC,
    "httpRoute": None,
    "existingRoute": {"name": "chat", "ruleName": "completions"},
}


def rule_backends(api_client: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    route = read(api_client, namespace, "httproutes", "chat")
    assert route is not None, "the user's HTTPRoute is gone"
    refs: list[dict[str, Any]] = route["spec"]["rules"][0].get("backendRefs") or []
    return refs


def test_a_users_rule_of_its_own_pool_is_adopted_and_given_back_on_deletion(
    api_client: client.ApiClient, namespace: str, kubeconfig: str, kubectl: str, tmp_path: Path
) -> None:
    """The user's rule sends its traffic to their InferencePool chat-pool: it keeps it while the
    baseline has no Ready pod; once it has one the rule is staged (chat-pool at its weight, the
    tracks' pools beside it at 0, recorded) and keeps it until the Gateway accepts the staged rule
    and both pools, then moves to the tracks' pools, and is given back on deletion; the user's pool
    is never written."""
    if not GIE_CRD.exists():
        pytest.fail(f"{GIE_CRD} is missing: the shared folder beside the checkout holds it", pytrace=False)
    install_gateway_api_crds(kubeconfig, kubectl)
    install_crd(api_client, GIE_CRD)
    objects = custom_objects(api_client)
    objects.create_namespaced_custom_object(POOL_GROUP, POOL_VERSION, namespace, "inferencepools", USERS_POOL)
    objects.create_namespaced_custom_object(
        GATEWAY_GROUP, GATEWAY_VERSION, namespace, "httproutes", USERS_ROUTE
    )
    before = rule_backends(api_client, namespace)  # as stored: with the API server's defaults
    users_pool = read(api_client, namespace, "inferencepools", "chat-pool")
    body = tiny()
    body["spec"]["rollout"]["traffic"] = ON_USERS_POOL
    body["spec"]["nodeSelector"] = {"specgate.dev/no-such-node": "true"}  # pods stay Pending at first
    create_sd(api_client, namespace, body)
    with operator_process(kubeconfig, tmp_path / "operator.log", "--namespace", namespace):
        wait_for(lambda: get_sd(api_client, namespace, "tiny").get("status", {}).get("phase"), 60, "a phase")
        time.sleep(3 * OPERATOR_INTERVAL_SECONDS)  # reconciles that could have taken the rule over
        status = get_sd(api_client, namespace, "tiny")["status"]
        assert status["phase"] != "Failed", status  # adopted, not refused: it waits for a Ready pod
        assert rule_backends(api_client, namespace) == before, "the rule was taken with no pod Ready"
        sim = {"nodeSelector": None, "podAnnotations": {"specgate.dev/lab-engine": "sim"}}
        objects.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, "tiny", {"spec": sim}
        )
        staged = [
            *before,
            *({"group": POOL_GROUP, "kind": "InferencePool", "name": n, "weight": 0} for n in POOLS),
        ]
        wait_for(lambda: rule_backends(api_client, namespace) == staged, 180, "the rule staged")
        traffic = wait_for(
            lambda: (get_sd(api_client, namespace, "tiny")["status"].get("traffic") or {}).get("original"),
            30,
            "the rule's record",
        )
        assert traffic["backendRefs"] == before, traffic
        for name in POOLS:
            pool = read(api_client, namespace, "inferencepools", name)
            assert pool is not None and applied_by_specgate(pool), pool
        report(api_client, namespace, "httproutes", "chat")  # the staged rule accepted, its pools not
        time.sleep(3 * OPERATOR_INTERVAL_SECONDS)  # reconciles that could have moved the weight
        assert rule_backends(api_client, namespace) == staged, "the weight moved to pools not accepted"
        status = get_sd(api_client, namespace, "tiny")["status"]
        assert status["reason"] == "RouteNotAccepted" and "keeps all its traffic on your" in status["message"]
        for name in POOLS:
            report(api_client, namespace, "inferencepools", name)
        wait_for(
            lambda: [r["name"] for r in rule_backends(api_client, namespace)] == list(POOLS),
            60,
            "the rule routed to the tracks' pools",
        )
        refs = rule_backends(api_client, namespace)
        assert [(r["group"], r["kind"], r["weight"]) for r in refs] == [
            (POOL_GROUP, "InferencePool", 1),  # the baseline's one Ready pod
            (POOL_GROUP, "InferencePool", 0),
        ]
        report(api_client, namespace, "httproutes", "chat")  # the moved rule's generation
        actual = wait_for(lambda: carried(api_client, namespace), 30, "the weights counted as carried")
        assert actual == {"baseline": 100, "canary": 0}

        objects.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "tiny")
        wait_for(lambda: sd_gone(api_client, namespace, "tiny"), 60, "the object deleted")
    assert rule_backends(api_client, namespace) == before
    after = read(api_client, namespace, "inferencepools", "chat-pool")
    assert after is not None and users_pool is not None and after["spec"] == users_pool["spec"]
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    assert "RouteRuleRestored" in [event.reason for event in events]
