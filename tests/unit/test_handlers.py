"""handlers.py's wiring (observe -> decide -> apply, and the status patch), with specgate.kube and
the Prometheus client faked at their module seam: the calls the handler makes, in its order."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import kopf
import pytest
from tests.unit.handler_fakes import OWNER, FakeKube, reconcile_step
from tests.unit.rollout_driver import (
    NEAR_GATE,
    T0,
    Run,
    make_spec,
    metrics,
    ready,
    spec_body,
    steady_history,
    to_rerollout,
)

from specgate import api, handlers, kube, render
from specgate.api import Phase
from specgate.gates import AcceptanceWindow
from specgate.observation import TrackMetrics, TrackState, Window
from specgate.prometheus import MetricsUnavailable, Selector
from specgate.render import Manifest, Track
from specgate.rollout import Reason

PROMETHEUS = "http://prometheus.monitoring:9090"
JOBS = frozenset({"llama-bench-baseline-1", "llama-bench-canary-1"})  # the rollout of generation 1


@dataclass
class FakePrometheus:
    """Stands in for the PrometheusClient class: answers track_metrics by track (an exception is
    raised) and records each query's URL, matchers, window and scrape interval."""

    answers: dict[str, TrackMetrics | Exception] = field(default_factory=dict)
    queries: list[tuple[str, str, Window, float]] = field(default_factory=list)
    url: str = ""
    history: tuple[AcceptanceWindow, ...] | Exception = ()
    history_queries: list[tuple[str, Window]] = field(default_factory=list)
    history_steps: list[float | None] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakePrometheus:
        monkeypatch.setattr(handlers, "PrometheusClient", self)
        return self

    def __call__(self, url: str) -> FakePrometheus:
        self.url = url
        return self

    def track_metrics(
        self, sel: Selector, window: Window, scrape_interval: float, leave_out: Sequence[Window] = ()
    ) -> TrackMetrics | None:
        self.queries.append((self.url, sel.matchers(), window, scrape_interval))
        answer = self.answers[sel.track]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def history_windows(
        self, sel: Selector, window: Window, scrape_interval: float, step: float | None = None
    ) -> tuple[tuple[AcceptanceWindow, ...], float]:
        self.history_queries.append((sel.matchers(), window))
        self.history_steps.append(step)
        if isinstance(self.history, Exception):
            raise self.history
        return self.history, step or 60.0


def rolling_back() -> Run:
    """A promoted rollout whose canary crash-loops: RollingBack, the baseline grown to 1 pod."""
    run = Run()
    run.to_promoted()
    crash = TrackState(exists=True, replicas=2, ready_replicas=2, failure="pod c-2: CrashLoopBackOff")
    d = run.step(baseline=TrackState(exists=True), canary=crash)
    assert (run.phase, d.baseline_replicas, d.canary_replicas) == (Phase.ROLLING_BACK, 1, 2)
    return run


def test_a_rollback_shrinks_the_canary_before_it_grows_the_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Baseline 1 -> 2 and canary 2 -> 1 in one step: the shrinking canary first (only scaled: its
    pods keep their template), then the baseline's manifest, the Service, and old benchmark Jobs."""
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(2)}).install(monkeypatch)
    prometheus = FakePrometheus().install(monkeypatch)
    decision = reconcile_step(rolling_back(), after=10)
    assert fake.calls == [
        ("read now", "llama-baseline"),
        ("read now", "llama-canary"),
        ("scale", "llama-canary", 1),
        ("apply", "Deployment", "llama-baseline", 2),
        ("apply", "Service", "llama", None),
        ("delete jobs but", JOBS),
    ]
    assert decision.status.phase == Phase.ROLLING_BACK and prometheus.queries == []


def test_a_shrink_is_decided_again_on_the_pods_the_api_server_has_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watches' cache still counts a baseline pod that has gone (a loaded API server's watch can
    lag a deletion by tens of seconds): the canary's shrink decided on the cache is decided again on
    the tracks read now, where the baseline has no Ready pod, and the canary keeps both of its."""
    cached = {"llama-baseline": ready(1), "llama-canary": ready(2)}
    gone = {"llama-baseline": TrackState(exists=True, replicas=1, ready_replicas=0)}
    fake = FakeKube(cached, read_now=gone).install(monkeypatch)
    FakePrometheus().install(monkeypatch)
    decision = reconcile_step(rolling_back(), after=10)
    assert decision.canary_replicas == 2 and decision.status.phase == Phase.ROLLING_BACK
    assert ("scale", "llama-canary", 1) not in fake.calls, fake.calls


def test_a_decision_that_shrinks_nothing_reads_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a shrink is checked against the API server: a tick that grows or holds costs no read."""
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}).install(monkeypatch)
    FakePrometheus().install(monkeypatch)
    run = Run()
    run.to_analyzing()
    reconcile_step(run, after=10)
    assert not [call for call in fake.calls if call[0] == "read now"], fake.calls


