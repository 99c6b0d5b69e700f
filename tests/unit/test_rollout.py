"""The rollout state machine, driven through time with scripted observations (no cluster)."""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from dataclasses import replace
from datetime import timedelta
from typing import Any, NamedTuple

import pytest
from tests.cluster.rollouts import short_of
from tests.unit.rollout_driver import (
    ITL_BOUNDS,
    NEAR_GATE,
    T0,
    Run,
    collapsed,
    edit,
    first_rerollout_look,
    itl,
    make_spec,
    metrics,
    ready,
    spec_body,
    steady_history,
    to_rerollout,
)

from specgate import api, gates, measurements, planning, render, rollout
from specgate.api import Phase
from specgate.cli import render_timeline
from specgate.gates import AcceptanceWindow, Histogram, Load
from specgate.observation import Observation, TrackMetrics, TrackState, Window
from specgate.rollout import Decision, Reason


def test_a_new_object_starts_its_baseline() -> None:
    run = Run()
    d = run.step(baseline=TrackState())
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.BASELINE, 2, None)
    assert run.status.observed_generation == 1
    assert [e.reason for e in d.events] == [Reason.NEW_GENERATION, Reason.WAITING_FOR_BASELINE]
    assert [h.reason for h in run.status.history] == [Reason.NEW_GENERATION]


def test_baseline_waits_for_ready_then_warms_up_then_measures() -> None:
    run = Run()
    run.step(baseline=TrackState(exists=True, replicas=2, ready_replicas=1, waiting="pod x: Unschedulable"))
    assert run.status.reason == Reason.WAITING_FOR_BASELINE and "Unschedulable" in (run.status.message or "")
    run.step(baseline=ready(2))
    assert run.status.reason == Reason.MEASURING_BASELINE
    assert rollout.measurement_window(run.spec, run.status, run.now + timedelta(seconds=20)) is None
    window = rollout.measurement_window(run.spec, run.status, run.now + timedelta(seconds=90))
    assert window is not None and window.end - window.start == timedelta(seconds=60)
    run.step(after=60, baseline=ready(2), baseline_metrics=metrics())
    assert run.phase == Phase.BASELINE  # warm-up (30 s) + window (60 s) not over yet
    measured = replace(metrics(), mean_itl_ms=41.5, window_start=run.now - timedelta(seconds=25))
    d = run.step(after=35, baseline=ready(2), baseline_metrics=measured)
    run.expect(Phase.CANARY)
    # The canary starts on the spare GPU; the baseline shrinks to 1 only once the canary is Ready.
    assert (d.baseline_replicas, d.canary_replicas) == (2, 1)
    assert run.status.baseline is not None and run.status.baseline.p99_itl_ms == pytest.approx(
        58.333
    )  # interpolated in 50-75 ms
    assert len(run.status.baseline.itl_bucket_counts) == len(ITL_BOUNDS)
    assert run.status.baseline.mean_itl_ms == 41.5
    assert (run.status.baseline.window_start, run.status.baseline.window_end) == (
        api.iso(run.now - timedelta(seconds=60)),
        api.iso(run.now),
    )


def test_a_baseline_never_ready_is_unhealthy_after_the_progress_deadline_and_waits() -> None:
    """Baseline pods that never become Ready (no GPU, a gated model's 401): after progressDeadline
    (5m) BaselineUnhealthy, Degraded and one Warning Event, still in Baseline asking for its pods
    (nothing to roll back to); Ready pods clear it."""
    run = Run()
    stuck = TrackState(exists=True, replicas=2, waiting="pod b-1: Unschedulable")
    run.step(baseline=stuck)
    run.step(after=290, baseline=stuck)
    assert (run.phase, run.status.reason) == (Phase.BASELINE, Reason.WAITING_FOR_BASELINE)
    d = run.step(after=20, baseline=stuck)
    assert (run.phase, run.status.reason) == (Phase.BASELINE, Reason.BASELINE_UNHEALTHY)
    assert d.baseline_replicas == 2  # its pods still asked for
    assert [(e.type, e.reason) for e in d.events] == [("Warning", Reason.BASELINE_UNHEALTHY)]
    assert "progressDeadline 5m" in (run.status.message or "") and degraded(run) == "True"
    d = run.step(after=600, baseline=stuck)
    assert (run.phase, d.events) == (Phase.BASELINE, ())
    run.step(baseline=ready(2))
    assert (run.status.reason, degraded(run)) == (Reason.MEASURING_BASELINE, "False")


def degraded(run: Run) -> str:
    return next(c.status for c in run.status.conditions if c.type == "Degraded")


def test_a_quiet_baseline_is_inconclusive_after_the_max_duration() -> None:
    run = Run()
    run.step(baseline=ready(2))
    quiet = replace(metrics(), itl=Histogram(ITL_BOUNDS, (0.0,) * len(ITL_BOUNDS)))
    run.step(after=120, baseline=ready(2), baseline_metrics=quiet)
    assert run.phase == Phase.BASELINE and "too little traffic" in (run.status.message or "")
    run.step(after=600, baseline=ready(2), baseline_metrics=quiet)
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.INCONCLUSIVE)


def test_a_sequential_baseline_with_many_steps_but_few_requests_is_not_stored() -> None:
    """A few long requests fill the step histogram but not the per-token one (one sample per
    request): a sequential canary is compared with the stored baseline, so stored like that, every
    per-token verdict would be InsufficientData. The canary strategy compares with the baseline
    beside the canary, whose window grows over the analysis: it goes on."""
    few_requests = replace(metrics(), per_token=itl(0.03, count=38))
    sequential = Run(make_spec(strategy="sequential"))
    sequential.step(baseline=ready(2))
    sequential.step(after=120, baseline=ready(2), baseline_metrics=few_requests)
    assert sequential.phase == Phase.BASELINE and sequential.status.baseline is None
    assert "38 per-token samples, need 50" in (sequential.status.message or ""), sequential.status.message
    sequential.step(after=30, baseline=ready(2), baseline_metrics=metrics())
    sequential.expect(Phase.CANARY)
    beside = Run()
    beside.step(baseline=ready(2))
    beside.step(after=120, baseline=ready(2), baseline_metrics=few_requests)
    beside.expect(Phase.CANARY)


def test_sequential_strategy_swaps_the_replicas_as_the_candidate_becomes_ready() -> None:
    run = Run(make_spec(strategy="sequential"))
    run.to_canary()
    assert run.last is not None and (run.last.baseline_replicas, run.last.canary_replicas) == (2, 1)
    d = run.step(baseline=ready(2), canary=ready(1))
    assert (d.baseline_replicas, d.canary_replicas) == (1, 2)
    d = run.step(baseline=ready(1), canary=ready(2))
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.ANALYZING, 0, 2)


def test_a_swapped_out_baseline_is_compared_as_stored_not_by_its_last_scrapes() -> None:
    """With the baseline at 0 pods (sequential, or swapped out for the canary without a spare GPU),
    its removed pods' last scrapes can fall in the range the query reaches before the window: series
    with no observation in it. make demo stalled on that until maxAnalysisDuration ("0 P99
    per-token latency samples on the smaller track"); the stored baseline is the comparison."""
    run = Run(make_spec(strategy="sequential"))
    run.to_canary()
    run.step(baseline=ready(2), canary=ready(1))
    run.step(baseline=ready(1), canary=ready(2))
    run.expect(Phase.ANALYZING)
    nothing = Histogram(ITL_BOUNDS, (0.0,) * len(ITL_BOUNDS))
    last_scrapes = TrackMetrics(itl=nothing, per_token=nothing, load=Load(0, None, None))
    gone = TrackState(exists=True)
    run.step(
        after=30, baseline=gone, canary=ready(2), baseline_metrics=last_scrapes, canary_metrics=metrics(0.8)
    )
    run.step(
        after=70, baseline=gone, canary=ready(2), baseline_metrics=last_scrapes, canary_metrics=metrics(0.8)
    )
    run.expect(Phase.PROMOTING)


def test_crashing_canary_rolls_back_at_once() -> None:
    run = Run()
    run.to_canary()
    crash = TrackState(exists=True, replicas=1, ready_replicas=0, failure="pod c: CrashLoopBackOff")
    d = run.step(baseline=ready(1), canary=crash)
    assert (run.phase, run.status.reason, d.canary_replicas, d.baseline_replicas) == (
        Phase.ROLLING_BACK,
        Reason.CANARY_UNHEALTHY,
        0,
        2,
    )
    assert any(e.type == "Warning" for e in d.events)
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.CANARY_UNHEALTHY)
    d = run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, d.canary_replicas, d.events) == (Phase.ROLLED_BACK, 0, ())


def test_canary_that_never_becomes_ready_hits_the_progress_deadline() -> None:
    run = Run()
    run.to_canary()
    unschedulable = "pod c-1: Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    starting = TrackState(exists=True, replicas=1, ready_replicas=0, waiting=unschedulable)
    run.step(baseline=ready(1), canary=starting)
    assert run.status.reason == Reason.WAITING_FOR_CANARY
    run.step(after=301, baseline=ready(2), canary=starting)
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.CANARY_UNHEALTHY)
    # The rollback says why the canary never became Ready, not only that it did not.
    assert "progressDeadline" in (run.status.message or "") and unschedulable in (run.status.message or "")


def test_good_canary_is_promoted_after_a_full_window() -> None:
    run = Run()
    run.to_analyzing()
    run.step(
        after=20, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8)
    )
    assert run.phase == Phase.ANALYZING  # gates pass, but less than one analysis window has passed
    assert run.status.verdict == "Pass"
    d = run.step(
        after=50, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8)
    )
    run.expect(Phase.PROMOTING)
    assert d.canary_replicas == 2
    canary = run.status.canary
    assert canary is not None and canary.alpha == pytest.approx(0.8, abs=0.01)
    assert canary.mean_acceptance_length == pytest.approx(1 + 0.8 * 4, abs=0.01)
    assert canary.acceptance_per_position[0] == pytest.approx(0.8, abs=0.01)
    assert (
        run.status.recommendation is not None
        and 1 <= run.status.recommendation.num_speculative_tokens <= planning.ADVICE_K_MAX
    )
    d = run.step(baseline=ready(1), canary=ready(2))
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.PROMOTED, 0, 2)
    available = {c.type: c.status for c in run.status.conditions}
    assert available == {
        "Available": "True",
        "Progressing": "False",
        "Degraded": "False",
        "Ready": "True",
        "Reconciling": "False",
        "Stalled": "False",
    }


@pytest.mark.parametrize(("indifference", "verdict"), [(0.05, "InsufficientData"), (0.3, "Pass")])
def test_the_indifference_zone_reaches_the_gate(indifference: float, verdict: str) -> None:
    """alpha 0.56 over spread-out windows: inside the default zone (0.55 +/- 0.05) that is not yet a
    verdict; with a zone of +/- 0.3 it is well past its middle and passes (a steady mix: mixDrift 0)."""
    limits = {"minDrafts": 100, "minLatencySamples": 50, "indifference": indifference, "mixDrift": 0}
    run = Run(make_spec(gates=limits))
    run.to_analyzing()
    spread = tuple(AcceptanceWindow(50, 200, 90 if i % 2 else 134) for i in range(20))
    canary = replace(metrics(0.56), acceptance=spread)
    run.step(after=20, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=canary)
    assert run.status.verdict == verdict, run.status.message
    assert f"+/- {indifference:g}" in (run.status.message or "")


def near_the_gate(alpha_twice: tuple[float, float]) -> TrackMetrics:
    """20 spread-out windows of 200 draft tokens, accepting the two counts in turn: an estimate a
    point from the default gate 0.55, which the SPRT cannot tell from it (inside the zone +/- 0.05)."""
    low, high = alpha_twice
    spread = tuple(AcceptanceWindow(50, 200, low if i % 2 else high) for i in range(20))
    return replace(metrics(0.55), acceptance=spread)


