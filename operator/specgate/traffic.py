"""Weights of a Gateway API route between the baseline and the canary, and their order (pure).

Behind a gateway, a track's share of traffic is its route weight, not its share of replicas. The
weights are load-matched: each track gets its share of the Ready serving pods, so per-pod load is
the same on both tracks and their latencies compare fairly. Weight moves before pods do: a track
gives up pods only once the route, as its gateway has accepted it, no longer sends it more than the
pods it keeps can carry (promotion moves weight to the canary before the baseline scales down; a
rollback moves it back before the canary scales down). Weights are percent of the route's traffic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specgate.capacity import Budget, Side


@dataclass(frozen=True)
class Weights:
    """Each track's percent of the route's traffic; `relative`, where the percents come from Ready
    pods, the pod counts themselves: Gateway API weights are relative, so the route is written with
    those (percent would round a 1-pod canary beside 199 baseline pods to 0). Not compared."""

    baseline: int
    canary: int
    relative: tuple[int, int] | None = field(default=None, compare=False)

    @property
    def pair(self) -> tuple[int, int]:
        """(baseline, canary), in the order replicas are."""
        return self.baseline, self.canary

    @property
    def written(self) -> tuple[int, int]:
        """The weights to write in the route's backendRefs: the pod counts, or the percents."""
        return self.relative or self.pair


ALL_BASELINE = Weights(100, 0)


def shares(baseline: int, canary: int) -> Weights | None:
    """Each track's share of the two, in percent; None when both are 0. Of the Ready pods, these
    are the load-matched weights; of a route's relative weights, the traffic each track gets."""
    total = baseline + canary
    if total == 0:
        return None
    percent = round(100 * canary / total)
    return Weights(100 - percent, percent, relative=(baseline, canary))


def capped(weights: Weights, canary_cap: int, baseline_ready: int, budget: Budget) -> Weights:
    """The initial step: the canary at most canary_cap, but never so little that the baseline's
    Ready pods carry more per pod than the floor's pods would (100 / (replicas - maxUnavailable))."""
    baseline_most = 100 * baseline_ready // max(budget.min_ready, 1)
    canary = min(weights.canary, max(canary_cap, 100 - baseline_most))
    return weights if canary == weights.canary else Weights(100 - canary, canary)


def carries_all(budget: Budget, ready: int) -> bool:
    """Whether these Ready pods (the baseline's, at first) can take all of a rule's traffic: the
    floor's worth (replicas - maxUnavailable), and at least one pod. Until then a user's rule keeps
    its own backends and an owned route is not created (no weight on a backend without Ready pods
    that did not already carry the traffic: a gateway answers 503 for it)."""
    return ready >= max(budget.min_ready, 1)


def away_from_unready(written: Weights | None, baseline_ready: int, canary_ready: int) -> Weights | None:
    """Paused or Failed (pods held as they are): the weights the rule must carry so that a track
    without Ready pods keeps none of the traffic, all of it to the other track where that one has
    Ready pods; None: leave the rule as it is. Weight only ever moves away from a track, never to
    one (a pause must not give the canary more than it had)."""
    if written is None:
        return None
    if written.canary > 0 and canary_ready == 0 and baseline_ready > 0:
        return ALL_BASELINE
    if written.baseline > 0 and baseline_ready == 0 and canary_ready > 0:
        return Weights(0, 100)
    return None


def held(rule: Weights | None, baseline_ready: int, canary_ready: int) -> Weights | None:
    """Paused or Failed: the weights the rule must carry, `rule` (its own, or what specgate last set
    on a route someone deleted) moved away from a track without Ready pods; None where there is
    nothing to write: no rule, or a track it weights has no Ready pod and the other none to take
    its share (whatever carries the traffic keeps it; a route is not made for pods that cannot serve)."""
    if rule is None:
        return None
    weights = away_from_unready(rule, baseline_ready, canary_ready) or rule
    if (weights.baseline > 0 and baseline_ready == 0) or (weights.canary > 0 and canary_ready == 0):
        return None
    return weights


