"""Transitions of TRANSITIONS that test_rollout's one-step TABLE reaches only from a status written
for it: here each is driven through decide() from a new object, the way production gets there."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.rollout_driver import T0, Run, edit, make_spec, metrics, ready

from specgate import api, render, rollout
from specgate.api import Phase
from specgate.gates import AcceptanceWindow
from specgate.observation import BenchmarkJob, Observation, TrackState
from specgate.rollout import Event, Reason

BAD_DRAFT = api.SpecError("speculative.draftModel", "draftModel is required")


def to_promoting(run: Run) -> None:
    """Through a passing analysis into Promoting (the canary's second pod not Ready yet)."""
    run.to_analyzing()
    run.step(
        after=70, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8)
    )
    run.expect(Phase.PROMOTING)


def test_promoting_past_the_progress_deadline_rolls_back_keeping_the_ready_canary_pod() -> None:
    """The canary's second pod never becomes Ready: Promoting waits out progressDeadline (5m), then
    rolls back; the unready pod goes at once, the Ready one serves until the baseline's is Ready."""
    run = Run()
    to_promoting(run)
    stuck = TrackState(exists=True, replicas=2, ready_replicas=1, waiting="pod c-2: Unschedulable")
    run.step(after=290, baseline=ready(1), canary=stuck)
    assert (run.phase, run.status.reason) == (Phase.PROMOTING, Reason.GATES_PASSED)
    d = run.step(after=20, baseline=ready(1), canary=stuck)
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.CANARY_UNHEALTHY)
    assert "did not scale to 2 Ready replicas" in (run.status.message or "")
    assert (d.baseline_replicas, d.canary_replicas) == (2, 1)
    run.step(baseline=ready(2), canary=ready(1))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.CANARY_UNHEALTHY)


def test_inconclusive_analysis_with_on_inconclusive_pause_holds_until_a_retry() -> None:
    """No drafts for maxAnalysisDuration (10m): onInconclusive Pause stops in Paused with both
    tracks as they are; only spec.rollout.retry goes on, as a new rollout from the baseline."""
    run = Run(make_spec(onInconclusive="Pause"))
    run.to_analyzing()
    quiet = {"baseline_metrics": metrics(), "canary_metrics": metrics(None)}
    run.step(after=590, baseline=ready(1), canary=ready(1), **quiet)
    assert (run.phase, run.status.verdict) == (Phase.ANALYZING, "InsufficientData")
    d = run.step(after=20, baseline=ready(1), canary=ready(1), **quiet)
    assert (run.phase, run.status.reason, run.status.resume_phase) == (
        Phase.PAUSED,
        Reason.INCONCLUSIVE,
        None,
    )
    assert [e.type for e in d.events] == ["Warning"] and (d.baseline_replicas, d.canary_replicas) == (1, 1)
    d = run.step(after=3600, baseline=ready(1), canary=ready(1))
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.PAUSED, 1, 1)
    assert d.keep_template == {"baseline", "canary"} and d.events == ()
    edit(run, retry=1)
    d = run.step(baseline=ready(1), canary=ready(1))
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)
    assert (run.status.rollout_generation, d.baseline_replicas, d.canary_replicas) == (2, 2, 1)


@pytest.mark.parametrize(("canary_latency", "phase"), [(0.04, Phase.PROMOTING), (0.14, Phase.ROLLING_BACK)])
def test_sequential_analysis_compares_with_the_stored_baseline(canary_latency: float, phase: Phase) -> None:
    """Sequential: the candidate has taken every pod, so no baseline is measured beside it; its
    latency is gated against the baseline's histograms stored in status (same 40 ms: promoted;
    140 ms, past the 50 % step-stall tolerance: rolled back, the baseline growing back first)."""
    run = Run(make_spec(strategy="sequential"))
    run.to_canary()
    run.step(baseline=ready(2), canary=ready(1))
    run.step(baseline=ready(1), canary=ready(2))
    run.expect(Phase.ANALYZING)
    run.now += timedelta(seconds=30)  # the candidate's warm-up
    swapped = {"baseline": TrackState(exists=True), "canary": ready(2)}
    d = run.step(after=70, **swapped, canary_metrics=metrics(0.8, latency=canary_latency))
    assert run.phase == phase, run.status.message
    assert "no P99" not in (run.status.message or "")  # both latency gates had a baseline
    if phase == Phase.PROMOTING:
        assert (run.status.verdict, d.baseline_replicas, d.canary_replicas) == ("Pass", 0, 2)
    else:
        assert (run.status.reason, run.status.verdict) == (Reason.LATENCY_REGRESSION, "Fail")
        assert "step stall" in (run.status.message or "")
        assert (d.baseline_replicas, d.canary_replicas) == (1, 2)


def test_fixing_the_spec_of_a_new_object_begins_its_rollout() -> None:
    """Created invalid (the handler fails it before decide()), then fixed: a new generation of an
    object that never ran begins at the baseline."""
    run = Run()
    run.status = rollout.invalid_spec(BAD_DRAFT, run.status, run.generation, run.now).status
    run.expect(Phase.FAILED)
    run.generation += 1
    d = run.step(baseline=TrackState())
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)
    assert (d.touch_children, d.baseline_replicas, d.canary_replicas) == (True, 2, None)


