"""traffic.backend InferencePool (issue 59): the pools specgate renders, checked against the Gateway
API Inference Extension's own InferencePool CRD (v1, GIE v1.6.0, kept beside the checkout in
../shared/gie/), the route's rule across the two pools, and the weights counted as carried only once
the route and both pools report Accepted and ResolvedRefs. The authoritative check, server-side apply
on a real API server with that CRD, is tests/cluster/test_inference_pool.py."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import kopf
import pytest
import yaml
from tests.conftest import ROOT
from tests.unit.handler_fakes import OWNER, FakeKube, json_patched, reconcile_step
from tests.unit.openapi_check import problems
from tests.unit.rollout_driver import Run, edit, make_spec, ready

from specgate import api, handlers, render, traffic
from specgate.api import Phase
from specgate.observation import RouteState, TrackState
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


# --- existingRoute: a rule of the user's own InferencePool adopted, its weight moved to the pools ---

ON_USERS_RULE = {**POOLS, "httpRoute": None, "existingRoute": {"name": "chat", "ruleName": "chat"}}
USERS_PICKER = {"kind": "Service", "name": "chat-epp", "port": {"number": 9002}}


def users_pool(picker: dict[str, Any] | None = USERS_PICKER) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]}
    if picker is not None:
        spec["endpointPickerRef"] = picker
    return {"metadata": {"name": "chat-pool", "namespace": "ml"}, "spec": spec}


def test_a_users_rule_of_its_own_pool_is_adopted_and_given_back() -> None:
    route = users_route(USERS_POOL)
    assert render.foreign_backends(route, EXISTING, OWNER, POOL) is None
    assert render.users_pool(route, EXISTING, OWNER) == "chat-pool"
    record = render.rule_record(route, EXISTING, OWNER)
    assert record is not None and record.backend_refs == [USERS_POOL]
    operations = render.rule_patch(route, EXISTING, OWNER, Weights(100, 0, relative=(2, 0)), POOL)
    assert operations == [
        {"op": "test", "path": "/spec/rules/0/name", "value": "chat"},
        {
            "op": "add",
            "path": "/spec/rules/0/backendRefs",
            "value": [pool_ref("llama-baseline", 2), pool_ref("llama-canary", 0)],
        },
    ]
    taken = json_patched(route, operations)
    assert render.users_pool(taken, EXISTING, OWNER) is None  # the tracks' pools: nothing to adopt
    restored = json_patched(taken, render.restore_patch(taken, record, OWNER))
    assert restored == route


REFUSED_RULES = {
    "two pools": (
        [USERS_POOL, pool_ref("other-pool", 1)],
        "not of 2 backends: give the rule one backend, or name another rule",
    ),
    "a pool beside a Service": (
        [USERS_POOL, USERS_SERVICE],
        "not of 2 backends: give the rule one backend, or name another rule",
    ),
    "a pool in another namespace": (
        [{**USERS_POOL, "namespace": "serving"}],
        "InferencePool serving/chat-pool (inference.networking.k8s.io): InferencePools llama-baseline "
        "and llama-canary are made in namespace ml, so the rule's pool must be there too",
    ),
    "another kind": (
        [{"group": "example.com", "kind": "Backend", "name": "b"}],
        "specgate routes only rules of core Services or of one InferencePool",
    ),
}


@pytest.mark.parametrize("case", REFUSED_RULES)
def test_a_pool_rule_specgate_cannot_adopt_is_refused_naming_why(case: str) -> None:
    refs, why = REFUSED_RULES[case]
    route = users_route(*refs)
    refused = render.foreign_backends(route, EXISTING, OWNER, POOL)
    assert refused is not None and why in refused, refused
    assert render.users_pool(route, EXISTING, OWNER) is None


def test_a_pool_rule_with_backend_service_is_refused_not_replaced_by_services() -> None:
    refused = render.foreign_backends(users_route(USERS_POOL), EXISTING, OWNER, api.Backend.SERVICE)
    assert refused == (
        "spec.rollout.traffic.existingRoute: HTTPRoute chat's rule 'chat' sends traffic to InferencePool "
        "chat-pool (inference.networking.k8s.io): set spec.rollout.traffic.backend: InferencePool (with "
        "inferencePool.endpointPicker) so the rule is weighted across InferencePools, not replaced by "
        "Services that bypass its picker"
    )


STAGED = [USERS_POOL, pool_ref("llama-baseline", 0), pool_ref("llama-canary", 0)]


def adopting(
    monkeypatch: pytest.MonkeyPatch, own: dict[str, Any] = USERS_POOL
) -> tuple[Run, FakeKube, dict[str, Any]]:
    """The user's rule on `own`, and an object adopting it whose baseline has no Ready pod yet."""
    route = users_route(own)
    run = Run(make_spec(traffic=ON_USERS_RULE))
    fake = FakeKube(
        {"llama-baseline": TrackState(exists=True, replicas=2, ready_replicas=0)},
        routes={"chat": copy.deepcopy(route)},
        pools={"chat-pool": users_pool()},
    )
    fake.install(monkeypatch)
    monkeypatch.setattr(kopf, "event", lambda body, type, reason, message: None)
    return run, fake, route


