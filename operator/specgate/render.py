"""Manifests of a SpeculativeDeployment's children (pure: dicts in, dicts out).

Names are stable (`<name>-baseline`, `<name>-canary`, Service `<name>`) so that reconciling again
finds the same objects, and every child carries an ownerReference so that deleting the object lets
the garbage collector remove them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from specgate import api, benchmark
from specgate.observation import RouteState, TrackState
from specgate.traffic import Parent, Weights, pools_hold, route_hold, shares

Manifest = dict[str, Any]

HTTP_PORT = 8000
LABEL_DEPLOYMENT = "specgate.dev/deployment"
LABEL_TRACK = "specgate.dev/track"
LABEL_METHOD = "specgate.dev/method"
LABEL_ENGINE = "specgate.dev/engine"
LABEL_BENCHMARK = "specgate.dev/benchmark"  # on benchmark pods: the track they measure
# On every child and its pods: the operator watches exactly the objects with this label.
MANAGED_BY = {"app.kubernetes.io/managed-by": "specgate"}
ANNOTATION_TEMPLATE = "specgate.dev/template-hash"  # on Deployments and pods: what they run
# On Deployments: the digest of the pod template this operator version rendered. A new version that
# renders the same spec differently rolls the pods of one track at a time (see capacity.may_roll).
ANNOTATION_RENDERED = "specgate.dev/rendered-pod-template"
VLLM_CONTAINER = "vllm"
DRIVER_SOURCE = (Path(__file__).parent / "bench_driver.py").read_text()
MAX_NAME = 63  # a Job's name becomes its pods' job-name label value
BUCKETS_FLAG = "--custom-histogram-buckets"
# vLLM 0.32's family for the ITL and the per-token latency histograms: one flag sets both.
BUCKETS_FAMILY = "inter_token_latency"
BUCKETS_SINCE = (0, 32)  # the first vLLM with BUCKETS_FLAG


class Track(StrEnum):
    BASELINE = "baseline"
    CANARY = "canary"


@dataclass(frozen=True)
class Owner:
    """The SpeculativeDeployment a child belongs to."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def template_hash(spec: api.SpeculativeDeploymentSpec, track: Track = Track.CANARY) -> str:
    """What the track's pods run: the spec without replicas and rollout (and, for the baseline,
    without speculative). Hashed from the spec, not from the rendered manifest, so that a new
    operator version rendering differently restarts no rollout."""
    unused = {"replicas", "rollout"} | ({"speculative"} if track is Track.BASELINE else set())
    if spec.pod_template is None:  # added later: absent, it keeps the hashes of objects made before
        unused.add("pod_template")
    if spec.workload_ref is None:  # the same
        unused.add("workload_ref")
    if spec.latency_buckets is None:  # the same
        unused.add("latency_buckets")
    pods = spec.model_dump(mode="json", by_alias=True, exclude=unused)
    if spec.workload_ref is not None:  # what the pods run: the template, not the hand-over's policy
        ref = spec.workload_ref
        pods["workloadRef"] = {"name": ref.name, "container": ref.container, "template": ref.template_digest}
    if "speculative" in pods:
        # Fields added later are left out while unset (Explicit is what unset means), as
        # pod_template is; a derived schedule is not what the user asked for, so it never makes a
        # new rollout by itself.
        auto = spec.speculative.num_speculative_tokens_per_batch_size_policy == api.PerBatchSizePolicy.AUTO
        if spec.speculative.num_speculative_tokens_per_batch_size is None or auto:
            del pods["speculative"]["numSpeculativeTokensPerBatchSize"]
        if not auto:
            del pods["speculative"]["numSpeculativeTokensPerBatchSizePolicy"]
    return digest(pods)


def deployment_name(owner: Owner, track: Track) -> str:
    return f"{owner.name}-{track.value}"


