"""Requests in annotations (`kubectl specgate pause|resume|retry|abort`): parsed, folded into the
spec the rollout follows, and the abort's path through decide() and handlers.step."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.handler_fakes import OWNER, FakeKube
from tests.unit.rollout_driver import Run, collapsed, edit, make_spec, metrics, ready

from specgate import api, cli, handlers, kube, rollout
from specgate.api import Phase
from specgate.observation import TrackState
from specgate.render import Track
from specgate.rollout import Reason

ABORT = "2026-11-24T10:00:00Z"
HALF_READY = TrackState(exists=True, replicas=2, ready_replicas=1)


def test_annotations_parse_into_requests_and_a_malformed_one_names_itself() -> None:
    assert api.parse_requests(None) == api.Requests()
    notes = {api.ANNOTATION_PAUSED: "true", api.ANNOTATION_RETRY: "3", api.ANNOTATION_ABORT: ABORT}
    assert api.parse_requests(notes) == api.Requests(paused=True, retries=3, abort=ABORT)
    with pytest.raises(api.SpecError, match=r"metadata\.annotations\[specgate\.dev/retry\]: 'two' is not"):
        api.parse_requests({api.ANNOTATION_RETRY: "two"})
    with pytest.raises(api.SpecError, match=r"'²' is not a whole number"):  # "²".isdigit() is True
        api.parse_requests({api.ANNOTATION_RETRY: "²"})
    with pytest.raises(api.SpecError, match=r"annotations\[specgate\.dev/paused\]: 'yes' is neither"):
        api.parse_requests({api.ANNOTATION_PAUSED: "yes"})


def test_the_rollout_follows_a_pause_from_either_source_and_the_sum_of_retries() -> None:
    spec = make_spec(paused=False, retry=2)
    folded = api.with_requests(spec, api.Requests(paused=True, retries=1))
    assert (folded.rollout.paused, folded.rollout.retry) == (True, 3)
    kept = api.with_requests(make_spec(paused=True), api.Requests())
    assert kept.rollout.paused  # resuming by annotation cannot undo the spec's own pause


def test_an_abort_during_analysis_rolls_back_through_the_capacity_steps_and_stays_rolled_back() -> None:
    run = Run()
    run.to_analyzing()
    d = run.step(abort=ABORT, baseline=HALF_READY, canary=ready(1), canary_metrics=metrics(0.9))
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.ABORTED)
    assert ABORT in (run.status.message or "") and "kubectl specgate retry" in (run.status.message or "")
    assert (d.baseline_replicas, d.canary_replicas) == (2, 1)  # the canary serves until the baseline is Ready
    run.step(abort=ABORT, baseline=ready(2), canary=ready(1))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.ABORTED)
    d = run.step(after=3600, abort=ABORT, baseline=ready(2), canary=ready(0))
    assert run.phase == Phase.ROLLED_BACK and d.canary_replicas == 0 and d.events == ()


def test_an_abort_before_the_canary_started_stops_at_once_and_a_retry_begins_again() -> None:
    run = Run()
    run.step(baseline=ready(2))
    run.step(abort=ABORT, baseline=ready(2))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.ABORTED)
    assert "the canary was never started" in (run.status.message or "")
    # `kubectl specgate retry`: the retry count goes up and the abort annotation goes.
    run.spec = api.with_requests(run.spec, api.Requests(retries=1))
    run.step(baseline=ready(2))
    assert run.phase == Phase.BASELINE and run.status.history[-1].reason == Reason.NEW_GENERATION


def test_an_abort_while_paused_rolls_back_the_phase_the_pause_held() -> None:
    run = Run(make_spec(paused=False))
    run.to_analyzing()
    run.spec = api.with_requests(run.spec, api.Requests(paused=True))
    run.step(baseline=ready(1), canary=ready(1))
    assert (run.phase, run.status.resume_phase) == (Phase.PAUSED, Phase.ANALYZING)
    d = run.step(abort=ABORT, baseline=HALF_READY, canary=ready(1))
    assert (run.phase, run.status.reason, run.status.resume_phase) == (
        Phase.ROLLING_BACK,
        Reason.ABORTED,
        None,
    )
    assert (d.baseline_replicas, d.canary_replicas) == (2, 1) and d.keep_template == {"canary"}


def test_a_pause_annotation_does_not_hold_the_guards_rollback() -> None:
    """After promotion the guard trips and the baseline grows back; `kubectl specgate pause` then
    must not hold pods half-way (the canary with alpha 0.2 serving most traffic): the rollback goes
    on to RolledBack, pod by pod, and no phase is kept to resume."""
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8))
    run.step(after=60, canary=ready(2), canary_metrics=collapsed())
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.GUARD_TRIPPED)
    run.spec = api.with_requests(run.spec, api.Requests(paused=True))
    d = run.step(baseline=ready(1), canary=ready(2))
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.ROLLING_BACK, 2, 1)
    d = run.step(baseline=ready(2), canary=ready(1))
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.ROLLED_BACK, 2, 0)
    assert run.status.resume_phase is None
    assert Phase.PAUSED not in [h.phase for h in run.status.history]


def test_an_abort_after_promotion_rolls_back_like_the_guard() -> None:
    """As the guard's rollback does: the baseline grows by maxSurge while every promoted pod serves
    on its gated template, the canary shrinks only as the baseline's pods are Ready, and the
    message says how to run the rollout again."""
    run = Run()
    run.to_promoted()
    steps = [((0, 2), (1, 2)), ((1, 2), (2, 1)), ((2, 1), (2, 0))]  # (ready baseline, canary) -> asked
    for (baseline, canary), asked in steps:
        d = run.step(abort=ABORT, baseline=ready(baseline), canary=ready(canary))
        assert (d.baseline_replicas, d.canary_replicas) == asked
        assert d.keep_template == frozenset({Track.CANARY})
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.ABORTED)
    assert [(h.phase, h.reason) for h in run.status.history[-2:]] == [
        (Phase.ROLLING_BACK, Reason.ABORTED),
        (Phase.ROLLED_BACK, Reason.ABORTED),
    ]
    assert ABORT in (run.status.message or "") and "kubectl specgate retry" in (run.status.message or "")


def test_an_abort_of_a_new_baseline_after_a_promotion_says_the_promoted_pods_still_serve() -> None:
    """A spec edit after promotion, aborted while the new baseline comes up: nothing of this rollout
    to roll back, but the promoted canary's pods serve until the baseline's are Ready (the message
    said the canary was never started), and they go only as the baseline's pods are Ready."""
    run = Run()
    run.to_promoted()
    edit(run, speculative={"method": "draft_model", "draftModel": "d", "numSpeculativeTokens": 2})
    run.step(baseline=TrackState(exists=True), canary=ready(2))
    run.expect(Phase.BASELINE)
    run.step(abort=ABORT, baseline=HALF_READY, canary=ready(2))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.ABORTED)
    message = run.status.message or ""
    assert "the last rollout's 2 canary pods serve until the baseline's are Ready" in message
    d = run.step(abort=ABORT, baseline=HALF_READY, canary=ready(2))
    assert (d.baseline_replicas, d.canary_replicas) == (2, 1)


