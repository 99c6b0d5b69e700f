"""Issue 61: a stuck roll scaled after its maxSurge was lowered, replayed through the real
handlers.step on the fake cluster, and that cluster's Deployment controller checked against the
Kubernetes documentation's own proportional-scaling example."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tests.unit.day2_history import OWNER, Event, Generated, History
from tests.unit.fake_cluster import BROKEN_IMAGE, FakeCluster
from tests.unit.rollout_driver import spec_body

from specgate import api, render

# --- defect 2: a stuck roll scaled down after its maxSurge was lowered ---


def stuck_roll_history(surge: int, *edits: tuple[int, str, dict[str, Any]]) -> Generated:
    """Replicas 6 serving (maxSurge `surge`, maxUnavailable 0: floor 6), then a new image that
    crash-loops: the baseline's roll sticks with its old ReplicaSet's 6 Ready pods beside `surge` new
    ones; then `edits`."""
    spec = spec_body(
        canaryReplicas=1, maxSurge=surge, maxUnavailable=0, metrics={"prometheusUrl": "http://p:9090"}
    )
    events = [Event(0, "image", spec={"image": f"vllm:{BROKEN_IMAGE}-0"})]
    events += [Event(tick, kind, spec=patch) for tick, kind, patch in edits]
    return Generated(0, spec | {"image": "vllm:1", "replicas": 6}, tuple(events))


def test_a_stuck_roll_lowered_after_its_max_surge_keeps_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 61, the fuzz's sequence: maxSurge 2 -> 1, then replicas 6 -> 5 (floor 5). Kubernetes
    scales the rolling baseline proportionally against the 8 pods its ReplicaSets were sized for
    (6 + 2): 6 -> 5 takes its old ReplicaSet 6 -> 4, two Ready pods. On 1be5013 specgate lowered it
    (counting one Ready pod lost per replica given up): 4 Ready of a floor of 5. The baseline keeps
    its 6 replicas while its roll is stuck."""
    generated = stuck_roll_history(
        2, (6, "surge", {"rollout": {"maxSurge": 1}}), (10, "hpa", {"replicas": 5})
    )
    with History(generated, ticks=40, begin_at_ready=6).wired(monkeypatch) as history:
        broken = list(history.run())
    assert broken == [], "\n".join(history.log[-30:])
    baseline = history.cluster.deployments["llama-baseline"]
    assert baseline.replicas == 6 and len(baseline.replica_sets) == 2  # still stuck, still whole
    assert history.cluster.ready_serving(render.serving_selector(OWNER)) == 6