def speculative_config(spec: api.SpeculativeSpec) -> dict[str, Any]:
    """The --speculative-config object vLLM accepts (never tensor_parallel_size inside it)."""
    config: dict[str, Any] = {
        "method": spec.method.value,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    optional = {
        "model": spec.draft_model,
        "draft_tensor_parallel_size": spec.draft_tensor_parallel_size,
        "prompt_lookup_min": spec.prompt_lookup_min,
        "prompt_lookup_max": spec.prompt_lookup_max,
    }
    config.update({k: v for k, v in optional.items() if v is not None})
    if spec.num_speculative_tokens_per_batch_size:
        ranges = sorted(spec.num_speculative_tokens_per_batch_size, key=lambda r: r.min_batch_size)
        config["num_speculative_tokens_per_batch_size"] = [
            [r.min_batch_size, r.max_batch_size, r.num_speculative_tokens] for r in ranges
        ]
    return {**spec.extra_config, **config}


def latency_ladder(buckets: api.LatencyBuckets) -> tuple[float, ...]:
    """The geometric ladder of edges (seconds, 4 significant digits) from `lowest` up to `highest`."""
    lowest, highest = api.parse_duration(buckets.lowest), api.parse_duration(buckets.highest)
    count = math.floor(math.log(highest / lowest) / math.log(buckets.ratio) + 1e-9)
    return tuple(float(f"{lowest * buckets.ratio**k:.4g}") for k in range(count + 1))


def vllm_version(image: str) -> tuple[int, int] | None:
    """(major, minor) of the vLLM an image's tag names (vllm/vllm-openai:v0.32.0), None if none."""
    tag = image.split("@")[0].rsplit("/", 1)[-1]
    found = re.search(r":v?(\d+)\.(\d+)", tag)
    return (int(found[1]), int(found[2])) if found else None


def wanted_buckets(spec: api.SpeculativeDeploymentSpec) -> tuple[float, ...] | None:
    """The ladder spec.latencyBuckets asks specgate to render on new pods, None where it renders none:
    its policy Engine, an adopted Deployment's engine (it keeps its buckets), vllmArgs setting the
    flag itself, or (policy Auto) an image whose tag names no vLLM 0.32 or later."""
    buckets = spec.latency_buckets or api.LatencyBuckets()
    if spec.workload_ref is not None or buckets.policy == api.BucketsPolicy.ENGINE:
        return None
    if any(arg.split("=")[0] == BUCKETS_FLAG for arg in spec.vllm_args):
        return None
    if buckets.policy == api.BucketsPolicy.AUTO:
        version = vllm_version(spec.vllm_image)
        if version is None or version < BUCKETS_SINCE:
            return None
    return latency_ladder(buckets)


def rendered_buckets(
    spec: api.SpeculativeDeploymentSpec, owner: Owner, track: Track, running: TrackState | None
) -> tuple[float, ...] | None:
    """The ladder the track's pods get: wanted_buckets, except that a Deployment already running
    this config without one keeps running without (`running`: the track's Deployment as observed),
    so that no operator upgrade restarts serving engines for their buckets; its next config gets it."""
    wanted = wanted_buckets(spec)
    if wanted is None or running is None or not running.exists:
        return wanted
    if running.template_hash == template_hash(spec, track):
        plain = _template(spec, owner, track, None)
        if running.rendered == digest(plain):
            return None
    return wanted


def vllm_args(
    spec: api.SpeculativeDeploymentSpec, track: Track, buckets: tuple[float, ...] | None = None
) -> list[str]:
    args = [
        spec.target.name,
        "--host",
        "0.0.0.0",
        "--port",
        str(HTTP_PORT),
        "--served-model-name",
        spec.served_name,
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        *spec.vllm_args,
    ]
    if buckets is not None:
        args += [BUCKETS_FLAG, json.dumps({BUCKETS_FAMILY: list(buckets)})]
    if track is Track.CANARY:
        # Serialised, never concatenated: user strings cannot break out of the JSON argument.
        args += ["--speculative-config", json.dumps(speculative_config(spec.speculative), sort_keys=True)]
    return args


def selector_labels(owner: Owner, track: Track) -> dict[str, str]:
    return {LABEL_DEPLOYMENT: owner.name, LABEL_TRACK: track.value}


def pod_labels(spec: api.SpeculativeDeploymentSpec, owner: Owner, track: Track) -> dict[str, str]:
    method = spec.speculative.method.value if track is Track.CANARY else "none"
    return {
        **spec.pod_labels,
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": owner.name,
        **MANAGED_BY,
        LABEL_ENGINE: "vllm",
        LABEL_METHOD: method,
        **selector_labels(owner, track),
    }


def _env(spec: api.SpeculativeDeploymentSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [e.model_dump(by_alias=True, exclude_none=True) for e in spec.env]
    if spec.model_cache is not None:
        env.append({"name": "HF_HOME", "value": spec.model_cache.mount_path})
    return env


def _probe(period: int, failures: int) -> dict[str, Any]:
    # httpGet on /health: the socket opens before the engine has loaded, so a TCP probe lies.
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


def _resources(spec: api.SpeculativeDeploymentSpec) -> dict[str, Any]:
    res = spec.resources
    limits: dict[str, str] = {res.gpu_resource_name: str(res.gpus)}
    requests: dict[str, str] = {res.gpu_resource_name: str(res.gpus)}
    if res.cpu:
        requests["cpu"] = res.cpu
    if res.memory:
        requests["memory"] = limits["memory"] = res.memory
    return {"limits": limits, "requests": requests}


def _volumes(spec: api.SpeculativeDeploymentSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # vLLM's tensor-parallel workers exchange data through /dev/shm, which defaults to 64 MiB.
    extra = spec.pod_template or api.PodTemplate()
    shm: dict[str, Any] = {"medium": "Memory"} | (
        {"sizeLimit": extra.shm_size_limit} if extra.shm_size_limit else {}
    )
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": shm}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if spec.model_cache is not None:
        volumes.append(
            {"name": "model-cache", "persistentVolumeClaim": {"claimName": spec.model_cache.claim_name}}
        )
        mounts.append({"name": "model-cache", "mountPath": spec.model_cache.mount_path})
    return volumes + extra.volumes, mounts + extra.volume_mounts


def _container_security(extra: api.PodTemplate | None) -> dict[str, Any]:
    context = extra.container_security_context if extra else None
    return {"securityContext": context} if context else {}


def _pod_template_fields(extra: api.PodTemplate | None) -> dict[str, Any]:
    """spec.podTemplate's pod-level fields, those set only."""
    if extra is None:
        return {}
    fields: dict[str, Any] = {
        "runtimeClassName": extra.runtime_class_name,
        "priorityClassName": extra.priority_class_name,
        "serviceAccountName": extra.service_account_name,
        "imagePullSecrets": [{"name": name} for name in extra.image_pull_secrets],
        "affinity": extra.affinity,
        "topologySpreadConstraints": extra.topology_spread_constraints,
        "securityContext": extra.security_context,
    }
    return {key: value for key, value in fields.items() if value}


# kube-proxy drops a deleted pod's endpoint within a second or two, a gateway (Traefik, Envoy) once
# its controller has rebuilt and pushed its configuration: seconds, more on a loaded node. At 5 s
# a gateway under a CI run's load still sent 1-2 requests to pods that had stopped (HTTP 502).
PRE_STOP_SECONDS = 15


def _container(
    spec: api.SpeculativeDeploymentSpec, track: Track, buckets: tuple[float, ...] | None
) -> dict[str, Any]:
    _, mounts = _volumes(spec)
    return {
        "name": VLLM_CONTAINER,
        "image": spec.vllm_image,
        "command": ["vllm", "serve"],
        "args": vllm_args(spec, track, buckets),
        "env": _env(spec),
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": _resources(spec),
        "volumeMounts": mounts,
        **_container_security(spec.pod_template),
        # Loading weights can take many minutes: a long startupProbe keeps liveness from killing it.
        "startupProbe": _probe(period=10, failures=180),
        "readinessProbe": _probe(period=5, failures=3),
        "livenessProbe": _probe(period=10, failures=6),
        # A deleted pod leaves its Service's and its route's endpoints only once kube-proxy and the
        # gateway have seen it go: until then requests still arrive, so vLLM stops accepting them
        # (SIGTERM) only after this pause, then finishes those in flight within the grace period.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
    }


def _metadata(owner: Owner, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels,
        "ownerReferences": [owner.reference()],
    }


def deployment(
    spec: api.SpeculativeDeploymentSpec,
    owner: Owner,
    track: Track,
    replicas: int,
    running: TrackState | None = None,
) -> Manifest:
    """The track's Deployment; `running`: its Deployment as observed (rendered_buckets)."""
    template = _template(spec, owner, track, rendered_buckets(spec, owner, track, running))
    meta = template["metadata"]
    annotations = {ANNOTATION_TEMPLATE: meta["annotations"][ANNOTATION_TEMPLATE]}
    return track_deployment(spec, owner, track, replicas, template, dict(meta["labels"]), annotations)


def _template(
    spec: api.SpeculativeDeploymentSpec, owner: Owner, track: Track, buckets: tuple[float, ...] | None
) -> dict[str, Any]:
    labels = pod_labels(spec, owner, track)
    annotations = {ANNOTATION_TEMPLATE: template_hash(spec, track)}
    volumes, _ = _volumes(spec)
    pod_spec: dict[str, Any] = {
        "containers": [_container(spec, track, buckets)],
        "volumes": volumes,
        "nodeSelector": dict(spec.node_selector),
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations],
        "terminationGracePeriodSeconds": 60,
        **_pod_template_fields(spec.pod_template),
    }
    return {
        "metadata": {"labels": labels, "annotations": {**spec.pod_annotations, **annotations}},
        "spec": pod_spec,
    }


def track_deployment(
    spec: api.SpeculativeDeploymentSpec,
    owner: Owner,
    track: Track,
    replicas: int,
    template: dict[str, Any],
    labels: dict[str, str],
    annotations: dict[str, str],
) -> Manifest:
    """Deployment <name>-<track> of a pod template (rendered here, or an adopted one: adopt.py)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            **_metadata(owner, deployment_name(owner, track), labels),
            "annotations": {**annotations, ANNOTATION_RENDERED: digest(template)},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(owner, track)},
            # A change of the template within one track keeps capacity as the rollout does.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": spec.rollout.max_surge,
                    "maxUnavailable": spec.rollout.max_unavailable,
                },
            },
            "template": template,
        },
    }


def with_max_unavailable(manifest: Manifest, max_unavailable: int) -> Manifest:
    """The Deployment `manifest` whose rolling update takes at most `max_unavailable` Ready pods:
    fewer than the spec's where the other track cannot cover them (rollout.rendered_unavailable)."""
    spec = manifest["spec"]
    rolling = {**spec["strategy"]["rollingUpdate"], "maxUnavailable": max_unavailable}
    return {**manifest, "spec": {**spec, "strategy": {**spec["strategy"], "rollingUpdate": rolling}}}


def digest(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:12]


def serving_selector(owner: Owner) -> dict[str, str]:
    """Both tracks' serving pods (benchmark Job pods aside): the Service's and the scale subresource's."""
    return {LABEL_DEPLOYMENT: owner.name, "app.kubernetes.io/name": "vllm"}


def service(owner: Owner, track: Track | None = None) -> Manifest:
    """Service <name> over both tracks (traffic follows the replica ratio of baseline and canary),
    or <name>-<track> over one track's pods, which a benchmark Job measures alone."""
    selector = serving_selector(owner)
    if track is not None:
        selector[LABEL_TRACK] = track.value
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, service_name(owner, track), dict(MANAGED_BY)),
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def service_name(owner: Owner, track: Track | None = None) -> str:
    return owner.name if track is None else deployment_name(owner, track)


def benchmark_job_name(owner: Owner, track: Track, generation: int) -> str:
    """Named for the generation, so that a new rollout never reads an older one's result."""
    suffix = f"-bench-{track.value}-{generation}"
    return owner.name[: MAX_NAME - len(suffix)].rstrip("-.") + suffix


def benchmark_job(
    spec: api.SpeculativeDeploymentSpec, owner: Owner, track: Track, generation: int
) -> Manifest:
    """A Job running bench_driver (`vllm bench serve` per concurrency point) against Service
    <name>-<track>. It requests no GPU and runs once: a failed benchmark is a verdict, not a retry."""
    bench = spec.rollout.benchmark
    url = f"http://{service_name(owner, track)}.{owner.namespace}.svc:{HTTP_PORT}"
    env = [
        *_env(spec),
        {"name": "SPECGATE_BENCH_CONFIG", "value": json.dumps(benchmark.driver_config(spec, url))},
    ]
    volumes, mounts = _volumes(spec)
    volumes, mounts = volumes[1:], mounts[1:]  # no /dev/shm: the client runs no tensor-parallel workers
    if bench.dataset_from is not None:
        volumes.append({"name": "datasets", "configMap": {"name": bench.dataset_from.config_map}})
        mounts.append({"name": "datasets", "mountPath": "/datasets", "readOnly": True})
    labels = {
        **MANAGED_BY,
        LABEL_DEPLOYMENT: owner.name,
        LABEL_BENCHMARK: track.value,
    }
    container = {
        "name": "benchmark",
        "image": bench.image or spec.vllm_image,
        "command": ["python3", "-c", DRIVER_SOURCE],
        "env": env,
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
        # The result is the termination message; a crash leaves the log's tail there instead.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(owner, benchmark_job_name(owner, track, generation), dict(labels)),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": max(int(api.parse_duration(bench.timeout)), 1),
            "ttlSecondsAfterFinished": 24 * 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": volumes,
                    **_benchmark_pod_fields(spec),
                },
            },
        },
    }


