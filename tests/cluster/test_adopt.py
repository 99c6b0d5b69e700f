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
from tests.cluster.rollouts import KWOK_TOLERATION, Load, fast_rollout, lab_operator, report, service_urls
from tests.conftest import ROOT

from specgate import api
from specgate.render import LABEL_ENGINE
from specgate_lab.crds import install_crd

pytestmark = pytest.mark.cluster

REPLICAS = 2
SELECTOR = {"app": "chat"}


def user_deployment(env: dict[str, str]) -> dict[str, Any]:
    """What a user runs before specgate: a Deployment of the engine (the lab's simulator)."""
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.32.0",
        "command": ["vllm", "serve"],
        "args": ["specgate/tiny-llama", "--served-model-name", "tiny", "--max-model-len", "512"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2},
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": SELECTOR},
            "template": {
                "metadata": {
                    # the lab's bridge starts an engine for pods with the engine label
                    "labels": {**SELECTOR, LABEL_ENGINE: "vllm"},
                    "annotations": {"specgate.dev/lab-engine": "sim"},
                },
                "spec": {
                    "containers": [container],
                    "tolerations": [KWOK_TOLERATION],
                    "terminationGracePeriodSeconds": 30,
                },
            },
        },
    }


def user_service() -> dict[str, Any]:
    port = {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "chat"},
        "spec": {"selector": SELECTOR, "ports": [port]},
    }


def adopting() -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "adopt"},
        "spec": {
            "workloadRef": {"name": "chat"},
            "replicas": REPLICAS,
            "speculative": {
                "method": "eagle3",
                "draftModel": "specgate/tiny-llama-eagle3",
                "numSpeculativeTokens": 3,
            },
            "rollout": fast_rollout(),
        },
    }


def test_adopt_roll_out_promote_and_hand_back_with_no_request_lost(lab: dict[str, Any]) -> None:
    api_client, namespace = lab["api_client"], lab["namespace"]
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    install_crd(api_client)
    env = {"PYTHONPATH": f"{ROOT / 'lab'}:{ROOT / 'operator'}", "SPECGATE_SIM_ALPHA": "0.8"}
    with CapacityMonitor(api_client, namespace, floors={"chat": REPLICAS}) as monitor:
        apps.create_namespaced_deployment(namespace, user_deployment(env))
        core.create_namespaced_service(namespace, user_service())
        monitor.wait_for_floor("chat", timeout=180)
        template = apps.read_namespaced_deployment("chat", namespace).to_dict()["spec"]["template"]
        urls = service_urls(lab["bridge_url"], namespace, ["chat"])
        operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"])
        with operator, Load(urls, "tiny", concurrency=4, duration=900) as load:
            create_sd(api_client, namespace, adopting())
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