def test_fixing_a_failed_spec_with_another_template_begins_a_new_rollout() -> None:
    """Failed during the analysis, then fixed to a different draft length: the pods' template has
    changed, so the analysis is not resumed (its figures are another config's) but begun again."""
    run = Run()
    run.to_analyzing()
    run.generation += 1
    run.status = rollout.invalid_spec(BAD_DRAFT, run.status, run.generation, run.now).status
    assert (run.phase, run.status.resume_phase) == (Phase.FAILED, Phase.ANALYZING)
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    d = run.step(baseline=ready(1), canary=ready(1))
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)
    assert (run.status.canary, run.status.resume_phase) == (None, None)
    assert (d.baseline_replicas, d.canary_replicas, d.keep_template) == (2, 1, frozenset({"canary"}))


def test_a_new_rollout_after_a_failed_edit_of_a_promoted_config_replaces_it_as_incumbent() -> None:
    """Promoted, then a bad edit (Failed, the promoted pods still serving), then fixed to a new draft:
    the new rollout replaces the promoted config, whose history measures the mix's drift, as it
    does after a valid edit (it found no incumbent here before)."""
    run = Run()
    run.to_promoted()
    promoted = next(h.time for h in run.status.history if h.phase == Phase.PROMOTED)
    run.generation += 1
    run.status = rollout.invalid_spec(BAD_DRAFT, run.status, run.generation, run.now).status
    assert (run.phase, run.status.resume_phase) == (Phase.FAILED, Phase.PROMOTED)
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    run.step(baseline=TrackState(exists=True), canary=ready(2))
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)
    assert (run.status.incumbent_since, run.status.incumbent_until) == (promoted, api.iso(run.now))


def test_fixing_a_failed_spec_back_to_the_same_template_resumes_the_analysis() -> None:
    """Failed during the analysis, then restored: Analyzing resumes with the canary as it is (no
    new rollout) and judges its metrics again."""
    run = Run()
    run.to_analyzing()
    run.generation += 1
    run.status = rollout.invalid_spec(BAD_DRAFT, run.status, run.generation, run.now).status
    run.generation += 1  # the spec as it was before the bad edit
    d = run.step(baseline=ready(1), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.8))
    assert (run.phase, run.status.resume_phase, run.status.verdict) == (Phase.ANALYZING, None, "Pass")
    assert Reason.NEW_GENERATION not in [h.reason for h in run.status.history[1:]]
    assert (d.baseline_replicas, d.canary_replicas, d.keep_template) == (1, 1, frozenset())
    assert [h.phase for h in run.status.history[-2:]] == [Phase.FAILED, Phase.ANALYZING]


def test_a_pause_does_not_hold_a_rollback() -> None:
    """Why Paused -> RollingBack is unreachable: a pause edit during a rollback is not recorded as a
    phase to resume; the rollback finishes and the pause waits for the next rollout."""
    run = Run()
    run.to_canary()
    crash = TrackState(exists=True, replicas=1, failure="pod c: CrashLoopBackOff")
    run.step(baseline=ready(1), canary=crash)
    run.expect(Phase.ROLLING_BACK)
    edit(run, paused=True)
    growing = TrackState(exists=True, replicas=2, ready_replicas=1)
    d = run.step(baseline=growing, canary=crash)
    assert (run.phase, run.status.resume_phase, d.keep_template) == (
        Phase.ROLLING_BACK,
        None,
        frozenset({"canary"}),
    )
    assert (d.baseline_replicas, d.canary_replicas) == (2, 0)
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, run.status.resume_phase) == (Phase.ROLLED_BACK, None)
    assert Phase.PAUSED not in [h.phase for h in run.status.history]


def name_conflict_then_freed(run: Run) -> None:
    """A new object whose Service name another object holds, until that object is deleted."""
    message = (
        "Service ns/m (not created by this SpeculativeDeployment): rename this object or remove the other"
    )
    run.status = rollout.failed(Reason.NAME_CONFLICT, message, run.status, run.generation, run.now).status
    run.step(baseline=TrackState())


def test_an_object_created_paused_pauses_once_its_name_is_free() -> None:
    """Pending -> Paused: the name conflict resumes the phase it failed in, Pending, at the same
    generation, and the pause holds it there."""
    run = Run(make_spec(paused=True))
    name_conflict_then_freed(run)
    assert [h.phase for h in run.status.history] == [Phase.FAILED, Phase.PENDING, Phase.PAUSED]
    assert (run.phase, run.status.resume_phase) == (Phase.PAUSED, Phase.PENDING)


def test_unpausing_an_object_that_was_created_paused_begins_its_rollout() -> None:
    """The object above, unpaused: its rollout should begin (decide() once raised on the arrow
    Paused -> Pending on every reconcile, so the object never left Paused)."""
    run = Run(make_spec(paused=True))
    name_conflict_then_freed(run)
    edit(run, paused=False)
    run.step(baseline=ready(2))
    assert run.phase == Phase.BASELINE and run.status.rollout_generation is not None
    assert Reason.NEW_GENERATION in [h.reason for h in run.status.history]


