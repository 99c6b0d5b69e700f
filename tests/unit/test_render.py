"""Rendered children: snapshots of whole manifests plus the properties vLLM and Kubernetes need."""

from __future__ import annotations

import copy
import json
import os
from itertools import pairwise
from typing import Any

import pytest
import yaml
from tests.conftest import ROOT, load_sample

from specgate import api, render
from specgate.observation import TrackState
from specgate.render import Owner, Track

SNAPSHOTS = ROOT / "tests" / "unit" / "snapshots"
OWNER = Owner(name="llama-8b", namespace="inference", uid="0000-1111")


def children(sample: str) -> list[dict[str, Any]]:
    spec = api.parse_spec(load_sample(sample)["spec"])
    return [
        render.deployment(spec, OWNER, Track.BASELINE, 3),
        render.deployment(spec, OWNER, Track.CANARY, 1),
        render.service(OWNER),
        render.pod_monitor(OWNER, "15s", spec.rollout.metrics.pod_monitor_labels),
    ]


@pytest.mark.parametrize("sample", ["llama-3.1-8b-eagle3.yaml", "tiny-cpu.yaml"])
def test_snapshot(sample: str) -> None:
    rendered = yaml.safe_dump_all(children(sample), sort_keys=True)
    path = SNAPSHOTS / sample
    if os.environ.get("SPECGATE_UPDATE_SNAPSHOTS"):
        path.write_text(rendered)
    assert path.read_text() == rendered, "rendering changed: review, then SPECGATE_UPDATE_SNAPSHOTS=1"


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = manifest["spec"]["template"]["spec"]["containers"][0]
    return c


def test_canary_gets_the_speculative_config_and_baseline_does_not() -> None:
    baseline, canary, *_ = children("llama-3.1-8b-eagle3.yaml")
    assert "--speculative-config" not in container(baseline)["args"]
    args = container(canary)["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3,
    }
    assert "tensor_parallel_size" not in config


def test_user_strings_cannot_break_the_json() -> None:
    spec = api.parse_spec(
        {
            "model": {"name": "m"},
            "image": "i",
            "speculative": {"method": "draft_model", "draftModel": 'x", "method": "ngram'},
        }
    )
    args = render.vllm_args(spec, Track.CANARY)
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["method"] == "draft_model"
    assert config["model"] == 'x", "method": "ngram'


def test_ngram_and_extra_config() -> None:
    spec = api.SpeculativeSpec(
        method=api.Method.NGRAM,
        prompt_lookup_min=2,
        prompt_lookup_max=5,
        extra_config={"max_model_len": 4096},
    )
    assert render.speculative_config(spec) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
        "max_model_len": 4096,
    }


