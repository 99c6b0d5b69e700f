"""Gateway routing that never sends live traffic to nothing (issue 57), driven through the real
decide(), traffic and handlers.step: each test is one of the issue's day-2 sequences, and fails on
1be5013, where the route was taken over before any pod was Ready, frozen while paused, uncapped,
held without a deadline, and never repaired."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client import REGISTRY
from tests.unit.handler_fakes import OWNER, FakeKube, reconcile_step
from tests.unit.rollout_driver import Run, edit, make_spec, metrics, ready, spec_body
from tests.unit.test_gateway_rollout import EXISTING, OWNED, accepted, gateway_run, user_route

from specgate import api, handlers, kube, render, rollout
from specgate import metrics as operator_metrics
from specgate.api import Phase
from specgate.capacity import Budget, Side
from specgate.observation import Observation, RouteState, TrackState
from specgate.rollout import Reason
from specgate.traffic import Weights, away_from_unready, carries_all, order, roll_carries

STARTING = TrackState(exists=True, replicas=2, ready_replicas=0, waiting="ContainerCreating")
USERS = [{"name": "vllm", "port": 8000}]


def routed(weights: Weights) -> RouteState:
    """A rule that sends traffic to the tracks' Services at `weights`, accepted by its Gateways."""
    return RouteState(weights=weights)


# --- sequence 1: a user's rule keeps its own backends until the baseline can take all of it ---


def test_a_users_rule_keeps_its_backends_until_the_baseline_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """First apply with existingRoute while the baseline's pods load: the rule is not touched (on
    1be5013 it was patched to 100/0 at once: every request on it a 503 for the model's load time)."""
    run = Run(make_spec(traffic=EXISTING))
    fake = FakeKube({"llama-baseline": STARTING}, routes={"chat": user_route(USERS)}).install(monkeypatch)
    run.status = reconcile_step(run, after=0).status
    assert not [call for call in fake.calls if call[0] == "patch route"]
    assert fake.routes["chat"]["spec"]["rules"][1]["backendRefs"] == USERS
    assert run.status.traffic is not None and run.status.traffic.original is None  # nothing taken yet
    fake.tracks["llama-baseline"] = TrackState(exists=True, replicas=2, ready_replicas=1)
    run.status = reconcile_step(run, after=10).status
    assert not [call for call in fake.calls if call[0] == "patch route"]  # 1 of the floor's 2 pods
    fake.tracks["llama-baseline"] = ready(2)
    run.status = reconcile_step(run, after=20).status
    patches = [call for call in fake.calls if call[0] == "patch route"]
    assert len(patches) == 1
    refs = fake.routes["chat"]["spec"]["rules"][1]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [("llama-baseline", 2), ("llama-canary", 0)]
    assert run.status.traffic is not None and run.status.traffic.original is not None
    assert run.status.traffic.original.backend_refs == USERS  # what deletion puts back


def test_the_owned_route_is_created_only_once_the_baseline_can_carry_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Run(make_spec(traffic=OWNED))
    fake = FakeKube({"llama-baseline": STARTING}).install(monkeypatch)
    decision = reconcile_step(run, after=0)
    assert not [call for call in fake.calls if call[1] == "HTTPRoute"]
    assert decision.route_weights is None
    run.status = decision.status
    fake.tracks["llama-baseline"] = ready(2)
    decision = reconcile_step(run, after=10)
    assert [call[2] for call in fake.calls if call[1] == "HTTPRoute"] == ["llama"]
    assert decision.route_weights == Weights(100, 0)


def test_takeover_needs_the_floors_ready_pods_and_never_weights_a_track_without_any() -> None:
    """traffic.order: a rule that does not route the tracks yet is written only once the baseline's
    Ready pods reach the floor (at least one); one that does keeps its weights where no pod of either
    track is Ready (whatever carried the traffic keeps it), and gives no weight to a track without."""
    budget = Budget(3, max_surge=1, max_unavailable=1)
    assert not carries_all(budget, 1) and carries_all(budget, 2)
    assert carries_all(Budget(1, 1, 1), 1) and not carries_all(Budget(1, 1, 1), 0)
    assert order(budget, Side(3, 1), Side(0, 0), (3, 0), None, routes_tracks=False).weights is None
    assert order(budget, Side(3, 2), Side(0, 0), (3, 0), None, routes_tracks=False).weights == Weights(100, 0)
    assert order(budget, Side(3, 0), Side(1, 0), (3, 1), Weights(75, 25)).weights is None
    assert order(budget, Side(3, 0), Side(1, 1), (3, 1), Weights(75, 25)).weights == Weights(0, 100)


# --- sequence 6: Paused and Failed still move weight away from a track without Ready pods ---


def paused_at_half() -> Run:
    run = gateway_run()
    run.step(baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)))
    edit(run, paused=True)
    held = run.step(baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)))
    run.expect(Phase.PAUSED)
    assert held.route_weights == Weights(50, 50)  # both tracks serve: the rule keeps what it has
    return run


def test_paused_the_weight_leaves_a_track_whose_pods_go_not_ready() -> None:
    """The canary's only pod goes NotReady while paused: its half of the route goes to the baseline
    (on 1be5013 the paused route kept 50 % on a Service without endpoints), replicas held as they are;
    once it is Ready again nothing moves back while paused."""
    run = paused_at_half()
    unready = TrackState(exists=True, replicas=1, ready_replicas=0)
    d = run.step(baseline=ready(1), canary=unready, route=routed(Weights(50, 50)))
    run.expect(Phase.PAUSED)
    assert (d.baseline_replicas, d.canary_replicas, d.route_weights) == (1, 1, Weights(100, 0))
    back = run.step(baseline=ready(1), canary=ready(1), route=routed(Weights(100, 0)))
    assert back.route_weights == Weights(100, 0)  # never toward a track while paused
    lost = run.step(
        baseline=TrackState(exists=True, replicas=1), canary=ready(1), route=routed(Weights(50, 50))
    )
    assert lost.route_weights == Weights(0, 100)


def test_failed_the_weight_still_leaves_a_track_without_ready_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid edit fails the object (no child is changed), then the canary's pod goes NotReady:
    the rule that routes the tracks gives the canary's share to the baseline."""
    run = gateway_run()
    route = user_route(render.backend_refs(OWNER, Weights(50, 50)))
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}, routes={"chat": route})
    fake.install(monkeypatch)
    run.status = run.status.model_copy(
        update={"traffic": api.TrafficStatus(route="chat", desired=api.RouteWeights(baseline=50, canary=50))}
    )
    raw = run.spec.model_dump(by_alias=True, mode="json")
    raw["replicas"] = -1
    failed = handlers_step(raw, run)
    assert failed.status.phase == Phase.FAILED
    assert not [call for call in fake.calls if call[0] == "patch route"]  # both tracks serve
    fake.tracks["llama-canary"] = TrackState(exists=True, replicas=1, ready_replicas=0)
    run.status = failed.status
    handlers_step(raw, run)
    refs = fake.routes["chat"]["spec"]["rules"][1]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [("llama-baseline", 100), ("llama-canary", 0)]
    assert fake.routes["chat"]["spec"]["rules"][0]["backendRefs"] == [{"name": "probe", "port": 80}]


