"""The Helm chart for real: lint, schema-valid manifests, install, and the operator working with
exactly the chart's RBAC (its ServiceAccount's token), while a call outside it is forbidden."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests.cluster.chart import CHART, HELM, KUBECONFORM, schema_location, strict
from tests.cluster.operator_process import Operator, run, service_account_kubeconfig, wait_for
from tests.cluster.rollouts import run_rollout, sim_rollout

from specgate import cli
from specgate_lab.crds import crd_path, install_crd, peering_crds_path

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_wide]  # a cluster-wide operator

RELEASE_NS = "specgate-system"
DASHBOARD = CHART / "dashboards" / "specgate.json"
RBAC_DENIED = re.compile(r'forbidden: User "[^"]+" cannot')  # how the API server words an RBAC denial


def test_helm_lint() -> None:
    out = run(HELM, "lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in out


def test_values_schema_rejects_bad_values() -> None:
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--set", "replicas=4"], capture_output=True, text=True
    )
    assert done.returncode != 0 and "replicas" in done.stderr


def test_the_chart_refuses_a_kubernetes_older_than_its_kube_version() -> None:
    """Chart.yaml's kubeVersion (the CRD's CEL rules with fieldPath need 1.30): an older cluster is
    refused with Helm's message before anything is applied. Without a cluster helm assumes the
    Kubernetes of its client-go, which build-binaries.sh sets as helm's own Makefile does (a plain
    `go install` says 1.20, and every `helm template` here would fail)."""
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--kube-version", "1.29.15"], capture_output=True, text=True
    )
    refusal = "chart requires kubeVersion: >=1.30.0-0 which is incompatible with Kubernetes v1.29.15"
    assert done.returncode != 0 and refusal in done.stderr, done.stderr
    run(HELM, "template", "x", str(CHART), "--kube-version", "1.30.0")
    run(HELM, "template", "x", str(CHART))  # as every other test here renders it


def test_the_crd_template_is_the_generated_crd_with_helms_labels() -> None:
    """templates/crd.yaml renders `make crd`'s file unchanged but for the chart's labels and, with
    crds.keep (default), the policy that keeps it on `helm uninstall`; crds.install=false renders
    none. (The copy in the chart equals crds/: tests/unit/test_packaging.py.)"""

    def crd(*values: str) -> list[dict[str, Any]]:
        out = run(HELM, "template", "specgate", str(CHART), "--namespace", RELEASE_NS, *values)
        return [d for d in yaml.safe_load_all(out) if d and d["kind"] == "CustomResourceDefinition"]

    (kept,) = crd()
    generated = yaml.safe_load(crd_path().read_text())
    metadata = kept.pop("metadata")
    assert kept == {k: v for k, v in generated.items() if k != "metadata"}
    assert metadata["name"] == generated["metadata"]["name"]
    assert metadata["annotations"] == {"helm.sh/resource-policy": "keep"}
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert metadata["labels"]["helm.sh/chart"] == f"specgate-{version}"
    (dropped,) = crd("--set", "crds.keep=false")
    assert "annotations" not in dropped["metadata"]
    assert crd("--set", "crds.install=false") == []


def cluster_schemas(kubectl: str, kubeconfig: str, out: Path, kinds: set[tuple[str, str]]) -> Path:
    """kubeconform schemas for the given (apiVersion, kind) from the local cluster's OpenAPI."""
    swagger = json.loads(run(kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/openapi/v2"))
    definitions = {name: strict(schema) for name, schema in swagger["definitions"].items()}
    for name, schema in definitions.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            if (api_version, gvk["kind"]) not in kinds:
                continue
            group = gvk["group"].split(".")[0]
            suffix = f"-{group}-{gvk['version']}" if group else f"-{gvk['version']}"
            standalone = {"$ref": f"#/definitions/{name}", "definitions": definitions}
            (out / f"{gvk['kind'].lower()}{suffix}.json").write_text(json.dumps(standalone))
    return out


def test_rendered_manifests_validate_against_the_cluster_openapi(
    api_client: client.ApiClient, kubectl: str, kubeconfig: str, tmp_path: Path
) -> None:
    # The peering objects of replicas > 1 are custom resources: their CRDs must be served.
    install_crd(api_client, peering_crds_path())
    wait_for(lambda: "KopfPeering" in run(kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/openapi/v2"),
             30, "KopfPeering in the OpenAPI")  # fmt: skip
    for values in (
        [],
        ["--set", "watchNamespaces={a,b}", "--set", "metrics.serviceMonitor=false"],
        ["--set", "replicas=2"],
        ["--set", "replicas=3", "--set", "watchNamespaces={a,b}"],
    ):
        rendered = run(HELM, "template", "specgate", str(CHART), "--namespace", RELEASE_NS, *values)
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        kinds = {(d["apiVersion"], d["kind"]) for d in docs}
        schemas = cluster_schemas(kubectl, kubeconfig, tmp_path, kinds)
        location = schema_location(schemas)
        out = run(KUBECONFORM, "-strict", "-summary", "-schema-location", location, input=rendered)
        assert "Invalid: 0, Errors: 0" in out, out
    # The schemas are strict: a misspelt field of the Deployment, and of the CRD the chart renders
    # since 0.2.0, is refused.
    for doc in docs:
        if doc["kind"] == "Deployment":
            doc["spec"]["replica"] = doc["spec"].pop("replicas")
        if doc["kind"] == "CustomResourceDefinition":
            doc["spec"]["names"]["shortName"] = doc["spec"]["names"].pop("shortNames")
    done = subprocess.run(
        [KUBECONFORM, "-strict", "-summary", "-schema-location", location],
        input=yaml.safe_dump_all(docs), capture_output=True, text=True,
    )  # fmt: skip
    assert "additional properties 'replica' not allowed" in done.stdout, done.stdout
    assert "additional properties 'shortName' not allowed" in done.stdout, done.stdout


def test_chart_installs_and_its_cluster_role_runs_a_rollout_watching_all_namespaces(
    api_client: client.ApiClient,
    namespace: str,
    kubectl: str,
    kubeconfig: str,
    bridge_url: str,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    env = {"KUBECONFIG": kubeconfig, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    # The lab's CRD is the test harness's, applied as `kubectl apply --server-side -f crds/` would:
    # a user who manages the CRD outside Helm says so with crds.install=false. (Taking it over is
    # test_helm_crd_upgrade.py's.)
    run(
        HELM,
        "upgrade",
        "--install",
        "specgate",
        str(CHART),
        "--namespace",
        RELEASE_NS,
        "--create-namespace",
        "--wait=false",
        "--set",
        "crds.install=false",
        env=env,
    )
    try:
        operator_kubeconfig = service_account_kubeconfig(
            kubectl, kubeconfig, RELEASE_NS, "specgate", tmp_path / "operator-kubeconfig"
        )

        forbidden = subprocess.run(
            [kubectl, "--kubeconfig", str(operator_kubeconfig), "-n", namespace, "get", "secrets"],
            capture_output=True,
            text=True,
        )
        assert forbidden.returncode != 0 and RBAC_DENIED.search(forbidden.stderr), forbidden.stderr

        # No --namespace: kopf lists and watches SpeculativeDeployments cluster-wide, as the chart's
        # default (watchNamespaces: []) runs it, through the ClusterRole it grants.
        cluster_wide = Operator(str(operator_kubeconfig), tmp_path, "--prometheus-url", prometheus_url)
        body = sim_rollout("helm", {"SPECGATE_SIM_ALPHA": "0.8"})
        rollout = run_rollout(
            api_client, namespace, str(operator_kubeconfig), bridge_url, prometheus_url, body, tmp_path,
            operator=cluster_wide,
        )  # fmt: skip
        assert rollout.status["phase"] == "Promoted", rollout.status.get("message")
        log = rollout.operator_log
        # Only RBAC denials count: watching the whole cluster, it may also see another test's
        # namespace terminate (403 NamespaceTerminating on its events).
        assert not RBAC_DENIED.search(log), log[-2000:]
        assert "may not list and watch ReplicaSets" not in log  # the chart grants the watch
    finally:
        run(HELM, "uninstall", "specgate", "--namespace", RELEASE_NS, env=env)


def test_values_for_namespaces_service_monitor_and_security_reach_the_manifests() -> None:
    """`watchNamespaces`, `metrics.serviceMonitor`, `metrics.monitorLabels`, `prometheusCA`, `prometheusAuth`, `grafanaDashboard` and the security
    contexts as a user sets them (and a parent chart's `global`): the operator watches exactly those
    namespaces with a Role in each; the ServiceMonitor and PrometheusRule carry the label
    kube-prometheus-stack selects by; the ServiceMonitor selects the metrics Service, scrapes the
    port the operator serves /metrics on and keeps the series' own namespace label (honorLabels);
    both security contexts are the values given (rendered with helm; the install test runs the
    default values)."""
    rendered = run(
        HELM, "template", "specgate", str(CHART), "--namespace", RELEASE_NS,
        "--set", "watchNamespaces={team-a,team-b}", "--set", "metrics.serviceMonitor=true",
        "--set", "metrics.port=9102", "--set", "securityContext.readOnlyRootFilesystem=false",
        "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.monitorLabels.release=kps",
        "--set", "global.imageRegistry=registry.example.com", "--set", "prometheusCA.configMap=prom-ca",
        "--set", "prometheusAuth.bearerTokenSecret.name=prom-token", "--set", "prometheusAuth.headers.X-Scope-OrgID=team-a",
        "--set", "grafanaDashboard.enabled=true",
    )  # fmt: skip
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    pod = by_kind["Deployment"][0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert [a for a in container["args"] if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    assert "--metrics-port=9102" in container["args"]
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind["Role"]}
    assert {ns for ns, _ in roles} == {"team-a", "team-b"}
    assert {b["metadata"]["namespace"] for b in by_kind["RoleBinding"]} == {"team-a", "team-b"}
    (monitor,) = by_kind["ServiceMonitor"]
    service = next(s for s in by_kind["Service"] if s["metadata"]["name"].endswith("-metrics"))
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    (rule,) = by_kind["PrometheusRule"]
    assert monitor["metadata"]["labels"]["release"] == rule["metadata"]["labels"]["release"] == "kps"
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    served = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert served[port["targetPort"]] == 9102
    # The private CA: the ConfigMap mounted, and the Prometheus client (requests) pointed at it.
    (volume,) = [v for v in pod["volumes"] if v["name"] == "prometheus-ca"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "prometheus-ca"]
    assert volume["configMap"]["name"] == "prom-ca"
    assert {"name": "REQUESTS_CA_BUNDLE", "value": f"{mount['mountPath']}/ca.crt"} in container["env"]
    # The token Secret mounted and named to the operator, and the tenant header on its command line.
    (token,) = [v for v in pod["volumes"] if v["name"] == "prometheus-token"]
    (token_mount,) = [m for m in container["volumeMounts"] if m["name"] == "prometheus-token"]
    assert token["secret"]["secretName"] == "prom-token"
    assert f"--prometheus-bearer-token-file={token_mount['mountPath']}/token" in container["args"]
    assert "--prometheus-header=X-Scope-OrgID: team-a" in container["args"]
    assert cli.build_parser().parse_args(container["args"]).prometheus_header == ["X-Scope-OrgID: team-a"]
    (dashboard,) = [
        c for c in by_kind["ConfigMap"] if c["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    assert json.loads(dashboard["data"]["specgate.json"]) == json.loads(DASHBOARD.read_text())
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_basic_auth_from_a_secret_reaches_the_operator_and_excludes_the_bearer_token() -> None:
    """prometheusAuth.basicAuthSecret: the whole Secret mounted (so a rotation reaches the file) and
    its key named by --prometheus-basic-auth-file; with bearerTokenSecret too, helm refuses both."""
    basic = ("--set", "prometheusAuth.basicAuthSecret.name=prom-basic")
    rendered = run(HELM, "template", "specgate", str(CHART), "--namespace", RELEASE_NS, *basic)
    (deployment,) = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "prometheus-basic-auth"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "prometheus-basic-auth"]
    assert volume["secret"] == {"secretName": "prom-basic"} and "subPath" not in mount
    assert f"--prometheus-basic-auth-file={mount['mountPath']}/credentials" in container["args"]
    assert not any(a.startswith("--prometheus-bearer-token-file") for a in container["args"])
    both = subprocess.run(
        [HELM, "template", "x", str(CHART), *basic, "--set", "prometheusAuth.bearerTokenSecret.name=t"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert both.returncode != 0 and "bearerTokenSecret.name or basicAuthSecret.name, not both" in both.stderr