def _benchmark_pod_fields(spec: api.SpeculativeDeploymentSpec) -> dict[str, Any]:
    """Where the benchmark pod runs and what it pulls with: those of the vLLM pods it measures.

    Its image is spec.image (unless benchmark.image): the CUDA vLLM image, large, often linux/amd64
    only and from a private registry, which the vLLM pods' nodes are known to pull (and to have
    cached) and to reach the model cache from. So the pod takes the same nodeSelector, tolerations
    (taints keep it off a tainted GPU pool otherwise) and node affinity, and pulls as the vLLM pods
    do: imagePullSecrets, serviceAccountName (its pull secrets, or a workload identity for the
    model bucket). Not copied: runtimeClassName and GPU resources (the client needs no GPU; the
    NVIDIA runtime would expose the node's GPUs to it unallocated), pod (anti-)affinity and
    topologySpreadConstraints (terms written for the vLLM pods: one replica per node by
    specgate.dev/deployment, which this pod carries too, would keep it off every GPU node),
    priorityClassName (a one-off client should not preempt)."""
    extra = spec.pod_template or api.PodTemplate()
    node_affinity = (extra.affinity or {}).get("nodeAffinity")
    fields: dict[str, Any] = {
        "affinity": {"nodeAffinity": node_affinity} if node_affinity else None,
        "serviceAccountName": extra.service_account_name,
        "imagePullSecrets": [{"name": name} for name in extra.image_pull_secrets],
    }
    return {
        "nodeSelector": dict(spec.node_selector),
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations],
        **{key: value for key, value in fields.items() if value},
    }


