"""traffic.existingRoute: the user's rule's own backendRefs are recorded once, as specgate first sets
them, and put back when the object is deleted (restore_rule, kopf's delete handler) or stops routing
that rule (handlers.step), only while the rule still routes to the tracks' Services (issue 41)."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException
from tests.unit.handler_fakes import OWNER, FakeKube, json_patched, reconcile_step
from tests.unit.rollout_driver import Run, make_spec, ready

from specgate import api, handlers, kube, render
from specgate.rollout import Reason
from specgate.traffic import Weights

EXISTING = {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleName": "completions"}}
BY_INDEX = {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleIndex": 1}}
OWNED = {"router": "GatewayAPI", "httpRoute": {"parentRefs": [{"name": "inference", "namespace": "gw"}]}}
USERS = [{"group": "", "kind": "Service", "name": "vllm", "port": 8000, "weight": 1}]
PROBE = [{"name": "probe", "port": 80}]


def route(completions: list[dict[str, Any]] | None, version: str = "77") -> dict[str, Any]:
    """HTTPRoute chat as read: rule health, then rule completions with these backendRefs (None: none)."""
    rule: dict[str, Any] = {"name": "completions"}
    if completions is not None:
        rule["backendRefs"] = completions
    return {
        "apiVersion": render.GATEWAY_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {"name": "chat", "namespace": "ml", "resourceVersion": version},
        "spec": {"rules": [{"name": "health", "backendRefs": PROBE}, rule]},
    }


def tracks(baseline: int = 100, canary: int = 0) -> list[dict[str, Any]]:
    return render.backend_refs(OWNER, Weights(baseline, canary))


# What specgate writes beside 2 Ready baseline pods: the pod counts (Gateway API weights are relative,
# issue 57), which route at 100/0.
WRITTEN = render.backend_refs(OWNER, Weights(100, 0, relative=(2, 0)))


def completions(fake: FakeKube) -> Any:
    return fake.routes["chat"]["spec"]["rules"][1].get("backendRefs")


def record(refs: list[dict[str, Any]], **rule: Any) -> api.OriginalRule:
    return api.OriginalRule(route="chat", backend_refs=refs, **(rule or {"rule_name": "completions"}))


# --- render: the record and the patch that puts it back ---


def test_the_record_is_the_rules_backend_refs_and_none_where_they_are_the_tracks_already() -> None:
    existing = api.ExistingRoute(name="chat", rule_name="completions")
    assert render.rule_record(route(USERS), existing, OWNER) == record(USERS)
    assert render.rule_record(route(None), existing, OWNER) == record([])
    assert render.rule_record(route(tracks(75, 25)), existing, OWNER) is None  # nothing of the user's


def test_the_restore_patch_tests_the_rule_and_what_it_routes_to_then_puts_the_record_back() -> None:
    read = route(tracks(75, 25))
    operations = render.restore_patch(read, record(USERS), OWNER)
    assert operations == [
        {"op": "test", "path": "/spec/rules/1/name", "value": "completions"},
        {"op": "test", "path": "/spec/rules/1/backendRefs", "value": tracks(75, 25)},
        {"op": "replace", "path": "/spec/rules/1/backendRefs", "value": USERS},
    ]
    assert json_patched(read, operations) == route(USERS)
    assert json_patched(read, render.restore_patch(read, record([]), OWNER)) == route(None)  # had none


def test_a_rule_by_index_is_guarded_by_the_routes_resource_version() -> None:
    operations = render.restore_patch(route(tracks()), record(USERS, rule_index=1), OWNER)
    assert operations[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "77"}
    with pytest.raises(kube.Conflict):  # a write since the read: refused, not overwritten
        json_patched(route(tracks(), version="78"), operations)


@pytest.mark.parametrize(
    ("read", "original", "why"),
    [
        (route(tracks()), record(USERS, rule_name="chat-v2"), "HTTPRoute chat's rule 'chat-v2' is gone"),
        (route(tracks()), record(USERS, rule_index=2), "HTTPRoute chat's rule at index 2 is gone"),
        (
            route(USERS),
            record(USERS),
            "HTTPRoute chat's rule 'completions' no longer routes to Services llama-baseline and llama-canary",
        ),
    ],
)
def test_nothing_is_put_back_on_a_rule_gone_or_routing_elsewhere(
    read: dict[str, Any], original: api.OriginalRule, why: str
) -> None:
    with pytest.raises(LookupError, match=f"^{why}$"):
        render.restore_patch(read, original, OWNER)


# --- handlers.step: recorded once; put back when the object stops routing the rule ---


def taken_over(monkeypatch: pytest.MonkeyPatch, traffic: dict[str, Any] = EXISTING) -> tuple[Run, FakeKube]:
    """A reconcile that took rule completions over from the user's Service vllm."""
    run = Run(make_spec(traffic=traffic))
    fake = FakeKube({"llama-baseline": ready(2)}, routes={"chat": route(USERS)}).install(monkeypatch)
    run.status = reconcile_step(run, after=0).status
    assert completions(fake) == WRITTEN
    return run, fake


