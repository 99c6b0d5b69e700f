"""The hand-over from an adopted Deployment to specgate's baseline and back, driven on the fake
cluster (Deployments, ReplicaSets and pods moved as the controller-manager moves them): the Ready
pods the user's Service selects never fall below replicas - maxUnavailable, checked every tick, and
the adopted Deployment's template is never touched."""

from __future__ import annotations

import copy
import random
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.fake_cluster import FakeCluster
from tests.unit.rollout_driver import T0, metrics
from tests.unit.spec_cases import adopting
from tests.unit.test_adopt import OWNER, SERVICE_SELECTOR, helm_deployment

from specgate import adopt, api, capacity, handover, kube, render
from specgate import rollout as rollout_module
from specgate.api import Phase
from specgate.observation import Observation, Workload
from specgate.render import Track

SEEDS = range(6)
SHAPES = [(4, 1, 0), (4, 0, 1), (3, 2, 0), (2, 1, 1), (1, 1, 0)]  # replicas, maxSurge, maxUnavailable
MAX_TICKS = 200


def adopted(replicas: int) -> dict[str, Any]:
    deployment = helm_deployment()
    deployment["spec"]["replicas"] = replicas
    deployment["spec"]["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    return deployment


class Lab:
    """The fake cluster with the user's Deployment serving, and specgate adopting it."""

    def __init__(self, seed: int, shape: tuple[int, int, int], policy: str = "progressively") -> None:
        replicas, surge, unavailable = shape
        rollout = {"maxSurge": surge, "maxUnavailable": unavailable, "canaryReplicas": 1}
        self.spec = api.parse_spec(
            adopting(workloadRef={"name": "llama", "scaleDown": policy}, replicas=replicas, rollout=rollout)
        )
        self.budget = capacity.Budget(replicas, surge, unavailable)
        self.cluster = FakeCluster(random.Random(seed))
        self.cluster.apply(adopted(replicas))
        self.original_template = copy.deepcopy(adopted(replicas)["spec"]["template"])
        self.ticks_below: list[str] = []
        self.most_pods = 0
        while self.serving() < replicas:  # serving before specgate arrives
            self.tick()
        self.ticks_below.clear()

    def serving(self) -> int:
        return self.cluster.ready_serving(SERVICE_SELECTOR)

    def workload(self) -> Workload:
        dep = self.cluster.deployments.get("llama")
        return kube.workload_state(dep.body() if dep else None)

    def baseline(self) -> capacity.Side:
        dep = self.cluster.deployments.get("llama-baseline")
        if dep is None:
            return capacity.Side(0, 0)
        body = dep.body()
        return capacity.Side(body["spec"]["replicas"], body["status"]["readyReplicas"])

    def tick(self) -> None:
        self.cluster.advance()
        self.cluster.kubelet()
        self.most_pods = max(self.most_pods, len(self.cluster.pods()))
        if self.serving() < self.budget.min_ready:
            self.ticks_below.append(
                f"tick {self.cluster.tick}: {self.serving()} Ready; {self.cluster.describe()}"
            )

    def operator_hand_over(self) -> handover.Step:
        assert self.spec.workload_ref is not None
        step = handover.hand_over(
            self.spec.workload_ref.scale_down, self.budget, self.workload(), self.baseline()
        )
        body = self.cluster.deployments["llama"].body()
        source = adopt.source_template(self.spec.workload_ref, body)
        self.cluster.apply(adopt.deployment(self.spec, OWNER, Track.BASELINE, step.baseline_replicas, source))
        self.cluster.scale("llama", step.workload_replicas)  # the scale subresource: replicas only
        return step

    def run_hand_over(self) -> int:
        for ticks in range(MAX_TICKS):
            if self.operator_hand_over().handed_over:
                return ticks
            self.tick()
        raise AssertionError(f"no hand-over in {MAX_TICKS} ticks: {self.cluster.describe()}")

    def run_hand_back(self, deadline: float = float("inf")) -> handover.HandBack:
        for ticks in range(MAX_TICKS):
            back = handover.hand_back(
                api.OnDelete.HAND_BACK, self.budget.replicas, self.budget, self.workload(), ticks, deadline
            )
            self.cluster.scale("llama", back.workload_replicas)
            if back.release:  # the finalizer goes: the garbage collector deletes specgate's pods
                del self.cluster.deployments["llama-baseline"]
                self.tick()
                return back
            self.tick()
        raise AssertionError(f"no hand-back in {MAX_TICKS} ticks: {self.cluster.describe()}")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_progressive_hand_over_and_back_keeps_the_floor_every_tick(
    seed: int, shape: tuple[int, int, int]
) -> None:
    lab = Lab(seed, shape)
    lab.run_hand_over()
    replicas, surge, _ = shape
    assert lab.workload().replicas == 0 and lab.cluster.deployments["llama"].pods() == []
    assert lab.baseline().replicas == replicas
    assert lab.most_pods <= replicas + surge, "the hand-over ran more pods than maxSurge allows"
    back = lab.run_hand_back()
    assert not back.timed_out
    assert lab.serving() >= lab.budget.min_ready
    assert lab.ticks_below == [], "\n".join(lab.ticks_below)
    assert lab.cluster.deployments["llama"].manifest["spec"]["template"] == lab.original_template
    assert lab.cluster.deployments["llama"].replicas == replicas


@pytest.mark.parametrize("seed", SEEDS)
def test_on_success_lowers_the_deployment_at_once_once_specgates_baseline_is_ready(seed: int) -> None:
    lab = Lab(seed, (3, 1, 0), policy="onSuccess")
    lab.operator_hand_over()
    assert lab.cluster.deployments["llama"].replicas == 3, "nothing goes before the baseline is Ready"
    lab.run_hand_over()
    assert lab.workload().replicas == 0
    assert lab.most_pods == 6, "onSuccess runs both in full meanwhile (the guide says so)"
    assert lab.ticks_below == [], "\n".join(lab.ticks_below)


def test_never_leaves_the_deployment_alone_and_starts_the_rollout_at_once() -> None:
    lab = Lab(0, (2, 1, 0), policy="never")
    assert lab.run_hand_over() == 0
    assert lab.cluster.deployments["llama"].replicas == 2


def test_a_hand_back_whose_deployment_never_loads_is_released_at_the_deadline_and_says_so() -> None:
    lab = Lab(0, (2, 1, 0))
    lab.run_hand_over()
    broken = lab.cluster.deployments["llama"]
    broken.manifest["spec"]["template"]["spec"]["containers"][0]["image"] = "broken"  # never Ready
    broken.new_hash = "broken"
    back = lab.run_hand_back(deadline=20)
    assert back.timed_out and "after progressDeadline (20s)" in back.message


def test_a_deployment_rolling_its_own_template_is_not_lowered_while_the_floor_needs_its_pods() -> None:
    budget = capacity.Budget(4, 1, 0)
    rolling = Workload(True, replicas=4, ready=4, rolling=True)
    step = handover.hand_over(api.ScaleDown.PROGRESSIVELY, budget, rolling, capacity.Side(1, 1))
    assert step.workload_replicas == 4 and step.baseline_replicas == 1 and not step.handed_over
    step = handover.hand_over(api.ScaleDown.PROGRESSIVELY, budget, rolling, capacity.Side(4, 4))
    assert step.workload_replicas == 0


def test_an_autoscaler_on_the_deployment_is_found() -> None:
    hpa = {
        "metadata": {"name": "llama-hpa"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"}},
    }
    other = {"metadata": {"name": "x"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "other"}}}
    keda = {
        "metadata": {"name": "llama-keda"},
        "spec": {"scaleTargetRef": {"name": "llama"}},
    }  # KEDA's defaults
    sd = {
        "metadata": {"name": "y"},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "specgate.dev/v1alpha1",
                "kind": "SpeculativeDeployment",
                "name": "llama",
            }
        },
    }
    assert handover.autoscaler("llama", [hpa, other], []) == "HorizontalPodAutoscaler llama-hpa"
    assert handover.autoscaler("llama", [other, sd], [keda]) == "ScaledObject llama-keda"
    assert handover.autoscaler("llama", [other, sd], []) is None


