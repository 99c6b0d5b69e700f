"""The operator's own /metrics: rollouts by phase and condition, verdicts by reason, time to verdict,
errors."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram, Info, start_http_server

from specgate import __version__
from specgate.api import Phase, parse_time
from specgate.conditions import RECONCILE_ERROR, TYPES
from specgate.rollout import Decision

ROLLOUT_PHASE = Gauge(
    "specgate_rollout_phase",
    "1 for the phase each SpeculativeDeployment is in, 0 for the others.",
    ["namespace", "name", "phase"],
)
PHASE_SINCE = Gauge(
    "specgate_phase_since_timestamp_seconds",
    "When each SpeculativeDeployment entered its phase (status.phaseSince; Analyzing: when its "
    "warm-up ends), Unix seconds.",
    ["namespace", "name"],
)
CONDITION = Gauge(
    "specgate_condition",
    "1 where a condition of each SpeculativeDeployment (Available, Degraded, ...) is True, 0 otherwise.",
    ["namespace", "name", "type"],
)
CANARY_ALPHA = Gauge(
    "specgate_canary_acceptance_ratio",
    "Latest measured alpha of the canary (accepted / draft tokens).",
    ["namespace", "name"],
)
ROUTE_WEIGHT = Gauge(
    "specgate_route_weight_percent",
    "router GatewayAPI: each track's percent of the route's rule, as specgate sets it (source desired) "
    "and as its Gateways accepted it (source accepted; absent until they have).",
    ["namespace", "name", "track", "source"],
)
BUILD_INFO = Info("specgate_build", "The operator's version.")
BUILD_INFO.info({"version": __version__})
DECISIONS = Counter(
    "specgate_decisions_total",
    "Phase changes by the phase entered and the reason (AcceptanceBelowGate, GuardTripped, ...).",
    ["phase", "reason"],
)
TIME_TO_VERDICT = Histogram(
    "specgate_time_to_verdict_seconds",
    "Seconds from the start of canary analysis to promotion or rollback.",
    buckets=(30, 60, 120, 300, 600, 900, 1800, 3600, 7200),
)
RECONCILE_SECONDS = Histogram(
    "specgate_reconcile_seconds",
    "Seconds one reconcile of one object took (observe, decide, apply).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter(
    "specgate_reconcile_errors_total", "Reconciles that raised an exception.", ["namespace", "name"]
)

_VERDICT_PHASES = {Phase.PROMOTING, Phase.ROLLING_BACK, Phase.ROLLED_BACK}


def serve(port: int) -> None:
    start_http_server(port)


def record(
    namespace: str, name: str, before: Phase, decision: Decision, analysis_seconds: float | None
) -> None:
    status = decision.status
    for phase in Phase:
        ROLLOUT_PHASE.labels(namespace, name, phase.value).set(1 if phase == status.phase else 0)
    since = parse_time(status.phase_since)
    if since is not None:
        PHASE_SINCE.labels(namespace, name).set(since.timestamp())
    for condition in status.conditions:
        CONDITION.labels(namespace, name, condition.type).set(1 if condition.status == "True" else 0)
    if status.canary is not None and status.canary.alpha is not None:
        CANARY_ALPHA.labels(namespace, name).set(status.canary.alpha)
    _record_route(namespace, name, decision)
    if status.phase != before:
        DECISIONS.labels(status.phase.value, status.reason or "").inc()
        if before == Phase.ANALYZING and status.phase in _VERDICT_PHASES and analysis_seconds is not None:
            TIME_TO_VERDICT.observe(analysis_seconds)


def _record_route(namespace: str, name: str, decision: Decision) -> None:
    """Desired and accepted weights, each series dropped while it is unknown (a stale accepted
    weight would hide a mismatch)."""
    traffic = decision.status.traffic
    for source in ("desired", "accepted"):
        weights = None if traffic is None else (traffic.desired if source == "desired" else traffic.actual)
        for track in ("baseline", "canary"):
            if weights is None:
                with contextlib.suppress(KeyError):
                    ROUTE_WEIGHT.remove(namespace, name, track, source)
            else:
                ROUTE_WEIGHT.labels(namespace, name, track, source).set(getattr(weights, track))


def forget(namespace: str, name: str) -> None:
    """Drop the series of a deleted object so dashboards do not show ghosts."""
    series = (
        [(ROLLOUT_PHASE, (namespace, name, p.value)) for p in Phase]
        + [(CONDITION, (namespace, name, t)) for t in (*TYPES, RECONCILE_ERROR)]
        + [(PHASE_SINCE, (namespace, name)), (CANARY_ALPHA, (namespace, name))]
        + [
            (ROUTE_WEIGHT, (namespace, name, t, s))
            for t in ("baseline", "canary")
            for s in ("desired", "accepted")
        ]
    )
    for metric, labels in series:
        with contextlib.suppress(KeyError):  # never recorded: nothing to drop
            metric.remove(*labels)
