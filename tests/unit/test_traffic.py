"""Route weights between the tracks: load-matched, moved before pods, and only what a gateway accepted
counts. Walked against a model of a cluster whose gateway takes the weights one tick late."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate.capacity import Budget, Side, step_toward
from specgate.traffic import (
    Parent,
    RouteStep,
    Weights,
    capped,
    order,
    route_hold,
    served_by_a_gateway,
    shares,
)

Tick = tuple[tuple[int, int], Weights]


def carries_at_most_the_floor_per_pod(weights: Weights, ready: tuple[int, int], budget: Budget) -> bool:
    """The capacity invariant for traffic: no track's Ready pods carry more per pod than the
    floor's (replicas - maxUnavailable) pods would, give or take half a percent of rounding. A
    floor of 0 (maxUnavailable at least replicas) lets every pod go: there is nothing to keep."""
    floor = budget.min_ready
    if floor == 0:
        return True
    return all(
        w * floor <= 100 * r + 0.5 * floor
        for w, r in zip((weights.baseline, weights.canary), ready, strict=True)
    )


def walk(
    budget: Budget, start: tuple[int, int], target: tuple[int, int], weights_first: bool = True
) -> list[Tick]:
    """Replicas and the weights the gateway routes after each tick, until the target holds. Pods
    removed stop serving at once, pods added are Ready a tick later, and the gateway accepts the
    weights a tick after they are written. weights_first=False applies capacity's proposal as the
    Service router does, to show that the invariant then breaks behind a gateway."""
    (b, c), (rb, rc) = start, start
    routed = shares(*start) or Weights(100, 0)
    ticks: list[Tick] = []
    for _ in range(60):
        proposed = step_toward(budget, Side(b, rb), Side(c, rc), target)
        step = order(budget, Side(b, rb), Side(c, rc), proposed, routed)
        if not weights_first:
            step = RouteStep(proposed, step.weights)
        (nb, nc), written = step.replicas, step.weights
        rb, rc = min(rb, nb), min(rc, nc)  # a shrink stops Ready pods first... before the gateway knows
        overloaded = f"overloaded: routing {routed} to Ready pods {(rb, rc)} after {ticks}"
        assert carries_at_most_the_floor_per_pod(routed, (rb, rc), budget), overloaded
        ticks.append(((nb, nc), routed))
        if (b, c) == (nb, nc) == target and (rb, rc) == target and routed == written:
            return ticks
        rb, rc = (nb if nb > b else rb), (nc if nc > c else rc)
        b, c, routed = nb, nc, written
    raise AssertionError(f"never reached {target}: stuck at {(b, c)} routing {routed}")


def test_load_matched_weights_are_each_tracks_share_of_ready_pods() -> None:
    assert shares(3, 1) == Weights(75, 25)
    assert shares(2, 1) == Weights(67, 33)
    assert shares(0, 4) == Weights(0, 100)
    assert shares(0, 0) is None  # nothing Ready: no share to match


def test_a_rollback_after_promotion_moves_weight_back_before_each_canary_pod_goes() -> None:
    """Figures worked by hand: replicas 4, maxSurge 1. The canary keeps its 4 pods until the gateway
    sends it 75 %, the share 3 pods carry beside the baseline's first Ready pod, and so on."""
    ticks = walk(Budget(4, max_surge=1, max_unavailable=0), start=(0, 4), target=(4, 0))
    assert ticks[:6] == [
        ((1, 4), Weights(0, 100)),  # a baseline pod starts; the canary serves everything
        ((1, 4), Weights(0, 100)),  # it is Ready: 25/75 written, the canary waits for the gateway
        ((2, 3), Weights(25, 75)),  # the gateway has it: one canary pod goes, one baseline pod starts
        ((2, 3), Weights(25, 75)),  # 50/50 written
        ((3, 2), Weights(50, 50)),
        ((3, 2), Weights(50, 50)),
    ]
    assert ticks[-1] == ((4, 0), Weights(100, 0))


def test_a_promotion_moves_weight_to_the_canary_before_each_baseline_pod_goes() -> None:
    ticks = walk(Budget(4, max_surge=1, max_unavailable=0), start=(3, 1), target=(0, 4))
    shrinks = [i for i in range(1, len(ticks)) if ticks[i][0][0] < ticks[i - 1][0][0]]
    assert shrinks, "the baseline never shrank"
    for i in shrinks:  # the tick before each shrink wrote what the gateway routes at the shrink
        assert ticks[i][1].baseline < ticks[i - 1][1].baseline
    assert ticks[-1] == ((0, 4), Weights(0, 100))


def test_without_weights_first_a_gateway_overloads_the_pods_that_remain() -> None:
    """The check above can fail: capacity's proposal alone, applied behind a gateway that still
    routes the old weights, leaves the shrunk track's Ready pods more than the floor's share."""
    with pytest.raises(AssertionError, match=r"^overloaded: routing Weights"):
        walk(Budget(4, max_surge=1, max_unavailable=0), start=(0, 4), target=(4, 0), weights_first=False)


@given(
    replicas=st.integers(1, 6),
    surge=st.integers(0, 2),
    unavailable=st.integers(0, 2),
    canary=st.integers(1, 5),
    promote=st.booleans(),
)
def test_every_transition_keeps_the_traffic_per_pod_within_the_floor(
    replicas: int, surge: int, unavailable: int, canary: int, promote: bool
) -> None:
    """From a settled canary to promotion or rollback, and from promotion back: at every tick the
    gateway's weights ask no Ready pod for more than the floor's share (asserted inside walk)."""
    if surge + unavailable == 0:
        surge = 1  # api.RULES refuses both 0
    canary = min(canary, max(replicas - 1, 1))
    budget = Budget(replicas, surge, unavailable)
    beside = (max(replicas - canary, 0), canary)
    walk(budget, beside, (0, replicas) if promote else (replicas, 0))
    walk(budget, (0, replicas), (replicas, 0))


