"""traffic.router GatewayAPI through decide() and handlers.step: the route's weights follow the Ready
pods, pods wait for the weights, and the analysis waits for the route's Gateways (issue 41)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from tests.unit.handler_fakes import FakeKube, reconcile_step
from tests.unit.rollout_driver import Run, edit, make_spec, metrics, ready, spec_body

from specgate import api, render, rollout
from specgate.api import Phase
from specgate.cli import render_timeline
from specgate.observation import Observation, RouteState, TrackState
from specgate.rollout import Decision, Event, Reason
from specgate.traffic import Weights

OWNED = {"router": "GatewayAPI", "httpRoute": {"parentRefs": [{"name": "inference", "namespace": "gw"}]}}
EXISTING = {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleName": "completions"}}
HALF = RouteState(weights=Weights(50, 50))
# A route its Gateway refuses still has its spec: the rule routes the tracks at 50/50 (issue 57).
NOT_ACCEPTED = RouteState(
    hold="parent Gateway inference: Accepted is False (NotAllowedByListeners: )", written=Weights(50, 50)
)


def gateway_run() -> Run:
    """A GatewayAPI rollout of 2 replicas in Analyzing (1 + 1 Ready), its route accepted at 50/50."""
    run = Run(make_spec(traffic=OWNED))
    run.step(baseline=ready(2), route=RouteState(weights=Weights(100, 0)))
    run.step(baseline=ready(2), route=RouteState(weights=Weights(100, 0)))
    run.step(
        after=95, baseline=ready(2), baseline_metrics=metrics(), route=RouteState(weights=Weights(100, 0))
    )
    run.expect(Phase.CANARY)
    run.step(baseline=ready(1), canary=ready(1), route=HALF)
    run.expect(Phase.ANALYZING)
    run.now += timedelta(seconds=30)  # the canary's warm-up
    return run


def four_baseline_pods_measured(run: Run, route: RouteState) -> None:
    """A 4-replica baseline Ready and measured on `route`: the rollout moves to Canary."""
    run.step(baseline=ready(4), route=route)
    run.step(baseline=ready(4), route=route)
    run.step(after=95, baseline=ready(4), baseline_metrics=metrics(), route=route)
    run.expect(Phase.CANARY)


def test_the_analysis_waits_for_the_gateway_and_starts_its_window_when_it_accepts() -> None:
    """Gates that would pass do not promote while the route is not accepted: the analysis window
    starts over from the moment the Gateways route as specgate set, with the reason in status; the
    phase keeps its start, so its deadlines still run (issue 57)."""
    run = gateway_run()
    entered = run.status.phase_since
    passing = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    decision = run.step(after=100, baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED, **passing)
    run.expect(Phase.ANALYZING)
    assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED
    assert "the analysis waits for the HTTPRoute: parent Gateway inference: Accepted is False" in (
        run.status.message or ""
    )
    assert run.status.analysis_since == run.now.isoformat().replace("+00:00", "Z")
    assert run.status.phase_since == entered
    assert [e.reason for e in decision.events] == [Reason.ROUTE_NOT_ACCEPTED]
    run.step(after=30, baseline=ready(1), canary=ready(1), route=HALF, **passing)
    run.expect(Phase.ANALYZING)  # 30 s of the 60 s analysis window since the route was accepted
    run.step(after=40, baseline=ready(1), canary=ready(1), route=HALF, **passing)
    run.expect(Phase.PROMOTING)


def test_a_rule_without_the_tracks_services_holds_the_analysis() -> None:
    run = gateway_run()
    run.step(after=100, baseline=ready(1), canary=ready(1), route=RouteState(), baseline_metrics=metrics())
    assert (run.phase, run.status.reason) == (Phase.ANALYZING, Reason.ROUTE_NOT_ACCEPTED)
    assert "does not send traffic to the baseline's and the canary's Services" in (run.status.message or "")


def test_weights_follow_the_ready_pods_and_the_baseline_shrinks_only_once_the_route_moved() -> None:
    """Promotion: the canary grows within maxSurge at 50/50; once both canary pods are Ready the
    weights go to 0/100, and the baseline's pod stays until its Gateways accepted them."""
    run = gateway_run()
    run.step(after=70, baseline=ready(1), canary=ready(1), route=HALF, **{
        "baseline_metrics": metrics(), "canary_metrics": metrics(0.8)})  # fmt: skip
    run.expect(Phase.PROMOTING)
    grown = run.step(baseline=ready(1), canary=ready(1), route=HALF)
    assert (grown.baseline_replicas, grown.canary_replicas, grown.route_weights) == (1, 2, Weights(50, 50))
    held = run.step(baseline=ready(1), canary=ready(2), route=HALF)
    run.expect(Phase.PROMOTED)
    assert (held.baseline_replicas, held.canary_replicas, held.route_weights) == (1, 2, Weights(0, 100))
    still = run.step(baseline=ready(1), canary=ready(2), route=NOT_ACCEPTED)
    assert still.baseline_replicas == 1  # unknown weights: the baseline may still carry its half
    accepted = RouteState(weights=Weights(0, 100))
    moved = run.step(baseline=ready(1), canary=ready(2), route=accepted)
    assert moved.baseline_replicas == 1  # accepted just now: the gateway may still route its half
    assert run.status.traffic is not None and run.status.traffic.actual_since == api.iso(run.now)
    early = run.step(after=29, baseline=ready(1), canary=ready(2), route=accepted)
    assert early.baseline_replicas == 1  # scaleDownDelay 30s
    gone = run.step(after=1, baseline=ready(1), canary=ready(2), route=accepted)
    assert (gone.baseline_replicas, gone.canary_replicas, gone.route_weights) == (0, 2, Weights(0, 100))


