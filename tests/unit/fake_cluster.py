"""A fake cluster for driving handlers.step: Deployments, their ReplicaSets and pods, moved the way
the controller-manager and the kubelet move them.

The rules come from the Kubernetes documentation (concepts/workloads/controllers/deployment:
"Rolling Update Deployment", "Proportional scaling", "Max Unavailable", "Max Surge"; and
replicaset: "Scaling a ReplicaSet"), checked against the controller's source
(pkg/controller/deployment/rolling.go, sync.go; pkg/controller/replicaset):
- A Deployment owns one ReplicaSet per pod template, keyed by the template's hash; the one for its
  current template is the new ReplicaSet, the others are old.
- Rolling update: the new ReplicaSet grows while all pods stay within replicas + maxSurge; old ones
  first lose their unavailable pods, then Ready ones only while the Ready pods of all ReplicaSets
  stay at replicas - maxUnavailable (counting the new ReplicaSet's unready pods as lost).
- A replicas change while old ReplicaSets still hold pods is a scaling event: replicas + maxSurge is
  spread over the ReplicaSets in proportion to their sizes, the rest going to the largest. Each
  ReplicaSet's proportion is taken against the replicas + maxSurge it was last sized for (its
  deployment.kubernetes.io/max-replicas annotation, set when the controller last scaled it), so a
  maxSurge lowered mid-roll makes the next scaling event shed more than the replicas given up
  (deploymentutil.GetProportion; rounded half away from zero, as integer.RoundToInt32).
- A ReplicaSet scaled down deletes unready pods first, then the ones Ready for the shortest time.
- Pods become Ready 1-3 ticks after they are created (minReadySeconds 0: Ready is available).
- The controller may see a change a tick late (observedGeneration < generation meanwhile).
- The operator's watch sees each ReplicaSet as the API server shows it: replicas, readyReplicas and
  the max-replicas annotation (kube.replica_set_view).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from specgate import kube
from specgate.capacity import ReplicaSetState
from specgate.render import ANNOTATION_TEMPLATE, LABEL_TRACK, Manifest

CREATED_AT = datetime(2026, 1, 1, tzinfo=UTC)  # tick 0's creationTimestamp
BROKEN_IMAGE = "broken"  # an image whose containers crash-loop (e.g. a gated model's 401)


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


@dataclass
class Pod:
    name: str
    template: dict[str, Any]
    rs: str  # its ReplicaSet's pod template hash
    ready_at: int | None  # the tick it becomes Ready (None: never, it crash-loops)
    ready_since: int | None = None
    crashed: bool = False  # its container has restarted
    crash_loop: bool = False

    @property
    def ready(self) -> bool:
        return self.ready_since is not None

    def body(self) -> dict[str, Any]:
        waiting = {"reason": "CrashLoopBackOff", "message": "back-off"} if self.crash_loop else None
        state = {"waiting": waiting} if waiting else {"running": {}}
        last = {"terminated": {"exitCode": 1, "reason": "Error"}} if self.crashed else {}
        ready = {"type": "Ready", "status": "True" if self.ready else "False"}
        return {
            "metadata": {
                "name": self.name,
                "labels": self.template["metadata"]["labels"],
                "annotations": self.template["metadata"]["annotations"],
            },
            "status": {
                "conditions": [ready],
                "containerStatuses": [{"state": state, "lastState": last}],
            },
        }


@dataclass
class ReplicaSet:
    template: dict[str, Any]
    created: int  # order of creation: older ReplicaSets are scaled down first
    replicas: int = 0
    pods: list[Pod] = field(default_factory=list)
    max_replicas: int = (
        0  # its max-replicas annotation: the Deployment's replicas + maxSurge when last scaled
    )

    @property
    def ready(self) -> int:
        return sum(pod.ready for pod in self.pods)

    def body(self, name: str) -> dict[str, Any]:
        """The ReplicaSet as the API server shows it: its pods' labels, the controller's max-replicas
        annotation, a creationTimestamp a tick apart from the next one."""
        created = CREATED_AT + timedelta(seconds=self.created)
        return {
            "metadata": {
                "name": name,
                "labels": self.template["metadata"]["labels"],
                "annotations": {kube.ANNOTATION_MAX_REPLICAS: str(self.max_replicas)},
                "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "spec": {"replicas": self.replicas, "template": self.template},
            "status": {"replicas": len(self.pods), "readyReplicas": self.ready},
        }


@dataclass
class Deployment:
    manifest: Manifest
    new_hash: str  # the pod template hash of its current template: its new ReplicaSet's key
    generation: int = 1
    observed_generation: int = 0
    synced_replicas: int = 0  # the replicas its ReplicaSets were last sized for
    replica_sets: dict[str, ReplicaSet] = field(default_factory=dict)

    @property
    def replicas(self) -> int:
        return int(self.manifest["spec"]["replicas"])

    @property
    def strategy(self) -> tuple[int, int]:
        rolling = self.manifest["spec"]["strategy"]["rollingUpdate"]
        surge, unavailable = int(rolling["maxSurge"]), int(rolling["maxUnavailable"])
        return (surge, unavailable) if surge or unavailable else (surge, 1)  # both 0: Kubernetes uses 1

    def pods(self) -> list[Pod]:
        return [pod for rs in self.replica_sets.values() for pod in rs.pods]

    def body(self) -> dict[str, Any]:
        new = self.replica_sets.get(self.new_hash)
        pods = self.pods()
        return {
            "metadata": {**self.manifest["metadata"], "generation": self.generation},
            "spec": self.manifest["spec"],
            "status": {
                "observedGeneration": self.observed_generation,
                "replicas": len(pods),
                "updatedReplicas": len(new.pods) if new else 0,
                "readyReplicas": sum(pod.ready for pod in pods),
            },
        }


@dataclass
class FakeCluster:
    rng: random.Random
    deployments: dict[str, Deployment] = field(default_factory=dict)
    tick: int = 0
    lag: float = 0.2  # the chance that the controller sees a Deployment's change a tick late
    _pods_made: int = 0

    # --- the API the operator writes through (kube.apply and kube.scale_deployment) ---

    def apply(self, manifest: Manifest) -> None:
        if manifest["kind"] != "Deployment":
            return  # Services and PodMonitors select pods; their content is not modelled
        name = manifest["metadata"]["name"]
        dep = self.deployments.get(name)
        if dep is None:
            self.deployments[name] = Deployment(
                copy.deepcopy(manifest), template_hash(manifest["spec"]["template"])
            )
        elif dep.manifest["spec"] != manifest["spec"] or dep.manifest["metadata"] != manifest["metadata"]:
            spec_changed = dep.manifest["spec"] != manifest["spec"]
            dep.manifest = copy.deepcopy(manifest)
            dep.new_hash = template_hash(manifest["spec"]["template"])
            dep.generation += spec_changed

    def scale(self, name: str, replicas: int) -> None:
        dep = self.deployments[name]
        if dep.replicas != replicas:
            dep.manifest["spec"]["replicas"] = replicas
            dep.generation += 1

    # --- what the operator's watches see ---

    def children(self) -> kube.Children:
        deployments = {
            (dep.manifest["metadata"]["namespace"], name): [kube.deployment_view(dep.body())]
            for name, dep in self.deployments.items()
        }
        pods: dict[tuple[str, str, str], list[kube.PodView]] = {}
        replica_sets: dict[tuple[str, str, str], list[ReplicaSetState]] = {}
        for name, dep in self.deployments.items():
            namespace = dep.manifest["metadata"]["namespace"]
            for pod in dep.pods():
                key = kube.pods_key(namespace, pod.template["metadata"]["labels"])
                pods.setdefault(key, []).append(kube.pod_view(pod.body()))
            for rs_hash, rs in dep.replica_sets.items():
                key = kube.pods_key(namespace, rs.template["metadata"]["labels"])
                replica_sets.setdefault(key, []).append(kube.replica_set_view(rs.body(f"{name}-{rs_hash}")))
        return kube.Children(deployments, {}, pods, replica_sets)

    def pods(self) -> list[Pod]:
        return [pod for dep in self.deployments.values() for pod in dep.pods()]

    def ready_serving(self, selector: dict[str, str]) -> int:
        """Ready pods that the Service's selector picks."""
        return sum(
            pod.ready and selector.items() <= pod.template["metadata"]["labels"].items()
            for pod in self.pods()
        )

    def ready_by_template(self, track: str) -> dict[str, int]:
        """Ready pods of a track by the template (ANNOTATION_TEMPLATE) they run."""
        counts: dict[str, int] = {}
        for pod in self.pods():
            meta = pod.template["metadata"]
            if pod.ready and meta["labels"].get(LABEL_TRACK) == track:
                counts[meta["annotations"][ANNOTATION_TEMPLATE]] = (
                    counts.get(meta["annotations"][ANNOTATION_TEMPLATE], 0) + 1
                )
        return counts

    def describe(self) -> str:
        """Each Deployment's replicas and its ReplicaSets' replicas/Ready pods, newest last."""
        return "; ".join(
            f"{name} {dep.replicas}: "
            + " ".join(
                f"{rs.replicas}/{rs.ready}"
                for rs in sorted(dep.replica_sets.values(), key=lambda r: r.created)
            )
            for name, dep in self.deployments.items()
        )

    # --- faults ---

    def restart(self, pod: Pod, crash: bool) -> None:
        """A crash (restart) or a failed readiness probe: not Ready for 1-3 ticks."""
        pod.ready_since, pod.crashed = None, pod.crashed or crash
        pod.ready_at = self.tick + self.rng.randint(1, 3)

    def crash_loop(self, pod: Pod) -> None:
        """CrashLoopBackOff for 3-10 ticks, then Ready again (the cause went away)."""
        pod.ready_since, pod.crashed, pod.crash_loop = None, True, True
        pod.ready_at = self.tick + self.rng.randint(3, 10)

    def delete(self, pod: Pod) -> None:
        """A deleted pod (`kubectl delete pod`, an eviction): its ReplicaSet makes another."""
        for rs in (rs for dep in self.deployments.values() for rs in dep.replica_sets.values()):
            rs.pods = [p for p in rs.pods if p is not pod]

    # --- the controller-manager and the kubelet, one tick ---

    def advance(self) -> None:
        self.tick += 1
        for dep in self.deployments.values():
            if dep.observed_generation < dep.generation and self.rng.random() < self.lag:
                continue
            sync_deployment(dep, self.tick)
            for key, rs in dep.replica_sets.items():
                self._sync_replica_set(key, rs)

    def kubelet(self) -> None:
        for pod in self.pods():
            if not pod.ready and pod.ready_at is not None and self.tick >= pod.ready_at:
                pod.ready_since, pod.crash_loop = self.tick, False

    def _sync_replica_set(self, key: str, rs: ReplicaSet) -> None:
        while len(rs.pods) < rs.replicas:
            self._pods_made += 1
            broken = BROKEN_IMAGE in rs.template["spec"]["containers"][0]["image"]
            ready_at = None if broken else self.tick + self.rng.randint(1, 3)
            pod = Pod(f"pod-{self._pods_made}", rs.template, key, ready_at)
            pod.crash_loop = pod.crashed = broken
            rs.pods.append(pod)
        if len(rs.pods) > rs.replicas:
            # Unready first, then the ones Ready for the shortest time (controller.ActivePods order).
            rs.pods.sort(key=lambda p: (p.ready, -(p.ready_since or 0)))
            del rs.pods[: len(rs.pods) - rs.replicas]


