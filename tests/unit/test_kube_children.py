"""A track's state from the watched children (the pod and Deployment objects as the API server
sends them, built with the kubernetes client's models and serialized), and the watch keys."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes.client import (
    ApiClient,
    V1Deployment,
    V1DeploymentSpec,
    V1DeploymentStatus,
    V1LabelSelector,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodStatus,
    V1PodTemplateSpec,
    V1ReplicaSet,
    V1ReplicaSetSpec,
    V1ReplicaSetStatus,
)
from kubernetes.client.exceptions import ApiException

from specgate import kube
from specgate.capacity import ReplicaSetState
from specgate.observation import TrackState
from specgate.render import ANNOTATION_RENDERED, ANNOTATION_TEMPLATE, Owner, Track, selector_labels

OWNER = Owner("llama", "ml", "u-1")
LABELS = selector_labels(OWNER, Track.CANARY)


def wire(model: Any) -> dict[str, Any]:
    return ApiClient().sanitize_for_serialization(model)  # type: ignore[no-any-return,no-untyped-call]


def deployment(
    replicas: int,
    template: str,
    ready: int,
    pods: int | None = None,
    updated: int | None = None,
    seen: int = 4,
) -> dict[str, Any]:
    """A Deployment at generation 4 whose controller has seen generation `seen`, with `pods` pods
    (all ReplicaSets) of which `updated` run the current template (both default to replicas)."""
    annotations = {ANNOTATION_TEMPLATE: template, ANNOTATION_RENDERED: f"render-of-{template}"}
    meta = V1ObjectMeta(name="llama-canary", generation=4, annotations=annotations)
    spec = V1DeploymentSpec(replicas=replicas, selector=V1LabelSelector(), template=V1PodTemplateSpec())
    status = V1DeploymentStatus(
        ready_replicas=ready,
        observed_generation=seen,
        replicas=replicas if pods is None else pods,
        updated_replicas=replicas if updated is None else updated,
    )
    return wire(V1Deployment(metadata=meta, spec=spec, status=status))


def pod(name: str, template: str, ready: bool, deleting: bool = False, **condition: str) -> dict[str, Any]:
    conditions = [V1PodCondition(type="Ready", status="True" if ready else "False")]
    if condition:
        conditions.append(V1PodCondition(type="PodScheduled", status="False", **condition))
    meta = V1ObjectMeta(
        name=name,
        labels=LABELS,
        annotations={ANNOTATION_TEMPLATE: template},
        deletion_timestamp=datetime(2026, 11, 25, tzinfo=UTC) if deleting else None,
    )
    return wire(V1Pod(metadata=meta, status=V1PodStatus(conditions=conditions)))


def children(dep: dict[str, Any] | None, pods: list[dict[str, Any]]) -> kube.Children:
    deployments = {} if dep is None else {("ml", "llama-canary"): [kube.deployment_view(dep)]}
    by_key: dict[tuple[str, str, str], list[kube.PodView]] = {}
    for body in pods:
        by_key.setdefault(kube.pods_key("ml", body["metadata"]["labels"]), []).append(kube.pod_view(body))
    return kube.Children(deployments=deployments, pods=by_key)


def test_only_ready_pods_on_the_current_template_that_are_not_going_away_count() -> None:
    pods = [
        pod("a", "new", ready=True),
        pod("b", "old", ready=True),  # a rolling update's old pod: Ready, but not what was asked for
        pod("c", "new", ready=True, deleting=True),
        pod("d", "new", ready=False, reason="Unschedulable", message="0/2 nodes have a free GPU"),
    ]
    dep = deployment(3, "new", ready=3, pods=3, updated=2)  # b is left of the old ReplicaSet
    state = kube.track_state(children(dep, pods), "ml", "llama-canary", LABELS)
    assert state == TrackState(
        exists=True,
        replicas=3,
        ready_replicas=1,
        waiting="pod d: Unschedulable: 0/2 nodes have a free GPU",
        template_hash="new",
        rendered="render-of-new",
        rolling=True,
        serving_ready=2,  # a and b serve behind the Service, whatever template they run
    )


def test_a_deployment_rolls_until_its_controller_has_seen_the_change_and_no_old_pod_is_left() -> None:
    def rolling(dep: dict[str, Any]) -> bool:
        return kube.deployment_view(dep).rolling

    assert not rolling(deployment(3, "new", ready=3))
    assert not rolling(deployment(5, "new", ready=3, pods=5, updated=5))  # scaling up: no old pod
    assert rolling(deployment(3, "new", ready=3, seen=3))  # just changed: the controller is behind
    assert rolling(deployment(3, "new", ready=3, pods=4, updated=1))  # old pods still serve


def test_a_deployment_the_watch_has_not_seen_does_not_exist() -> None:
    assert kube.track_state(children(None, [pod("a", "new", ready=True)]), "ml", "llama-canary", LABELS) == (
        TrackState()
    )


def replica_set(
    name: str, replicas: int, ready: int, max_replicas: str | None, minute: int
) -> dict[str, Any]:
    """A ReplicaSet of llama-canary as the Deployment controller makes it: its pods' labels, its
    max-replicas annotation (None: absent), created `minute` minutes into the hour."""
    annotations = {} if max_replicas is None else {kube.ANNOTATION_MAX_REPLICAS: max_replicas}
    meta = V1ObjectMeta(
        name=name,
        labels={**LABELS, "pod-template-hash": name},
        annotations=annotations,
        creation_timestamp=datetime(2026, 11, 25, 10, minute, tzinfo=UTC),
    )
    spec = V1ReplicaSetSpec(replicas=replicas, selector=V1LabelSelector())
    return wire(
        V1ReplicaSet(
            metadata=meta, spec=spec, status=V1ReplicaSetStatus(replicas=replicas, ready_replicas=ready)
        )
    )


def test_a_tracks_replica_sets_with_pods_are_read_with_their_sizes_and_annotations() -> None:
    """What a rolling Deployment's next scaling event starts from (capacity.scaled_ready): each
    ReplicaSet's replicas, Ready pods and max-replicas annotation, in creation order; one scaled to 0
    (a finished roll's, kept for rollbacks) takes no part."""
    bodies = [
        replica_set("old", 6, 6, "9", minute=1),
        replica_set("new", 3, 0, None, minute=2),
        replica_set("older", 0, 0, "5", minute=0),
    ]
    by_key: dict[tuple[str, str, str], list[ReplicaSetState]] = {}
    for body in bodies:
        by_key.setdefault(kube.pods_key("ml", body["metadata"]["labels"]), []).append(
            kube.replica_set_view(body)
        )
    watch = children(deployment(6, "new", ready=0, pods=9, updated=3), [])
    watch = kube.Children(watch.deployments, pods=watch.pods, replica_sets=by_key)
    state = kube.track_state(watch, "ml", "llama-canary", LABELS)
    assert state.replica_sets == (
        ReplicaSetState(6, 6, 9, "2026-11-25T10:01:00Z old"),
        ReplicaSetState(3, 0, None, "2026-11-25T10:02:00Z new"),
    )
    assert sorted(rs.created for rs in state.replica_sets) == [rs.created for rs in state.replica_sets]


def test_pods_are_kept_by_namespace_owner_and_track() -> None:
    assert kube.pods_key("ml", LABELS) == ("ml", "llama", "canary")
    assert kube.pods_key("ml", {"app": "other"}) == ("ml", "", "")


class FakeApi:
    """kube._request stand-in: records the applies and answers with the generation they leave."""

    def __init__(self) -> None:
        self.writes: list[int] = []
        self.generation = 1

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> dict[str, Any]:
        assert (method, path, options["name"]) == ("PATCH", kube.DEPLOYMENT, "llama-baseline")
        assert options["content_type"] == kube.APPLY and options["query"]["force"] is True
        self.generation += 1
        self.writes.append(body["spec"]["replicas"])
        return {"metadata": {"name": options["name"], "generation": self.generation}}


def watched(generation: int | None) -> kube.Children:
    """What the watch shows of llama-baseline: absent (None), or at this generation."""
    if generation is None:
        return kube.Children()
    view = kube.DeploymentView(replicas=1, ready_replicas=1, template="t", generation=generation)
    return kube.Children(deployments={("ml", "llama-baseline"): [view]})


def test_a_child_is_written_again_only_when_it_or_its_manifest_changed(monkeypatch: Any) -> None:
    apps = FakeApi()
    monkeypatch.setattr(kube, "_request", apps.request)
    monkeypatch.setattr(kube, "_owner_uids", lambda kind, namespace, name: None)  # no such object yet
    owner = Owner("llama", "ml", f"u-{id(apps)}")
    manifest = {
        "kind": "Deployment",
        "metadata": {"name": "llama-baseline", "namespace": "ml", "ownerReferences": [owner.reference()]},
        "spec": {"replicas": 1},
    }
    kube.apply(manifest, watched(None))
    kube.apply(manifest, watched(apps.generation))  # the watch shows what the write left: idle
    kube.apply(manifest, watched(apps.generation))
    assert apps.writes == [1]
    kube.apply(manifest, watched(apps.generation + 1))  # someone edited it: ours is applied again
    kube.apply(manifest, watched(None))  # someone deleted it
    kube.apply({**manifest, "spec": {"replicas": 2}}, watched(apps.generation))  # we changed it
    assert apps.writes == [1, 1, 1, 2]
    kube.forget(owner.uid)
    kube.apply({**manifest, "spec": {"replicas": 2}}, watched(apps.generation))  # nothing remembered
    assert apps.writes == [1, 1, 1, 2, 2]


def test_the_replica_set_watch_is_asked_of_the_rbac_per_namespace_and_verb(monkeypatch: Any) -> None:
    """`specgate run` indexes the ReplicaSets only where its RBAC lets it list and watch them (kopf
    would run no handler at all beside an index it may not fill): one SelfSubjectAccessReview per
    namespace and verb, the first denial ending it; an API server that does not answer counts as
    allowed (kopf's watches then say what is wrong)."""
    asked: list[tuple[str, str]] = []
    denied = {("team-b", "watch")}

    def review(method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        assert (method, path, body["kind"]) == ("POST", kube.ACCESS_REVIEWS, "SelfSubjectAccessReview")
        attributes = body["spec"]["resourceAttributes"]
        assert (attributes["group"], attributes["resource"]) == ("apps", "replicasets")
        asked.append((attributes["namespace"], attributes["verb"]))
        return {"status": {"allowed": asked[-1] not in denied}}

    monkeypatch.setattr(kube, "_request", review)
    assert kube.may_list_and_watch("apps", "replicasets", [""])
    assert asked == [("", "list"), ("", "watch")]
    asked.clear()
    assert not kube.may_list_and_watch("apps", "replicasets", ["team-a", "team-b", "team-c"])
    assert asked == [("team-a", "list"), ("team-a", "watch"), ("team-b", "list"), ("team-b", "watch")]

    def unreachable(*_: Any, **__: Any) -> dict[str, Any]:
        raise ApiException(status=503, reason="Service Unavailable")

    monkeypatch.setattr(kube, "_request", unreachable)
    assert kube.may_list_and_watch("apps", "replicasets", ["team-a"])