@pytest.mark.parametrize(
    ("accepted", "phase", "reason", "side"),
    [
        ((90, 134), Phase.PROMOTING, Reason.GATES_PASSED, "at or above 0.55, inside"),  # alpha 0.56
        ((86, 130), Phase.ROLLING_BACK, Reason.ACCEPTANCE_BELOW_GATE, "below 0.55, inside"),  # 0.54
    ],
)
def test_a_canary_inside_the_zone_is_decided_at_the_deadline_by_its_side_of_the_gate(
    accepted: tuple[float, float], phase: Phase, reason: str, side: str
) -> None:
    """Issue 37: with the data it needs but still undecided at maxAnalysisDuration (10m here), the
    acceptance test takes the estimate's side of the gate instead of rolling a good canary back as
    Inconclusive; the latency gates passed (the same histograms as the baseline's)."""
    run = Run(make_spec(gates={"minDrafts": 100, "minLatencySamples": 50, "mixDrift": 0}))
    run.to_analyzing()
    canary = near_the_gate(accepted)
    run.step(after=90, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=canary)
    assert (run.phase, run.status.verdict) == (Phase.ANALYZING, "InsufficientData"), run.status.message
    run.step(after=540, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=canary)
    assert (run.phase, run.status.reason) == (phase, reason), run.status.message
    assert f"decided at maxAnalysisDuration by the estimate's side of the gate ({side}" in (
        run.status.message or ""
    )


def test_status_shows_how_far_the_acceptance_test_is_from_a_verdict_and_when_the_deadline_decides() -> None:
    """status.canary keeps the SPRT's log-LR and its bound, and when maxAnalysisDuration ends (10m
    after the analysis began); specgate status reads them as a share of the way to a verdict."""
    run = Run(make_spec(gates={"minDrafts": 100, "minLatencySamples": 50, "mixDrift": 0}))
    run.to_analyzing()
    began = run.now
    run.step(
        after=90,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=metrics(),
        canary_metrics=near_the_gate((90, 134)),
    )
    canary = run.status.canary
    assert canary is not None and canary.acceptance_log_lr is not None
    bound = canary.acceptance_bound
    # Wald's log(0.95 / 0.05) less the overshoot of one window's step (test_gates pins how much)
    assert (
        bound is not None
        and math.log(19) / 2 <= bound < math.log(19)
        and abs(canary.acceptance_log_lr) < bound
    )
    assert canary.analysis_deadline == api.iso(began + timedelta(minutes=10))
    toward = "Pass" if canary.acceptance_log_lr >= 0 else "Fail"
    share = abs(canary.acceptance_log_lr) / canary.acceptance_bound
    line = next(x for x in render_timeline("x", run.status).splitlines() if x.startswith("  test "))
    assert line == (
        f"  test     acceptance log-LR {canary.acceptance_log_lr:+.2f}: {share:.0%} of the way to {toward} "
        f"(Pass at +{bound:.2f}, Fail at -{bound:.2f}); by its side of the gate at {canary.analysis_deadline}"
    )


def test_a_latency_gate_without_its_data_leaves_a_decided_acceptance_inconclusive() -> None:
    """Only acceptance is decided by its side at the deadline: a per-token histogram with 10 samples
    (minLatencySamples 50) still has no verdict, and the canary is not promoted on alpha alone."""
    run = Run(make_spec(gates={"minDrafts": 100, "minLatencySamples": 50, "mixDrift": 0}))
    run.to_analyzing()
    canary = replace(near_the_gate((90, 134)), per_token=itl(0.03, count=10))
    run.step(after=630, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=canary)
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.INCONCLUSIVE), run.status.message
    assert "decided at maxAnalysisDuration" in (run.status.message or "")


def test_an_inconclusive_message_names_the_data_it_lacks_as_the_scale_test_reads_it() -> None:
    """tests/cluster/test_scale_and_peering.py accepts an Inconclusive only where its message names a
    count short of its need (short_of): no drafts; latency samples short beside an acceptance test
    decided at the deadline; a quiet baseline. A verdict on enough data names nothing short."""
    canary, baseline = ready(1), ready(1)
    no_drafts = Run()
    no_drafts.to_analyzing()
    for after in (60, 600):
        no_drafts.step(
            after=after,
            baseline=baseline,
            canary=canary,
            baseline_metrics=metrics(),
            canary_metrics=metrics(None),
        )
    few_samples = Run(make_spec(gates={"minDrafts": 100, "minLatencySamples": 50, "mixDrift": 0}))
    few_samples.to_analyzing()
    decided = replace(near_the_gate((90, 134)), per_token=itl(0.03, count=10))
    few_samples.step(
        after=630, baseline=baseline, canary=canary, baseline_metrics=metrics(), canary_metrics=decided
    )
    quiet = Run()
    quiet.step(baseline=ready(2))
    silent = replace(metrics(), itl=Histogram(ITL_BOUNDS, (0.0,) * len(ITL_BOUNDS)))
    for after in (120, 600):
        quiet.step(after=after, baseline=ready(2), baseline_metrics=silent)
    for run, short in ((no_drafts, {"drafts"}), (few_samples, {"latency"}), (quiet, {"latency"})):
        assert run.status.reason == Reason.INCONCLUSIVE, run.status.message
        assert short_of(run.status.message or "") == short, run.status.message
    low = Run()
    low.to_analyzing()
    low.step(
        after=20, baseline=baseline, canary=canary, baseline_metrics=metrics(), canary_metrics=metrics(0.3)
    )
    assert low.status.reason == Reason.ACCEPTANCE_BELOW_GATE
    assert short_of(low.status.message or "") == set(), low.status.message


def test_low_alpha_rolls_back_with_the_figures() -> None:
    run = Run()
    run.to_analyzing()
    d = run.step(
        after=20, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.3)
    )
    # The canary (slow or not, its answers are correct) serves until the baseline's new pod is Ready.
    assert (run.phase, run.status.reason, d.canary_replicas, d.baseline_replicas) == (
        Phase.ROLLING_BACK,
        Reason.ACCEPTANCE_BELOW_GATE,
        1,
        2,
    )
    assert "0.3" in (run.status.message or "") and "0.55" in (run.status.message or "")
    assert run.status.verdict == "Fail"
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.ACCEPTANCE_BELOW_GATE)


def test_worse_p99_itl_rolls_back() -> None:
    run = Run()
    run.to_analyzing()
    run.step(
        after=20,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=metrics(latency=0.04),
        canary_metrics=metrics(0.9, latency=0.14),
    )
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.LATENCY_REGRESSION)


@pytest.mark.parametrize("action", ["RollBack", "Pause"])
def test_metrics_unavailable_never_promotes_and_acts_after_the_budget(action: str) -> None:
    run = Run(make_spec(onMetricsUnavailable=action))
    run.to_analyzing()
    for _ in range(11):
        run.step(baseline=ready(1), canary=ready(1), metrics_error="connection refused")
        assert run.phase == Phase.ANALYZING and run.status.verdict == "MetricsUnavailable"
    run.step(after=20, baseline=ready(1), canary=ready(1), metrics_error="connection refused")
    expected = Phase.ROLLING_BACK if action == "RollBack" else Phase.PAUSED
    assert (run.phase, run.status.reason) == (expected, Reason.METRICS_UNAVAILABLE)


def test_metrics_coming_back_resets_the_budget() -> None:
    run = Run()
    run.to_analyzing()
    run.step(after=100, baseline=ready(1), canary=ready(1), canary_metrics=None)
    assert run.status.metrics_unavailable_since is not None
    run.step(
        after=10, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(None)
    )
    assert run.status.metrics_unavailable_since is None and run.phase == Phase.ANALYZING


def test_no_drafts_is_insufficient_then_inconclusive() -> None:
    run = Run()
    run.to_analyzing()
    run.step(
        after=60, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(None)
    )
    assert run.phase == Phase.ANALYZING and run.status.verdict == "InsufficientData"
    run.step(
        after=600,
        baseline=ready(2),
        canary=ready(1),
        baseline_metrics=metrics(),
        canary_metrics=metrics(None),
    )
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.INCONCLUSIVE)


def phases_through_the_analysis(run: Run, baseline: TrackMetrics, canary: TrackMetrics) -> list[Phase]:
    """The phases seen at a look every 60 s from the end of the canary's warm-up until just past
    maxAnalysisDuration (10m): 11 looks."""
    run.to_analyzing()
    seen: list[Phase] = []
    for _ in range(11):
        run.step(
            after=60, baseline=ready(1), canary=ready(1), baseline_metrics=baseline, canary_metrics=canary
        )
        seen.append(run.phase)
    return seen


NEVER_DECIDED = [Phase.ANALYZING] * 10 + [Phase.ROLLING_BACK]  # Inconclusive after 10m


@pytest.mark.parametrize("missing", ["per_token", "itl"])
def test_a_canary_without_a_latency_histogram_is_never_promoted(missing: str) -> None:
    """A canary whose engine exports no per-token (or no ITL) histogram, at alpha 0.8: its latency
    cannot be compared, so it is never promoted, however good its alpha; Inconclusive at the end."""
    run = Run()
    canary = replace(metrics(0.8), **{missing: None})
    assert phases_through_the_analysis(run, metrics(), canary) == NEVER_DECIDED
    assert run.status.reason == Reason.INCONCLUSIVE
    assert Reason.GATES_PASSED not in [h.reason for h in run.status.history]


def test_too_few_latency_samples_never_promote() -> None:
    """A canary at alpha 0.8 with 10,000 latency samples like the baseline's, where
    minLatencySamples asks 20,000 (the baseline has 100,000): the latency verdict stays
    InsufficientData, which is never read as a Pass. Under the test's usual minimum (50) the same
    canary is promoted at the first look."""
    canary = replace(metrics(0.8), itl=itl(0.04, count=10_000), per_token=itl(0.03, count=10_000))
    run = Run(make_spec(gates={"minDrafts": 100, "minLatencySamples": 20_000}))
    assert phases_through_the_analysis(run, metrics(), canary) == NEVER_DECIDED
    assert (run.status.reason, run.status.verdict) == (Reason.INCONCLUSIVE, "InsufficientData")
    assert phases_through_the_analysis(Run(), metrics(), canary)[0] == Phase.PROMOTING


def test_counter_resets_and_nan_do_not_crash_or_promote() -> None:
    """21 windows, none usable: NaN increases, a counter reset's negative ones, and more accepted
    tokens than draft tokens (counters scraped apart). Read as data, the last kind alone would be
    alpha 1.5 over 350 drafts: a Pass; left out, there is nothing to judge."""
    run = Run()
    run.to_analyzing()
    broken = (
        AcceptanceWindow(math.nan, math.nan, math.nan),
        AcceptanceWindow(-50, -200, -180),
        AcceptanceWindow(50, 200, 300),
    )
    canary = replace(metrics(0.9), acceptance=broken * 7)
    run.step(after=70, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=canary)
    assert run.phase == Phase.ANALYZING and run.status.verdict == "InsufficientData"


