"""Reliability on the local real cluster: operator crashes, failing canaries, deletion mid-rollout,
secrets, and a fuzz of the API. Real API server, operator process, Prometheus; simulated engines."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.conftest import Rollouts, side_by_side
from tests.cluster.operator_process import (
    RECONCILE_LINE,
    create_sd,
    get_sd,
    live_pods,
    reconciles_of,
    sd_gone,
    wait_for,
)
from tests.cluster.rollouts import (
    SETTLED,
    fake_gpu_node,
    history_time,
    lab_operator,
    orphaned_pods,
    pin_to_node,
    report,
    run_rollout,
    sim_rollout,
)
from tests.conftest import load_sample, tiny

from specgate import api, render, rollout
from specgate.observation import Observation, TrackState
from specgate.render import LABEL_TRACK, Owner, Track
from specgate_lab.crds import install_crd

pytestmark = pytest.mark.cluster

GOOD = {"SPECGATE_SIM_ALPHA": "0.8"}
SHORT = {"warmup": "2s", "analysisWindow": "10s"}  # enough for a baseline measurement


def phase_of(obj: dict[str, Any]) -> str | None:
    phase: str | None = obj.get("status", {}).get("phase")
    return phase


# --- 1 and 4: SIGKILL the operator at every phase boundary; a Secret never leaks ---


def test_sigkilled_operator_resumes_each_phase_it_is_killed_in_and_never_leaks_the_token(
    lab: dict[str, Any],
) -> None:
    """SIGKILL at the first look at each phase (Baseline, Canary, Analyzing, Promoting) and once
    mid-analysis; Baseline and Analyzing last at least warmup + analysisWindow by the operator's own
    rules and are always hit, the other points when a 2-s poll lands in them (the kill points are
    printed). One run: a second seed cost 70 s of CI for other kill moments of the same phases."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    token = f"hf_{uuid.uuid4().hex}"
    client.CoreV1Api(api_client).create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="hf-token"), string_data={"token": token}),
    )
    body = sim_rollout("restart", {**GOOD, "SPECGATE_SIM_SEED": "0"})
    body["spec"]["env"].append(
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    )
    operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"], "--verbose")
    killed: dict[str, float] = {}
    violations: list[str] = []

    def kill_at_boundaries(obj: dict[str, Any]) -> None:
        phase, status = phase_of(obj), obj.get("status", {})
        canary_deployments = client.AppsV1Api(api_client).list_namespaced_deployment(
            namespace, label_selector=f"{LABEL_TRACK}=canary"
        )
        if len(canary_deployments.items) > 1:
            violations.append(f"{len(canary_deployments.items)} canary Deployments in {phase}")
        canary = len(live_pods(api_client, namespace, "restart", Track.CANARY))
        baseline = len(live_pods(api_client, namespace, "restart", Track.BASELINE))
        if phase == "Promoted" and canary > body["spec"]["replicas"]:
            violations.append(f"{canary} canary pods in Promoted")
        if canary + baseline > body["spec"]["replicas"] + body["spec"]["rollout"].get("canaryReplicas", 1):
            violations.append(f"{canary} canary + {baseline} baseline pods in {phase}")
        point = phase
        if phase == "Analyzing" and "Analyzing" in killed:
            # Mid-analysis: once the operator started after the last kill has written an analysis.
            figures_at = api.parse_time((status.get("canary") or {}).get("windowEnd"))
            restarted_at = datetime.fromtimestamp(killed["Analyzing"], UTC)
            point = "mid-analysis" if figures_at and figures_at > restarted_at else None
        if point in ("Baseline", "Canary", "Analyzing", "mid-analysis", "Promoting") and point not in killed:
            operator.kill_and_restart()
            killed[point] = time.time()

    # Only the operator dies, never a pod: run_rollout's capacity check holds the full floor
    # (replicas) through every kill; an operator that restarts must not restart the serving pods.
    run = run_rollout(body=body, during=kill_at_boundaries, operator=operator, timeout=480, **lab)
    status = run.status
    report(
        kills_survived=operator.kills,
        kill_points=",".join(killed),
        invariant_violations=len(violations),
    )
    assert status["phase"] == "Promoted", status.get("message")
    # How many of the other points a poll lands in is the machine's speed, not the operator's: they
    # are reported above. Whatever was killed, the operator's own history shows every phase entered
    # once, in order: no kill restarted or skipped one.
    assert {"Baseline", "Analyzing"} <= killed.keys(), killed
    assert run.phases == ["Baseline", "Canary", "Analyzing", "Promoting", "Promoted"], status["history"]
    assert status["canary"]["alpha"] == pytest.approx(0.8, abs=0.06)
    assert violations == []
    assert orphaned_pods(api_client, namespace) == []

    # The token stays a reference: in the pods, never in the logs, the status or any Event.
    pods = live_pods(api_client, namespace, "restart", Track.CANARY)
    assert pods
    for pod in pods:
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["HF_TOKEN"].value is None
        assert env["HF_TOKEN"].value_from.secret_key_ref.to_dict() == {
            "name": "hf-token",
            "key": "token",
            "optional": None,
        }
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    assert len(run.operator_log) > 0 and events
    for where, text in {
        "operator log": run.operator_log,
        "status": json.dumps(get_sd(api_client, namespace, "restart")["status"]),
        "events": json.dumps([e.to_dict() for e in events], default=str),
    }.items():
        assert token not in text, f"the Secret's value leaked into the {where}"