def roll_carries(budget: Budget, rolling: Side, weight: int) -> bool:
    """Behind a route, whether a track rolling to a new pod template keeps, through its roll's worst
    case (maxUnavailable of its Ready pods down), Ready pods that carry its `weight` percent of the
    route at no more per pod than the floor's pods would: the other track's pods take none of it."""
    ready = min(rolling.ready, rolling.replicas)
    left = ready - min(budget.max_unavailable, ready)
    return left >= pods_to_carry(budget, weight)


def pods_to_carry(budget: Budget, weight: int) -> int:
    """The Ready pods that carry `weight` percent of the route at no more per pod than the floor's
    pods would (0 for a floor of 0: the spec lets every pod go)."""
    return max(math.ceil(weight * budget.min_ready / 100), 0)


def most_of(*weights: Weights | None) -> Weights | None:
    """Each track's largest weight among those known (None: none is): what the route may send it."""
    known = [w for w in weights if w is not None]
    if not known:
        return None
    return Weights(max(w.baseline for w in known), max(w.canary for w in known))


@dataclass(frozen=True)
class RouteStep:
    """What to apply now: replicas per track (baseline, canary) and the route's weights (None: leave
    the rule as it is)."""

    replicas: tuple[int, int]
    weights: Weights | None


def order(
    budget: Budget,
    baseline: Side,
    canary: Side,
    proposed: tuple[int, int],
    actual: Weights | None,
    canary_cap: int | None = None,
    routes_tracks: bool = True,
    settled: bool = True,
) -> RouteStep:
    """Weights and replicas for this tick, from the replicas capacity.step_toward proposes.

    The weights match the Ready pods that remain after the proposed step. If the step lowers a
    track's replicas while `actual` (the weights its gateway accepted, None when unknown) still
    gives that track more, that track keeps its replicas this tick: the weights move first, and the
    shrink follows once the gateway has them. The growing side still grows within maxSurge counted
    with the held pods (a stalled gateway must not freeze a promotion's or a rollback's growth). A
    new pod gets weight once Ready. A track's last pods also wait until `settled`: the gateway has
    routed `actual` for traffic.scaleDownDelay (a gateway reports a route Accepted before its data
    plane routes it, and a track without endpoints that still has weight there answers 503; a
    track that keeps pods keeps endpoints, so its other shrinks need not wait).

    `routes_tracks`: whether the rule sends traffic to the tracks' Services already (its spec, not
    only once accepted). A rule that does not (a user's rule with its own backends, an owned route
    not created yet or deleted by someone) is written only once the Ready pods its weights would
    send the traffic to carries_all: the baseline's alone while the canary's share is capped (Canary,
    Analyzing: a takeover must not give the canary more than its cap), both tracks' otherwise (an
    owned route deleted while Promoted comes back on the canary's pods, where the baseline has
    none); with no Ready pod on either track the rule is left as it is (whatever carried the
    traffic keeps it)."""
    after = (min(baseline.ready, proposed[0]), min(canary.ready, proposed[1]))
    carriers = after[0] if canary_cap is not None else after[0] + after[1]
    if not routes_tracks and not carries_all(budget, carriers):
        return RouteStep(proposed, None)  # the tracks cannot carry the rule's traffic yet
    desired = shares(*after)
    if desired is None:
        return RouteStep(proposed, None)
    if canary_cap is not None:
        desired = capped(desired, canary_cap, after[0], budget)
    current = (baseline.replicas, canary.replicas)
    for track in (0, 1):
        shrinks = proposed[track] < current[track]
        unrouted = actual is None or actual.pair[track] > desired.pair[track]
        if shrinks and (unrouted or (proposed[track] == 0 and not settled)):
            return RouteStep(_growth_only(budget, current, proposed), desired)
    return RouteStep(proposed, desired)


def through_stage(weights: Weights | None, takes_over: bool, staged: bool, accepted: bool) -> Weights | None:
    """The weights to write on a user's rule that the tracks' InferencePools take over (`takes_over`:
    the rule does not route the tracks yet), None where the rule must be staged first (its own
    backends keep all the traffic, the pools are named at weight 0): until the rule is `staged` and
    its Gateways `accepted` it and both pools, a gateway may not serve the pools (its endpoint
    picker does not know them yet), and a rule moved to them would fail requests that its own
    backends serve. Other rules take `weights` as they are."""
    if weights is None or not takes_over or (staged and accepted):
        return weights
    return None


