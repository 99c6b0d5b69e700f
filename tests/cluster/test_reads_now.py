"""kube.track_state_now on the lab's API server: a track as it is now, which a shrink is decided on
(the watches' cache can lag a pod's deletion by tens of seconds on a loaded API server). No operator
runs: the test renders the baseline Deployment itself, and the bridge runs its simulated engine."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client, config
from tests.cluster.operator_process import create_sd, wait_for
from tests.cluster.rollouts import sim_rollout

from specgate import api, kube, render
from specgate.render import Track
from specgate_lab.crds import install_crd

pytestmark = pytest.mark.cluster


@pytest.fixture(autouse=True)
def crd(lab: dict[str, Any]) -> None:
    """The objects' CRD, which a fresh lab does not serve until a test installs it."""
    install_crd(lab["api_client"])


def test_a_track_read_now_counts_a_deleted_pod_as_gone_at_once(lab: dict[str, Any]) -> None:
    api_client, namespace = lab["api_client"], lab["namespace"]
    config.load_kube_config(config_file=lab["kubeconfig"])  # type: ignore[no-untyped-call]
    body = sim_rollout("reads", {"SPECGATE_SIM_ALPHA": "0.8"})
    created = create_sd(api_client, namespace, body)
    owner = render.Owner("reads", namespace, created["metadata"]["uid"])
    spec = api.parse_spec(body["spec"])
    name, selector = (
        render.deployment_name(owner, Track.BASELINE),
        render.selector_labels(owner, Track.BASELINE),
    )
    assert kube.track_state_now(namespace, name, selector).exists is False

    kube.apply(render.deployment(spec, owner, Track.BASELINE, 1))
    wait_for(lambda: kube.track_state_now(namespace, name, selector).ready_replicas == 1, 300, "a Ready pod")
    state = kube.track_state_now(namespace, name, selector)
    assert (state.exists, state.replicas, state.serving) == (True, 1, 1)

    core = client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod(namespace, label_selector=f"{render.LABEL_DEPLOYMENT}=reads").items
    assert len(pods) == 1
    core.delete_namespaced_pod(pods[0].metadata.name, namespace)
    state = kube.track_state_now(namespace, name, selector)  # its replacement is not Ready yet
    assert (state.replicas, state.ready_replicas, state.serving) == (1, 0, 0)


def test_a_status_is_written_as_of_the_version_read_and_a_stale_copy_is_read_again(
    lab: dict[str, Any],
) -> None:
    """kube.write_status puts the resourceVersion read in its merge patch: the API server refuses a
    write decided on an older copy (409: False, nothing written). kube.current_object reads the object
    again where its copy is not at the version last written here, as a lagging watch's copy is not;
    a copy at that version is used as it is. A null in the patch deletes the field."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    config.load_kube_config(config_file=lab["kubeconfig"])  # type: ignore[no-untyped-call]
    created = create_sd(api_client, namespace, sim_rollout("versions", {"SPECGATE_SIM_ALPHA": "0.8"}))
    objects = client.CustomObjectsApi(api_client)

    def stored() -> dict[str, Any]:
        obj: dict[str, Any] = objects.get_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, "versions"
        )
        return obj

    first = {"phase": "Baseline", "message": "measuring", "observedGeneration": 1}
    assert kube.write_status(created["metadata"], first) is True
    now = stored()
    assert {k: now["status"].get(k) for k in first} == first

    # Decided on the copy from before that write: refused, and the status is the first one still.
    assert kube.write_status(created["metadata"], {"phase": "Canary", "message": "stale"}) is False
    assert stored()["status"]["phase"] == "Baseline"

    # The stale copy is read again; a copy at the version written is not (the same object back).
    fresh = kube.current_object(created)
    assert (fresh["status"]["phase"], fresh["metadata"]["resourceVersion"]) == (
        "Baseline",
        now["metadata"]["resourceVersion"],
    )
    assert kube.current_object(now) is now

    assert kube.write_status(now["metadata"], {"message": None}) is True
    assert "message" not in stored()["status"] and stored()["status"]["phase"] == "Baseline"
