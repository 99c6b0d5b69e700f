"""One generated day-2 history played on the real controller-manager, kwok's pods and the simulated
engines, and on the model the property test trusts (tests/unit/day2_history.py: the same generator,
the same history): the two must agree on the fewest Ready serving pods.

The history (day2_history.replay_history) is drawn from what the lab performs: spec edits and
replicas changes as merge patches of the object, pause, retry and abort as the property test makes
them, an engine killed (the bridge restarts it) or a pod deleted for a fault. A model tick is
TICK_SECONDS here; the run ends once the events are done and the rollout has settled."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.conftest import CACHE
from tests.cluster.figures import FIGURES
from tests.cluster.operator_process import OPERATOR_INTERVAL_SECONDS
from tests.cluster.rollouts import SETTLED, patch_rollout, run_rollout, sim_rollout
from tests.unit.day2_history import (
    FAULTS,
    REPLAY_MODEL_TICKS,
    Event,
    Generated,
    History,
    pick,
    replay_history,
)

from specgate import api

pytestmark = [pytest.mark.cluster, pytest.mark.beside_gateway]  # its line: hack/test.sh

NAME = "replay"
# Two reconciles a tick: the model reconciles once a tick, and a simulated engine is Ready in about
# one interval, as a model pod is in 1-3 ticks.
TICK_SECONDS = 2 * OPERATOR_INTERVAL_SECONDS
# How far the model's minimum may sit above the cluster's. The model samples Ready pods once a tick,
# at its worst point (after the controllers removed pods, before the kubelet marks new ones Ready),
# but in one order: a tick's fault comes before its reconcile and controller sync, so a roll's next
# removal always sees the fault. On the cluster they interleave: a fault can land after the
# Deployment controller removed an old pod and before its replacement is Ready, one pod the model
# has no instant for. The operator never rolls both tracks at once (capacity.may_roll), so one pod.
TICK_GRANULARITY_PODS = 1


def lab_body(generated: Generated) -> dict[str, Any]:
    """The generated first spec on simulated engines: the fields the events edit come from it."""
    body = sim_rollout(NAME, {"SPECGATE_SIM_ALPHA": "0.8"})
    spec, first = body["spec"], generated.spec
    spec |= {key: first[key] for key in ("image", "replicas")}
    spec["rollout"] |= {k: first["rollout"][k] for k in ("canaryReplicas", "maxSurge", "maxUnavailable")}
    spec["speculative"]["numSpeculativeTokens"] = first["speculative"]["numSpeculativeTokens"]
    return body


class Player:
    """Performs each event once its tick's time has come, from run_rollout's `during`."""

    def __init__(self, lab: dict[str, Any], monitor: CapacityMonitor, generated: Generated) -> None:
        self.api_client, self.namespace, self.monitor = lab["api_client"], lab["namespace"], monitor
        self.replicas = int(generated.spec["replicas"])
        self.pending: Iterator[Event] = iter(generated.events)
        self.next: Event | None = next(self.pending, None)
        self.began: float | None = None  # the monitor's time of tick 0: all first replicas serving
        self.log: list[str] = []

    def during(self, _obj: dict[str, Any]) -> None:
        if self.began is None and self.monitor.ready(NAME) >= self.replicas:
            self.began = self.monitor.elapsed()
        if self.began is None:
            return
        tick = (self.monitor.elapsed() - self.began) / TICK_SECONDS
        while self.next is not None and self.next.tick <= tick:
            self.perform(self.next)
            self.next = next(self.pending, None)

    def perform(self, event: Event) -> None:
        self.log.append(event.describe())
        if event.spec is not None:
            patch_rollout(self.api_client, self.namespace, NAME, event.spec)
        if event.annotations is not None:
            client.CustomObjectsApi(self.api_client).patch_namespaced_custom_object(
                api.GROUP, api.VERSION, self.namespace, api.PLURAL, NAME,
                {"metadata": {"annotations": event.annotations}},
            )  # fmt: skip
        if event.kind in FAULTS:
            self.fault(event)

    def fault(self, event: Event) -> None:
        serving = self.monitor.serving(NAME)
        if not serving:
            return  # as the model: a fault takes a Ready pod or nothing
        pod = pick(serving, event.pick)
        self.monitor.fault(NAME, pod)  # before the pod goes: the floor forgives it, as the model's
        if event.kind == "delete":
            client.CoreV1Api(self.api_client).delete_namespaced_pod(pod, self.namespace)
        else:  # crash loop: the engine dies, the bridge restarts it after a back-off
            state = json.loads((CACHE / "cluster" / "bridge-state.json").read_text())
            os.kill(state[f"{self.namespace}/{pod}"]["pid"], signal.SIGKILL)
        self.log.append(f"{event.kind} took {pod}")

    @property
    def done(self) -> bool:
        return self.next is None


def test_a_generated_day2_history_keeps_the_same_minimum_ready_on_the_cluster_as_on_the_model(
    lab: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = replay_history()
    replicas = int(generated.spec["replicas"])
    with History(generated, REPLAY_MODEL_TICKS, begin_at_ready=replicas).wired(monkeypatch) as model:
        violations = list(model.run())
    assert violations == [], "\n".join([*violations, *model.log[-60:]])

    monitor = CapacityMonitor(lab["api_client"], lab["namespace"])
    player = Player(lab, monitor, generated)

    def settled(obj: dict[str, Any]) -> bool:
        status = obj.get("status", {})
        caught_up = status.get("observedGeneration") == obj["metadata"]["generation"]
        return player.done and caught_up and status.get("phase") in SETTLED

    run = run_rollout(body=lab_body(generated), during=player.during, until=settled, monitor=monitor,
                      timeout=600, **lab)  # fmt: skip
    assert player.began is not None
    cluster_min, drops = monitor.min_ready(NAME, since=player.began), monitor.figures()["drops"]
    floor = lowest_floor(generated)
    faults = sum(event.kind in FAULTS for event in generated.events)
    line = (
        f"replay seed={generated.seed} events={len(generated.events)} model_min_ready={model.min_ready} "
        f"cluster_min_ready={cluster_min} floor={floor} faults={faults} drops={drops} "
        f"phases={'-'.join(run.phases)}"
    )
    print(line)
    FIGURES.append(line)
    assert model.min_ready is not None and cluster_min is not None, line
    # Agreement: each keeps the floor in force at every moment (the model's Floor and the monitor's
    # drops: one rule, tests/floor.py, a fault forgiven the pod it took), so neither minimum is
    # below the history's lowest floor less a pod per fault; and the model is no kinder than the
    # cluster by more than its tick explains (TICK_GRANULARITY_PODS).
    assert drops == 0, line
    assert min(model.min_ready, cluster_min) >= floor - faults, f"{line}\n" + "\n".join(player.log)
    assert model.min_ready - cluster_min <= TICK_GRANULARITY_PODS, f"{line}\n" + "\n".join(player.log)


def lowest_floor(generated: Generated) -> int:
    """The lowest `replicas - maxUnavailable` of the history's specs."""
    first = generated.spec
    floors = [int(raw["replicas"]) - int(raw["rollout"]["maxUnavailable"]) for raw in generated.specs()]
    return max(min([int(first["replicas"]) - int(first["rollout"]["maxUnavailable"]), *floors]), 0)
