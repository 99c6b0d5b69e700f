"""Capacity-safe moves between the tracks, walked step by step against a model of a cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.fake_cluster import proportional_sizes
from tests.unit.rollout_driver import Run, make_spec, metrics, ready, spec_body

from specgate import api, capacity, render, rollout, traffic
from specgate.api import Phase
from specgate.capacity import (
    Budget,
    ReplicaSetState,
    Side,
    guaranteed,
    may_roll,
    roll_unavailable,
    scaled_ready,
    step_toward,
)
from specgate.observation import TrackState
from specgate.render import Owner, Track


def walk(budget: Budget, start: tuple[int, int], target: tuple[int, int]) -> list[int]:
    """Apply step_toward until the target holds; pods removed stop serving at once, pods added
    become Ready one step later (as they load the model). Returns the Ready total after each step."""
    (b, c), (rb, rc) = start, start
    serving = []
    for _ in range(50):
        nb, nc = step_toward(budget, Side(b, rb), Side(c, rc), target)
        # Shrinking removes unready pods first (a ReplicaSet's choice); Ready ones only beyond them.
        rb, rc = min(rb, nb), min(rc, nc)
        serving.append(rb + rc)
        if (b, c) == (nb, nc) == target and (rb, rc) == target:
            return serving
        rb, rc = (nb if nb > b else rb), (nc if nc > c else rc)  # last step's new pods are Ready now
        b, c = nb, nc
    raise AssertionError(f"never reached {target}: stuck at {(b, c)}")


@pytest.mark.parametrize(
    ("surge", "unavailable", "floor"),
    [(1, 0, 4), (2, 0, 4), (0, 1, 3), (1, 1, 3)],
)
def test_rollback_after_promotion_never_drops_below_the_floor(
    surge: int, unavailable: int, floor: int
) -> None:
    serving = walk(Budget(4, surge, unavailable), start=(0, 4), target=(4, 0))
    assert min(serving) == floor  # the floor is used (pods are swapped) but never crossed


def test_no_spare_gpu_swaps_one_pod_at_a_time() -> None:
    budget = Budget(4, max_surge=0, max_unavailable=1)
    moves = []
    b, c = 0, 4
    for _ in range(4):  # a fixed count: a regression that swaps slower fails here instead of hanging
        b, c = step_toward(budget, Side(b, b), Side(c, c), (4, 0))
        moves.append((b, c))
    assert moves == [(1, 3), (2, 2), (3, 1), (4, 0)]


def test_shrinking_side_waits_for_the_growing_sides_ready_pods() -> None:
    budget = Budget(4, max_surge=1, max_unavailable=0)
    # Canary strategy: the canary pod is not Ready yet, so the baseline keeps all four.
    assert step_toward(budget, Side(4, 4), Side(1, 0), (3, 1)) == (4, 1)
    assert step_toward(budget, Side(4, 4), Side(1, 1), (3, 1)) == (3, 1)


def test_unready_pods_of_the_shrinking_side_go_at_once() -> None:
    """A crash-looping canary serves nothing: keeping it protects no capacity."""
    budget = Budget(4, max_surge=1, max_unavailable=0)
    assert step_toward(budget, Side(0, 0), Side(4, 0), (4, 0)) == (4, 0)
    assert step_toward(budget, Side(0, 0), Side(4, 2), (4, 0)) == (3, 2)


def test_targets_above_the_surge_budget_are_reached_not_cut_to_it() -> None:
    """maxSurge bounds the way to the targets, not the targets: asked for 2 pods on each side with
    replicas 2 and no surge, both sides grow to 2 (cut to the budget, the baseline would get none)."""
    assert step_toward(Budget(2, max_surge=0, max_unavailable=1), Side(0, 0), Side(0, 0), (2, 2)) == (2, 2)


def test_scaling_up_and_down_in_place() -> None:
    budget = Budget(8, max_surge=1, max_unavailable=0)
    assert step_toward(budget, Side(0, 0), Side(4, 4), (0, 8)) == (0, 8)
    assert step_toward(Budget(2, 1, 0), Side(0, 0), Side(4, 4), (0, 2)) == (0, 2)


# Any budget, any observed (replicas, Ready) per track, any canary target.
OBSERVED_STATES = {
    "replicas": st.integers(1, 8),
    "surge": st.integers(0, 2),
    "unavailable": st.integers(0, 2),
    "baseline": st.tuples(st.integers(0, 8), st.integers(0, 8)),
    "canary": st.tuples(st.integers(0, 8), st.integers(0, 8)),
    "target_canary": st.integers(0, 8),
}


@given(**OBSERVED_STATES)
def test_one_step_from_any_observed_state_keeps_the_floor_or_the_ready_pods_there_are(
    replicas: int,
    surge: int,
    unavailable: int,
    baseline: tuple[int, int],
    canary: tuple[int, int],
    target_canary: int,
) -> None:
    """Whatever the cluster shows (both tracks shrinking at once after a scale-down, say), the Ready
    pods one step keeps are at least replicas - maxUnavailable, or all the Ready pods there were
    (a shrink removes unready pods first, so a side kept at n pods keeps min(n, ready) Ready ones);
    and a step that starts pods never asks for more than replicas + maxSurge pods in all. The floor
    holds too where the baseline shows more Ready pods than replicas (a lowering its Deployment has
    not acted on yet; the canary's are not raised back: see the rolling canary's test below)."""
    budget = Budget(replicas, surge, unavailable)
    base, can = Side(max(baseline), min(baseline)), Side(max(canary), min(canary))
    target = (max(replicas - target_canary, 0), min(target_canary, replicas))
    floor = max(replicas - unavailable, 0)
    b, c = step_toward(budget, base, can, target)
    assert min(b, base.ready) + min(c, can.ready) >= min(floor, base.ready + can.ready)
    if b > base.replicas or c > can.replicas:
        assert b + c <= replicas + surge
    pending = Side(min(baseline), max(baseline))
    b, c = step_toward(budget, pending, can, target)
    assert min(b, pending.ready) + min(c, can.ready) >= min(floor, pending.ready + can.ready)


def test_ready_pods_a_pending_lowering_would_remove_are_kept_when_the_floor_rises() -> None:
    """Found by `make fuzz` (seed 859): Promoting has set the baseline 1 -> 0, its Deployment has not
    acted yet (its Ready pod still serves), and an HPA raises replicas 3 -> 6 (floor 5) beside 3 Ready
    canary pods. The pending lowering would take 4 Ready pods to 3: the baseline goes back to 1, and
    the canary grows only within the pods the budget leaves."""
    assert step_toward(Budget(6, max_surge=0, max_unavailable=1), Side(0, 1), Side(3, 3), (0, 6)) == (1, 5)


def test_a_rolling_canarys_surge_is_not_taken_for_a_pending_lowering() -> None:
    """Found by `make fuzz` (seed 3233) against a first version of the rule above: an upgrade rolls the
    canary (1 replica, its old and new pod both Ready), and replicas 2 -> 6 raises the floor. Raising
    the canary to keep its surge pod would serve the ungated config on 3 pods, above its share of
    1 + maxSurge; it stays at 1."""
    canary = guaranteed(Side(1, 2), rolling=True, max_unavailable=1)
    assert step_toward(Budget(6, max_surge=1, max_unavailable=1), Side(5, 1), canary, (5, 1)) == (5, 1)


def test_a_track_mid_roll_counts_only_the_pods_its_deployment_keeps() -> None:
    assert guaranteed(Side(3, 3), rolling=True, max_unavailable=1).kept(3) == 2
    assert guaranteed(Side(3, 1), rolling=True, max_unavailable=1).kept(3) == 1  # fewer Ready already
    # Lowered mid-roll: proportional scaling may take any Ready pod (issue 61); raised, it is not counted on more.
    assert guaranteed(Side(3, 3), rolling=True, max_unavailable=1).kept(2) == 0
    assert guaranteed(Side(3, 3), rolling=True, max_unavailable=1).kept(4) == 3
    assert guaranteed(Side(3, 3), rolling=False, max_unavailable=1).kept(3) == 3
    assert guaranteed(Side(3, 3), rolling=True, max_unavailable=0).kept(3) == 3  # surge-only rolls


def test_a_shrink_beside_a_rolling_track_keeps_the_floor_against_its_next_loss() -> None:
    """Canary 1 of 1 mid-roll (its Deployment may take its Ready pod at any moment), baseline 3 of 3,
    floor 3: the baseline may not give up a pod on the strength of that Ready canary."""
    budget = Budget(4, 0, 1)
    canary = guaranteed(Side(1, 1), rolling=True, max_unavailable=1)
    assert step_toward(budget, Side(3, 3), canary, targets=(2, 2)) == (3, 1)
    assert step_toward(budget, Side(3, 3), Side(1, 1), targets=(2, 2)) == (2, 2)  # not rolling: it may


@pytest.mark.parametrize(
    ("rolling", "other", "other_rolling", "shrinking", "allowed"),
    [
        (Side(3, 3), Side(1, 1), False, False, True),  # 4 Ready, the roll may cost 1: 3 >= 3
        (Side(3, 3), Side(1, 1), True, False, False),  # the other track is rolling: losses add up
        (Side(3, 3), Side(1, 1), False, True, False),  # a shrink this reconcile: losses add up
        (Side(3, 3), Side(1, 0), False, False, False),  # the canary is not Ready: 3 - 1 < 3
        (Side(3, 0), Side(1, 1), False, False, True),  # nothing Ready to lose (a render fix may help)
    ],
)
def test_a_re_render_rolls_only_alone_and_within_the_floor(
    rolling: Side, other: Side, other_rolling: bool, shrinking: bool, allowed: bool
) -> None:
    assert may_roll(Budget(4, 0, 1), rolling, other, other_rolling, shrinking) is allowed


def test_a_rolling_track_is_not_shrunk_below_what_its_own_roll_keeps() -> None:
    """Issue 38, item 1: baseline 2 of 2 mid-roll (maxSurge 0, maxUnavailable 1: its Deployment may
    take one Ready pod), canary 2 of 2, floor 3. Shrinking the baseline to 1 would let its roll keep
    1 - 1 = 0: it keeps its 2 pods (1 Ready guaranteed + 2 = 3) until its roll is over."""
    budget = Budget(4, max_surge=0, max_unavailable=1)
    rolling = guaranteed(Side(2, 2), rolling=True, max_unavailable=1)
    assert step_toward(budget, rolling, Side(2, 2), targets=(0, 4)) == (2, 2)
    assert step_toward(budget, Side(2, 2), Side(2, 2), targets=(0, 4)) == (1, 3)  # not rolling: it may


def test_pods_a_track_may_lose_are_not_free_to_remove() -> None:
    """A Deployment scaled 2 -> 1 that its controller has not seen yet reads as rolling, 2 Ready:
    that its roll might take them is no licence to take them now (floor 2, the canary counts 1)."""
    budget = Budget(4, max_surge=0, max_unavailable=2)
    baseline = guaranteed(Side(1, 2), rolling=True, max_unavailable=2)
    canary = guaranteed(Side(3, 1), rolling=True, max_unavailable=2)
    assert step_toward(budget, baseline, canary, targets=(0, 4))[0] == 1


def test_a_re_render_counts_no_ready_pod_above_the_replicas() -> None:
    """Found by test_day2_property (seed 191): baseline scaled 6 -> 4, its controller not caught up
    (6 Ready), floor 4. Its 2 extra pods go anyway: a roll of 4 at maxUnavailable 2 keeps 2."""
    assert not may_roll(Budget(6, 1, 2), Side(4, 6), Side(2, 0), other_rolling=False, shrinking=False)


def test_a_rolling_track_is_not_lowered_while_proportional_scaling_could_take_its_ready_pods() -> None:
    """Found by test_day2_property (seed 121 of the shared generator): the baseline rolls onto a
    crash-looping template (old ReplicaSet 3 Ready, new 4 never Ready: 7 pods at replicas 6,
    maxSurge 1), the canary's 1 pod Ready, and replicas 6 -> 4 (floor 4). The controller scales a
    rolling Deployment proportionally (Kubernetes docs, "Proportional scaling"): 6 -> 4 takes the old
    ReplicaSet 3 -> 2, a Ready pod, and 2 + 1 serve of a floor of 4. Every replica given up may be a
    Ready one, so the baseline keeps 6 and the canary its pod."""
    baseline = guaranteed(Side(6, 3), rolling=True, max_unavailable=0)
    assert step_toward(Budget(4, max_surge=1, max_unavailable=0), baseline, Side(1, 1), targets=(4, 0)) == (
        6,
        1,
    )


def test_a_lowered_rolling_track_may_lose_ready_pods_a_steady_one_loses_unready_first() -> None:
    """4 replicas, 2 Ready, lowered to 3. Not rolling, the ReplicaSet deletes the unready pod first
    and both Ready pods stay. Rolling, the Deployment scales its ReplicaSets proportionally, against
    the sizes they were last given (a maxSurge lowered since makes it shed more than the replica
    given up): none is counted on (issue 61)."""
    assert Side(4, 2).kept(3) == 2
    assert guaranteed(Side(4, 2), rolling=True, max_unavailable=1).kept(3) == 0


def test_a_shrink_stops_at_its_target_where_the_floor_would_allow_more() -> None:
    """Baseline 4 of 4, canary 1 of 1, targets (3, 1), floor 3: the floor would let the baseline go
    to 2, but the target asks for 3 and no pod beyond it is removed."""
    assert step_toward(Budget(4, max_surge=1, max_unavailable=1), Side(4, 4), Side(1, 1), (3, 1)) == (3, 1)


# --- the rollout's replicas and templates within the budget (rollout.py; mutation testing, issue 42) ---

B, C = Track.BASELINE, Track.CANARY


def test_a_deployment_already_on_the_spec_template_is_not_held_however_few_pods_are_ready() -> None:
    """Holding a template guards a roll to a new one; a baseline that already runs the spec's
    template (1 of 2 Ready, the canary gone) has nothing to roll, so it is applied, not held."""
    spec = make_spec(maxSurge=0, maxUnavailable=1)
    digest = "rendered-now"
    baseline = TrackState(
        exists=True,
        replicas=2,
        ready_replicas=1,
        template_hash=render.template_hash(spec, B),
        rendered=digest,
    )
    assert rollout.templates_to_wait(spec, {B: digest}, {B: baseline, C: TrackState()}, {B: 2}) == frozenset()


def test_a_new_baseline_template_counts_no_canary_pod_that_goes_this_reconcile() -> None:
    """A new baseline template (an edit) beside a canary scaled to 0 in the same reconcile: the
    canary's Ready pod is gone by the time the roll takes one of the baseline's, so the roll would
    leave no pod of the floor's 1 and the template waits."""
    spec = make_spec(maxSurge=0, maxUnavailable=1)
    digest = "rendered-now"
    baseline = TrackState(
        exists=True, replicas=1, ready_replicas=1, template_hash="an older spec", rendered="old"
    )
    canary = TrackState(
        exists=True,
        replicas=1,
        ready_replicas=1,
        template_hash=render.template_hash(spec, C),
        rendered=digest,
    )
    states = {B: baseline, C: canary}
    assert rollout.templates_to_wait(spec, {B: digest, C: digest}, states, {B: 1, C: 0}) == {B}
    assert rollout.templates_to_wait(spec, {B: digest, C: digest}, states, {B: 1, C: 1}) == frozenset()


