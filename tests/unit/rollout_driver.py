"""Drives rollout.decide() through time with scripted observations: the unit tests' spec, track
metrics and readiness, and a Run that keeps status between steps. Shared by the rollout, handler,
guard and request tests (a helper module, not a test module, so that no test is collected twice)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from specgate import api, rollout
from specgate.api import Phase
from specgate.gates import AcceptanceWindow, Histogram, Load
from specgate.observation import Observation, TrackMetrics, TrackState
from specgate.rollout import Decision

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, math.inf)


def spec_body(**rollout_fields: Any) -> dict[str, Any]:
    """The unit tests' spec: short stages, small minimum samples; `rollout_fields` override."""
    return {
        "model": {"name": "m"},
        "image": "vllm",
        "replicas": 2,
        "speculative": {"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 4},
        "rollout": {
            "warmup": "30s",
            "analysisWindow": "60s",
            "maxAnalysisDuration": "10m",
            "progressDeadline": "5m",
            "metricsUnavailableBudget": "2m",
            "gates": {"minDrafts": 100, "minLatencySamples": 50},
            **rollout_fields,
        },
    }


def make_spec(**rollout_fields: Any) -> api.SpeculativeDeploymentSpec:
    return api.parse_spec(spec_body(**rollout_fields))


def itl(typical_seconds: float, count: float = 100_000) -> Histogram:
    """A histogram whose mass sits in the bucket of typical_seconds (1 % spills one bucket higher)."""
    i = next(i for i, b in enumerate(ITL_BOUNDS) if typical_seconds <= b)
    cumulative = [0.0 if j < i else (0.985 * count if j == i else count) for j in range(len(ITL_BOUNDS))]
    return Histogram(bounds=ITL_BOUNDS, counts=tuple(cumulative))


def metrics(
    alpha: float | None = None,
    latency: float = 0.04,
    windows: int = 20,
    per_token: float = 0.03,
    load: float = 2.0,
    pace: float | None = None,
) -> TrackMetrics:
    """A track's figures; `pace`: its mean seconds per output token in each of its windows (the
    speedup gate's sum over count), by default 0.030 without alpha (a baseline) and 0.024 with
    (a canary 1.25x faster per token), 30 requests a window."""
    acceptance: tuple[AcceptanceWindow, ...] = ()
    per_position: tuple[float, ...] = ()
    if alpha is not None:
        acceptance = tuple(AcceptanceWindow(50, 200, 200 * alpha) for _ in range(windows))
        per_position = tuple(50 * windows * alpha ** (i + 1) for i in range(4))
    pace = pace if pace is not None else (0.030 if alpha is None else 0.024)
    return TrackMetrics(
        per_token_windows=tuple((15.0 * (i + 1), 30 * pace, 30.0) for i in range(windows)),
        acceptance=acceptance,
        accepted_per_position=per_position,
        itl=itl(latency),
        engine_steps=25_000.0,  # vllm:iteration_tokens_total's count: the ITL's 100,000 samples at 4 running
        per_token=itl(per_token),
        p99_ttft_ms=120.0,
        per_token_latency_ms=30.0,
        output_tokens_per_second=250.0,
        requests_per_second=load,
        concurrency=4.0,
        load=Load(pods=1, requests_per_second_per_pod=load, running_per_pod=4.0 * load / 2),
    )


def collapsed() -> TrackMetrics:
    """A promoted canary's alpha fallen to 0.2 for 30 minutes of 15 s windows: enough for the guard
    to trip in its first hour, when its spread is the rollout's fallback drift (0.09 over 3 min)."""
    return metrics(0.2, windows=120)


def ready(n: int) -> TrackState:
    return TrackState(exists=True, replicas=n, ready_replicas=n)


class Run:
    """Feeds decide() one observation at a time, keeping status and the children it asked for."""

    def __init__(self, spec: api.SpeculativeDeploymentSpec | None = None) -> None:
        self.spec = spec or make_spec()
        self.status = api.SpeculativeDeploymentStatus()
        self.now = T0
        self.generation = 1
        self.last: Decision | None = None

    def step(self, after: float = 10, **obs: Any) -> Decision:
        self.now += timedelta(seconds=after)
        canary_metrics = obs.get("canary_metrics")
        if self.phase == Phase.PROMOTED and canary_metrics is not None and "guard_acceptance" not in obs:
            # The handler reads the guard's history from the same Prometheus: the same windows here.
            obs["guard_acceptance"] = canary_metrics.acceptance
            obs["guard_block_seconds"] = canary_metrics.acceptance_window_seconds or 15.0
        observation = Observation(generation=self.generation, **obs)
        decision = rollout.decide(self.spec, self.status, observation, self.now)
        self.status, self.last = decision.status, decision
        if rollout.routes_by_weight(self.spec):  # status.traffic, as handlers.step writes it
            recorded = self.status.traffic
            route = rollout.traffic_status("route", decision, observation, None, recorded, self.now)
            self.status = self.status.model_copy(update={"traffic": route})
        return decision

    @property
    def phase(self) -> Phase:
        return self.status.phase

    def expect(self, phase: Phase) -> None:
        """Assert the phase (a method, so that mypy does not narrow run.phase across steps)."""
        assert self.phase == phase, self.status.message

    def to_canary(self) -> None:
        self.step(baseline=ready(2))
        self.step(baseline=ready(2))  # Ready seen: warm-up starts
        self.step(after=95, baseline=ready(2), baseline_metrics=metrics())
        assert self.phase == Phase.CANARY, self.status.message

    def to_analyzing(self) -> None:
        self.to_canary()
        self.step(baseline=ready(1), canary=ready(1))
        assert self.phase == Phase.ANALYZING
        self.now += timedelta(seconds=30)  # warm-up of the canary

    def to_promoted(self) -> None:
        self.to_analyzing()
        self.step(
            after=70,
            baseline=ready(1),
            canary=ready(1),
            baseline_metrics=metrics(),
            canary_metrics=metrics(0.8),
        )
        assert self.phase == Phase.PROMOTING, self.status.message
        self.step(baseline=ready(1), canary=ready(2))
        self.expect(Phase.PROMOTED)


def edit(run: Run, **rollout_fields: Any) -> None:
    """What the API server does on any spec edit: a new spec and generation + 1."""
    raw = run.spec.model_dump(by_alias=True, mode="json")
    for key, value in rollout_fields.items():
        target = raw if key in ("replicas", "speculative") else raw["rollout"]
        target[key] = value
    run.spec = api.parse_spec(raw)
    run.generation += 1


# A rollout that replaces a promoted config (issue 37): shared by the rollout and handler tests.


def steady_history(hours: float = 4.0, alpha: float = 0.7) -> tuple[AcceptanceWindow, ...]:
    """What Prometheus returns for a promoted config whose mix did not move: 60 s blocks, one alpha."""
    return tuple(
        AcceptanceWindow(0.0, 4000.0, 4000.0 * alpha, end=60.0 * (i + 1)) for i in range(int(hours * 60))
    )


def to_rerollout(run: Run) -> datetime:
    """Promoted, serving for 13 h, then a new config: the new rollout's Analyzing phase, with its
    start as the incumbent's end (returned)."""
    run.to_promoted()
    run.step(after=13 * 3600, canary=ready(2), canary_metrics=metrics(0.8))
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    run.step(baseline=TrackState(exists=True), canary=ready(2))
    began = run.now
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    run.to_analyzing()
    return began


NEAR_GATE = metrics(0.62, windows=12)  # three minutes at 0.62: a Pass on a steady mix, not under 0.09


def first_rerollout_look(run: Run, after: float) -> None:
    """The re-rollout's first look at NEAR_GATE, reading the promoted config's steady 4 h history."""
    run.step(
        after=after,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=metrics(),
        canary_metrics=NEAR_GATE,
        incumbent_acceptance=steady_history(),
        incumbent_window_seconds=60.0,
    )