def test_guard_trips_when_alpha_drifts_after_promotion() -> None:
    run = Run()
    run.to_promoted()
    window = rollout.measurement_window(run.spec, run.status, run.now + timedelta(seconds=60))
    assert window is not None
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8))
    assert (run.phase, run.status.reason) == (Phase.PROMOTED, Reason.GUARDING)
    d = run.step(after=60, canary=ready(2), canary_metrics=collapsed())
    # After promotion the baseline is at 0: it grows by maxSurge while all canary pods serve.
    assert (run.phase, run.status.reason, d.canary_replicas, d.baseline_replicas) == (
        Phase.ROLLING_BACK,
        Reason.GUARD_TRIPPED,
        2,
        1,
    )
    d = run.step(baseline=ready(1), canary=ready(2))
    assert (run.phase, d.canary_replicas, d.baseline_replicas) == (Phase.ROLLING_BACK, 1, 2)
    d = run.step(baseline=ready(2), canary=ready(1))
    assert (run.phase, run.status.reason, d.canary_replicas) == (Phase.ROLLED_BACK, Reason.GUARD_TRIPPED, 0)


def test_guard_keeps_the_analysis_figures_until_it_sees_drafts() -> None:
    """Just after promotion the guard window holds no draft yet: alpha must not vanish from status."""
    run = Run()
    run.to_promoted()
    analysed = run.status.canary
    assert analysed is not None and analysed.alpha == pytest.approx(0.8)
    run.step(after=5, canary=ready(2), canary_metrics=metrics(None))
    assert (run.phase, run.status.reason, run.status.canary) == (Phase.PROMOTED, Reason.GUARDING, analysed)
    # A first window of 50 drafts (minDrafts 100) gives an estimate, not yet the guard's figures: a
    # CI run's edit 6 s after promotion derived its Auto schedule from the gate's alpha after such a
    # window replaced the analysis's (the canary's per-position acceptance, 40 windows, gone).
    run.step(after=10, canary=ready(2), canary_metrics=metrics(0.7, windows=1))
    assert run.status.canary == analysed
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.7))
    assert run.status.canary is not None and run.status.canary.alpha == pytest.approx(0.7)


def test_guard_compares_latency_with_the_stored_baseline() -> None:
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8, latency=0.4))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.GUARD_TRIPPED)
    assert "P99 ITL" in (run.status.message or "")


def promote_beside(run: Run, phase_samples: float, analysis_samples: float) -> None:
    """Promotes with the Baseline phase's per-token histogram of phase_samples requests and the
    baseline beside the canary's, over the analysis, of analysis_samples."""
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))
    run.step(
        after=95, baseline=ready(2), baseline_metrics=replace(metrics(), per_token=itl(0.03, phase_samples))
    )
    run.expect(Phase.CANARY)
    run.step(baseline=ready(1), canary=ready(1))
    run.now += timedelta(seconds=30)
    beside = replace(metrics(), per_token=itl(0.03, analysis_samples))
    run.step(
        after=70, baseline=ready(1), canary=ready(1), baseline_metrics=beside, canary_metrics=metrics(0.8)
    )
    run.expect(Phase.PROMOTING)
    run.step(baseline=ready(1), canary=ready(2))
    run.expect(Phase.PROMOTED)


def stored_per_token_samples(run: Run) -> float:
    assert run.status.baseline is not None
    return sum(run.status.baseline.per_token_bucket_counts[-1:])


def test_at_promotion_the_baseline_measured_beside_the_canary_is_kept_where_it_counted_more() -> None:
    """400 requests in the Baseline phase's window bound no P99 from above (524 at the guard's z):
    the baseline beside the canary counted 900 over the analysis, and that is what the guard reads."""
    run = Run()
    promote_beside(run, phase_samples=400, analysis_samples=900)
    assert stored_per_token_samples(run) == 900
    baseline = run.status.baseline
    assert baseline is not None and baseline.window_end is not None
    analysis_began = next(h.time for h in run.status.history if h.phase == Phase.ANALYZING)
    assert baseline.window_end > analysis_began  # RFC 3339 in UTC: ordered as text
    run = Run()
    promote_beside(run, phase_samples=2000, analysis_samples=900)
    assert stored_per_token_samples(run) == 2000  # the larger stays


def test_the_guard_trips_on_per_token_latency_against_the_baseline_of_the_analysis() -> None:
    """A promoted canary whose per-token P99 went from the 50-75 ms bucket to 150-200 ms: against the
    Baseline phase's 400 requests the guard could never fail it (no bound on the baseline's P99);
    against the analysis's 900 it rolls back."""
    run = Run()
    promote_beside(run, phase_samples=400, analysis_samples=900)
    slower = replace(metrics(0.8), per_token=itl(0.12, 2000))
    run.step(after=60, canary=ready(2), canary_metrics=slower)
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.GUARD_TRIPPED), run.status.message
    assert "P99 per-token latency" in (run.status.message or "")


def test_an_edit_after_promotion_keeps_the_gated_pods_until_the_baseline_takes_over() -> None:
    """The new config starts as a canary like any other: the promoted pods are scaled down (never
    re-rendered) while the plain baseline's pods become Ready."""
    run = Run()
    run.to_promoted()
    passed = run.status.passed_template_hash
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    d = run.step(baseline=TrackState(exists=True, replicas=0), canary=ready(2))
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)
    assert (d.baseline_replicas, d.canary_replicas, d.keep_template) == (1, 2, frozenset({"canary"}))
    assert run.status.baseline is None and run.status.canary is None
    assert run.status.template_hash != passed and run.status.passed_template_hash == passed
    d = run.step(baseline=ready(1), canary=ready(2))
    assert (d.baseline_replicas, d.canary_replicas, d.keep_template) == (2, 1, frozenset({"canary"}))
    d = run.step(baseline=ready(2), canary=ready(1))
    assert (d.baseline_replicas, d.canary_replicas) == (2, 0)
    run.to_canary()  # the baseline is measured anew, then the new config gets the canary's share
    assert run.last is not None and run.last.keep_template == frozenset()
    assert run.last.canary_replicas == 1


def test_a_new_rollout_forgets_the_last_guard() -> None:
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8))
    assert run.status.guard is not None
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    run.step(baseline=TrackState(exists=True), canary=ready(2))
    assert (run.phase, run.status.guard) == (Phase.BASELINE, None)


def test_pause_holds_and_resumes_without_restarting() -> None:
    run = Run()
    run.to_canary()
    edit(run, paused=True)
    d = run.step(baseline=ready(2), canary=TrackState(exists=True, replicas=1))
    assert run.phase == Phase.PAUSED and (d.baseline_replicas, d.canary_replicas) == (2, 1)
    assert d.keep_template == frozenset({"baseline", "canary"})
    run.step(after=3600, baseline=ready(2), canary=TrackState(exists=True, replicas=1))
    assert run.phase == Phase.PAUSED
    edit(run, paused=False)
    run.step(baseline=ready(2), canary=TrackState(exists=True, replicas=1))
    assert (run.phase, run.status.reason) == (Phase.CANARY, Reason.WAITING_FOR_CANARY)
    assert Reason.NEW_GENERATION not in [h.reason for h in run.status.history[1:]]


def test_pausing_a_promoted_rollout_changes_no_pod() -> None:
    run = Run()
    run.to_promoted()
    history = len(run.status.history)
    for paused in (True, False, True, False):  # a person pauses; Argo CD self-heal reverts it
        edit(run, paused=paused)
        d = run.step(
            baseline=TrackState(exists=True, replicas=0), canary=ready(2), canary_metrics=metrics(0.8)
        )
        assert (d.baseline_replicas, d.canary_replicas) == (0, 2)
        assert run.phase == (Phase.PAUSED if paused else Phase.PROMOTED)
        # Paused, no track is re-rendered; resumed, the spec is the one promoted: nothing to keep.
        assert d.keep_template == (
            frozenset({render.Track.BASELINE, render.Track.CANARY}) if paused else frozenset()
        )
    assert run.status.baseline is not None and run.status.template_hash == run.status.passed_template_hash
    assert [h.phase for h in run.status.history[history:]] == [Phase.PAUSED, Phase.PROMOTED] * 2


def test_replica_changes_scale_without_restarting() -> None:
    run = Run()
    run.to_promoted()
    edit(run, replicas=4)
    d = run.step(baseline=TrackState(exists=True, replicas=0), canary=ready(2))
    assert (run.phase, d.baseline_replicas, d.canary_replicas, d.keep_template) == (
        Phase.PROMOTED,
        0,
        4,
        frozenset(),
    )


def test_retry_reruns_only_an_ended_rollout() -> None:
    run = Run()
    run.to_analyzing()
    edit(run, retry=1)
    d = run.step(baseline=ready(1), canary=ready(1))
    run.expect(Phase.ANALYZING)
    assert Reason.RETRY_IGNORED in [e.reason for e in d.events]
    run.step(
        after=20, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.3)
    )
    run.step(baseline=ready(2), canary=ready(1))
    assert run.phase == Phase.ROLLED_BACK
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert run.phase == Phase.ROLLED_BACK  # the retry bumped during the analysis was used up
    edit(run, retry=2)
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)


def test_crash_looping_canary_after_promotion_rolls_back() -> None:
    run = Run()
    run.to_promoted()
    crash = TrackState(exists=True, replicas=2, ready_replicas=1, failure="pod c-2: CrashLoopBackOff")
    d = run.step(baseline=TrackState(exists=True, replicas=0), canary=crash, canary_metrics=metrics(0.8))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.CANARY_UNHEALTHY)
    assert (d.baseline_replicas, d.canary_replicas) == (2, 1)  # the Ready canary pod serves on


def test_promoted_canary_short_of_ready_pods_rolls_back_after_the_deadline() -> None:
    run = Run()
    run.to_promoted()
    short = TrackState(exists=True, replicas=2, ready_replicas=1, waiting="pod c-2: Unschedulable")
    run.step(canary=short, canary_metrics=metrics(0.8))
    assert run.phase == Phase.PROMOTED and run.status.unready_since is not None
    run.step(after=301, canary=short, canary_metrics=metrics(0.8))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.CANARY_UNHEALTHY)
    assert "Unschedulable" in (run.status.message or "")


@pytest.mark.parametrize("action", ["Warn", "RollBack"])
def test_guard_without_metrics_degrades_and_rolls_back_only_if_asked(action: str) -> None:
    run = Run(make_spec(guard={"onMetricsUnavailable": action}))
    run.to_promoted()
    run.step(canary=ready(2), metrics_error="connection refused")
    assert (run.phase, run.status.reason) == (Phase.PROMOTED, Reason.GUARDING)
    d = run.step(after=130, canary=ready(2), metrics_error="connection refused")
    if action == "Warn":
        assert (run.phase, run.status.reason) == (Phase.PROMOTED, Reason.METRICS_UNAVAILABLE)
        assert [(e.type, e.reason) for e in d.events] == [("Warning", Reason.METRICS_UNAVAILABLE)]
        degraded = {c.type: c.status for c in run.status.conditions}["Degraded"]
        assert degraded == "True" and (d.baseline_replicas, d.canary_replicas) == (0, 2)
    else:
        assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.METRICS_UNAVAILABLE)


def test_a_rollback_that_cannot_get_gpus_says_so_and_keeps_serving() -> None:
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=collapsed())
    pending = TrackState(
        exists=True, replicas=1, waiting="pod b-1: Unschedulable: Insufficient nvidia.com/gpu"
    )
    d = run.step(after=301, baseline=pending, canary=ready(2))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.ROLLBACK_STALLED)
    assert "Insufficient nvidia.com/gpu" in (run.status.message or "") and d.canary_replicas == 2
    assert [e.type for e in d.events] == ["Warning"]
    run.step(baseline=ready(2), canary=ready(1))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.GUARD_TRIPPED)


def test_restoring_a_spec_that_failed_resumes_the_phase() -> None:
    run = Run()
    run.to_promoted()
    error = api.SpecError("speculative.draftModel", "draftModel is required")
    run.generation += 1
    run.status = rollout.invalid_spec(error, run.status, run.generation, run.now).status
    assert run.phase == Phase.FAILED
    run.generation += 1  # the same spec as before the bad edit
    d = run.step(baseline=TrackState(exists=True, replicas=0), canary=ready(2), canary_metrics=metrics(0.8))
    assert (run.phase, d.canary_replicas, d.baseline_replicas) == (Phase.PROMOTED, 2, 0)