def handlers_step(raw: dict[str, Any], run: Run) -> rollout.Decision:
    return handlers.step(raw, run.status, OWNER, run.generation + 1, run.now, {}, kube.Children())


def test_away_from_unready_never_moves_weight_toward_a_track() -> None:
    assert away_from_unready(Weights(90, 10), baseline_ready=4, canary_ready=0) == Weights(100, 0)
    assert away_from_unready(Weights(90, 10), baseline_ready=0, canary_ready=1) == Weights(0, 100)
    assert away_from_unready(Weights(100, 0), baseline_ready=0, canary_ready=1) == Weights(0, 100)
    assert away_from_unready(Weights(100, 0), baseline_ready=4, canary_ready=1) is None
    assert away_from_unready(Weights(90, 10), baseline_ready=0, canary_ready=0) is None
    assert away_from_unready(None, baseline_ready=0, canary_ready=1) is None


# --- sequence 7: a hard cap on the canary's share; held (and rolled back) where it cannot hold ---


def four_replicas(**rollout_fields: Any) -> Run:
    """4 replicas, 1 canary pod (maxSurge 1) in Analyzing behind the owned route, after warm-up."""
    run = Run(api.parse_spec({**spec_body(**{"traffic": OWNED, **rollout_fields}), "replicas": 4}))
    plain = routed(Weights(100, 0))
    run.step(baseline=ready(4), route=plain)
    run.step(baseline=ready(4), route=plain)
    run.step(after=95, baseline=ready(4), baseline_metrics=metrics(), route=plain)
    run.expect(Phase.CANARY)
    run.step(baseline=ready(4), canary=ready(1), route=plain)
    run.expect(Phase.ANALYZING)
    run.now += timedelta(seconds=30)
    return run


def test_the_default_cap_is_the_load_matched_share_at_the_specs_replicas() -> None:
    assert rollout.max_canary_weight(api.parse_spec({**spec_body(traffic=OWNED), "replicas": 4})) == 25
    assert rollout.max_canary_weight(make_spec(traffic={**OWNED, "maxCanaryWeight": 10})) == 10


def test_a_low_max_canary_weight_keeps_the_baseline_whole_beside_the_canary() -> None:
    """maxCanaryWeight 10 below the load-matched 25 %: the baseline keeps its 4 pods (maxSurge 1)
    and the canary gets 10 %, not 20 or 25."""
    run = four_replicas(traffic={**OWNED, "maxCanaryWeight": 10})
    d = run.step(baseline=ready(4), canary=ready(1), route=routed(Weights(90, 10)))
    assert (d.baseline_replicas, d.canary_replicas, d.route_weights) == (4, 1, Weights(90, 10))


def test_the_baseline_losing_pods_holds_the_analysis_and_rolls_back_after_the_deadline() -> None:
    """Initial weight 5 % on 4 + 1 pods; the baseline loses 2 pods: the 2 left cannot carry 95 %
    (at most what the floor's 4 pods would, traffic.capped), so the canary carries its load-matched
    33 %, above its 25 % cap: status says so, passing gates do not count, and past progressDeadline
    (5 m) the rollout rolls back. On 1be5013 the analysis ran on at 33 %."""
    run = four_replicas(traffic={**OWNED, "initialCanaryWeight": 5})
    good: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    two = TrackState(exists=True, replicas=4, ready_replicas=2)
    d = run.step(baseline=two, canary=ready(1), route=routed(Weights(95, 5)), **good)
    assert d.route_weights is not None and d.route_weights.canary > 25
    run.expect(Phase.ANALYZING)
    assert run.status.reason == Reason.CANARY_ABOVE_MAX_WEIGHT
    assert "above its cap 25%" in (run.status.message or "")
    assert [e.reason for e in d.events] == [Reason.CANARY_ABOVE_MAX_WEIGHT]
    assert any(c.type == "Degraded" and c.status == "True" for c in run.status.conditions)
    over = routed(d.route_weights)
    for _ in range(29):
        run.step(baseline=two, canary=ready(1), route=over, **good)
        run.expect(Phase.ANALYZING)
    run.step(after=11, baseline=two, canary=ready(1), route=over, **good)
    run.expect(Phase.ROLLING_BACK)
    assert run.status.reason == Reason.CANARY_ABOVE_MAX_WEIGHT


def test_a_baseline_with_no_ready_pod_gives_the_canary_all_it_must_and_holds() -> None:
    run = four_replicas()
    none = TrackState(exists=True, replicas=3, ready_replicas=0)
    d = run.step(baseline=none, canary=ready(1), route=routed(Weights(75, 25)))
    assert d.route_weights == Weights(0, 100)  # a black hole is an outage; a slow canary is not
    assert run.status.reason == Reason.CANARY_ABOVE_MAX_WEIGHT


def test_the_baseline_back_resumes_the_analysis_with_a_fresh_window() -> None:
    run = four_replicas()
    good: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    two = TrackState(exists=True, replicas=3, ready_replicas=1)
    run.step(baseline=two, canary=ready(1), route=routed(Weights(50, 50)), **good)
    assert run.status.reason == Reason.CANARY_ABOVE_MAX_WEIGHT
    run.step(after=50, baseline=ready(3), canary=ready(1), route=routed(Weights(75, 25)), **good)
    run.expect(Phase.ANALYZING)  # 50 s of the 60 s window since the hold
    assert run.status.held_since is None
    run.step(after=20, baseline=ready(3), canary=ready(1), route=routed(Weights(75, 25)), **good)
    run.expect(Phase.PROMOTING)


# --- sequence 3: a route hold in Analyzing keeps phase_since and has a deadline ---

NOT_ACCEPTED = RouteState(
    hold="parent Gateway inference: Accepted is False (NotAllowedByListeners: )", written=Weights(50, 50)
)


def test_a_route_hold_in_analyzing_rolls_back_past_progress_deadline() -> None:
    """One Gateway of two refuses the route for good while alpha is 0.1: on 1be5013 the rollout sat
    in Analyzing at 50/50 for ever (phase_since reset every tick); now past progressDeadline it rolls
    back, for RouteNotAccepted, and meanwhile it is Degraded."""
    run = gateway_run()
    entered = run.status.phase_since
    low: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.1)}
    run.step(after=10, baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED, **low)
    assert (run.phase, run.status.reason, run.status.phase_since) == (
        Phase.ANALYZING,
        Reason.ROUTE_NOT_ACCEPTED,
        entered,
    )
    assert any(c.type == "Degraded" and c.status == "True" for c in run.status.conditions)
    for _ in range(29):
        run.step(baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED, **low)
        run.expect(Phase.ANALYZING)
    run.step(after=11, baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED, **low)
    run.expect(Phase.ROLLING_BACK)
    assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED
    assert "held past progressDeadline 5m" in (run.status.message or "")