def test_what_cannot_be_adopted_is_refused_with_the_fix() -> None:
    ref = api.WorkloadRef(name="llama")
    serving = Workload(True, replicas=4, ready=4)
    assert handover.refusal(ref, 4, serving, None, None) is None
    assert handover.refusal(ref, 4, Workload(), None, None) == (
        "Deployment llama does not exist in this namespace: create it, or fix workloadRef.name"
    )
    scaled = handover.refusal(ref, 4, serving, None, "HorizontalPodAutoscaler llama-hpa")
    assert scaled is not None and scaled.startswith(
        "HorizontalPodAutoscaler llama-hpa scales Deployment llama"
    )
    assert handover.refusal(ref, 2, serving, None, None) == (
        "spec.replicas 2 is below the 4 replicas of Deployment llama: the hand-over would serve on fewer "
        "pods; set replicas: 4 (or scale the Deployment to 2 first)"
    )
    # mid-hand-over the Deployment's replicas fall: the replicas from before the adoption count
    assert handover.refusal(ref, 2, Workload(True, 1, 1), 4, None) is not None


# --- through decide(): the rollout waits in Pending for the hand-over, then adopts, rolls out, promotes ---

STAGES = {"warmup": "30s", "analysisWindow": "60s", "maxAnalysisDuration": "10m", "progressDeadline": "5m"}