def test_invalid_spec_fails_without_touching_children() -> None:
    error = api.SpecError("speculative.draftModel", "draftModel is required")
    d = rollout.invalid_spec(error, api.SpeculativeDeploymentStatus(), 3, T0)
    assert (d.status.phase, d.status.reason, d.status.observed_generation) == (Phase.FAILED, "InvalidSpec", 3)
    assert "spec.speculative.draftModel" in (d.status.message or "")
    assert [e.type for e in d.events] == ["Warning"]
    again = rollout.invalid_spec(error, d.status, 3, T0 + timedelta(seconds=10))
    assert again.events == () and again.status.history == d.status.history


def test_history_and_conditions_keep_transition_times() -> None:
    run = Run()
    run.to_canary()
    first = {c.type: c.last_transition_time for c in run.status.conditions}
    run.step(baseline=ready(1), canary=TrackState(exists=True, replicas=1))
    assert {c.type: c.last_transition_time for c in run.status.conditions} == first
    assert [h.phase for h in run.status.history] == [Phase.BASELINE, Phase.CANARY]


TEMPLATE = render.template_hash(make_spec())  # what the pods run in every row of TABLE
EDITED = 2  # the generation after one spec edit: the API server bumps it on every change of spec


def at(phase: Phase, **fields: Any) -> api.SpeculativeDeploymentStatus:
    """A status in phase as this operator writes it for generation 1 (the pods' template hash, the
    retry it saw, the generation its rollout began at), entered a minute before T0."""
    gated = TEMPLATE if phase in (Phase.PROMOTING, Phase.PROMOTED) else None
    return api.SpeculativeDeploymentStatus(
        phase=phase,
        phase_since=api.iso(T0 - timedelta(seconds=60)),
        observed_generation=1,
        template_hash=TEMPLATE,
        passed_template_hash=gated,
        rollout_generation=1,
        observed_retry=0,
        **fields,
    )


LONG_AGO = api.iso(T0 - timedelta(minutes=30))
HALF_READY = TrackState(exists=True, replicas=2, ready_replicas=1)
CRASHING = TrackState(exists=True, replicas=1, failure="pod c: CrashLoopBackOff")
GOOD = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
PAUSE = {"paused": True}
BENCHMARK = {"measurement": "benchmark", "benchmark": {"concurrency": [1, 8], "numPrompts": 50}}
# The children of each pausable phase as a person finds them: what a pause must hold as they are.
CHILDREN: dict[Phase, dict[str, TrackState]] = {
    Phase.BASELINE: {"baseline": ready(2)},
    Phase.CANARY: {"baseline": ready(2), "canary": TrackState(exists=True, replicas=1)},
    Phase.ANALYZING: {"baseline": ready(1), "canary": ready(1)},
    Phase.PROMOTING: {"baseline": ready(1), "canary": HALF_READY},
    Phase.PROMOTED: {"baseline": TrackState(exists=True), "canary": ready(2)},
}
# A new object created paused whose Service name was taken, once the other object is gone (no spec
# change, so the same generation): Failed resumes Pending, the one way a stored status is Pending
# without beginning a new rollout.
NAME_FREED = rollout.failed(
    Reason.NAME_CONFLICT, "Service ns/m is taken", api.SpeculativeDeploymentStatus(), 1, T0
).status


class Row(NamedTuple):
    """decide() on `status`, the spec with rollout `overrides` at `generation`, observing `fields`."""

    status: api.SpeculativeDeploymentStatus
    overrides: dict[str, Any]
    fields: dict[str, Any]
    expected: Phase
    generation: int = 1
    source: Phase | None = None  # the arrow's start, where decide() gets there from status.phase

    def arrow(self) -> tuple[Phase, Phase]:
        return (self.source or self.status.phase, self.expected)


# One row per arrow of TRANSITIONS that production reaches; every spec edit bumps the generation.
TABLE: list[Row] = [
    Row(api.SpeculativeDeploymentStatus(), {}, {}, Phase.BASELINE),  # a new object: no status yet
    Row(NAME_FREED, PAUSE, {}, Phase.PAUSED, source=Phase.PENDING),
    Row(at(Phase.BASELINE, ready_since=LONG_AGO), {}, {"baseline": ready(2), **GOOD}, Phase.CANARY),
    Row(
        at(Phase.BASELINE, ready_since=LONG_AGO, metrics_unavailable_since=LONG_AGO),
        {},
        {"baseline": ready(2), "metrics_error": "down"},
        Phase.ROLLED_BACK,
    ),
    Row(at(Phase.CANARY), {}, {"baseline": ready(1), "canary": ready(1)}, Phase.ANALYZING),
    Row(at(Phase.CANARY), {}, {"baseline": HALF_READY, "canary": CRASHING}, Phase.ROLLING_BACK),
    Row(at(Phase.ANALYZING), {}, {"baseline": ready(1), "canary": ready(1), **GOOD}, Phase.PROMOTING),
    Row(
        at(Phase.ANALYZING),
        {},
        {"baseline": HALF_READY, "canary": ready(1), "canary_metrics": metrics(0.2)},
        Phase.ROLLING_BACK,
    ),
    Row(at(Phase.PROMOTING), {}, {"baseline": ready(1), "canary": ready(2)}, Phase.PROMOTED),
    Row(at(Phase.PROMOTING), {}, {"baseline": HALF_READY, "canary": CRASHING}, Phase.ROLLING_BACK),
    Row(
        at(Phase.PROMOTED),
        {},
        {"canary": ready(2), "canary_metrics": collapsed(), "guard_acceptance": collapsed().acceptance},
        Phase.ROLLING_BACK,
    ),
    Row(at(Phase.ROLLING_BACK), {}, {"baseline": ready(2)}, Phase.ROLLED_BACK),
    # rollout.measurement switched to benchmark after the Baseline phase (issue 61): measured again.
    *[Row(at(phase), BENCHMARK, CHILDREN[phase], Phase.BASELINE, EDITED) for phase in (Phase.CANARY, Phase.ANALYZING)],
    *[Row(at(phase), PAUSE, children, Phase.PAUSED, EDITED) for phase, children in CHILDREN.items()],
    *[Row(at(Phase.PAUSED, resume_phase=p), {}, CHILDREN[p], p, EDITED) for p in CHILDREN],
    # `kubectl specgate abort` while paused: the held canary rolls back; none started, none to roll back.
    Row(at(Phase.PAUSED, resume_phase=Phase.PROMOTING), PAUSE, {**CHILDREN[Phase.PROMOTING], "abort": "now"},
        Phase.ROLLING_BACK),
    Row(at(Phase.PAUSED, resume_phase=Phase.BASELINE), PAUSE, {**CHILDREN[Phase.BASELINE], "abort": "now"},
        Phase.ROLLED_BACK),
]  # fmt: skip
# Arrows no input reaches, and why (decide() still never takes an arrow outside TRANSITIONS).
UNREACHABLE: dict[tuple[Phase, Phase], str] = {}


def arrows_taken(
    before: api.SpeculativeDeploymentStatus, after: api.SpeculativeDeploymentStatus
) -> list[tuple[Phase, Phase]]:
    """The phase changes of one decision, from its history (a resumed phase has an entry too)."""
    phases = [before.phase, *(h.phase for h in after.history[len(before.history) :])]
    return list(itertools.pairwise(phases))


def assert_held(decision: Decision, observation: Observation) -> None:
    """Every existing Deployment keeps its replicas and its pods' template."""
    assert decision.keep_template == {"baseline", "canary"}
    if observation.baseline.exists:
        assert decision.baseline_replicas == observation.baseline.replicas
    if observation.canary.exists:
        assert decision.canary_replicas == observation.canary.replicas


@pytest.mark.parametrize("row", TABLE, ids=lambda row: "->".join(p.value for p in row.arrow()))
def test_transition(row: Row) -> None:
    """decide() takes the row's arrow; a pause remembers the phase it holds and changes no pod."""
    observation = Observation(generation=row.generation, **row.fields)
    decision = rollout.decide(make_spec(**row.overrides), row.status, observation, T0)
    assert decision.status.phase == row.expected, decision.status.message
    assert row.arrow() in arrows_taken(row.status, decision.status)
    assert decision.status.observed_generation == row.generation
    if row.expected == Phase.PAUSED:
        assert decision.status.resume_phase == row.arrow()[0]
        assert_held(decision, observation)


def test_the_table_covers_every_reachable_arrow() -> None:
    arrows = {(a, b) for a, targets in rollout.TRANSITIONS.items() for b in targets}
    covered = {row.arrow() for row in TABLE}
    assert covered.isdisjoint(UNREACHABLE) and covered | UNREACHABLE.keys() == arrows


def test_settled_phases_stay_put() -> None:
    for phase in (Phase.ROLLED_BACK, Phase.FAILED):
        decision = rollout.decide(make_spec(), at(phase), Observation(generation=1, baseline=ready(2)), T0)
        assert decision.status.phase == phase and decision.events == ()


# A phase with a deadline, the children it waits on, and where it ends past the deadline.
DEADLINES = [
    (Phase.ANALYZING, {"baseline": HALF_READY, "canary": ready(1), "canary_metrics": metrics(0.2)}, 10,
     Reason.ACCEPTANCE_BELOW_GATE),
    (Phase.PROMOTING, {"baseline": ready(1), "canary": HALF_READY}, 310, Reason.CANARY_UNHEALTHY),
    (Phase.ROLLING_BACK, {"baseline": HALF_READY, "canary": ready(1)}, 310, Reason.ROLLBACK_STALLED),
]  # fmt: skip


@pytest.mark.parametrize(
    ("phase", "children", "after", "reason"), DEADLINES, ids=[d[0].value for d in DEADLINES]
)
def test_a_status_without_phase_since_runs_its_deadlines_from_when_it_is_seen(
    phase: Phase, children: dict[str, Any], after: float, reason: Reason
) -> None:
    """A status without phaseSince (written by hand, or by another tool) adopts the first look as
    its start: the failing canary is judged, the stuck promotion and rollback hit progressDeadline."""
    status = at(phase).model_copy(update={"phase_since": None})
    first = rollout.decide(make_spec(), status, Observation(generation=1, **children), T0)
    assert first.status.phase_since == api.iso(T0)
    later = T0 + timedelta(seconds=after)
    d = rollout.decide(make_spec(), first.status, Observation(generation=1, **children), later)
    assert (d.status.phase, d.status.reason) == (Phase.ROLLING_BACK, reason), d.status.message


def test_a_name_conflict_fails_touching_nothing_and_resumes_once_the_name_is_free() -> None:
    run = Run()
    run.step(baseline=TrackState())
    message = (
        "Service ns/m (not created by this SpeculativeDeployment): rename this object or remove the other"
    )
    d = rollout.failed(Reason.NAME_CONFLICT, message, run.status, run.generation, run.now)
    assert (d.status.phase, d.status.reason, d.touch_children) == (Phase.FAILED, "NameConflict", False)
    assert [(e.type, e.message) for e in d.events] == [("Warning", message)]
    run.status = d.status
    d = run.step(baseline=TrackState(exists=True, replicas=2))
    assert (run.phase, d.touch_children, d.baseline_replicas) == (Phase.BASELINE, True, 2)