def pod_monitor(owner: Owner, scrape_interval: str, labels: dict[str, str] | None = None) -> Manifest:
    """Prometheus Operator PodMonitor producing the target labels the gates query by, scraping at
    the interval the operator sizes its windows by; `labels` let a Prometheus select it."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _metadata(owner, owner.name, {**(labels or {}), **MANAGED_BY}),
        "spec": {
            "selector": {"matchLabels": {LABEL_DEPLOYMENT: owner.name}},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": scrape_interval}],
            "podTargetLabels": [LABEL_DEPLOYMENT, LABEL_TRACK, LABEL_METHOD],
        },
    }


GATEWAY_API_VERSION = "gateway.networking.k8s.io/v1"
INFERENCE_GROUP = "inference.networking.k8s.io"  # Gateway API Inference Extension
INFERENCE_POOL_VERSION = f"{INFERENCE_GROUP}/v1"


def inference_pool(owner: Owner, track: Track, picker: api.EndpointPicker) -> Manifest:
    """InferencePool <name>-<track> (backend InferencePool): the track's serving pods on the
    engine's port, and the endpoint picker the user runs for it."""
    return {
        "apiVersion": INFERENCE_POOL_VERSION,
        "kind": "InferencePool",
        "metadata": _metadata(owner, deployment_name(owner, track), dict(MANAGED_BY)),
        "spec": {
            "selector": {"matchLabels": {**serving_selector(owner), LABEL_TRACK: track.value}},
            "targetPorts": [{"number": HTTP_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": picker.name,
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode.value,
            },
        },
    }


def inference_pools(owner: Owner, traffic: api.Traffic) -> list[Manifest]:
    """Both tracks' InferencePools, baseline first, where the route's backends are pools; else none."""
    return [inference_pool(owner, track, picker) for track, picker in pool_pickers(traffic).items()]


def pool_pickers(traffic: api.Traffic) -> dict[Track, api.EndpointPicker]:
    """Each track's endpoint picker, baseline first, where the route's backends are pools; else none."""
    pickers = traffic.inference_pool.endpoint_picker if traffic.inference_pool is not None else None
    if traffic.backend != api.Backend.INFERENCE_POOL or pickers is None:
        return {}
    by_track = {Track.BASELINE: pickers.baseline, Track.CANARY: pickers.canary}
    return {track: picker for track, picker in by_track.items() if picker is not None}


def missing_picker(owner: Owner, track: Track, picker: api.EndpointPicker) -> str:
    """Why a track's pool cannot resolve its endpoint picker: the Service it names does not exist."""
    return (
        f"its endpointPickerRef names Service {picker.name}, which does not exist in namespace "
        f"{owner.namespace}: deploy the endpoint picker of InferencePool {deployment_name(owner, track)} "
        f"there, or fix spec.rollout.traffic.inferencePool.endpointPicker.{track.value}.name"
    )


def shared_picker(
    pool: Mapping[str, Any] | None, name: str, owner: Owner, traffic: api.Traffic
) -> str | None:
    """Why the spec's pickers cannot take over from the user's InferencePool `name` (as read; None:
    they can): an endpoint picker picks from the one pool it runs for, so a track's pool naming the
    user's pool's picker would be answered with the endpoints of the user's pool, not its own."""
    ref = (pool or {}).get("spec", {}).get("endpointPickerRef") or {}
    if ref.get("group") not in (None, "") or ref.get("kind", "Service") != "Service":
        return None
    for track, picker in pool_pickers(traffic).items():
        if picker.name == ref.get("name"):
            return (
                f"spec.rollout.traffic.inferencePool.endpointPicker.{track.value}: Service {picker.name} is "
                f"the endpoint picker of your InferencePool {name}, which the rule routes to now; a picker "
                f"picks from the one pool it runs for, so InferencePool {deployment_name(owner, track)} needs "
                "its own: deploy a picker for that pool and name its Service here"
            )
    return None


def spec_differs(found: Mapping[str, Any] | None, manifest: Manifest) -> bool:
    """Whether the object as read lacks what `manifest`'s spec sets (absent, or a field missing or
    with another value; fields the API server defaults are not in the manifest: not compared)."""
    return found is None or not _within(manifest["spec"], found.get("spec") or {})


def track_ref(owner: Owner, track: Track, backend: api.Backend) -> dict[str, Any]:
    """A backendRef to the track's Service or InferencePool, without its weight."""
    if backend is api.Backend.INFERENCE_POOL:
        return {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": deployment_name(owner, track)}
    return {"kind": "Service", "name": service_name(owner, track), "port": HTTP_PORT}


def backend_refs(
    owner: Owner, weights: Weights, backend: api.Backend = api.Backend.SERVICE
) -> list[dict[str, Any]]:
    """The tracks' Services (or InferencePools), weighted: what a rule of the route sends traffic to."""
    return [
        {**track_ref(owner, track, backend), "weight": weight}
        for track, weight in zip((Track.BASELINE, Track.CANARY), weights.written, strict=True)
    ]


def http_route(
    owner: Owner,
    template: api.HTTPRouteTemplate,
    weights: Weights,
    backend: api.Backend = api.Backend.SERVICE,
) -> Manifest:
    """HTTPRoute <name> (traffic.httpRoute): one rule, the tracks' Services (or pools) as its backends."""
    rule: dict[str, Any] = {"backendRefs": backend_refs(owner, weights, backend)}
    if template.matches:
        rule["matches"] = template.matches
    if template.timeouts is not None:
        rule["timeouts"] = template.timeouts.model_dump(by_alias=True, exclude_none=True)
    spec: dict[str, Any] = {
        "parentRefs": [p.model_dump(by_alias=True, exclude_none=True) for p in template.parent_refs],
        "rules": [rule],
    }
    if template.hostnames:
        spec["hostnames"] = template.hostnames
    return {
        "apiVersion": GATEWAY_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": _metadata(owner, owner.name, dict(MANAGED_BY)),
        "spec": spec,
    }


def route_differs(route: Mapping[str, Any] | None, manifest: Manifest) -> bool:
    """Whether the HTTPRoute as read lacks what `manifest` sets: absent, or a field of its spec
    missing or with another value, a list of another length (a rule added by hand). Fields the API
    server defaults (a backendRef's group, a match's path type) are not in the manifest: not compared."""
    return route is None or not _within(_split(manifest["spec"]), _split(route.get("spec") or {}))


def _split(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with each rule's backendRef weights as percent of the rule's: Gateway API weights are
    relative, so 3/1 and 75/25 split the traffic alike (a backend without a weight has 1)."""
    copied = copy.deepcopy(dict(spec))
    for rule in copied.get("rules") or []:
        refs = rule.get("backendRefs") or []
        total = sum(int(ref.get("weight", 1)) for ref in refs)
        for ref in refs:
            ref["weight"] = round(100 * int(ref.get("weight", 1)) / total) if total else 0
    return copied


def _within(want: object, have: object) -> bool:
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(k in have and _within(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(_within(w, h) for w, h in zip(want, have, strict=True))
        )
    return want == have


def rule_index(route: Mapping[str, Any], existing: api.ExistingRoute) -> int:
    """Position of the managed rule in the user's route; LookupError naming the field to fix."""
    rules = route.get("spec", {}).get("rules") or []
    if existing.rule_name is not None:
        names = [rule.get("name") for rule in rules]
        if existing.rule_name in names:
            return names.index(existing.rule_name)
        raise LookupError(
            f"spec.rollout.traffic.existingRoute.ruleName: HTTPRoute {existing.name} has no rule named "
            f"{existing.rule_name!r} (its rules: {names}): name the rule in the route or fix ruleName"
        )
    assert existing.rule_index is not None  # api.RULES: exactly one of ruleName and ruleIndex
    if existing.rule_index < len(rules):
        return existing.rule_index
    raise LookupError(
        f"spec.rollout.traffic.existingRoute.ruleIndex: HTTPRoute {existing.name} has {len(rules)} "
        f"rules, so no rule {existing.rule_index}: give the position of a rule, from 0"
    )


def rule_patch(
    route: Mapping[str, Any],
    existing: api.ExistingRoute,
    owner: Owner,
    weights: Weights,
    backend: api.Backend = api.Backend.SERVICE,
) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) that sets the managed rule's backendRefs and nothing else.

    Not server-side apply: the HTTPRoute CRD declares spec.rules an atomic list, so an apply of one
    rule's backendRefs would take (and need) the whole list. The patch's test ops make the API
    server refuse it, instead of changing another rule, if the rules moved since `route` was read."""
    index = rule_index(route, existing)
    refs = backend_refs(owner, weights, backend)
    return [*_rule_guard(route, existing, index), {"op": "add", "path": _refs_path(index), "value": refs}]


def stage_patch(route: Mapping[str, Any], existing: api.ExistingRoute, owner: Owner) -> list[dict[str, Any]]:
    """A JSON patch (guarded as rule_patch's) that stages the user's rule for the tracks' InferencePools:
    the rule's own backendRefs as they are, carrying all its traffic, and the two pools beside them
    at weight 0. A Gateway reports on an InferencePool (Accepted, ResolvedRefs) only once a route
    names it; at weight 0 the pools are named and get no request, so the weight moves to them only
    once their Gateways accept them (a gateway whose picker does not serve a pool yet fails its
    requests). [] where the rule is staged so already."""
    index = rule_index(route, existing)
    read = _rule_refs(route, index)
    staged = [*_users_refs(read, owner), *backend_refs(owner, Weights(0, 0), api.Backend.INFERENCE_POOL)]
    if read == staged:
        return []
    return [*_rule_guard(route, existing, index), {"op": "add", "path": _refs_path(index), "value": staged}]


def staged_refs(refs: list[dict[str, Any]], owner: Owner) -> list[dict[str, Any]] | None:
    """The user's own backendRefs of a staged rule (stage_patch): the refs other than the tracks'
    two InferencePools, where the rule names both of those beside at least one other (whatever the
    pools' weights: a rule edited by hand is staged again, at 0), or only those two at weight 0 (a
    user's rule that had no backendRefs: []); None for any other rule."""
    names = {track_ref(owner, track, api.Backend.INFERENCE_POOL)["name"] for track in Track}
    ours = [ref for ref in refs if _is_pool(ref) and ref.get("name") in names and not ref.get("namespace")]
    users = [ref for ref in refs if ref not in ours]
    if len(ours) != 2 or {ref["name"] for ref in ours} != names:
        return None
    if users or all(int(ref.get("weight", 1)) == 0 for ref in ours):
        return users
    return None  # the tracks' pools weighted: the rule taken over


def _users_rule_refs(
    route: Mapping[str, Any], existing: api.ExistingRoute, owner: Owner
) -> list[dict[str, Any]]:
    """The user's backendRefs of the existing rule (_users_refs). LookupError where it is not there."""
    return _users_refs(_rule_refs(route, rule_index(route, existing)), owner)


def _users_refs(refs: list[dict[str, Any]], owner: Owner) -> list[dict[str, Any]]:
    """The rule's refs without the tracks' pools a staged rule names beside the user's (as read
    otherwise)."""
    users = staged_refs(refs, owner)
    return refs if users is None else users


def tracks_rule(route: Mapping[str, Any], owner: Owner) -> int | None:
    """The position of the route's first rule whose backends are exactly the tracks' Services."""
    rules = route.get("spec", {}).get("rules") or []
    routed = (i for i in range(len(rules)) if _track_weights(_rule_refs(route, i), owner) is not None)
    return next(routed, None)


def weights_patch(
    route: Mapping[str, Any], index: int, owner: Owner, weights: Weights
) -> list[dict[str, Any]]:
    """A JSON patch setting rule `index`'s backendRefs to the tracks' Services (or InferencePools,
    as the rule has them) at `weights`, refused by the API server if the route changed since it was
    read (a test of its resourceVersion)."""
    version = route["metadata"]["resourceVersion"]
    backend = _refs_backend(_rule_refs(route, index)) or api.Backend.SERVICE
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "add", "path": _refs_path(index), "value": backend_refs(owner, weights, backend)},
    ]


def repoint_patch(route: Mapping[str, Any], index: int, owner: Owner) -> list[dict[str, Any]]:
    """A JSON patch pointing rule `index` at Service <name> (both tracks' serving pods, as router
    Service serves them), refused if the route changed since it was read: what the HTTPRoute specgate
    owned routes once the object stops weighting it (the gateway's clients keep being served)."""
    version = route["metadata"]["resourceVersion"]
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "add", "path": _refs_path(index), "value": shared_service_refs(owner)},
    ]


