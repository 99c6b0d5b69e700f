"""Random day-2 histories, and the model that plays one: the real handlers.step tick by tick against
a fake cluster whose Deployments roll as the controller-manager rolls them (fake_cluster.py).

generate() draws a history up front, as data: a list of events (a spec edit as a JSON merge patch,
an annotation, a fault, an operator upgrade, metrics lost), each at a tick. The property test
(test_day2_property.py) plays thousands on the model; the cluster replay test
(tests/cluster/test_day2_replay.py) plays one on the real controller-manager and the model both.

Each tick of the model: the tick's events, then one reconcile, then the controllers and the
kubelet. Invariants checked every tick (DESIGN.md, section 2):
- Ready serving pods never below `replicas - maxUnavailable` once reached. The floor is the
  rollout's own: of the current valid spec; a replicas change lowers it at once and raises it only
  as Ready pods reach it (scaling itself is allowed), and a fault (a crash, a failed probe, a
  deleted pod) lowers it by the pod it took until a newly Ready pod makes up for it (tests/floor.py).
- Never more Ready pods on canary templates that no gate passed than the canary's share
  (canaryReplicas, plus maxSurge while the canary Deployment itself rolls).
- A rollback resumed after a failed spec ends with the reason it began with (RouteNotAccepted may
  stand in while its last pods wait for the Gateway).
- Through an owned HTTPRoute (router GatewayAPI, a floor above 0): no new weight written on a track
  without Ready pods, no track's last Ready pods taken while the Gateway sends it traffic, and a
  track that lost its pods loses its weight within STALE_WEIGHT_TICKS reconciles.
- A reconcile never raises (issue 61: a measurement switched mid-analysis raised on every tick).

Besides the images, drafts, pauses, retries, aborts and replicas of day 2, the histories edit
maxSurge and maxUnavailable (the fake cluster scales a mid-roll Deployment proportionally, as
Kubernetes does), rollout.measurement, the router (Service or an owned HTTPRoute, which a fake
Gateway accepts some ticks late: fake_gateway.py), the strategy, the K schedule and the gates, in
every phase; benchmark Jobs run for a minute and report the canary's alpha, as Prometheus reads it
over the Job.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from tests.floor import Floor
from tests.unit.fake_cluster import BROKEN_IMAGE, FakeCluster, Pod
from tests.unit.fake_gateway import FakeGateway
from tests.unit.rollout_driver import T0, metrics, spec_body

from specgate import api, handlers, kube, render
from specgate.api import Phase
from specgate.gates import AcceptanceWindow
from specgate.observation import BenchmarkJob, TrackMetrics, TrackState
from specgate.prometheus import MetricsUnavailable, Selector
from specgate.render import Owner, Track
from specgate.rollout import Reason

TICKS = 250
TICK_SECONDS = 10
EVENT_RATE = 0.1  # the chance of an event in a tick
OWNER = Owner(name="llama", namespace="ml", uid="u-1")
UPGRADE_LABEL = "specgate.dev/fake-operator-version"  # what an operator upgrade renders differently
FAULTS = frozenset({"crash", "unready", "crash loop", "delete"})  # each takes one Ready pod
JOB_TICKS = 6  # a benchmark Job's run
STALE_WEIGHT_TICKS = 2  # the reconcile that sees a track lose its pods; one more where the watch lags

T = TypeVar("T")
Patch = dict[str, Any]  # a JSON merge patch (RFC 7386): what `kubectl patch --type merge` sends


@dataclass(frozen=True)
class Event:
    """One thing that happens to the object or its pods, at the start of a tick."""

    tick: int
    kind: str
    spec: Patch | None = None  # a spec edit
    annotations: dict[str, str | None] | None = None  # None: remove the annotation
    pick: float = 0.0  # a fault's pod: this fraction into the Ready serving pods sorted by name
    lasts: int = 0  # ticks that metrics stay lost

    def describe(self) -> str:
        what = self.spec or self.annotations or (f"{self.lasts} ticks" if self.lasts else "")
        return f"{self.tick}: {self.kind} {what}".rstrip()


@dataclass(frozen=True)
class Generated:
    seed: int
    spec: dict[str, Any]  # the object's first spec
    events: tuple[Event, ...]

    def specs(self) -> Iterator[dict[str, Any]]:
        """The spec after each event (unchanged by events that are not edits)."""
        raw = copy.deepcopy(self.spec)
        for event in self.events:
            merge_patch(raw, event.spec or {})
            yield raw


def merge_patch(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Apply a JSON merge patch in place, as the API server does: objects merge, None removes."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


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
class _Drawing:
    """The state a history's next event depends on while it is drawn."""

    rng: random.Random
    tick: int
    raw: dict[str, Any]
    annotations: dict[str, str]

    def edit(self, kind: str, patch: Patch) -> Event:
        merge_patch(self.raw, patch)
        return Event(self.tick, kind, spec=patch)