def sync_deployment(dep: Deployment, tick: int) -> None:
    """One sync of the Deployment controller (RollingUpdate strategy)."""
    dep.observed_generation = dep.generation
    new_hash = dep.new_hash
    if new_hash not in dep.replica_sets:
        dep.replica_sets[new_hash] = ReplicaSet(
            dep.manifest["spec"]["template"], created=tick, max_replicas=_max_replicas(dep)
        )
    new = dep.replica_sets[new_hash]
    old = sorted((rs for h, rs in dep.replica_sets.items() if h != new_hash), key=lambda rs: rs.created)
    active = [rs for rs in [new, *old] if rs.replicas]
    if dep.synced_replicas != dep.replicas:  # a scaling event: sync.go scale(), then nothing else
        if len(active) > 1:
            _scale_proportionally(dep, active)
        else:  # one active ReplicaSet (or none: the new one) takes the replicas as they are
            _resize(dep, active[0] if active else new, dep.replicas)
        dep.synced_replicas = dep.replicas
        return
    if not any(rs.replicas for rs in old):
        _resize(dep, new, dep.replicas)
        return
    _grow_new(dep, new, old)
    _shrink_old(dep, new, old)


def _max_replicas(dep: Deployment) -> int:
    return dep.replicas + dep.strategy[0]