def staged_on_ready(run: Run, fake: FakeKube, route: dict[str, Any]) -> None:
    """The rule kept while the baseline has no Ready pod; staged once it has (the user's backend at
    its weight, the tracks' pools named at 0), recorded."""
    run.status = reconcile_step(run, after=0).status
    assert fake.routes["chat"] == route and run.status.phase != Phase.FAILED
    fake.tracks["llama-baseline"] = ready(2)
    decision = reconcile_step(run, after=10)
    run.status = decision.status
    said = [(e.type, e.reason) for e in decision.events]
    assert ("Warning", Reason.ROUTE_NOT_ACCEPTED) in said, said  # what it waits for, as an Event too
    refs = fake.routes["chat"]["spec"]["rules"][0]["backendRefs"]
    assert refs == [
        *route["spec"]["rules"][0]["backendRefs"],
        pool_ref("llama-baseline", 0),
        pool_ref("llama-canary", 0),
    ]
    assert run.status.traffic is not None and run.status.traffic.original == api.OriginalRule(
        route="chat", rule_name="chat", backend_refs=route["spec"]["rules"][0]["backendRefs"]
    )


def gateway_accepts(fake: FakeKube, *objects: str) -> None:
    """The Gateway reports Accepted and ResolvedRefs on the route and/or pools named."""
    for name in objects:
        store = fake.routes if name == "chat" else fake.pools
        store[name] = accepted(store[name])