def _growth_only(budget: Budget, current: tuple[int, int], proposed: tuple[int, int]) -> tuple[int, int]:
    """The proposal with its shrinks held: each growing track grows as far as replicas + maxSurge
    pods in all allow beside the other track's pods as they stay."""
    most = budget.replicas + budget.max_surge
    b, c = current
    if proposed[0] > b:
        b = min(proposed[0], max(b, most - c))
    if proposed[1] > c:
        c = min(proposed[1], max(c, most - b))
    return b, c


# --- the route's parent status: measure only what the gateway routes ---


@dataclass(frozen=True)
class Parent:
    """A parentRef the route names (Gateway API ParentReference, group and kind left as Gateway)."""

    name: str
    namespace: str | None = None
    section_name: str | None = None


def route_hold(
    route: Mapping[str, Any] | None, parents: Sequence[Parent] | None, kind: str = "HTTPRoute"
) -> str | None:
    """Why the route's traffic cannot be measured yet, or None when every parent that names it
    (those in `parents`; None: every parent in its status) has Accepted and ResolvedRefs True for
    the route's current generation. `kind` names the object in the reasons: an InferencePool's
    status.parents has the route's shape, and its Gateways must accept it too."""
    if route is None:
        return f"the {kind} does not exist yet"
    namespace = route.get("metadata", {}).get("namespace")
    generation = route.get("metadata", {}).get("generation")
    statuses = route.get("status", {}).get("parents") or []
    reported = [_parent(s.get("parentRef", {}), namespace) for s in statuses]
    wanted = reported if parents is None else [_in(p, namespace) for p in parents]
    if not wanted:
        return f"no Gateway has picked up the {kind} yet (status.parents is empty)"
    for parent in wanted:
        found = [s for s, r in zip(statuses, reported, strict=True) if r == parent]
        problem = _parent_problem(found[0] if found else None, generation, kind)
        if problem:
            return f"parent Gateway {parent.name}: {problem}"
    return None


def served_by_a_gateway(route: Mapping[str, Any]) -> bool:
    """Whether some parent Gateway reports the route Accepted (for any generation): one that may
    still serve a configuration of it. None does: nothing sends traffic by it."""
    return any(
        condition.get("type") == "Accepted" and condition.get("status") == "True"
        for parent in route.get("status", {}).get("parents") or []
        for condition in parent.get("conditions") or []
    )


def pools_hold(
    pools: Mapping[str, Mapping[str, Any] | None],
    parents: Sequence[Parent] | None,
    missing_pickers: Mapping[str, str] | None = None,
) -> str | None:
    """Why the InferencePools (by name, None: not found) do not carry their weights yet: the first
    pool whose Gateways (`parents` as route_hold reads them) have not accepted it and resolved its
    endpoint picker, with the cause where it is known (`missing_pickers`: the picker's Service is
    absent, by pool name); None when every one has."""
    for name, pool in pools.items():
        hold = route_hold(pool, parents, kind="InferencePool")
        if hold is not None:
            cause = (missing_pickers or {}).get(name)
            return f"InferencePool {name}: {cause} ({hold})" if cause else f"InferencePool {name}: {hold}"
    return None


def _parent(ref: Mapping[str, Any], namespace: str | None) -> Parent:
    return _in(Parent(str(ref.get("name", "")), ref.get("namespace"), ref.get("sectionName")), namespace)


def _in(parent: Parent, namespace: str | None) -> Parent:
    """A parentRef without a namespace names a Gateway in the route's own."""
    return parent if parent.namespace else Parent(parent.name, namespace, parent.section_name)


def _parent_problem(status: Mapping[str, Any] | None, generation: int | None, kind: str) -> str | None:
    if status is None:
        return f"has not reported on the {kind} yet"
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    for kind in ("Accepted", "ResolvedRefs"):
        condition = conditions.get(kind)
        if condition is None or condition.get("observedGeneration") != generation:
            return f"{kind} not yet reported for generation {generation}"
        if condition.get("status") != "True":
            return f"{kind} is {condition.get('status')} ({condition.get('reason')}: {condition.get('message', '')})"
    return None
