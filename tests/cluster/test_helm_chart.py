"""The Helm chart for real: lint, schema-valid manifests, install, and the operator working with
exactly the chart's RBAC (its ServiceAccount's token), while a call outside it is forbidden."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests.cluster.conftest import CACHE
from tests.cluster.operator_process import wait_for
from tests.cluster.rollouts import run_rollout, sim_rollout
from tests.conftest import ROOT

from specgate import cli
from specgate.lab.crds import PEERING_CRDS_PATH, install_crd

pytestmark = pytest.mark.cluster

CHART = ROOT / "charts" / "specgate"
HELM = str(CACHE / "bin" / "helm")
KUBECONFORM = str(CACHE / "bin" / "kubeconform")
RELEASE_NS = "specgate-system"
DASHBOARD = CHART / "dashboards" / "specgate.json"


def run(*argv: str, **kwargs: Any) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_helm_lint() -> None:
    out = run(HELM, "lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in out


def test_values_schema_rejects_bad_values() -> None:
    done = subprocess.run(
        [HELM, "template", "x", str(CHART), "--set", "replicas=4"], capture_output=True, text=True
    )
    assert done.returncode != 0 and "replicas" in done.stderr


def cluster_schemas(kubectl: str, kubeconfig: str, out: Path, kinds: set[tuple[str, str]]) -> Path:
    """kubeconform schemas for the given (apiVersion, kind) from the local cluster's OpenAPI."""
    swagger = json.loads(run(kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/openapi/v2"))
    definitions = swagger["definitions"]
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
    install_crd(api_client, PEERING_CRDS_PATH)
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
        out = run(
            KUBECONFORM, "-strict", "-summary", "-schema-location",
            f"{schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json", input=rendered,
        )  # fmt: skip
        assert "Invalid: 0, Errors: 0" in out, out


def test_chart_installs_and_its_rbac_runs_a_rollout(
    api_client: client.ApiClient,
    namespace: str,
    kubectl: str,
    kubeconfig: str,
    bridge_url: str,
    prometheus_url: str,
    tmp_path: Path,
) -> None:
    env = {"KUBECONFIG": kubeconfig, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
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
        env=env,
    )
    try:
        token = run(
            kubectl, "--kubeconfig", kubeconfig, "-n", RELEASE_NS, "create", "token", "specgate"
        ).strip()
        operator_kubeconfig = tmp_path / "operator-kubeconfig"
        config = yaml.safe_load(Path(kubeconfig).read_text())
        config["users"] = [{"name": "specgate", "user": {"token": token}}]
        for ctx in config["contexts"]:
            ctx["context"]["user"] = "specgate"
        operator_kubeconfig.write_text(yaml.safe_dump(config))

        forbidden = subprocess.run(
            [kubectl, "--kubeconfig", str(operator_kubeconfig), "-n", namespace, "get", "secrets"],
            capture_output=True,
            text=True,
        )
        assert forbidden.returncode != 0 and "forbidden" in forbidden.stderr.lower()

        body = sim_rollout("helm", {"SPECGATE_SIM_ALPHA": "0.8"})
        rollout = run_rollout(
            api_client, namespace, str(operator_kubeconfig), bridge_url, prometheus_url, body, tmp_path
        )
        assert rollout.status["phase"] == "Promoted", rollout.status.get("message")
        log = rollout.operator_log
        assert "Forbidden" not in log and "403" not in log, log[-2000:]
    finally:
        run(HELM, "uninstall", "specgate", "--namespace", RELEASE_NS, env=env)


def test_alerts_fire_as_their_runbooks_say(tmp_path: Path) -> None:
    """The chart's PrometheusRule, evaluated by Prometheus's own rule engine (promtool test rules)
    on series the operator exports: errors for 10 minutes fire; a rolled-back object fires."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make cluster-up` (Debian's prometheus ships it)"
    base = "https://example.com/runbooks/"
    rendered = run(
        HELM, "template", "specgate", str(CHART), "--show-only", "templates/prometheusrule.yaml",
        "--set", "metrics.prometheusRule.enabled=true", "--set", f"metrics.prometheusRule.runbookBaseUrl={base}",
    )  # fmt: skip
    rule = yaml.safe_load(rendered)
    assert rule["kind"] == "PrometheusRule"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    for alert in (r for g in rule["spec"]["groups"] for r in g["rules"]):
        page = alert["annotations"]["runbook_url"].removeprefix(base)
        assert (ROOT / "runbooks" / page).is_file(), f"{alert['alert']} links a missing page {page}"
    errors = {"namespace": "ns", "name": "broken"}
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'specgate_reconcile_errors_total{namespace="ns",name="broken"}', "values": "0+1x40"},
                    {"series": 'specgate_reconcile_errors_total{namespace="ns",name="fine"}', "values": "3x40"},
                    {"series": 'specgate_rollout_phase{namespace="ns",name="eagle",phase="RolledBack"}', "values": "0 0 1x10"},
                    {"series": 'specgate_rollout_phase{namespace="ns",name="good",phase="RolledBack"}', "values": "0x12"},
                ],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "SpecgateReconcileErrors", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "SpecgateReconcileErrors",
                        "exp_alerts": [{"exp_labels": {"severity": "warning", **errors}, "exp_annotations": {
                            "summary": "specgate cannot reconcile ns/broken",
                            "description": "Reconciles keep failing, so the rollout does not advance; the operator log says why.",
                            "runbook_url": f"{base}reconcile-errors.md",
                        }}],
                    },
                    {"eval_time": "1m", "alertname": "SpecgateRolledBack", "exp_alerts": []},
                    {
                        "eval_time": "5m",
                        "alertname": "SpecgateRolledBack",
                        "exp_alerts": [{"exp_labels": {"severity": "info", "namespace": "ns", "name": "eagle"}, "exp_annotations": {
                            "summary": "ns/eagle serves without speculative decoding: rolled back",
                            "description": "kubectl describe sd -n ns eagle gives the reason; bump spec.rollout.retry to try again.",
                            "runbook_url": f"{base}README.md",
                        }}],
                    },
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    out = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert "SUCCESS" in out, out


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