def test_the_users_pool_keeps_all_its_traffic_until_the_tracks_pools_are_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No weight moves to a pool a gateway may not serve yet: the rule is staged once the baseline
    is Ready, keeps its traffic on the user's pool while its Gateway has not accepted the staged
    rule and both pools (RouteNotAccepted, saying so), moves once it has, and is given back exactly
    on deletion. Before the staged step (main), the first write moved the weight at once."""
    run, fake, route = adopting(monkeypatch)
    staged_on_ready(run, fake, route)
    assert (run.status.phase, run.status.reason) == (Phase.BASELINE, Reason.ROUTE_NOT_ACCEPTED)
    assert (run.status.message or "").startswith(
        "the baseline's takeover of the rule waits for the HTTPRoute: the rule keeps all its traffic on "
        "your InferencePool chat-pool (inference.networking.k8s.io) until the Gateways accept "
        "InferencePools llama-baseline and llama-canary, once it names them at weight 0: "
    )  # decided on the rule as read before this reconcile staged it
    assert run.status.traffic is not None and run.status.traffic.desired is None
    applied = [call[2] for call in fake.calls if call[:2] == ("apply", "InferencePool")]
    assert applied == NAMES  # specgate's own pools, with the spec's pickers; the user's is not written
    gateway_accepts(fake, "chat", "llama-baseline")  # the staged rule and one pool: not yet
    fake.calls.clear()
    run.status = reconcile_step(run, after=20).status
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == STAGED
    assert not [call for call in fake.calls if call[0] == "patch route"]
    assert (run.status.message or "").endswith(
        "which it names at weight 0: InferencePool llama-canary: no Gateway has picked up the "
        "InferencePool yet (status.parents is empty)"
    )
    gateway_accepts(fake, "llama-canary")
    run.status = reconcile_step(run, after=30).status
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == [
        pool_ref("llama-baseline", 2),
        pool_ref("llama-canary", 0),
    ]
    assert run.status.traffic is not None and run.status.traffic.desired == api.RouteWeights(
        baseline=100, canary=0
    )
    assert run.status.reason != Reason.ROUTE_NOT_ACCEPTED and run.status.held_since is None
    assert fake.pools["chat-pool"] == users_pool()
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda body, type, reason, message: posted.append((type, reason)))
    assert run.status.traffic.original is not None
    handlers.restore_rule(**deleting(run.status.traffic.original))
    assert fake.routes["chat"] == accepted(route)  # the user's rule exactly (the status as the Gateway wrote)
    assert posted == [("Normal", Reason.ROUTE_RULE_RESTORED)]


def test_a_router_switch_mid_stage_gives_the_users_rule_back_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    run, fake, route = adopting(monkeypatch)
    staged_on_ready(run, fake, route)
    edit(run, traffic={"router": "Service"})
    run.status = reconcile_step(run, after=20).status
    assert fake.routes["chat"] == route and run.status.traffic is None


def test_deletion_mid_stage_gives_the_users_rule_back_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    run, fake, route = adopting(monkeypatch)
    staged_on_ready(run, fake, route)
    assert run.status.traffic is not None and run.status.traffic.original is not None
    handlers.restore_rule(**deleting(run.status.traffic.original))
    assert fake.routes["chat"] == route


def test_a_users_pool_gone_mid_stage_is_not_pointed_back_at(monkeypatch: pytest.MonkeyPatch) -> None:
    run, fake, route = adopting(monkeypatch)
    staged_on_ready(run, fake, route)
    del fake.pools["chat-pool"]
    assert run.status.traffic is not None and run.status.traffic.original is not None
    handlers.restore_rule(**deleting(run.status.traffic.original))
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == render.shared_service_refs(OWNER)


def test_pools_never_accepted_end_the_hold_at_progress_deadline_on_the_users_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hold like any other: past progressDeadline (5m here) the rollout stops (RouteNotAccepted),
    and the rule's traffic is still all on the user's pool."""
    run, fake, route = adopting(monkeypatch)
    staged_on_ready(run, fake, route)
    gateway_accepts(fake, "chat")  # the route accepted; its Gateway never reports on the pools
    for after in range(20, 330, 10):
        run.status = reconcile_step(run, after=after).status
        if run.status.phase != Phase.BASELINE:
            break
        assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED and run.status.held_since is not None
    assert (run.status.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.ROUTE_NOT_ACCEPTED)
    assert run.status.held_since is None  # entering RolledBack ends the hold
    assert "held past progressDeadline 5m" in (run.status.message or "")
    assert after == 320  # held from the staging tick at 10 s: 320 s is the first tick past 5m
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == STAGED
    run.status = reconcile_step(run, after=340).status  # RolledBack keeps it so
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == STAGED


def test_a_record_lost_mid_stage_is_taken_from_the_staged_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator killed between the staged write and its status write: the next reads find the
    staged rule, and the record taken at the move is the user's own backends, not the pools."""
    run, fake, route = adopting(monkeypatch)
    staged_on_ready(run, fake, route)
    run.status = run.status.model_copy(update={"traffic": None})  # the status write lost
    gateway_accepts(fake, "chat", *NAMES)
    run.status = reconcile_step(run, after=20).status
    assert render.route_weights(fake.routes["chat"], 0, OWNER, POOL) == Weights(100, 0)
    assert run.status.traffic is not None and run.status.traffic.original == api.OriginalRule(
        route="chat", rule_name="chat", backend_refs=[USERS_POOL]
    )