def test_a_bad_edit_while_paused_keeps_the_phase_the_pause_holds() -> None:
    """Paused in Analyzing, an invalid edit, the spec restored, then unpaused: the analysis resumes
    (it once came back Paused with no resumePhase, which reads as a pause by an action: unpausing
    did nothing and the retry it asked for restarted the rollout)."""
    run = Run()
    run.to_analyzing()
    edit(run, paused=True)
    run.step(baseline=ready(1), canary=ready(1))
    assert (run.phase, run.status.resume_phase) == (Phase.PAUSED, Phase.ANALYZING)
    run.generation += 1
    run.status = rollout.invalid_spec(BAD_DRAFT, run.status, run.generation, run.now).status
    run.generation += 1  # the spec as it was, still paused
    run.step(baseline=ready(1), canary=ready(1))
    edit(run, paused=False)
    run.step(baseline=ready(1), canary=ready(1))
    assert run.phase == Phase.ANALYZING, run.status.message


def fail_and_restore(run: Run) -> None:
    """An invalid edit (Failed), then the spec as it was before it."""
    run.generation += 1
    run.status = rollout.invalid_spec(BAD_DRAFT, run.status, run.generation, run.now).status
    run.generation += 1


def test_a_rollback_resumed_after_a_failed_spec_ends_with_its_own_reason() -> None:
    """Promoted, the guard trips, and during the rollback an invalid edit is made and restored: the
    rollback resumes saying why it rolls back and ends RolledBack GuardTripped (it ended Resumed)."""
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8, latency=0.4))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.GUARD_TRIPPED)
    fail_and_restore(run)
    d = run.step(baseline=TrackState(exists=True, replicas=2, ready_replicas=1), canary=ready(2))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.GUARD_TRIPPED)
    assert [e.reason for e in d.events] == [Reason.RESUMED]
    run.step(baseline=ready(2), canary=ready(1))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.GUARD_TRIPPED)
    assert "P99 ITL" in (run.status.message or "")


def test_a_rolled_back_object_restored_after_a_failed_spec_keeps_its_reason() -> None:
    run = Run()
    run.to_analyzing()
    run.step(after=70, baseline=ready(2), canary=ready(1), canary_metrics=metrics(0.2))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.ACCEPTANCE_BELOW_GATE)
    fail_and_restore(run)
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.ACCEPTANCE_BELOW_GATE)


def test_an_edit_during_a_rollback_begins_its_rollout_once_rolled_back() -> None:
    """The guard trips and the spec is edited during the rollback: the rollback finishes first, and
    RolledBack keeps its reason, verdict and canary figures (the edit wiped them, and the rollback
    became a Baseline); the edit's rollout begins after."""
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8, latency=0.4))
    run.expect(Phase.ROLLING_BACK)
    figures = (run.status.canary, run.status.verdict)
    assert None not in figures
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    run.step(baseline=TrackState(exists=True, replicas=2, ready_replicas=1), canary=ready(2))
    assert (run.phase, (run.status.canary, run.status.verdict)) == (Phase.ROLLING_BACK, figures)
    run.step(baseline=ready(2), canary=ready(1))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.GUARD_TRIPPED)
    assert (run.status.canary, run.status.verdict) == figures
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)


def test_an_edit_fixed_after_failing_during_a_rollback_still_waits_for_rolled_back() -> None:
    """The guard trips; during the rollback an invalid edit (Failed), then fixed as a new draft
    length: the rollback resumes and ends RolledBack GuardTripped with its figures, and only then
    does the edit's rollout begin (the fix restarted the rollout at once: Baseline NewGeneration,
    the rollback's reason and figures gone, as an edit made directly during RollingBack once did)."""
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8, latency=0.4))
    run.expect(Phase.ROLLING_BACK)
    figures = (run.status.canary, run.status.verdict)
    run.generation += 1
    run.status = rollout.invalid_spec(BAD_DRAFT, run.status, run.generation, run.now).status
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    d = run.step(baseline=TrackState(exists=True, replicas=2, ready_replicas=1), canary=ready(2))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.GUARD_TRIPPED)
    assert (d.baseline_replicas, d.canary_replicas) == (2, 1)
    assert [e.message for e in d.events] == [
        "the spec is valid again; its new template waits for RolledBack; resuming RollingBack"
    ]
    run.step(baseline=ready(2), canary=ready(1))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.GUARD_TRIPPED)
    assert (run.status.canary, run.status.verdict) == figures
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)


INVALID = "invalid spec: spec.speculative.draftModel: draftModel is required"
CONDITIONS_OF_FAILED = {
    "Available": "False",
    "Progressing": "False",
    "Degraded": "True",
    "Ready": "False",
    "Reconciling": "False",
    "Stalled": "True",
}