def test_a_status_from_an_operator_without_template_hashes_is_adopted_and_a_pause_restarts_nothing() -> None:
    run = Run()
    run.to_promoted()
    run.status = run.status.model_copy(update={"template_hash": None, "passed_template_hash": None})
    run.step(canary=ready(2), canary_metrics=metrics(0.8))
    assert run.status.template_hash == run.status.passed_template_hash is not None
    edit(run, paused=True)
    d = run.step(baseline=TrackState(exists=True, replicas=0), canary=ready(2))
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.PAUSED, 0, 2)
    assert Reason.NEW_GENERATION not in [h.reason for h in run.status.history[1:]]


def test_a_status_without_template_hashes_before_promotion_is_adopted_without_a_passed_template() -> None:
    """An analysis from an operator without template hashes is adopted as this spec's rollout, but
    no template has passed the gates yet: passedTemplateHash stays unset until promotion."""
    run = Run()
    run.to_analyzing()
    run.status = run.status.model_copy(update={"template_hash": None})
    run.step(baseline=ready(1), canary=ready(1))
    run.expect(Phase.ANALYZING)
    assert (run.status.template_hash, run.status.passed_template_hash) == (TEMPLATE, None)


# --- latency at production figures (vLLM's buckets, seed 004's EAGLE winner) ---

VLLM_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, math.inf)


# Buckets 5 % apart, as vLLM's --custom-histogram-buckets can set them: fine enough for a 10 % gate.
FINE_BOUNDS = (*(round(0.005 * 1.05**i, 6) for i in range(80)), math.inf)


def sampled(
    mean_seconds: float, n: int, seed: int, sigma: float = 0.3, bounds: tuple[float, ...] = VLLM_BOUNDS
) -> Histogram:
    """Bucket counts of n lognormal samples with the given mean (vLLM's bucket bounds by default)."""
    rng = random.Random(seed)
    mu = math.log(mean_seconds) - sigma**2 / 2
    samples = sorted(rng.lognormvariate(mu, sigma) for _ in range(n))
    return Histogram(bounds, tuple(float(bisect.bisect_right(samples, b)) for b in bounds))


def seed_004(itl_ms: float, per_token_ms: float, seed: int, alpha: float | None = None) -> TrackMetrics:
    """A track of seed 004's Llama-3.1-8B chat run: mean ITL (one sample per engine step) and mean
    time per output token (one sample per request) as the article reports them."""
    return replace(
        metrics(alpha),
        itl=sampled(itl_ms / 1000, 60_000, seed),
        per_token=sampled(per_token_ms / 1000, 6_000, seed + 1, sigma=0.15),
    )


# Baseline 421 tok/s, EAGLE 601 tok/s (1.43x) at 17.49 ms per token, so the baseline's is 25.0 ms;
# ITL 23.4 ms against EAGLE's 31.1 ms (+33 %: a step emits several tokens).
SEED_004_BASELINE = (23.4, 17.49 * 601 / 421)
SEED_004_EAGLE = (31.1, 17.49)


def analyze(run: Run, baseline: TrackMetrics, canary: TrackMetrics) -> None:
    run.to_analyzing()
    for _ in range(3):
        run.step(
            after=30, baseline=ready(1), canary=ready(1), baseline_metrics=baseline, canary_metrics=canary
        )


def test_seed_004_eagle_winner_is_promoted_with_default_latency_gates() -> None:
    """Raw step ITL 33 % worse, per-token latency 30 % better: the default gates (per-token 10 %,
    stall 50 %) promote it, where a 10 % gate on the raw ITL rolled it back."""
    run = Run()
    analyze(run, seed_004(*SEED_004_BASELINE, seed=1), seed_004(*SEED_004_EAGLE, seed=3, alpha=0.8))
    assert run.phase in (Phase.PROMOTING, Phase.PROMOTED), run.status.message
    canary, baseline = run.status.canary, run.status.baseline
    assert canary is not None and baseline is not None
    assert canary.p99_itl_ms is not None and canary.p99_per_token_latency_ms is not None
    passed = next(h for h in run.status.history if h.reason == Reason.GATES_PASSED)
    assert "P99 per-token latency" in passed.message and "step stall" in passed.message


def test_seed_004_winner_fails_a_10_percent_gate_on_the_raw_step_latency() -> None:
    run = Run(make_spec(gates={"minDrafts": 100, "minLatencySamples": 50, "maxP99ItlRegression": 0.10}))
    analyze(run, seed_004(*SEED_004_BASELINE, seed=1), seed_004(*SEED_004_EAGLE, seed=3, alpha=0.8))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.LATENCY_REGRESSION)
    assert "step stall" in (run.status.message or "")


def fine_per_token(slower: float, seed: int, alpha: float | None = None) -> TrackMetrics:
    """A track of seed 004's baseline whose per-token latency is `slower` times the baseline's, on
    buckets fine enough for a 10 % gate (vLLM's default ones are not: see test_gates)."""
    itl_ms, per_token_ms = SEED_004_BASELINE
    fine = sampled(slower * per_token_ms / 1000, 6_000, seed, sigma=0.15, bounds=FINE_BOUNDS)
    return replace(seed_004(itl_ms, per_token_ms, seed, alpha), per_token=fine)


def test_per_token_latency_15_percent_worse_rolls_back() -> None:
    run = Run()
    analyze(run, fine_per_token(1.0, seed=1), fine_per_token(1.15, seed=3, alpha=0.8))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.LATENCY_REGRESSION), (
        run.status.message
    )
    assert "per-token" in (run.status.message or "")


@pytest.mark.parametrize(
    ("tolerance", "slower", "phase"),
    [(0.20, 1.30, Phase.ROLLING_BACK), (0.30, 1.15, Phase.PROMOTING)],
    ids=["30%-worse-at-20%", "15%-worse-at-30%"],
)
def test_the_per_token_gate_takes_its_own_tolerance(tolerance: float, slower: float, phase: Phase) -> None:
    """maxP99PerTokenRegression, neither the step stall's 50 % nor a fixed 10 %, decides: 30 % worse
    rolls back at 20 %, 15 % worse passes at 30 % (the step stall, like the baseline's, passes)."""
    limits = {"minDrafts": 100, "minLatencySamples": 50, "maxP99PerTokenRegression": tolerance}
    run = Run(make_spec(gates=limits))
    analyze(run, fine_per_token(1.0, seed=1), fine_per_token(slower, seed=3, alpha=0.8))
    entered = run.status.history[-1]
    assert entered.phase == phase, entered.message
    assert "P99 per-token latency canary" in entered.message and f"{tolerance:.0%}" in entered.message


def test_latency_at_unequal_loads_is_not_compared() -> None:
    """The canary took half the baseline's requests per pod and held half as many running: its
    shorter tail says nothing, so the latency verdict waits (and names both loads)."""
    run = Run()
    run.to_analyzing()
    slow_baseline = metrics(latency=0.3, load=4.0)
    run.step(
        after=70,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=slow_baseline,
        canary_metrics=metrics(0.8),
    )
    assert run.phase == Phase.ANALYZING and run.status.verdict == "InsufficientData"
    message = run.status.message or ""
    assert "loads differ" in message and "2.00 req/s" in message and "4.00 req/s" in message
    assert run.status.canary is not None and run.status.canary.requests_per_second_per_pod == 2.0


@pytest.mark.parametrize(
    "left_out",
    [AcceptanceWindow(math.nan, 80, 60), AcceptanceWindow(20, 0, 0)],
    ids=["stale", "without-draft-tokens"],
)
def test_mean_acceptance_length_counts_only_the_windows_the_gate_uses(left_out: AcceptanceWindow) -> None:
    """The gate leaves out a window whose drafts came back NaN (a stale marker: unusable) and one
    without draft tokens (its drafts counter moved alone, as counters scraped apart can): neither
    counts in status.canary, whose drafts are the gate's samples. Judged: 100 drafts, 320 accepted
    -> 1 + 3.2 = 4.2."""
    judged = AcceptanceWindow(100, 400, 320)
    track = replace(metrics(), acceptance=(judged, left_out))
    acceptance = gates.acceptance_gate(
        track.acceptance, 0.55, error_rate=0.05, indifference=0.05, min_drafts=50
    )
    measurement = measurements.canary_measurement(track, acceptance, T0)
    assert measurement.drafts == acceptance.samples == 100
    assert measurement.mean_acceptance_length == 4.2


def test_reasons_are_written_as_plain_strings() -> None:
    status = api.SpeculativeDeploymentStatus().model_copy(update={"reason": Reason.GUARD_TRIPPED})
    written = status.model_dump(by_alias=True, mode="json")["reason"]
    assert type(written) is str and json.dumps(written) == '"GuardTripped"'
    assert f"{Reason.PAUSED}" == str(Reason.PAUSED) == "Paused"
    assert "MetricsUnavailable" in rollout.DEGRADED_REASONS


def test_status_and_the_cli_show_a_measurement_in_the_same_words() -> None:
    run = Run()
    run.to_promoted()
    baseline, canary = run.status.baseline, run.status.canary
    assert baseline is not None and canary is not None and canary.alpha is not None
    measured = next(h for h in run.status.history if h.reason == Reason.BASELINE_MEASURED)
    assert measured.message == f"baseline: {baseline.figures()}"
    assert "p99_itl_ms=" in measured.message and "p99_ttft_ms=" in measured.message
    timeline = render_timeline("x", run.status).splitlines()
    assert f"  baseline {baseline.figures()}" in timeline
    assert f"  canary   {canary.figures()}" in timeline
    assert f"alpha={canary.alpha:.3f}" in canary.figures()


def _rerender(
    states: dict[render.Track, TrackState], wanted: dict[render.Track, int]
) -> frozenset[render.Track]:
    """templates_to_wait for make_spec(replicas 2, maxUnavailable 1) where this version renders both
    tracks' pods differently from what their Deployments carry."""
    spec = make_spec(maxSurge=0, maxUnavailable=1)
    on_spec = {
        t: replace(s, template_hash=render.template_hash(spec, t), rendered="old") for t, s in states.items()
    }
    return rollout.templates_to_wait(spec, {t: "new" for t in wanted}, on_spec, wanted)


def test_a_promoted_canary_being_lowered_keeps_the_ready_pods_an_hpa_raise_needs() -> None:
    """The day-2 fuzz with its new edits (issue 61, seed 113): Promoted on two canary pods (replicas
    2, maxSurge 2, maxUnavailable 1), a new draft length lowers the canary to one while the baseline
    starts; before its Deployment acts, an HPA raises replicas to 6 (floor 5, two Ready pods in all).
    The canary's pods still run the gated config (its template is kept until the baseline takes
    over), so both are kept, not capped at canaryReplicas: the floor lost one before."""
    run = Run(make_spec(maxSurge=2, maxUnavailable=1))
    run.to_promoted()
    promoted = replace(ready(2), template_hash=run.status.passed_template_hash)
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    lowered = run.step(baseline=TrackState(exists=True), canary=promoted)
    assert (run.phase, lowered.canary_replicas) == (Phase.BASELINE, 1)
    assert render.Track.CANARY in lowered.keep_template
    edit(run, replicas=6)
    kept = run.step(baseline=TrackState(exists=True, replicas=2), canary=replace(promoted, replicas=1))
    assert kept.canary_replicas == 2


def test_an_operator_upgrade_re_renders_one_track_at_a_time_baseline_first() -> None:
    b, c = render.Track.BASELINE, render.Track.CANARY
    assert _rerender({b: ready(1), c: ready(1)}, {b: 1, c: 1}) == {c}  # the baseline goes first
    rolling = replace(ready(1), rolling=True)
    assert _rerender({b: rolling, c: ready(1)}, {b: 1, c: 1}) == {
        c
    }  # its own roll: applying again is a no-op
    assert _rerender({b: ready(1), c: rolling}, {b: 1, c: 1}) == {b, c}  # never beside the other's roll
    assert _rerender({b: ready(1), c: ready(1)}, {b: 0, c: 1}) == {b, c}  # a shrink this reconcile
    assert _rerender({b: ready(1), c: replace(ready(1), ready_replicas=0)}, {b: 1, c: 1}) == {b, c}