def test_a_flapping_route_hold_is_bounded_by_max_analysis_duration() -> None:
    """The route is accepted for a moment every 4 minutes (each hold shorter than progressDeadline):
    every window starts over, and maxAnalysisDuration (10 m from the phase's start) ends it."""
    run = gateway_run()
    half = routed(Weights(50, 50))
    good: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    for tick in range(72):  # 10 s apart: accepted for one tick each 4 minutes
        route = half if tick % 24 == 23 else NOT_ACCEPTED
        run.step(after=10, baseline=ready(1), canary=ready(1), route=route, **good)
        if run.phase != Phase.ANALYZING:
            break
    run.expect(Phase.ROLLING_BACK)
    assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED
    assert "held at maxAnalysisDuration 10m" in run.status.history[-1].message
    assert (run.now - gateway_run().now).total_seconds() == 610


# --- sequence 8: the analysis counts only windows at the weights specgate set ---


def test_weights_other_than_the_desired_ones_hold_the_analysis() -> None:
    """A hand edit (or a GitOps reset) leaves the route at 80/20 while specgate wants 50/50: the
    passing gates do not promote until the Gateways route 50/50 for a whole window."""
    run = gateway_run()
    good: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    run.step(after=100, baseline=ready(1), canary=ready(1), route=routed(Weights(80, 20)), **good)
    run.expect(Phase.ANALYZING)
    assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED
    assert "its Gateways route 80/20 (baseline/canary), not the desired 50/50" in (run.status.message or "")
    run.step(after=50, baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)), **good)
    run.expect(Phase.ANALYZING)
    run.step(after=20, baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)), **good)
    run.expect(Phase.PROMOTING)


# --- sequence 2: the owned route is repaired when deleted or edited ---


def test_the_owned_route_is_repaired_when_deleted_or_edited(monkeypatch: pytest.MonkeyPatch) -> None:
    """The route as read is compared with what specgate sets: unchanged, nothing is written (an idle
    object costs nothing); deleted or edited by someone, it is applied again, with a Warning Event."""
    run = Run(make_spec(traffic=OWNED))
    fake = FakeKube({"llama-baseline": ready(2)}).install(monkeypatch)
    run.status = reconcile_step(run, after=0).status
    assert len([call for call in fake.calls if call[1] == "HTTPRoute"]) == 1
    template = run.spec.rollout.traffic
    assert template is not None and template.http_route is not None
    manifest = render.http_route(OWNER, template.http_route, Weights(100, 0))
    fake.routes["llama"] = accepted(manifest)
    fake.calls = []
    d = reconcile_step(run, after=10)
    assert not [call for call in fake.calls if call[1] == "HTTPRoute"]
    assert Reason.ROUTE_REPAIRED not in [e.reason for e in d.events]
    run.status = d.status
    del fake.routes["llama"]  # someone deleted it
    d = reconcile_step(run, after=20)
    assert [call[2] for call in fake.calls if call[1] == "HTTPRoute"] == ["llama"]
    repaired = [e for e in d.events if e.reason == Reason.ROUTE_REPAIRED]
    assert [(e.type, "was deleted" in e.message) for e in repaired] == [("Warning", True)]
    edited = accepted(copy.deepcopy(manifest))
    edited["spec"]["rules"][0]["backendRefs"][1]["weight"] = 50
    fake.routes["llama"], fake.calls = edited, []
    d = reconcile_step(run, after=30)
    assert [call[2] for call in fake.calls if call[1] == "HTTPRoute"] == ["llama"]
    assert [
        "was changed by someone else" in e.message for e in d.events if e.reason == Reason.ROUTE_REPAIRED
    ] == [True]


def test_the_owned_route_deleted_while_promoted_comes_back_on_the_canarys_pods() -> None:
    """Promoted (the baseline at 0 pods), someone deletes the owned route: decide() asks for it
    again at 0/100, the canary's Ready pods carrying it all. Found by the lab's Traefik
    (tests/cluster/test_gateway_routing.py): a missing route was written only once the baseline
    could carry it all, which in Promoted is never, so the gateway answered 404 for good."""
    run = gateway_run()
    passing = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)), **passing)
    run.step(baseline=ready(1), canary=ready(2), route=routed(Weights(50, 50)), **passing)
    run.step(baseline=ready(1), canary=ready(2), route=routed(Weights(0, 100)), **passing)
    run.expect(Phase.PROMOTED)
    done = run.step(baseline=ready(0), canary=ready(2), route=routed(Weights(0, 100)), **passing)
    assert done.baseline_replicas == 0
    deleted = RouteState(hold="HTTPRoute llama does not exist yet")  # render.route_state of no route
    d = run.step(baseline=ready(0), canary=ready(2), route=deleted, **passing)
    assert d.route_weights == Weights(0, 100) and d.route_weights.written == (0, 2)
    assert (d.baseline_replicas, d.canary_replicas) == (0, 2)
    run.expect(Phase.PROMOTED)


def test_a_rule_not_routing_the_tracks_is_written_once_the_pods_it_would_weight_carry_it() -> None:
    """traffic.order for a rule that does not send traffic to the tracks (routes_tracks False):
    where the canary's share is capped (Canary, Analyzing), the baseline's Ready pods alone must
    carry it all before it is taken over; elsewhere (Promoted, RollingBack) the Ready pods of both,
    each track weighted by its own; with too few, or none, the rule is left as it is."""
    budget = Budget(2, 1, 0)
    promoted = order(budget, Side(0, 0), Side(2, 2), (0, 2), None, None, routes_tracks=False)
    assert promoted.weights == Weights(0, 100)
    rolling_back = order(budget, Side(1, 1), Side(2, 1), (1, 1), None, None, routes_tracks=False)
    assert rolling_back.weights == Weights(50, 50)
    short = order(budget, Side(0, 0), Side(2, 1), (0, 2), None, None, routes_tracks=False)
    assert short.weights is None  # one Ready pod where the floor is 2
    capped_takeover = order(budget, Side(1, 1), Side(1, 1), (1, 1), None, 50, routes_tracks=False)
    assert capped_takeover.weights is None  # the baseline alone cannot carry it: the canary would
    analyzing = order(budget, Side(2, 2), Side(1, 1), (2, 1), None, 50, routes_tracks=False)
    assert analyzing.weights is not None and analyzing.weights.pair == (67, 33)


