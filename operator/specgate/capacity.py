"""Moving pods between the baseline and the canary without losing serving capacity (pure).

Both tracks sit behind one Service and both answer correctly (speculative decoding is lossless), so
the serving capacity is the Ready pods of both. Every transition moves toward its target the way a
Deployment's rolling update does: the shrinking side gives up a Ready pod only when the other side's
Ready pods keep the total at `replicas - maxUnavailable`, and the growing side starts new pods only
within `replicas + maxSurge` pods in all.

A track mid-roll (ReplicaSets of two templates) is a different animal: a replicas change is a
scaling event its Deployment spreads over every ReplicaSet in proportion to the size each was last
sized for (replicas + maxSurge then, its max-replicas annotation; Kubernetes docs, "Proportional
scaling"), Ready pods included. A maxSurge lowered since they were sized makes the Deployment shed
more than the change: maxSurge 2 -> 1, then replicas 6 -> 5 takes two Ready pods of the old
ReplicaSet; maxSurge 3 -> 1, then 6 -> 7 still takes one (issue 61). A lowering may take every Ready
pod of the track for some split, so a rolling track is lowered only while the other track alone
keeps the floor. A raise is judged on the ReplicaSets as observed (`scaled_ready`, the controller's
own arithmetic) and held only where the Ready pods it sheds are ones the floor needs: holding a
stuck roll below its replicas for nothing leaves the floor to its roll's maxUnavailable of fewer
pods (the day-2 fuzz found that worse).

A rolling track's Deployment takes up to its maxUnavailable of Ready pods at its own pace, whatever
the other track has lost meanwhile: it is rendered with the spec's only as far as the other track's
Ready pods cover them (`roll_unavailable`; maxUnavailable raised mid-roll beside a crashed canary pod
took the total below the new floor, issue 61's seed 693).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaSetState:
    """One of a Deployment's ReplicaSets as the API server reports it: what its Deployment's next
    scaling event starts from (Kubernetes docs, "Proportional scaling")."""

    replicas: int  # spec.replicas
    ready: int  # status.readyReplicas
    # deployment.kubernetes.io/max-replicas: the Deployment's replicas + maxSurge when the controller
    # last scaled it (None: not set), the base of its share of a scaling event.
    max_replicas: int | None
    created: str  # creationTimestamp then name: the controller's order among ReplicaSets of one size


@dataclass(frozen=True)
class Side:
    """A track as observed: pods asked for and pods Ready, how many Ready pods below its replicas
    its Deployment's own rolling update may still take, and whether it is rolling (ReplicaSets of
    two templates: a replicas change then scales them all proportionally, Ready pods included), with
    its ReplicaSets (empty: not seen) and its Deployment's maxSurge, what such a change starts from."""

    replicas: int
    ready: int
    unavailable: int = 0
    rolling: bool = False
    replica_sets: tuple[ReplicaSetState, ...] = ()
    max_surge: int = 0

    def kept(self, replicas: int) -> int:
        """The Ready pods the track keeps at `replicas`, whatever its own roll still removes; rolling,
        a lowering may take every one, and a raise those its scaling event sheds (module's note)."""
        ready = self.ready
        if self.rolling and replicas < self.replicas:
            return 0
        if self.rolling and replicas > self.replicas:
            scaled = scaled_ready(self.replica_sets, replicas + self.max_surge)
            ready = ready if scaled is None else min(ready, scaled)
        return max(min(ready, replicas - self.unavailable), 0)


@dataclass(frozen=True)
class Budget:
    replicas: int
    max_surge: int
    max_unavailable: int

    @property
    def min_ready(self) -> int:
        return max(self.replicas - self.max_unavailable, 0)


def step_toward(
    budget: Budget, baseline: Side, canary: Side, targets: tuple[int, int], canary_share: int = 0
) -> tuple[int, int]:
    """The replica counts to apply now, on the way from the observed sides to (baseline, canary);
    the canary's Ready pods a lowering would take are kept up to `canary_share` of them."""
    want_b, want_c = targets
    # The second shrink counts only the Ready pods the first one keeps, so together they hold the floor.
    canary_ready = canary.kept(canary.replicas)
    b = max(
        _shrink(budget, baseline, want_b, canary_ready),
        _kept_above_its_replicas(budget, baseline, canary_ready),
    )
    c = _shrink(budget, canary, want_c, other_ready=baseline.kept(b))
    c = max(c, min(_kept_above_its_replicas(budget, canary, baseline.kept(b)), canary_share))
    most_pods = max(budget.replicas + budget.max_surge, want_b + want_c)
    c = _grow(canary.replicas, want_c, room=most_pods - b) if want_c > canary.replicas else c
    c = _raise_kept(budget, canary, c, other_ready=baseline.kept(b))
    b = max(b, _grow(baseline.replicas, want_b, room=most_pods - c)) if want_b > baseline.replicas else b
    b = _raise_kept(budget, baseline, b, other_ready=canary.kept(c))
    return b, c


def may_roll(budget: Budget, rolling: Side, other: Side, other_rolling: bool, shrinking: bool) -> bool:
    """Whether one track's pod template may start rolling now (a new operator version renders it
    differently): never beside the other track's roll or a shrink, whose losses would add up, and
    only if the roll's worst case (its Deployment takes max_unavailable Ready pods) keeps the floor."""
    return not (other_rolling or shrinking) and roll_keeps_floor(budget, rolling, other.ready)