def test_gpu_probes_labels_and_owner() -> None:
    baseline, canary, service, _ = children("llama-3.1-8b-eagle3.yaml")
    c = container(canary)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert "tcpSocket" not in c[probe]
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1800
    labels = canary["spec"]["template"]["metadata"]["labels"]
    assert labels[render.LABEL_TRACK] == "canary"
    assert labels[render.LABEL_METHOD] == "eagle3"
    assert baseline["spec"]["template"]["metadata"]["labels"][render.LABEL_METHOD] == "none"
    assert set(service["spec"]["selector"].items()) <= set(labels.items())
    assert set(service["spec"]["selector"].items()) <= set(
        baseline["spec"]["template"]["metadata"]["labels"].items()
    )
    for child in (baseline, canary, service):
        ref = child["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["uid"], ref["controller"]) == ("SpeculativeDeployment", OWNER.uid, True)
    assert [d["metadata"]["name"] for d in (baseline, canary)] == ["llama-8b-baseline", "llama-8b-canary"]


def test_secret_env_stays_a_reference() -> None:
    _, canary, *_ = children("llama-3.1-8b-eagle3.yaml")
    env = {e["name"]: e for e in container(canary)["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
    }
    assert env["HF_HOME"]["value"] == "/root/.cache/huggingface"


def test_a_new_speculative_config_changes_only_the_canarys_template() -> None:
    """The baseline runs no speculation: a new draft length must not restart its serving pods."""
    raw = load_sample("tiny-cpu.yaml")["spec"]
    before = api.parse_spec(raw)
    after = api.parse_spec({**raw, "speculative": {**raw["speculative"], "numSpeculativeTokens": 2}})
    rescaled = api.parse_spec({**raw, "replicas": 7, "rollout": {"paused": True}})
    assert render.template_hash(before, Track.BASELINE) == render.template_hash(after, Track.BASELINE)
    assert render.template_hash(before) != render.template_hash(after)
    assert render.template_hash(before) == render.template_hash(rescaled)

    def pod_template(spec: api.SpeculativeDeploymentSpec, track: Track) -> Any:
        return render.deployment(spec, OWNER, track, 1)["spec"]["template"]

    assert pod_template(before, Track.BASELINE) == pod_template(after, Track.BASELINE)
    assert pod_template(before, Track.CANARY) != pod_template(after, Track.CANARY)


def test_an_old_objects_template_hash_survives_the_pod_template_field() -> None:
    """Golden values, computed before spec.podTemplate existed: an operator upgrade must not change
    what an existing object's pods are said to run, or every rollout would begin again."""
    spec = api.parse_spec(load_sample("tiny-cpu.yaml")["spec"])
    assert (render.template_hash(spec), render.template_hash(spec, Track.BASELINE)) == (
        "090f178898f8",
        "e7c92f0d5f7b",
    )


def test_the_pod_template_reaches_both_tracks_pods() -> None:
    """What GPU clusters need, on the baseline and the canary alike; specgate's own volumes stay."""
    raw = load_sample("tiny-cpu.yaml")["spec"]
    raw["podTemplate"] = {
        "runtimeClassName": "nvidia",
        "priorityClassName": "inference-high",
        "serviceAccountName": "vllm",
        "imagePullSecrets": ["registry"],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"specgate.dev/deployment": "llama-8b"}}}],
        "securityContext": {"fsGroup": 1000},
        "containerSecurityContext": {"allowPrivilegeEscalation": False},
        "shmSizeLimit": "16Gi",
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }  # fmt: skip
    spec = api.parse_spec(raw)
    for track in Track:
        pod = render.deployment(spec, OWNER, track, 1)["spec"]["template"]["spec"]
        assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "inference-high"
        assert pod["serviceAccountName"] == "vllm" and pod["imagePullSecrets"] == [{"name": "registry"}]
        assert pod["affinity"] == raw["podTemplate"]["affinity"]
        assert pod["topologySpreadConstraints"] == raw["podTemplate"]["topologySpreadConstraints"]
        assert pod["securityContext"] == {"fsGroup": 1000}
        assert pod["volumes"] == [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
            {"name": "scratch", "emptyDir": {}},
        ]
        (container,) = pod["containers"]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False}
        assert container["volumeMounts"] == [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "scratch", "mountPath": "/scratch"},
        ]


def test_a_k_schedule_per_batch_size_reaches_the_speculative_config() -> None:
    """vLLM's num_speculative_tokens_per_batch_size: [start, end, K] triples, sorted by start."""
    raw = load_sample("tiny-cpu.yaml")["spec"]
    raw["speculative"]["numSpeculativeTokens"] = 4
    raw["speculative"]["numSpeculativeTokensPerBatchSize"] = [
        {"minBatchSize": 9, "maxBatchSize": 256, "numSpeculativeTokens": 2},
        {"minBatchSize": 1, "maxBatchSize": 8, "numSpeculativeTokens": 4},
    ]
    spec = api.parse_spec(raw)
    config = render.speculative_config(spec.speculative)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 256, 2]]
    assert config["num_speculative_tokens"] == 4
    old = api.parse_spec(load_sample("tiny-cpu.yaml")["spec"])
    assert render.template_hash(spec) != render.template_hash(old)
    assert render.template_hash(spec, Track.BASELINE) == render.template_hash(old, Track.BASELINE)


def test_a_draft_models_own_tensor_parallel_size_reaches_vllm_under_its_name() -> None:
    """vLLM's --speculative-config reads a draft model's sharding as draft_tensor_parallel_size."""
    spec = api.SpeculativeSpec(method=api.Method.DRAFT_MODEL, draft_model="d", draft_tensor_parallel_size=1)
    assert render.speculative_config(spec) == {
        "method": "draft_model",
        "model": "d",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 1,
    }