def test_a_failed_spec_is_recorded_in_status_history_conditions_and_a_warning_event() -> None:
    """An invalid edit of a promoted rollout: Failed since now, the phase to resume, one history
    entry and one Warning Event with the message users read, and every condition says Failed (for
    the edit's generation): Degraded and Stalled, no longer Available or Ready."""
    run = Run()
    run.to_promoted()
    later = run.now + timedelta(seconds=30)
    d = rollout.invalid_spec(BAD_DRAFT, run.status, 2, later)
    status = d.status
    assert (status.phase, status.reason, status.message) == (Phase.FAILED, Reason.INVALID_SPEC, INVALID)
    assert (status.phase_since, status.resume_phase, status.observed_generation) == (
        api.iso(later),
        Phase.PROMOTED,
        2,
    )
    assert status.history[-1] == api.HistoryEntry(
        time=api.iso(later), phase=Phase.FAILED, reason=Reason.INVALID_SPEC, message=INVALID
    )
    assert {c.type: c.status for c in status.conditions} == CONDITIONS_OF_FAILED
    assert {(c.reason, c.message, c.observed_generation) for c in status.conditions} == {
        (Reason.INVALID_SPEC, INVALID, 2)
    }
    assert d.events == (rollout.Event("Warning", Reason.INVALID_SPEC, INVALID),)
    assert d.touch_children is False


def test_the_same_failure_seen_again_changes_nothing_but_another_bad_edit_is_a_new_failure() -> None:
    """Each reconcile of the same invalid generation finds it Failed as before: phaseSince, history
    and Events stay. A second invalid edit (a new generation), even with the same error, is a new
    failure: since now, in the history, and a Warning Event."""
    run = Run()
    run.to_analyzing()
    first = rollout.invalid_spec(BAD_DRAFT, run.status, 2, run.now).status
    again = rollout.invalid_spec(BAD_DRAFT, first, 2, run.now + timedelta(minutes=5))
    assert (again.status.phase_since, again.status.history, again.events) == (
        api.iso(run.now),
        first.history,
        (),
    )
    edited = run.now + timedelta(minutes=10)
    second = rollout.invalid_spec(BAD_DRAFT, again.status, 3, edited)
    assert (second.status.phase_since, second.status.resume_phase) == (api.iso(edited), Phase.ANALYZING)
    assert second.status.history == [
        *first.history,
        api.HistoryEntry(
            time=api.iso(edited), phase=Phase.FAILED, reason=Reason.INVALID_SPEC, message=INVALID
        ),
    ]
    assert second.events == (rollout.Event("Warning", Reason.INVALID_SPEC, INVALID),)


def test_a_fixed_spec_resumes_with_the_reason_and_message_the_phase_was_entered_with() -> None:
    """RolledBack for a low alpha, an invalid edit, the spec restored: RolledBack again with its own
    reason and message (not the Failed one's), a history entry and a Normal Event saying why."""
    run = Run()
    run.to_analyzing()
    run.step(after=70, baseline=ready(2), canary=ready(1), canary_metrics=metrics(0.2))
    run.expect(Phase.ROLLED_BACK)
    rolled_back = run.status.message
    fail_and_restore(run)
    d = run.step(baseline=ready(2), canary=TrackState(exists=True))
    why = "the spec is valid again and the pods' template is unchanged"
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.ROLLED_BACK,
        Reason.ACCEPTANCE_BELOW_GATE,
        rolled_back,
    )
    assert run.status.history[-1] == api.HistoryEntry(
        time=api.iso(run.now), phase=Phase.ROLLED_BACK, reason=Reason.RESUMED, message=why
    )
    assert d.events == (rollout.Event("Normal", Reason.RESUMED, f"{why}; resuming RolledBack"),)


def test_a_resumed_phase_whose_entry_left_the_history_says_it_resumed() -> None:
    """A promoted config paused and unpaused 15 times (a person, then Argo CD's self-heal): the 30
    newest history entries are the pauses and the resumes, so the one why Promoted began is gone. A
    spec fixed after an invalid edit then resumes Promoted saying so (the guard is off here, so no
    look of the guard rewrites it)."""
    run = Run(make_spec(guard={"enabled": False}))
    run.to_promoted()
    for _ in range(15):
        for paused in (True, False):
            edit(run, paused=paused)
            run.step(baseline=TrackState(exists=True), canary=ready(2))
    assert {(h.phase, h.reason) for h in run.status.history} == {
        (Phase.PAUSED, Reason.PAUSED),
        (Phase.PROMOTED, Reason.RESUMED),
    }
    fail_and_restore(run)
    d = run.step(baseline=TrackState(exists=True), canary=ready(2))
    message = "the spec is valid again and the pods' template is unchanged; resuming Promoted"
    assert (run.phase, run.status.reason, run.status.message) == (Phase.PROMOTED, Reason.RESUMED, message)
    assert (d.baseline_replicas, d.canary_replicas) == (0, 2)


