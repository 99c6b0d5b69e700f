"""Bad input on a real API server: refused at `kubectl apply` with the field, the reason and the fix."""

from __future__ import annotations

import subprocess
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from tests.cluster.operator_process import create_sd, get_sd, wait_for
from tests.cluster.rollouts import lab_operator
from tests.conftest import tiny

from specgate import api, kube, render
from specgate_lab.crds import crd_path, install_crd

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("crd")]


def kubectl_apply(kubectl: str, kubeconfig: str, namespace: str, body: dict[str, Any], *flags: str) -> Any:
    return subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "-n", namespace, "apply", *flags, "-f", "-"],
        input=yaml.safe_dump(body),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_name_that_cannot_name_the_services_is_refused_with_the_fix(
    kubectl: str, kubeconfig: str, namespace: str
) -> None:
    done = kubectl_apply(kubectl, kubeconfig, namespace, tiny("llama-3.1-8b"))
    assert done.returncode != 0
    assert "metadata.name" in done.stderr and "DNS-1035" in done.stderr, done.stderr
    assert "<name>-baseline" in done.stderr and "llama-3-1-8b" in done.stderr, done.stderr
    longest = "x" * api.MAX_NAME_LENGTH
    assert kubectl_apply(kubectl, kubeconfig, namespace, tiny(longest + "x"), "--dry-run=server").returncode
    for good in ("llama-3-1-8b", longest):
        done = kubectl_apply(kubectl, kubeconfig, namespace, tiny(good), "--dry-run=server")
        assert done.returncode == 0, done.stderr


def test_a_bad_prometheus_url_is_refused_naming_the_field(
    kubectl: str, kubeconfig: str, namespace: str
) -> None:
    body = tiny("tiny")
    body["spec"].setdefault("rollout", {}).setdefault("metrics", {})["prometheusUrl"] = "not a url"
    done = kubectl_apply(kubectl, kubeconfig, namespace, body)
    assert done.returncode != 0
    assert "spec.rollout.metrics.prometheusUrl" in done.stderr and "http://" in done.stderr, done.stderr


