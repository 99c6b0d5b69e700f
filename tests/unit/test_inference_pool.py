"""traffic.backend InferencePool (issue 59): the pools specgate renders, checked against the Gateway
API Inference Extension's own InferencePool CRD (v1, GIE v1.6.0, kept beside the checkout in
../shared/gie/), the route's rule across the two pools, and the weights counted as carried only once
the route and both pools report Accepted and ResolvedRefs. The authoritative check, server-side apply
on a real API server with that CRD, is tests/cluster/test_inference_pool.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from tests.conftest import ROOT
from tests.unit.handler_fakes import OWNER, FakeKube, json_patched, reconcile_step
from tests.unit.openapi_check import problems
from tests.unit.rollout_driver import Run, make_spec, ready

from specgate import api, render, traffic
from specgate.api import Phase
from specgate.observation import RouteState
from specgate.render import Track
from specgate.rollout import Reason
from specgate.traffic import Parent, Weights

GIE_CRD = ROOT.parent / "shared" / "gie" / "inference.networking.k8s.io_inferencepools.yaml"
GATEWAY = {"name": "inference", "namespace": "gw"}
PICKERS = {
    "baseline": {"name": "llama-epp", "port": 9002},
    "canary": {"name": "llama-canary-epp", "port": 9002},
}
POOLS = {
    "router": "GatewayAPI",
    "httpRoute": {"parentRefs": [GATEWAY]},
    "backend": "InferencePool",
    "inferencePool": {"endpointPicker": PICKERS},
}
TRAFFIC = api.Traffic.model_validate(POOLS)
POOL = api.Backend.INFERENCE_POOL
NAMES = ["llama-baseline", "llama-canary"]


@pytest.fixture(scope="module")
def pool_schema() -> dict[str, Any]:
    """InferencePool v1's openAPIV3Schema, from the CRD file beside the checkout (CI has it)."""
    if not GIE_CRD.exists():
        pytest.skip(f"{GIE_CRD} is not beside this checkout (the shared folder holds it in CI)")
    crd = yaml.safe_load(GIE_CRD.read_text())
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema


def test_each_tracks_pool_passes_the_inference_pool_crd(pool_schema: dict[str, Any]) -> None:
    pools = render.inference_pools(OWNER, TRAFFIC)
    assert [p["metadata"]["name"] for p in pools] == NAMES
    for pool in pools:
        assert problems(pool, pool_schema) == []
    broken = copy.deepcopy(pools[0])
    del broken["spec"]["endpointPickerRef"]["port"]  # a picker Service without its port
    assert problems(broken, pool_schema) != []  # the check refuses what the API server refuses