def test_the_initial_step_caps_the_canary_unless_the_baseline_cannot_carry_the_rest() -> None:
    # maxSurge 1: the canary runs beside all 4 baseline pods, which carry 95 % within the floor.
    assert capped(Weights(80, 20), canary_cap=5, baseline_ready=4, budget=Budget(4, 1, 0)) == Weights(95, 5)
    # maxUnavailable 1: 3 baseline pods may carry a third each, so 5 % for the canary is fine.
    assert capped(Weights(75, 25), canary_cap=5, baseline_ready=3, budget=Budget(4, 0, 1)) == Weights(95, 5)
    # No spare pod and no pod to spare: 3 baseline pods carry at most 3/4, the canary the rest.
    assert capped(Weights(75, 25), canary_cap=5, baseline_ready=3, budget=Budget(4, 1, 0)) == Weights(75, 25)
    # The cap never raises the canary above its load-matched share.
    assert capped(Weights(97, 3), canary_cap=5, baseline_ready=4, budget=Budget(4, 1, 0)) == Weights(97, 3)


def test_an_unknown_accepted_weight_holds_every_shrink() -> None:
    """Until the gateway has accepted a route, nothing says where traffic goes: pods stay."""
    step = order(Budget(4, 1, 0), Side(4, 4), Side(1, 1), proposed=(3, 1), actual=None)
    assert step == RouteStep((4, 1), Weights(75, 25))


def test_only_a_tracks_last_pods_wait_for_the_route_to_have_settled() -> None:
    """Accepted but not yet routed for scaleDownDelay (settled False): a baseline keeping 3 pods
    keeps endpoints and shrinks at once; a canary losing its last pod waits, as its Service would
    have no endpoint while a lagging data plane still gives it weight."""
    budget = Budget(4, 1, 0)
    kept = order(budget, Side(4, 4), Side(1, 1), proposed=(3, 1), actual=Weights(75, 25), settled=False)
    assert kept == RouteStep((3, 1), Weights(75, 25))
    emptied = (4, 0)
    waits = order(budget, Side(4, 4), Side(1, 1), proposed=emptied, actual=Weights(100, 0), settled=False)
    assert waits == RouteStep((4, 1), Weights(100, 0))
    goes = order(budget, Side(4, 4), Side(1, 1), proposed=emptied, actual=Weights(100, 0), settled=True)
    assert goes == RouteStep((4, 0), Weights(100, 0))


def route(*parents: dict[str, Any], generation: int = 2) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "generation": generation}, "status": {"parents": list(parents)}}


def parent(
    name: str, accepted: str = "True", resolved: str = "True", seen: int = 2, **ref: str
) -> dict[str, Any]:
    conditions = [
        {"type": "Accepted", "status": accepted, "reason": "Accepted", "observedGeneration": seen},
        {"type": "ResolvedRefs", "status": resolved, "reason": "BackendNotFound", "message": "no llama-canary",
         "observedGeneration": seen},
    ]  # fmt: skip
    return {
        "parentRef": {"name": name, **ref},
        "controllerName": "traefik.io/gateway-controller",
        "conditions": conditions,
    }


OURS = [Parent("inference")]


def test_measuring_waits_until_every_parent_accepts_the_routes_generation() -> None:
    assert route_hold(route(parent("inference", namespace="ml")), OURS) is None
    assert route_hold(None, OURS) == "the HTTPRoute does not exist yet"
    assert route_hold(route(), OURS) == "parent Gateway inference: has not reported on the HTTPRoute yet"
    assert route_hold(route(parent("inference", seen=1)), OURS) == (
        "parent Gateway inference: Accepted not yet reported for generation 2"
    )
    assert route_hold(route(parent("inference", resolved="False")), OURS) == (
        "parent Gateway inference: ResolvedRefs is False (BackendNotFound: no llama-canary)"
    )
    other = [*OURS, Parent("edge", "gateways", "https")]
    assert route_hold(route(parent("inference")), other) == (
        "parent Gateway edge: has not reported on the HTTPRoute yet"
    )
    assert (
        route_hold(
            route(parent("inference"), parent("edge", namespace="gateways", sectionName="https")), other
        )
        is None
    )


def test_a_users_route_is_judged_by_every_parent_in_its_status() -> None:
    assert route_hold(route(), None) == "no Gateway has picked up the HTTPRoute yet (status.parents is empty)"
    assert route_hold(route(parent("a"), parent("b", accepted="False")), None) == (
        "parent Gateway b: Accepted is False (Accepted: )"
    )


def test_a_route_no_gateway_accepts_is_served_by_none() -> None:
    """A released route waits for its Gateways only where one accepts it at all (handlers._release_record)."""
    parent = {"parentRef": {"name": "inference"}, "conditions": [{"type": "Accepted", "status": "True"}]}
    assert served_by_a_gateway({"status": {"parents": [parent]}})
    refused = {
        **parent,
        "conditions": [{"type": "Accepted", "status": "False", "reason": "NoMatchingParent"}],
    }
    assert not served_by_a_gateway({"status": {"parents": [refused]}})
    assert not served_by_a_gateway({"status": {}})