def test_an_abort_on_a_failed_object_rolls_back_the_phase_its_fix_resumes() -> None:
    """Failed touches no pod; the abort waits for the spec to be fixed (then rolls that phase back)."""
    run = Run()
    run.to_analyzing()
    run.status = rollout.invalid_spec(api.SpecError("image", "bad"), run.status, 1, run.now).status
    run.step(abort=ABORT, baseline=ready(1), canary=ready(1))
    assert run.phase == Phase.ROLLING_BACK and run.status.reason == Reason.ABORTED


def test_the_handler_reads_the_annotations_and_a_malformed_one_fails_touching_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeKube(tracks={"llama-baseline": ready(2)}).install(monkeypatch)
    run = Run()
    raw = run.spec.model_dump(by_alias=True, mode="json")
    paused = handlers.step(
        raw, run.status, OWNER, 1, run.now, {api.ANNOTATION_PAUSED: "true"}, kube.Children()
    )
    assert paused.status.phase == Phase.PAUSED and "specgate.dev/paused" in (paused.status.message or "")
    fake.calls.clear()
    bad = handlers.step(
        raw,
        paused.status,
        OWNER,
        1,
        run.now + timedelta(seconds=10),
        {api.ANNOTATION_RETRY: "x"},
        kube.Children(),
    )
    assert (bad.status.phase, bad.status.reason) == (Phase.FAILED, Reason.INVALID_SPEC)
    assert "metadata.annotations[specgate.dev/retry]" in (bad.status.message or "")
    assert fake.calls == [] and not bad.touch_children