def test_an_invalid_edit_of_a_rollout_paused_for_a_retry_still_waits_for_the_retry() -> None:
    """Paused by onInconclusive Pause (no phase to resume: only a retry goes on), then an invalid
    edit fixed: Paused again with its reason, holding both tracks, until spec.rollout.retry begins
    a new rollout."""
    run = Run(make_spec(onInconclusive="Pause"))
    run.to_analyzing()
    quiet = {"baseline_metrics": metrics(), "canary_metrics": metrics(None)}
    run.step(after=610, baseline=ready(1), canary=ready(1), **quiet)
    assert (run.phase, run.status.resume_phase) == (Phase.PAUSED, None)
    run.generation += 1
    run.status = rollout.invalid_spec(BAD_DRAFT, run.status, run.generation, run.now).status
    assert run.status.resume_phase == Phase.PAUSED
    run.generation += 1
    d = run.step(baseline=ready(1), canary=ready(1))
    assert (run.phase, run.status.reason, run.status.resume_phase) == (
        Phase.PAUSED,
        Reason.INCONCLUSIVE,
        None,
    )
    assert (d.baseline_replicas, d.canary_replicas, d.keep_template) == (1, 1, {"baseline", "canary"})
    edit(run, retry=1)
    run.step(baseline=ready(1), canary=ready(1))
    assert (run.phase, run.status.history[-1].reason) == (Phase.BASELINE, Reason.NEW_GENERATION)


# --- what each step says: its events, messages and status fields (mutation testing, issue 42) ---

NEW_DRAFT_LENGTH = {"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2}


def test_a_new_rollouts_first_look_says_so_in_normal_events() -> None:
    """A new object whose baseline pods are not Ready yet: the rollout begins and waits, both told
    as Normal Events (nothing is wrong) with the messages users read; no promoted config serves, so
    there is no incumbent to measure the mix's drift on."""
    run = Run()
    d = run.step(baseline=TrackState(exists=True, replicas=2))
    assert d.events == (
        Event("Normal", Reason.NEW_GENERATION, "rollout of generation 1 begins"),
        Event("Normal", Reason.WAITING_FOR_BASELINE, "waiting for baseline: 0/2 ready"),
    )
    assert (run.status.reason, run.status.message) == (
        Reason.WAITING_FOR_BASELINE,
        "waiting for baseline: 0/2 ready",
    )
    assert (run.status.incumbent_since, run.status.incumbent_until) == (None, None)


def test_a_step_outside_transitions_is_refused_naming_it() -> None:
    """decide() never leaves TRANSITIONS: a handler asking for an arrow that is not there raises,
    naming it, rather than writing a phase change the state machine does not have."""
    spec = make_spec()
    status = api.SpeculativeDeploymentStatus(phase=Phase.BASELINE, phase_since=api.iso(T0))
    step = rollout._Step(
        spec, status, Observation(generation=1), T0, baseline_replicas=2, canary_replicas=None
    )
    with pytest.raises(AssertionError, match=r"^transition Baseline -> Promoted is not in TRANSITIONS$"):
        step.enter(Phase.PROMOTED, Reason.PROMOTED, "skipping the canary")


def test_status_reports_the_observed_templates_and_the_generation_its_conditions_are_for() -> None:
    """status carries the pod template hashes the two Deployments were seen with, and every
    condition says which generation it describes."""
    run = Run()
    b, c = render.Track.BASELINE, render.Track.CANARY
    on_spec = {t: render.template_hash(run.spec, t) for t in (b, c)}
    run.generation = 3
    d = run.step(
        baseline=replace(ready(2), template_hash=on_spec[b]),
        canary=TrackState(exists=True, template_hash=on_spec[c]),
    )
    assert (d.status.baseline_template_hash, d.status.canary_template_hash) == (on_spec[b], on_spec[c])
    assert {cond.observed_generation for cond in d.status.conditions} == {3}


def test_a_retry_of_a_rollout_that_has_not_ended_is_ignored_with_an_event_saying_why() -> None:
    run = Run()
    to_promoting(run)
    edit(run, retry=1)
    d = run.step(baseline=ready(1), canary=TrackState(exists=True, replicas=2, ready_replicas=1))
    run.expect(Phase.PROMOTING)
    assert (
        Event("Normal", Reason.RETRY_IGNORED, "spec.rollout.retry ignored: the rollout is Promoting")
        in d.events
    )


# --- a new rollout: what it forgets of the last one ---


def to_rolled_back_for_low_alpha(run: Run) -> None:
    run.to_analyzing()
    run.step(
        after=70, baseline=ready(2), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.2)
    )
    run.expect(Phase.ROLLED_BACK)


def test_a_rollback_finished_in_the_same_step_warns_once() -> None:
    """The baseline still has all its Ready pods when the canary fails its gate: RollingBack and
    RolledBack in one step, one Warning (a person must look at it) and the end as a Normal Event."""
    run = Run()
    run.to_analyzing()
    d = run.step(
        after=70, baseline=ready(2), canary=ready(1), baseline_metrics=metrics(), canary_metrics=metrics(0.2)
    )
    run.expect(Phase.ROLLED_BACK)
    assert [(e.type, e.reason) for e in d.events] == [
        ("Warning", Reason.ACCEPTANCE_BELOW_GATE),
        ("Normal", Reason.ACCEPTANCE_BELOW_GATE),
    ]
    assert d.events[0].message == d.events[1].message == run.status.message