def test_a_stuck_roll_raised_after_its_max_surge_fell_keeps_the_floor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same mechanism raising: maxSurge 3 -> 1, then replicas 6 -> 7. The ReplicaSets were sized
    for 6 + 3 = 9 pods and 7 + 1 are allowed now, so the scaling event still sheds one, from the
    largest ReplicaSet: the old one, 6 -> 5 Ready of a floor of 6 (7's floor not reached yet).
    specgate reads the ReplicaSets' sizes and annotations (capacity.scaled_ready) and holds the
    raise while the roll is stuck."""
    generated = stuck_roll_history(
        3, (6, "surge", {"rollout": {"maxSurge": 1}}), (10, "hpa", {"replicas": 7})
    )
    with History(generated, ticks=40, begin_at_ready=6).wired(monkeypatch) as history:
        broken = list(history.run())
    assert broken == [], "\n".join(history.log[-30:])
    assert history.cluster.deployments["llama-baseline"].replicas == 6


# --- seed 693: maxUnavailable raised while one track rolls and the other is short of a Ready pod ---


def test_a_max_unavailable_raised_mid_roll_beside_a_crashed_canary_pod_keeps_the_floor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The day-2 fuzz's seed 693, as its sequence: replicas 5 (canary 2, maxSurge 1, maxUnavailable
    0), paused in Analyzing; an operator upgrade re-renders the pods and, once unpaused, the baseline
    rolls (3 old Ready pods, 1 surge); a canary pod crashes; then maxSurge 0, maxUnavailable 2 (floor
    3). With the spec's 2 on its Deployment the baseline's roll keeps 3 - 2 = 1 Ready pod: 2 in all
    beside the canary's 1. The baseline's Deployment is rendered with what the canary leaves it: 1."""
    spec = spec_body(
        canaryReplicas=2, maxSurge=1, maxUnavailable=0, metrics={"prometheusUrl": "http://p:9090"}
    )
    events = (
        Event(20, "pause", spec={"rollout": {"paused": True}}),
        Event(30, "upgrade"),
        Event(40, "pause", spec={"rollout": {"paused": False}}),
        Event(43, "crash", pick=0.9),
        Event(45, "budget", spec={"rollout": {"maxSurge": 0, "maxUnavailable": 2}}),
    )
    generated = Generated(0, spec | {"image": "vllm:1", "replicas": 5}, events)
    with History(generated, ticks=80).wired(monkeypatch) as history:
        broken = list(history.run())
    assert broken == [], "\n".join(history.log[-30:])
    # The crash took one of the canary's 2 Ready pods, beside the baseline's roll (old 3, surge 1).
    assert "43: after reconcile llama-baseline 3: 3/3 1/0; llama-canary 2: 2/1" in history.log
    assert history.floors >= {5, 3} and history.min_ready == 3  # the new floor was reached and held


# --- seed 357 (watch a tick behind): weight sent to a track on the watch's stale Ready pods ---


def test_behind_a_lagging_watch_no_weight_goes_to_a_track_whose_pods_just_went(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The day-2 fuzz's seed 357 with the watches a tick behind, as its sequence: replicas 3 (canary
    1, maxSurge 1, maxUnavailable 1) behind an owned HTTPRoute; aborted in Analyzing, the canary's
    pod goes once the baseline is back; a new draft length then starts a rollout whose first route
    write gave the canary weight on the watch's stale view of it (1 Ready; none in the cluster).
    Weight sent to a track anew is decided on the tracks read now, as a shrink is."""
    spec = spec_body(
        canaryReplicas=1, maxSurge=1, maxUnavailable=1, metrics={"prometheusUrl": "http://p:9090"}
    )
    routed = {"router": "GatewayAPI", "httpRoute": {"parentRefs": [{"name": "inference", "namespace": "gw"}]}}
    events = (
        Event(9, "unready", pick=0.2914265129971284),
        Event(18, "router", spec={"rollout": {"traffic": routed}}),
        Event(23, "upgrade"),
        Event(24, "abort", annotations={api.ANNOTATION_ABORT: "24"}),
        Event(30, "speculative", spec={"speculative": {"numSpeculativeTokens": 3}}),
    )
    generated = Generated(357, spec | {"image": "vllm:1", "replicas": 3}, events)
    with History(generated, ticks=40, watch_lags=True).wired(monkeypatch) as history:
        broken = list(history.run())
    assert broken == [], "\n".join(history.log[-30:])
    assert "29: after reconcile llama-baseline 3: 2/2 1/0; llama-canary 0: 1/1" in history.log


# --- the fake cluster's Deployment controller against the Kubernetes documentation ---


def nginx(image: str, replicas: int) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": "nginx"}, "annotations": {}},
        "spec": {"containers": [{"image": image}]},
    }
    return {
        "kind": "Deployment",
        "metadata": {"name": "nginx-deployment", "namespace": "default", "annotations": {}},
        "spec": {
            "replicas": replicas,
            "strategy": {"rollingUpdate": {"maxSurge": 3, "maxUnavailable": 2}},
            "template": template,
        },
    }


def replica_sets(cluster: FakeCluster) -> list[tuple[int, int]]:
    """(DESIRED, READY) of each ReplicaSet, oldest first, as `kubectl get rs` shows them."""
    dep = cluster.deployments["nginx-deployment"]
    return [(rs.replicas, rs.ready) for rs in sorted(dep.replica_sets.values(), key=lambda rs: rs.created)]


def settle(cluster: FakeCluster, ticks: int = 10) -> None:
    for _ in range(ticks):
        cluster.advance()
        cluster.kubelet()


def test_the_fake_deployment_controller_scales_a_stuck_roll_as_the_kubernetes_docs_show() -> None:
    """Kubernetes docs, Deployments, "Proportional scaling": 10 replicas, maxSurge 3, maxUnavailable 2;
    an image that cannot be pulled sticks the roll at the new ReplicaSet's 5 (0 Ready) beside the old
    one's 8; the autoscaler scales to 15, and "3 replicas are added to the old ReplicaSet and 2
    replicas are added to the new ReplicaSet": `kubectl get rs` shows 7 (0 Ready) and 11 (11 Ready)."""
    cluster = FakeCluster(random.Random(0), lag=0.0)
    cluster.apply(nginx("nginx:1.14.2", 10))
    settle(cluster)
    assert replica_sets(cluster) == [(10, 10)]
    cluster.apply(nginx(f"nginx:{BROKEN_IMAGE}", 10))  # "nginx:sometag", unresolvable
    settle(cluster)
    assert replica_sets(cluster) == [(8, 8), (5, 0)]
    cluster.scale("nginx-deployment", 15)
    settle(cluster)
    assert replica_sets(cluster) == [(11, 11), (7, 0)]