def _image(d: _Drawing) -> Event:
    image = f"vllm:{BROKEN_IMAGE}-{d.tick}" if d.rng.random() < 0.1 else f"vllm:{d.tick}"
    return d.edit("image", {"image": image})


def _args(d: _Drawing) -> Event:
    return d.edit("args", {"vllmArgs": ["--max-num-seqs", str(d.rng.randint(8, 64))]})


def _speculative(d: _Drawing) -> Event:
    return d.edit("speculative", {"speculative": {"numSpeculativeTokens": d.rng.randint(2, 6)}})


def _invalid(d: _Drawing) -> Event:
    return d.edit("invalid", {"speculative": {"numSpeculativeTokens": 0}})


def _pause(d: _Drawing) -> Event:
    return d.edit("pause", {"rollout": {"paused": not d.raw["rollout"].get("paused", False)}})


def _retry(d: _Drawing) -> Event:
    return d.edit("retry", {"rollout": {"retry": d.raw["rollout"].get("retry", 0) + 1}})


def _abort(d: _Drawing) -> Event:
    value = None if api.ANNOTATION_ABORT in d.annotations else str(d.tick)
    merge_patch(d.annotations, {api.ANNOTATION_ABORT: value})
    return Event(d.tick, "abort", annotations={api.ANNOTATION_ABORT: value})


def _hpa(d: _Drawing) -> Event:
    return d.edit("hpa", {"replicas": d.rng.randint(1, 6)})


def _budget(d: _Drawing) -> Event:
    """maxSurge and maxUnavailable, together (both 0 is refused at admission)."""
    surge, unavailable = d.rng.choice([(0, 1), (1, 0), (1, 1), (0, 2), (2, 0), (2, 1), (3, 0), (3, 1)])
    return d.edit("budget", {"rollout": {"maxSurge": surge, "maxUnavailable": unavailable}})


def _measurement(d: _Drawing) -> Event:
    current = d.raw["rollout"].get("measurement", "traffic")
    mode = d.rng.choice([m for m in ("traffic", "benchmark", "both") if m != current])
    return d.edit("measurement", {"rollout": {"measurement": mode}})


ROUTED = {"router": "GatewayAPI", "httpRoute": {"parentRefs": [{"name": "inference", "namespace": "gw"}]}}


def _router(d: _Drawing) -> Event:
    """Service <-> an owned HTTPRoute (the Gateway accepts it some ticks later: fake_gateway.py)."""
    routed = d.raw["rollout"].get("traffic", {}).get("router") == "GatewayAPI"
    traffic = {"router": "Service", "httpRoute": None} if routed else ROUTED
    return d.edit("router", {"rollout": {"traffic": traffic}})


def _strategy(d: _Drawing) -> Event:
    """canary <-> sequential (refused beside router GatewayAPI: Failed until the next edit fixes it)."""
    current = d.raw["rollout"].get("strategy", "canary")
    return d.edit("strategy", {"rollout": {"strategy": "sequential" if current == "canary" else "canary"}})