def test_a_retry_after_a_rollback_warms_the_baseline_up_again_and_forgets_the_verdict() -> None:
    """The retried rollout measures its own baseline: Ready again is a new warm-up (30s) before any
    measurement, and the last rollout's verdict and draft-length advice are not shown as this one's."""
    run = Run()
    to_rolled_back_for_low_alpha(run)
    assert run.status.verdict == "Fail" and run.status.recommendation is not None
    edit(run, retry=1)
    d = run.step(baseline=ready(2), canary=TrackState(exists=True))
    run.expect(Phase.BASELINE)
    message = "baseline is Ready; warming up for 30s, then measuring"
    assert (run.status.reason, run.status.message) == (Reason.MEASURING_BASELINE, message)
    assert Event("Normal", Reason.MEASURING_BASELINE, message) in d.events
    assert (run.status.verdict, run.status.recommendation) == (None, None)
    run.step(after=25, baseline=ready(2), canary=TrackState(exists=True), baseline_metrics=metrics())
    run.expect(Phase.BASELINE)


def test_a_rollback_begun_while_metrics_were_missing_does_not_report_them_missing() -> None:
    """The canary's metrics go missing during the analysis, then its pod crash-loops: the rollback
    reads no metrics, so status does not carry on saying since when they are missing."""
    run = Run()
    run.to_analyzing()
    run.step(after=40, baseline=ready(1), canary=ready(1), baseline_metrics=metrics())
    assert (run.status.reason, run.status.metrics_unavailable_since) == (
        Reason.METRICS_UNAVAILABLE,
        api.iso(run.now),
    )
    crash = TrackState(exists=True, replicas=1, failure="pod c: CrashLoopBackOff")
    run.step(baseline=ready(1), canary=crash)
    run.expect(Phase.ROLLING_BACK)
    assert run.status.metrics_unavailable_since is None


def test_a_new_rollout_of_a_paused_promoted_config_measures_the_drift_on_its_history() -> None:
    """Promoted, then paused, then a new draft length: the promoted config still serves (the pause
    held it), so the new rollout reads its history from its promotion up to now."""
    run = Run()
    run.to_promoted()
    promoted = next(h.time for h in run.status.history if h.phase == Phase.PROMOTED)
    edit(run, paused=True)
    run.step(baseline=TrackState(exists=True), canary=ready(2))
    assert (run.phase, run.status.resume_phase) == (Phase.PAUSED, Phase.PROMOTED)
    edit(run, speculative=NEW_DRAFT_LENGTH)
    run.step(after=3600, baseline=TrackState(exists=True), canary=ready(2))
    assert (run.status.incumbent_since, run.status.incumbent_until) == (promoted, api.iso(run.now))


def test_a_new_rollout_after_a_guard_rollback_has_no_promoted_config_to_measure() -> None:
    """The promoted config was rolled back by the guard: the baseline serves, so the next rollout has
    no incumbent history (its promotion long ago is not what serves)."""
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8, latency=0.4))
    run.expect(Phase.ROLLING_BACK)
    run.step(baseline=ready(2), canary=ready(1))
    run.expect(Phase.ROLLED_BACK)
    edit(run, speculative=NEW_DRAFT_LENGTH)
    run.step(baseline=ready(2), canary=TrackState(exists=True))
    run.expect(Phase.BASELINE)
    assert (run.status.incumbent_since, run.status.incumbent_until) == (None, None)


def test_a_new_rollout_forgets_that_the_promoted_canary_was_short_of_pods() -> None:
    """A promoted canary one pod short starts the progressDeadline clock; a new draft length begins
    a new rollout, which must not inherit that clock (a later promotion would roll back at once)."""
    run = Run()
    run.to_promoted()
    short = TrackState(exists=True, replicas=2, ready_replicas=1)
    run.step(after=60, baseline=TrackState(exists=True), canary=short, canary_metrics=metrics(0.8))
    assert run.status.unready_since == api.iso(run.now)
    edit(run, speculative=NEW_DRAFT_LENGTH)
    run.step(baseline=TrackState(exists=True), canary=short)
    run.expect(Phase.BASELINE)
    assert run.status.unready_since is None


def test_unpausing_an_object_created_paused_creates_its_baseline_and_records_its_template() -> None:
    """The object created paused never had a baseline Deployment: unpaused, its rollout asks for
    the baseline at spec.replicas (2) and records the template it rolls out."""
    run = Run(make_spec(paused=True))
    name_conflict_then_freed(run)
    edit(run, paused=False)
    d = run.step(baseline=TrackState())
    run.expect(Phase.BASELINE)
    assert (d.baseline_replicas, d.canary_replicas) == (2, None)
    assert run.status.template_hash == render.template_hash(run.spec)


# --- the waits and their deadlines, to the second ---


def test_the_baseline_is_waited_for_until_just_past_the_progress_deadline() -> None:
    """Baseline pods never Ready: at exactly progressDeadline (5m) the rollout still waits; a second
    later BaselineUnhealthy, saying what it waits for."""
    run = Run()
    stuck = TrackState(exists=True, replicas=2, waiting="pod b-1: Unschedulable")
    run.step(baseline=stuck)
    run.step(after=300, baseline=stuck)
    assert (run.status.reason, run.status.message) == (
        Reason.WAITING_FOR_BASELINE,
        "waiting for baseline: 0/2 ready (pod b-1: Unschedulable)",
    )
    run.step(after=1, baseline=stuck)
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.BASELINE,
        Reason.BASELINE_UNHEALTHY,
        "baseline not Ready within progressDeadline 5m (waiting for baseline: 0/2 ready "
        "(pod b-1: Unschedulable)); nothing to roll back to: the rollout waits",
    )