def test_with_scale_down_delay_0s_the_baseline_goes_once_the_route_is_accepted() -> None:
    run = gateway_run()
    run.spec = make_spec(traffic={**OWNED, "scaleDownDelay": "0s"})
    passing = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=HALF, **passing)
    run.step(baseline=ready(1), canary=ready(1), route=HALF)
    run.step(baseline=ready(1), canary=ready(2), route=HALF)
    run.expect(Phase.PROMOTED)
    gone = run.step(baseline=ready(1), canary=ready(2), route=RouteState(weights=Weights(0, 100)))
    assert (gone.baseline_replicas, gone.canary_replicas) == (0, 2)


def test_a_rollback_moves_the_weight_to_the_baseline_before_the_canary_goes() -> None:
    """The baseline grows back at once; the canary's pod stays until the Gateways accepted 100/0,
    even once the phase is RolledBack, and the reason the rollback was for stays its reason."""
    run = gateway_run()
    low = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.2)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=HALF, **low)
    run.expect(Phase.ROLLING_BACK)
    held = run.step(baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED)
    assert (held.baseline_replicas, held.canary_replicas, held.route_weights) == (2, 1, Weights(50, 50))
    assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED
    assert "the canary's scale-down waits for the HTTPRoute" in (run.status.message or "")
    grown = run.step(baseline=ready(2), canary=ready(1), route=HALF)
    run.expect(Phase.ROLLED_BACK)
    assert run.status.reason == Reason.ACCEPTANCE_BELOW_GATE
    assert (grown.baseline_replicas, grown.canary_replicas, grown.route_weights) == (2, 1, Weights(100, 0))
    back = RouteState(weights=Weights(100, 0))
    accepted = run.step(baseline=ready(2), canary=ready(1), route=back)
    assert (accepted.baseline_replicas, accepted.canary_replicas) == (2, 1)  # for scaleDownDelay
    done = run.step(after=30, baseline=ready(2), canary=ready(1), route=back)
    assert (done.baseline_replicas, done.canary_replicas) == (2, 0)


# --- handlers.step: the route read, written and reported ---


def accepted(route: dict[str, Any], parent: str = "inference", namespace: str = "gw") -> dict[str, Any]:
    """The route as the API server returns it once its Gateway accepted it."""
    generation = 3
    conditions = [
        {"type": kind, "status": "True", "reason": kind, "observedGeneration": generation}
        for kind in ("Accepted", "ResolvedRefs")
    ]
    return {
        **route,
        "metadata": {**route["metadata"], "generation": generation, "resourceVersion": "77"},
        "status": {
            "parents": [{"parentRef": {"name": parent, "namespace": namespace}, "conditions": conditions}]
        },
    }


def test_without_the_gateway_api_crds_nothing_is_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run(make_spec(traffic=OWNED))
    fake = FakeKube(http_route_crd=False).install(monkeypatch)
    status = reconcile_step(run, after=0).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.GATEWAY_API_CRD_MISSING)
    assert "spec.rollout.traffic.router is GatewayAPI" in (status.message or "")
    assert fake.calls == []