def _resize(dep: Deployment, rs: ReplicaSet, replicas: int) -> None:
    """The controller scales a ReplicaSet (scaleReplicaSet): its annotations follow the Deployment."""
    if rs.replicas != replicas:
        rs.replicas, rs.max_replicas = replicas, _max_replicas(dep)


def proportional_sizes(sets: list[tuple[int, int]], allowed: int, pods: int) -> list[int]:
    """The sizes a scaling event gives ReplicaSets of (replicas, max-replicas annotation), all active
    and in the controller's order (growing: largest and newest first; shrinking: largest and oldest),
    the Deployment now allowing `allowed` pods (replicas + maxSurge) and having `pods` (its
    status.replicas, read where an annotation is missing). Kubernetes' sync.go scale() and
    deploymentutil.GetProportion: each takes its proportion of the change, the leftover goes to
    the first."""
    to_add = allowed - sum(replicas for replicas, _ in sets)
    sizes, added = [], 0
    for replicas, annotated in sets:
        share = 0
        before = annotated or pods
        if to_add != added and before:
            fraction = math.floor(replicas * allowed / before + 0.5) - replicas
            share = min(fraction, to_add - added) if to_add > 0 else max(fraction, to_add - added)
        sizes.append(replicas + share)
        added += share
    if sizes:
        sizes[0] = max(sizes[0] + to_add - added, 0)
    return sizes