def shared_service_refs(owner: Owner) -> list[dict[str, Any]]:
    """backendRefs to Service <name>, both tracks' serving pods."""
    return [{"kind": "Service", "name": service_name(owner), "port": HTTP_PORT}]


def owned_by(route: Mapping[str, Any], owner: Owner) -> bool:
    """Whether the object lists `owner` among its ownerReferences (the HTTPRoute specgate made)."""
    references = route.get("metadata", {}).get("ownerReferences") or []
    return any(reference.get("uid") == owner.uid for reference in references)


def routed_by_another(route: Mapping[str, Any], existing: api.ExistingRoute, owner: Owner) -> str | None:
    """Why the user's rule is refused because another SpeculativeDeployment routes it (None: none
    does): its backends are exactly another object's track Services (<other>-baseline and
    <other>-canary). Two objects weighting one rule would write it in turn every reconcile."""
    refs = _rule_refs(route, rule_index(route, existing))
    names = sorted(str(ref.get("name", "")) for ref in refs if ref.get("kind", "Service") == "Service")
    if (
        len(refs) != 2
        or len(names) != 2
        or not (names[0].endswith("-baseline") and names[1].endswith("-canary"))
    ):
        return None
    other = names[0].removesuffix("-baseline")
    if other != names[1].removesuffix("-canary") or other == owner.name:
        return None
    return (
        f"spec.rollout.traffic.existingRoute: {describe_rule(existing)} is routed by SpeculativeDeployment "
        f"{other} (its Services {other}-baseline and {other}-canary): one object per rule; name another "
        "rule, or remove that object's existingRoute first"
    )