def test_the_baseline_is_measured_as_soon_as_warm_up_and_window_have_passed() -> None:
    """Ready seen at t: warm-up (30s) and the analysis window (60s) end at t + 90s, when the
    baseline is measured and the canary begins."""
    run = Run()
    run.step(baseline=ready(2))
    run.step(after=90, baseline=ready(2), baseline_metrics=metrics())
    run.expect(Phase.CANARY)


def test_a_new_rollout_waits_for_the_last_canary_pod_to_go_before_measuring_the_baseline() -> None:
    """After a promotion the new rollout's baseline is Ready while one canary pod still serves: the
    baseline is not measured (it does not carry all the traffic yet), however long that lasts."""
    run = Run()
    run.to_promoted()
    edit(run, speculative=NEW_DRAFT_LENGTH)
    for _ in range(3):
        run.step(after=60, baseline=ready(2), canary=ready(1), baseline_metrics=metrics())
        assert (run.phase, run.status.reason) == (Phase.BASELINE, Reason.WAITING_FOR_BASELINE)
        assert run.status.ready_since is None


def test_a_new_baseline_template_is_measured_only_once_its_pods_run_it() -> None:
    """A new vLLM image after a rollback: the baseline's Ready pods still run the old template (the
    new one waits for capacity), so they are not measured; once they run the spec's, warm-up begins."""
    run = Run()
    to_rolled_back_for_low_alpha(run)
    old = render.template_hash(run.spec, render.Track.BASELINE)
    run.spec = api.parse_spec({**run.spec.model_dump(by_alias=True, mode="json"), "image": "vllm:v2"})
    run.generation += 1
    new = render.template_hash(run.spec, render.Track.BASELINE)
    assert new != old
    run.step(baseline=replace(ready(2), template_hash=old), canary=TrackState(exists=True))
    assert (run.status.reason, run.status.ready_since) == (Reason.WAITING_FOR_BASELINE, None)
    run.step(baseline=replace(ready(2), template_hash=new), canary=TrackState(exists=True))
    assert (run.status.reason, run.status.message) == (
        Reason.MEASURING_BASELINE,
        "baseline is Ready; warming up for 30s, then measuring",
    )


def test_the_canary_is_waited_for_until_just_past_the_progress_deadline() -> None:
    """The canary's pod never becomes Ready: Canary waits (WaitingForCanary, saying so) through the
    5m progressDeadline, then rolls back a second past it, naming how many pods were Ready."""
    run = Run()
    run.to_canary()
    pending = TrackState(exists=True, replicas=1)
    d = run.step(after=300, baseline=ready(2), canary=pending)
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.CANARY,
        Reason.WAITING_FOR_CANARY,
        "waiting for canary: 0/1 ready",
    )
    assert d.events == (Event("Normal", Reason.WAITING_FOR_CANARY, "waiting for canary: 0/1 ready"),)
    run.step(after=1, baseline=ready(2), canary=pending)
    assert (run.status.reason, run.status.message) == (
        Reason.CANARY_UNHEALTHY,
        "canary not Ready within progressDeadline 5m (0/1 ready)",
    )


def test_a_ready_canary_starts_the_analysis_saying_so() -> None:
    run = Run()
    run.to_analyzing()
    entered = run.status.history[-1]
    assert (entered.phase, entered.reason, entered.message) == (
        Phase.ANALYZING,
        Reason.CANARY_READY,
        "canary is Ready; analysis begins after warm-up",
    )


def test_promoting_waits_until_just_past_the_progress_deadline_saying_for_what() -> None:
    run = Run()
    to_promoting(run)
    stuck = TrackState(exists=True, replicas=2, ready_replicas=1, waiting="pod c-2: Unschedulable")
    run.step(after=300, baseline=ready(1), canary=stuck)
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.PROMOTING,
        Reason.GATES_PASSED,
        "waiting for canary: 1/2 ready (pod c-2: Unschedulable)",
    )
    run.step(after=1, baseline=ready(1), canary=stuck)
    run.expect(Phase.ROLLING_BACK)


def test_a_promoted_canary_short_of_a_pod_is_still_guarded_until_the_progress_deadline() -> None:
    """One promoted pod lost: the guard goes on judging the pods that serve; at exactly
    progressDeadline (5m) it is still Promoted, a second later rolled back, saying why."""
    run = Run()
    run.to_promoted()
    short = TrackState(exists=True, replicas=2, ready_replicas=1)
    run.step(after=60, baseline=TrackState(exists=True), canary=short, canary_metrics=metrics(0.8))
    assert (run.phase, run.status.reason) == (Phase.PROMOTED, Reason.GUARDING)
    assert (run.status.message or "").startswith("guard: ")
    assert run.status.guard is not None and run.status.guard.checked_at == api.iso(run.now)
    run.step(after=300, baseline=TrackState(exists=True), canary=short, canary_metrics=metrics(0.8))
    run.expect(Phase.PROMOTED)
    run.step(after=1, baseline=TrackState(exists=True), canary=short, canary_metrics=metrics(0.8))
    assert (run.phase, run.status.reason, run.status.message) == (
        Phase.ROLLING_BACK,
        Reason.CANARY_UNHEALTHY,
        "promoted canary below 2 Ready replicas for progressDeadline 5m (waiting for canary: 1/2 ready)",
    )