def _scale_proportionally(dep: Deployment, active: list[ReplicaSet]) -> None:
    allowed = _max_replicas(dep)
    to_add = allowed - sum(rs.replicas for rs in active)
    if to_add > 0:
        active.sort(key=lambda rs: (-rs.replicas, -rs.created))
    else:
        active.sort(key=lambda rs: (-rs.replicas, rs.created))
    pods = len(dep.pods())
    sizes = proportional_sizes([(rs.replicas, rs.max_replicas) for rs in active], allowed, pods)
    for rs, size in zip(active, sizes, strict=True):
        rs.replicas, rs.max_replicas = size, allowed  # every one is scaled: its annotations follow
    dep.synced_replicas = dep.replicas


def _grow_new(dep: Deployment, new: ReplicaSet, old: list[ReplicaSet]) -> None:
    if new.replicas >= dep.replicas:
        new.replicas = dep.replicas
        return
    surge, _ = dep.strategy
    room = dep.replicas + surge - sum(rs.replicas for rs in [new, *old])
    _resize(dep, new, new.replicas + max(min(room, dep.replicas - new.replicas), 0))


def _shrink_old(dep: Deployment, new: ReplicaSet, old: list[ReplicaSet]) -> None:
    _, unavailable = dep.strategy
    min_available = dep.replicas - unavailable
    everything = sum(rs.replicas for rs in [new, *old])
    new_unavailable = new.replicas - new.ready
    may_remove = everything - min_available - new_unavailable
    if may_remove <= 0:
        return
    for rs in old:  # their unhealthy pods first
        cut = min(rs.replicas - rs.ready, may_remove)
        _resize(dep, rs, rs.replicas - cut)
        may_remove -= cut
    available = sum(rs.ready for rs in [new, *old])
    to_remove = available - min_available
    for rs in old:
        if to_remove <= 0:
            break
        cut = min(rs.replicas, to_remove)
        _resize(dep, rs, rs.replicas - cut)
        to_remove -= cut