def foreign_backends(
    route: Mapping[str, Any],
    existing: api.ExistingRoute,
    owner: Owner,
    backend: api.Backend = api.Backend.SERVICE,
) -> str | None:
    """Why specgate refuses to route the user's rule (None: it does not): a backend that is neither
    a core Service nor, with backend InferencePool, the one InferencePool of the user's that
    users_pool adopts would be replaced by the tracks' Services (or pools) and bypassed.
    LookupError where the rule is not there (route_state says so). A staged rule is judged by the
    user's backends in it (the tracks' pools beside them at weight 0 are specgate's own)."""
    refs = _users_rule_refs(route, existing, owner)
    if _track_weights(refs, owner) is not None:
        return None
    other = [
        ref for ref in refs if ref.get("group") not in (None, "") or ref.get("kind", "Service") != "Service"
    ]
    if not other:
        return None
    named = ", ".join(_describe_ref(ref) for ref in other)
    pools = [ref for ref in other if _is_pool(ref)]
    rule = f"spec.rollout.traffic.existingRoute: {describe_rule(existing)}"
    if backend is not api.Backend.INFERENCE_POOL:
        why = (
            "set spec.rollout.traffic.backend: InferencePool (with inferencePool.endpointPicker) so the "
            "rule is weighted across InferencePools, not replaced by Services that bypass its picker"
            if pools and len(pools) == len(other)
            else "specgate routes only rules whose backends are core Services (it would replace these, "
            "bypassing them); name another rule, or use httpRoute"
        )
        return f"{rule} sends traffic to {named}: {why}"
    if _users_pool_of(refs, route, owner) is not None:
        return None
    ours = " and ".join(deployment_name(owner, track) for track in Track)
    if len(refs) > 1:
        why = (
            f"specgate adopts a rule of one InferencePool of yours (its traffic moves to InferencePools "
            f"{ours}), not of {len(refs)} backends: give the rule one backend, or name another rule"
        )
    elif pools:
        why = (
            f"InferencePools {ours} are made in namespace {owner.namespace}, so the rule's pool must be "
            f"there too: point the rule at a pool in namespace {owner.namespace}, or name another rule"
        )
    else:
        why = "specgate routes only rules of core Services or of one InferencePool; name another rule"
    return f"{rule} sends traffic to {named}: {why}"