def test_behind_a_route_a_re_render_waits_while_its_roll_would_leave_the_tracks_weight_on_no_pod() -> None:
    """The day-2 fuzz with routes (issue 61): replicas 3, maxSurge 0, maxUnavailable 2 (floor 1),
    Analyzing with one baseline pod that the route gives a third of its traffic: an operator upgrade
    re-rendered it at once (the canary's two pods keep the floor), and the Gateway sent that third
    to a Service with no Ready pod for the roll's length. It waits while the route weights the
    track (and the canary with it: one track re-renders at a time, the baseline first)."""
    b, c = render.Track.BASELINE, render.Track.CANARY
    spec = api.parse_spec(spec_body(maxSurge=0, maxUnavailable=2) | {"replicas": 3})
    on_spec = {
        t: replace(ready(n), template_hash=render.template_hash(spec, t), rendered="old")
        for t, n in ((b, 1), (c, 2))
    }
    wanted, rendered = {b: 1, c: 2}, {b: "new", c: "new"}
    assert rollout.templates_to_wait(spec, rendered, on_spec, wanted) == {c}  # no route: the baseline first
    third = {b: 33, c: 67}
    assert rollout.templates_to_wait(spec, rendered, on_spec, wanted, third) == {b, c}
    assert rollout.templates_to_wait(spec, rendered, on_spec, wanted, {b: 0, c: 100}) == {c}


def test_a_spec_change_or_a_render_already_applied_is_not_held() -> None:
    b, c = render.Track.BASELINE, render.Track.CANARY
    spec = make_spec(maxSurge=0, maxUnavailable=1)
    done = TrackState(exists=True, replicas=1, ready_replicas=1, template_hash=render.template_hash(spec, b))
    new_spec = TrackState(exists=True, replicas=1, ready_replicas=1, template_hash="an older spec")
    assert (
        rollout.templates_to_wait(
            spec, {b: "new", c: "new"}, {b: replace(done, rendered="new"), c: new_spec}, {b: 1, c: 1}
        )
        == frozenset()
    )


def test_a_rerollout_measures_the_drift_on_the_promoted_configs_history() -> None:
    """The rollout that replaces a promoted config reads its last mixDriftHistory (12 h) on the canary
    track, up to the new rollout's start, once: a steady history measures no drift, so three minutes
    at 0.62 pass where the fallback mixDrift 0.09 would not yet; status says which drift and whence,
    and keeps it (that a later look judges with it is
    test_a_measured_drift_is_read_back_from_status_at_every_later_look's)."""
    run = Run()
    began = to_rerollout(run)
    promoted = next(h.time for h in run.status.history if h.phase == Phase.PROMOTED)
    assert (run.status.incumbent_since, run.status.incumbent_until) == (promoted, api.iso(began))
    window = rollout.incumbent_window(run.spec, run.status)
    assert window is not None and (window.start, window.end) == (began - timedelta(hours=12), began)
    first_rerollout_look(run, after=60)
    drift = run.status.mix_drift
    assert drift is not None and drift.standard_deviation == 0.0
    assert drift.source == "measured over 4.0 h of the promoted config's alpha (60s windows, design effect 1)"
    assert drift.design_effect == 1.0  # a history that never moved: tokens as good as independent
    assert run.status.verdict == "Pass"
    assert rollout.incumbent_window(run.spec, run.status) is None  # read once
    run.step(
        after=60, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=NEAR_GATE
    )
    assert run.status.mix_drift == drift and run.status.verdict == "Pass"


def test_a_first_rollout_keeps_the_fallback_drift() -> None:
    """No promoted config, no history: the spec's mixDrift, and three minutes at 0.62 are not enough."""
    run = Run()
    run.to_analyzing()
    assert rollout.incumbent_window(run.spec, run.status) is None
    run.step(
        after=60, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=NEAR_GATE
    )
    drift = run.status.mix_drift
    assert drift is not None and (drift.standard_deviation, drift.timescale_seconds) == (0.09, 180.0)
    assert drift.source == "spec mixDrift (fallback: no promoted config to measure it on)"
    assert run.status.verdict == "InsufficientData"
    assert "drift: spec mixDrift (fallback" in (run.status.message or "")


def rerollout_near_the_gate(**incumbent: Any) -> Run:
    """A re-rollout's first minute of analysis of a near-gate canary, with the incumbent's history
    (or its error) as given."""
    run = Run()
    to_rerollout(run)
    run.step(
        after=60,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=metrics(),
        canary_metrics=NEAR_GATE,
        **incumbent,
    )
    return run


def test_an_unreadable_or_short_incumbent_history_falls_back_and_says_why() -> None:
    run = rerollout_near_the_gate(incumbent_error="Prometheus query failed: timeout")
    drift = run.status.mix_drift
    assert drift is not None and drift.standard_deviation == 0.09
    assert (
        drift.source
        == "spec mixDrift (fallback: the promoted config's history: Prometheus query failed: timeout)"
    )
    short = rerollout_near_the_gate(incumbent_acceptance=steady_history(hours=0.5))
    assert short.status.mix_drift is not None and short.status.mix_drift.standard_deviation == 0.09
    assert short.status.verdict == "InsufficientData"


def test_a_rollout_after_a_rollback_has_no_incumbent() -> None:
    """Rolled back, the plain baseline serves: the next rollout replaces no promoted config."""
    run = Run()
    run.to_analyzing()
    run.step(
        after=60, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.2)
    )
    run.step(baseline=ready(2), canary=ready(1))
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    run.expect(Phase.ROLLED_BACK)
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, run.status.incumbent_since, run.status.mix_drift) == (Phase.BASELINE, None, None)


def test_each_canary_keeps_its_step_cost_and_a_new_draft_length_adds_its_own() -> None:
    """A canary's mean step over the baseline's goes into status.stepCosts with its K; the rollout of
    another K of the same target and draft keeps it beside its own, and the advice is costed by both
    (one K cannot tell a step's fixed extra from a draft pass's); another draft starts again."""
    run = Run()
    baseline, canary = replace(metrics(), mean_itl_ms=10.0), replace(metrics(0.8), mean_itl_ms=25.0)

    def rollout_with(step_ms: float) -> None:
        run.step(baseline=ready(2))
        run.step(baseline=ready(2))
        run.step(after=95, baseline=ready(2), baseline_metrics=baseline)
        run.expect(Phase.CANARY)
        run.step(baseline=ready(1), canary=ready(1))
        run.now += timedelta(seconds=30)
        measured = replace(canary, mean_itl_ms=step_ms)
        run.step(
            after=70, baseline=ready(1), canary=ready(1), baseline_metrics=baseline, canary_metrics=measured
        )
        run.expect(Phase.PROMOTING)

    rollout_with(25.0)
    costs = run.status.step_costs
    assert [(c.k, c.step_ratio, c.concurrency) for c in costs] == [(4, 2.5, 4)]
    assert costs[0].config == "m vllm draft_model d"
    assert costs[0].acceptance_per_position == pytest.approx([0.8, 0.64, 0.512, 0.4096])
    one_k = run.status.recommendation
    assert one_k is not None and "steps measured K=4 2.50x a plain one" in one_k.message

    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 1})
    rollout_with(20.0)
    assert [(c.k, c.step_ratio) for c in run.status.step_costs] == [(1, 2.0), (4, 2.5)]
    both = run.status.recommendation
    assert both is not None and "steps measured K=1 2.00x, K=4 2.50x a plain one" in both.message
    # Most of a step's extra is fixed (2.0x at K=1, 2.5x at K=4): longer drafts are cheap, and the
    # K=4 canary's acceptance, kept with its cost, is what prices them.
    assert both.num_speculative_tokens > one_k.num_speculative_tokens

    edit(run, speculative={"method": "draft_model", "draftModel": "other", "numSpeculativeTokens": 4})
    rollout_with(25.0)
    assert [(c.k, c.config) for c in run.status.step_costs] == [(4, "m vllm draft_model other")]


def test_a_crash_looping_baseline_is_unhealthy_at_once_and_still_waited_for() -> None:
    """A baseline pod in CrashLoopBackOff needs no deadline: BaselineUnhealthy (Degraded) with a
    Warning Event naming the pod, and its replicas still asked for (nothing to roll back to)."""
    run = Run()
    crashing = TrackState(exists=True, replicas=2, failure="pod b-1: CrashLoopBackOff")
    d = run.step(baseline=crashing)
    message = "baseline is unhealthy: pod b-1: CrashLoopBackOff"
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.BASELINE,
        Reason.BASELINE_UNHEALTHY,
        message,
    )
    assert d.events[-1] == rollout.Event("Warning", Reason.BASELINE_UNHEALTHY, message)
    assert (d.baseline_replicas, degraded(run)) == (2, "True")


def test_a_quiet_baseline_waits_until_the_max_duration_has_passed_then_warns_inconclusive() -> None:
    """A baseline without traffic says why it waits (MeasuringBaseline) until maxAnalysisDuration
    (10m) has passed, not at the instant it is reached; then it stops Inconclusive, which a Warning
    Event reports."""
    run = Run()
    run.step(baseline=ready(2))
    began = run.now  # the Baseline phase began here
    quiet = replace(metrics(), itl=Histogram(ITL_BOUNDS, (0.0,) * len(ITL_BOUNDS)))
    waiting = "baseline has too little traffic to measure (0 step stall samples, need 50): send traffic to the Service"
    run.step(after=120, baseline=ready(2), baseline_metrics=quiet)
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.BASELINE,
        Reason.MEASURING_BASELINE,
        waiting,
    )
    run.now = began + timedelta(minutes=10) - timedelta(seconds=10)
    run.step(baseline=ready(2), baseline_metrics=quiet)  # exactly maxAnalysisDuration
    assert (run.phase, run.status.reason) == (Phase.BASELINE, Reason.MEASURING_BASELINE)
    d = run.step(after=1, baseline=ready(2), baseline_metrics=quiet)
    stopped = f"{waiting} (for maxAnalysisDuration)"
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.ROLLED_BACK,
        Reason.INCONCLUSIVE,
        stopped,
    )
    assert d.events == (rollout.Event("Warning", Reason.INCONCLUSIVE, stopped),)


def test_a_baseline_without_metrics_past_the_budget_stops_and_never_creates_a_canary() -> None:
    """Prometheus unreadable for metricsUnavailableBudget (2m) while the baseline is measured: the
    rollout stops before its canary, saying why, and later looks still ask for no canary."""
    run = Run()
    run.step(baseline=ready(2))
    run.step(after=95, baseline=ready(2), metrics_error="connection refused")
    run.expect(Phase.BASELINE)
    run.step(after=120, baseline=ready(2), metrics_error="connection refused")
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.ROLLED_BACK,
        Reason.METRICS_UNAVAILABLE,
        "metrics unavailable for 2m: connection refused; the canary was never started",
    )
    d = run.step(baseline=ready(2))
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.ROLLED_BACK, 2, None)


def test_a_finished_rollback_reports_rolled_back_with_a_warning_event() -> None:
    """The guard tripped; once the baseline is Ready again the rollback ends RolledBack, still
    GuardTripped, with a Warning Event (a person must look at it)."""
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8, latency=0.4))
    run.expect(Phase.ROLLING_BACK)
    why = run.status.message or ""
    assert why.startswith("latency regressed over the last 30m: P99 ITL")
    d = run.step(baseline=ready(2), canary=ready(1))
    run.expect(Phase.ROLLED_BACK)
    assert d.events == (rollout.Event("Warning", Reason.GUARD_TRIPPED, why),)


