"""handlers.step and the deletion handler with spec.workloadRef, specgate.kube faked at its module
seam: what is read of the adopted Deployment, what is written (its replicas through the scale
subresource, never its template), and what is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from tests.unit.handler_fakes import OWNER, FakeKube
from tests.unit.spec_cases import adopting
from tests.unit.test_adopt import helm_deployment

from specgate import api, handlers, kube
from specgate.api import Phase
from specgate.observation import TrackState

NOW = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
HPA = {"metadata": {"name": "llama-hpa"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llama"}}}


def serving(replicas: int = 2) -> dict[str, Any]:
    body = helm_deployment()
    body["spec"]["replicas"] = replicas
    body["metadata"]["generation"] = 1
    body["status"] = {
        "observedGeneration": 1,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
    }
    return body


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    return FakeKube().install(monkeypatch)


def cluster(
    monkeypatch: pytest.MonkeyPatch,
    deployment: dict[str, Any] | None,
    hpas: list[dict[str, Any]] | None = None,
) -> None:
    monkeypatch.setattr(
        kube, "read_deployment", lambda namespace, name: deployment if name == "llama" else None
    )
    monkeypatch.setattr(kube, "autoscalers", lambda namespace: (hpas or [], []))


def reconcile(status: api.SpeculativeDeploymentStatus | None = None, **spec: Any) -> Any:
    raw = adopting(replicas=2, **spec)
    return handlers.step(raw, status or api.SpeculativeDeploymentStatus(), OWNER, 1, NOW, {}, kube.Children())


def test_the_first_reconcile_starts_the_baseline_from_the_deployments_template_and_renders_no_service(
    monkeypatch: pytest.MonkeyPatch, fake: FakeKube
) -> None:
    cluster(monkeypatch, serving())
    decision = reconcile()
    assert (decision.status.phase, decision.status.reason) == (Phase.PENDING, "HandingOver")
    assert ("apply", "Deployment", "llama-baseline", 1) in fake.calls  # maxSurge 1: one pod beside its 2
    assert not [c for c in fake.calls if c[0] == "scale"], (
        "nothing Ready of specgate's yet: the Deployment stays"
    )
    assert not [c for c in fake.calls if c[:2] == ("apply", "Service")], "the user's Service serves"
    assert decision.status.workload == api.WorkloadStatus(
        name="llama",
        original_replicas=2,
        replicas=2,
        handed_over=False,
        message=decision.status.workload.message,
    )
    assert decision.status.selector == "specgate.dev/deployment=llama,specgate.dev/engine=vllm"


def test_the_deployment_is_lowered_through_the_scale_subresource_as_the_baseline_becomes_ready(
    monkeypatch: pytest.MonkeyPatch, fake: FakeKube
) -> None:
    cluster(monkeypatch, serving())
    first = reconcile()
    fake.tracks["llama-baseline"] = TrackState(exists=True, replicas=1, ready_replicas=1)
    fake.calls.clear()
    second = reconcile(first.status)
    assert ("scale", "llama", 1) in fake.calls
    assert ("apply", "Deployment", "llama-baseline", 1) in fake.calls, "its 2 pods count until they are gone"
    assert [e.message.split(":")[0] for e in second.events] == [
        "scaled Deployment llama from 2 to 1 replicas (its template untouched)"
    ]
    cluster(monkeypatch, serving(1))
    fake.calls.clear()
    reconcile(second.status)
    assert ("apply", "Deployment", "llama-baseline", 2) in fake.calls
    assert not [c for c in fake.calls if c[0] == "scale"], "1 Ready of its own beside the baseline's 1"


@pytest.mark.parametrize(
    ("deployment", "hpas", "message"),
    [
        (None, None, "spec.workloadRef: Deployment llama does not exist in namespace ml"),
        (serving(), [HPA], "HorizontalPodAutoscaler llama-hpa scales Deployment llama"),
        (serving(3), None, "spec.replicas 2 is below the 3 replicas of Deployment llama"),
    ],
)
def test_what_cannot_be_adopted_fails_touching_nothing(
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeKube,
    deployment: dict[str, Any] | None,
    hpas: list[dict[str, Any]] | None,
    message: str,
) -> None:
    cluster(monkeypatch, deployment, hpas)
    decision = reconcile()
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, "WorkloadNotAdoptable")
    assert decision.status.message is not None and decision.status.message.startswith(message)
    assert fake.calls == []


def test_a_shell_string_container_fails_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, fake: FakeKube
) -> None:
    body = serving()
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["sh", "-c", "vllm serve m"]
    cluster(monkeypatch, body)
    decision = reconcile()
    assert decision.status.reason == "WorkloadNotAdoptable"
    assert (
        decision.status.message is not None and "start it as command [vllm, serve]" in decision.status.message
    )
    assert fake.calls == []


def deleted(replicas_before: int, runtime: float = 0, on_delete: str = "HandBack") -> dict[str, Any]:
    record = api.WorkloadStatus(name="llama", original_replicas=replicas_before, replicas=0, handed_over=True)
    status = api.SpeculativeDeploymentStatus(workload=record).model_dump(by_alias=True, mode="json")
    spec = adopting(replicas=2, workloadRef={"name": "llama", "onDelete": on_delete})
    body = kopf.Body(
        {"metadata": {"name": "llama", "namespace": "ml", "uid": "u-1"}, "spec": spec, "status": status}
    )
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


def scaled_down() -> dict[str, Any]:
    body = serving(0)
    body["status"] = {"observedGeneration": 1, "replicas": 0}
    return body


def test_deletion_scales_the_deployment_back_and_holds_until_its_pods_are_ready(
    monkeypatch: pytest.MonkeyPatch, fake: FakeKube, events: list[Any]
) -> None:
    cluster(monkeypatch, scaled_down())
    with pytest.raises(kopf.TemporaryError, match="handing back"):
        handlers.hand_back(**deleted(2))
    assert fake.calls == [("scale", "llama", 2)] and events == []
    cluster(monkeypatch, serving(2))
    handlers.hand_back(**deleted(2, runtime=120))
    assert events == [
        ("Normal", "HandedBack", "handed back: the adopted Deployment serves with 2 Ready pods")
    ]


def test_deletion_lets_go_at_progress_deadline_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, fake: FakeKube, events: list[Any]
) -> None:
    cluster(monkeypatch, scaled_down())
    handlers.hand_back(**deleted(2, runtime=15 * 60))  # progressDeadline's default: 15m
    assert [(type, reason) for type, reason, _ in events] == [("Warning", "HandedBack")]


def test_deletion_with_on_delete_leave_leaves_the_replicas(
    monkeypatch: pytest.MonkeyPatch, fake: FakeKube, events: list[Any]
) -> None:
    cluster(monkeypatch, scaled_down())
    handlers.hand_back(**deleted(2, on_delete="Leave"))
    assert fake.calls == []


def test_only_adopting_objects_get_the_hand_back_handler() -> None:
    adopting_object = deleted(2)
    plain = {**adopting_object, "spec": kopf.Spec(kopf.Body({"spec": {"model": {"name": "m"}}}))}
    assert [handlers._adopts(**kwargs) for kwargs in (adopting_object, plain)] == [True, False]