def test_the_rules_own_backend_refs_are_recorded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    run, fake = taken_over(monkeypatch)
    assert run.status.traffic is not None and run.status.traffic.original == record(USERS)
    # The route's owner applies it again: specgate sets the rule again and keeps the first record.
    fake.routes["chat"] = route([{"name": "vllm-v2", "port": 8000}])
    status = reconcile_step(run, after=10).status
    assert completions(fake) == WRITTEN
    assert status.traffic is not None and status.traffic.original == record(USERS)


def test_no_record_for_a_route_of_specgates_own(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(make_spec(traffic=OWNED))
    FakeKube({"llama-baseline": ready(2)}).install(monkeypatch)
    traffic = reconcile_step(run, after=0).status.traffic
    assert traffic is not None and traffic.original is None


def test_the_router_back_to_service_puts_the_rule_back(monkeypatch: pytest.MonkeyPatch) -> None:
    run, fake = taken_over(monkeypatch)
    run.spec = make_spec()
    decision = reconcile_step(run, after=10)
    assert completions(fake) == USERS
    assert decision.status.traffic is None
    assert [(e.type, e.reason) for e in decision.events] == [("Normal", Reason.ROUTE_RULE_RESTORED)]


def test_a_rule_that_moved_keeps_its_record_until_the_next_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    run, fake = taken_over(monkeypatch, BY_INDEX)
    run.spec = make_spec()
    real_read = fake.read_route
    monkeypatch.setattr(handlers.kube, "read_route", lambda ns, name: route(tracks(), version="76"))
    kept = reconcile_step(run, after=10).status.traffic  # the route changed after this (stale) read
    assert completions(fake) == WRITTEN
    assert kept is not None and kept.route == "chat" and kept.original == record(USERS, rule_index=1)
    assert kept.desired is None
    monkeypatch.setattr(handlers.kube, "read_route", real_read)
    run.status = run.status.model_copy(update={"traffic": kept})
    assert reconcile_step(run, after=10).status.traffic is None
    assert completions(fake) == USERS


def test_another_rule_gets_the_old_one_put_back_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    run, fake = taken_over(monkeypatch)
    run.spec = make_spec(traffic={**EXISTING, "existingRoute": {"name": "chat", "ruleName": "health"}})
    traffic = reconcile_step(run, after=10).status.traffic
    rules = fake.routes["chat"]["spec"]["rules"]
    assert (rules[0]["backendRefs"], rules[1]["backendRefs"]) == (WRITTEN, USERS)
    assert traffic is not None and traffic.original == record(PROBE, rule_name="health")


def test_a_rule_pointed_elsewhere_is_left_with_a_warning_and_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run, fake = taken_over(monkeypatch)
    fake.routes["chat"] = route([{"name": "other", "port": 8000}])  # pointed back by hand, elsewhere
    run.spec = make_spec()
    decision = reconcile_step(run, after=10)
    assert completions(fake) == [{"name": "other", "port": 8000}]
    assert decision.status.traffic is None
    (event,) = decision.events
    assert (event.type, event.reason) == ("Warning", Reason.ROUTE_RULE_NOT_RESTORED)
    assert "no longer routes to Services llama-baseline and llama-canary" in event.message


# --- the delete handler ---


def deleted(
    original: api.OriginalRule | None, spec: dict[str, Any] | None = None, runtime: float = 0
) -> dict[str, Any]:
    """restore_rule's arguments for the object being deleted, with this record in status, `runtime`
    seconds after kopf first ran the handler for this deletion."""
    traffic = None if original is None else api.TrafficStatus(route="chat", original=original)
    status = api.SpeculativeDeploymentStatus(traffic=traffic).model_dump(by_alias=True, mode="json")
    meta = {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid}
    body = kopf.Body({"metadata": meta, "spec": spec or {}, "status": status})
    return {
        "body": body,
        "meta": body.meta,
        "spec": body.spec,
        "status": body.status,
        "runtime": timedelta(seconds=runtime),
    }


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        kopf, "event", lambda body, type, reason, message: posted.append((type, reason, message))
    )
    return posted


def test_deletion_puts_the_rule_back(monkeypatch: pytest.MonkeyPatch, events: list[Any]) -> None:
    fake = FakeKube(routes={"chat": route(tracks(60, 40))}).install(monkeypatch)
    handlers.restore_rule(**deleted(record(USERS)))
    assert completions(fake) == USERS
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == PROBE
    assert events == [
        (
            "Normal",
            Reason.ROUTE_RULE_RESTORED,
            "HTTPRoute chat's rule 'completions': its own backendRefs are back, as before specgate routed it",
        )
    ]