@pytest.mark.cluster_wide  # serves an older CRD for a moment
def test_an_object_named_before_the_rule_can_still_be_updated_and_deleted(
    api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """The rule checks creates only: an old object's status writes and finalizer removal go through."""
    old = yaml.safe_load(crd_path().read_text())
    del old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    objects = client.CustomObjectsApi(api_client)
    try:
        install_crd(api_client, tmp_path / "old.yaml")
        create_sd(api_client, namespace, tiny("llama-3.1-8b"))
    finally:
        install_crd(api_client)
    args = (api.GROUP, api.VERSION, namespace, api.PLURAL, "llama-3.1-8b")
    objects.patch_namespaced_custom_object(*args, {"metadata": {"finalizers": ["specgate.dev/test"]}})
    objects.patch_namespaced_custom_object_status(*args, {"status": {"phase": "Failed"}})
    objects.patch_namespaced_custom_object(*args, {"metadata": {"finalizers": None}})
    objects.delete_namespaced_custom_object(*args)


def test_foreign_children_names_what_specgate_did_not_create(
    api_client: client.ApiClient, kubeconfig: str, namespace: str
) -> None:
    """A Service someone else made under a child's name is named, and applying over it is refused;
    owned and absent children (and the PodMonitor, whose CRD the lab lacks) pass. No operator runs."""
    # kube.py uses the default client, as in the operator
    config.load_kube_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    created = create_sd(api_client, namespace, tiny("llama"))
    owner = render.Owner("llama", namespace, created["metadata"]["uid"])
    core = client.CoreV1Api(api_client)
    theirs = client.V1Service(
        metadata=client.V1ObjectMeta(name="llama"),
        spec=client.V1ServiceSpec(selector={"app": "theirs"}, ports=[client.V1ServicePort(port=80)]),
    )
    core.create_namespaced_service(namespace, theirs)
    ours = render.service(owner, render.Track.CANARY)
    core.create_namespaced_service(namespace, cast(Any, ours))
    children = [
        render.service(owner),
        ours,
        render.service(owner, render.Track.BASELINE),
        render.pod_monitor(owner, "15s"),
    ]
    assert kube.foreign_children(children, owner.uid) == [
        f"Service {namespace}/llama (not created by this SpeculativeDeployment)"
    ]
    assert kube.foreign_children([ours], str(uuid.uuid4())) == [
        f"Service {namespace}/llama-canary (not created by this SpeculativeDeployment)"
    ]
    # Applying over their Service is refused before any write, not a takeover.
    with pytest.raises(kube.ForeignChild, match=f"Service {namespace}/llama "):
        kube.apply(render.service(owner))
    assert core.read_namespaced_service("llama", namespace).spec.selector == {"app": "theirs"}


def test_a_service_specgate_did_not_create_is_left_untouched_and_named(lab: dict[str, Any]) -> None:
    """The operator refuses the object (Failed, NameConflict) and creates nothing; once the other
    Service is gone the rollout begins."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    theirs = client.V1Service(
        metadata=client.V1ObjectMeta(name="taken", labels={"team": "theirs"}),
        spec=client.V1ServiceSpec(selector={"app": "theirs"}, ports=[client.V1ServicePort(port=80)]),
    )
    core.create_namespaced_service(namespace, theirs)
    before = core.read_namespaced_service("taken", namespace)
    create_sd(api_client, namespace, tiny("taken"))
    operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"])
    with operator:
        status = wait_for(lambda: _status_if(api_client, namespace, "Failed"), 60, "phase Failed")
        assert status["reason"] == "NameConflict" and f"Service {namespace}/taken" in status["message"]
        after = core.read_namespaced_service("taken", namespace)
        assert after.metadata.resource_version == before.metadata.resource_version  # not even re-applied
        assert after.metadata.owner_references is None and after.spec.selector == {"app": "theirs"}
        assert apps.list_namespaced_deployment(namespace).items == []
        core.delete_namespaced_service("taken", namespace)
        wait_for(lambda: _status_if(api_client, namespace, "Baseline"), 60, "the rollout to begin")
    events = core.list_namespaced_event(namespace).items
    assert any(e.reason == "NameConflict" and e.type == "Warning" for e in events)


def _status_if(
    api_client: client.ApiClient, namespace: str, phase: str, name: str = "taken"
) -> dict[str, Any] | None:
    status: dict[str, Any] = get_sd(api_client, namespace, name).get("status", {})
    return status if status.get("phase") == phase else None


# The least of the Prometheus Operator's PodMonitor CRD the API server needs to serve the resource.
POD_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor", "listKind": "PodMonitorList"},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }],
    },
}  # fmt: skip


@pytest.mark.cluster_wide  # creates and deletes the PodMonitor CRD
def test_a_pod_monitor_without_the_prometheus_operator_is_a_failed_status_naming_the_field(
    lab: dict[str, Any],
) -> None:
    """podMonitor: true on a cluster without the PodMonitor CRD (the lab has none): phase Failed
    with the field and the fix, and no child; once the CRD is installed the rollout begins and
    creates its PodMonitor. (Before, applying the PodMonitor raised and status was never written.)"""
    api_client, namespace = lab["api_client"], lab["namespace"]
    extensions = client.ApiextensionsV1Api(api_client)
    body = tiny("monitored")
    body["spec"]["podAnnotations"] = {"specgate.dev/lab-engine": "sim"}
    body["spec"]["rollout"]["metrics"]["podMonitor"] = True
    body["spec"]["rollout"]["metrics"]["podMonitorLabels"] = {"release": "kube-prometheus-stack"}
    create_sd(api_client, namespace, body)
    operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"])
    try:
        with operator:
            status = wait_for(lambda: _status_if(api_client, namespace, "Failed", "monitored"), 60, "Failed")
            assert status["reason"] == "PodMonitorCRDMissing", status
            assert "spec.rollout.metrics.podMonitor" in status["message"], status["message"]
            assert client.AppsV1Api(api_client).list_namespaced_deployment(namespace).items == []
            extensions.create_custom_resource_definition(POD_MONITOR_CRD)
            wait_for(
                lambda: _status_if(api_client, namespace, "Baseline", "monitored"), 90, "the rollout to begin"
            )
            monitor = wait_for(lambda: _pod_monitor(api_client, namespace, "monitored"), 60, "its PodMonitor")
            assert monitor["metadata"]["ownerReferences"][0]["name"] == "monitored"
            assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # what selects it
    finally:
        with suppress(ApiException):
            extensions.delete_custom_resource_definition(POD_MONITOR_CRD["metadata"]["name"])


def _pod_monitor(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return cast(
            dict[str, Any],
            client.CustomObjectsApi(api_client).get_namespaced_custom_object(
                "monitoring.coreos.com", "v1", namespace, "podmonitors", name
            ),
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