def _schedule(d: _Drawing) -> Event:
    """A K schedule per batch size: explicit ranges, Auto (the cost model's), or none."""
    k = max(d.raw.get("speculative", {}).get("numSpeculativeTokens", 3), 1)
    ranges = [
        {"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": k},
        {"minBatchSize": 9, "maxBatchSize": 256, "numSpeculativeTokens": d.rng.randint(1, k)},
    ]
    choice = d.rng.choice(["ranges", "auto", "none"])
    speculative = {
        "ranges": {
            "numSpeculativeTokensPerBatchSize": ranges,
            "numSpeculativeTokensPerBatchSizePolicy": None,
        },
        "auto": {"numSpeculativeTokensPerBatchSize": None, "numSpeculativeTokensPerBatchSizePolicy": "Auto"},
        "none": {"numSpeculativeTokensPerBatchSize": None, "numSpeculativeTokensPerBatchSizePolicy": None},
    }[choice]
    return d.edit("schedule", {"speculative": speculative})


def _gates(d: _Drawing) -> Event:
    """The gates' thresholds and policies (the canary's alpha is 0.8 or 0.3: some edits flip a verdict)."""
    gates = {
        "minAcceptanceRate": d.rng.choice([0.25, 0.55, 0.7, 0.9]),
        "minAcceptanceRatePolicy": d.rng.choice(["Fixed", "BreakEven"]),
        "maxP99PerTokenRegression": d.rng.choice([0.05, 0.1, 1.0]),
        "minSpeedup": d.rng.choice([0.5, 1.0, 1.2]),
    }
    return d.edit("gates", {"rollout": {"gates": gates}})


def _fault(kind: str) -> Callable[[_Drawing], Event]:
    return lambda d: Event(d.tick, kind, pick=d.rng.random())


# Each kind's weight and how it is drawn.
EVENTS: dict[str, tuple[float, Callable[[_Drawing], Event]]] = {
    "image": (3, _image),
    "args": (1, _args),
    "speculative": (2, _speculative),
    "invalid": (1, _invalid),
    "pause": (2, _pause),
    "retry": (1, _retry),
    "abort": (1.5, _abort),
    "hpa": (2, _hpa),
    "upgrade": (2, lambda d: Event(d.tick, "upgrade")),
    "crash": (1, _fault("crash")),
    "unready": (1, _fault("unready")),
    "crash loop": (0.5, _fault("crash loop")),
    "delete": (1, _fault("delete")),
    "metrics": (1, lambda d: Event(d.tick, "metrics", lasts=d.rng.randint(3, 20))),
    "budget": (2, _budget),
    "measurement": (1.5, _measurement),
    "router": (1.5, _router),
    "strategy": (1, _strategy),
    "schedule": (1, _schedule),
    "gates": (1, _gates),
}


def generate(
    seed: int, ticks: int = TICKS, kinds: Sequence[str] = tuple(EVENTS), rate: float = EVENT_RATE
) -> Generated:
    """A random history of `ticks` ticks, an event of `kinds` in a tick with chance `rate`. An invalid
    spec is fixed (a valid draft length) 2-12 ticks later."""
    rng = random.Random(seed)
    drawing = _Drawing(rng, 0, first_spec(rng), {})
    spec = copy.deepcopy(drawing.raw)
    weights = [EVENTS[kind][0] for kind in kinds]
    events: list[Event] = []
    fix_at: int | None = None
    for drawing.tick in range(ticks):
        if rng.random() < rate:
            kind = rng.choices(list(kinds), weights)[0]
            events.append(EVENTS[kind][1](drawing))
            fix_at = drawing.tick + rng.randint(2, 12) if kind == "invalid" else fix_at
        if fix_at == drawing.tick:
            events.append(drawing.edit("fix", {"speculative": {"numSpeculativeTokens": 4}}))
    return Generated(seed, spec, tuple(events))