def test_a_rollback_without_its_history_entry_keeps_the_reason_in_status() -> None:
    """A RollingBack status with no history entry for it (written by hand or by an older operator):
    it ends RolledBack with the reason status has, and no message is made up for it."""
    status = at(Phase.ROLLING_BACK, reason=Reason.GUARD_TRIPPED, message="alpha dropped")
    d = rollout.decide(make_spec(), status, Observation(generation=1, baseline=ready(2)), T0)
    assert (d.status.phase, d.status.reason, d.status.message) == (
        Phase.ROLLED_BACK,
        Reason.GUARD_TRIPPED,
        "",
    )
    assert d.events == (rollout.Event("Warning", Reason.GUARD_TRIPPED, ""),)


def test_a_rollback_stalls_only_once_past_the_progress_deadline_and_says_what_it_waits_for() -> None:
    """RollingBack since a minute before T0 with the baseline half Ready: at exactly progressDeadline
    (5m) it still waits; a second later it is RollbackStalled, naming the baseline's pods."""
    status = at(Phase.ROLLING_BACK, reason=Reason.GUARD_TRIPPED, message="alpha dropped")
    children = {"baseline": HALF_READY, "canary": ready(1)}
    deadline = T0 + timedelta(minutes=4)
    d = rollout.decide(make_spec(), status, Observation(generation=1, **children), deadline)
    assert (d.status.phase, d.status.reason) == (Phase.ROLLING_BACK, Reason.GUARD_TRIPPED)
    later = deadline + timedelta(seconds=1)
    d = rollout.decide(make_spec(), status, Observation(generation=1, **children), later)
    assert (d.status.phase, d.status.reason, d.status.message) == (
        Phase.ROLLING_BACK,
        Reason.ROLLBACK_STALLED,
        "rollback stalled: waiting for baseline: 1/2 ready after progressDeadline 5m; the canary keeps "
        "serving until the baseline is Ready",
    )


def test_a_latency_verdict_still_missing_at_the_deadline_is_not_decided_by_the_acceptance_rule() -> None:
    """Both tracks' P99 step stall lies beyond the last bucket (2.5 s): no latency verdict. At
    maxAnalysisDuration only the acceptance test is decided by its estimate's side of the gate; the
    latency one stays InsufficientData, and the rollout is Inconclusive, not promoted."""
    run = Run()
    run.to_analyzing()
    beyond = {"baseline_metrics": metrics(latency=3.0), "canary_metrics": metrics(0.8, latency=3.0)}
    run.step(after=70, baseline=ready(1), canary=ready(1), **beyond)
    assert (run.phase, run.status.verdict) == (Phase.ANALYZING, "InsufficientData")
    run.step(after=540, baseline=ready(1), canary=ready(1), **beyond)
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.INCONCLUSIVE), run.status.message


def test_a_mix_drift_history_of_0s_reads_no_incumbent_history() -> None:
    """gates.mixDriftHistory 0s turns the measured drift off: nothing of the replaced promoted
    config is read (the spec's fallback drift is used)."""
    spec = make_spec(gates={"minDrafts": 100, "minLatencySamples": 50, "mixDriftHistory": "0s"})
    status = at(
        Phase.ANALYZING,
        incumbent_since=api.iso(T0 - timedelta(hours=5)),
        incumbent_until=api.iso(T0 - timedelta(minutes=1)),
    )
    assert rollout.incumbent_window(spec, status) is None


def test_a_measured_drift_is_read_back_from_status_at_every_later_look() -> None:
    """The steady history's drift (sd 0, design effect 1) is measured at the first look and kept in
    status; its source shows in the acceptance test's message. The next look has no history to read
    (the operator reads it only while status has no drift): it must judge with the kept drift, and
    passes, where re-deciding without the history would fall back to mixDrift 0.09."""
    run = Run()
    to_rerollout(run)
    measured = "drift: measured over 4.0 h of the promoted config's alpha (60s windows, design effect 1)"
    first_rerollout_look(run, after=30)
    assert (run.phase, run.status.verdict) == (Phase.ANALYZING, "Pass")  # before the analysis window
    assert measured in (run.status.message or "")
    kept = run.status.mix_drift
    run.step(
        after=30, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=NEAR_GATE
    )
    assert (run.phase, run.status.reason, run.status.mix_drift) == (
        Phase.PROMOTING,
        Reason.GATES_PASSED,
        kept,
    )
    assert measured in (run.status.message or "")


def test_a_mix_drift_history_of_0s_falls_back_to_the_spec_and_says_so() -> None:
    """A rollout that replaces a promoted config, with gates.mixDriftHistory 0s: the measured drift
    is off, so the spec's mixDrift 0.09 over mixDriftTimescale 3m is used, and status says why."""
    run = Run(make_spec(gates={"minDrafts": 100, "minLatencySamples": 50, "mixDriftHistory": "0s"}))
    to_rerollout(run)
    run.step(
        after=60, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=NEAR_GATE
    )
    assert run.status.mix_drift == api.MixDriftStatus(
        standard_deviation=0.09,
        timescale_seconds=180.0,
        source="spec mixDrift (fallback: mixDriftHistory is 0s)",
    )
    assert run.status.verdict == "InsufficientData"


def test_status_keeps_the_drift_to_four_decimals_and_its_timescale_to_a_tenth_of_a_second() -> None:
    """A first rollout keeps the spec's mixDrift 0.05678 and mixDriftTimescale 100.37s as status
    shows them: sd 0.0568, timescale 100.4 s."""
    gates_fields = {
        "minDrafts": 100,
        "minLatencySamples": 50,
        "mixDrift": 0.05678,
        "mixDriftTimescale": "100.37s",
    }
    run = Run(make_spec(gates=gates_fields))
    run.to_analyzing()
    run.step(
        after=30, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=NEAR_GATE
    )
    drift = run.status.mix_drift
    assert drift is not None and (drift.standard_deviation, drift.timescale_seconds) == (0.0568, 100.4)


def bursty_history() -> tuple[AcceptanceWindow, ...]:
    """4 h of 60 s blocks of 4000 draft tokens at alpha 0.7, but every 40 minutes a minute of hard
    prompts (alpha 0.6) followed by one of easy ones (0.8): no drift (blocks two or more apart
    never move together), and a spread per token larger than independent tokens'."""
    swing = {0: -400.0, 1: 400.0}
    return tuple(
        AcceptanceWindow(0.0, 4000.0, 2800.0 + swing.get(i % 40, 0.0), end=60.0 * (i + 1)) for i in range(240)
    )


def test_a_measured_design_effect_is_kept_to_one_decimal() -> None:
    """bursty_history: 12 of its 240 blocks are off by 400 accepted tokens, a variance of
    400^2 * 12 / 240 = 8000 per block (the pairs' negative lag-1 correlation does not lower it),
    times 240 / 239 = 8033.5, over 4000 tokens: 2.0084 per token, against 0.7 * 0.3 = 0.21 for
    independent tokens: a design effect of 9.56, which status keeps as 9.6 (the source, as 10)."""
    run = rerollout_near_the_gate(incumbent_acceptance=bursty_history(), incumbent_window_seconds=60.0)
    drift = run.status.mix_drift
    assert drift is not None and (drift.standard_deviation, drift.design_effect) == (0.0, 9.6)
    assert (
        drift.source == "measured over 4.0 h of the promoted config's alpha (60s windows, design effect 10)"
    )


def test_a_canary_crash_looping_during_the_analysis_rolls_back_at_once() -> None:
    run = Run()
    run.to_analyzing()
    crashing = TrackState(exists=True, replicas=1, ready_replicas=0, failure="CrashLoopBackOff")
    run.step(
        after=20, baseline=ready(1), canary=crashing, baseline_metrics=metrics(), canary_metrics=metrics(0.8)
    )
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.ROLLING_BACK,
        Reason.CANARY_UNHEALTHY,
        "canary is unhealthy: CrashLoopBackOff",
    )


def test_a_look_at_the_instant_the_canarys_warm_up_ends_judges_nothing_yet() -> None:
    """The analysis window starts where the warm-up ends: at that instant it holds nothing, so the
    status still says the canary is Ready and no verdict or figure is written."""
    run = Run()
    run.to_analyzing()  # now: the warm-up's end
    d = run.step(
        after=0, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8)
    )
    assert (run.phase, run.status.reason, run.status.verdict, run.status.canary) == (
        Phase.ANALYZING,
        Reason.CANARY_READY,
        None,
        None,
    )
    assert d.events == ()


def test_the_analysis_message_gives_each_gates_result_in_turn() -> None:
    """Half a minute into the analysis, status says the acceptance test's result, then the per-token
    gate's (tolerance 10%), then the step stall's (50%), then the speedup gate's (the canary's 24 ms
    a token against the baseline's 30: 1.25), separated by semicolons."""
    run = Run()
    run.to_analyzing()
    run.step(
        after=30, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8)
    )
    message = run.status.message or ""
    assert (run.phase, run.status.reason) == (Phase.ANALYZING, Reason.ANALYZING)
    assert message.startswith("alpha 0.800 ")
    assert "(fallback: no promoted config to measure it on); P99 per-token latency canary " in message
    assert ": within 10%; P99 ITL (step stall) canary " in message
    assert ": within 50%; speedup 1.250 [" in message
    assert message.endswith("(gate 1 +/- 0.03)")


def test_status_keeps_each_latency_gates_ratio_interval_and_samples_after_an_analyzing_look() -> None:
    """Both tracks' histograms alike (98.5 % at or below 50 ms, the rest in 50-75 ms): ratio 1. On
    probability paper log P99 moves ln 1.5 / (probit(1 - 0.5 / n) - probit(0.985)) per probit, and
    the ranks 0.99 -/+ 2.3 sqrt(0.0099 / n) bracket it; the two tracks' half-widths in quadrature:
    per-token, n = 100,000 samples: [0.9931, 1.0070]; step stall, the 100,000 ITL samples counted
    in their 25,000 engine steps: [0.9839, 1.0163]. Both within their tolerance (1.1, 1.5): Pass,
    nothing more needed. A second look at the same figures writes the same gates."""
    run = Run()
    run.to_analyzing()
    look = {
        "baseline": ready(1),
        "canary": ready(1),
        "baseline_metrics": metrics(),
        "canary_metrics": metrics(0.8),
    }
    run.step(after=30, **look)
    canary = run.status.canary
    assert canary is not None and run.phase == Phase.ANALYZING
    assert canary.per_token_latency_gate == api.LatencyGateStatus(
        verdict="Pass", ratio=1.0, ratio_lower=0.9931, ratio_upper=1.007, tolerance=1.1, samples=100_000
    )
    assert canary.step_stall_gate == api.LatencyGateStatus(
        verdict="Pass", ratio=1.0, ratio_lower=0.9839, ratio_upper=1.0163, tolerance=1.5, samples=25_000
    )
    timeline = render_timeline("x", run.status).splitlines()
    assert [line for line in timeline if line.startswith("  latency ")] == [
        "  latency  per-token P99 ratio=1.000 [0.9931, 1.007] tolerance=1.1 samples=100000 Pass",
        "  latency  step stall P99 ratio=1.000 [0.9839, 1.0163] tolerance=1.5 samples=25000 Pass",
    ]
    run.step(after=15, **look)
    again = run.status.canary
    assert again is not None
    assert (again.per_token_latency_gate, again.step_stall_gate) == (
        canary.per_token_latency_gate,
        canary.step_stall_gate,
    )