def test_a_toleration_reaches_the_pods_in_kubernetes_spelling() -> None:
    """A NoExecute toleration's seconds are tolerationSeconds in a pod spec (Kubernetes ignores
    an unknown toleration_seconds, and the pod would be evicted at once)."""
    raw = load_sample("tiny-cpu.yaml")["spec"]
    toleration = {
        "key": "gpu-maintenance",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    spec = api.parse_spec({**raw, "tolerations": [toleration]})
    for track in Track:
        pod = render.deployment(spec, OWNER, track, 1)["spec"]["template"]["spec"]
        assert pod["tolerations"] == [toleration]


# --- the latency histograms' buckets (issue 58) ---

LADDER_SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "image": "vllm/vllm-openai:v0.32.0",
    "speculative": {"method": "eagle3", "draftModel": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
}


def rendered_ladder(args: list[str]) -> list[float] | None:
    """The inter_token_latency edges in a container's args, None without the flag."""
    if "--custom-histogram-buckets" not in args:
        return None
    edges: list[float] = json.loads(args[args.index("--custom-histogram-buckets") + 1])["inter_token_latency"]
    return edges


def spec_with(**fields: Any) -> api.SpeculativeDeploymentSpec:
    return api.parse_spec({**LADDER_SPEC, **fields})


def test_both_tracks_of_a_vllm_032_image_get_the_default_ladder() -> None:
    """5 ms x 1.08^k below 5 s: k up to floor(ln 1000 / ln 1.08) = floor(89.76) = 89, so 90 edges,
    the same on both tracks, each at 4 significant digits."""
    spec = spec_with()
    ladders = [rendered_ladder(container(render.deployment(spec, OWNER, t, 1))["args"]) for t in Track]
    assert ladders[0] == ladders[1]
    edges = ladders[0]
    assert edges is not None and len(edges) == 90
    assert edges[:3] == [0.005, 0.0054, 0.005832]
    assert edges[-1] == pytest.approx(0.005 * 1.08**89, rel=1e-3) and edges[-1] < 5
    assert all(b / a == pytest.approx(1.08, rel=2e-3) for a, b in pairwise(edges))


@pytest.mark.parametrize(
    ("fields", "rendered"),
    [
        ({"image": "vllm/vllm-openai:v0.11.0"}, False),  # Auto: the flag does not exist before 0.32
        ({"image": "registry.local/vllm:prod"}, False),  # Auto: the tag names no version
        ({"image": "vllm/vllm-openai:v0.32.0@sha256:" + "a" * 64}, True),
        ({"image": "vllm/vllm-openai:1.0.2"}, True),
        ({"image": "registry.local/vllm:prod", "latencyBuckets": {"policy": "Render"}}, True),
        ({"latencyBuckets": {"policy": "Engine"}}, False),
    ],
)
def test_the_policy_and_the_images_vllm_version_decide_whether_the_ladder_is_rendered(
    fields: dict[str, Any], rendered: bool
) -> None:
    args = container(render.deployment(spec_with(**fields), OWNER, Track.CANARY, 1))["args"]
    assert (rendered_ladder(args) is not None) == rendered


def test_the_users_own_buckets_are_kept_and_not_doubled() -> None:
    own = ["--custom-histogram-buckets", '{"inter_token_latency": [0.01, 0.02]}']
    args = container(render.deployment(spec_with(vllmArgs=own), OWNER, Track.BASELINE, 1))["args"]
    assert args.count("--custom-histogram-buckets") == 1
    assert rendered_ladder(args) == [0.01, 0.02]


def test_a_set_ladder_is_a_new_config() -> None:
    """Setting latencyBuckets changes what the pods run (a new rollout); unset, it keeps the hashes
    of objects made before the field (test_an_old_objects_template_hash_survives_the_pod_template_field)."""
    unset = spec_with()
    changed = render.template_hash(spec_with(latencyBuckets={"ratio": 1.05}), Track.BASELINE)
    assert changed != render.template_hash(unset, Track.BASELINE)


def test_pods_already_running_the_config_without_a_ladder_keep_running_without() -> None:
    """An operator upgrade must not restart serving engines for their buckets: a Deployment made by
    an earlier version (the same template hash, rendered without the flag) is rendered as it runs,
    so its digest does not change; a Deployment of another config, or none yet, gets the ladder."""
    spec = spec_with()
    for track in Track:
        template = copy.deepcopy(render.deployment(spec, OWNER, track, 1)["spec"]["template"])
        args = template["spec"]["containers"][0]["args"]
        flag = args.index("--custom-histogram-buckets")
        del args[flag : flag + 2]  # as a version before the ladder rendered it
        old = TrackState(
            exists=True, template_hash=render.template_hash(spec, track), rendered=render.digest(template)
        )
        kept = render.deployment(spec, OWNER, track, 1, old)
        assert rendered_ladder(container(kept)["args"]) is None
        assert kept["metadata"]["annotations"][render.ANNOTATION_RENDERED] == old.rendered
        other_config = TrackState(exists=True, template_hash="0" * 12, rendered=old.rendered)
        assert rendered_ladder(container(render.deployment(spec, OWNER, track, 1, other_config))["args"])
        assert rendered_ladder(container(render.deployment(spec, OWNER, track, 1, TrackState()))["args"])


def test_an_adopted_deployment_keeps_its_engines_buckets() -> None:
    spec = api.parse_spec(
        {"workloadRef": {"name": "llama"}, "speculative": LADDER_SPEC["speculative"], "latencyBuckets": {}}
    )
    assert render.wanted_buckets(spec) is None