def analyzing() -> Run:
    """A canary 70 s into its analysis (warm-up over at T0 + 155 s), Prometheus in the spec."""
    run = Run(make_spec(metrics={"prometheusUrl": PROMETHEUS}))
    run.to_analyzing()
    assert run.now == T0 + timedelta(seconds=155)
    return run


def test_an_analysis_reads_both_tracks_over_the_analysis_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus is asked for each track by its target labels over [warm-up end, now], and its
    figures decide: a passing canary is promoted, growing first (the baseline keeps its pod)."""
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}).install(monkeypatch)
    answers: dict[str, TrackMetrics | Exception] = {"baseline": metrics(), "canary": metrics(0.8)}
    prometheus = FakePrometheus(answers).install(monkeypatch)
    decision = reconcile_step(analyzing(), after=70)
    window = Window(T0 + timedelta(seconds=155), T0 + timedelta(seconds=225))
    labels = 'namespace="ml",specgate_dev_deployment="llama",specgate_dev_track='
    assert prometheus.queries == [
        (PROMETHEUS, labels + '"baseline"', window, 15.0),
        (PROMETHEUS, labels + '"canary"', window, 15.0),
    ]
    assert (decision.status.phase, decision.status.verdict) == (Phase.PROMOTING, "Pass")
    assert fake.calls == [
        ("apply", "Deployment", "llama-baseline", 1),
        ("apply", "Deployment", "llama-canary", 2),
        ("apply", "Service", "llama", None),
        ("delete jobs but", JOBS),
    ]


def test_an_analysis_without_a_serving_baseline_reads_the_canary_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A baseline with no Ready pod (swapped out for the canary) is compared as stored: its series
    are not queried (the fake has no answer for them and would raise)."""
    FakeKube({"llama-baseline": ready(0), "llama-canary": ready(1)}).install(monkeypatch)
    prometheus = FakePrometheus({"canary": metrics(0.8)}).install(monkeypatch)
    reconcile_step(analyzing(), after=70)
    assert [q[1].rsplit("=", 1)[-1] for q in prometheus.queries] == ['"canary"']


def test_prometheus_down_is_metrics_unavailable_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}).install(monkeypatch)
    down = MetricsUnavailable("Prometheus query failed: connection refused")
    FakePrometheus({"baseline": down, "canary": down}).install(monkeypatch)
    decision = reconcile_step(analyzing(), after=70)
    status = decision.status
    assert (status.phase, status.reason, status.verdict) == (
        Phase.ANALYZING,
        Reason.METRICS_UNAVAILABLE,
        "MetricsUnavailable",
    )
    assert "connection refused" in (status.message or "")


def test_a_name_conflict_touches_no_child_and_asks_prometheus_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = "Service ml/llama (not created by this SpeculativeDeployment)"
    fake = FakeKube(taken=[taken]).install(monkeypatch)
    prometheus = FakePrometheus().install(monkeypatch)
    decision = reconcile_step(analyzing(), after=70)
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, Reason.NAME_CONFLICT)
    assert taken in (decision.status.message or "")
    assert (fake.calls, prometheus.queries) == ([], [])


