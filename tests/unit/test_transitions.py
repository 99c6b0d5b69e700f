"""Transitions of TRANSITIONS that test_rollout's one-step TABLE reaches only from a status written
for it: here each is driven through decide() from a new object, the way production gets there."""

from __future__ import annotations

from datetime import timedelta

import pytest
from tests.unit.rollout_driver import Run, edit, make_spec, metrics, ready

from specgate import api, rollout
from specgate.api import Phase
from specgate.observation import TrackState
from specgate.rollout import Reason

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