def test_a_pool_selects_its_tracks_serving_pods_on_the_engines_port_with_its_picker() -> None:
    spec = make_spec(traffic=POOLS)
    baseline, canary = render.inference_pools(OWNER, TRAFFIC)
    for pool, track, other in (
        (baseline, Track.BASELINE, Track.CANARY),
        (canary, Track.CANARY, Track.BASELINE),
    ):
        selector = pool["spec"]["selector"]["matchLabels"]
        assert selector.items() <= render.pod_labels(spec, OWNER, track).items()
        assert not selector.items() <= render.pod_labels(spec, OWNER, other).items()
        assert pool["spec"]["targetPorts"] == [{"number": render.HTTP_PORT}]
        assert pool["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert baseline["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "llama-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert canary["spec"]["endpointPickerRef"]["name"] == "llama-canary-epp"


def test_no_pools_for_service_backends() -> None:
    services = api.Traffic.model_validate({"router": "GatewayAPI", "httpRoute": {"parentRefs": [GATEWAY]}})
    assert render.inference_pools(OWNER, services) == []


def test_the_owned_routes_rule_weights_the_two_pools_as_it_would_the_services() -> None:
    template = api.HTTPRouteTemplate.model_validate({"parentRefs": [GATEWAY]})
    weights = Weights(75, 25, relative=(3, 1))
    refs = render.http_route(OWNER, template, weights, POOL)["spec"]["rules"][0]["backendRefs"]
    assert refs == [
        {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": "llama-baseline",
            "weight": 3,
        },
        {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": "llama-canary",
            "weight": 1,
        },
    ]
    services = render.http_route(OWNER, template, weights)["spec"]["rules"][0]["backendRefs"]
    assert [ref["weight"] for ref in services] == [ref["weight"] for ref in refs]


def test_an_owned_route_of_services_differs_from_one_of_pools() -> None:
    """Switching backend rewrites the owned route: the kinds are compared, not only the weights."""
    template = api.HTTPRouteTemplate.model_validate({"parentRefs": [GATEWAY]})
    services = render.http_route(OWNER, template, Weights(100, 0))
    assert render.route_differs(services, render.http_route(OWNER, template, Weights(100, 0), POOL))
    assert not render.route_differs(services, render.http_route(OWNER, template, Weights(100, 0)))


def rule(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": "5"}, "spec": {"rules": [{"backendRefs": list(refs)}]}}


def pool_ref(name: str, weight: int) -> dict[str, Any]:
    return {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name, "weight": weight}


def test_a_rules_pool_weights_are_read_for_backend_inference_pool_only() -> None:
    pools = rule(pool_ref("llama-baseline", 3), pool_ref("llama-canary", 1))
    assert render.route_weights(pools, 0, OWNER, POOL) == Weights(75, 25)
    assert render.route_weights(pools, 0, OWNER, api.Backend.SERVICE) is None  # not what it sets
    assert render.route_weights(pools, 0, OWNER) == Weights(75, 25)  # the tracks', of either kind
    service = {"kind": "Service", "name": "llama-canary", "port": 8000, "weight": 1}
    assert render.route_weights(rule(pool_ref("llama-baseline", 3), service), 0, OWNER) is None
    other_group = {**pool_ref("llama-canary", 1), "group": "example.com"}
    assert render.route_weights(rule(pool_ref("llama-baseline", 3), other_group), 0, OWNER) is None


def test_weights_moved_away_from_a_track_keep_the_rules_pools() -> None:
    """A failed object's rule (weights_patch, read without a spec) keeps the kind of backends it has."""
    pools = rule(pool_ref("llama-baseline", 1), pool_ref("llama-canary", 1))
    patch = render.weights_patch(pools, 0, OWNER, Weights(100, 0))
    assert patch[1]["value"] == [pool_ref("llama-baseline", 100), pool_ref("llama-canary", 0)]


def accepted(obj: dict[str, Any], resolved: str = "True", seen: int = 2) -> dict[str, Any]:
    """The object (route or pool) with Gateway inference's Accepted and ResolvedRefs for generation 2."""
    conditions = [
        {"type": "Accepted", "status": "True", "reason": "Accepted", "observedGeneration": seen},
        {"type": "ResolvedRefs", "status": resolved, "reason": "Why", "observedGeneration": seen},
    ]
    return {
        **obj,
        "metadata": {**obj.get("metadata", {}), "namespace": "ml", "generation": 2},
        "status": {"parents": [{"parentRef": GATEWAY, "conditions": conditions}]},
    }


def owned_route() -> dict[str, Any]:
    template = api.HTTPRouteTemplate.model_validate({"parentRefs": [GATEWAY]})
    return accepted(render.http_route(OWNER, template, Weights(75, 25), POOL))


def pools_read(baseline: dict[str, Any] | None, canary: dict[str, Any] | None) -> dict[str, Any]:
    return dict(zip(NAMES, (baseline, canary), strict=True))


def test_weights_count_as_carried_only_once_the_route_and_both_pools_are_accepted() -> None:
    base, can = render.inference_pools(OWNER, TRAFFIC)
    both = pools_read(accepted(base), accepted(can))
    assert render.route_state(owned_route(), TRAFFIC, OWNER, both) == RouteState(weights=Weights(75, 25))
    holds = {
        "InferencePool llama-canary: the InferencePool does not exist yet": pools_read(accepted(base), None),
        "InferencePool llama-baseline: parent Gateway inference: has not reported on the InferencePool "
        "yet": pools_read(base, accepted(can)),
        "InferencePool llama-canary: parent Gateway inference: ResolvedRefs is False (Why: )": pools_read(
            accepted(base), accepted(can, resolved="False")
        ),
        "InferencePool llama-baseline: parent Gateway inference: Accepted not yet reported for "
        "generation 2": pools_read(accepted(base, seen=1), accepted(can)),
    }
    for hold, pools in holds.items():
        assert render.route_state(owned_route(), TRAFFIC, OWNER, pools) == RouteState(
            hold=hold, written=Weights(75, 25)
        )
    route = {**owned_route(), "status": {}}  # the route itself not accepted: its hold comes first
    state = render.route_state(route, TRAFFIC, OWNER, both)
    assert state.weights is None and "HTTPRoute" in (state.hold or "")


def test_a_pool_accepted_by_another_gateway_than_the_routes_does_not_count() -> None:
    pool = accepted(render.inference_pools(OWNER, TRAFFIC)[0])
    assert traffic.pools_hold({"p": pool}, [Parent("inference", "gw")]) is None
    assert traffic.pools_hold({"p": pool}, [Parent("internal", "gw")]) == (
        "InferencePool p: parent Gateway internal: has not reported on the InferencePool yet"
    )


# --- handlers.step: the pools created, read and refused ---


def test_without_the_inference_pool_crd_nothing_is_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(make_spec(traffic=POOLS))
    fake = FakeKube({"llama-baseline": ready(2)}, inference_pool_crd=False).install(monkeypatch)
    status = reconcile_step(run, after=0).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.INFERENCE_POOL_CRD_MISSING)
    assert "spec.rollout.traffic.backend is InferencePool" in (status.message or "")
    assert fake.calls == []


def test_the_pools_are_applied_before_the_route_names_them_and_again_only_where_they_differ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Run(make_spec(traffic=POOLS))
    fake = FakeKube({"llama-baseline": ready(2)}).install(monkeypatch)
    reconcile_step(run, after=0)
    written = [(call[1], call[2]) for call in fake.calls if call[0] == "apply" and call[1] != "Deployment"]
    pools_then_route = [w for w in written if w[0] in ("InferencePool", "HTTPRoute")]
    assert pools_then_route == [("InferencePool", n) for n in NAMES] + [("HTTPRoute", "llama")]
    route = next(call[3] for call in fake.calls if call[1] == "HTTPRoute")
    assert [(r["kind"], r["name"], r["weight"]) for r in route["rules"][0]["backendRefs"]] == [
        ("InferencePool", "llama-baseline", 2),
        ("InferencePool", "llama-canary", 0),
    ]
    fake.calls.clear()
    reconcile_step(run, after=10)
    assert not [call for call in fake.calls if call[1] == "InferencePool"]  # as read: nothing to write
    fake.pools["llama-canary"]["spec"]["endpointPickerRef"]["name"] = "edited"
    reconcile_step(run, after=20)
    assert [call[2] for call in fake.calls if call[1] == "InferencePool"] == ["llama-canary"]


def test_a_pool_name_taken_by_someone_else_is_a_name_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(make_spec(traffic=POOLS))
    taken = "InferencePool ml/llama-canary (not created by this SpeculativeDeployment)"
    seen: list[list[str]] = []

    def foreign(manifests: list[render.Manifest], owner_uid: str) -> list[str]:
        seen.append([f"{m['kind']} {m['metadata']['name']}" for m in manifests])
        return [taken]

    FakeKube().install(monkeypatch)
    monkeypatch.setattr("specgate.kube.foreign_children", foreign)
    status = reconcile_step(run, after=0).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.NAME_CONFLICT)
    assert {f"InferencePool {n}" for n in NAMES} <= set(seen[0])


