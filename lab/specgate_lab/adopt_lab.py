"""What a user runs before specgate, on the lab: a plain Deployment of the engine (the simulator) and
the Service that selects its pods, and the SpeculativeDeployment that adopts them (spec.workloadRef).
Shared by `make demo SCENARIO=adopt` and tests/cluster/test_adopt.py."""

from __future__ import annotations

from typing import Any

from specgate import api
from specgate.render import LABEL_ENGINE, PRE_STOP_SECONDS

NAME = "chat"  # the user's Deployment and Service
SELECTOR = {"app": NAME}
SERVED_MODEL = "tiny"
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def user_deployment(replicas: int, env: dict[str, str]) -> dict[str, Any]:
    """The engine as a Helm chart would run it: `vllm serve` with its flags as args, a readiness
    probe and a preStop sleep; the lab's bridge runs the simulator for pods with its annotation."""
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.32.0",
        "command": ["vllm", "serve"],
        "args": ["specgate/tiny-llama", "--served-model-name", SERVED_MODEL, "--max-model-len", "512"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2},
        # As long as specgate's rendered pods sleep (render.PRE_STOP_SECONDS): behind the lab's Traefik
        # under CI load, a 5 s sleep let 5 requests of 1,602 reach pods already gone (HTTP 502).
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": SELECTOR},
            "template": {
                "metadata": {
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
        "metadata": {"name": NAME},
        "spec": {"selector": SELECTOR, "ports": [port]},
    }


def adopting(name: str, replicas: int, rollout: dict[str, Any]) -> dict[str, Any]:
    """A SpeculativeDeployment that adopts the user's Deployment: its pods run the Deployment's
    template, the canary with an EAGLE-3 draft's flags appended."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {
            "workloadRef": {"name": NAME},
            "replicas": replicas,
            "speculative": {
                "method": "eagle3",
                "draftModel": "specgate/tiny-llama-eagle3",
                "numSpeculativeTokens": 3,
            },
            "rollout": rollout,
        },
    }