# --- 2: a canary that crashes, cannot be scheduled or never starts rolls back as CanaryUnhealthy ---


FAILURES = ("crashloop", "unschedulable", "stuck")


@pytest.mark.parametrize("mode", FAILURES)
def test_failing_canary_rolls_back_as_unhealthy(rollouts: Rollouts, mode: str) -> None:
    rollouts[mode].result()


def fail_the_canary(mode: str, lab: dict[str, Any]) -> None:
    if mode != "unschedulable":
        return check_the_failing_canary(mode, lab, node="")
    # A fake node with 1 GPU that only this rollout's pods tolerate: filling it disturbs no other.
    namespace = lab["namespace"]
    with fake_gpu_node(lab["api_client"], f"rel-{namespace}", gpus=1, taint=namespace) as node:
        check_the_failing_canary(mode, lab, node)


def check_the_failing_canary(mode: str, lab: dict[str, Any], node: str) -> None:
    api_client, namespace = lab["api_client"], lab["namespace"]
    if mode == "crashloop":
        # The canary alone gets --speculative-config; its engine exits at start, again and again.
        # The deadline is long enough for the bridge to start, lose and restart the engine on a
        # loaded machine (90 s was not, with half the cores taken): the pods' state must decide.
        body = sim_rollout(
            "crash", {**GOOD, "SPECGATE_SIM_EXIT": "speculative"}, **SHORT, progressDeadline="180s"
        )
    elif mode == "unschedulable":
        # Baseline and canary pods may only use a 1-GPU node: the baseline holds it, the canary waits.
        body = sim_rollout("nogpu", GOOD, **SHORT, progressDeadline="30s")
        pin_to_node(body, node, taint=namespace)
    else:
        # The canary's engine opens its port but never finishes loading: /health hangs, never Ready.
        body = sim_rollout(
            "stuck", {**GOOD, "SPECGATE_SIM_STUCK": "speculative"}, **SHORT, progressDeadline="30s"
        )
    name = body["metadata"]["name"]
    messages: list[str] = []
    # The canary never serves, the baseline must throughout: run_rollout's capacity check keeps the
    # whole floor (replicas) on the baseline's pods, from its first Ready pod to the roll-back.
    run = run_rollout(
        body=body, during=lambda obj: messages.append(obj.get("status", {}).get("message", "")), **lab
    )
    status = run.status
    assert "Promoted" not in run.phases and "Promoting" not in run.phases, run.phases
    assert (status["phase"], status["reason"]) == ("RolledBack", "CanaryUnhealthy"), status.get("message")
    deadline = api.parse_duration(body["spec"]["rollout"]["progressDeadline"])
    took = (history_time(status, "RolledBack") - history_time(status, "Canary")).total_seconds()
    if mode == "crashloop":
        assert "CrashLoopBackOff" in status["message"]
        assert took < deadline  # found by the pods' state, not by waiting out the deadline
    else:  # nothing fails outright: the progress deadline decides
        assert "progressDeadline" in status["message"] and "0/1 ready" in status["message"]
        # Not before the deadline. How soon after it the next reconcile runs is the machine's: the
        # point is that the deadline decides, not how fast the operator ticks.
        assert deadline <= took
    if mode == "unschedulable":
        assert any("Unschedulable" in m and "nvidia.com/gpu" in m for m in messages), messages[-5:]
        assert "Insufficient nvidia.com/gpu" in status["message"]
    canary = client.AppsV1Api(api_client).read_namespaced_deployment(f"{name}-canary", namespace)
    assert canary.spec.replicas == 0
    wait_for(lambda: not live_pods(api_client, namespace, name, Track.CANARY), 30, "canary pods gone")
    assert orphaned_pods(api_client, namespace) == []
    if mode == "crashloop":  # how the engine ended outlives its pods, in status and the Event
        events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
        unhealthy = [e.message for e in events if e.reason == "CanaryUnhealthy"]
        assert "last exit 1 (Error)" in status["message"], status["message"]
        assert any("last exit 1 (Error)" in m for m in unhealthy), unhealthy
        # and what the engine said as it died, read from the crashed container's previous log
        said = "simulated engine failure at startup (SPECGATE_SIM_EXIT=speculative)"
        assert said in status["message"], status["message"]
        assert any(said in m for m in unhealthy), unhealthy
    report(mode=mode, canary_to_rolled_back_s=round(took), progress_deadline_s=deadline, false_promotions=0)