class DecideLab(Lab):
    """The fake cluster driven by rollout.decide(), as the handler applies its decisions."""

    def __init__(self, seed: int, shape: tuple[int, int, int], policy: str = "progressively") -> None:
        super().__init__(seed, shape, policy)
        replicas, surge, unavailable = shape
        rollout = {"maxSurge": surge, "maxUnavailable": unavailable, "canaryReplicas": 1, **STAGES}
        ref = {"name": "llama", "scaleDown": policy}
        self.spec = api.parse_spec(adopting(workloadRef=ref, replicas=replicas, rollout=rollout))
        self.status = api.SpeculativeDeploymentStatus()
        self.now = T0
        self.events: list[rollout_module.Event] = []
        self.autoscaler: str | None = None

    def observe(self) -> Observation:
        children = self.cluster.children()
        tracks = {
            t: kube.track_state(children, "ml", f"llama-{t.value}", render.selector_labels(OWNER, t))
            for t in Track
        }
        return Observation(
            generation=1,
            baseline=tracks[Track.BASELINE],
            canary=tracks[Track.CANARY],
            baseline_metrics=metrics(),
            canary_metrics=metrics(0.8) if tracks[Track.CANARY].exists else None,
            workload=self.workload(),
            workload_autoscaler=self.autoscaler,
        )

    def decide(self) -> rollout_module.Decision:
        assert self.spec.workload_ref is not None
        self.now += timedelta(seconds=10)
        source = adopt.source_template(self.spec.workload_ref, self.cluster.deployments["llama"].body())
        spec = adopt.resolve(self.spec, source)
        decision = rollout_module.decide(spec, self.status, self.observe(), self.now)
        self.status = decision.status
        self.events += decision.events
        if decision.touch_children:
            self.cluster.apply(
                adopt.deployment(spec, OWNER, Track.BASELINE, decision.baseline_replicas, source)
            )
            if decision.canary_replicas is not None:
                self.cluster.apply(
                    adopt.deployment(spec, OWNER, Track.CANARY, decision.canary_replicas, source)
                )
        if decision.workload_replicas is not None:
            self.cluster.scale("llama", decision.workload_replicas)
        return decision

    def run_until(self, phase: Phase) -> None:
        for _ in range(MAX_TICKS):
            if self.decide().status.phase == phase:
                return
            self.tick()
        raise AssertionError(f"not {phase} in {MAX_TICKS} ticks: {self.status.message}")