def test_a_users_rule_of_services_is_staged_too_and_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule of core Services taken over with backend InferencePool: its Services keep the traffic
    beside the pools at 0 until they are accepted (the staged rule is not refused as three backends)."""
    run, fake, route = adopting(monkeypatch, own=USERS_SERVICE)
    staged_on_ready(run, fake, route)
    gateway_accepts(fake, "chat", *NAMES)
    run.status = reconcile_step(run, after=20).status
    assert run.status.phase != Phase.FAILED, run.status.message
    assert render.route_weights(fake.routes["chat"], 0, OWNER, POOL) == Weights(100, 0)
    assert run.status.traffic is not None and run.status.traffic.original is not None
    handlers.restore_rule(**deleting(run.status.traffic.original))
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == [USERS_SERVICE]


def test_the_staged_rule_is_read_as_the_users() -> None:
    """The three-backend rule: no weight on the tracks (their pools carry none), its user's part
    what is adopted, recorded and refused by, and what stage_patch writes again unchanged."""
    staged = users_route(*STAGED)
    assert render.staged_refs(STAGED, OWNER) == [USERS_POOL]
    assert render.route_weights(staged, 0, OWNER, POOL) is None
    assert render.users_pool(staged, EXISTING, OWNER) == "chat-pool"
    assert render.foreign_backends(staged, EXISTING, OWNER, POOL) is None
    record = render.rule_record(staged, EXISTING, OWNER)
    assert record is not None and record.backend_refs == [USERS_POOL]
    assert render.stage_patch(staged, EXISTING, OWNER) == []
    edited = users_route(USERS_POOL, pool_ref("llama-baseline", 3), pool_ref("llama-canary", 1))
    assert render.staged_refs(edited["spec"]["rules"][0]["backendRefs"], OWNER) == [USERS_POOL]
    assert json_patched(edited, render.stage_patch(edited, EXISTING, OWNER)) == staged  # back to 0
    assert render.staged_refs([pool_ref("llama-baseline", 1), pool_ref("llama-canary", 0)], OWNER) is None
    assert render.staged_refs([USERS_POOL, pool_ref("llama-baseline", 0)], OWNER) is None
    assert (
        render.staged_refs([USERS_POOL, pool_ref("other-baseline", 0), pool_ref("other-canary", 0)], OWNER)
        is None
    )


def test_a_users_rule_without_backends_is_staged_and_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule with no backendRefs (it answers nothing) is staged as the pools alone at weight 0, moved
    once they are accepted, and given back with none."""
    route = users_route()
    run = Run(make_spec(traffic=ON_USERS_RULE))
    fake = FakeKube({"llama-baseline": ready(2)}, routes={"chat": copy.deepcopy(route)}).install(monkeypatch)
    run.status = reconcile_step(run, after=0).status
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == STAGED[1:]
    assert render.staged_refs(STAGED[1:], OWNER) == []
    gateway_accepts(fake, "chat", *NAMES)
    run.status = reconcile_step(run, after=10).status
    assert render.route_weights(fake.routes["chat"], 0, OWNER, POOL) == Weights(100, 0)
    assert run.status.traffic is not None and run.status.traffic.original is not None
    assert run.status.traffic.original.backend_refs == []
    monkeypatch.setattr(kopf, "event", lambda body, type, reason, message: None)
    handlers.restore_rule(**deleting(run.status.traffic.original))
    assert "backendRefs" not in fake.routes["chat"]["spec"]["rules"][0]


def test_the_staged_rule_holds_until_the_route_and_both_pools_are_accepted() -> None:
    base, can = render.inference_pools(OWNER, TRAFFIC)
    users = api.Traffic.model_validate(ON_USERS_RULE)
    staged = accepted(users_route(*STAGED))
    state = render.route_state(staged, users, OWNER, pools_read(accepted(base), accepted(can)))
    assert state == RouteState(staged=True)  # accepted: through_stage lets the weight move
    state = render.route_state(staged, users, OWNER, pools_read(accepted(base), can))
    assert state.staged and state.weights is None and state.written is None
    assert state.hold == (
        "the rule keeps all its traffic on your InferencePool chat-pool (inference.networking.k8s.io) "
        "until the Gateways accept InferencePools llama-baseline and llama-canary, which it names at "
        "weight 0: InferencePool llama-canary: no Gateway has picked up the InferencePool yet "
        "(status.parents is empty)"
    )


def test_a_takeover_goes_through_the_stage() -> None:
    move = Weights(100, 0)
    assert traffic.through_stage(move, takes_over=True, staged=False, accepted=True) is None
    assert traffic.through_stage(move, takes_over=True, staged=True, accepted=False) is None
    assert traffic.through_stage(move, takes_over=True, staged=True, accepted=True) == move
    assert traffic.through_stage(move, takes_over=False, staged=False, accepted=False) == move
    assert traffic.through_stage(None, takes_over=True, staged=False, accepted=False) is None