def users_pool(route: Mapping[str, Any], existing: api.ExistingRoute, owner: Owner) -> str | None:
    """The name of the user's InferencePool that the rule routes all its traffic to (its only
    backendRef, in the object's namespace): the rule specgate adopts with backend InferencePool,
    its weight moved to the tracks' pools as the baseline's pods carry it (a staged rule's too).
    None for any other rule."""
    refs = _users_rule_refs(route, existing, owner)
    return _users_pool_of(refs, route, owner)


def _users_pool_of(refs: list[dict[str, Any]], route: Mapping[str, Any], owner: Owner) -> str | None:
    if len(refs) != 1 or not _is_pool(refs[0]) or _track_weights(refs, owner) is not None:
        return None
    namespace = refs[0].get("namespace") or route.get("metadata", {}).get("namespace") or owner.namespace
    return str(refs[0].get("name")) if namespace == owner.namespace else None


def backend_of(ref: Mapping[str, Any]) -> api.Backend | None:
    """The kind a backendRef is, a core Service or an InferencePool; None for any other."""
    return _refs_backend([dict(ref)])


def _is_pool(ref: Mapping[str, Any]) -> bool:
    return backend_of(ref) is api.Backend.INFERENCE_POOL


def _describe_ref(ref: Mapping[str, Any]) -> str:
    where = f"{ref['namespace']}/" if ref.get("namespace") else ""
    return f"{ref.get('kind', 'Service')} {where}{ref.get('name')} ({ref.get('group') or 'core'})"


def _rule_guard(route: Mapping[str, Any], existing: api.ExistingRoute, index: int) -> list[dict[str, Any]]:
    """The test op that makes a patch of rule `index` fail if the rules moved since `route` was read:
    of the rule's name, or of the route's resourceVersion for a rule without one."""
    if existing.rule_name is not None:
        return [{"op": "test", "path": f"/spec/rules/{index}/name", "value": existing.rule_name}]
    version = route["metadata"]["resourceVersion"]
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]


def _refs_path(index: int) -> str:
    return f"/spec/rules/{index}/backendRefs"


def recorded_rule(original: api.OriginalRule) -> api.ExistingRoute:
    """The rule a record was taken of, as existingRoute names it."""
    return api.ExistingRoute(
        name=original.route, rule_name=original.rule_name, rule_index=original.rule_index
    )


def describe_rule(rule: api.ExistingRoute) -> str:
    which = repr(rule.rule_name) if rule.rule_name is not None else f"at index {rule.rule_index}"
    return f"HTTPRoute {rule.name}'s rule {which}"


def rule_record(
    route: Mapping[str, Any], existing: api.ExistingRoute, owner: Owner
) -> api.OriginalRule | None:
    """The user's rule's own backendRefs, read before specgate first sets them: what restore_patch
    puts back. None where they are the tracks' Services already (the record was lost, or an earlier
    specgate took the rule over): nothing of the user's is left to keep. Of a staged rule (the record
    lost between the staged write and the status write), the user's backends in it."""
    refs = _users_rule_refs(route, existing, owner)
    if _track_weights(refs, owner) is not None:
        return None
    return api.OriginalRule(
        route=existing.name, rule_name=existing.rule_name, rule_index=existing.rule_index, backend_refs=refs
    )


def releases(original: api.OriginalRule, traffic: api.Traffic | None) -> bool:
    """Whether the recorded rule is one specgate no longer routes (router Service, a route of its own,
    another rule): its backendRefs go back now."""
    existing = traffic.existing_route if traffic is not None else None
    return existing != recorded_rule(original)