@pytest.mark.parametrize("shape", SHAPES[:4])
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_decide_hands_over_then_rolls_out_and_promotes_keeping_the_floor(
    seed: int, shape: tuple[int, int, int]
) -> None:
    lab = DecideLab(seed, shape)
    replicas = shape[0]
    first = lab.decide()
    assert first.status.phase == Phase.PENDING and first.status.reason == "HandingOver"
    assert first.canary_replicas is None
    lab.run_until(Phase.BASELINE)
    assert lab.status.workload is not None
    assert (lab.status.workload.original_replicas, lab.status.workload.handed_over) == (replicas, True)
    assert lab.workload().running == 0
    scaled = [e.message for e in lab.events if e.reason == "HandingOver"]
    assert scaled[0].startswith(f"scaled Deployment llama from {replicas} to ")
    assert [e.reason for e in lab.events].count("HandedOver") == 1
    assert lab.most_pods <= replicas + shape[1], "the hand-over ran more pods than maxSurge allows"
    lab.run_until(Phase.PROMOTED)
    assert lab.ticks_below == [], "\n".join(lab.ticks_below)
    assert lab.cluster.deployments["llama"].manifest["spec"]["template"] == lab.original_template


def test_decide_lowers_a_deployment_raised_again_after_the_hand_over_and_warns() -> None:
    lab = DecideLab(0, (2, 1, 0))
    lab.run_until(Phase.BASELINE)
    for _ in range(5):
        lab.tick()
    lab.cluster.scale("llama", 2)  # Argo CD's selfHeal puts the replicas in git back
    lab.tick()
    decision = lab.decide()
    assert decision.workload_replicas == 0
    [warning] = [e for e in decision.events if e.type == "Warning"]
    assert (
        warning.reason == "HandingOver" and "make it ignore the Deployment's spec.replicas" in warning.message
    )


@pytest.mark.parametrize(
    ("change", "cause"),
    [
        (
            {"autoscaler": "HorizontalPodAutoscaler llama-hpa"},
            "HorizontalPodAutoscaler llama-hpa scales Deployment llama",
        ),
        ({"replicas": 1}, "spec.replicas 1 is below the 2 replicas of Deployment llama"),
    ],
)
def test_decide_refuses_what_would_fight_or_shrink_the_hand_over(change: dict[str, Any], cause: str) -> None:
    lab = DecideLab(0, (2, 1, 0))
    lab.autoscaler = change.get("autoscaler")
    if "replicas" in change:
        lab.spec = lab.spec.model_copy(update={"replicas": change["replicas"]})
    decision = lab.decide()
    assert decision.status.phase == Phase.FAILED and decision.status.reason == "WorkloadNotAdoptable"
    assert decision.status.message is not None and decision.status.message.startswith(cause)
    assert not decision.touch_children and decision.workload_replicas is None
    assert lab.cluster.deployments["llama"].replicas == 2


def test_a_refusal_fixed_resumes_the_hand_over_in_pending() -> None:
    lab = DecideLab(0, (2, 1, 0))
    lab.autoscaler = "HorizontalPodAutoscaler llama-hpa"
    assert lab.decide().status.phase == Phase.FAILED
    lab.autoscaler = None  # the HPA removed
    decision = lab.decide()
    assert (decision.status.phase, decision.status.reason) == (Phase.PENDING, "HandingOver")
    assert decision.status.resume_phase is None and decision.baseline_replicas == 1


def test_a_paused_hand_over_moves_nothing() -> None:
    lab = DecideLab(0, (2, 1, 0))
    lab.decide()
    for _ in range(4):
        lab.tick()
    lab.spec = lab.spec.model_copy(update={"rollout": lab.spec.rollout.model_copy(update={"paused": True})})
    before = lab.baseline()
    decision = lab.decide()
    assert decision.workload_replicas is None and decision.canary_replicas is None
    assert decision.baseline_replicas == before.replicas
    assert decision.status.message is not None and decision.status.message.startswith("paused")