def test_a_name_taken_after_it_was_seen_free_fails_the_object_at_the_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube.apply refuses a child whose name another object took since it was read free; the
    reconcile ends Failed (NameConflict) with the status of before, and writes nothing after it."""
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}).install(monkeypatch)
    FakePrometheus({"baseline": metrics(), "canary": metrics(0.8)}).install(monkeypatch)

    def service_taken(manifest: Manifest, children: kube.Children | None = None) -> None:
        if manifest["kind"] == "Service":
            raise kube.ForeignChild("Service ml/llama (not created by this SpeculativeDeployment)")
        fake.apply(manifest, children)

    monkeypatch.setattr(kube, "apply", service_taken)
    decision = reconcile_step(analyzing(), after=70)
    assert (decision.status.phase, decision.status.reason) == (Phase.FAILED, Reason.NAME_CONFLICT)
    assert "Service ml/llama (not created" in (decision.status.message or "")
    assert not decision.touch_children and ("delete jobs but", JOBS) not in fake.calls


@pytest.mark.parametrize(
    ("job_owner", "phase", "reason"),
    [("u-0", Phase.FAILED, Reason.NAME_CONFLICT), (OWNER.uid, Phase.ROLLED_BACK, Reason.MEASUREMENT_FAILED)],
)
def test_a_benchmark_job_another_object_owns_is_a_name_conflict_not_a_measurement(
    monkeypatch: pytest.MonkeyPatch, job_owner: str, phase: Phase, reason: Reason
) -> None:
    """A finished Job with the baseline benchmark's name that another uid owns (an earlier object of
    this name deleted with --cascade=orphan left it): NameConflict, nothing written, its report not
    read as ours. Our own Job with the same bad report fails the measurement."""
    fake = FakeKube({"llama-baseline": ready(2)}).install(monkeypatch)
    FakePrometheus().install(monkeypatch)
    job = {
        "metadata": {"name": "llama-bench-baseline-1", "ownerReferences": [{"uid": job_owner}]},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    report = {"state": {"terminated": {"exitCode": 0, "message": "not a report"}}}
    pods = {"items": [{"metadata": {"name": "p"}, "status": {"containerStatuses": [report]}}]}
    monkeypatch.setattr(kube, "_request", lambda method, path, **_: job if path == kube.JOB else pods)
    run = Run(make_spec(measurement="benchmark"))
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))  # Ready: the warm-up begins
    decision = reconcile_step(run, after=40)
    assert (decision.status.phase, decision.status.reason) == (phase, reason), decision.status.message
    if phase == Phase.FAILED:
        assert "Job ml/llama-bench-baseline-1 (not created by" in (decision.status.message or "")
        assert fake.calls == []


def test_scaling_below_the_canary_fails_naming_the_field_and_touches_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """replicas 2 -> 1 during the analysis with canaryReplicas 2 (an HPA, `kubectl scale`): the
    ungated canary would be every pod (it was: baseline 0, canary 2). The API server refuses it by
    the CRD's CEL rule; an object that reaches the operator anyway is Failed, pods as they are."""
    fake = FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}).install(monkeypatch)
    FakePrometheus({"baseline": metrics(), "canary": metrics(0.8)}).install(monkeypatch)
    run = analyzing()
    raw = run.spec.model_dump(by_alias=True, mode="json")
    raw["replicas"], raw["rollout"]["canaryReplicas"] = 1, 2
    decision = handlers.step(raw, run.status, OWNER, run.generation + 1, run.now, {}, kube.Children())
    status = decision.status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.INVALID_SPEC)
    assert (status.message or "").startswith(
        "invalid spec: spec.rollout.canaryReplicas: canaryReplicas must be less"
    )
    assert fake.calls == []


def test_a_pod_monitor_without_its_crd_is_failed_naming_the_field_and_touches_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Applying the PodMonitor would raise 404 after the Deployments were written: refused first,
    with a status that says why (it used to raise before any status was written)."""
    run = Run(make_spec(metrics={"prometheusUrl": PROMETHEUS, "podMonitor": True}))
    fake = FakeKube(pod_monitor_crd=False).install(monkeypatch)
    prometheus = FakePrometheus().install(monkeypatch)
    decision = reconcile_step(run, after=0)
    status = decision.status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.POD_MONITOR_CRD_MISSING)
    assert "spec.rollout.metrics.podMonitor" in (status.message or "")
    assert (fake.calls, prometheus.queries) == ([], [])
    fake.pod_monitor_crd = True  # the Prometheus Operator is installed: the rollout begins
    run.status = status
    assert reconcile_step(run, after=10).status.phase == Phase.BASELINE


def test_status_carries_what_the_scale_subresource_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """status.replicas (both tracks' pods as observed, for an HPA's currentReplicas) and
    status.selector (their pods, for pod metrics), which the CRD's scale subresource points at."""
    FakeKube({"llama-baseline": ready(1), "llama-canary": ready(2)}).install(monkeypatch)
    FakePrometheus({"baseline": metrics(), "canary": metrics(0.8)}).install(monkeypatch)
    status = reconcile_step(analyzing(), after=70).status
    assert (status.replicas, status.selector) == (
        3,
        "app.kubernetes.io/name=vllm,specgate.dev/deployment=llama",
    )


def test_a_reconcile_that_raised_is_retried_on_the_next_tick_not_after_a_minute() -> None:
    """kopf retries a failed handler after its backoff (60 s unless the handler says otherwise)."""
    (timer,) = kopf.get_default_registry()._spawning.get_all_handlers()
    assert (timer.id, timer.interval, timer.backoff) == (
        "reconcile",
        handlers.INTERVAL_SECONDS,
        handlers.INTERVAL_SECONDS,
    )


STORED = api.SpeculativeDeploymentStatus(
    phase=Phase.ANALYZING,
    observed_generation=1,
    verdict="MetricsUnavailable",
    metrics_unavailable_since="2026-11-22T12:00:00Z",
)


