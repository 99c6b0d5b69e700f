"""The operator's own series that the chart's alerts read: each object's conditions and when it
entered its phase, and none of them left behind once the object is deleted."""

from __future__ import annotations

from prometheus_client import REGISTRY
from tests.unit.rollout_driver import Run

from specgate import api, conditions, metrics
from specgate.api import Phase
from specgate.observation import TrackState

NS, NAME = "metrics-test", "stuck"


def condition(kind: str) -> float | None:
    return REGISTRY.get_sample_value("specgate_condition", {"namespace": NS, "name": NAME, "type": kind})


def phase_since() -> float | None:
    labels = {"namespace": NS, "name": NAME}
    return REGISTRY.get_sample_value("specgate_phase_since_timestamp_seconds", labels)


def test_a_degraded_object_exports_its_conditions_and_phase_start_until_deleted() -> None:
    """A baseline never Ready past progressDeadline (BaselineUnhealthy): Degraded 1, Ready 0, and
    the start of Baseline as a timestamp; deleting the object drops every one of its series."""
    run = Run()
    stuck = TrackState(exists=True, replicas=2, waiting="pod b-1: CrashLoopBackOff")
    first = run.step(baseline=stuck)
    metrics.record(NS, NAME, Phase.PENDING, first, None)
    assert condition("Degraded") == 0
    entered = api.parse_time(run.status.phase_since)
    assert entered is not None and phase_since() == entered.timestamp()

    later = run.step(after=20 * 60, baseline=stuck)
    metrics.record(NS, NAME, Phase.BASELINE, later, None)
    assert run.phase == Phase.BASELINE
    assert (condition("Degraded"), condition("Ready")) == (1, 0)
    assert phase_since() == entered.timestamp()  # still the start of Baseline

    metrics.forget(NS, NAME)
    assert [condition(kind) for kind in conditions.TYPES] == [None] * len(conditions.TYPES)
    assert phase_since() is None


def test_the_condition_types_are_those_the_status_carries() -> None:
    """forget() drops a deleted object's condition series by conditions.TYPES: a type added to the
    status but not there would stay exported for ever."""
    run = Run()
    run.step(baseline=TrackState())
    assert sorted(c.type for c in run.status.conditions) == sorted(conditions.TYPES)
