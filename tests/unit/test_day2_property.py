"""The real handlers.step, driven tick by tick through random day-2 histories against a fake
cluster whose Deployments roll as the controller-manager rolls them (tests/unit/fake_cluster.py).

Every tick: maybe one event (a spec edit, pause, retry, abort, an HPA's replicas, an operator upgrade
that renders the pod template differently, a pod crash, metrics lost, an invalid spec), then one
reconcile, then the controllers and the kubelet. Invariants checked every tick (DESIGN.md, section 2):
- Ready serving pods never below `replicas - maxUnavailable` once reached. The floor is the
  rollout's own: of the current valid spec; a replicas change lowers it at once and raises it only
  as Ready pods reach it (scaling itself is allowed), and a fault (a crash, a failed probe) lowers
  it by the pod it took.
- Never more Ready pods on canary templates that no gate passed than the canary's share
  (canaryReplicas, plus maxSurge while the canary Deployment itself rolls).
- A rollback resumed after a failed spec ends with the reason it began with.

SPECGATE_FUZZ_HISTORIES sets the number of histories (`make fuzz`), SPECGATE_FUZZ_SEED replays one.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from tests.unit.fake_cluster import BROKEN_IMAGE, FakeCluster
from tests.unit.rollout_driver import T0, metrics, spec_body

from specgate import api, handlers, kube, render
from specgate.api import Phase
from specgate.observation import TrackMetrics
from specgate.prometheus import MetricsUnavailable, Selector
from specgate.render import Owner, Track
from specgate.rollout import Reason

HISTORIES = int(os.environ.get("SPECGATE_FUZZ_HISTORIES", "500"))
TICKS = 250
TICK_SECONDS = 10
OWNER = Owner(name="llama", namespace="ml", uid="u-1")
UPGRADE_LABEL = "specgate.dev/fake-operator-version"  # what an operator upgrade renders differently


def first_spec(rng: random.Random) -> dict[str, Any]:
    replicas = rng.randint(2, 5)
    surge, unavailable = rng.choice([(0, 1), (1, 0), (1, 1), (0, 2), (2, 0), (2, 1)])
    body = spec_body(
        canaryReplicas=rng.randint(1, min(2, replicas - 1)),
        maxSurge=surge,
        maxUnavailable=unavailable,
        metrics={"prometheusUrl": "http://prometheus:9090"},
    )
    return body | {"image": "vllm:1", "replicas": replicas}


@dataclass
class Floor:
    """The floor in force: it follows the target down at once and up as Ready pods reach it."""

    armed: int = 0

    def lose_one(self) -> None:
        """A fault took a Ready pod: no rollout could have kept it (a shrink may be in flight)."""
        self.armed = max(self.armed - 1, 0)

    def check(self, ready: int, target: int) -> str | None:
        self.armed = min(self.armed, target)
        broken = f"{ready} Ready serving pods of a floor of {self.armed}" if ready < self.armed else None
        self.armed = max(self.armed, min(ready, target))
        return broken


@dataclass
class History:
    """One random day-2 history: the object as the API server holds it, and the cluster."""

    seed: int
    rng: random.Random = field(init=False)
    cluster: FakeCluster = field(init=False)
    raw: dict[str, Any] = field(init=False)
    valid: api.SpeculativeDeploymentSpec = field(init=False)  # the last valid spec
    status: api.SpeculativeDeploymentStatus = field(default_factory=api.SpeculativeDeploymentStatus)
    annotations: dict[str, str] = field(default_factory=dict)
    generation: int = 1
    tick: int = 0
    operator_version: int = 0
    metrics_lost_until: int = -1
    fix_at: int | None = None  # when an invalid spec is fixed
    alpha: dict[str, float] = field(default_factory=dict)  # by canary template
    gated: set[str] = field(default_factory=set)  # canary templates a gate passed
    floor: Floor = field(default_factory=Floor)
    rollback_reason: str | None = None
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.cluster = FakeCluster(self.rng)
        self.raw = first_spec(self.rng)
        self.valid = api.parse_spec(self.raw)

    # --- the seams handlers.step reads and writes through ---

    def pod_labels(self, original: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
        def labels(*args: Any) -> dict[str, str]:
            return {**original(*args), UPGRADE_LABEL: str(self.operator_version)}

        return labels

    def track_metrics(self, sel: Selector, *_: Any) -> TrackMetrics:
        if self.tick < self.metrics_lost_until:
            raise MetricsUnavailable("Prometheus query failed: connection refused")
        if sel.track == Track.BASELINE.value:
            return metrics()
        canary = self.cluster.deployments.get(render.deployment_name(OWNER, Track.CANARY))
        template = canary.manifest["metadata"]["annotations"][render.ANNOTATION_TEMPLATE] if canary else ""
        return metrics(self.alpha.setdefault(template, 0.8 if self.rng.random() < 0.75 else 0.3))

    # --- one tick ---

    def run(self) -> Iterator[str]:
        """The invariants each tick breaks, described."""
        for self.tick in range(TICKS):
            if self.rng.random() < 0.1:
                self.event()
            if self.fix_at == self.tick:
                self.edit(lambda raw: raw["speculative"].update(numSpeculativeTokens=4), "fix the spec")
            yield from self.reconcile()
            self.log.append(f"{self.tick}: after reconcile {self.cluster.describe()}")
            self.cluster.advance()
            yield from self.check_capacity()
            self.cluster.kubelet()

    def reconcile(self) -> Iterator[str]:
        now = T0 + timedelta(seconds=TICK_SECONDS * self.tick)
        before = self.status
        children = self.cluster.children()
        decision = handlers.step(
            copy.deepcopy(self.raw), before, OWNER, self.generation, now, dict(self.annotations), children
        )
        self.status = status = decision.status
        if status.phase != before.phase:
            self.log.append(f"{self.tick}: {before.phase} -> {status.phase} ({status.reason})")
        if status.phase in (Phase.PROMOTING, Phase.PROMOTED) and status.template_hash:
            self.gated.add(status.template_hash)
        for entry, previous in self.entries(status, now):
            # A rollback begins with RollingBack, or with RolledBack when nothing needs rolling back.
            direct = entry.phase == Phase.ROLLED_BACK and (
                previous is None or previous.phase != Phase.ROLLING_BACK
            )
            if entry.reason != Reason.RESUMED and (entry.phase == Phase.ROLLING_BACK or direct):
                self.rollback_reason = entry.reason
        if status.phase == Phase.ROLLED_BACK and status.reason != self.rollback_reason:
            yield f"RolledBack with reason {status.reason}, the rollback began with {self.rollback_reason}"

    @staticmethod
    def entries(
        status: api.SpeculativeDeploymentStatus, now: datetime
    ) -> Iterator[tuple[api.HistoryEntry, api.HistoryEntry | None]]:
        """This reconcile's history entries, each with the one before it."""
        history = status.history
        for i, entry in enumerate(history):
            if entry.time == api.iso(now):
                yield entry, history[i - 1] if i else None

    def check_capacity(self) -> Iterator[str]:
        spec = self.valid
        ready = self.cluster.ready_serving(render.serving_selector(OWNER))
        broken = self.floor.check(ready, max(spec.replicas - spec.rollout.max_unavailable, 0))
        if broken:
            yield broken
        ungated = sum(
            n for t, n in self.cluster.ready_by_template(Track.CANARY.value).items() if t not in self.gated
        )
        canary = self.cluster.deployments.get(render.deployment_name(OWNER, Track.CANARY))
        rolling = canary is not None and kube.deployment_view(canary.body()).rolling
        share = spec.rollout.canary_replicas + (spec.rollout.max_surge if rolling else 0)
        if ungated > share:
            yield f"{ungated} Ready pods on ungated canary templates, the canary's share is {share}"

    # --- events ---

    def event(self) -> None:
        kind = self.rng.choices(list(EVENTS), weights=[weight for weight, _ in EVENTS.values()])[0]
        EVENTS[kind][1](self)

    def edit(self, change: Callable[[dict[str, Any]], object], what: str) -> None:
        change(self.raw)
        self.generation += 1
        self.log.append(f"{self.tick}: {what}")
        with contextlib.suppress(api.SpecError):  # Failed: the floor stays the last valid spec's
            self.valid = api.parse_spec(self.raw)

    def annotate(self, key: str, value: str | None) -> None:
        self.log.append(f"{self.tick}: annotation {key}={value}")
        if value is None:
            self.annotations.pop(key, None)
        else:
            self.annotations[key] = value

    def fault(self, what: str, hurt: Callable[[Any], None]) -> None:
        ready = [pod for pod in self.cluster.pods() if pod.ready]
        if ready:
            pod = self.rng.choice(ready)
            hurt(pod)
            self.log.append(f"{self.tick}: {what} {pod.name}")
            self.floor.lose_one()


