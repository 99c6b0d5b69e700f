"""`helm upgrade` brings the SpeculativeDeployment CRD (chart 0.2.0 made it a template): from a 0.1.0
release, whose CRD came from crds/ and was never upgraded, with the README's one-time
--take-ownership; then with a plain `helm upgrade`; and `helm uninstall` keeps the CRD."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from tests.cluster.chart import CHART, HELM
from tests.cluster.operator_process import wait_for
from tests.conftest import load_sample

from specgate_lab.crds import CRD_FILE, install_crd

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_wide]  # the CRD every test uses

CRD_NAME = "speculativedeployments.specgate.dev"
RELEASE = "specgate-upgrade"  # not the other Helm test's release: its cluster-wide RBAC is named after it
POD_TEMPLATE = {"runtimeClassName": "nvidia"}


def spec_properties(crd: dict[str, Any]) -> dict[str, Any]:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    properties: dict[str, Any] = schema["properties"]["spec"]["properties"]
    return properties


def without_pod_template(crd: dict[str, Any]) -> None:
    """The CRD without spec.podTemplate, and without the later rules that name it (workloadRef's:
    the API server refuses a rule on a field the schema lacks)."""
    spec_properties(crd).pop("podTemplate")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["x-kubernetes-validations"] = [
        rule for rule in spec.get("x-kubernetes-validations", []) if "podTemplate" not in rule["rule"]
    ]


def edit_yaml(path: Path, edit: Callable[[Any], object]) -> None:
    doc = yaml.safe_load(path.read_text())
    edit(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def previous_chart(tmp_path: Path) -> Path:
    """Chart 0.1.0 as it was released: its CRDs in crds/ (installed once, never upgraded by Helm),
    no `crds` values, and a CRD without spec.podTemplate, a field 0.2.0 has. Built from the current
    chart rather than from git history, which a CI clone may lack (shallow)."""
    chart = tmp_path / "specgate-0.1.0"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "crd.yaml").unlink()
    (chart / "files" / CRD_FILE).rename(chart / "crds" / CRD_FILE)
    edit_yaml(chart / "crds" / CRD_FILE, without_pod_template)

    def released(meta: dict[str, Any]) -> None:
        meta["version"] = "0.1.0"
        del meta["kubeVersion"]  # 0.1.0 declared none

    edit_yaml(chart / "Chart.yaml", released)
    edit_yaml(chart / "values.yaml", lambda values: values.pop("crds"))
    schema = json.loads((chart / "values.schema.json").read_text())
    del schema["properties"]["crds"]
    (chart / "values.schema.json").write_text(json.dumps(schema))
    return chart


def next_chart(tmp_path: Path) -> Path:
    """The current chart with a changed CRD (a field's description), as the next release would be."""
    chart = tmp_path / "specgate-next"
    shutil.copytree(CHART, chart)
    edit_yaml(chart / "Chart.yaml", lambda meta: meta.update(version="0.2.1"))
    edit_yaml(
        chart / "files" / CRD_FILE,
        lambda crd: spec_properties(crd)["podTemplate"].update(description="Changed by the next chart."),
    )
    return chart


@pytest.fixture
def lab_crd(api_client: client.ApiClient) -> Iterator[None]:
    """The lab's CRD is shared by every cluster test: afterwards it is again exactly the harness's
    (install_crd: no Helm labels or annotations, the current schema)."""
    try:
        yield
    finally:
        ext = client.ApiextensionsV1Api(api_client)
        meta = {"metadata": {"labels": None, "annotations": None}}
        ext.patch_custom_resource_definition(CRD_NAME, meta, _content_type="application/merge-patch+json")
        install_crd(api_client)
        restored = ext.read_custom_resource_definition(CRD_NAME).metadata
        assert restored and not restored.labels and not restored.annotations


def test_helm_upgrade_brings_the_crd_from_chart_0_1_0_and_uninstall_keeps_it(
    api_client: client.ApiClient, lab_crd: None, namespace: str, kubectl: str, kubeconfig: str, tmp_path: Path
) -> None:
    env = {"KUBECONFIG": kubeconfig, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def helm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([HELM, *args, "-n", namespace], capture_output=True, text=True, env=env)

    def kube(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [kubectl, "--kubeconfig", kubeconfig, "-n", namespace, *args]
        return subprocess.run(argv, input=stdin, capture_output=True, text=True)

    def crd() -> dict[str, Any]:
        served: dict[str, Any] = json.loads(kube("get", "crd", CRD_NAME, "-o", "json").stdout)
        return served

    body = load_sample("tiny-cpu.yaml")
    body["spec"]["podTemplate"] = POD_TEMPLATE
    manifest = yaml.safe_dump(body)

    def accepted() -> bool:
        """kubectl apply (strict field validation, as by default) takes spec.podTemplate."""
        done = kube("apply", "--dry-run=server", "-f", "-", stdin=manifest)
        assert done.returncode == 0 or 'unknown field "spec.podTemplate"' in done.stderr, done.stderr
        return done.returncode == 0

    def stored_pod_template() -> Any:
        jsonpath = "jsonpath={.spec.podTemplate}"
        return json.loads(kube("get", "sd", body["metadata"]["name"], "-o", jsonpath).stdout)

    # A 0.1.0 user: the CRD came from the chart's crds/. The lab's CRD exists already, so Helm skips
    # crds/ (as it does for a CRD installed before): the old schema is applied the way the harness
    # applies CRDs, with no Helm ownership, exactly what a crds/ install leaves.
    old = previous_chart(tmp_path)
    install_crd(api_client, old / "crds" / CRD_FILE)
    installed = helm("install", RELEASE, str(old), "--set", "logLevel=debug")
    assert installed.returncode == 0, installed.stderr
    try:
        wait_for(lambda: not accepted(), 30, "the 0.1.0 CRD served")
        assert "podTemplate" not in spec_properties(crd())

        # Helm does not touch a resource it did not create unless told to take it over.
        refused = helm("upgrade", RELEASE, str(CHART), "--reset-then-reuse-values")
        assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr, refused.stderr

        # The README's one-time step; the values given to 0.1.0 are kept.
        upgraded = helm("upgrade", RELEASE, str(CHART), "--reset-then-reuse-values", "--take-ownership")
        assert upgraded.returncode == 0, upgraded.stderr
        wait_for(accepted, 30, "spec.podTemplate served after helm upgrade")
        annotations = crd()["metadata"]["annotations"]
        assert annotations["helm.sh/resource-policy"] == "keep"
        assert annotations["meta.helm.sh/release-name"] == RELEASE
        assert json.loads(helm("get", "values", RELEASE, "-o", "json").stdout) == {"logLevel": "debug"}
        assert kube("apply", "-f", "-", stdin=manifest).returncode == 0
        assert stored_pod_template() == POD_TEMPLATE

        # Every later upgrade brings the CRD with no extra step.
        later = helm("upgrade", RELEASE, str(next_chart(tmp_path)), "--reset-then-reuse-values")
        assert later.returncode == 0, later.stderr
        served = crd()
        assert spec_properties(served)["podTemplate"]["description"] == "Changed by the next chart."
        assert served["metadata"]["labels"]["helm.sh/chart"] == "specgate-0.2.1"
        assert served["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    finally:
        # Whatever failed above, the uninstall must not delete the CRD every other test shares
        # (with it, every object of it): the chart's keep is asserted above, this only guards.
        kube("annotate", "crd", CRD_NAME, "helm.sh/resource-policy=keep", "--overwrite")
        uninstalled = helm("uninstall", RELEASE)
    assert uninstalled.returncode == 0, uninstalled.stderr
    # keep: the CRD, and with it the users' objects, survive the release.
    assert crd()["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert stored_pod_template() == POD_TEMPLATE