def test_the_owned_route_is_applied_with_the_weights_and_reported_in_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Run(make_spec(traffic=OWNED))
    fake = FakeKube({"llama-baseline": ready(2)}).install(monkeypatch)
    decision = reconcile_step(run, after=0)
    applied = {call[2]: call for call in fake.calls if call[0] == "apply"}
    assert {"llama", "llama-baseline", "llama-canary"} <= set(applied)  # the route and the tracks' Services
    route = applied["llama"][3]
    assert route["parentRefs"] == [{"name": "inference", "namespace": "gw"}]
    assert [(b["name"], b["weight"]) for b in route["rules"][0]["backendRefs"]] == [
        ("llama-baseline", 2),  # the Ready pods: Gateway API weights are relative (issue 57)
        ("llama-canary", 0),
    ]
    traffic = decision.status.traffic
    assert traffic is not None and traffic.route == "llama"
    assert traffic.desired is not None and (traffic.desired.baseline, traffic.desired.canary) == (100, 0)
    assert traffic.actual is None  # not read back from an accepted route yet
    run.spec, run.status = make_spec(), decision.status  # the router back to Service: no route in status
    assert reconcile_step(run, after=10).status.traffic is None


def user_route(backends: list[dict[str, Any]]) -> dict[str, Any]:
    return accepted(
        {
            "apiVersion": render.GATEWAY_API_VERSION,
            "kind": "HTTPRoute",
            "metadata": {"name": "chat", "namespace": "ml"},
            "spec": {
                "parentRefs": [{"name": "inference", "namespace": "gw"}],
                "rules": [
                    {"name": "health", "backendRefs": [{"name": "probe", "port": 80}]},
                    {"name": "completions", "backendRefs": backends},
                ],
            },
        }
    )


