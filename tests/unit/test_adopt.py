"""Rendering the tracks of an object that adopts a running vLLM Deployment (spec.workloadRef): the
baseline runs the Deployment's pod template with nothing lost, the canary the same with the
speculative flags appended, and what cannot be adopted is refused with the fix."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.unit.spec_cases import adopting

from specgate import adopt, api, render
from specgate.render import Owner, Track

OWNER = Owner(name="llama", namespace="ml", uid="u-1")
SERVICE_SELECTOR = {"app.kubernetes.io/name": "llama-chart", "app.kubernetes.io/instance": "prod"}
ARGS = ["meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--max-model-len", "8192"]


def helm_deployment() -> dict[str, Any]:
    """A vLLM Deployment as a Helm chart writes it: what a user runs before specgate."""
    probe = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama", "namespace": "ml", "labels": {"app.kubernetes.io/managed-by": "Helm"}},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": SERVICE_SELECTOR},
            "template": {
                "metadata": {
                    "creationTimestamp": None,
                    "labels": {**SERVICE_SELECTOR, "team": "inference"},
                    "annotations": {"prometheus.io/scrape": "true"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm/vllm-openai:v0.11.0",
                            "command": ["vllm", "serve"],
                            "args": list(ARGS),
                            "env": [
                                {
                                    "name": "HF_TOKEN",
                                    "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}},
                                }
                            ],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            "volumeMounts": [{"name": "weights", "mountPath": "/models"}],
                            "readinessProbe": probe,
                            "startupProbe": {**probe, "failureThreshold": 120},
                        },
                        {"name": "log-shipper", "image": "fluent-bit:3", "args": ["-c", "/etc/fb.conf"]},
                    ],
                    "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "llama-weights"}}],
                    "nodeSelector": {"gpu": "h100"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
                    "runtimeClassName": "nvidia",
                    "terminationGracePeriodSeconds": 120,
                },
            },
        },
    }


def spec_for(**ref: Any) -> api.SpeculativeDeploymentSpec:
    return api.parse_spec(adopting(workloadRef={"name": "llama", **ref}))


def render_track(track: Track, source: dict[str, Any] | None = None, **ref: Any) -> dict[str, Any]:
    spec = spec_for(**ref)
    assert spec.workload_ref is not None
    template = adopt.source_template(spec.workload_ref, source or helm_deployment())
    return adopt.deployment(spec, OWNER, track, 2, template)


def with_vllm(**container: Any) -> dict[str, Any]:
    deployment = helm_deployment()
    deployment["spec"]["template"]["spec"]["containers"][0].update(container)
    return deployment


def refusal(source: dict[str, Any], **ref: Any) -> str:
    spec = spec_for(**ref)
    assert spec.workload_ref is not None
    with pytest.raises(adopt.AdoptionError) as err:
        adopt.deployment(spec, OWNER, Track.BASELINE, 1, adopt.source_template(spec.workload_ref, source))
    assert str(err.value).startswith("spec.workloadRef: ")
    return err.value.message


def test_the_baseline_runs_the_deployments_pod_spec_with_nothing_lost() -> None:
    source = helm_deployment()
    baseline = render_track(Track.BASELINE, source)
    assert baseline["spec"]["template"]["spec"] == source["spec"]["template"]["spec"]
    assert source == helm_deployment(), "rendering must not change the referenced Deployment"
    assert baseline["metadata"]["name"] == "llama-baseline"
    assert baseline["spec"]["replicas"] == 2
    assert baseline["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_the_canary_appends_the_speculative_flags_to_the_vllm_containers_args_only() -> None:
    source = helm_deployment()
    canary = render_track(Track.CANARY, source)
    pod, original = canary["spec"]["template"]["spec"], source["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    assert vllm["args"][: len(ARGS)] == ARGS
    assert vllm["args"][len(ARGS)] == "--speculative-config"
    assert json.loads(vllm["args"][-1]) == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3,
    }
    assert len(vllm["args"]) == len(ARGS) + 2
    assert {**vllm, "args": ARGS} == original["containers"][0]
    assert pod["containers"][1] == original["containers"][1]  # the sidecar's -c is not vLLM's
    assert {k: v for k, v in pod.items() if k != "containers"} == {
        k: v for k, v in original.items() if k != "containers"
    }


@pytest.mark.parametrize("track", list(Track))
def test_both_tracks_pods_carry_the_labels_the_users_service_selects(track: Track) -> None:
    deployment = render_track(track)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert SERVICE_SELECTOR.items() <= labels.items()
    assert labels["team"] == "inference"
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "specgate.dev/deployment": "llama",
        "specgate.dev/track": track.value,
    }
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert adopt.serving_selector(OWNER).items() <= labels.items()
    assert labels["app.kubernetes.io/managed-by"] == "specgate"  # the operator watches its pods by it
    assert labels["specgate.dev/method"] == ("eagle3" if track is Track.CANARY else "none")


def test_the_pods_keep_the_templates_annotations_beside_specgates() -> None:
    metadata = render_track(Track.BASELINE)["spec"]["template"]["metadata"]
    assert metadata["annotations"]["prometheus.io/scrape"] == "true"
    assert "specgate.dev/template-hash" in metadata["annotations"]
    assert "creationTimestamp" not in metadata


def hashes(source: dict[str, Any], **ref: Any) -> tuple[str, str]:
    return (
        render_track(Track.BASELINE, source, **ref)["metadata"]["annotations"]["specgate.dev/template-hash"],
        render_track(Track.CANARY, source, **ref)["metadata"]["annotations"]["specgate.dev/template-hash"],
    )


def test_a_gitops_edit_of_the_referenced_template_is_a_new_rollout_the_hand_over_policy_is_not() -> None:
    before = hashes(helm_deployment())
    assert before[0] != before[1]
    edited = with_vllm(image="vllm/vllm-openai:v0.12.0")
    assert set(hashes(edited)).isdisjoint(before)
    assert hashes(helm_deployment(), scaleDown="never", onDelete="Leave") == before
    rescaled = helm_deployment()
    rescaled["spec"]["replicas"] = 9  # the Deployment's replicas are not what its pods run
    assert hashes(rescaled) == before


@pytest.mark.parametrize(
    "command",
    [
        {"command": ["sh", "-c", "vllm serve meta-llama/Llama-3.1-8B-Instruct"], "args": []},
        {"command": ["/bin/bash"], "args": ["-c", "exec vllm serve $MODEL"]},
    ],
)
def test_a_container_starting_vllm_through_a_shell_string_is_refused_with_the_fix(
    command: dict[str, Any],
) -> None:
    message = refusal(with_vllm(**command))
    assert "starts vLLM through a shell string (sh -c ...)" in message
    assert "start it as command [vllm, serve]" in message


@pytest.mark.parametrize(
    "command",
    [
        {"command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": ["--model", "m"]},
        {"args": ["--model", "m"]},  # the image's entrypoint (vllm/vllm-openai: vllm serve)
    ],
)
def test_a_container_starting_vllm_directly_is_adopted(command: dict[str, Any]) -> None:
    source = helm_deployment()
    source["spec"]["template"]["spec"]["containers"][0] = {
        k: v for k, v in source["spec"]["template"]["spec"]["containers"][0].items() if k != "command"
    } | command
    args = render_track(Track.CANARY, source)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--model", "m"] and args[2] == "--speculative-config"


@pytest.mark.parametrize(
    "flag", [["--speculative-config", "{}"], ['--speculative-config={"method":"ngram"}']]
)
def test_a_deployment_already_speculating_is_refused(flag: list[str]) -> None:
    message = refusal(with_vllm(args=[*ARGS, *flag]))
    assert "already runs speculative decoding" in message


def test_the_vllm_container_is_the_named_one_or_the_only_one() -> None:
    source = helm_deployment()
    source["spec"]["template"]["spec"]["containers"][0]["name"] = "server"
    message = refusal(source)
    assert message == (
        "Deployment llama has no container 'vllm' (it has server, log-shipper): set "
        "workloadRef.container to the one that runs vLLM"
    )
    canary = render_track(Track.CANARY, source, container="server")["spec"]["template"]["spec"]
    assert canary["containers"][0]["args"][-2] == "--speculative-config"
    del source["spec"]["template"]["spec"]["containers"][1]
    alone = render_track(Track.CANARY, source)["spec"]["template"]["spec"]
    assert alone["containers"][0]["args"][-2] == "--speculative-config"


@pytest.mark.parametrize("label", ["specgate.dev/track", "app.kubernetes.io/managed-by"])
def test_a_pod_label_specgate_sets_otherwise_is_refused_not_overwritten(label: str) -> None:
    source = helm_deployment()
    source["spec"]["template"]["metadata"]["labels"][label] = "Helm"
    message = refusal(source)
    assert message.startswith(f"the Deployment's pod template sets label {label}, which specgate sets")


def test_a_deployment_without_a_pod_template_is_refused() -> None:
    source = helm_deployment()
    del source["spec"]["template"]
    spec = spec_for()
    assert spec.workload_ref is not None
    with pytest.raises(adopt.AdoptionError, match="Deployment llama has no pod template with containers"):
        adopt.source_template(spec.workload_ref, source)


def test_an_adopted_track_deployment_rolls_as_a_rendered_one() -> None:
    """The same Deployment shape as render.deployment: its rolling update keeps the floor."""
    adopted = render_track(Track.BASELINE)
    assert adopted["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert render.ANNOTATION_RENDERED in adopted["metadata"]["annotations"]


def test_with_a_pod_monitor_the_vllm_port_must_be_named_http() -> None:
    spec = spec_for()
    assert spec.workload_ref is not None
    adopt.source_template(spec.workload_ref, helm_deployment(), pod_monitor=True)
    unnamed = with_vllm(ports=[{"containerPort": 8000}])
    adopt.source_template(spec.workload_ref, unnamed)  # no PodMonitor: Prometheus scrapes as it did
    with pytest.raises(adopt.AdoptionError, match="has no port named http, which the PodMonitor"):
        adopt.source_template(spec.workload_ref, unnamed, pod_monitor=True)