def roll_keeps_floor(budget: Budget, rolling: Side, other_ready: int) -> bool:
    """Whether a new pod template on `rolling` keeps the floor through its roll's worst case (its
    Deployment takes max_unavailable Ready pods), beside `other_ready` Ready pods of the other track."""
    ready = min(rolling.ready, rolling.replicas)  # those above its replicas go whatever it runs
    loss = min(budget.max_unavailable, ready)
    return loss == 0 or ready + other_ready - loss >= budget.min_ready


def roll_unavailable(budget: Budget, side: Side, replicas: int, other_ready: int, own_need: int = 0) -> int:
    """The maxUnavailable to render on a track's Deployment at `replicas` while it rolls: the spec's,
    lowered so that its roll keeps the Ready pods the floor needs beside the other track's
    `other_ready` (a maxUnavailable raised mid-roll while the other track is short of Ready pods
    would otherwise let this roll take them too: issue 61, seed 693), and the `own_need` its share
    of a route needs (the other track's pods take none of it). Kubernetes refuses a maxUnavailable
    of 0 beside a maxSurge of 0: 1 then, the least a roll without surge can do."""
    keep = min(side.ready, max(budget.min_ready - other_ready, own_need, 0))
    unavailable = min(budget.max_unavailable, max(replicas - keep, 0))
    return unavailable if unavailable or budget.max_surge else 1


def guaranteed(side: Side, rolling: bool, max_unavailable: int) -> Side:
    """A track as capacity can count on it: a Deployment mid-roll may take any Ready pod above
    `replicas - maxUnavailable` down at any moment, so only those below it count (Side.kept)."""
    unavailable = max_unavailable if rolling else 0
    return Side(side.replicas, side.ready, unavailable, rolling, side.replica_sets, side.max_surge)


def scaled_ready(sets: Sequence[ReplicaSetState], allowed: int) -> int | None:
    """The Ready pods a Deployment's ReplicaSets keep once a scaling event gives them `allowed` pods
    (its replicas + maxSurge), as the controller sizes them (sync.go scale(): one active ReplicaSet
    takes the replicas; several share the change by deploymentutil.GetProportion) and each deletes
    its unready pods first. None where that cannot be told: no ReplicaSet seen, or one without the
    max-replicas annotation (the controller would read the Deployment's status then)."""
    active = [rs for rs in sets if rs.replicas > 0]
    if len(active) < 2 or any(not rs.max_replicas for rs in active):
        return None
    to_add = allowed - sum(rs.replicas for rs in active)
    # Growing: largest first, then newest (ReplicaSetsBySizeNewer); shrinking: largest, then oldest.
    active.sort(key=lambda rs: rs.created, reverse=to_add > 0)
    active.sort(key=lambda rs: -rs.replicas)
    sizes, added = [], 0
    for rs in active:
        share = _proportion(rs, allowed, to_add, added)
        sizes.append(rs.replicas + share)
        added += share
    sizes[0] = max(sizes[0] + to_add - added, 0)  # the leftover goes to the first
    return sum(min(rs.ready, size) for rs, size in zip(active, sizes, strict=True))


def _proportion(rs: ReplicaSetState, allowed: int, to_add: int, added: int) -> int:
    """deploymentutil.GetProportion: the ReplicaSet's share of the change, its size scaled from the
    pods it was last sized for to `allowed` (rounded half away from zero), never past what is left."""
    if to_add == added or not rs.max_replicas:
        return 0
    fraction = math.floor(rs.replicas * allowed / rs.max_replicas + 0.5) - rs.replicas
    return min(fraction, to_add - added) if to_add > 0 else max(fraction, to_add - added)


def _shrink(budget: Budget, side: Side, target: int, other_ready: int) -> int:
    """Keep the Ready pods the floor still needs; unready ones go (a ReplicaSet deletes those first).
    A rolling track the floor needs any Ready pod of is not lowered at all: proportional scaling may
    take every one (Side.kept), and pods its roll only may remove are still serving."""
    if target >= side.replicas:
        return side.replicas
    needed = _needed(budget, side, other_ready)
    if needed == 0:
        return target
    return side.replicas if side.rolling else min(side.replicas, max(target, needed))


def _raise_kept(budget: Budget, side: Side, replicas: int, other_ready: int) -> int:
    """`replicas`, unless it raises a rolling track whose scaling event would shed Ready pods the
    floor needs (a maxSurge lowered since its ReplicaSets were sized, see the module's note): then
    its replicas stay as they are until the other track or its own roll makes up for them."""
    if replicas <= side.replicas:
        return replicas
    needed = min(side.kept(side.replicas), max(budget.min_ready - other_ready, 0))
    return replicas if side.kept(replicas) >= needed else side.replicas


def _kept_above_its_replicas(budget: Budget, side: Side, other_ready: int) -> int:
    """Ready pods above a track's replicas (a lowering its Deployment has not acted on yet, or its
    roll's surge) would go: those the floor has come to need since (an HPA scale-up, a lost pod) are
    kept by raising its replicas back. The canary's only up to its share (step_toward): more could
    serve an ungated config above it (issue 61: a rollback lowered the canary 1 -> 0 at a floor of
    1, then replicas 2 -> 6 raised the floor before its Deployment acted)."""
    return _needed(budget, side, other_ready) if side.ready > side.replicas else 0


def _needed(budget: Budget, side: Side, other_ready: int) -> int:
    """The side's Ready pods the floor needs beside the other side's `other_ready`."""
    return min(side.ready, max(budget.min_ready - other_ready, 0))


def _grow(current: int, target: int, room: int) -> int:
    return min(target, max(current, room))