rollouts = side_by_side({mode: partial(fail_the_canary, mode) for mode in FAILURES})  # the three at once

# --- 3: deleting the object mid-analysis removes every child and the object ---


WITNESS = tiny("witness")
WITNESS["spec"]["speculative"]["extraConfig"] = {"tensor_parallel_size": 2}  # past the schema, InvalidSpec


def test_deleting_mid_analysis_removes_every_child(lab: dict[str, Any]) -> None:
    api_client, namespace = lab["api_client"], lab["namespace"]
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    leftovers: dict[str, list[str]] = {}

    def children() -> dict[str, list[str]]:
        return {
            "deployments": [d.metadata.name for d in apps.list_namespaced_deployment(namespace).items],
            "replicasets": [r.metadata.name for r in apps.list_namespaced_replica_set(namespace).items],
            "pods": [p.metadata.name for p in core.list_namespaced_pod(namespace).items],
            "services": [s.metadata.name for s in core.list_namespaced_service(namespace).items],
        }

    def gone() -> bool:
        nonlocal leftovers
        leftovers = children()
        return sd_gone(api_client, namespace, "gone") and not any(leftovers.values())

    def delete_once_analyzing(obj: dict[str, Any]) -> bool:
        if phase_of(obj) != "Analyzing":
            assert phase_of(obj) not in SETTLED, obj.get("status")
            return False
        before = children()
        assert before["deployments"] == ["gone-baseline", "gone-canary"] and len(before["pods"]) == 2, before
        # kopf's finalizer: the object can only go if the running operator releases it.
        assert obj["metadata"].get("finalizers"), obj["metadata"]
        client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, "gone"
        )
        # kwok deletes a terminating pod at a random moment before its grace period ends (a kubelet
        # may take all of it: preStop, then SIGTERM): the bound is the pods' grace and the GC's chain.
        pods = core.list_namespaced_pod(namespace).items
        grace = max(pod.spec.termination_grace_period_seconds or 30 for pod in pods)
        started = time.monotonic()
        try:
            wait_for(gone, grace + 60, "the object and its children to be gone")
        finally:
            report(
                deleted_in_s=round(time.monotonic() - started, 1),
                grace_s=grace,
                orphaned_pods=len(leftovers.get("pods", [])),
                finalizers_before=",".join(obj["metadata"].get("finalizers", [])) or "none",
            )
        # Each reconcile queries Prometheus; none may run for the object once it is gone. A witness
        # reconciled 3 times since shows the operator ticked meanwhile (a sleep passes with a
        # stalled or dead operator too); its spec fails InvalidSpec, so it makes no child.
        logged = len(operator.log_text())
        create_sd(api_client, namespace, WITNESS)

        def since_deleted(name: str) -> list[str]:
            return reconciles_of(operator.log_text()[logged:], namespace, name)

        wait_for(lambda: len(since_deleted("witness")) >= 3, 60, "3 reconciles of a witness")
        late_reconciles.extend(since_deleted("gone"))
        return True

    operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"], "--verbose")
    late_reconciles: list[str] = []
    # Deleting the object asks for nothing to serve: run_rollout's capacity floor is 0 from its
    # deletionTimestamp on (capacity.sd_floor), and the full replicas until then. The witness never
    # serves, so only the object's own floor is required to have been reached.
    monitor = CapacityMonitor(api_client, namespace, require_reached=False)
    run = run_rollout(
        body=sim_rollout("gone", GOOD, **SHORT),
        until=delete_once_analyzing,
        operator=operator,
        monitor=monitor,
        **lab,
    )
    assert monitor.timelines["gone"].reached, "the object's floor was never reached"
    assert leftovers == {"deployments": [], "replicasets": [], "pods": [], "services": []}
    assert RECONCILE_LINE.search(run.operator_log), "the operator log shows no reconcile at all"
    assert late_reconciles == [], "the operator still reconciled (and queried Prometheus) after deletion"


