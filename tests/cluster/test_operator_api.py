"""The API on a real API server, and the operator reconciling a sample into its children."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.operator_process import (
    create_sd,
    get_sd,
    operator_process,
    sd_gone,
    service_account_kubeconfig,
    specgate_status,
    wait_for,
)
from tests.conftest import SAMPLES, load_sample, tiny
from tests.unit.spec_cases import RULE_CASES

import specgate
from specgate import api, kube
from specgate_lab import demo
from specgate_lab.calibrate import free_port
from specgate_lab.crds import install_crd

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("crd")]


def sd(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec}


def test_samples_are_accepted(api_client: client.ApiClient, namespace: str) -> None:
    for path in sorted(SAMPLES.glob("*.yaml")):
        body = load_sample(path.name)
        body["metadata"]["namespace"] = namespace
        created = create_sd(api_client, namespace, body, dry_run=True)
        # The API server applied the schema's defaults.
        assert created["spec"]["rollout"]["gates"]["minAcceptanceRate"] == 0.55
        assert created["spec"]["speculative"]["numSpeculativeTokens"] >= 1


def test_a_new_object_reads_in_progress_before_any_operator_writes_status(
    api_client: client.ApiClient, namespace: str
) -> None:
    """kstatus (Flux's health checks, `kubectl wait` in pipelines) reads a custom resource without
    status as Current; with the CRD's status default the API server itself answers generation 1
    not yet observed, which kstatus's generic rule (observedGeneration != generation) reads as
    InProgress, and PHASE shows Pending while no operator runs."""
    body = tiny()
    create_sd(api_client, namespace, body)
    obj = get_sd(api_client, namespace, body["metadata"]["name"])
    assert obj["status"] == {"observedGeneration": 0, "phase": "Pending"}
    assert obj["status"]["observedGeneration"] != obj["metadata"]["generation"] == 1


@pytest.mark.parametrize(
    ("index", "rejected", "accepted"), [case for case in RULE_CASES if api.RULES[case[0]].cel is not None]
)
def test_cel_rules_on_the_api_server(
    api_client: client.ApiClient,
    namespace: str,
    index: int,
    rejected: dict[str, Any],
    accepted: dict[str, Any],
) -> None:
    rule = api.RULES[index]
    with pytest.raises(ApiException) as err:
        create_sd(api_client, namespace, sd("bad", rejected), dry_run=True)
    assert err.value.status == 422
    assert rule.message in err.value.body
    assert rule.field.split(".")[-1] in err.value.body
    create_sd(api_client, namespace, sd("good", accepted), dry_run=True)


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("speculative", "numSpeculativeTokens"), 17, "spec.speculative.numSpeculativeTokens"),
        (("rollout", "gates", "minAcceptanceRate"), 1.5, "spec.rollout.gates.minAcceptanceRate"),
        (("speculative", "method"), "medusa", "spec.speculative.method"),
        (("rollout", "warmup"), "5 minutes", "spec.rollout.warmup"),
    ],
)
def test_schema_errors_name_the_field(
    api_client: client.ApiClient, namespace: str, path: tuple[str, ...], value: Any, field: str
) -> None:
    spec = copy.deepcopy(RULE_CASES[0][2])
    node = spec
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    with pytest.raises(ApiException) as err:
        create_sd(api_client, namespace, sd("bad", spec), dry_run=True)
    assert err.value.status == 422 and field in err.value.body


def test_operator_creates_the_baseline(
    api_client: client.ApiClient,
    namespace: str,
    kubeconfig: str,
    kubectl: str,
    tmp_path: Path,
    gpu_cluster_classes: str,
) -> None:
    body = tiny()
    body["spec"]["podAnnotations"] = {"specgate.dev/lab-engine": "sim"}
    body["spec"]["replicas"] = 2
    body["spec"]["podTemplate"] = {
        "runtimeClassName": gpu_cluster_classes,
        "priorityClassName": gpu_cluster_classes,
        "imagePullSecrets": ["registry"],
        "shmSizeLimit": "1Gi",
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    secret = "hf_do_not_leak_0123456789"
    client.CoreV1Api(api_client).create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="hf-token"), string_data={"token": secret}),
    )
    body["spec"]["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    ]
    apps = client.AppsV1Api(api_client)
    metrics_port, liveness_port = free_port(), free_port()
    own = ("--metrics-port", str(metrics_port), "--liveness", f"http://127.0.0.1:{liveness_port}/healthz")
    with (
        CapacityMonitor(api_client, namespace) as capacity,
        operator_process(kubeconfig, tmp_path / "operator.log", "--namespace", namespace, *own),
    ):
        create_sd(api_client, namespace, body)
        dep = wait_for(lambda: apps.read_namespaced_deployment("tiny-baseline", namespace), 60, "baseline")
        status = wait_for(
            lambda: get_sd(api_client, namespace, "tiny").get("status", {}).get("observedGeneration"),
            60,
            "status",
        )
        assert status == 1
        obj = get_sd(api_client, namespace, "tiny")
        capacity.wait_for_floor("tiny", 90)  # both replicas serve behind Service tiny, and stay
        # The operator's own endpoints, as the chart's probes and ServiceMonitor use them.
        with urllib.request.urlopen(f"http://127.0.0.1:{liveness_port}/healthz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
            exposed = resp.read().decode()
        phases = {
            sample.labels["phase"]: sample.value
            for family in text_string_to_metric_families(exposed)
            for sample in family.samples
            if sample.name == "specgate_rollout_phase" and sample.labels["namespace"] == namespace
        }
        assert phases["Baseline"] == 1 and sum(phases.values()) == 1, phases
        (build,) = [f for f in text_string_to_metric_families(exposed) if f.name == "specgate_build_info"]
        assert build.samples[0].labels == {"version": specgate.__version__}
        shown = specgate_status(kubeconfig, namespace, "tiny")
        assert shown.returncode == 0 and shown.stdout.startswith("tiny: Baseline"), shown
        # The same as kubectl's plugin, found on PATH as kubectl-specgate (make venv installs it).
        plugin = subprocess.run(
            [kubectl, "specgate", "status", "tiny", "-n", namespace], capture_output=True, text=True, timeout=60,
            env={**os.environ, "KUBECONFIG": kubeconfig, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        )  # fmt: skip
        # The reason may move on between the two reads (WaitingForBaseline -> MeasuringBaseline).
        assert plugin.returncode == 0 and plugin.stdout.startswith("tiny: Baseline ("), plugin
        assert "NewGeneration: rollout of generation 1 begins" in plugin.stdout, plugin
        as_json = json.loads(specgate_status(kubeconfig, namespace, "tiny", "-o", "json").stdout)
        assert as_json["phase"] == "Baseline" and as_json["observedGeneration"] == 1
        waited = specgate_status(
            kubeconfig, namespace, "tiny", "--watch", "--timeout", "3", "--interval", "1"
        )
        assert waited.returncode == 2 and "no verdict within 3s" in waited.stderr, waited  # still measuring
    container = dep.spec.template.spec.containers[0]
    assert dep.spec.replicas == 2
    # spec.podTemplate on the pods the API server admitted (their classes exist), which became Ready.
    pods = client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector="specgate.dev/track=baseline"
    )
    for pod in pods.items:
        assert pod.spec.runtime_class_name == gpu_cluster_classes and pod.spec.priority == 1000
        assert pod.spec.image_pull_secrets[0].name == "registry"
        volumes = {v.name: v for v in pod.spec.volumes}
        assert volumes["dshm"].empty_dir.size_limit == "1Gi" and "scratch" in volumes
    assert container.resources.limits == {"nvidia.com/gpu": "1"}
    assert container.args[0] == "specgate/tiny-llama" and "--speculative-config" not in container.args
    assert container.startup_probe.http_get.path == "/health"
    assert dep.metadata.owner_references[0].uid == obj["metadata"]["uid"]
    svc = client.CoreV1Api(api_client).read_namespaced_service("tiny", namespace)
    assert svc.spec.selector == {"specgate.dev/deployment": "tiny", "app.kubernetes.io/name": "vllm"}
    assert obj["status"]["phase"] == "Baseline"
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert conditions["Progressing"] == "True" and conditions["Available"] == "False"
    (event,) = [
        e for e in _events(api_client, namespace, "NewGeneration") if e.involved_object.name == "tiny"
    ]
    assert event.source.component == "specgate"  # kubectl describe's From column
    # The token stays a reference: not in the Deployment, the status, the Events or the operator's log.
    assert container.env[0].value_from.secret_key_ref.name == "hf-token" and container.env[0].value is None
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    for text in (
        str(dep.to_dict()),
        str(obj["status"]),
        " ".join(e.message or "" for e in events),
        (tmp_path / "operator.log").read_text(),
    ):
        assert secret not in text


def test_an_operator_whose_role_lacks_replica_sets_says_so_and_still_reconciles(
    api_client: client.ApiClient, namespace: str, kubeconfig: str, kubectl: str, tmp_path: Path
) -> None:
    """A Role from before 0.3.0 grants specgate everything but list and watch on ReplicaSets: `specgate
    run` says so at start and reconciles without that watch (kopf would run no handler at all while
    an index of its stays unfilled)."""
    rbac, core = client.RbacAuthorizationV1Api(api_client), client.CoreV1Api(api_client)
    name = f"specgate-no-replicasets-{namespace}"
    rules = [
        client.V1PolicyRule(api_groups=[group], resources=[resource], verbs=sorted(verbs))
        for group, resource, verbs in kube.PERMISSIONS
        if resource != "replicasets"
    ]
    assert len(rules) == len(kube.PERMISSIONS) - 1
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="specgate"))
    )
    rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name=name), rules=rules))
    binding = client.V1ClusterRoleBinding(
        metadata=client.V1ObjectMeta(name=name),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="specgate", namespace=namespace)],
    )
    rbac.create_cluster_role_binding(binding)
    try:
        account = service_account_kubeconfig(kubectl, kubeconfig, namespace, "specgate", tmp_path / "sa")
        body = tiny()
        body["spec"]["podAnnotations"] = {"specgate.dev/lab-engine": "sim"}
        log_path = tmp_path / "operator.log"
        with operator_process(account, log_path, "--namespace", namespace):
            create_sd(api_client, namespace, body)
            apps = client.AppsV1Api(api_client)
            wait_for(lambda: apps.read_namespaced_deployment("tiny-baseline", namespace), 60, "baseline")
            observed = wait_for(
                lambda: get_sd(api_client, namespace, "tiny").get("status", {}).get("observedGeneration"),
                60,
                "status",
            )
            assert observed == 1
        log = log_path.read_text()
        assert f"may not list and watch ReplicaSets (apps) in {namespace}" in log, log[-2000:]
        assert "forbidden" not in log.lower(), log[-2000:]  # no watch or call it made was refused
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_kubectl_get_shows_the_columns(
    api_client: client.ApiClient, namespace: str, kubeconfig: str, kubectl: str
) -> None:
    body = tiny()
    create_sd(api_client, namespace, body)
    out = subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "-n", namespace, "get", "sd"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    header = out.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "METHOD", "K", "ALPHA", "P99-ITL-BASE", "P99-ITL-CANARY", "AGE"]
    row = out.splitlines()[1].split()  # no operator runs: status columns are empty or <none>
    assert row[0] == "tiny" and row[row.index("draft_model") + 1] == "4", out


def test_an_invalid_spec_that_slips_past_the_schema_fails_without_children(
    api_client: client.ApiClient, namespace: str, kubeconfig: str, tmp_path: Path
) -> None:
    """CEL cannot look inside extraConfig, so the API server accepts this; the operator refuses it."""
    bad = tiny()
    bad["spec"]["speculative"]["extraConfig"] = {"tensor_parallel_size": 2}
    create_sd(api_client, namespace, bad)
    with operator_process(kubeconfig, tmp_path / "operator.log", "--namespace", namespace):
        status = wait_for(lambda: _written_status(api_client, namespace, "tiny"), 60, "status")
        events = wait_for(lambda: _events(api_client, namespace, "InvalidSpec"), 30, "InvalidSpec Event")
    assert status["phase"] == "Failed" and status["reason"] == "InvalidSpec"
    assert (
        "spec.speculative.extraConfig" in status["message"] and "draftTensorParallelSize" in status["message"]
    )
    assert events[0].type == "Warning"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Stalled"]["status"] == "True" and conditions["Stalled"]["reason"] == "InvalidSpec"
    assert client.AppsV1Api(api_client).list_namespaced_deployment(namespace).items == []


def _events(api_client: client.ApiClient, namespace: str, reason: str) -> list[Any]:
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    return [e for e in events if e.reason == reason]


def test_a_demo_kept_with_keep_1_can_delete_its_object(
    api_client: client.ApiClient, namespace: str, kubeconfig: str, prometheus_url: str, tmp_path: Path
) -> None:
    """`make demo KEEP=1` stops its operator but keeps the cluster: the object it leaves must still
    be deletable with kubectl, so the demo takes kopf's finalizer off as its operator stops."""
    install_crd(api_client)
    body = tiny()
    body["spec"]["podAnnotations"] = {"specgate.dev/lab-engine": "sim"}
    operator = demo.start_operator(kubeconfig, namespace, prometheus_url, tmp_path / "operator.log")
    try:
        create_sd(api_client, namespace, body)
        wait_for(
            lambda: get_sd(api_client, namespace, "tiny")["metadata"].get("finalizers"),
            60,
            "kopf's finalizer",
        )
    finally:
        demo.stop_operator(operator, api_client, namespace)
    objects = client.CustomObjectsApi(api_client)
    objects.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "tiny")
    wait_for(
        lambda: sd_gone(api_client, namespace, "tiny"),
        30,
        "the object to be deleted with no operator running",
    )


def _written_status(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The status once the operator wrote one (the CRD's default says observedGeneration 0)."""
    status: dict[str, Any] = get_sd(api_client, namespace, name)["status"]
    return status if status.get("observedGeneration") else None
