"""spec.workloadRef on the lab: a plain simulator Deployment and its Service serve two request loops,
one through the Service and one through the lab's Traefik on the user's own HTTPRoute (its rule
sends to the Service, which selects specgate's pods too: specgate leaves the route alone). A
SpeculativeDeployment adopts the Deployment (the hand-over), rolls out a canary and promotes; the
drafts then go bad and an edit of the draft length rolls out a canary that rolls back; deleting the
object hands serving back. 0 failed requests in either loop, the Deployment's template unchanged, the Ready
pods behind its Service never below the floor (CapacityMonitor, with the Service's fixed floor).
Issue 59."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.gateway import GROUP, VERSION, gateway_lab, get
from tests.cluster.gateway_rollouts import RULE, user_route
from tests.cluster.operator_process import create_sd, get_sd, wait_for
from tests.cluster.rollouts import (
    Load,
    fast_rollout,
    lab_operator,
    patch_rollout,
    pin_to_node,
    report,
    service_urls,
)
from tests.conftest import ROOT

from specgate import api
from specgate_lab.adopt_lab import NAME, SERVED_MODEL, adopting, user_deployment, user_service
from specgate_lab.crds import install_crd

pytestmark = [pytest.mark.cluster, pytest.mark.gateway]

REPLICAS = 2


def phase_of(api_client: client.ApiClient, namespace: str) -> tuple[str | None, str | None]:
    status = get_sd(api_client, namespace, "adopt").get("status", {})
    return status.get("phase"), status.get("reason")


def test_adopt_roll_out_promote_roll_back_and_hand_back_with_no_request_lost(lab: dict[str, Any]) -> None:
    api_client, namespace = lab["api_client"], lab["namespace"]
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    install_crd(api_client)
    bad_draft = lab["log_dir"] / "bad-draft"  # while it exists, every speculative engine accepts 0.3
    env = {
        "PYTHONPATH": f"{ROOT / 'lab'}:{ROOT / 'operator'}",
        "SPECGATE_SIM_ALPHA": "0.8",
        "SPECGATE_SIM_SCRIPT": f"if:{bad_draft}:alpha=0.3",
    }
    deployment = user_deployment(REPLICAS, env)
    node = f"gw-{namespace}"
    pin_to_node({"spec": deployment["spec"]["template"]["spec"]}, node, namespace)
    traefik_log = lab["log_dir"] / "traefik.log"
    with (
        gateway_lab(api_client, lab["kubeconfig"], namespace, node, 2 * REPLICAS + 1, traefik_log) as port,
        CapacityMonitor(api_client, namespace, floors={NAME: REPLICAS}) as monitor,
    ):
        apps.create_namespaced_deployment(namespace, deployment)
        core.create_namespaced_service(namespace, user_service())
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "httproutes", user_route(RULE)
        )
        monitor.wait_for_floor(NAME, timeout=180)
        gateway = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: get(f"{gateway}/v1/models")[0] == 200, 120, "the user's route served through Traefik"
        )
        template = apps.read_namespaced_deployment(NAME, namespace).to_dict()["spec"]["template"]
        urls = [*service_urls(lab["bridge_url"], namespace, [NAME]), gateway]
        operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"])
        with operator, Load(urls, SERVED_MODEL, concurrency=4, duration=1200) as load:
            create_sd(api_client, namespace, adopting("adopt", REPLICAS, fast_rollout()))
            settled = ("Promoted", "RolledBack", "Failed")
            wait_for(lambda: phase_of(api_client, namespace)[0] in settled, 600, "the rollout to settle")
            obj = get_sd(api_client, namespace, "adopt")
            status = obj["status"]
            assert status["phase"] == "Promoted", (
                f"{status.get('reason')}: {status.get('message')}\n{operator.log_text()[-3000:]}"
            )
            assert obj["status"]["workload"]["handedOver"] is True
            assert apps.read_namespaced_deployment(NAME, namespace).spec.replicas == 0
            bad_draft.touch()
            patch_rollout(api_client, namespace, "adopt", {"speculative": {"numSpeculativeTokens": 2}})
            wait_for(
                lambda: phase_of(api_client, namespace)[0] == "RolledBack", 600, "the K=2 canary's rollback"
            )
            rolled_back = phase_of(api_client, namespace)
            client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, "adopt"
            )
            wait_for(
                lambda: not [
                    o
                    for o in client.CustomObjectsApi(api_client).list_namespaced_custom_object(
                        api.GROUP, api.VERSION, namespace, api.PLURAL
                    )["items"]
                ],
                300,
                "the object to go",
            )
            after = apps.read_namespaced_deployment(NAME, namespace)
            assert after.spec.replicas == REPLICAS and (after.status.ready_replicas or 0) >= REPLICAS
            time.sleep(10)  # requests on the Deployment's pods alone
        through_service, through_gateway = load.results
        report(
            adopt_rolled_back=rolled_back,
            adopt_requests=through_service.requests,
            adopt_errors=through_service.errors,
            adopt_failures=dict(through_service.failures),
            adopt_gateway_requests=through_gateway.requests,
            adopt_gateway_errors=through_gateway.errors,
            adopt_gateway_failures=dict(through_gateway.failures),
        )
        assert rolled_back == ("RolledBack", "AcceptanceBelowGate"), rolled_back
        for result in load.results:
            assert result.requests > 0 and result.errors == 0, dict(result.failures)
        assert apps.read_namespaced_deployment(NAME, namespace).to_dict()["spec"]["template"] == template
