"""Moving pods between the baseline and the canary without losing serving capacity (pure).

Both tracks sit behind one Service and both answer correctly (speculative decoding is lossless), so
the serving capacity is the Ready pods of both. Every transition moves toward its target the way a
Deployment's rolling update does: the shrinking side gives up a Ready pod only when the other side's
Ready pods keep the total at `replicas - maxUnavailable`, and the growing side starts new pods only
within `replicas + maxSurge` pods in all.

A track mid-roll (ReplicaSets of two templates) is a different animal: lowering its replicas is a
scaling event its Deployment spreads over every ReplicaSet in proportion to the size each was last
sized for (replicas + maxSurge then; Kubernetes docs, "Proportional scaling"), Ready pods included.
specgate does not see the ReplicaSets, and a maxSurge lowered since they were sized makes the
Deployment shed more than the change (maxSurge 2 -> 1, then replicas 6 -> 5: two Ready pods of the
old ReplicaSet go, issue 61). For some split every Ready pod of the track may go, so a rolling
track is lowered only while the other track alone keeps the floor. Raising one is not held: a
raise sheds pods only where maxSurge fell by more than the raise (6 -> 7 after 3 -> 1), and holding
a stuck roll below its replicas leaves the floor to its roll's maxUnavailable of fewer pods (the
fuzz found that worse); that case stays open until specgate sees the ReplicaSets' sizes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Side:
    """A track as observed: pods asked for and pods Ready, how many Ready pods below its replicas
    its Deployment's own rolling update may still take, and whether it is rolling (ReplicaSets of
    two templates: lowering its replicas then scales them all proportionally, Ready pods included)."""

    replicas: int
    ready: int
    unavailable: int = 0
    rolling: bool = False

    def kept(self, replicas: int) -> int:
        """The Ready pods the track keeps at `replicas`, whatever its own roll still removes; rolling,
        a lowering may take every one (proportional scaling, see the module's note)."""
        if self.rolling and replicas < self.replicas:
            return 0
        return max(min(self.ready, replicas - self.unavailable), 0)


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
    b = max(b, _grow(baseline.replicas, want_b, room=most_pods - c)) if want_b > baseline.replicas else b
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


def guaranteed(side: Side, rolling: bool, max_unavailable: int) -> Side:
    """A track as capacity can count on it: a Deployment mid-roll may take any Ready pod above
    `replicas - maxUnavailable` down at any moment, so only those below it count (Side.kept)."""
    return Side(side.replicas, side.ready, max_unavailable if rolling else 0, rolling)


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
