"""The Prometheus Operator objects specgate ships, checked against that operator's own CRDs: the
chart's ServiceMonitor and PrometheusRule and the operator's PodMonitor (the lab has no Prometheus
Operator to apply them to). Needs only the binaries and the CRDs of `make binaries`, no cluster."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.cluster.chart import CHART, HELM, KUBECONFORM, schema_location, strict
from tests.cluster.conftest import CACHE
from tests.cluster.operator_process import run

from specgate import render

pytestmark = pytest.mark.cluster

CRDS = CACHE / "crds" / "prometheus-operator"  # pinned by hack/build-binaries.sh
# One field per kind, misspelt: kubeconform must refuse each (the schemas are strict).
MISSPELT: dict[str, tuple[list[str | int], str, str]] = {
    "ServiceMonitor": (["spec", "endpoints", 0], "honorLabels", "honourLabels"),
    "PrometheusRule": (["spec", "groups", 0, "rules", 0], "annotations", "annotation"),
    "PodMonitor": (["spec"], "podTargetLabels", "podTargetLabel"),
}


def write_schemas(out: Path) -> Path:
    """kubeconform's layout: <kind>-<group's first label>-<version>.json."""
    assert CRDS.is_dir(), f"{CRDS} is missing: run `make binaries`"
    for path in sorted(CRDS.glob("*.yaml")):
        crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        group = crd["spec"]["group"].split(".")[0]
        for version in crd["spec"]["versions"]:
            name = f"{crd['spec']['names']['kind'].lower()}-{group}-{version['name']}.json"
            (out / name).write_text(json.dumps(strict(version["schema"]["openAPIV3Schema"])))
    return out


def kubeconform(schemas: Path, docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each document's result by kind (statusValid, statusInvalid with its message, ...)."""
    done = subprocess.run(
        [KUBECONFORM, "-strict", "-verbose", "-output", "json", "-schema-location", schema_location(schemas)],
        input=yaml.safe_dump_all(docs), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr  # 1: something is invalid
    return {r["kind"]: r for r in json.loads(done.stdout)["resources"]}


def shipped() -> list[dict[str, Any]]:
    rendered = run(
        HELM, "template", "specgate", str(CHART), "--namespace", "specgate-system",
        "--set", "metrics.serviceMonitor=true", "--set", "metrics.prometheusRule.enabled=true",
        "--set", "metrics.monitorLabels.release=kps",
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["apiVersion"].startswith("monitoring.")]
    owner = render.Owner(name="llama-8b", namespace="inference", uid="0000-1111")
    return [*docs, render.pod_monitor(owner, "15s")]


def test_the_monitoring_objects_match_the_prometheus_operator_crds(tmp_path: Path) -> None:
    schemas = write_schemas(tmp_path)
    docs = shipped()
    assert sorted(d["kind"] for d in docs) == sorted(MISSPELT)
    results = kubeconform(schemas, docs)
    statuses = {kind: result["status"] for kind, result in results.items()}
    assert statuses == dict.fromkeys(MISSPELT, "statusValid"), results

    for doc in docs:
        path, right, wrong = MISSPELT[doc["kind"]]
        node: Any = doc
        for step in path:
            node = node[step]
        node[wrong] = node.pop(right)
    results = kubeconform(schemas, docs)
    for kind, (_, _, wrong) in MISSPELT.items():
        assert results[kind]["status"] == "statusInvalid" and wrong in results[kind]["msg"], results[kind]