def test_status_says_how_many_samples_a_latency_gate_still_needs() -> None:
    """A canary with 10 per-token samples where minLatencySamples is 50: no ratio yet, 10 samples,
    50 needed; the step stall beside it is judged as before."""
    run = Run()
    run.to_analyzing()
    canary_metrics = replace(metrics(0.8), per_token=itl(0.03, count=10))
    run.step(
        after=30,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=metrics(),
        canary_metrics=canary_metrics,
    )
    canary = run.status.canary
    assert canary is not None and run.phase == Phase.ANALYZING
    assert canary.per_token_latency_gate == api.LatencyGateStatus(
        verdict="InsufficientData", tolerance=1.1, samples=10, samples_needed=50
    )
    assert canary.step_stall_gate is not None and canary.step_stall_gate.verdict == "Pass"
    assert (
        "  latency  per-token P99 ratio=- tolerance=1.1 samples=10 InsufficientData, needs 50 samples a track"
        in (render_timeline("x", run.status).splitlines())
    )


def test_missing_canary_metrics_without_an_error_are_noted_and_never_pass() -> None:
    """Prometheus answered, but with no series of the canary: MetricsUnavailable from that look on."""
    run = Run()
    run.to_analyzing()
    run.step(after=70, baseline=ready(1), canary=ready(1), baseline_metrics=metrics())
    assert (run.phase, run.status.reason, run.status.verdict, run.status.message) == (
        Phase.ANALYZING,
        Reason.METRICS_UNAVAILABLE,
        "MetricsUnavailable",
        f"metrics unavailable since {api.iso(run.now)} (never a pass): no metrics for the track",
    )


def test_a_baseline_with_exactly_the_minimum_latency_samples_is_measured() -> None:
    """minLatencySamples 50 and exactly 50 step-stall samples: enough."""
    run = Run()
    run.step(baseline=ready(2))
    run.step(after=120, baseline=ready(2), baseline_metrics=replace(metrics(), itl=itl(0.04, count=50)))
    run.expect(Phase.CANARY)


def test_a_baseline_without_a_step_stall_histogram_counts_no_samples() -> None:
    run = Run()
    run.step(baseline=ready(2))
    run.step(after=120, baseline=ready(2), baseline_metrics=replace(metrics(), itl=None))
    assert (run.phase, run.status.message) == (
        Phase.BASELINE,
        "baseline has too little traffic to measure (0 step stall samples, need 50): send traffic to the Service",
    )


def test_a_sequential_baseline_short_of_both_histograms_names_both() -> None:
    run = Run(make_spec(strategy="sequential"))
    run.step(baseline=ready(2))
    few = replace(metrics(), itl=itl(0.04, count=10), per_token=itl(0.03, count=10))
    run.step(after=120, baseline=ready(2), baseline_metrics=few)
    assert run.status.message == (
        "baseline has too little traffic to measure (10 step stall samples, need 50; 10 per-token "
        "samples, need 50): send traffic to the Service"
    )


def test_a_baseline_counts_its_step_stall_in_engine_steps() -> None:
    """400 step-stall samples at 10 running are 40 engine steps: fewer than minLatencySamples 50."""
    run = Run()
    run.step(baseline=ready(2))
    steps_short = replace(metrics(), itl=itl(0.04, count=400), engine_steps=40.0)
    run.step(after=120, baseline=ready(2), baseline_metrics=steps_short)
    assert run.status.message == (
        "baseline has too little traffic to measure (40 step stall samples, need 50): send traffic to the Service"
    )


def test_a_canary_without_a_step_count_is_judged_on_its_samples_saying_so() -> None:
    run = Run()
    run.to_analyzing()
    no_steps = replace(metrics(0.8), engine_steps=None)
    run.step(
        after=30, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=no_steps
    )
    assert (
        ": within 50%; no engine step count for the canary (vllm:iteration_tokens_total): samples counted "
        "as independent; speedup " in (run.status.message or "")
    )


def test_a_stored_baseline_keeps_its_engine_steps_for_the_stall_gate() -> None:
    """Sequential: the canary is compared with the stored baseline, whose steps status keeps; one
    stored before itlSteps existed has none, and the verdict says so."""
    run = Run(make_spec(strategy="sequential"))
    run.to_canary()
    assert run.status.baseline is not None and run.status.baseline.itl_steps == 25_000
    run.step(baseline=ready(2), canary=ready(1))
    run.step(baseline=ready(1), canary=ready(2))
    run.expect(Phase.ANALYZING)
    gone = TrackState(exists=True)
    run.step(after=31, baseline=gone, canary=ready(2), canary_metrics=metrics(0.8))
    assert (run.phase, (run.status.message or "")[-12:]) == (Phase.ANALYZING, ": within 50%")
    older = run.status.baseline.model_copy(update={"itl_steps": None})
    run.status = run.status.model_copy(update={"baseline": older})
    run.step(after=5, baseline=gone, canary=ready(2), canary_metrics=metrics(0.8))
    assert (run.status.message or "").endswith(
        ": within 50%; no engine step count for the baseline (vllm:iteration_tokens_total): samples counted "
        "as independent"
    )


def test_the_baseline_window_opens_only_after_the_warm_up() -> None:
    """Ready at T0, warm-up 30s: at T0 + 30s there is nothing to query yet; a second later, that
    second."""
    spec = make_spec()
    status = at(Phase.BASELINE, ready_since=api.iso(T0))
    assert rollout.measurement_window(spec, status, T0 + timedelta(seconds=30)) is None
    later = T0 + timedelta(seconds=31)
    assert rollout.measurement_window(spec, status, later) == Window(T0 + timedelta(seconds=30), later)


def test_the_analysis_window_opens_only_after_the_canarys_warm_up() -> None:
    """Analyzing since T0 (the warm-up's end): nothing to query during the warm-up or at its end."""
    spec = make_spec()
    status = at(Phase.ANALYZING).model_copy(update={"phase_since": api.iso(T0)})
    assert rollout.measurement_window(spec, status, T0 - timedelta(seconds=10)) is None
    assert rollout.measurement_window(spec, status, T0) is None
    later = T0 + timedelta(seconds=5)
    assert rollout.measurement_window(spec, status, later) == Window(T0, later)


@pytest.mark.parametrize("phase", [Phase.CANARY, Phase.PROMOTING, Phase.ROLLED_BACK])
def test_outside_baseline_analysis_and_promoted_nothing_is_queried(phase: Phase) -> None:
    """The guard is enabled (the default), yet its window is only the promoted config's."""
    assert rollout.measurement_window(make_spec(), at(phase), T0 + timedelta(minutes=5)) is None


def test_the_guard_does_not_compare_latency_at_a_load_unlike_the_stored_baselines() -> None:
    """After promotion the canary is compared with the baseline stored at 2 requests per second
    per pod: at 4 its longer step stall says nothing of the config, and the guard keeps guarding."""
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8, latency=0.4, load=4.0))
    assert (run.phase, run.status.reason) == (Phase.PROMOTED, Reason.GUARDING), run.status.message


def test_the_drift_allowance_follows_the_windows_length_as_scraped() -> None:
    """Scraped every 60 s, 8 acceptance windows span 8 minutes: a 3-minute swing of sd 0.09 averages
    down to a variance of 0.0081 * 0.49 = 0.0040 over them (read as 15 s windows, 2 minutes, it
    would be 0.0081 * 0.81 = 0.0066). 32,000 draft tokens at alpha 0.7 then give an SPRT log-LR of
    about 2 * 0.05 * 0.15 / 0.0040 = 3.8, over log(0.95 / 0.05) = 2.9: a Pass."""
    run = Run(make_spec(metrics={"scrapeInterval": "60s"}))
    run.to_analyzing()
    minutes = replace(metrics(0.7), acceptance=tuple(AcceptanceWindow(1000, 4000, 2800) for _ in range(8)))
    run.step(
        after=480, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=minutes
    )
    assert (run.phase, run.status.verdict) == (Phase.PROMOTING, "Pass"), run.status.message


def test_a_canary_that_accepts_well_but_is_slower_per_token_rolls_back_for_no_speedup() -> None:
    """Alpha 0.8 (gate 0.55) and P99 latencies alike pass, but the canary takes 33 ms a token where
    the baseline beside it takes 30 (speedup 30 / 33 = 0.909): NoSpeedup, the estimate in status."""
    run = Run()
    run.to_analyzing()
    run.step(
        after=20,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=metrics(),
        canary_metrics=metrics(0.8, pace=0.033),
    )
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.NO_SPEEDUP)
    canary = run.status.canary
    assert canary is not None and canary.speedup == pytest.approx(30 / 33, abs=1e-4)
    assert canary.speedup_lower is not None and canary.speedup_upper is not None
    assert canary.speedup_lower < canary.speedup < canary.speedup_upper
    assert canary.output_tokens_per_second_per_pod == 250.0  # the helper's 250 tok/s on one pod
    assert "speedup 0.909 [" in (run.status.message or "")


def test_the_gates_report_in_order_alpha_then_latency_then_speedup() -> None:
    """A canary below every gate (alpha 0.2, P99 ITL 0.14 s against 0.04, 10 % slower per token)
    rolls back for the first in the agreed order: AcceptanceBelowGate; with alpha fine,
    LatencyRegression; with latency fine too, NoSpeedup."""
    for alpha, latency, reason in (
        (0.2, 0.14, Reason.ACCEPTANCE_BELOW_GATE),
        (0.9, 0.14, Reason.LATENCY_REGRESSION),
        (0.9, 0.04, Reason.NO_SPEEDUP),
    ):
        run = Run()
        run.to_analyzing()
        slow = metrics(alpha, latency=latency, pace=0.033)
        run.step(
            after=20, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=slow
        )
        assert run.status.reason == reason, run.status.message


def test_min_speedup_demands_a_margin() -> None:
    """minSpeedup 1.3: the helper's canary, 1.25x faster per token (24 ms against 30), is 0.05 below
    it, beyond the 0.03 zone: NoSpeedup; at the default 1.0 it promotes (test above)."""
    run = Run(make_spec(gates={"minDrafts": 100, "minLatencySamples": 50, "minSpeedup": 1.3}))
    run.to_analyzing()
    run.step(
        after=20, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8)
    )
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.NO_SPEEDUP)


def test_a_canary_exactly_as_fast_is_decided_at_the_deadline_by_its_side() -> None:
    """Canary and baseline at 30 ms a token in every window: S = 1.00 exactly, inside the zone, and
    the SPRT's log-LR is 0: undecided until maxAnalysisDuration (10m here), where its estimate sits on
    the gate with no spread (radius 0 <= 0 + 0.03): Pass by its side, and the canary promotes."""
    run = Run()
    run.to_analyzing()
    same = metrics(0.8, pace=0.030)
    run.step(after=70, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=same)
    run.expect(Phase.ANALYZING)
    assert "speedup 1.000" in (run.status.message or "")
    run.step(after=600, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=same)
    run.expect(Phase.PROMOTING)
    assert "decided at maxAnalysisDuration by the estimate's side" in (run.status.message or "")


def test_without_a_baseline_beside_the_canary_the_speedup_is_not_judged() -> None:
    """Sequential: the baseline served alone before the canary; no window pairs with the canary's, so
    the speedup gate does not run (a slower canary is the latency gates' to judge there)."""
    run = Run(make_spec(strategy="sequential"))
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))
    run.step(after=95, baseline=ready(2), baseline_metrics=metrics())
    run.step(baseline=TrackState(), canary=ready(2))
    run.now += timedelta(seconds=30)
    run.step(after=70, baseline=TrackState(), canary=ready(2), canary_metrics=metrics(0.8, pace=0.033))
    assert run.phase in (Phase.ANALYZING, Phase.PROMOTING), run.status.message
    assert "speedup" not in (run.status.message or "")
    assert run.status.canary is not None and run.status.canary.alpha is not None
    assert run.status.canary.speedup is None