def test_the_users_rule_is_patched_only_where_its_weights_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The other rule is never touched; the patch tests the rule's name, so a route whose rules
    moved since it was read is refused by the API server rather than another rule changed."""
    run = Run(make_spec(traffic=EXISTING))
    fake = FakeKube(
        {"llama-baseline": ready(2)}, routes={"chat": user_route([{"name": "vllm", "port": 8000}])}
    )
    fake.install(monkeypatch)
    status = reconcile_step(run, after=0).status
    patches = [call for call in fake.calls if call[0] == "patch route"]
    assert len(patches) == 1
    _, name, operations = patches[0]
    assert name == "chat"
    assert operations[0] == {"op": "test", "path": "/spec/rules/1/name", "value": "completions"}
    assert operations[1]["path"] == "/spec/rules/1/backendRefs"
    assert [(b["name"], b["weight"]) for b in operations[1]["value"]] == [
        ("llama-baseline", 2),  # the Ready pods: Gateway API weights are relative (issue 57)
        ("llama-canary", 0),
    ]
    assert not any(call[0] == "apply" and call[1] == "HTTPRoute" for call in fake.calls)
    assert status.traffic is not None and status.traffic.actual is None  # the rule had other backends
    ours = [{"kind": "Service", "name": "llama-baseline", "port": 8000, "weight": 100},
            {"kind": "Service", "name": "llama-canary", "port": 8000, "weight": 0}]  # fmt: skip
    fake.routes["chat"], fake.calls = user_route(ours), []
    run.status = status
    status = reconcile_step(run, after=10).status
    assert not [call for call in fake.calls if call[0] == "patch route"]
    assert status.traffic is not None and status.traffic.actual is not None
    assert (status.traffic.actual.baseline, status.traffic.actual.canary) == (100, 0)


def test_a_rule_that_is_not_there_is_named_in_status_and_nothing_is_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    route = {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleName": "chat-v2"}}
    run = Run(make_spec(traffic=route))
    fake = FakeKube({"llama-baseline": ready(2)}, routes={"chat": user_route([])}).install(monkeypatch)
    reconcile_step(run, after=0)
    assert not [call for call in fake.calls if call[0] == "patch route"]


def initial_step_run(weight: int = 10, **rollout: Any) -> Run:
    """A GatewayAPI rollout of 4 replicas and 1 canary pod at traffic.initialCanaryWeight `weight`,
    in Analyzing with the route accepted at what it asked for."""
    body = spec_body(traffic={**OWNED, "initialCanaryWeight": weight}, **rollout)
    run = Run(api.parse_spec({**body, "replicas": 4}))
    plain = RouteState(weights=Weights(100, 0))
    run.step(baseline=ready(4), route=plain)
    run.step(baseline=ready(4), route=plain)
    entered = run.step(after=95, baseline=ready(4), baseline_metrics=metrics(), route=plain)
    run.expect(Phase.CANARY)
    assert (entered.baseline_replicas, entered.canary_replicas) == (4, 1)  # the canary surges
    analysing = run.step(baseline=ready(4), canary=ready(1), route=plain)
    run.expect(Phase.ANALYZING)
    assert analysing.route_weights == Weights(100 - weight, weight)
    run.now += timedelta(seconds=30)  # the canary's warm-up
    return run


def test_the_initial_step_judges_alpha_alone_then_latency_at_the_load_matched_weight() -> None:
    """At 10 % the canary's latency is not judged (its per-pod load is not the baseline's); once
    alpha passed, the weight goes to 25/75 before the baseline gives up a pod, the analysis waits
    for the Gateways to route it, and there the slower canary is rolled back for its latency."""
    run = initial_step_run()
    at_10 = RouteState(weights=Weights(90, 10))
    slow = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8, per_token=0.09)}
    run.step(after=70, baseline=ready(4), canary=ready(1), route=at_10, **slow)
    run.expect(Phase.ANALYZING)
    assert run.status.reason == Reason.INITIAL_STEP_PASSED, run.status.message
    assert run.status.initial_step_passed is not None
    moving = run.step(baseline=ready(4), canary=ready(1), route=at_10, **slow)
    assert (moving.baseline_replicas, moving.canary_replicas, moving.route_weights) == (4, 1, Weights(75, 25))
    assert run.status.reason == Reason.ROUTE_NOT_ACCEPTED
    assert "still give the canary its initial weight 10%, not 25%" in (run.status.message or "")
    back = run.step(baseline=ready(4), canary=ready(1), route=RouteState(weights=Weights(75, 25)), **slow)
    run.expect(Phase.ROLLED_BACK)  # the baseline had not given up its pod yet
    assert run.status.reason == Reason.LATENCY_REGRESSION
    assert (back.baseline_replicas, back.canary_replicas, back.route_weights) == (4, 1, Weights(100, 0))


def test_a_good_canary_passes_both_parts_and_promotes() -> None:
    run = initial_step_run()
    good = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    run.step(after=70, baseline=ready(4), canary=ready(1), route=RouteState(weights=Weights(90, 10)), **good)
    assert run.status.reason == Reason.INITIAL_STEP_PASSED
    at_25 = RouteState(weights=Weights(75, 25))
    shrunk = run.step(baseline=ready(4), canary=ready(1), route=at_25, **good)
    assert (shrunk.baseline_replicas, shrunk.canary_replicas) == (3, 1)  # once the route moved
    run.step(after=30, baseline=ready(3), canary=ready(1), route=at_25, **good)
    run.expect(Phase.ANALYZING)  # 40 s of the 60 s analysis window at 25 %
    run.step(after=30, baseline=ready(3), canary=ready(1), route=at_25, **good)
    run.expect(Phase.PROMOTING)


def test_alpha_below_the_gate_at_the_initial_weight_rolls_back_there() -> None:
    run = initial_step_run()
    low = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.2)}
    rolled = run.step(
        after=70, baseline=ready(4), canary=ready(1), route=RouteState(weights=Weights(90, 10)), **low
    )
    run.expect(Phase.ROLLED_BACK)  # the baseline kept its 4 pods beside the canary
    assert run.status.reason == Reason.ACCEPTANCE_BELOW_GATE
    assert (run.status.message or "").startswith("at the initial canary weight 10%: ")
    assert (rolled.canary_replicas, rolled.route_weights) == (1, Weights(100, 0))


def test_without_spare_pods_the_capacity_floor_bounds_the_initial_weight() -> None:
    """maxSurge 0: the canary's 2 pods replace baseline pods, and the 2 left may carry no more than
    the floor's 3 pods would (66 %): the canary gets 34 %, not 10 %."""
    body = spec_body(
        traffic={**OWNED, "initialCanaryWeight": 10}, maxSurge=0, maxUnavailable=1, canaryReplicas=2
    )
    run = Run(api.parse_spec({**body, "replicas": 4}))
    plain = RouteState(weights=Weights(100, 0))
    four_baseline_pods_measured(run, plain)
    analysing = run.step(baseline=ready(2), canary=ready(2), route=plain)
    run.expect(Phase.ANALYZING)
    assert analysing.route_weights == Weights(66, 34)