# --- benchmark mode (spec.rollout.measurement benchmark or both) ---


def bench_run(measurement: str = "benchmark") -> Run:
    return Run(make_spec(measurement=measurement, benchmark={"concurrency": [1, 8], "numPrompts": 50}))


def bench_report(p99_itl_ms: float, alpha: float | None = None) -> str:
    """bench_driver's report: the same figures at concurrency 1 and 8 (alpha: with vLLM's counters)."""
    point: dict[str, Any] = {
        "completed": 50, "failed": 0, "p99_itl_ms": p99_itl_ms, "mean_itl_ms": p99_itl_ms / 2,
        "p99_tpot_ms": 15.0, "mean_tpot_ms": 10.0, "p99_ttft_ms": 80.0, "output_throughput": 500.0,
    }  # fmt: skip
    if alpha is not None:
        point |= {"acceptance_rate_percent": alpha * 100, "drafts": 400, "acceptance_per_position": [alpha]}
    return json.dumps({"points": [{"concurrency": c, **point} for c in (1, 8)]})


def finished_job(track: str, report: str) -> BenchmarkJob:
    return BenchmarkJob(f"llama-bench-{track}-1", exists=True, finished=True, report=report, start=T0, end=T0)


BASELINE_BENCHMARK = "baseline benchmark at concurrency 8: P99 ITL 22.0 ms, P99 TTFT 80.0 ms, 500.0 tok/s"


def test_the_baseline_benchmark_starts_exactly_when_its_warm_up_ends() -> None:
    """Ready seen at t: no Job during the 30s warm-up (the pods are still compiling and caching), its
    Job asked for at t + 30s."""
    run = bench_run()
    run.step(baseline=ready(2))
    warming = run.step(after=20, baseline=ready(2))
    assert (warming.benchmark_track, run.status.reason) == (None, Reason.MEASURING_BASELINE)
    started = run.step(after=10, baseline=ready(2), baseline_job=BenchmarkJob("llama-bench-baseline-1"))
    assert (started.benchmark_track, run.status.reason) == ("baseline", Reason.RUNNING_BENCHMARK)


def test_a_benchmarked_baseline_is_described_by_its_benchmark_alone() -> None:
    """Benchmark mode measures no traffic: the baseline's figures are its benchmark's, with no
    "no figures" for traffic that was never measured."""
    run = bench_run()
    run.step(baseline=ready(2))
    run.step(after=30, baseline=ready(2), baseline_job=BenchmarkJob("llama-bench-baseline-1"))
    run.step(baseline=ready(2), baseline_job=finished_job("baseline", bench_report(22.0)))
    run.expect(Phase.CANARY)
    assert run.status.message == BASELINE_BENCHMARK


def test_both_modes_describe_the_baseline_by_its_traffic_then_its_benchmark() -> None:
    run = bench_run("both")
    run.step(baseline=ready(2))
    done = finished_job("baseline", bench_report(22.0))
    run.step(after=30, baseline=ready(2), baseline_job=done)
    run.step(after=60, baseline=ready(2), baseline_job=done, baseline_metrics=metrics())
    run.expect(Phase.CANARY)
    assert run.status.baseline is not None
    assert run.status.message == f"baseline: {run.status.baseline.figures()}; {BASELINE_BENCHMARK}"


def test_a_benchmark_promoted_canary_is_guarded_on_its_production_traffic() -> None:
    """Benchmark mode judged no production traffic, so no mix drift was kept: after promotion the
    guard still watches the canary's traffic, with the first rollout's fallback drift."""
    run = bench_run()
    run.step(baseline=ready(2))
    run.step(after=30, baseline=ready(2), baseline_job=BenchmarkJob("llama-bench-baseline-1"))
    run.step(baseline=ready(2), baseline_job=finished_job("baseline", bench_report(22.0)))
    run.step(baseline=ready(1), canary=ready(1))
    run.expect(Phase.ANALYZING)
    run.step(after=40, baseline=ready(1), canary=ready(1), canary_job=BenchmarkJob("llama-bench-canary-1"))
    windows = tuple(AcceptanceWindow(100, 300, 240) for _ in range(4))
    done = finished_job("canary", bench_report(23.0, alpha=0.8))
    run.step(baseline=ready(1), canary=ready(1), canary_job=done, canary_job_acceptance=windows)
    run.expect(Phase.PROMOTING)
    run.step(baseline=ready(1), canary=ready(2))
    run.expect(Phase.PROMOTED)
    assert run.status.mix_drift is None
    run.step(after=60, baseline=TrackState(exists=True), canary=ready(2), canary_metrics=metrics(0.8))
    assert (run.phase, run.status.reason) == (Phase.PROMOTED, Reason.GUARDING)
    assert run.status.canary is not None and run.status.canary.alpha is not None