def test_kube_apply_writes_an_httproute_every_time_it_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """kube.apply's cache compares with the watched children; an HTTPRoute is not watched, so on
    1be5013 a route deleted after its first write was never written again."""
    requests: list[tuple[str, str]] = []

    def answer(method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        requests.append((method, path))
        return {"metadata": {"resourceVersion": "1", "generation": 1}}

    monkeypatch.setattr(kube, "_request", answer)
    monkeypatch.setattr(kube, "foreign_children", lambda manifests, uid, fresh=False: [])
    template = api.parse_spec(spec_body(traffic=OWNED)).rollout.traffic
    assert template is not None and template.http_route is not None
    manifest = render.http_route(OWNER, template.http_route, Weights(100, 0))
    kube.apply(manifest)
    kube.apply(manifest)
    assert [m for m, _ in requests] == ["PATCH", "PATCH"]


def test_route_differs_ignores_what_the_api_server_defaults() -> None:
    template = api.parse_spec(spec_body(traffic=OWNED)).rollout.traffic
    assert template is not None and template.http_route is not None
    manifest = render.http_route(OWNER, template.http_route, Weights(75, 25))
    served = accepted(copy.deepcopy(manifest))
    for ref in served["spec"]["rules"][0]["backendRefs"]:
        ref["group"] = ""  # defaulted by the API server
    served["spec"]["rules"][0]["matches"] = [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert not render.route_differs(served, manifest)
    assert render.route_differs(None, manifest)
    served["spec"]["rules"].append({"backendRefs": [{"name": "other", "port": 80}]})
    assert render.route_differs(served, manifest)


# --- sequence 5: a router switch points the owned route at Service <name>, then lets it be ---


def test_a_switch_to_router_service_points_the_owned_route_at_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On 1be5013 the owned route kept its frozen 50/50 and, after a later promotion, sent half the
    gateway's traffic to an empty baseline Service. Now its rule routes to Service <name> (both
    tracks' serving pods); status keeps the route until its Gateways have served that rule for
    scaleDownDelay (they may send the tracks the old weights until then: the pods are held), then
    forgets it, and later reconciles leave it alone."""
    run = gateway_run()
    template = run.spec.rollout.traffic
    assert template is not None and template.http_route is not None
    manifest = render.http_route(OWNER, template.http_route, Weights(50, 50))
    fake = FakeKube(
        {"llama-baseline": ready(1), "llama-canary": ready(1)}, routes={"llama": accepted(manifest)}
    )
    fake.install(monkeypatch)
    run.status = run.status.model_copy(
        update={"traffic": api.TrafficStatus(route="llama", desired=api.RouteWeights(baseline=50, canary=50))}
    )
    edit(run, traffic={"router": "Service"})
    d = reconcile_step(run, after=10)
    refs = fake.routes["llama"]["spec"]["rules"][0]["backendRefs"]
    assert refs == [{"kind": "Service", "name": "llama", "port": render.HTTP_PORT}]
    assert [e.reason for e in d.events if e.reason == Reason.ROUTE_RELEASED] == [Reason.ROUTE_RELEASED]
    route = fake.routes["llama"]
    route["metadata"]["generation"] = 4  # the patch, as the API server counts it: not accepted yet
    run.status, fake.calls = d.status, []
    held = reconcile_step(run, after=10)
    assert held.status.traffic is not None and held.status.traffic.actual_since is None
    for condition in route["status"]["parents"][0]["conditions"]:
        condition["observedGeneration"] = 4  # its Gateway accepts the rule pointed at Service llama
    run.status = held.status
    accepted_at = reconcile_step(run, after=10).status.traffic
    assert accepted_at is not None and accepted_at.actual_since == api.iso(run.now + timedelta(seconds=10))
    run.status = run.status.model_copy(update={"traffic": accepted_at})
    assert reconcile_step(run, after=39).status.traffic is not None  # scaleDownDelay 30s not over
    assert reconcile_step(run, after=40).status.traffic is None
    assert not [call for call in fake.calls if call[0] == "patch route"]


def test_while_the_owned_route_is_released_no_track_gives_up_pods() -> None:
    """The day-2 fuzz (issue 61, seeds 466, 487): a router switched to Service mid-rollback let the
    canary's last pod go in the reconcile that pointed the route at Service <name>, while its Gateway
    still sent the canary a quarter. Until the release is done, replicas only rise and templates stay."""
    decided = rollout.Decision(api.SpeculativeDeploymentStatus(), 5, 0, keep_template=frozenset())
    observation = Observation(generation=1, baseline=ready(4), canary=ready(1))
    held = handlers._held_for_release(decided, observation)
    assert (held.baseline_replicas, held.canary_replicas) == (5, 1)
    assert held.keep_template == {render.Track.BASELINE, render.Track.CANARY}
    none_yet = handlers._held_for_release(
        replace(decided, canary_replicas=None), replace(observation, canary=TrackState())
    )
    assert none_yet.canary_replicas is None


def test_a_decision_made_again_on_the_tracks_read_now_still_holds_them_for_the_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rollback through the owned route switched to router Service: the hold keeps the canary's
    pod while the Gateways may still send it half. Where the same reconcile also takes pods (an
    adopted Deployment lowered: _takes_pods), the decision is made again on the tracks read now
    (the watch lagged: the baseline has 2 Ready pods, not 1); that decision holds them too (it did
    not: the canary's last pod went with the Gateways still at 50/50)."""
    run = gateway_run()
    low: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.2)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)), **low)
    run.expect(Phase.ROLLING_BACK)
    recorded = api.TrafficStatus(route="llama", desired=api.RouteWeights(baseline=50, canary=50))
    run.status = run.status.model_copy(update={"traffic": recorded})
    edit(run, traffic={"router": "Service"})
    FakeKube(read_now={"llama-baseline": ready(2), "llama-canary": ready(1)}).install(monkeypatch)
    cached = Observation(generation=run.generation, baseline=ready(1), canary=ready(1))
    now = run.now + timedelta(seconds=10)
    decision = handlers._decide(run.spec, run.status, cached, now, releasing=True)
    plan = handlers.plan_tracks(run.spec, OWNER, decision, cached, None)
    read_now, again, _ = handlers._decided_on_tracks_now(
        run.spec, run.status, OWNER, cached, decision, plan, now, None, releasing=True
    )
    assert read_now.baseline == ready(2)
    assert rollout.decide(run.spec, run.status, read_now, now).canary_replicas == 0  # unheld
    assert (again.baseline_replicas, again.canary_replicas) == (2, 1)
    assert again.keep_template == {render.Track.BASELINE, render.Track.CANARY}


def test_a_route_that_moved_keeps_its_record_until_it_is_pointed_at_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = gateway_run()
    template = run.spec.rollout.traffic
    assert template is not None and template.http_route is not None
    route = accepted(render.http_route(OWNER, template.http_route, Weights(50, 50)))
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}, routes={"llama": route})
    fake.install(monkeypatch)

    def moved(namespace: str, name: str, operations: list[dict[str, Any]]) -> None:
        raise kube.Conflict("HTTPRoute ml/llama changed since it was read")

    monkeypatch.setattr(kube, "patch_route", moved)
    recorded = api.TrafficStatus(route="llama", desired=api.RouteWeights(baseline=50, canary=50))
    run.status = run.status.model_copy(update={"traffic": recorded})
    edit(run, traffic={"router": "Service"})
    assert reconcile_step(run, after=10).status.traffic == recorded


# --- item 10: a rule whose backends are not core Services is refused, naming the field ---