def test_kubectl_specgate_status_shows_the_routes_weights_and_the_initial_step() -> None:
    status = api.SpeculativeDeploymentStatus(
        traffic=api.TrafficStatus(route="chat", desired=api.RouteWeights(baseline=75, canary=25)),
        initial_step_passed="2026-11-27T21:00:00Z",
    )
    lines = render_timeline("llama", status).splitlines()
    assert (
        "  route    HTTPRoute chat baseline/canary: desired 75/25, accepted -; alpha passed at the "
        "initial weight at 2026-11-27T21:00:00Z"
    ) in lines
    assert not [
        x for x in render_timeline("llama", api.SpeculativeDeploymentStatus()).splitlines() if "route" in x
    ]


def test_a_rollback_held_by_the_route_says_what_waits_and_warns_once() -> None:
    """The canary's pod stays while the Gateways have not accepted the baseline's weight: status
    names what waits and why, with one Warning Event (a route that is not accepted needs a person),
    not one per look."""
    run = gateway_run()
    low = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.2)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=HALF, **low)
    run.expect(Phase.ROLLING_BACK)
    held = run.step(baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED)
    message = (
        "the canary's scale-down waits for the HTTPRoute: "
        "parent Gateway inference: Accepted is False (NotAllowedByListeners: )"
    )
    assert (run.status.reason, run.status.message) == (Reason.ROUTE_NOT_ACCEPTED, message)
    assert held.events == (Event("Warning", Reason.ROUTE_NOT_ACCEPTED, message),)
    again = run.step(baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED)
    assert again.events == ()


def test_alpha_passed_at_the_initial_weight_says_so_and_what_comes_next() -> None:
    """Alpha passes at the 10 % initial weight: status and its Event say at which weight, with the
    acceptance figures, and that alpha and latency are analysed next at the load-matched weight."""
    run = initial_step_run()
    good = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    d = run.step(
        after=70, baseline=ready(4), canary=ready(1), route=RouteState(weights=Weights(90, 10)), **good
    )
    message = run.status.message or ""
    assert run.status.reason == Reason.INITIAL_STEP_PASSED
    assert message.startswith("alpha passed at the initial canary weight 10% (alpha ")
    assert message.endswith(
        "); the canary now gets its load-matched weight, where alpha and latency are analysed"
    )
    assert [(e.type, e.reason, e.message) for e in d.events] == [
        ("Normal", Reason.INITIAL_STEP_PASSED, message)
    ]


# --- what waits for the route, and what status says of it (mutation testing, issue 42) ---


def test_an_unread_route_holds_the_analysis_saying_so() -> None:
    """The HTTPRoute could not be read this reconcile: the analysis does not start, and status says
    why (an unknown route is not one that routes as specgate set); nothing is written to a route
    not known to route the tracks while the baseline alone cannot carry it (issue 57)."""
    run = gateway_run()
    d = run.step(after=100, baseline=ready(1), canary=ready(1), baseline_metrics=metrics())
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.ANALYZING,
        Reason.ROUTE_NOT_ACCEPTED,
        "the analysis waits for the HTTPRoute: the HTTPRoute has not been read",
    )
    assert (d.baseline_replicas, d.canary_replicas, d.route_weights) == (1, 1, None)


def test_a_rule_without_the_tracks_services_says_exactly_what_is_missing() -> None:
    run = gateway_run()
    run.step(after=100, baseline=ready(1), canary=ready(1), route=RouteState(), baseline_metrics=metrics())
    assert run.status.message == (
        "the analysis waits for the HTTPRoute: the HTTPRoute's rule does not send traffic to the "
        "baseline's and the canary's Services yet"
    )


def test_the_service_router_sets_no_route_weights() -> None:
    """traffic.router Service (the default): the replica ratio splits traffic; no route is written."""
    run = Run()
    run.to_analyzing()
    assert run.last is not None and run.last.route_weights is None