def test_deletion_without_a_record_or_a_route_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, events: list[Any]
) -> None:
    fake = FakeKube(routes={"chat": route(tracks())}).install(monkeypatch)
    handlers.restore_rule(**deleted(None, {"rollout": {"traffic": EXISTING}}))  # never taken over
    del fake.routes["chat"]
    handlers.restore_rule(**deleted(record(USERS)))  # the route was deleted first
    assert fake.calls == [] and events == []


def test_deletion_leaves_a_rule_gone_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, events: list[Any]
) -> None:
    fake = FakeKube(routes={"chat": route(tracks())}).install(monkeypatch)
    fake.routes["chat"]["spec"]["rules"].pop()
    handlers.restore_rule(**deleted(record(USERS)))
    assert fake.calls == []
    assert [(type, reason) for type, reason, _ in events] == [("Warning", Reason.ROUTE_RULE_NOT_RESTORED)]


def test_deletion_tries_again_where_the_rules_moved(
    monkeypatch: pytest.MonkeyPatch, events: list[Any]
) -> None:
    fake = FakeKube(routes={"chat": route(tracks())}).install(monkeypatch)
    stale = copy.deepcopy(fake.routes["chat"])
    fake.routes["chat"]["metadata"]["resourceVersion"] = "78"
    monkeypatch.setattr(handlers.kube, "read_route", lambda ns, name: stale)
    with pytest.raises(kopf.TemporaryError):
        handlers.restore_rule(**deleted(record(USERS, rule_index=1)))
    assert completions(fake) == tracks() and events == []


def test_deletion_tries_again_until_progress_deadline_then_lets_the_object_go(
    monkeypatch: pytest.MonkeyPatch, events: list[Any]
) -> None:
    """On 1be5013 kopf gave up after 6 retries 10 s apart, however long the object's deadline: an API
    server restarting for a minute left the rule on Services about to be deleted. Now every failure
    is tried again until progressDeadline from the deletion; past it, a Warning says the rule was left."""
    FakeKube(routes={"chat": route(tracks())}).install(monkeypatch)

    def down(namespace: str, name: str) -> dict[str, Any]:
        raise ApiException(status=503, reason="Service Unavailable")

    monkeypatch.setattr(handlers.kube, "read_route", down)
    spec = make_spec(traffic=EXISTING, progressDeadline="30m").model_dump(by_alias=True, mode="json")
    with pytest.raises(kopf.TemporaryError):
        handlers.restore_rule(**deleted(record(USERS), spec, runtime=25 * 60))
    assert events == []
    handlers.restore_rule(**deleted(record(USERS), spec, runtime=30 * 60))
    ((type, reason, message),) = events
    assert (type, reason) == ("Warning", Reason.ROUTE_RULE_NOT_RESTORED)
    assert "within progressDeadline (1800 s) of the deletion and were left as they are" in message
    assert handlers.restore_deadline({}) == timedelta(minutes=15)  # a spec that cannot be read: the default


def test_deletion_points_a_rule_whose_own_service_is_gone_at_the_shared_service(
    monkeypatch: pytest.MonkeyPatch, events: list[Any]
) -> None:
    """The user's Service vllm was deleted before the object: the rule is not pointed back at it (a
    backend that answers nothing) nor left on the track Services' frozen weights, but routes to
    Service llama while it lasts, and the Warning says so (on 1be5013 it was pointed back at vllm)."""
    fake = FakeKube(routes={"chat": route(tracks(60, 40))}, missing_services={"vllm"}).install(monkeypatch)
    handlers.restore_rule(**deleted(record(USERS)))
    assert completions(fake) == [{"kind": "Service", "name": "llama", "port": render.HTTP_PORT}]
    ((type, reason, message),) = events
    assert (type, reason) == ("Warning", Reason.ROUTE_RULE_NOT_RESTORED)
    assert (
        "(Service vllm) no longer exist, so it routes to Service llama instead, until this object's"
        in message
    )


def test_only_objects_that_hold_a_users_rule_get_the_delete_handler() -> None:
    """Its `when` filter: the others get no change handling from kopf (nor its annotation); no count
    of retries or fixed timeout bounds it (progressDeadline does, in the handler)."""
    found = kopf.get_default_registry()._changing.get_all_handlers()
    assert {(h.id, h.requires_finalizer, h.when, h.retries, h.timeout) for h in found} == {
        ("restore_rule", True, handlers._holds_a_rule, None, None),
        ("hand_back", True, handlers._adopts, None, None),  # spec.workloadRef (test_adopt_handlers.py)
    }
    with_rule = deleted(None, {"rollout": {"traffic": EXISTING}})
    with_record = deleted(record(USERS), {"rollout": {"traffic": OWNED}})
    without = deleted(None, {"rollout": {"traffic": OWNED}})
    assert [handlers._holds_a_rule(**kwargs) for kwargs in (with_rule, with_record, without)] == [
        True,
        True,
        False,
    ]