def test_an_existing_rule_of_inference_pools_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llama-pool"}]
    run = Run(make_spec(traffic=EXISTING))
    fake = FakeKube({"llama-baseline": ready(2)}, routes={"chat": user_route(pool)}).install(monkeypatch)
    status = reconcile_step(run, after=0).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.INVALID_SPEC)
    assert (status.message or "").startswith(
        "spec.rollout.traffic.existingRoute: HTTPRoute chat's rule 'completions' sends traffic to "
        "InferencePool llama-pool (inference.networking.k8s.io)"
    )
    assert not [call for call in fake.calls if call[0] in ("patch route", "apply", "scale")]
    fake.routes["chat"] = user_route(USERS)  # the rule points at a Service again: the rollout goes on
    run.status = status
    assert reconcile_step(run, after=10).status.phase == Phase.BASELINE


# --- sequence 4: a stalled gateway in Promoting: growth goes on, and the reason is the route's ---


def test_growth_within_max_surge_does_not_wait_for_a_held_shrink() -> None:
    """The baseline's shrink waits for the Gateways; the canary still grows as far as maxSurge
    allows beside the baseline's pods as they stay (on 1be5013 both sides froze)."""
    step = order(Budget(4, max_surge=2, max_unavailable=0), Side(3, 3), Side(2, 2), (2, 4), Weights(60, 40))
    assert (step.replicas, step.weights) == ((3, 3), Weights(50, 50))
    full = order(Budget(4, max_surge=1, max_unavailable=0), Side(3, 3), Side(2, 2), (2, 3), Weights(60, 40))
    assert full.replicas == (3, 2)  # no room within maxSurge until the baseline's pod goes


def test_a_promotion_held_by_the_route_past_its_deadline_rolls_back_for_the_route() -> None:
    """3 replicas, maxSurge 1: the canary's 2 pods are Ready, its third waits for the baseline's
    pod, which waits for a Gateway that never accepts. Past progressDeadline the rollback says so
    (on 1be5013: CanaryUnhealthy, "did not scale", with every canary pod Ready)."""
    spec = api.parse_spec({**spec_body(traffic=OWNED), "replicas": 3})
    run = Run(spec)
    run.status = api.SpeculativeDeploymentStatus(
        phase=Phase.PROMOTING,
        phase_since="2026-11-22T12:00:00Z",
        template_hash=render.template_hash(spec),
        passed_template_hash=render.template_hash(spec),
        observed_generation=1,
    )
    held = RouteState(
        hold="parent Gateway inference: Accepted is False (NotAllowedByListeners: )", written=Weights(50, 50)
    )
    d = run.step(after=60, baseline=ready(2), canary=ready(2), route=held)
    run.expect(Phase.PROMOTING)
    assert (d.baseline_replicas, d.canary_replicas) == (2, 2)
    run.step(after=250, baseline=ready(2), canary=ready(2), route=held)
    run.expect(Phase.ROLLING_BACK)
    assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED
    assert "waited for the HTTPRoute past progressDeadline 5m" in (run.status.message or "")


def test_a_rollback_says_why_it_rolls_back_again_once_the_gateways_accept() -> None:
    """RouteNotAccepted while the Gateways had not accepted 100/0; once they route as set, status
    says again why the rollout rolls back (on 1be5013 it kept RouteNotAccepted)."""
    run = gateway_run()
    low: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.2)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)), **low)
    run.expect(Phase.ROLLING_BACK)
    run.step(baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED)
    assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED
    run.step(baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)))
    run.expect(Phase.ROLLING_BACK)
    assert run.status.reason == Reason.ACCEPTANCE_BELOW_GATE


# --- item 10: a 422 from the route's validation is told apart from a patch that found it moved ---


def refusal(status: dict[str, Any]) -> ApiException:
    exc = ApiException(status=422, reason="Unprocessable Entity")
    exc.body = json.dumps(status)
    return exc


