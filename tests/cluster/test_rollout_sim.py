"""End-to-end rollouts on the local cluster with simulated engines: the gates, the guard, outages."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.parse
import urllib.request
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.conftest import CACHE, Rollouts, cluster_classes, side_by_side
from tests.cluster.operator_process import get_sd, specgate_status
from tests.cluster.rollouts import SETTLED, Rollout, history_time, run_rollout, sim_rollout
from tests.conftest import ROOT
from tests.integration.prometheus_server import prometheus_server

from specgate import api, gates
from specgate.render import LABEL_DEPLOYMENT, LABEL_TRACK
from specgate_lab.calibrate import answers_ok
from specgate_lab.crds import install_crd, peering_crds_path

pytestmark = pytest.mark.cluster


def canary_replicas(api_client: client.ApiClient, namespace: str, name: str) -> int:
    dep = client.AppsV1Api(api_client).read_namespaced_deployment(f"{name}-canary", namespace)
    return int(dep.spec.replicas)


def reasons(api_client: client.ApiClient, namespace: str) -> list[str]:
    return [e.reason for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items]


def promote_under_another_writer_and_an_hpa(lab: dict[str, Any]) -> tuple[Rollout, list[str], dict[str, Any]]:
    """A GitOps tool or `kubectl annotate` writes the object throughout, so its resourceVersion keeps
    moving under the operator: status is written by merge patch and children by server-side apply,
    neither conditional on a resourceVersion, so no write may fail with 409 Conflict. Meanwhile a
    real HorizontalPodAutoscaler (the lab's controller manager) raises replicas 1 -> 2 through the
    scale subresource: the tracks rescale in place and the rollout goes on, never restarting. The
    pods of both tracks carry what a GPU cluster needs (spec.podTemplate)."""
    objects = client.CustomObjectsApi(lab["api_client"])
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "good"},
        "spec": {
            "scaleTargetRef": {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": "SpeculativeDeployment", "name": "good"},
            "minReplicas": 2,  # below it the controller scales up without asking for metrics
            "maxReplicas": 2,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}],
        },
    }  # fmt: skip
    client.AutoscalingV2Api(lab["api_client"]).create_namespaced_horizontal_pod_autoscaler(
        lab["namespace"], hpa
    )
    writes: list[str] = []  # the phase of each write
    pod_specs: dict[str, Any] = {}  # by track, as the API server admitted them

    def annotate(obj: dict[str, Any]) -> None:
        pods = client.CoreV1Api(lab["api_client"]).list_namespaced_pod(
            lab["namespace"], label_selector=f"{LABEL_DEPLOYMENT}=good"
        )
        pod_specs.update({p.metadata.labels[LABEL_TRACK]: p.spec for p in pods.items})
        writes.append(obj.get("status", {}).get("phase", "none"))
        touched = {"metadata": {"annotations": {"example.com/touched": str(len(writes))}}}
        objects.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, lab["namespace"], api.PLURAL, obj["metadata"]["name"], touched
        )

    body = sim_rollout("good", {"SPECGATE_SIM_ALPHA": "0.8"})
    body["spec"]["podTemplate"] = {
        "runtimeClassName": lab["namespace"],
        "priorityClassName": lab["namespace"],
        "imagePullSecrets": ["registry"],
        "shmSizeLimit": "1Gi",
    }
    with cluster_classes(lab["api_client"], lab["namespace"]):
        return run_rollout(body=body, during=annotate, **lab), writes, pod_specs


def test_a_gpu_pod_template_is_promoted_while_another_writer_and_an_hpa_change_the_object(
    rollouts: Rollouts,
) -> None:
    lab, (run, writes, pod_specs) = rollouts["good"].result()
    gpu_cluster_classes = lab["namespace"]
    objects = client.CustomObjectsApi(lab["api_client"])
    status = run.status
    assert status["phase"] == "Promoted", status.get("message")
    assert sorted(pod_specs) == ["baseline", "canary"]
    for spec in pod_specs.values():
        assert (spec.runtime_class_name, spec.priority_class_name) == (gpu_cluster_classes,) * 2
        assert spec.priority == 1000 and [s.name for s in spec.image_pull_secrets] == ["registry"]
        shm = next(v.empty_dir for v in spec.volumes if v.name == "dshm")
        assert (shm.medium, shm.size_limit) == ("Memory", "1Gi")
    # How many polls a rollout spans is the machine's speed; that the writes went on through the phases
    # that last a window by the operator's own rules is the test's.
    assert {"Baseline", "Analyzing"} <= set(writes), writes
    assert "Conflict" not in run.operator_log, run.operator_log[-2000:]
    # The other writer and the HPA restarted nothing: each phase entered once, in order.
    assert run.phases == ["Baseline", "Canary", "Analyzing", "Promoting", "Promoted"], status["history"]
    assert status["canary"]["alpha"] == pytest.approx(0.8, abs=0.06)
    # After promotion the guard's own (younger, wider) interval stands in status: it need not clear
    # the gate on its own; the promotion itself was GatesPassed (checked below). How soon after
    # promotion the test reads status is the machine's pace: the guard's first windows may not hold
    # minDrafts and MIN_WINDOWS yet, and then status has alpha but no interval.
    canary = status["canary"]
    if "alphaLower" in canary:
        assert canary["alphaLower"] <= canary["alpha"] <= canary["alphaUpper"]
    else:
        young = canary["drafts"] < api.parse_spec(run.obj["spec"]).rollout.gates.min_drafts
        assert "alphaUpper" not in canary and (
            young or status.get("guard", {}).get("windows", 0) < gates.MIN_WINDOWS
        ), status
    assert status["baseline"]["p99ItlMs"] > 0 and status["canary"]["p99ItlMs"] > 0
    assert len(status["canary"]["acceptancePerPosition"]) == 3
    apps = client.AppsV1Api(lab["api_client"])
    assert apps.read_namespaced_deployment("good-baseline", lab["namespace"]).spec.replicas == 0
    assert "GatesPassed" in reasons(lab["api_client"], lab["namespace"])
    # The HPA's scale reached the object, and the promoted track, with one rollout from start to end.
    assert run.obj["spec"]["replicas"] == 2
    assert apps.read_namespaced_deployment("good-canary", lab["namespace"]).spec.replicas == 2
    assert status["selector"] == "app.kubernetes.io/name=vllm,specgate.dev/deployment=good"
    # status.replicas is what the last tick observed. run.status may be a tick older (the operator
    # can tick once more before run_rollout stops it), so compare with the object as it now stands:
    # the API server's scale subresource reads the same status.
    final = get_sd(lab["api_client"], lab["namespace"], "good")["status"]
    scale = objects.get_namespaced_custom_object_scale(
        api.GROUP, api.VERSION, lab["namespace"], api.PLURAL, "good"
    )
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (2, final["replicas"])
    assert final["replicas"] in (2, 3)  # canary 2, with the baseline's last pod until it is gone
    assert scale["status"]["selector"] == status["selector"]
    assert specgate_status(lab["kubeconfig"], lab["namespace"], "good", "--watch").returncode == 0


def roll_back_below_the_gate(lab: dict[str, Any]) -> Rollout:
    return run_rollout(body=sim_rollout("lowalpha", {"SPECGATE_SIM_ALPHA": "0.3"}), **lab)


def test_low_alpha_rolls_back_below_the_gate(rollouts: Rollouts) -> None:
    lab, run = rollouts["lowalpha"].result()
    status = run.status
    assert (status["phase"], status["reason"]) == ("RolledBack", "AcceptanceBelowGate"), status.get("message")
    assert status["canary"]["alpha"] == pytest.approx(0.3, abs=0.06)
    assert canary_replicas(lab["api_client"], lab["namespace"], "lowalpha") == 0
    waited = specgate_status(lab["kubeconfig"], lab["namespace"], "lowalpha", "--watch", "--timeout", "60")
    assert waited.returncode == 1 and waited.stdout.startswith("lowalpha: RolledBack"), waited


def decide_a_near_gate_canary_at_the_deadline(lab: dict[str, Any]) -> Rollout:
    """Alpha 0.58, inside the indifference zone (0.55 +/- 0.05): with a first rollout's drift
    allowance (mixDrift 0.09 over 3 min) the sequential test cannot tell it within
    maxAnalysisDuration (4m here), so the deadline decides it by the estimate's side of the gate.
    The question is alpha's: the latency gates keep fast_rollout's wide tolerances (CI runs' 495-640
    samples on the simulator's 10-25 and 25-50 ms buckets could tell neither 10 % nor 100 %, and the
    latency half's Inconclusive, not alpha's side, decided it)."""
    return run_rollout(body=sim_rollout("neargate", {"SPECGATE_SIM_ALPHA": "0.58"}), **lab)


def test_a_near_gate_canary_is_decided_at_the_deadline_by_its_side_of_the_gate(rollouts: Rollouts) -> None:
    """Issue 37: not rolled back as Inconclusive. Which side the estimate lands on is the run's (the
    simulator's requests each have their own acceptance); the verdict must follow it, and come no
    sooner than maxAnalysisDuration after the analysis began."""
    _, run = rollouts["neargate"].result()
    status = run.status
    decided = next(h for h in status["history"] if h["phase"] in ("Promoting", "RollingBack"))
    assert "decided at maxAnalysisDuration by the estimate's side of the gate" in decided["message"], decided
    estimate = re.search(r"alpha (\d\.\d+) \[", decided["message"])
    assert estimate is not None, decided["message"]
    expected = (
        ("Promoting", "GatesPassed") if float(estimate[1]) >= 0.55 else ("RollingBack", "AcceptanceBelowGate")
    )
    assert (decided["phase"], decided["reason"]) == expected, decided["message"]
    deadline = api.parse_duration(run.obj["spec"]["rollout"]["maxAnalysisDuration"])
    analysed = history_time(status, decided["phase"]) - history_time(status, "Analyzing")
    assert analysed.total_seconds() >= deadline


# Runbook commands the lab cannot run, and why.
RUNBOOK_EXAMPLE_TIME = "1764150000"  # what the runbooks' `@` queries show for the rollback's time
LAB_LACKS = {
    "kubectl get prometheus": "no Prometheus Operator in the lab",
    "podmonitor": "no Prometheus Operator in the lab",
    "specgate-system": "no in-cluster operator (the Helm test installs one and runs a rollout)",
    "OPNS": "no in-cluster operator, so no namespace of its own to name",
    "logs job/": "a traffic rollout runs no benchmark Job (tests/cluster/test_benchmark.py does)",
    "--previous": "a container that never crashed has no previous log (this object's never did)",
    "httproute": "this object routes by Service (test_gateway_routing.py rolls out through a gateway)",
    "get svc NAME-baseline": "a Service-routed object has no per-track Services (router GatewayAPI has)",
}


def runbook_snippets(kind: str) -> list[tuple[str, str]]:
    """(runbook, snippet) for every ```kind block of runbooks/*.md; a bash block gives one snippet
    per command (continuation lines joined, comments dropped), a promql block one expression."""
    found = []
    for page in sorted((ROOT / "runbooks").glob("*.md")):
        for block in re.findall(rf"```{kind}\n(.*?)```", page.read_text(), re.S):
            if kind == "promql":
                found.append((page.name, " ".join(block.split())))
                continue
            for command in block.replace("\\\n", " ").splitlines():
                command = command.split("  #")[0].strip()
                if command and not command.startswith("#"):
                    found.append((page.name, command))
    return found


NODE_GONE = re.compile(r'nodes "[^"]+" not found')


def run_snippet(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_runbooks_commands_and_the_dashboards_queries_run_on_a_rolled_back_object(
    rollouts: Rollouts, kubectl: str
) -> None:
    """Every kubectl and specgate command of runbooks/ (but those LAB_LACKS names) runs as written
    on the rolled-back object, and every PromQL expression evaluates on the lab's Prometheus; the
    AcceptanceBelowGate page's alpha query gives the simulator's alpha (0.3); every query of the
    Grafana dashboard evaluates, and its vLLM panels have data."""
    lab, run = rollouts["lowalpha"].result()
    # The runbooks assume the chart's install, which brings kopf's peering CRDs (the lab's operator
    # runs as a process): installed here, not left to a test that happened to run before.
    install_crd(lab["api_client"], peering_crds_path())
    # The runbooks' example unix time stands for the rollback's (runbooks/README.md, "Queries
    # after a rollback"): the queries are evaluated then, as a reader told so would.
    rolled_back = str(int(history_time(run.status, "RollingBack").timestamp()))
    names = {"NS": lab["namespace"], "NAME": "lowalpha", "OBJECT": "lowalpha", "GEN": "1"}
    names[RUNBOOK_EXAMPLE_TIME] = rolled_back

    def filled(text: str) -> str:
        return re.sub(rf"\b(NS|NAME|OBJECT|GEN|{RUNBOOK_EXAMPLE_TIME})\b", lambda m: names[m.group(1)], text)

    ran, failed = 0, list[str]()
    env = {
        **os.environ,
        "KUBECONFIG": lab["kubeconfig"],
        "PATH": f"{Path(kubectl).parent}:{os.environ['PATH']}",
    }
    for page, command in runbook_snippets("bash"):
        if any(lacking in command for lacking in LAB_LACKS):
            continue
        # What a pipe's grep or sed keeps is not the point; a pipe inside $(...) is part of the command.
        first = filled(command) if "$(" in command else filled(command).split(" | ")[0]
        done = run_snippet(first, env)
        if done.returncode != 0 and NODE_GONE.search(done.stderr):
            # `kubectl describe nodes` lists, then gets each: a node another module deleted in between
            # answers NotFound (a CI run's did). The command is sound: run it again.
            done = run_snippet(first, env)
        allowed = (0, 1) if first.startswith("kubectl diff") else (0,)  # diff exits 1 on a difference
        if done.returncode not in allowed:
            failed.append(f"{page}: {first}\n{done.stderr}")
        ran += 1
    assert not failed, "\n".join(failed)  # every broken command at once
    assert ran >= 20, ran
    for page, expression in runbook_snippets("promql"):
        query = urllib.parse.urlencode({"query": filled(expression)})
        with urllib.request.urlopen(f"{lab['prometheus_url']}/api/v1/query?{query}", timeout=10) as resp:
            answer = json.loads(resp.read())
        assert answer["status"] == "success", f"{page}: {expression}: {answer}"
        if page == "acceptance-below-gate.md" and "num_draft_tokens_total" in expression:
            assert float(answer["data"]["result"][0]["value"][1]) == pytest.approx(0.3, abs=0.06)

    # The Grafana dashboard's queries too, with its variables set as Grafana would (the rate
    # interval long enough to reach back over the canary's life): every vLLM panel has data.
    dashboard = json.loads((ROOT / "charts" / "specgate" / "dashboards" / "specgate.json").read_text())
    variables = {
        "$namespace": lab["namespace"],
        "$deployment": "lowalpha",
        "$gate": "0.55",
        "$__rate_interval": "10m",
    }
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expression = target["expr"]
            for variable, value in variables.items():
                expression = expression.replace(variable, value)
            query = urllib.parse.urlencode({"query": expression})
            with urllib.request.urlopen(f"{lab['prometheus_url']}/api/v1/query?{query}", timeout=10) as resp:
                answer = json.loads(resp.read())
            assert answer["status"] == "success", f"{panel['title']}: {expression}: {answer}"
            if "vllm:" in expression:
                assert answer["data"]["result"], (
                    f"dashboard panel {panel['title']!r} has no data: {expression}"
                )


def roll_back_a_heavy_draft(lab: dict[str, Any]) -> Rollout:
    # A heavy draft: every step pays 3 x 40 ms of drafting, so streaming users see longer stalls.
    env = {"SPECGATE_SIM_ALPHA": "0.85", "SPECGATE_SIM_DRAFT_PASS_MS": "40"}
    return run_rollout(body=sim_rollout("slow", env, gates={"maxP99ItlRegression": 1.0}), **lab)


def test_worse_p99_itl_rolls_back_with_latency_regression(rollouts: Rollouts) -> None:
    lab, run = rollouts["slow"].result()
    status = run.status
    assert (status["phase"], status["reason"]) == ("RolledBack", "LatencyRegression"), status.get("message")
    assert "P99 ITL (step stall) canary" in status["message"]
    assert canary_replicas(lab["api_client"], lab["namespace"], "slow") == 0


def roll_back_a_draft_that_does_not_pay(lab: dict[str, Any]) -> Rollout:
    """Issue 60: alpha 0.7 (gate 0.55) with K = 3 emits 3.1 tokens a step, but every draft pass costs
    60 ms (lab/specgate_lab/sim/model.py): a canary step of about 215 ms against a plain one of
    13 ms, so about 70 ms a token against 13. The simulator's own cost per step (Python, streaming)
    adds to both and favours the canary's fewer steps: with 14 ms passes a loaded CI-like run
    measured the canary 1.036x faster, so the pass cost is set where only an overhead above 80 ms a
    step could close the gap. The step stall's and per-token P99's tolerances are set wide (a stall
    many times the plain step is what these drafts cost), so that alpha and both P99 gates pass and
    only the speedup gate can roll it back."""
    env = {"SPECGATE_SIM_ALPHA": "0.7", "SPECGATE_SIM_DRAFT_PASS_MS": "60"}
    gates_ = {
        "minDrafts": 100,
        "minLatencySamples": 50,
        "maxP99ItlRegression": 50,
        "maxP99PerTokenRegression": 10,
    }
    return run_rollout(body=sim_rollout("nospeedup", env, gates=gates_), **lab)


def test_a_canary_slower_per_token_rolls_back_for_no_speedup_while_alpha_and_p99_pass(
    rollouts: Rollouts,
) -> None:
    lab, run = rollouts["nospeedup"].result()
    status = run.status
    assert (status["phase"], status["reason"]) == ("RolledBack", "NoSpeedup"), status.get("message")
    decided = next(h for h in status["history"] if h["phase"] == "RollingBack")
    assert decided["message"].startswith("speedup 0."), decided
    canary = status["canary"]
    assert canary["alpha"] == pytest.approx(0.7, abs=0.08)
    assert canary["speedupUpper"] < 1.0, canary
    assert canary_replicas(lab["api_client"], lab["namespace"], "nospeedup") == 0


def drift_after_promotion(lab: dict[str, Any]) -> tuple[Rollout, list[datetime]]:
    """The canary's engines drift to alpha 0.15 once the guard has judged them promoted and good:
    the test creates the file their script waits for (a moment of its choosing on any machine)."""
    drift = lab["log_dir"] / "drift"
    body = sim_rollout("drift", {"SPECGATE_SIM_SCRIPT": f"0s:alpha=0.85;if:{drift}:alpha=0.15"})
    body["spec"]["replicas"] = 4
    # A budget of one false alarm a day (the default is 0.1 a month): a lower CUSUM threshold, so a
    # drop this large trips in fewer windows; the month-long budget is the guard benchmark's to show.
    body["spec"]["rollout"]["guard"]["falseAlarmsPerMonth"] = 30
    # The simulated mix does not drift: said, the guard's first hour scales its CUSUM by the
    # engines' own spread instead of the fallback drift's (which would take it some 10 minutes).
    body["spec"]["rollout"]["gates"]["mixDrift"] = 0
    drifted_at: list[datetime] = []

    def drift_once_the_guard_judges(obj: dict[str, Any]) -> None:
        status = obj.get("status", {})
        judging = (status.get("guard") or {}).get("windows", 0) >= gates.MIN_GUARD_BLOCKS
        if status.get("phase") == "Promoted" and judging and not drifted_at:
            drifted_at.append(datetime.now(UTC).replace(microsecond=0))  # status keeps whole seconds
            drift.touch()

    run = run_rollout(
        body=body,
        during=drift_once_the_guard_judges,
        until=lambda obj: obj.get("status", {}).get("phase") in ("RolledBack", "Failed"),
        timeout=600,
        **lab,
    )
    return run, drifted_at


def test_guard_rolls_back_when_alpha_drifts_after_promotion_keeping_every_replica(
    rollouts: Rollouts,
) -> None:
    """replicas 4, maxSurge 1: after promotion the baseline is at 0, so the rollback must grow it
    while the canary serves; run_rollout's CapacityMonitor fails the test below 4 Ready pods."""
    lab, (run, drifted_at) = rollouts["drift"].result()
    status = run.status
    assert drifted_at, f"the guard never judged a promoted canary: {run.phases} {status.get('message')}"
    assert run.phases[-4:] == ["Promoting", "Promoted", "RollingBack", "RolledBack"], run.phases
    assert (status["phase"], status["reason"]) == ("RolledBack", "GuardTripped"), status.get("message")
    assert "alpha dropped below the gate" in status["message"]
    assert history_time(status, "RollingBack") >= drifted_at[0]  # the drift tripped it, not a false alarm
    assert canary_replicas(lab["api_client"], lab["namespace"], "drift") == 0
    baseline = client.AppsV1Api(lab["api_client"]).read_namespaced_deployment(
        "drift-baseline", lab["namespace"]
    )
    assert baseline.spec.replicas == 4


def stop_prometheus_mid_analysis(lab: dict[str, Any]) -> tuple[Rollout, list[bool]]:
    with ExitStack() as outage:
        url, _ = outage.enter_context(
            prometheus_server(lab["log_dir"] / "prometheus", 2, targets=CACHE / "cluster" / "targets" / "2s")
        )
        stopped: list[bool] = []

        def stop_prometheus_once_analyzing(obj: dict[str, Any]) -> None:
            if obj.get("status", {}).get("phase") == "Analyzing" and not stopped:
                outage.close()
                stopped.append(True)

        body = sim_rollout("outage", {"SPECGATE_SIM_ALPHA": "0.9"})
        run = run_rollout(body=body, during=stop_prometheus_once_analyzing, **{**lab, "prometheus_url": url})
    return run, stopped


def test_prometheus_outage_never_promotes(rollouts: Rollouts) -> None:
    """The operator's Prometheus (the test's own, scraping the lab's 2 s targets as the lab's does)
    stops mid-analysis and stays down: the rollout rolls back as MetricsUnavailable, never promoted.
    The shared Prometheus of the other tests is not touched."""
    lab, (run, stopped) = rollouts["outage"].result()
    status = run.status
    assert stopped, "the rollout never reached Analyzing"
    assert "Promoting" not in run.phases and "Promoted" not in run.phases
    assert (status["phase"], status["reason"]) == ("RolledBack", "MetricsUnavailable"), status.get("message")
    assert "MetricsUnavailable" in reasons(lab["api_client"], lab["namespace"])
    assert answers_ok(f"{lab['prometheus_url']}/-/ready"), "the shared Prometheus went down"


def canary_schedules(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """num_speculative_tokens_per_batch_size of each canary pod's --speculative-config, by pod."""
    pods = client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=f"{LABEL_DEPLOYMENT}={name},{LABEL_TRACK}=canary"
    )
    found = {}
    for pod in pods.items:
        args = next(c.args for c in pod.spec.containers if c.name == "vllm")
        config = json.loads(args[args.index("--speculative-config") + 1])
        found[pod.metadata.name] = config.get("num_speculative_tokens_per_batch_size")
    return found


def promote_twice_with_an_auto_schedule(
    lab: dict[str, Any],
) -> tuple[Rollout, list[dict[str, Any]], dict[str, Any]]:
    """numSpeculativeTokensPerBatchSizePolicy Auto: the first rollout derives its schedule from the
    gate's alpha (no canary of this draft yet) and promotes; an edit then starts a second rollout,
    whose schedule comes from the promoted canary's per-position acceptance. Every status.kSchedule
    and every canary pod's rendered schedule is recorded on the way."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    body = sim_rollout("auto", {"SPECGATE_SIM_ALPHA": "0.8"})
    body["spec"]["speculative"]["numSpeculativeTokensPerBatchSizePolicy"] = "Auto"
    schedules: list[dict[str, Any]] = []  # status.kSchedule each time it changed
    pods: dict[str, Any] = {}  # canary pod -> the schedule its engine was started with

    def record_and_edit_once_promoted(obj: dict[str, Any]) -> None:
        status = obj.get("status", {})
        if status.get("kSchedule") and (not schedules or schedules[-1] != status["kSchedule"]):
            schedules.append(status["kSchedule"])
        pods.update(canary_schedules(api_client, namespace, "auto"))
        if status.get("phase") == "Promoted" and obj["metadata"]["generation"] == 1:
            edit = {"spec": {"env": [*obj["spec"]["env"], {"name": "SPECGATE_TEST_EDIT", "value": "1"}]}}
            client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, "auto", edit
            )

    def promoted_again(obj: dict[str, Any]) -> bool:
        status = obj.get("status", {})
        return status.get("phase") in SETTLED - {"Promoted"} or (
            status.get("phase") == "Promoted" and status.get("rolloutGeneration") == 2
        )

    run = run_rollout(
        body=body, during=record_and_edit_once_promoted, until=promoted_again, timeout=600, **lab
    )
    return run, schedules, pods


def test_an_auto_schedule_is_derived_per_rollout_rendered_and_promoted(rollouts: Rollouts) -> None:
    lab, (run, schedules, pods) = rollouts["auto"].result()
    status = run.status
    assert (status["phase"], status["rolloutGeneration"]) == ("Promoted", 2), status.get("message")
    assert run.phases.count("Promoted") == 2 and "RolledBack" not in run.phases, run.phases
    # One schedule per rollout, held from its start to its end: a schedule never restarts a rollout.
    first, second = schedules
    assert (first["source"], second["source"]) == ("GateAlpha", "CanaryMeasurement")
    assert first["templateHash"] != second["templateHash"] == status["templateHash"]
    assert status["kSchedule"] == second
    for schedule in (first, second):
        ranges = schedule["ranges"]
        assert ranges[0][0] == 1 and all(0 <= k <= 3 for _, _, k in ranges), ranges
        assert [a for a, _, _ in ranges[1:]] == [b + 1 for _, b, _ in ranges[:-1]], ranges
        assert schedule["accelerator"].startswith("H100 (assumed")  # kwok nodes name no GPU product
    # The second rests on what the first canary measured: with every draft 3 long (the simulator
    # ignores the schedule), alpha is the mean of the per-position rates, and the simulator's is 0.8
    # (0.78-0.80 on quiet runs; a loaded CI-like run measured [0.812, 0.722, 0.632], its first
    # position short of the simulator's 0.89 for a reason not found yet: issue 61's note).
    per_position = second["acceptancePerPosition"]
    assert len(per_position) == 3 and sum(per_position) / 3 == pytest.approx(0.8, abs=0.1), per_position
    # Every canary pod ran its rollout's schedule, and only that: the rendering reached vLLM's config.
    assert set(map(json.dumps, pods.values())) <= {json.dumps(first["ranges"]), json.dumps(second["ranges"])}
    assert json.dumps(second["ranges"]) in set(map(json.dumps, pods.values()))
    shown = specgate_status(lab["kubeconfig"], lab["namespace"], "auto")
    assert f"schedule {json.dumps(second['ranges'])} (CanaryMeasurement:" in shown.stdout, shown


# This module's rollouts run side by side, the longest first.
rollouts = side_by_side(
    {
        "auto": promote_twice_with_an_auto_schedule,
        "drift": drift_after_promotion,
        "good": promote_under_another_writer_and_an_hpa,
        "lowalpha": roll_back_below_the_gate,
        "neargate": decide_a_near_gate_canary_at_the_deadline,
        "slow": roll_back_a_heavy_draft,
        "nospeedup": roll_back_a_draft_that_does_not_pay,
        "outage": stop_prometheus_mid_analysis,
    }
)