@dataclass
class History:
    """A generated history played on the model: the object as the API server holds it, and the
    fake cluster (its own random stream: pods Ready 1-3 ticks after creation, controller lag)."""

    generated: Generated
    ticks: int = TICKS
    # None: the events' ticks count from the first. n: from the first tick with n Ready serving pods
    # (the replay: a history of day 2 begins once the baseline serves, on the model as on the lab).
    begin_at_ready: int | None = None
    began: int | None = None  # the tick the events' tick 0 is
    # True: the watches' cache handlers.step gets is a tick behind the cluster (a loaded API server's
    # watch lagging), while kube.track_state_now reads the cluster as it is
    watch_lags: bool = False
    watched: kube.Children | None = None  # the cluster as the last tick's reconcile saw it
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
    alpha: dict[str, float] = field(default_factory=dict)  # by canary template
    gated: set[str] = field(default_factory=set)  # canary templates a gate passed
    floor: Floor = field(default_factory=Floor)
    min_ready: int | None = None  # the fewest Ready serving pods once the floor was reached and began
    floors: set[int] = field(default_factory=set)  # every floor in force
    rollback_reason: str | None = None
    jobs: dict[str, int] = field(default_factory=dict)  # benchmark Jobs by name: the tick each was made
    ungated_allowed: int = 0  # Ready pods on ungated canary templates allowed now (check_capacity)
    stale_weight: dict[Track, int] = field(default_factory=dict)  # ticks a track's weight outlived its pods
    route_problems: list[str] = field(default_factory=list)  # found while the reconcile wrote the route
    log: list[str] = field(default_factory=list)
    gateway: FakeGateway = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(f"cluster-{self.generated.seed}")
        self.cluster = FakeCluster(self.rng)
        self.gateway = FakeGateway(random.Random(f"gateway-{self.generated.seed}"))
        self.raw = copy.deepcopy(self.generated.spec)
        self.valid = api.parse_spec(self.raw)

    # --- the seams handlers.step reads and writes through ---

    @contextlib.contextmanager
    def wired(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[History]:
        """handlers.step writing to this history's fake cluster and reading its metrics."""
        with monkeypatch.context() as patch:
            for name in ("foreign_children", "delete_benchmark_jobs"):
                patch.setattr(kube, name, lambda *_, **__: [])
            patch.setattr(kube, "serves_pod_monitors", lambda: True)
            patch.setattr(kube, "_read_previous_log", lambda *_: "")
            patch.setattr(kube, "apply", lambda manifest, _=None: self.apply(manifest))
            patch.setattr(kube, "benchmark_job", lambda _owner, name: self.benchmark_job(name))
            patch.setattr(kube, "scale_deployment", self.scale_deployment)
            patch.setattr(kube, "track_state_now", self.track_state_now)
            patch.setattr(kube, "serves_http_routes", lambda: True)
            patch.setattr(kube, "read_route", lambda _ns, name: self.gateway.read(name))
            patch.setattr(kube, "patch_route", lambda _ns, name, ops: self.gateway.patch(name, ops))
            patch.setattr(render, "pod_labels", self.pod_labels(render.pod_labels))
            patch.setattr(handlers, "PrometheusClient", lambda _url: self)
            yield self

    def scale_deployment(
        self, namespace: str, name: str, replicas: int, children: kube.Children | None = None
    ) -> None:
        """As kube.scale_deployment: no request where the watched Deployment has these replicas
        already (with the watch lagging, the cluster's may differ: the write it would undo is not sent)."""
        dep = (children or kube.Children()).deployment(namespace, name)
        if dep is None or dep.replicas != replicas:
            self.cluster.scale(name, replicas)

    def track_state_now(self, namespace: str, name: str, selector: dict[str, str]) -> TrackState:
        """The fake cluster as it is now (what the step's children also show: no watch lags here)."""
        return kube.track_state(self.cluster.children(), namespace, name, selector)

    def pod_labels(self, original: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
        def labels(*args: Any) -> dict[str, str]:
            return {**original(*args), UPGRADE_LABEL: str(self.operator_version)}

        return labels

    def apply(self, manifest: dict[str, Any]) -> None:
        """A benchmark Job starts running; the rest is the cluster's."""
        if manifest["kind"] == "Job":
            self.jobs.setdefault(manifest["metadata"]["name"], self.tick)
        elif manifest["kind"] == "HTTPRoute":
            self.check_written_route(manifest)
            self.gateway.apply(manifest)
        else:
            self.cluster.apply(manifest)

    def now_at(self, tick: int) -> datetime:
        return T0 + timedelta(seconds=TICK_SECONDS * tick)

    def canary_alpha(self) -> float:
        """The alpha of the config the canary runs: good (0.8) three times in four, else 0.3."""
        canary = self.cluster.deployments.get(render.deployment_name(OWNER, Track.CANARY))
        template = canary.manifest["metadata"]["annotations"][render.ANNOTATION_TEMPLATE] if canary else ""
        return self.alpha.setdefault(template, 0.8 if self.rng.random() < 0.75 else 0.3)

    def benchmark_job(self, name: str) -> BenchmarkJob:
        """A Job runs JOB_TICKS, then reports every point: the canary a little faster per token,
        with its config's alpha (the driver's figure; the gate reads job_windows')."""
        made = self.jobs.get(name)
        if made is None:
            return BenchmarkJob(name)
        if self.tick < made + JOB_TICKS:
            return BenchmarkJob(name, exists=True, start=self.now_at(made))
        canary = f"-bench-{Track.CANARY.value}-" in name
        rate = {"acceptance_rate_percent": self.canary_alpha() * 100, "drafts": 400} if canary else {}
        points = [
            {"concurrency": c, "completed": 50, "failed": 0, "p99_itl_ms": 21.0, "mean_itl_ms": 10.0,
             "p99_tpot_ms": 15.0, "mean_tpot_ms": 9.0 if canary else 10.0, "p99_ttft_ms": 80.0,
             "output_throughput": 100.0, **rate}
            for c in self.valid.rollout.benchmark.concurrency
        ]  # fmt: skip
        report = json.dumps({"points": points})
        end = self.now_at(made + JOB_TICKS)
        return BenchmarkJob(name, exists=True, finished=True, report=report, start=self.now_at(made), end=end)

    def job_windows(self, sel: Selector, *_: Any) -> tuple[tuple[AcceptanceWindow, ...], float]:
        """The canary's counters over its Job: its config's alpha, and only the Job's requests."""
        if self.tick < self.metrics_lost_until:
            raise MetricsUnavailable("Prometheus query failed: connection refused")
        alpha = self.canary_alpha()
        return tuple(AcceptanceWindow(100, 300, 300 * alpha) for _ in range(6)), 50.0 * len(
            self.valid.rollout.benchmark.concurrency
        )

    def track_metrics(self, sel: Selector, *_: Any) -> TrackMetrics:
        if self.tick < self.metrics_lost_until:
            raise MetricsUnavailable("Prometheus query failed: connection refused")
        if sel.track == Track.BASELINE.value:
            return metrics()
        return metrics(self.canary_alpha())

    def history_windows(self, sel: Selector, *_: Any) -> tuple[tuple[AcceptanceWindow, ...], float]:
        """The replaced promoted config's hours (read once per re-rollout): a steady mix, or lost."""
        if self.tick < self.metrics_lost_until:
            raise MetricsUnavailable("Prometheus query failed: connection refused")
        return tuple(AcceptanceWindow(0.0, 4000.0, 3200.0, end=60.0 * i) for i in range(1, 241)), 60.0

    # --- one tick ---

    def run(self) -> Iterator[str]:
        """The invariants each tick breaks, described."""
        by_tick: dict[int, list[Event]] = {}
        for event in self.generated.events:
            by_tick.setdefault(event.tick, []).append(event)
        serving = render.serving_selector(OWNER)
        for tick in range(self.ticks):
            self.tick = tick
            if self.began is None and self.cluster.ready_serving(serving) >= (self.begin_at_ready or 0):
                self.began = tick
            for event in by_tick.get(tick - self.began, []) if self.began is not None else []:
                self.happen(event)
            yield from self.reconcile()
            yield from self.route_problems
            self.route_problems.clear()
            self.log.append(f"{self.tick}: after reconcile {self.cluster.describe()}")
            before = self.ready_by_track()
            self.cluster.advance()
            yield from self.check_pods_under_route(before)
            self.gateway.tick()
            yield from self.check_capacity()
            yield from self.check_weights_follow_pods()
            self.cluster.kubelet()

    def reconcile(self) -> Iterator[str]:
        now = T0 + timedelta(seconds=TICK_SECONDS * self.tick)
        before = self.status
        children = self.cluster.children()
        if self.watch_lags:
            children, self.watched = self.watched or children, children
        try:
            decision = handlers.step(
                copy.deepcopy(self.raw), before, OWNER, self.generation, now, dict(self.annotations), children
            )
        except Exception as error:  # a reconcile that raises never converges (issue 61)
            self.log.append(traceback.format_exc(limit=-4))
            yield f"reconcile raised {type(error).__name__}: {error} (phase {before.phase.value})"
            return
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
        # RouteNotAccepted stands in while a last pod waits for the Gateway (rollout._reason_entered_with).
        if status.phase == Phase.ROLLED_BACK and status.reason not in (
            self.rollback_reason,
            Reason.ROUTE_NOT_ACCEPTED,
        ):
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
        target = max(spec.replicas - spec.rollout.max_unavailable, 0)
        self.floors.add(target)
        broken = self.floor.check(ready, target)
        if broken:
            yield broken
        if self.floor.protected and self.began is not None:  # as the cluster's CapacityMonitor counts it
            self.min_ready = ready if self.min_ready is None else min(self.min_ready, ready)
        ungated = sum(
            n for t, n in self.cluster.ready_by_template(Track.CANARY.value).items() if t not in self.gated
        )
        canary = self.cluster.deployments.get(render.deployment_name(OWNER, Track.CANARY))
        rolling = canary is not None and kube.deployment_view(canary.body()).rolling
        # Strategy sequential serves the canary on every pod while it is measured: the user's choice.
        sequential = spec.rollout.strategy == api.Strategy.SEQUENTIAL
        canary_share = spec.replicas if sequential else spec.rollout.canary_replicas
        share = canary_share + (spec.rollout.max_surge if rolling else 0)
        # A share lowered by an edit (sequential -> canary, replicas lowered) is reached as the
        # controller removes the canary's pods (the floor first): until then they may only go down.
        pods = sum(len(rs.pods) for rs in canary.replica_sets.values()) if canary is not None else 0
        self.ungated_allowed = max(share, min(self.ungated_allowed, pods))
        if ungated > self.ungated_allowed:
            yield f"{ungated} Ready pods on ungated canary templates, the canary's share is {share}"

    def guarded(self) -> bool:
        """Whether the spec in force lets not every pod go (a floor of 0 lets a route's too)."""
        return self.valid.replicas - self.valid.rollout.max_unavailable > 0

    def routed(self) -> bool:
        """Whether the spec in force weights the owned HTTPRoute (router GatewayAPI), guarded. Router
        Service: specgate points the route at Service <name> and stops weighting it."""
        traffic = self.valid.rollout.traffic
        return traffic is not None and traffic.router == api.Router.GATEWAY_API and self.guarded()

    def ready_by_track(self) -> dict[Track, int]:
        serving = render.serving_selector(OWNER)
        return {t: self.cluster.ready_serving({**serving, render.LABEL_TRACK: t.value}) for t in Track}

    def check_pods_under_route(self, before: Mapping[Track, int]) -> Iterator[str]:
        """The controllers' step (advance) performs specgate's scale-downs and template rolls: none
        may take a track's last Ready pods while the Gateway still sends it traffic (a router switched
        to Service included: the Gateway serves the old weights until it accepts the route pointed at
        Service <name>)."""
        if not self.guarded():
            return
        served, after = self.gateway.served_backends(OWNER.name), self.ready_by_track()
        for track in Track:
            weight = served.get(render.service_name(OWNER, track), 0)
            if weight and before[track] and not after[track]:
                share = f"{weight} of {sum(served.values())}"
                yield f"the {track.value}'s last Ready pods went while the Gateway sends it {share}"

    def check_weights_follow_pods(self) -> Iterator[str]:
        """The weights specgate writes leave a track without Ready pods beside one with them within
        STALE_WEIGHT_TICKS reconciles (a fault's pod, a crash loop: in every phase)."""
        written, ready = self.gateway.written_backends(OWNER.name), self.ready_by_track()
        for track in Track:
            other = Track.CANARY if track is Track.BASELINE else Track.BASELINE
            weight = written.get(render.service_name(OWNER, track), 0)
            stale = self.routed() and weight > 0 and not ready[track] and ready[other] > 0
            self.stale_weight[track] = self.stale_weight.get(track, 0) + 1 if stale else 0
            if self.stale_weight[track] > STALE_WEIGHT_TICKS:
                yield f"the route gives the {track.value} {weight} with no Ready pod, beside {ready[other]}"

    def check_written_route(self, manifest: Mapping[str, Any]) -> None:
        """A route specgate writes puts no new weight on a track without Ready pods (DESIGN.md 2)."""
        if not self.routed():
            return
        before = self.gateway.written_backends(manifest["metadata"]["name"])
        after, ready = FakeGateway.backends(manifest["spec"]), self.ready_by_track()
        for track in Track:
            service = render.service_name(OWNER, track)
            if after.get(service) and not before.get(service) and not ready[track]:
                self.route_problems.append(
                    f"the route was written with weight on {service}, which has no Ready pod"
                )

    # --- events ---

    def happen(self, event: Event) -> None:
        self.log.append(event.describe())
        if event.spec is not None:
            merge_patch(self.raw, event.spec)
            self.generation += 1
            with contextlib.suppress(api.SpecError):  # Failed: the floor stays the last valid spec's
                self.valid = api.parse_spec(self.raw)
        if event.annotations is not None:
            merge_patch(self.annotations, event.annotations)
        if event.kind == "upgrade":
            self.operator_version += 1
        elif event.kind == "metrics":
            self.metrics_lost_until = self.tick + event.lasts
        elif event.kind in FAULTS:
            self.fault(event)

    def fault(self, event: Event) -> None:
        ready = sorted((p for p in self.cluster.pods() if p.ready and self._serving(p)), key=lambda p: p.name)
        if not ready:
            return
        pod = pick(ready, event.pick)
        hurt: dict[str, Callable[[Pod], None]] = {
            "crash": lambda p: self.cluster.restart(p, crash=True),
            "unready": lambda p: self.cluster.restart(p, crash=False),
            "crash loop": self.cluster.crash_loop,
            "delete": self.cluster.delete,
        }
        hurt[event.kind](pod)
        self.log.append(f"{self.tick}: {event.kind} took {pod.name}")
        self.floor.lose_one()

    @staticmethod
    def _serving(pod: Pod) -> bool:
        labels: dict[str, str] = pod.template["metadata"]["labels"]
        return render.serving_selector(OWNER).items() <= labels.items()


def pick(ready: Sequence[T], fraction: float) -> T:
    """The pod a fault takes: `fraction` into the Ready serving pods sorted by name."""
    return ready[min(int(fraction * len(ready)), len(ready) - 1)]


# The history tests/cluster/test_day2_replay.py plays on the lab. The lab performs edits, pause,
# retry, abort, replicas changes, pod deletions and engine kills (a killed engine shows
# CrashLoopBackOff until its restart is Ready: the model's crash loop, not its plain crash); not an
# operator upgrade (it needs the operator stopped), metrics loss (the lab's Prometheus is shared), a
# failed readiness probe alone, nor an invalid spec (the CRD refuses numSpeculativeTokens 0 before
# the operator sees it). Seed 16: replicas 4, canaryReplicas 2, maxSurge 0, maxUnavailable 2 (no
# spare GPU), replicas 4 -> 6, a new vLLM argument, a pause, a pod deleted while paused, a new draft
# length, unpaused, replicas 6 again; 40 ticks of events, then the model runs to REPLAY_MODEL_TICKS.
LAB_KINDS = ("image", "args", "speculative", "pause", "retry", "abort", "hpa", "crash loop", "delete")
REPLAY_SEED = 16
REPLAY_TICKS = 40
REPLAY_RATE = 0.2
REPLAY_MODEL_TICKS = 120  # the events' 40 ticks, then time for the rollout they leave to settle


def replay_history() -> Generated:
    return generate(REPLAY_SEED, REPLAY_TICKS, LAB_KINDS, REPLAY_RATE)


def lab_problems(generated: Generated) -> list[str]:
    """Why the lab could not play the history as the model does (empty: it can)."""
    problems = []
    for event, raw in zip(generated.events, generated.specs(), strict=True):
        if BROKEN_IMAGE in str((event.spec or {}).get("image", "")):
            problems.append(f"{event.describe()}: the lab's engines ignore the image")
        try:
            api.parse_spec(raw)
        except api.SpecError as error:  # the CRD's rules are parse_spec's: the API server refuses it
            problems.append(f"{event.describe()}: refused at admission ({error})")
    return problems
