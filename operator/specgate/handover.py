"""Handing serving over from an adopted Deployment (spec.workloadRef) to specgate's pods, and back on
deletion (pure: observed values in, replica counts out).

The user's Service selects the adopted Deployment's pods and specgate's baseline pods alike
(adopt.py keeps the user's labels), so the Ready pods behind it are both sides' Ready pods. specgate
changes the adopted Deployment's replicas only (through its scale subresource), never its
template, and as a Deployment's rolling update would: the side that shrinks gives up Ready pods only
while the other side's Ready pods keep `replicas - maxUnavailable`, and both sides together stay
within `replicas + maxSurge` pods (policy progressively; onSuccess runs both in full meanwhile,
never leaves the Deployment alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specgate import api, capacity
from specgate.observation import Workload

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Step:
    """What to apply now: the adopted Deployment's replicas and specgate's baseline's; whether the
    hand-over is done (the rollout proper may start), and what is happening, said in status."""

    workload_replicas: int
    baseline_replicas: int
    handed_over: bool
    message: str


@dataclass(frozen=True)
class HandBack:
    """On deletion: the adopted Deployment's replicas, and whether specgate's pods may go now."""

    workload_replicas: int
    release: bool
    message: str
    timed_out: bool = False


def autoscaler(name: str, hpas: Sequence[Manifest], scaled_objects: Sequence[Manifest]) -> str | None:
    """The HPA or KEDA ScaledObject that scales Deployment `name`, which would fight the hand-over
    (it sets the replicas specgate lowers); None when there is none."""
    for kind, objects in (("ScaledObject", scaled_objects), ("HorizontalPodAutoscaler", hpas)):
        for obj in objects:
            target = obj.get("spec", {}).get("scaleTargetRef") or {}
            group = str(target.get("apiVersion", "apps/v1")).split("/")[0]
            if (
                target.get("kind", "Deployment") == "Deployment"
                and group == "apps"
                and target.get("name") == name
            ):
                return f"{kind} {obj.get('metadata', {}).get('name')}"
    return None


def refusal(
    ref: api.WorkloadRef, replicas: int, workload: Workload, original: int | None, scaler: str | None
) -> str | None:
    """Why the Deployment cannot be adopted, with the fix; None when it can."""
    if not workload.exists:
        return f"Deployment {ref.name} does not exist in this namespace: create it, or fix workloadRef.name"
    if scaler is not None:
        return (
            f"{scaler} scales Deployment {ref.name} and would undo the hand-over (specgate lowers its "
            f"replicas): remove the autoscaler, or scale this SpeculativeDeployment instead (it has a "
            "scale subresource)"
        )
    before = workload.replicas if original is None else original
    if before > replicas:
        return (
            f"spec.replicas {replicas} is below the {before} replicas of Deployment {ref.name}: the "
            f"hand-over would serve on fewer pods; set replicas: {before} (or scale the Deployment to "
            f"{replicas} first)"
        )
    return None


def hand_over(
    policy: api.ScaleDown, budget: capacity.Budget, workload: Workload, baseline: capacity.Side
) -> Step:
    """One tick of the hand-over from the adopted Deployment to specgate's baseline."""
    if not workload.exists or policy is api.ScaleDown.NEVER:
        return Step(workload.replicas, budget.replicas, True, _left(workload))
    ours = baseline.kept(baseline.replicas)
    if policy is api.ScaleDown.ON_SUCCESS:
        keep = 0 if ours >= budget.replicas else workload.replicas
        return _step(workload, keep, budget.replicas, ours)
    needed = max(budget.min_ready - ours, 0)
    # A Deployment mid-roll spreads a lowering over its ReplicaSets, Ready pods included
    # (capacity.py's note): it is lowered only once specgate's pods alone keep the floor.
    keep = workload.replicas if workload.rolling and needed > 0 else min(workload.replicas, needed)
    # The Deployment's pods count until they are gone: its controller may act on a lowering late.
    room = budget.replicas + budget.max_surge - max(keep, workload.running)
    grown = max(min(budget.replicas, room), min(baseline.replicas, budget.replicas))
    return _step(workload, keep, grown, ours)


def _step(workload: Workload, keep: int, baseline: int, ours: int) -> Step:
    done = keep == 0 and workload.running == 0
    message = (
        f"handed over: the adopted Deployment runs 0 replicas, specgate's baseline {baseline}"
        if done
        else f"handing over: the adopted Deployment at {keep} replicas ({workload.ready} Ready), "
        f"specgate's baseline at {baseline} ({ours} Ready)"
    )
    return Step(keep, baseline, done, message)


def _left(workload: Workload) -> str:
    if not workload.exists:
        return "the adopted Deployment is gone: specgate's pods serve alone"
    return f"scaleDown never: the adopted Deployment keeps its {workload.replicas} replicas beside specgate's pods"


def hand_back(
    on_delete: api.OnDelete,
    original: int,
    budget: capacity.Budget,
    workload: Workload,
    elapsed: float,
    deadline: float,
) -> HandBack:
    """On deletion: the adopted Deployment back at its replicas from before the adoption, and
    specgate's pods released once its Ready pods alone keep the floor (or past `deadline` seconds:
    a model that never loads must not keep the object forever; the release then says so)."""
    if on_delete is api.OnDelete.LEAVE or not workload.exists:
        return HandBack(workload.replicas, True, "onDelete Leave: the adopted Deployment's replicas stay")
    replicas = max(workload.replicas, original)
    needed = min(budget.min_ready, original)
    if workload.ready >= needed:
        return HandBack(
            replicas, True, f"handed back: the adopted Deployment serves with {workload.ready} Ready pods"
        )
    if elapsed >= deadline:
        return HandBack(
            replicas,
            True,
            f"handed back without waiting longer: the adopted Deployment has {workload.ready} Ready "
            f"pods of the {needed} the floor needs after progressDeadline ({deadline:.0f}s)",
            timed_out=True,
        )
    return HandBack(
        replicas,
        False,
        f"handing back: the adopted Deployment at {replicas} replicas, {workload.ready}/{needed} Ready",
    )
