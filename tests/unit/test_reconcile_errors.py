"""Issue 61: a reconcile that raises the same exception again and again is surfaced in status (the
ReconcileError condition) and by a Warning Event, not only in the operator's log and metric."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from prometheus_client import REGISTRY
from tests.unit.rollout_driver import Run

from specgate import api, handlers, kube
from specgate.rollout import Decision, Event

META = {"name": "llama", "namespace": "ml", "uid": "u-61", "generation": 3, "resourceVersion": "7"}


@pytest.fixture(autouse=True)
def written(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The statuses reconcile writes (kube.write_status), in order; each write succeeds."""
    statuses: list[dict[str, Any]] = []

    def write(meta: dict[str, Any], status: dict[str, Any]) -> bool:
        statuses.append(status)
        return True

    monkeypatch.setattr(kube, "write_status", write)
    return statuses


def reconcile(
    status: dict[str, Any], patch: kopf.Patch | None = None, replica_sets: bool = True
) -> kopf.Patch:
    """One tick of the kopf timer on the object into `patch` (returned; kopf applies it even when
    the handler raises, which propagates); without the ReplicaSet index where `replica_sets` is
    False (`specgate run` where the RBAC does not let it watch them)."""
    patch = kopf.Patch() if patch is None else patch
    indexes: dict[str, Any] = {"child_deployments": {}, "child_services": {}, "child_pods": {}}
    if replica_sets:
        indexes["child_replica_sets"] = {}
    body = kopf.Body({"metadata": META, "spec": {}, "status": status})
    handlers.reconcile(body=body, patch=patch, **indexes)
    return patch


def gauge() -> float | None:
    """specgate_condition{type="ReconcileError"} of the object, as /metrics serves it."""
    labels = {"namespace": "ml", "name": "llama", "type": "ReconcileError"}
    return REGISTRY.get_sample_value("specgate_condition", labels)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_the_same_error_raised_n_times_is_a_condition_and_one_event_then_cleared(
    monkeypatch: pytest.MonkeyPatch, written: list[dict[str, Any]]
) -> None:
    events: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "event", lambda body, **event: events.append(event))
    run = Run()
    run.to_analyzing()  # a status with the phase's conditions, as an object mid-rollout has
    status = run.status.model_dump(by_alias=True, mode="json")

    def broken(*_: Any) -> Decision:
        raise ValueError("evaluate needs both tracks' benchmarks")

    monkeypatch.setattr(handlers, "step", broken)
    patches = [kopf.Patch() for _ in range(handlers.RECONCILE_ERRORS_SURFACED + 1)]
    for patch in patches:
        with pytest.raises(ValueError, match="evaluate needs"):
            reconcile(status, patch)
    assert handlers.RECONCILE_ERRORS_SURFACED == 3
    assert [dict(p) for p in patches] == [{}, {}, dict(patches[2]), {}]  # written once, at the third
    failing = condition(patches[2]["status"], "ReconcileError")
    assert failing["status"] == "True" and failing["observedGeneration"] == 3
    assert "the last 3 reconciles raised the same error" in failing["message"]
    assert "ValueError: evaluate needs both tracks' benchmarks" in failing["message"]
    assert condition(patches[2]["status"], "Progressing")["status"] == "True"  # the phase's conditions kept
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "ReconcileError")]
    assert gauge() == 1

    # Fixed (a new operator, the edit undone): the next reconcile clears it, and a new failure counts from 1.
    status["conditions"] = patches[2]["status"]["conditions"]
    kept = api.parse_status(status)
    monkeypatch.setattr(handlers, "step", lambda *_: Decision(kept, baseline_replicas=1, canary_replicas=1))
    reconcile(status)
    assert condition(written[-1], "ReconcileError")["status"] == "False"
    assert gauge() == 0
    monkeypatch.setattr(handlers, "step", broken)
    with pytest.raises(ValueError):
        reconcile(status)
    assert handlers._FAILURES["u-61"][1] == 1


def test_a_reconcile_without_the_replica_set_index_decides_on_no_replica_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where `specgate run` may not watch ReplicaSets it registers no index for them: reconcile
    passes step the children it has, with no ReplicaSets, as where none were seen."""
    seen: list[kube.Children] = []
    kept = api.parse_status({})

    def step(*args: Any) -> Decision:
        seen.append(args[-1])
        return Decision(kept, baseline_replicas=1, canary_replicas=1)

    monkeypatch.setattr(handlers, "step", step)
    reconcile({}, replica_sets=False)
    assert [dict(children.replica_sets) for children in seen] == [{}]


def test_different_errors_in_a_row_are_not_the_same_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flaky API server answering a different error each time is the metric's and alert's to show;
    the condition says that one error keeps coming back."""
    monkeypatch.setattr(kopf, "event", lambda body, **event: None)
    errors = iter([ConnectionError("a"), ConnectionError("b"), ConnectionError("a"), ConnectionError("b")])

    def flaky(*_: Any) -> Decision:
        raise next(errors)

    monkeypatch.setattr(handlers, "step", flaky)
    for _ in range(4):
        with pytest.raises(ConnectionError):
            reconcile({})
    assert handlers._FAILURES["u-61"] == ("ConnectionError: b", 1)


def test_a_decision_on_an_object_changed_since_it_was_read_writes_and_tells_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The status write is refused (the object's resourceVersion moved on: kube.write_status False):
    the transition's Event is not sent either, and the next tick decides on the object as it is."""
    events: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "event", lambda body, **event: events.append(event))
    monkeypatch.setattr(kube, "write_status", lambda meta, status: False)
    moved = api.parse_status({"phase": "Canary"})
    told = Event("Normal", "BaselineMeasured", "baseline: ...")
    monkeypatch.setattr(handlers, "step", lambda *_: Decision(moved, 1, 1, events=(told,)))
    reconcile({"phase": "Baseline"})
    assert events == []
    monkeypatch.setattr(kube, "write_status", lambda meta, status: True)
    reconcile({"phase": "Baseline"})
    assert [e["reason"] for e in events] == ["BaselineMeasured"]