def _image(h: History) -> None:
    image = f"vllm:{BROKEN_IMAGE}-{h.tick}" if h.rng.random() < 0.1 else f"vllm:{h.tick}"
    h.edit(lambda raw: raw.update(image=image), f"image {image}")


def _args(h: History) -> None:
    args = ["--max-num-seqs", str(h.rng.randint(8, 64))]
    h.edit(lambda raw: raw.update(vllmArgs=args), f"args {args}")


def _speculative(h: History) -> None:
    k = h.rng.randint(2, 6)
    h.edit(lambda raw: raw["speculative"].update(numSpeculativeTokens=k), f"numSpeculativeTokens {k}")


def _invalid(h: History) -> None:
    h.edit(lambda raw: raw["speculative"].update(numSpeculativeTokens=0), "invalid spec")
    h.fix_at = h.tick + h.rng.randint(2, 12)


def _pause(h: History) -> None:
    paused = not h.raw["rollout"].get("paused", False)
    h.edit(lambda raw: raw["rollout"].update(paused=paused), f"paused {paused}")


def _retry(h: History) -> None:
    retry = h.raw["rollout"].get("retry", 0) + 1
    h.edit(lambda raw: raw["rollout"].update(retry=retry), f"retry {retry}")


def _abort(h: History) -> None:
    h.annotate(api.ANNOTATION_ABORT, None if api.ANNOTATION_ABORT in h.annotations else str(h.tick))