def test_write_status_deletes_the_fields_the_new_status_clears(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metrics back: verdict and metricsUnavailableSince go to None, which the merge patch must
    carry as null (left out, the API server would keep the old values), as of the version read."""
    writes: list[tuple[dict[str, Any], dict[str, Any]]] = []
    monkeypatch.setattr(kube, "write_status", lambda meta, status: writes.append((meta, status)) or True)
    new = STORED.model_copy(update={"verdict": None, "metrics_unavailable_since": None})
    assert handlers.write_status({"resourceVersion": "41"}, STORED, new)
    ((meta, status),) = writes
    cleared = {key: status.get(key, "left out") for key in ("verdict", "metricsUnavailableSince")}
    assert (meta, cleared) == ({"resourceVersion": "41"}, {"verdict": None, "metricsUnavailableSince": None})
    assert status["phase"] == "Analyzing"


def test_write_status_leaves_an_unchanged_status_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "write_status", lambda meta, status: pytest.fail("written"))
    assert handlers.write_status({"resourceVersion": "41"}, STORED, STORED.model_copy())


def test_an_abort_with_a_new_template_keeps_the_old_one_while_its_roll_would_break_the_floor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 38, item 2: replicas 2 -> 3 (an HPA) while paused with the baseline 2 of 2 Ready, then an
    image edit and an abort in one reconcile. Rolling the new image on 2 pods (maxUnavailable 1)
    would leave 1 Ready of a floor of 2: the baseline is only scaled (its template kept) this time."""
    run = Run(make_spec(maxSurge=1, maxUnavailable=1))
    old = render.template_hash(run.spec, Track.BASELINE)
    baseline = TrackState(exists=True, replicas=2, ready_replicas=2, template_hash=old)
    run.step(baseline=baseline)
    run.step(baseline=baseline)
    run.expect(Phase.BASELINE)
    raw = run.spec.model_dump(by_alias=True, mode="json")
    raw.update(replicas=3, image="vllm:2")
    fake = FakeKube({"llama-baseline": baseline}).install(monkeypatch)
    FakePrometheus().install(monkeypatch)
    abort = {api.ANNOTATION_ABORT: "now"}
    decision = handlers.step(raw, run.status, OWNER, run.generation + 1, run.now, abort, kube.Children())
    assert decision.status.phase == Phase.ROLLED_BACK
    # The new template waits (rollout.templates_to_wait): nothing is taken away, so nothing is read
    # again from the API server before the baseline is scaled.
    assert fake.calls[0] == ("scale", "llama-baseline", 2)
    assert not [call for call in fake.calls if call[0] == "read now"], fake.calls


def test_a_fixed_spec_measures_the_phase_it_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by test_day2_property (seed 31): Baseline -> Failed (invalid spec) -> fixed. The
    reconcile that resumes Baseline must read the baseline's metrics: observed as Failed, none were
    read, and the resumed phase took that for metrics lost (with a stale metricsUnavailableSince, a
    rollback)."""
    FakeKube({"llama-baseline": ready(2)}).install(monkeypatch)
    prometheus = FakePrometheus({"baseline": metrics()}).install(monkeypatch)
    run = Run(make_spec(metrics={"prometheusUrl": PROMETHEUS}))
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))  # Ready: the warm-up begins
    raw = run.spec.model_dump(by_alias=True, mode="json")
    invalid = {**raw, "speculative": {**raw["speculative"], "numSpeculativeTokens": 0}}
    failed = handlers.step(invalid, run.status, OWNER, 2, run.now, {}, kube.Children()).status
    assert failed.phase == Phase.FAILED
    later = run.now + timedelta(seconds=100)
    decision = handlers.step(raw, failed, OWNER, 3, later, {}, kube.Children())
    assert [query[1] for query in prometheus.queries] == [
        'namespace="ml",specgate_dev_deployment="llama",specgate_dev_track="baseline"'
    ]
    assert (decision.status.phase, decision.status.verdict) == (Phase.CANARY, None)


def test_an_auto_schedule_is_derived_once_then_held_and_rendered_into_the_canary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """numSpeculativeTokensPerBatchSizePolicy Auto: the reconcile derives status.kSchedule and the
    canary Deployment's --speculative-config carries its ranges; a later reconcile keeps both
    although the canary now measures a draft that would give another schedule."""
    body = spec_body()
    body["speculative"]["numSpeculativeTokensPerBatchSizePolicy"] = "Auto"
    run = Run(api.parse_spec(body))
    run.to_canary()
    FakeKube({"llama-baseline": ready(1)}).install(monkeypatch)
    applied: dict[str, Manifest] = {}
    monkeypatch.setattr(kube, "apply", lambda m, children=None: applied.update({m["metadata"]["name"]: m}))

    def canary_ranges() -> Any:
        args = applied["llama-canary"]["spec"]["template"]["spec"]["containers"][0]["args"]
        return json.loads(args[args.index("--speculative-config") + 1])[
            "num_speculative_tokens_per_batch_size"
        ]

    first = reconcile_step(run, after=10).status
    assert first.k_schedule is not None and first.k_schedule.template_hash == first.template_hash
    assert canary_ranges() == first.k_schedule.ranges
    measured = api.Measurement(acceptance_per_position=[0.01, 0.0001], drafts=10_000)
    run.status = first.model_copy(update={"canary": measured})
    applied.clear()
    again = reconcile_step(run, after=20).status
    assert again.k_schedule == first.k_schedule
    assert canary_ranges() == first.k_schedule.ranges


@pytest.mark.parametrize("readable", [True, False], ids=["read", "unreadable"])
def test_a_rerollout_reads_the_promoted_configs_history_once(
    monkeypatch: pytest.MonkeyPatch, readable: bool
) -> None:
    """The rollout that replaced a promoted config asks Prometheus for that config's history on the
    canary track (where it served), over the 12 h before this rollout began; the drift it measures
    is kept in status, and the next reconcile asks no more. Prometheus failing on it falls back to
    mixDrift, naming the failure, and does not hold the analysis."""
    FakeKube({"llama-baseline": ready(1), "llama-canary": ready(1)}).install(monkeypatch)
    down = MetricsUnavailable("Prometheus query failed: timeout")
    answers: dict[str, TrackMetrics | Exception] = {"baseline": metrics(), "canary": NEAR_GATE}
    prometheus = FakePrometheus(answers, history=steady_history() if readable else down).install(monkeypatch)
    run = Run(make_spec(metrics={"prometheusUrl": PROMETHEUS}))
    began = to_rerollout(run)
    decision = reconcile_step(run, after=60)
    labels = 'namespace="ml",specgate_dev_deployment="llama",specgate_dev_track="canary"'
    assert prometheus.history_queries == [(labels, Window(began - timedelta(hours=12), began))]
    drift = decision.status.mix_drift
    assert drift is not None and drift.standard_deviation == (0.0 if readable else 0.09)
    assert drift.source.startswith("measured over 4.0 h" if readable else "spec mixDrift (fallback: ")
    run.status, run.now = decision.status, run.now + timedelta(seconds=60)
    reconcile_step(run, after=60)
    assert len(prometheus.history_queries) == 1


@pytest.mark.parametrize("readable", [True, False], ids=["read", "unreadable"])
def test_a_promoted_canary_is_guarded_on_its_history_in_blocks_of_four_scrapes(
    monkeypatch: pytest.MonkeyPatch, readable: bool
) -> None:
    """After promotion the guard asks Prometheus for the canary track's alpha since the promotion
    (guard.history back, 36 h by default), in blocks of 4 scrapes (60 s at the spec's 15 s), and
    judges them; Prometheus failing on it is the guard's metrics being unavailable, as for its
    latency figures (held within metricsUnavailableBudget, the gated config keeps serving)."""
    FakeKube({"llama-baseline": ready(0), "llama-canary": ready(2)}).install(monkeypatch)
    blocks = tuple(AcceptanceWindow(100, 400, 280, end=float(i)) for i in range(30))
    down = MetricsUnavailable("Prometheus query failed: timeout")
    answers: dict[str, TrackMetrics | Exception] = {"canary": metrics(0.7)}
    prometheus = FakePrometheus(answers, history=blocks if readable else down).install(monkeypatch)
    run = Run(make_spec(metrics={"prometheusUrl": PROMETHEUS}))
    run.to_promoted()
    promoted = run.now
    decision = reconcile_step(run, after=3600)
    labels = 'namespace="ml",specgate_dev_deployment="llama",specgate_dev_track="canary"'
    now = promoted + timedelta(seconds=3600)
    assert prometheus.history_queries == [(labels, Window(promoted + timedelta(seconds=60), now))]
    assert prometheus.history_steps == [60.0]
    status = decision.status
    assert status.phase == Phase.PROMOTED
    if readable:
        assert status.guard is not None and (status.guard.windows, status.guard.window_seconds) == (30, 60.0)
        assert status.reason == Reason.GUARDING
    else:
        assert status.metrics_unavailable_since == api.iso(now)
        assert "guard: metrics unavailable since" in (status.message or "")