def test_a_canary_re_render_waits_for_the_baselines_roll() -> None:
    """An operator upgrade re-renders both tracks; the baseline's is applied and still rolling: the
    canary's waits (two rolls at once could each take a Ready pod)."""
    spec = make_spec(maxSurge=0, maxUnavailable=1)
    on_spec = {t: render.template_hash(spec, t) for t in (B, C)}
    baseline = TrackState(
        exists=True, replicas=1, ready_replicas=1, template_hash=on_spec[B], rendered="new", rolling=True
    )
    canary = TrackState(exists=True, replicas=1, ready_replicas=1, template_hash=on_spec[C], rendered="old")
    assert rollout.templates_to_wait(spec, {B: "new", C: "new"}, {B: baseline, C: canary}, {B: 1, C: 1}) == {
        C
    }


def test_a_max_unavailable_raised_mid_roll_is_rendered_only_as_far_as_the_other_track_covers() -> None:
    """Issue 61, seed 693's sequence: replicas 5 (canary 2, maxSurge 1, maxUnavailable 0), the baseline
    rolling after an operator upgrade (3 old Ready pods, 1 new one Ready), a canary pod crashed (1
    of 2 Ready), then maxSurge 0 and maxUnavailable 2 (floor 3). The spec's 2 on the baseline's
    Deployment lets it keep 3 - 2 = 1 of its 4 Ready pods: 2 Ready in all. Beside the canary's 1 it
    must keep 2: it is rendered with 1. The canary, not rolling, keeps the spec's 2."""
    spec = api.parse_spec(spec_body(canaryReplicas=2, maxSurge=0, maxUnavailable=2) | {"replicas": 5})
    digests = {B: "after the upgrade", C: "as before"}
    baseline = TrackState(
        exists=True, replicas=3, ready_replicas=1, serving_ready=4, rendered=digests[B], rolling=True
    )
    canary = TrackState(exists=True, replicas=2, ready_replicas=1, rendered=digests[C])
    states = {B: baseline, C: canary}
    assert rollout.rendered_unavailable(spec, states, {B: 3, C: 2}, digests) == {B: 1, C: 2}
    healed = {B: baseline, C: replace(canary, ready_replicas=2)}  # the canary covers the spec's 2
    assert rollout.rendered_unavailable(spec, healed, {B: 3, C: 2}, digests) == {B: 2, C: 2}
    manifest = render.deployment(spec, Owner("llama", "ml", "u-1"), B, 3)
    lowered = render.with_max_unavailable(manifest, 1)
    assert lowered["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert manifest["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 2  # the spec's, unchanged


def test_a_roll_without_surge_is_rendered_with_the_least_max_unavailable_kubernetes_accepts() -> None:
    """maxSurge 0: a roll needs maxUnavailable 1 at least (the API server refuses both 0), even where
    the floor would want none of the track's Ready pods taken; with a surge, 0 holds every one."""
    rolling = guaranteed(Side(3, 3), rolling=True, max_unavailable=1)
    assert roll_unavailable(Budget(4, max_surge=0, max_unavailable=1), rolling, 3, other_ready=0) == 1
    assert roll_unavailable(Budget(4, max_surge=1, max_unavailable=1), rolling, 3, other_ready=0) == 0
    assert roll_unavailable(Budget(4, max_surge=1, max_unavailable=1), rolling, 3, other_ready=1) == 1


def to_canary_of(spec: api.SpeculativeDeploymentSpec) -> Run:
    run = Run(spec)
    n = spec.replicas
    run.step(baseline=ready(n))
    run.step(baseline=ready(n))
    run.step(after=95, baseline=ready(n), baseline_metrics=metrics())
    run.expect(Phase.CANARY)
    return run


def test_the_baseline_keeps_every_pod_the_canary_does_not_take() -> None:
    """4 replicas, 1 canary pod, maxUnavailable 1: once the canary is Ready the baseline gives up
    one pod, to 3, not down to the one pod a side-by-side comparison would need."""
    run = to_canary_of(api.parse_spec({**spec_body(maxUnavailable=1), "replicas": 4}))
    d = run.step(baseline=ready(4), canary=ready(1))
    run.expect(Phase.ANALYZING)
    assert (d.baseline_replicas, d.canary_replicas) == (3, 1)


def test_one_replica_with_a_spare_gpu_keeps_its_baseline_pod_beside_the_canary() -> None:
    """replicas 1, maxSurge 1: the canary runs on the spare GPU beside the baseline's pod, so that
    both are measured side by side."""
    run = to_canary_of(api.parse_spec({**spec_body(), "replicas": 1}))
    d = run.step(baseline=ready(1), canary=ready(1))
    run.expect(Phase.ANALYZING)
    assert (d.baseline_replicas, d.canary_replicas) == (1, 1)


def test_one_replica_without_a_spare_gpu_gives_the_baselines_pod_to_the_canary() -> None:
    """replicas 1, maxSurge 0, maxUnavailable 1: no GPU for a second pod, so the baseline's pod
    goes as the canary's starts (nothing serves between, as maxUnavailable 1 allows)."""
    run = to_canary_of(api.parse_spec({**spec_body(maxSurge=0, maxUnavailable=1), "replicas": 1}))
    d = run.last
    assert d is not None and (d.baseline_replicas, d.canary_replicas) == (0, 1)


# --- a track mid-roll, for every split of its pods over two ReplicaSets (issue 61) ---


def replica_set(pods: tuple[int, int]) -> tuple[int, int]:
    """(pods, Ready) of a ReplicaSet from two draws: the larger its pods."""
    return max(pods), min(pods)


def ready_after(
    deployment: tuple[int, tuple[int, int], tuple[int, int], tuple[int, int]], replicas: int, surge: int
) -> int:
    """The Ready pods a Deployment keeps once Kubernetes acts on `replicas`: deployment is its
    replicas, its old and new ReplicaSets' (pods, Ready) and their max-replicas annotations. A
    change while both hold pods is a scaling event (the fake cluster's proportional_sizes, as
    sync.go scales); one ReplicaSet alone is sized as asked, its unready pods deleted first."""
    current, (old, old_ready), (new, new_ready), (old_max, new_max) = deployment
    if replicas == current:
        return old_ready + new_ready
    if not (old and new):
        return min(old_ready + new_ready, replicas)
    allowed = replicas + surge
    growing = allowed > old + new
    # The controller's order: growing, the largest and newest first; shrinking, largest and oldest.
    first_new = (new, 1) > (old, 0) if growing else new > old
    sets = [(new, new_max), (old, old_max)] if first_new else [(old, old_max), (new, new_max)]
    sizes = proportional_sizes(sets, allowed, old + new)
    new_size, old_size = sizes if first_new else sizes[::-1]
    return min(old_ready, old_size) + min(new_ready, new_size)


def watched(
    old: tuple[int, int], new: tuple[int, int], annotated: tuple[int, int]
) -> tuple[ReplicaSetState, ...]:
    """The ReplicaSets with pods as the operator's watch shows them (kube.track_state), the old one
    created first."""
    sets = ((old, annotated[0], "2026-01-01T00:00:00Z old"), (new, annotated[1], "2026-01-01T00:01:00Z new"))
    return tuple(
        ReplicaSetState(pods, ready, max_replicas, created)
        for (pods, ready), max_replicas, created in sets
        if pods
    )


SPLITS = {
    "replicas": st.integers(1, 8),
    "surge": st.integers(0, 3),
    "unavailable": st.integers(0, 2),
    "baseline": st.tuples(st.integers(0, 8), st.tuples(st.integers(0, 8), st.integers(0, 8)),
                          st.tuples(st.integers(0, 8), st.integers(0, 8)), st.tuples(st.integers(1, 16), st.integers(1, 16))),
    "canary": st.tuples(st.integers(0, 8), st.tuples(st.integers(0, 8), st.integers(0, 8)),
                        st.tuples(st.integers(0, 8), st.integers(0, 8)), st.tuples(st.integers(1, 16), st.integers(1, 16))),
    "target_canary": st.integers(0, 8),
}  # fmt: skip


@given(**SPLITS)
def test_a_step_keeps_the_floor_for_every_replica_set_split_of_a_rolling_track(
    replicas: int,
    surge: int,
    unavailable: int,
    baseline: tuple[int, tuple[int, int], tuple[int, int], tuple[int, int]],
    canary: tuple[int, tuple[int, int], tuple[int, int], tuple[int, int]],
    target_canary: int,
) -> None:
    """Each track: its Deployment's replicas, an old and a new ReplicaSet of any pods and Ready pods,
    and any max-replicas annotations (a maxSurge lowered since they were sized leaves them above
    replicas + maxSurge). specgate sees replicas, Ready pods, whether it rolls and the ReplicaSets;
    whatever the split, the Ready pods both Deployments keep once Kubernetes acts on one step are the
    floor, or what the tracks guaranteed before it (a roll may take maxUnavailable of its Ready pods
    anyway)."""
    budget = Budget(replicas, surge, unavailable)
    tracks = []
    for current, old, new, annotated in (baseline, canary):
        split = (current, replica_set(old), replica_set(new), annotated)
        tracks.append(split)
    sides = [
        guaranteed(
            Side(current, old[1] + new[1], replica_sets=watched(old, new, annotated), max_surge=surge),
            rolling=bool(old[0] and new[0]),
            max_unavailable=unavailable,
        )
        for current, old, new, annotated in tracks
    ]
    target = (max(replicas - target_canary, 0), min(target_canary, replicas))
    b, c = step_toward(budget, sides[0], sides[1], target)
    kept = ready_after(tracks[0], b, surge) + ready_after(tracks[1], c, surge)
    guaranteed_before = sides[0].kept(sides[0].replicas) + sides[1].kept(sides[1].replicas)
    assert kept >= min(budget.min_ready, guaranteed_before)


def test_a_stuck_roll_is_not_lowered_while_the_floor_needs_its_ready_pods() -> None:
    """Issue 61: the baseline's roll stuck (old ReplicaSet 6 Ready, new one 2 crash-looping, sized for
    6 + maxSurge 2), maxSurge lowered to 1, replicas 6 -> 5 (floor 5). Lowering it to 5 is a scaling
    event against those 8 pods: 6 * 6/8 rounds to 5, the leftover to the largest, the old one, 6 -> 4.
    It keeps its 6 replicas; a raise is not held where the ReplicaSets are not seen (see capacity.py)."""
    baseline = (6, (6, 6), (2, 0), (8, 8))
    assert ready_after(baseline, 5, surge=1) == 4  # what 1be5013's step led to
    rolling = guaranteed(Side(6, 6), rolling=True, max_unavailable=0)
    assert step_toward(Budget(5, max_surge=1, max_unavailable=0), rolling, Side(0, 0), (5, 0)) == (6, 0)
    assert step_toward(Budget(7, max_surge=1, max_unavailable=0), rolling, Side(0, 0), (7, 0)) == (7, 0)
    # With the canary's Ready pods keeping the floor alone, the rolling baseline may change.
    assert step_toward(Budget(5, max_surge=1, max_unavailable=0), rolling, Side(5, 5), (0, 5)) == (0, 5)


def test_a_scaling_event_keeps_the_ready_pods_the_controllers_proportions_leave() -> None:
    """capacity.scaled_ready against the Kubernetes docs' example (10 replicas, maxSurge 3, stuck at 8
    old Ready and 5 new unready; 15 replicas: 11 and 7, no Ready pod lost) and issue 61's raise
    (maxSurge 3 -> 1, then 6 -> 7: 6 + 3 pods sized for 9 share 8, the old one gives up a Ready pod)."""
    docs = (ReplicaSetState(8, 8, 13, "1 old"), ReplicaSetState(5, 0, 13, "2 new"))
    assert scaled_ready(docs, 15 + 3) == 8
    stuck = (ReplicaSetState(6, 6, 9, "1 old"), ReplicaSetState(3, 0, 9, "2 new"))
    assert scaled_ready(stuck, 7 + 1) == 5
    assert scaled_ready(stuck, 8 + 1) == 6  # sized for as many pods as before: nothing shed
    assert scaled_ready(stuck[:1], 7 + 1) is None  # one ReplicaSet takes the replicas as they are
    assert scaled_ready((stuck[0], ReplicaSetState(3, 0, None, "2 new")), 8) is None  # not annotated


def test_a_stuck_roll_is_not_raised_while_its_scaling_event_would_shed_ready_pods_the_floor_needs() -> None:
    """Issue 61's raise: the baseline's roll stuck at 6 old Ready pods and 3 crash-looping new ones,
    sized for 6 + maxSurge 3; maxSurge lowered to 1, replicas 6 -> 7. Raising it to 7 would take an
    old Ready pod (6 -> 5 of a floor of 6 reached): it keeps its 6 replicas until the canary's Ready
    pods keep the floor alone, and is raised where the ReplicaSets shed nothing."""
    stuck = (ReplicaSetState(6, 6, 9, "1 old"), ReplicaSetState(3, 0, 9, "2 new"))
    rolling = guaranteed(Side(6, 6, replica_sets=stuck, max_surge=1), rolling=True, max_unavailable=0)
    assert step_toward(Budget(7, max_surge=1, max_unavailable=0), rolling, Side(0, 0), (7, 0)) == (6, 0)
    assert step_toward(Budget(7, max_surge=1, max_unavailable=0), rolling, Side(7, 7), (7, 7)) == (7, 7)
    unshed = guaranteed(Side(6, 6, replica_sets=stuck, max_surge=3), rolling=True, max_unavailable=0)
    assert step_toward(Budget(7, max_surge=3, max_unavailable=0), unshed, Side(0, 0), (7, 0)) == (7, 0)


def test_a_canarys_ready_pod_a_pending_lowering_would_take_is_kept_within_its_share() -> None:
    """Found by the day-2 fuzz with the budget edits (seed 113): a rollback lowered the canary 1 -> 0
    (floor 1: the baseline's Ready pod was enough); before its Deployment acted, replicas 2 -> 6
    raised the floor to 5, and the canary's Ready pod went: 1 Ready where 2 had been reached. As the
    baseline's are, it is kept by raising the canary back, but never above its share."""
    budget = Budget(6, max_surge=1, max_unavailable=1)
    assert step_toward(budget, Side(6, 1), Side(0, 1), (6, 0), canary_share=1) == (6, 1)
    assert step_toward(budget, Side(6, 1), Side(0, 3), (6, 0), canary_share=1) == (6, 1)  # not above it
    assert step_toward(budget, Side(6, 5), Side(0, 1), (6, 0), canary_share=1) == (6, 0)  # not needed


def test_behind_a_route_a_rolling_track_keeps_the_pods_its_weight_needs() -> None:
    """The day-2 fuzz with routes (issue 61, seed 1005): replicas 3, canaryReplicas 2, maxSurge 2,
    maxUnavailable 1 (floor 2); in Analyzing the route gives the baseline a third, its Deployment
    rolls after an operator upgrade and is lowered 2 -> 1 for load matching. The canary's 2 Ready
    pods keep the floor, so the spec's maxUnavailable 1 let the baseline's roll take its only Ready
    pod while the Gateway sent it a third of the traffic. Behind the route it keeps the pod its
    weight needs: rendered with 0 (its maxSurge brings the new pod first)."""
    spec = api.parse_spec(spec_body(canaryReplicas=2, maxSurge=2, maxUnavailable=1) | {"replicas": 3})
    digests = {B: "after the upgrade", C: "as before"}
    baseline = TrackState(
        exists=True, replicas=2, ready_replicas=2, rendered="before the upgrade", rolling=True
    )
    canary = TrackState(exists=True, replicas=2, ready_replicas=2, rendered=digests[C])
    states, wanted = {B: baseline, C: canary}, {B: 1, C: 2}
    assert rollout.rendered_unavailable(spec, states, wanted, digests) == {B: 1, C: 1}  # the floor alone
    assert rollout.rendered_unavailable(spec, states, wanted, digests, {B: 33, C: 67}) == {B: 0, C: 1}
    assert rollout.rendered_unavailable(spec, states, wanted, digests, {B: 0, C: 100}) == {B: 1, C: 1}
    assert traffic.pods_to_carry(capacity.Budget(3, 2, 1), 33) == 1
    assert traffic.pods_to_carry(capacity.Budget(3, 2, 1), 100) == 2
    assert traffic.pods_to_carry(capacity.Budget(2, 0, 2), 100) == 0  # a floor of 0