def _hpa(h: History) -> None:
    replicas = h.rng.randint(1, 6)
    h.edit(lambda raw: raw.update(replicas=replicas), f"replicas {replicas}")


def _upgrade(h: History) -> None:
    h.operator_version += 1
    h.log.append(f"{h.tick}: operator upgrade {h.operator_version}")


def _crash(h: History) -> None:
    h.fault("crash", lambda pod: h.cluster.restart(pod, crash=True))


def _unready(h: History) -> None:
    h.fault("readiness probe fails", lambda pod: h.cluster.restart(pod, crash=False))


def _crash_loop(h: History) -> None:
    h.fault("CrashLoopBackOff", h.cluster.crash_loop)


def _metrics_lost(h: History) -> None:
    h.metrics_lost_until = h.tick + h.rng.randint(3, 20)
    h.log.append(f"{h.tick}: metrics lost until {h.metrics_lost_until}")


EVENTS: dict[str, tuple[float, Callable[[History], None]]] = {
    "image": (3, _image),
    "args": (1, _args),
    "speculative": (2, _speculative),
    "invalid": (1, _invalid),
    "pause": (2, _pause),
    "retry": (1, _retry),
    "abort": (1.5, _abort),
    "hpa": (2, _hpa),
    "upgrade": (2, _upgrade),
    "crash": (1, _crash),
    "unready": (1, _unready),
    "crash loop": (0.5, _crash_loop),
    "metrics": (1, _metrics_lost),
}


def seeds() -> list[int]:
    replay = os.environ.get("SPECGATE_FUZZ_SEED")
    return [int(replay)] if replay else list(range(HISTORIES))


def test_random_day2_histories_keep_the_safety_invariants(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("foreign_children", "delete_benchmark_jobs"):
        monkeypatch.setattr(kube, name, lambda *_, **__: [])
    monkeypatch.setattr(kube, "serves_pod_monitors", lambda: True)
    monkeypatch.setattr(kube, "_read_previous_log", lambda *_: "")
    original_labels = render.pod_labels
    for seed in seeds():
        history = History(seed)
        monkeypatch.setattr(kube, "apply", lambda manifest, _=None, h=history: h.cluster.apply(manifest))
        monkeypatch.setattr(
            kube, "scale_deployment", lambda _ns, name, n, _=None, h=history: h.cluster.scale(name, n)
        )
        monkeypatch.setattr(render, "pod_labels", history.pod_labels(original_labels))
        monkeypatch.setattr(handlers, "PrometheusClient", lambda _url, h=history: h)
        broken = next(history.run(), None)
        if broken is not None:
            trail = "\n".join(history.log[-60:])
            pytest.fail(
                f"seed {seed} (SPECGATE_FUZZ_SEED={seed} to replay), tick {history.tick}: {broken}\n{trail}"
            )
