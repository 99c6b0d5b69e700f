"""Plain GPU Deployments for the cluster tests that exercise the lab without the operator."""

from __future__ import annotations

from kubernetes import client

KWOK_TOLERATION = client.V1Toleration(key="kwok.x-k8s.io/node", operator="Exists", effect="NoSchedule")


def gpu_deployment(
    name: str,
    gpus: int,
    labels: dict[str, str] | None = None,
    args: list[str] | None = None,
    *,
    replicas: int = 1,
    annotations: dict[str, str] | None = None,
) -> client.V1Deployment:
    pod_labels = {"app": name, **(labels or {})}
    container = client.V1Container(
        name="vllm",
        image="vllm/vllm-openai:v0.11.0",
        command=["vllm", "serve"],
        args=args or ["specgate/tiny-llama", "--port", "8000"],
        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}),
    )
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels={"app": name}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=pod_labels, annotations=annotations),
                spec=client.V1PodSpec(containers=[container], tolerations=[KWOK_TOLERATION]),
            ),
        ),
    )