# --- existingRoute: a rule of Services taken over with the pools; a rule of the user's pool refused ---

EXISTING = api.ExistingRoute(name="chat", rule_name="chat")
USERS_SERVICE = {"kind": "Service", "name": "vllm", "port": 8000}
USERS_POOL = pool_ref("chat-pool", 1)


def users_route(*refs: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "chat", "namespace": "ml", "resourceVersion": "9"},
        "spec": {"parentRefs": [GATEWAY], "rules": [{"name": "chat", "backendRefs": list(refs)}]},
    }


def test_a_users_rule_of_services_gets_the_pools_and_its_own_backends_back() -> None:
    route = users_route(USERS_SERVICE)
    assert render.foreign_backends(route, EXISTING, OWNER, POOL) is None
    record = render.rule_record(route, EXISTING, OWNER)
    assert record is not None and record.backend_refs == [USERS_SERVICE]
    taken = json_patched(route, render.rule_patch(route, EXISTING, OWNER, Weights(100, 0), POOL))
    assert render.route_weights(taken, 0, OWNER, POOL) == Weights(100, 0)
    restored = json_patched(taken, render.restore_patch(taken, record, OWNER))
    assert restored == route


def test_a_users_rule_of_its_own_pool_is_refused_not_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    route = users_route(USERS_POOL)
    why = render.foreign_backends(route, EXISTING, OWNER, POOL)
    assert why is not None and "does not yet adopt your InferencePool" in why
    assert "InferencePool chat-pool (inference.networking.k8s.io)" in why
    existing = {**POOLS, "httpRoute": None, "existingRoute": {"name": "chat", "ruleName": "chat"}}
    run = Run(make_spec(traffic=existing))
    fake = FakeKube({"llama-baseline": ready(2)}, routes={"chat": route}).install(monkeypatch)
    status = reconcile_step(run, after=0).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.INVALID_SPEC)
    assert fake.routes["chat"] == route and not [c for c in fake.calls if c[0] == "apply"]