def deleting(record: api.OriginalRule) -> dict[str, Any]:
    """restore_rule's arguments for the object being deleted with this record in status."""
    traffic = api.TrafficStatus(route="chat", original=record)
    status = api.SpeculativeDeploymentStatus(traffic=traffic).model_dump(by_alias=True, mode="json")
    meta = {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid}
    body = kopf.Body({"metadata": meta, "spec": {}, "status": status})
    return {"body": body, "meta": body.meta, "spec": body.spec, "status": body.status, "runtime": timedelta()}


def taken_rule() -> dict[str, Any]:
    return users_route(pool_ref("llama-baseline", 1), pool_ref("llama-canary", 1))


def test_deletion_points_the_rule_back_at_the_users_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKube(routes={"chat": taken_rule()}, pools={"chat-pool": users_pool()}).install(monkeypatch)
    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda body, type, reason, message: posted.append((type, reason)))
    record = api.OriginalRule(route="chat", rule_name="chat", backend_refs=[USERS_POOL])
    handlers.restore_rule(**deleting(record))
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == [USERS_POOL]
    assert posted == [("Normal", Reason.ROUTE_RULE_RESTORED)]


def test_a_users_pool_gone_is_not_pointed_back_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for a Service gone: a rule pointed back at a pool that does not exist answers nothing."""
    fake = FakeKube(routes={"chat": taken_rule()}).install(monkeypatch)
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        kopf, "event", lambda body, type, reason, message: posted.append((type, reason, message))
    )
    record = api.OriginalRule(route="chat", rule_name="chat", backend_refs=[USERS_POOL])
    handlers.restore_rule(**deleting(record))
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == render.shared_service_refs(OWNER)
    ((kind, reason, message),) = posted
    assert (kind, reason) == ("Warning", Reason.ROUTE_RULE_NOT_RESTORED)
    assert (
        "its own backends (InferencePool chat-pool) no longer exist, so it routes to Service llama" in message
    )


def test_a_spec_picker_that_is_the_users_pools_own_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A picker picks from the one pool it runs for: the baseline's pool cannot borrow the user's."""
    shared = {
        **ON_USERS_RULE,
        "inferencePool": {"endpointPicker": {**PICKERS, "baseline": {"name": "chat-epp", "port": 9002}}},
    }
    route = users_route(USERS_POOL)
    run = Run(make_spec(traffic=shared))
    fake = FakeKube(
        {"llama-baseline": ready(2)}, routes={"chat": copy.deepcopy(route)}, pools={"chat-pool": users_pool()}
    )
    fake.install(monkeypatch)
    status = reconcile_step(run, after=0).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.INVALID_SPEC)
    assert (status.message or "").startswith(
        "spec.rollout.traffic.inferencePool.endpointPicker.baseline: Service chat-epp is the endpoint "
        "picker of your InferencePool chat-pool"
    )
    assert fake.routes["chat"] == route and not [c for c in fake.calls if c[0] == "apply"]
    fake.pools["chat-pool"] = users_pool(picker=None)  # the user's pool without a picker: none is shared
    run.status = status
    assert reconcile_step(run, after=10).status.phase != Phase.FAILED


# --- a pool's endpoint picker Service missing: the hold says which field to fix ---


def test_a_pools_missing_picker_service_is_named_in_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route's hold (RouteNotAccepted, with its deadline) says why the canary's pool is not
    resolved where its picker's Service is absent; a pool resolved is not looked up."""
    fake = FakeKube(missing_services={"llama-canary-epp", "llama-epp"}).install(monkeypatch)
    base, can = render.inference_pools(OWNER, TRAFFIC)
    pools = pools_read(accepted(base), can)  # no Gateway resolved the canary's pool
    state = handlers._route_state(owned_route(), TRAFFIC, OWNER, pools)
    assert state == RouteState(
        hold="InferencePool llama-canary: its endpointPickerRef names Service llama-canary-epp, which "
        "does not exist in namespace ml: deploy the endpoint picker of InferencePool llama-canary there, "
        "or fix spec.rollout.traffic.inferencePool.endpointPicker.canary.name (parent Gateway inference: "
        "has not reported on the InferencePool yet)",
        written=Weights(75, 25),
    )
    fake.missing_services = {"llama-epp"}  # the canary's picker deployed: the gateway's own reason
    state = handlers._route_state(owned_route(), TRAFFIC, OWNER, pools)
    assert (
        state.hold
        == "InferencePool llama-canary: parent Gateway inference: has not reported on the InferencePool yet"
    )