def restore_patch(
    route: Mapping[str, Any],
    original: api.OriginalRule,
    owner: Owner,
    refs: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """A JSON patch that puts the recorded backendRefs back on their rule (or `refs` instead, where
    those no longer serve), guarded as rule_patch's, and with a test of the backendRefs read: a
    change made since the read is not overwritten.

    LookupError, saying why, where there is nothing to put back: the rule is gone (by its name, or
    its index is past the end), or it no longer routes to the tracks' Services (someone pointed it
    elsewhere, or for ruleIndex another rule is at that index now): what it routes to stays. A
    staged rule (the user's backends, the tracks' pools beside them at weight 0) is put back too."""
    rule = recorded_rule(original)
    try:
        index = rule_index(route, rule)
    except LookupError:
        raise LookupError(f"{describe_rule(rule)} is gone") from None
    read = _rule_refs(route, index)
    if _track_weights(read, owner) is None and staged_refs(read, owner) is None:
        services = " and ".join(service_name(owner, track) for track in Track)
        raise LookupError(f"{describe_rule(rule)} no longer routes to Services {services}")
    path = _refs_path(index)
    put_back = original.backend_refs if refs is None else refs
    put = (
        {"op": "replace", "path": path, "value": put_back}
        if put_back
        else {"op": "remove", "path": path}  # the rule had none
    )
    return [*_rule_guard(route, rule, index), {"op": "test", "path": path, "value": read}, put]


def route_name(owner: Owner, traffic: api.Traffic) -> str:
    """The HTTPRoute whose rule specgate weights: its own (<name>) or the user's."""
    return traffic.existing_route.name if traffic.existing_route is not None else owner.name


def route_state(
    route: Mapping[str, Any] | None,
    traffic: api.Traffic,
    owner: Owner,
    pools: Mapping[str, Mapping[str, Any] | None] | None = None,
    missing_pickers: Mapping[str, str] | None = None,
) -> RouteState:
    """The rule's weights as the route's Gateways accepted them, or why they have not (yet). With
    backend InferencePool, `pools` (by name, as read) must be accepted by those Gateways as well;
    `missing_pickers`: why a pool cannot be (its picker's Service is absent), by the pool's name."""
    existing = traffic.existing_route
    if route is None:
        return RouteState(
            hold=f"HTTPRoute {route_name(owner, traffic)} does not exist" + ("" if existing else " yet")
        )
    try:
        index = 0 if existing is None else rule_index(route, existing)
    except LookupError as error:
        return RouteState(hold=str(error))
    owned = traffic.http_route.parent_refs if traffic.http_route is not None and existing is None else None
    parents = None if owned is None else [Parent(p.name, p.namespace, p.section_name) for p in owned]
    hold = route_hold(route, parents) or (pools_hold(pools, parents, missing_pickers) if pools else None)
    written = route_weights(route, index, owner, traffic.backend)
    refs = _rule_refs(route, index)
    staged = existing is not None and staged_refs(refs, owner) is not None
    if hold and existing is not None and written is None and traffic.backend is api.Backend.INFERENCE_POOL:
        hold = _adoption_hold(_users_refs(refs, owner), owner, staged, hold)
    if hold:
        return RouteState(hold=hold, written=written, staged=staged)
    return RouteState(weights=written, staged=staged)


def _adoption_hold(users: list[dict[str, Any]], owner: Owner, staged: bool, hold: str) -> str:
    """The hold of a user's rule that the tracks' pools take over, saying where its traffic is and
    what its move waits for."""
    own = ", ".join(_describe_ref(ref) for ref in users) or "no backend"
    pools = " and ".join(deployment_name(owner, track) for track in Track)
    named = "which it names at weight 0" if staged else "once it names them at weight 0"
    return (
        f"the rule keeps all its traffic on your {own} until the Gateways accept InferencePools "
        f"{pools}, {named}: {hold}"
    )


def route_weights(
    route: Mapping[str, Any], index: int, owner: Owner, backend: api.Backend | None = None
) -> Weights | None:
    """The share of traffic rule `index` of the route gives each track's Service (or InferencePool),
    None unless its backends are exactly those two (_track_weights)."""
    weights = _track_weights(_rule_refs(route, index), owner, backend)
    return None if weights is None else shares(*weights)


def _rule_refs(route: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    rules = route.get("spec", {}).get("rules") or []
    return list(rules[index].get("backendRefs") or []) if index < len(rules) else []


def _track_weights(
    refs: list[dict[str, Any]], owner: Owner, backend: api.Backend | None = None
) -> tuple[int, int] | None:
    """The (baseline, canary) weights of the tracks' backends among refs, None unless refs are
    exactly those two, both Services or both InferencePools (`backend`: that kind only; a backend
    without a weight has Gateway API's default, 1). The two kinds are named alike (<name>-<track>)."""
    kind = _refs_backend(refs)
    if len(refs) != 2 or kind is None or backend not in (None, kind):
        return None
    weights = {ref.get("name"): int(ref.get("weight", 1)) for ref in refs}
    names = [track_ref(owner, track, kind)["name"] for track in (Track.BASELINE, Track.CANARY)]
    if set(weights) != set(names):
        return None
    return weights[names[0]], weights[names[1]]


def _refs_backend(refs: list[dict[str, Any]]) -> api.Backend | None:
    """The kind all of refs are, core Services or InferencePools; None for any other or a mix."""
    kinds = {(ref.get("group") or "", ref.get("kind", "Service")) for ref in refs}
    known = {
        ("", "Service"): api.Backend.SERVICE,
        (INFERENCE_GROUP, "InferencePool"): api.Backend.INFERENCE_POOL,
    }
    return known.get(kinds.pop()) if len(kinds) == 1 else None
