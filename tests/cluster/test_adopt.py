"""spec.workloadRef on the lab: a plain simulator Deployment and its Service serve a request loop;
a SpeculativeDeployment adopts it (the hand-over), rolls out a canary and promotes; deleting it
hands serving back. 0 failed requests, the Deployment's template unchanged, the Ready pods behind
its Service never below the floor (CapacityMonitor, with the Service's fixed floor)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.operator_process import create_sd, get_sd, wait_for
from tests.cluster.rollouts import Load, fast_rollout, lab_operator, report, service_urls
from tests.conftest import ROOT

from specgate import api
from specgate_lab.adopt_lab import adopting, user_deployment, user_service
from specgate_lab.crds import install_crd

pytestmark = [pytest.mark.cluster, pytest.mark.beside_gateway]  # its line: hack/test.sh

REPLICAS = 2


def test_adopt_roll_out_promote_and_hand_back_with_no_request_lost(lab: dict[str, Any]) -> None:
    api_client, namespace = lab["api_client"], lab["namespace"]
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    install_crd(api_client)
    env = {"PYTHONPATH": f"{ROOT / 'lab'}:{ROOT / 'operator'}", "SPECGATE_SIM_ALPHA": "0.8"}
    with CapacityMonitor(api_client, namespace, floors={"chat": REPLICAS}) as monitor:
        apps.create_namespaced_deployment(namespace, user_deployment(REPLICAS, env))
        core.create_namespaced_service(namespace, user_service())
        monitor.wait_for_floor("chat", timeout=180)
        template = apps.read_namespaced_deployment("chat", namespace).to_dict()["spec"]["template"]
        urls = service_urls(lab["bridge_url"], namespace, ["chat"])
        operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"])
        with operator, Load(urls, "tiny", concurrency=4, duration=900) as load:
            create_sd(api_client, namespace, adopting("adopt", REPLICAS, fast_rollout()))
            wait_for(
                lambda: get_sd(api_client, namespace, "adopt").get("status", {}).get("phase")
                in ("Promoted", "RolledBack", "Failed"),
                600,
                "the rollout to settle",
            )
            obj = get_sd(api_client, namespace, "adopt")
            status = obj["status"]
            assert status["phase"] == "Promoted", (
                f"{status.get('reason')}: {status.get('message')}\n{operator.log_text()[-3000:]}"
            )
            assert obj["status"]["workload"]["handedOver"] is True
            assert apps.read_namespaced_deployment("chat", namespace).spec.replicas == 0
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
            after = apps.read_namespaced_deployment("chat", namespace)
            assert after.spec.replicas == REPLICAS and (after.status.ready_replicas or 0) >= REPLICAS
            time.sleep(10)  # requests on the Deployment's pods alone
        result = load.results[0]
        report(
            adopt_requests=result.requests, adopt_errors=result.errors, adopt_failures=dict(result.failures)
        )
        assert result.requests > 0 and result.errors == 0, dict(result.failures)
        assert apps.read_namespaced_deployment("chat", namespace).to_dict()["spec"]["template"] == template