# --- 5: fuzz the API: the server names the field it rejects; the operator never crashes on the rest ---

_SIM = sim_rollout("fuzz", GOOD)["spec"]
SEEDS: list[dict[str, Any]] = [
    load_sample("tiny-cpu.yaml")["spec"],
    load_sample("llama-3.1-8b-eagle3.yaml")["spec"],
    {
        **_SIM,
        "env": [*_SIM["env"], {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    },
    {**_SIM, "speculative": {"method": "ngram", "promptLookupMin": 2, "promptLookupMax": 4}},
]
NUMBERS = {  # path: (lowest, highest or None) of the valid range
    "replicas": (1, None),
    "resources.gpus": (1, None),
    "tensorParallelSize": (1, None),
    "speculative.numSpeculativeTokens": (1, 16),
    "speculative.draftTensorParallelSize": (1, None),
    "speculative.promptLookupMin": (1, None),
    "speculative.promptLookupMax": (1, None),
    "rollout.canaryReplicas": (1, None),
    "rollout.retry": (0, None),
    "rollout.gates.minAcceptanceRate": (0, 1),
    "rollout.gates.maxP99ItlRegression": (0, None),
    "rollout.gates.minDrafts": (1, None),
    "rollout.gates.minLatencySamples": (1, None),
    "rollout.gates.errorRate": (0, 0.5),
}
ENUMS = {
    "speculative.method": [m.value for m in api.Method],
    "rollout.strategy": [s.value for s in api.Strategy],
    "rollout.onMetricsUnavailable": [a.value for a in api.Action],
    "rollout.onInconclusive": [a.value for a in api.Action],
}
DURATIONS = [
    "rollout.warmup",
    "rollout.analysisWindow",
    "rollout.maxAnalysisDuration",
    "rollout.progressDeadline",
    "rollout.metricsUnavailableBudget",
    "rollout.guard.window",
]
REQUIRED = ["model", "model.name", "image", "speculative", "env.0.name", "env.0.valueFrom.secretKeyRef.key"]
JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    kind: str
    spec: dict[str, Any]
    fields: tuple[str, ...]  # wire paths a rejection may name (a CEL rule names one of its fields)


def _paths(node: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _split(path: str) -> tuple[str | int, ...]:
    return tuple(int(p) if p.isdigit() else p for p in path.split("."))


def wire(path: tuple[str | int, ...]) -> str:
    out = "spec"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _set(spec: dict[str, Any], path: tuple[str | int, ...], value: Any, delete: bool = False) -> bool:
    """Set (or delete) a path, creating missing objects; False when a list index does not exist."""
    node: Any = spec
    for part in path[:-1]:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return False
            node = node[part]
        else:
            node = node.setdefault(part, {})
    leaf = path[-1]
    if isinstance(leaf, int) and (not isinstance(node, list) or leaf >= len(node)):
        return False
    if not delete:
        node[leaf] = value
    elif isinstance(leaf, int) or leaf in node:
        del node[leaf]
    return True


@st.composite
def mutated_specs(draw: st.DrawFn) -> Case:
    spec = json.loads(json.dumps(draw(st.sampled_from(SEEDS))))
    kind = draw(
        st.sampled_from(["type", "number", "enum", "required", "duration", "cel", "extraConfig", "unknown"])
    )
    if kind == "type":  # any field, any other JSON type
        path = draw(st.sampled_from(list(_paths(spec))))
        _set(spec, path, draw(JSON_VALUES))
        return Case(kind, spec, (wire(path),))
    if kind == "number":  # out of range, fractional where an integer is due, or in range
        name = draw(st.sampled_from(sorted(NUMBERS)))
        low, high = NUMBERS[name]
        edges = [low - 1, low, low + 0.5, (high or low + 1) + 1, 2**31, 2**53, -(2**31)]
        value: Any = draw(st.sampled_from(edges) | st.integers(-5, 40) | st.floats(-2, 20, allow_nan=False))
        _set(spec, _split(name), value)
        return Case(kind, spec, (wire(_split(name)),))
    if kind == "enum":
        name = draw(st.sampled_from(sorted(ENUMS)))
        known = st.sampled_from(ENUMS[name])
        value = draw(known | known.map(str.upper) | st.sampled_from(["", "medusa", "Rollback", "none"]))
        _set(spec, _split(name), value)
        return Case(kind, spec, (wire(_split(name)),))
    if kind == "required":
        path = _split(draw(st.sampled_from(REQUIRED)))
        if not _set(spec, path, None, delete=True):
            path = ("image",)
            _set(spec, path, None, delete=True)
        return Case(kind, spec, (wire(path),))
    if kind == "duration":
        name = draw(st.sampled_from(DURATIONS))
        bad = st.sampled_from(["5", "5 minutes", "-1s", "1d", "", "1.5.3s", "5S", "1h 30m", "s", "0x10s"])
        value = draw(bad | st.from_regex(api.DURATION_PATTERN, fullmatch=True) | st.text(max_size=6))
        _set(spec, _split(name), value)
        return Case(kind, spec, (wire(_split(name)),))
    if kind == "cel":  # the guarded combinations, both ways
        speculative: dict[str, Any] = {"method": draw(st.sampled_from(ENUMS["speculative.method"]))}
        for key in draw(st.sets(st.sampled_from(["draftModel", "promptLookupMin", "promptLookupMax"]))):
            speculative[key] = "draft" if key == "draftModel" else draw(st.integers(1, 8))
        spec["speculative"] = speculative
        env: dict[str, Any] = draw(
            st.sampled_from([{"value": "1"}, {"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}, {}])
        )
        if draw(st.booleans()):
            env = {"value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
        spec["env"] = [{"name": "A", **env}]
        spec["tensorParallelSize"] = draw(st.integers(1, 4))
        spec["resources"] = {"gpus": draw(st.integers(1, 4))}
        names = (
            "speculative.draftModel",
            "speculative.promptLookupMin",
            "env[0].value",
            "tensorParallelSize",
        )
        return Case(kind, spec, tuple(f"spec.{n}" for n in names))
    if kind == "extraConfig":  # free-form: only the operator can check it
        keys = st.sampled_from(
            ["max_model_len", "tensor_parallel_size", "method", "model", "disable_logprobs"]
        )
        spec.setdefault("speculative", {})["extraConfig"] = draw(
            st.dictionaries(keys, JSON_VALUES, max_size=3)
        )
        return Case(kind, spec, ("spec.speculative.extraConfig",))
    objects = [p for p in _paths(spec) if isinstance(_get(spec, p), dict)]
    path = (*draw(st.sampled_from([(), *objects])), "bogusField")
    _set(spec, path, draw(JSON_VALUES))
    return Case(kind, spec, (wire(path),))


def _get(spec: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    node: Any = spec
    for part in path:
        node = node[part]
    return node


def _related(cause: str, field: str) -> bool:
    """The cause names the field, something inside it, or (a CEL rule) its object or a sibling."""

    def parent(path: str) -> str:
        return path.rsplit(".", 1)[0].rsplit("[", 1)[0] if "." in path else path

    return (
        cause == field
        or cause.startswith((f"{field}.", f"{field}["))
        or cause == parent(field) != "spec"
        or parent(cause) == parent(field)
    )


def operator_verdict(raw_spec: dict[str, Any]) -> str | None:
    """What the handler does before any I/O: parse (InvalidSpec names the field), then render the
    children and decide once in every phase. Returns the InvalidSpec field, or None when accepted."""
    try:
        spec = api.parse_spec(raw_spec)
    except api.SpecError as error:
        assert error.field and str(error).startswith(f"spec.{error.field}: "), error
        return error.field
    owner = Owner("fuzz", "fuzz", "uid")
    for track in Track:
        render.deployment(spec, owner, track, spec.replicas)
    now = datetime.now(UTC)
    ready = TrackState(exists=True, replicas=spec.replicas, ready_replicas=spec.replicas)
    observation = Observation(generation=1, baseline=ready, canary=ready)
    long_ago = api.iso(now - timedelta(hours=1))
    for phase in api.Phase:
        status = api.SpeculativeDeploymentStatus(
            phase=phase, observed_generation=1, phase_since=long_ago, ready_since=long_ago
        )
        rollout.measurement_window(spec, status, now)
        rollout.decide(spec, status, observation, now)
    return None


def test_fuzzed_specs_are_rejected_with_the_field_or_handled_by_the_operator(
    api_client: client.ApiClient, namespace: str
) -> None:
    install_crd(api_client)
    counts: Counter[str] = Counter()

    @settings(
        max_examples=1000,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=mutated_specs())
    def check(case: Case) -> None:
        counts["tried"] += 1
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "fuzz"},
            "spec": case.spec,
        }
        try:
            created = create_sd(api_client, namespace, body, dry_run=True)
        except ApiException as exc:
            assert exc.status == 422, (exc.status, exc.body, case)
            status = json.loads(exc.body or "{}")
            causes = [c.get("field", "") for c in status["details"]["causes"]]
            # The API server writes some paths with a leading dot (".spec.replicas: Invalid value").
            named = [
                c
                for c in causes
                if c and c in status["message"] and any(_related(c.lstrip("."), f) for f in case.fields)
            ]
            assert named, (case, status["message"])
            counts["rejected"] += 1
            return
        counts["accepted"] += 1
        if operator_verdict(created["spec"]) is not None:
            counts[f"invalid_spec_{case.kind}"] += 1
            counts["invalid_spec"] += 1

    check()
    report(
        fuzz_tried=counts["tried"],
        rejected_with_field=counts["rejected"],
        accepted=counts["accepted"],
        invalid_spec_by_operator=counts["invalid_spec"],
        detail=dict(sorted(counts.items())),
    )
    assert counts["tried"] >= 1000 and counts["rejected"] > 0 and counts["accepted"] > 0