def obj(phase: str, **annotations: str) -> dict[str, Any]:
    return {"metadata": {"annotations": annotations, "resourceVersion": "7"}, "status": {"phase": phase}}


def test_the_cli_asks_for_annotations_and_refuses_a_retry_that_would_be_ignored() -> None:
    assert cli._request_changes("pause", obj("Analyzing")) == {api.ANNOTATION_PAUSED: "true"}
    assert cli._request_changes("resume", obj("Paused")) == {api.ANNOTATION_PAUSED: None}
    stamp = cli._request_changes("abort", obj("Promoted"))[api.ANNOTATION_ABORT]
    assert stamp is not None and stamp.endswith("Z")
    with pytest.raises(ValueError, match="it is Analyzing; retry re-runs a RolledBack or Failed"):
        cli._request_changes("retry", obj("Analyzing"))
    retried = cli._request_changes("retry", obj("RolledBack", **{api.ANNOTATION_RETRY: "2"}))
    assert retried == {api.ANNOTATION_RETRY: "3", api.ANNOTATION_ABORT: None}
    aborted = obj("RolledBack", **{api.ANNOTATION_ABORT: ABORT})
    assert cli._request_changes("retry", aborted) == {api.ANNOTATION_RETRY: "1", api.ANNOTATION_ABORT: None}
    with pytest.raises(ValueError, match="it is RollingBack; retry once it is RolledBack"):
        cli._request_changes("retry", obj("RollingBack", **{api.ANNOTATION_ABORT: ABORT}))


def test_kubectl_plugin_completion_prints_candidates_then_cobras_directive() -> None:
    """Run as kubectl runs it (a process of its own: argcomplete takes over its file descriptors)."""
    code = "import sys; from specgate.cli import complete_plugin; sys.argv[0] = 'kubectl_complete-specgate'; complete_plugin()"
    done = subprocess.run([sys.executable, "-c", code, "re"], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["resume", "retry", ":4"]
    done = subprocess.run(
        [sys.executable, "-c", code, "status", "--w"], capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == ["--watch", ":4"]


def test_removing_the_retry_annotation_re_runs_nothing() -> None:
    """Only a rise of spec.rollout.retry + the annotation's count re-runs a rollout that ended."""
    run = Run()
    run.spec = api.with_requests(make_spec(), api.Requests(retries=2))
    run.step(baseline=ready(2))
    run.step(abort=ABORT, baseline=ready(2))
    assert run.phase == Phase.ROLLED_BACK and run.status.observed_retry == 2
    run.spec = make_spec()  # `kubectl annotate sd NAME specgate.dev/retry- specgate.dev/abort-`
    d = run.step(baseline=ready(2))
    assert run.phase == Phase.ROLLED_BACK and d.events == () and run.status.observed_retry == 0
    run.spec = api.with_requests(make_spec(), api.Requests(retries=1))  # counted up from there
    run.step(baseline=ready(2))
    assert run.phase == Phase.BASELINE


def watched(phase: str, observed_retry: int, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"generation": 3, "annotations": annotations},
        "spec": {"rollout": {"retry": 1}},
        "status": {"phase": phase, "observedGeneration": 3, "observedRetry": observed_retry},
    }


def test_status_watch_waits_for_the_verdict_of_the_latest_request() -> None:
    """A request bumps no generation: the watch's verdict must be of the retry and abort asked for."""
    assert cli.watch_exit_code(watched("RolledBack", 1)) == cli.EXIT_ROLLED_BACK
    assert (
        cli.watch_exit_code(watched("RolledBack", 1, **{api.ANNOTATION_RETRY: "1"})) is None
    )  # retry 2 unseen
    assert cli.watch_exit_code(watched("Promoted", 2, **{api.ANNOTATION_RETRY: "1"})) == cli.EXIT_PROMOTED
    assert cli.watch_exit_code(watched("Promoted", 1, **{api.ANNOTATION_ABORT: ABORT})) is None
    assert (
        cli.watch_exit_code(watched("RolledBack", 1, **{api.ANNOTATION_ABORT: ABORT})) == cli.EXIT_ROLLED_BACK
    )