def test_promotion_held_by_the_route_says_the_baselines_scale_down_waits() -> None:
    """Promoting while the Gateways have not accepted the weights: the baseline's pod stays, and
    status and one Warning Event say that its scale-down waits for the HTTPRoute, and why."""
    run = gateway_run()
    passing = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    run.step(after=70, baseline=ready(1), canary=ready(1), route=HALF, **passing)
    run.expect(Phase.PROMOTING)
    growing = TrackState(exists=True, replicas=2, ready_replicas=1)
    d = run.step(baseline=ready(1), canary=growing, route=NOT_ACCEPTED)
    message = (
        "the baseline's scale-down waits for the HTTPRoute: "
        "parent Gateway inference: Accepted is False (NotAllowedByListeners: )"
    )
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.PROMOTING,
        Reason.ROUTE_NOT_ACCEPTED,
        message,
    )
    assert d.events == (Event("Warning", Reason.ROUTE_NOT_ACCEPTED, message),)
    assert d.baseline_replicas == 1


def test_a_new_rollout_begins_with_its_own_initial_step() -> None:
    """Alpha passed at the initial weight in the last rollout; a new draft length must pass it again
    at 10 % before its canary gets its load-matched weight."""
    run = initial_step_run()
    good = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    run.step(after=70, baseline=ready(4), canary=ready(1), route=RouteState(weights=Weights(90, 10)), **good)
    assert run.status.initial_step_passed is not None
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    run.step(baseline=ready(4), canary=ready(1), route=RouteState(weights=Weights(90, 10)))
    run.expect(Phase.BASELINE)
    assert run.status.initial_step_passed is None


def test_at_the_initial_weight_the_baseline_beside_the_canary_stays_within_max_surge() -> None:
    """4 replicas, 2 canary pods, maxSurge 1: beside them the baseline keeps 3 pods (4 + 1 - 2), not
    all 4; at 3 Ready baseline pods the capacity floor (4) bounds the canary's weight to 25 %."""
    body = spec_body(traffic={**OWNED, "initialCanaryWeight": 10}, canaryReplicas=2)
    run = Run(api.parse_spec({**body, "replicas": 4}))
    plain = RouteState(weights=Weights(100, 0))
    four_baseline_pods_measured(run, plain)
    run.step(baseline=ready(4), canary=ready(2), route=plain)
    run.expect(Phase.ANALYZING)
    d = run.step(baseline=ready(4), canary=ready(2), route=RouteState(weights=Weights(75, 25)))
    assert (d.baseline_replicas, d.canary_replicas, d.route_weights) == (3, 2, Weights(75, 25))


def test_status_traffic_has_no_accepted_weights_where_the_route_was_not_read() -> None:
    run = gateway_run()
    decision = run.step(baseline=ready(1), canary=ready(1), route=NOT_ACCEPTED)
    traffic = rollout.traffic_status("llama", decision, Observation(generation=1), None, None, run.now)
    assert traffic == api.TrafficStatus(
        route="llama", desired=api.RouteWeights(baseline=50, canary=50), actual=None, original=None
    )


def to_canary_behind_the_route() -> tuple[Run, Decision]:
    """A GatewayAPI rollout of 2 replicas entering Canary (its Deployment not created yet)."""
    run = Run(make_spec(traffic=OWNED))
    plain = RouteState(weights=Weights(100, 0))
    run.step(baseline=ready(2), route=plain)
    run.step(baseline=ready(2), route=plain)
    entered = run.step(after=95, baseline=ready(2), baseline_metrics=metrics(), route=plain)
    run.expect(Phase.CANARY)
    return run, entered


def test_a_canary_without_a_deployment_gets_no_weight() -> None:
    """Canary begins: the canary's Deployment does not exist yet, so no pod of it can serve, and
    the route keeps all traffic on the baseline."""
    _, entered = to_canary_behind_the_route()
    assert (entered.baseline_replicas, entered.canary_replicas, entered.route_weights) == (
        2,
        1,
        Weights(100, 0),
    )


def test_a_rollback_asks_for_no_canary_pod_where_the_canary_has_no_deployment() -> None:
    """The canary's Deployment never came (rejected, or deleted by a person): past progressDeadline
    the rollout rolls back, and while the route cannot be read it still asks for no canary pod."""
    run, _ = to_canary_behind_the_route()
    half = TrackState(exists=True, replicas=2, ready_replicas=1)
    run.step(after=301, baseline=half, canary=TrackState(), route=RouteState(weights=Weights(100, 0)))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.CANARY_UNHEALTHY)
    d = run.step(baseline=half, canary=TrackState())
    assert (d.baseline_replicas, d.canary_replicas) == (2, 0)