def test_a_route_whose_validation_refuses_the_weights_fails_with_its_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 422 of the route's validation (a CEL rule of the Gateway implementation, say) is Invalid,
    with the API server's message; a 422 of a JSON patch whose test failed is a Conflict (the rule
    moved: read again). On 1be5013 both were a Conflict, and a refused rule looped for ever."""
    invalid = {
        "kind": "Status",
        "message": 'HTTPRoute.gateway.networking.k8s.io "chat" is invalid: spec.rules[1].backendRefs: Too many',
        "reason": "Invalid",
        "details": {"name": "chat", "kind": "HTTPRoute", "causes": [{"field": "spec.rules[1].backendRefs"}]},
        "code": 422,
    }
    moved = {
        "kind": "Status",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid",
        "details": {"causes": [{"type": "UnexpectedServerResponse", "message": "testing value failed"}]},
        "code": 422,
    }
    for body, expected in ((invalid, kube.Invalid), (moved, kube.Conflict)):

        def answer(*_: Any, _body: dict[str, Any] = body, **__: Any) -> dict[str, Any]:
            raise refusal(_body)

        monkeypatch.setattr(kube, "_request", answer)
        with pytest.raises(expected):
            kube.patch_route("ml", "chat", [])

    run = Run(make_spec(traffic=EXISTING))
    fake = FakeKube({"llama-baseline": ready(2)}, routes={"chat": user_route(USERS)}).install(monkeypatch)

    def refuse(namespace: str, name: str, operations: list[dict[str, Any]]) -> None:
        raise kube.Invalid(invalid["message"])

    monkeypatch.setattr(kube, "patch_route", refuse)
    status = reconcile_step(run, after=0).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.INVALID_SPEC)
    assert status.message == f"HTTPRoute chat refused the weights: {invalid['message']}"
    assert fake.routes["chat"]["spec"]["rules"][1]["backendRefs"] == USERS


# --- sequence 9: a track the route weights rolls its template only on pods that carry its weight ---


def test_a_template_roll_waits_while_the_route_weights_the_tracks_only_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """replicas 2, maxSurge 0, maxUnavailable 1, canaryReplicas 1, Analyzing at 50/50; an image edit
    moves the route to 100/0. On 1be5013 the baseline's only pod was swapped for the new template in
    the same reconcile (capacity counted the canary's pod, to which the route now sends nothing): all
    route traffic on a Service without a Ready pod. Now the baseline keeps its template (only scaled)
    until it has Ready pods that carry its weight through the roll."""
    body = spec_body(traffic=OWNED, maxSurge=0, maxUnavailable=1, canaryReplicas=1)
    run = Run(api.parse_spec(body))
    plain = routed(Weights(100, 0))
    run.step(baseline=ready(2), route=plain)
    run.step(baseline=ready(2), route=plain)
    run.step(after=95, baseline=ready(2), baseline_metrics=metrics(), route=plain)
    run.step(baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)))
    run.expect(Phase.ANALYZING)
    old = {track: render.template_hash(run.spec, track) for track in render.Track}

    def pods(n: int, track: render.Track, replicas: int | None = None) -> TrackState:
        return TrackState(
            exists=True,
            replicas=n if replicas is None else replicas,
            ready_replicas=n,
            template_hash=old[track],
        )

    run.spec, run.generation = api.parse_spec({**body, "image": "vllm:0.33"}), run.generation + 1
    template = run.spec.rollout.traffic
    assert template is not None and template.http_route is not None
    route = accepted(render.http_route(OWNER, template.http_route, Weights(50, 50)))
    tracks = {"llama-baseline": pods(1, render.Track.BASELINE), "llama-canary": pods(1, render.Track.CANARY)}
    fake = FakeKube(tracks, routes={"llama": route}).install(monkeypatch)
    d = reconcile_step(run, after=10)
    assert d.status.phase == Phase.BASELINE and d.route_weights == Weights(100, 0)
    assert ("scale", "llama-baseline", 1) in fake.calls
    assert not [c for c in fake.calls if c[:3] == ("apply", "Deployment", "llama-baseline")]
    run.status, fake.calls = d.status, []
    fake.routes["llama"] = accepted(render.http_route(OWNER, template.http_route, Weights(100, 0)))
    fake.tracks = {"llama-baseline": pods(2, render.Track.BASELINE), "llama-canary": TrackState(exists=True)}
    reconcile_step(run, after=20)
    assert ("apply", "Deployment", "llama-baseline", 2) in fake.calls  # 2 Ready pods: one may go


def test_roll_carries_counts_the_tracks_own_pods_against_its_weight() -> None:
    budget = Budget(2, max_surge=0, max_unavailable=1)
    assert not roll_carries(budget, Side(1, 1), 100)
    assert not roll_carries(budget, Side(1, 1), 50)
    assert roll_carries(budget, Side(1, 1), 0)
    assert roll_carries(budget, Side(2, 2), 100)
    assert not roll_carries(Budget(4, 1, 1), Side(3, 3), 100)  # 2 pods left for the floor's 3
    assert roll_carries(Budget(4, 1, 1), Side(4, 4), 100)
    assert roll_carries(Budget(1, 0, 1), Side(1, 1), 100)  # replicas 1, maxUnavailable 1: allowed


# --- item 10: Gateway API weights are relative: the route is written with pod counts ---


def test_a_one_pod_canary_beside_199_baseline_pods_gets_its_pods_share() -> None:
    """Percent weights rounded the canary's 0.5 % to 0: its Ready pod got no traffic. The route is
    written with the Ready pods (199 and 1); status and decisions keep the percents."""
    step = order(Budget(200, 1, 0), Side(199, 199), Side(1, 1), (199, 1), Weights(100, 0))
    assert step.weights == Weights(100, 0) and step.weights is not None
    assert step.weights.written == (199, 1)
    refs = render.backend_refs(OWNER, step.weights)
    assert [(r["name"], r["weight"]) for r in refs] == [("llama-baseline", 199), ("llama-canary", 1)]
    capped_step = order(Budget(4, 1, 0), Side(4, 4), Side(1, 1), (4, 1), Weights(100, 0), canary_cap=10)
    assert capped_step.weights is not None and capped_step.weights.written == (90, 10)  # a cap: percents


def test_route_differs_compares_relative_weights_by_the_split_they_make() -> None:
    template = api.parse_spec(spec_body(traffic=OWNED)).rollout.traffic
    assert template is not None and template.http_route is not None
    manifest = render.http_route(OWNER, template.http_route, Weights(75, 25, relative=(3, 1)))
    as_percent = accepted(render.http_route(OWNER, template.http_route, Weights(75, 25)))
    assert not render.route_differs(as_percent, manifest)
    half = accepted(render.http_route(OWNER, template.http_route, Weights(50, 50, relative=(2, 2))))
    assert render.route_differs(half, manifest)


# --- item 10: the owned route's rule can set Gateway API timeouts ---


def test_the_owned_routes_rule_carries_the_timeouts_asked_for() -> None:
    """Envoy-based gateways cut streams at 15 s by default; on 1be5013 the owned route could not say
    otherwise (the field did not exist)."""
    traffic = {
        **OWNED,
        "httpRoute": {**OWNED["httpRoute"], "timeouts": {"request": "10m", "backendRequest": "1h30m"}},
    }
    template = make_spec(traffic=traffic).rollout.traffic
    assert template is not None and template.http_route is not None
    rule = render.http_route(OWNER, template.http_route, Weights(100, 0))["spec"]["rules"][0]
    assert rule["timeouts"] == {"request": "10m", "backendRequest": "1h30m"}
    plain = make_spec(traffic=OWNED).rollout.traffic
    assert plain is not None and plain.http_route is not None
    assert "timeouts" not in render.http_route(OWNER, plain.http_route, Weights(100, 0))["spec"]["rules"][0]
    with pytest.raises(api.SpecError):
        make_spec(
            traffic={**OWNED, "httpRoute": {**OWNED["httpRoute"], "timeouts": {"request": "10 minutes"}}}
        )


# --- item 10: the Baseline phase names the route, not "the Service", when the route holds traffic ---


def test_a_baseline_short_of_traffic_behind_a_refused_route_says_so() -> None:
    run = Run(make_spec(traffic=OWNED))
    refused = RouteState(hold="parent Gateway inference: Accepted is False (NotAllowedByListeners: )")
    idle = replace(metrics(), itl=None)
    run.step(baseline=ready(2), route=refused)
    run.step(baseline=ready(2), route=refused)
    run.step(after=95, baseline=ready(2), baseline_metrics=idle, route=refused)
    run.expect(Phase.BASELINE)
    assert (run.status.message or "").endswith(
        "the HTTPRoute does not carry it yet: parent Gateway inference: Accepted is False "
        "(NotAllowedByListeners: )"
    )
    assert "send traffic to the Service" not in (run.status.message or "")


# --- item 10: the desired and accepted weights as gauges, for an alert on a lasting mismatch ---


def test_the_routes_desired_and_accepted_weights_are_exported_and_dropped() -> None:
    def weight(track: str, source: str) -> float | None:
        labels = {"namespace": "ml", "name": "route-gauges", "track": track, "source": source}
        return REGISTRY.get_sample_value("specgate_route_weight_percent", labels)

    run = gateway_run()
    d = run.step(baseline=ready(1), canary=ready(1), route=routed(Weights(100, 0)))
    traffic = api.TrafficStatus(
        route="llama",
        desired=api.RouteWeights(baseline=50, canary=50),
        actual=api.RouteWeights(baseline=100, canary=0),
    )
    d = replace(d, status=d.status.model_copy(update={"traffic": traffic}))
    operator_metrics.record("ml", "route-gauges", Phase.ANALYZING, d, None)
    assert [weight(t, s) for s in ("desired", "accepted") for t in ("baseline", "canary")] == [50, 50, 100, 0]
    unaccepted = replace(
        d, status=d.status.model_copy(update={"traffic": traffic.model_copy(update={"actual": None})})
    )
    operator_metrics.record("ml", "route-gauges", Phase.ANALYZING, unaccepted, None)
    assert (weight("canary", "desired"), weight("canary", "accepted")) == (50, None)  # no stale accepted
    operator_metrics.forget("ml", "route-gauges")
    assert weight("canary", "desired") is None


# --- item 10: a rule is put back only on backends that still exist ---


def test_a_rule_whose_own_service_is_gone_is_not_pointed_back_at_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router goes back to Service after the user's own Service vllm was deleted: putting the
    rule back would send its traffic to nothing, and the track Services' weights are no longer set,
    so it routes to Service llama (both tracks' serving pods, which the Service router keeps) and a
    Warning says why. On 1be5013 the rule was pointed at the missing Service."""
    run = Run(make_spec(traffic=EXISTING))
    fake = FakeKube({"llama-baseline": ready(2)}, routes={"chat": user_route(USERS)}).install(monkeypatch)
    run.status = reconcile_step(run, after=0).status
    assert run.status.traffic is not None and run.status.traffic.original is not None
    fake.missing_services = {"vllm"}
    run.spec = make_spec()
    decision = reconcile_step(run, after=10)
    refs = fake.routes["chat"]["spec"]["rules"][1]["backendRefs"]
    assert refs == render.shared_service_refs(OWNER)
    assert decision.status.traffic is None  # the rule is the user's again
    (event,) = [e for e in decision.events if e.reason == Reason.ROUTE_RULE_NOT_RESTORED]
    assert event.type == "Warning"
    assert (
        "(Service vllm) no longer exist, so it routes to Service llama instead, which keeps" in event.message
    )


# --- item 10: one object per rule ---


def test_a_rule_another_object_routes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two SpeculativeDeployments naming one rule wrote it in turn every 10 s on 1be5013; the second
    now fails with NameConflict, naming the other, and leaves the rule alone."""
    theirs = [
        {"kind": "Service", "name": "mistral-baseline", "port": 8000, "weight": 3},
        {"kind": "Service", "name": "mistral-canary", "port": 8000, "weight": 1},
    ]
    run = Run(make_spec(traffic=EXISTING))
    fake = FakeKube({"llama-baseline": ready(2)}, routes={"chat": user_route(theirs)}).install(monkeypatch)
    status = reconcile_step(run, after=0).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.NAME_CONFLICT)
    assert "is routed by SpeculativeDeployment mistral" in (status.message or "")
    assert not [call for call in fake.calls if call[0] in ("patch route", "apply", "scale")]
    ours = render.backend_refs(OWNER, Weights(100, 0))
    assert (
        render.routed_by_another(
            user_route(ours), api.ExistingRoute(name="chat", rule_name="completions"), OWNER
        )
        is None
    )


# --- item 10: a held last scale-down in Promoted or RolledBack is reported ---


def test_a_promoted_baseline_held_by_the_route_says_what_holds_it_once() -> None:
    """Promoted while the Gateways have not accepted 0/100: the baseline's last pod stays (it may
    still get traffic) and status and one Warning Event say so, the guard's word after it (on
    1be5013 status said Guarding and nothing named the pod nobody scaled down); once the
    Gateways accept, the pod goes and status is the guard's again."""
    run = gateway_run()
    passing = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)), **passing)
    run.expect(Phase.PROMOTING)
    run.step(baseline=ready(1), canary=ready(2), route=routed(Weights(50, 50)), **passing)
    run.expect(Phase.PROMOTED)
    d = run.step(baseline=ready(1), canary=ready(2), route=NOT_ACCEPTED, **passing)
    assert (d.baseline_replicas, run.status.reason) == (1, Reason.ROUTE_NOT_ACCEPTED)
    held = (
        "the baseline's scale-down of its last 1 pod waits for the HTTPRoute: "
        "parent Gateway inference: Accepted is False (NotAllowedByListeners: ); guard: "
    )
    assert (run.status.message or "").startswith(held)
    assert [(e.type, e.reason) for e in d.events] == [("Warning", Reason.ROUTE_NOT_ACCEPTED)]
    degraded = next(c for c in d.status.conditions if c.type == "Degraded")
    assert degraded.status == "True"
    again = run.step(baseline=ready(1), canary=ready(2), route=NOT_ACCEPTED, **passing)
    assert again.events == ()  # said once
    run.step(baseline=ready(1), canary=ready(2), route=routed(Weights(0, 100)), **passing)
    done = run.step(after=30, baseline=ready(1), canary=ready(2), route=routed(Weights(0, 100)), **passing)
    assert (done.baseline_replicas, run.status.reason) == (0, Reason.GUARDING)


