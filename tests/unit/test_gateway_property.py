"""Generated route histories through the real decide() (issue 57): pods going NotReady on either track
in every phase, a Gateway that accepts late or never, a route edited or deleted by someone, pauses.
Every tick the decision must hold the route's invariants:
- no weight on a track without Ready pods (of the pods it keeps after the tick's step);
- a rule that does not route the tracks yet is written only once the baseline carries all of it;
- a user's rule taken over by the tracks' InferencePools moves its weight only from the staged rule
  (its own backends at full weight, the pools at 0) that its Gateways accepted with both pools;
- in Canary and Analyzing the canary is at most its cap, unless the floor forces more;
- every hold has a deadline: Analyzing never outlives maxAnalysisDuration, a hold never
  progressDeadline, each by more than a tick; and no promotion from a tick whose route was not
  accepted at the weights specgate set.

SPECGATE_ROUTE_HISTORIES sets the number of histories (default 300, about 10 s; thousands for a fuzz run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.rollout_driver import Run, metrics, spec_body

from specgate import api, rollout
from specgate.api import Phase
from specgate.capacity import Budget
from specgate.observation import RouteState, TrackState
from specgate.traffic import Weights, capped, shares

OWNED = {"router": "GatewayAPI", "httpRoute": {"parentRefs": [{"name": "inference", "namespace": "gw"}]}}
EXISTING = {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleName": "completions"}}
PICKERS = {"baseline": {"name": "epp", "port": 9002}, "canary": {"name": "canary-epp", "port": 9002}}
EXISTING_POOLS = {**EXISTING, "backend": "InferencePool", "inferencePool": {"endpointPicker": PICKERS}}
HISTORIES = int(os.environ.get("SPECGATE_ROUTE_HISTORIES", "300"))
TICK = 10.0
ROUTE_KINDS = ("accepted", "accepted", "accepted", "pending", "edited", "gone")


@dataclass(frozen=True)
class Tick:
    baseline_lost: int  # Ready pods the baseline is short of this tick
    canary_lost: int
    route: str  # one of ROUTE_KINDS: what the Gateway and people did to the route
    edited_canary: int  # the canary's percent someone wrote by hand ("edited")
    pause: bool  # flip spec.rollout.paused


ticks = st.builds(
    Tick,
    baseline_lost=st.sampled_from((0, 0, 0, 0, 1, 2, 9)),
    canary_lost=st.sampled_from((0, 0, 0, 0, 1, 9)),
    route=st.sampled_from(ROUTE_KINDS),
    edited_canary=st.integers(0, 100),
    pause=st.sampled_from((False,) * 19 + (True,)),
)
specs = st.fixed_dictionaries(
    {
        "replicas": st.integers(1, 4),
        "maxSurge": st.integers(0, 1),
        "maxUnavailable": st.integers(0, 1),
        "traffic": st.sampled_from(
            (
                OWNED,
                EXISTING,
                EXISTING_POOLS,
                {**OWNED, "initialCanaryWeight": 5},
                {**OWNED, "maxCanaryWeight": 10},
            )
        ),
    }
)


def spec_of(drawn: dict[str, Any]) -> api.SpeculativeDeploymentSpec:
    surge = 1 if drawn["maxUnavailable"] == 0 else drawn["maxSurge"]  # one of them moves pods
    body = spec_body(traffic=drawn["traffic"], maxSurge=surge, maxUnavailable=drawn["maxUnavailable"])
    return api.parse_spec({**body, "replicas": drawn["replicas"]})


class Cluster:
    """Deployments that get the replicas asked for (new pods Ready at the next tick unless lost) and
    a route whose spec holds what specgate last wrote, accepted by its Gateway as the tick says."""

    def __init__(self, spec: api.SpeculativeDeploymentSpec, existing: bool) -> None:
        self.replicas: list[int | None] = [spec.replicas, None]
        self.written: Weights | None = None  # the rule's weights as its spec has them (None: not ours)
        self.existing = existing
        self.staged = False  # the user's rule staged for the tracks' pools (its own backends carry all)

    def tracks(self, tick: Tick) -> tuple[TrackState, TrackState]:
        states = []
        for replicas, lost in zip(self.replicas, (tick.baseline_lost, tick.canary_lost), strict=True):
            if replicas is None:
                states.append(TrackState())
            else:
                states.append(
                    TrackState(exists=True, replicas=replicas, ready_replicas=max(replicas - lost, 0))
                )
        return states[0], states[1]

    def route(self, tick: Tick) -> RouteState:
        if tick.route == "gone":  # deleted (owned), or reset to the user's own backends (existingRoute)
            self.written, self.staged = None, False
        if tick.route == "edited" and self.written is not None:
            self.written = Weights(100 - tick.edited_canary, tick.edited_canary)
        if self.written is None and self.staged:  # the pools' Gateways accept as the tick says
            return RouteState(
                hold="InferencePool x: pending" if tick.route == "pending" else None, staged=True
            )
        if self.written is None:
            return RouteState(hold=None if self.existing else "HTTPRoute llama does not exist yet")
        if tick.route == "pending":
            return RouteState(hold="parent Gateway inference: Accepted is False (x: )", written=self.written)
        return RouteState(weights=self.written)

    def apply(self, decision: rollout.Decision) -> None:
        self.replicas = [decision.baseline_replicas, decision.canary_replicas]
        if decision.route_weights is not None:
            self.written, self.staged = decision.route_weights, False
        elif decision.stage_rule and self.written is None:
            self.staged = True


def check(
    run: Run,
    before: api.SpeculativeDeploymentStatus,
    tracks: tuple[TrackState, TrackState],
    route: RouteState,
) -> list[str]:
    """The invariants on the decision just taken (run.last)."""
    decision = run.last
    assert decision is not None
    spec, status, problems = run.spec, decision.status, []
    budget = Budget(spec.replicas, spec.rollout.max_surge, spec.rollout.max_unavailable)
    kept = (decision.baseline_replicas, decision.canary_replicas or 0)
    ready = [min(t.ready_replicas if t.exists else 0, n) for t, n in zip(tracks, kept, strict=True)]
    weights = decision.route_weights
    carried = weights if weights is not None else route.in_spec  # what the rule routes after the tick
    if carried is not None and sum(ready) > 0:
        for name, weight, pods in zip(("baseline", "canary"), carried.pair, ready, strict=True):
            if weight > 0 and pods == 0:
                problems.append(f"{weight}% on the {name}, which keeps no Ready pod")
    if weights is not None:
        # A rule taken over goes to Ready pods that carry all its traffic: the baseline's before
        # promotion, the canary's once Promoted. (Held, Paused or Failed, an owned route someone
        # deleted comes back with its last weights on whatever is Ready: checked above.)
        behind = sum(t.ready_replicas for t, w in zip(tracks, weights.pair, strict=True) if w > 0)
        held = status.phase in (Phase.PAUSED, Phase.FAILED)
        if not route.routes_tracks and not held and behind < max(budget.min_ready, 1):
            problems.append(f"took the rule over at {weights.pair} with {behind} Ready pods behind it")
        pools = (
            spec.rollout.traffic is not None and spec.rollout.traffic.backend == api.Backend.INFERENCE_POOL
        )
        if pools and not route.routes_tracks and not (route.staged and route.hold is None):
            problems.append(
                f"moved the rule to the pools at {weights.pair} before they were staged and accepted"
            )
    if decision.stage_rule and (weights is not None or route.routes_tracks):
        problems.append("staged a rule that routes the tracks")
        if status.phase in (Phase.CANARY, Phase.ANALYZING) and before.phase == status.phase:
            cap = rollout.max_canary_weight(spec)
            floor_forced = capped(shares(*ready) or Weights(100, 0), cap, ready[0], budget).canary
            if weights.canary > max(cap, floor_forced):
                problems.append(f"canary at {weights.canary}% above its cap {cap}%")
    since = api.parse_time(status.phase_since)
    if status.phase == Phase.ANALYZING and since is not None:
        most = api.parse_duration(spec.rollout.max_analysis_duration) + TICK
        if (run.now - since).total_seconds() > most:
            problems.append(f"Analyzing for {(run.now - since).total_seconds()} s")
    held = api.parse_time(status.held_since)
    if (
        held is not None
        and (run.now - held).total_seconds() > api.parse_duration(spec.rollout.progress_deadline) + TICK
    ):
        problems.append(f"held since {status.held_since}")
    if before.phase == Phase.ANALYZING and status.phase == Phase.PROMOTING and route.weights is None:
        problems.append("promoted from a tick whose route was not accepted")
    return problems


@settings(max_examples=HISTORIES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=specs, history=st.lists(ticks, min_size=20, max_size=80))
def test_generated_route_histories_keep_the_invariants(drawn: dict[str, Any], history: list[Tick]) -> None:
    run = Run(spec_of(drawn))
    cluster = Cluster(run.spec, existing="existingRoute" in drawn["traffic"])
    log: list[str] = []
    good: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    for i, tick in enumerate(history):
        if tick.pause:
            raw = run.spec.model_dump(by_alias=True, mode="json")
            raw["rollout"]["paused"] = not run.spec.rollout.paused
            run.spec, run.generation = api.parse_spec(raw), run.generation + 1
        baseline, canary = cluster.tracks(tick)
        route = cluster.route(tick)
        before = run.status
        decision = run.step(after=TICK if i else 0, baseline=baseline, canary=canary, route=route, **good)
        log.append(
            f"{i}: {before.phase.value}->{decision.status.phase.value} ({decision.status.reason}) "
            f"pods {baseline.ready_replicas}/{baseline.replicas} {canary.ready_replicas}/{canary.replicas} "
            f"route {tick.route} {route} -> {decision.baseline_replicas},{decision.canary_replicas} "
            f"{decision.route_weights}"
        )
        problems = check(run, before, (baseline, canary), route)
        assert not problems, "\n".join([*problems, *log[-25:]])
        cluster.apply(decision)


def test_a_route_never_accepted_in_analysis_is_bounded_by_its_deadline() -> None:
    """The property's deadline, pinned on one history: a Gateway that never accepts again."""
    run = Run(spec_of({"replicas": 2, "maxSurge": 1, "maxUnavailable": 0, "traffic": OWNED}))
    cluster = Cluster(run.spec, existing=False)
    accepted, pending = Tick(0, 0, "accepted", 0, False), Tick(0, 0, "pending", 0, False)
    good: dict[str, Any] = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.2)}
    phases = []
    for _ in range(80):
        tick = accepted if run.phase != Phase.ANALYZING else pending
        baseline, canary = cluster.tracks(tick)
        run.step(after=TICK, baseline=baseline, canary=canary, route=cluster.route(tick), **good)
        assert run.last is not None
        cluster.apply(run.last)
        phases.append(run.phase)
        if run.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK):
            break
    assert Phase.ANALYZING in phases and run.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK), phases
    entered = next(h for h in run.status.history if h.phase == Phase.ANALYZING)
    rolled = next(h for h in run.status.history if h.phase == Phase.ROLLING_BACK)
    assert rolled.reason == rollout.Reason.ROUTE_NOT_ACCEPTED, rolled
    held_for = (run.now - api.parse_time(entered.time)).total_seconds()  # type: ignore[operator]
    # the warm-up (30 s), the tick that sees the hold, progressDeadline (5 m) and the tick past it
    assert held_for <= 30 + TICK + 300 + TICK
