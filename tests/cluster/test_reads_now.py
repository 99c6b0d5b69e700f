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

pytestmark = pytest.mark.cluster


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