def test_a_rolled_back_canary_held_by_the_route_says_so_then_why_it_rolled_back() -> None:
    """RolledBack: the canary's last pod waits for the Gateways to accept 100/0, said
    in status and one Warning; once they do, status says again why the rollout rolled back."""
    run = gateway_run()
    low: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.2)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=routed(Weights(50, 50)), **low)
    run.expect(Phase.ROLLING_BACK)
    run.step(baseline=ready(2), canary=ready(1), route=routed(Weights(50, 50)))
    run.expect(Phase.ROLLED_BACK)
    d = run.step(baseline=ready(2), canary=ready(1), route=NOT_ACCEPTED)
    assert (d.canary_replicas, run.status.reason) == (1, Reason.ROUTE_NOT_ACCEPTED)
    assert (run.status.message or "").startswith("the canary's scale-down of its last 1 pod waits for")
    assert [(e.type, e.reason) for e in d.events] == [("Warning", Reason.ROUTE_NOT_ACCEPTED)]
    run.step(baseline=ready(2), canary=ready(1), route=routed(Weights(100, 0)))
    done = run.step(after=30, baseline=ready(2), canary=ready(1), route=routed(Weights(100, 0)))
    assert (done.canary_replicas, run.status.reason) == (0, Reason.ACCEPTANCE_BELOW_GATE)
    assert done.events == ()


# --- sequence 6, Failed: the last weights kept, moved only away from a track without Ready pods ---


def failing(cause: str, run: Run, fake: FakeKube) -> dict[str, Any]:
    """The raw spec of `run`, with what makes handlers.step fail for `cause` set on it or the fake."""
    raw = run.spec.model_dump(by_alias=True, mode="json")
    if cause == Reason.INVALID_SPEC:
        raw["replicas"] = -1
    elif cause == Reason.POD_MONITOR_CRD_MISSING:
        raw["rollout"]["metrics"] = {**raw["rollout"].get("metrics", {}), "podMonitor": True}
        fake.pod_monitor_crd = False
    else:
        fake.taken = ["Service llama-canary is owned by another object"]
    return raw


