"""What one reconcile observed of the world (children from the API server, figures from
Prometheus, benchmark Jobs), as plain values: kube.py and prometheus.py build them, rollout.decide
reads them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from specgate.capacity import ReplicaSetState
from specgate.gates import AcceptanceWindow, Histogram, Load
from specgate.traffic import Weights


@dataclass(frozen=True)
class TrackState:
    """A track's Deployment as the API server reports it."""

    exists: bool = False
    replicas: int = 0
    ready_replicas: int = 0
    failure: str | None = None  # a reason that needs a new spec, e.g. CrashLoopBackOff
    waiting: str | None = None  # a reason that may clear up, e.g. Unschedulable (progressDeadline bounds it)
    template_hash: str | None = None  # render.ANNOTATION_TEMPLATE of the Deployment
    rendered: str | None = None  # render.ANNOTATION_RENDERED: the pod template as last rendered
    rolling: bool = False  # its rolling update has pods of an older template still to replace
    # Ready pods on any of its templates: all serve behind the Service (None: ready_replicas).
    serving_ready: int | None = None
    replica_sets: tuple[ReplicaSetState, ...] = ()  # those with replicas; () where not watched

    def ready(self, want: int) -> bool:
        return self.exists and want > 0 and self.ready_replicas >= want

    @property
    def serving(self) -> int:
        """The Ready pods capacity counts: a rolling Deployment's old template still serves."""
        return self.ready_replicas if self.serving_ready is None else self.serving_ready


@dataclass(frozen=True)
class Workload:
    """The adopted Deployment as the API server reports it."""

    exists: bool = False
    replicas: int = 0
    ready: int = 0
    rolling: bool = False  # its own rolling update is under way (a GitOps edit of its template)
    pods: int | None = None  # its pods (status.replicas): a lowering its controller has not acted on yet

    @property
    def running(self) -> int:
        return self.replicas if self.pods is None else max(self.pods, self.replicas)


@dataclass(frozen=True)
class TrackMetrics:
    """One track's figures over the measurement window, from Prometheus."""

    acceptance: tuple[AcceptanceWindow, ...] = ()
    accepted_per_position: tuple[float, ...] = ()
    itl: Histogram | None = None  # per running request per engine step: the stall
    engine_steps: float | None = None  # the steps behind `itl` (None: not exported)
    per_token: Histogram | None = None  # per request: its time per output token
    # (window end, summed seconds, requests) of that histogram's sum and count per acceptance window
    per_token_windows: tuple[tuple[float, float, float], ...] = ()
    mean_itl_ms: float | None = None
    window_start: datetime | None = None  # the first scrape the figures count (or the window's start)
    window_end: datetime | None = None  # the last scrape they count; None: the time of the reading
    p99_ttft_ms: float | None = None
    per_token_latency_ms: float | None = None
    output_tokens_per_second: float | None = None
    requests_per_second: float | None = None
    concurrency: float | None = None
    load: Load | None = None
    scrape_interval_seconds: float | None = None
    acceptance_window_seconds: float | None = None


@dataclass(frozen=True)
class BenchmarkJob:
    """A track's benchmark Job as the API server reports it."""

    name: str
    exists: bool = False
    finished: bool = False
    failure: str | None = None  # the Job failed, or its pod cannot start
    report: str | None = None  # the pod's termination message: bench_driver's report
    start: datetime | None = None
    end: datetime | None = None


@dataclass(frozen=True)
class RouteState:
    """The HTTPRoute rule specgate weights (traffic.router GatewayAPI), as its Gateways report it."""

    weights: Weights | None = None  # the rule's shares once every Gateway accepted them; None: not yet
    hold: str | None = None  # why its traffic cannot be measured yet; None: accepted
    # Not accepted yet (hold set): the rule's shares as its spec has them; None: the rule does not
    # send traffic to the tracks' Services (a user's rule with its own backends, no route or rule).
    written: Weights | None = None
    # A user's rule staged for the tracks' InferencePools (render.stage_patch): its own backends carry
    # all its traffic, the pools are named beside them at weight 0 for their Gateways to accept.
    staged: bool = False

    @property
    def in_spec(self) -> Weights | None:
        """The rule's shares as its spec has them, accepted or not (None: not the tracks' Services)."""
        return self.weights if self.weights is not None else self.written

    @property
    def routes_tracks(self) -> bool:
        """Whether the rule sends traffic to the tracks' Services (so their weights may move)."""
        return self.in_spec is not None


@dataclass(frozen=True)
class Observation:
    generation: int
    baseline: TrackState = TrackState()
    canary: TrackState = TrackState()
    baseline_metrics: TrackMetrics | None = None
    canary_metrics: TrackMetrics | None = None
    metrics_error: str | None = None  # set when Prometheus failed or returned nothing usable
    baseline_job: BenchmarkJob | None = None
    canary_job: BenchmarkJob | None = None
    # The canary's spec-decode counters over its benchmark Job's time range (None: unavailable).
    canary_job_acceptance: tuple[AcceptanceWindow, ...] | None = None
    # Requests the canary finished over that range (None: unavailable): the Job's, unless others came.
    canary_job_requests: float | None = None
    abort: str | None = None  # the specgate.dev/abort annotation's value, when a person set it
    # The promoted config this rollout replaces: its spec-decode counters over its last hours in
    # windows of `incumbent_window_seconds`, read once per rollout (None: not read, or unreadable).
    incumbent_acceptance: tuple[AcceptanceWindow, ...] | None = None
    incumbent_window_seconds: float = 60.0
    incumbent_error: str | None = None  # why the incumbent's history could not be read
    # After promotion, the guard's history of the canary's counters in blocks of `guard_block_seconds`
    # (None: not read; its failure is metrics_error, as the guard's other metrics).
    guard_acceptance: tuple[AcceptanceWindow, ...] | None = None
    guard_block_seconds: float = 60.0
    route: RouteState | None = None  # traffic.router GatewayAPI only
    workload: Workload | None = None  # spec.workloadRef only: the adopted Deployment
    workload_autoscaler: str | None = None  # the HPA or KEDA ScaledObject scaling it (handover.autoscaler)


@dataclass(frozen=True)
class Window:
    """The time range the handler should measure for the current phase."""

    start: datetime
    end: datetime