@pytest.mark.parametrize("cause", [Reason.INVALID_SPEC, Reason.POD_MONITOR_CRD_MISSING, Reason.NAME_CONFLICT])
@pytest.mark.parametrize("recorded", [api.RouteWeights(baseline=50, canary=50), None])
def test_failed_keeps_the_last_weights_and_only_moves_them_away_from_unready_pods(
    monkeypatch: pytest.MonkeyPatch, cause: str, recorded: api.RouteWeights | None
) -> None:
    """Whatever fails the object (no child is changed): while both tracks serve the rule keeps its
    weights; a track whose pods go NotReady loses its share to the other; back Ready, nothing moves
    toward it. On 1be5013 (and before this, for NameConflict, and for a status whose desired weights
    a pause had left empty: `recorded` None) the rule kept half its traffic on a Service without
    endpoints."""
    run = gateway_run()
    route = user_route(render.backend_refs(OWNER, Weights(50, 50)))
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}, routes={"chat": route})
    fake.install(monkeypatch)
    traffic = api.TrafficStatus(route="chat", desired=recorded)
    run.status = run.status.model_copy(update={"traffic": traffic})
    raw = failing(cause, run, fake)
    failed = handlers_step(raw, run)
    assert (failed.status.phase, failed.status.reason) == (Phase.FAILED, cause)
    assert not [call for call in fake.calls if call[0] in ("patch route", "apply", "scale")]
    run.status = failed.status
    fake.tracks["llama-canary"] = TrackState(exists=True, replicas=1, ready_replicas=0)
    handlers_step(raw, run)
    refs = fake.routes["chat"]["spec"]["rules"][1]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [("llama-baseline", 100), ("llama-canary", 0)]
    fake.tracks["llama-canary"], fake.calls = ready(1), []
    handlers_step(raw, run)
    assert not [call for call in fake.calls if call[0] == "patch route"]  # never back toward it


def test_failed_without_a_phase_to_resume_never_moves_weight_toward_a_track() -> None:
    """Failed with no phase to resume (a status an older operator wrote), the spec valid again:
    decide() holds the pods and the route (on 1be5013 it set the load-matched 50/50, moving half
    the rule's traffic to the canary of a rollout that was not running)."""
    spec = make_spec(traffic=OWNED)
    run = Run(spec)
    run.status = api.SpeculativeDeploymentStatus(
        phase=Phase.FAILED,
        phase_since="2026-11-22T12:00:00Z",
        template_hash=render.template_hash(spec),
        observed_generation=1,
    )
    d = run.step(baseline=ready(1), canary=ready(1), route=routed(Weights(100, 0)))
    run.expect(Phase.FAILED)
    assert (d.baseline_replicas, d.canary_replicas, d.route_weights) == (1, 1, Weights(100, 0))
    lost = run.step(
        baseline=TrackState(exists=True, replicas=1), canary=ready(1), route=routed(Weights(100, 0))
    )
    assert lost.route_weights == Weights(0, 100)


# --- sequence 2 while Paused: the owned route is put back, only toward Ready pods ---


def test_the_owned_route_deleted_while_paused_is_put_back_toward_ready_pods_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paused in Analyzing at 50/50, someone deletes the owned route: it is applied again at the
    weights specgate last set (on 1be5013 it stayed deleted while paused: the gateway answered 404);
    deleted again while the canary's pod is NotReady, it comes back without the canary's share;
    with no Ready pod on either track it is not made. The pause holds throughout: no replica moves,
    and unpausing resumes the analysis, not a new rollout."""
    run = gateway_run()
    template = run.spec.rollout.traffic
    assert template is not None and template.http_route is not None
    half = accepted(render.http_route(OWNER, template.http_route, Weights(50, 50)))
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}, routes={"llama": half})
    fake.install(monkeypatch)
    recorded = api.TrafficStatus(route="llama", desired=api.RouteWeights(baseline=50, canary=50))
    run.status = run.status.model_copy(update={"traffic": recorded})
    edit(run, paused=True)

    def reconcile(after: float) -> tuple[list[list[int]], list[str]]:
        """One reconcile while paused: the route's weights written, and the Events' reasons."""
        fake.calls = []
        decision = reconcile_step(run, after=after)
        run.status = decision.status
        assert (run.status.phase, run.status.resume_phase) == (Phase.PAUSED, Phase.ANALYZING)
        assert {call[2] for call in fake.calls if call[0] == "scale"} <= {1}  # replicas as they are
        routes = [call[3]["rules"][0]["backendRefs"] for call in fake.calls if call[1] == "HTTPRoute"]
        return [[ref["weight"] for ref in refs] for refs in routes], [e.reason for e in decision.events]

    assert reconcile(10)[0] == []  # as set: nothing written
    del fake.routes["llama"]
    assert reconcile(20) == ([[50, 50]], [Reason.ROUTE_REPAIRED])
    fake.tracks["llama-canary"] = TrackState(exists=True, replicas=1, ready_replicas=0)
    assert reconcile(30)[0] == [[100, 0]]  # still deleted, now without the canary's share
    fake.tracks["llama-baseline"] = TrackState(exists=True, replicas=1, ready_replicas=0)
    assert reconcile(40)[0] == []  # no Ready pod on either track: no route made for them
    fake.tracks = {"llama-baseline": ready(1), "llama-canary": ready(1)}
    fake.routes["llama"] = accepted(render.http_route(OWNER, template.http_route, Weights(100, 0)))
    edit(run, paused=False)
    resumed = reconcile_step(run, after=50)
    assert resumed.status.phase == Phase.ANALYZING  # not Baseline: the rollout goes on where it was
    assert [h.reason for h in resumed.status.history[-2:]] == [Reason.PAUSED, Reason.RESUMED]


def test_while_the_gateway_has_not_accepted_the_rule_no_track_rolls_as_if_it_carried_nothing() -> None:
    """The day-2 fuzz with routes (issue 61, seed 475): replicas 2, maxSurge 0, maxUnavailable 1,
    Promoting at 50/50 after an operator upgrade; specgate wrote 0/100 and its Gateway had not
    accepted it yet, so the baseline's re-render (its weight 0 as written) rolled its only pod away
    while the Gateway still sent it half. Until the Gateways accept the rule's spec, what they
    accepted before may still serve: every track is judged as carrying all of it."""
    b, c = render.Track.BASELINE, render.Track.CANARY
    spec = make_spec(maxSurge=0, maxUnavailable=1)
    decision = rollout.Decision(api.SpeculativeDeploymentStatus(), 1, 1, route_weights=Weights(0, 100))
    pending = RouteState(hold="parent Gateway inference: Accepted not yet reported", written=Weights(0, 100))
    states = {
        t: replace(ready(1), template_hash=render.template_hash(spec, t), rendered="before the upgrade")
        for t in (b, c)
    }
    rendered = {b: "after the upgrade", c: "after the upgrade"}

    def waiting(route: RouteState) -> frozenset[render.Track]:
        observation = Observation(generation=1, baseline=states[b], canary=states[c], route=route)
        routed = handlers._routed(decision, observation)
        return rollout.templates_to_wait(spec, rendered, states, {b: 1, c: 1}, routed)

    assert waiting(pending) == {b, c}
    assert waiting(RouteState(weights=Weights(0, 100))) == {c}  # accepted: the baseline carries nothing
