"""The SpeculativeDeployment API (specgate.dev/v1alpha1): spec and status as pydantic models.

The models are the single source of the CRD schema (see crd.py): field descriptions become what
`kubectl explain` prints, and the cross-field rules in RULES become both CEL
`x-kubernetes-validations` (enforced by the API server) and the same check in Python (enforced by
the operator, for objects that reached it some other way).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.json_schema import SkipJsonSchema

GROUP = "specgate.dev"
VERSION = "v1alpha1"
KIND = "SpeculativeDeployment"
PLURAL = "speculativedeployments"
API_VERSION = f"{GROUP}/{VERSION}"

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as "90s", "5m" or "1h30m"."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration like 30s, 5m or 1h30m")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def iso(t: datetime) -> str:
    """A time as status stores it (RFC 3339, UTC, whole seconds)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


class Model(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected (the CRD prunes them anyway)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", use_enum_values=False
    )


# The pattern cannot bound a duration's size, and "10000000000m" overflows date arithmetic: the
# operator refuses durations over a year (InvalidSpec naming the field) instead of crashing each tick.
MAX_DURATION_SECONDS = 366 * 24 * 3600


def _bounded_duration(text: str) -> str:
    if parse_duration(text) > MAX_DURATION_SECONDS:
        raise ValueError(f"{text!r} is longer than 8784h (366 days)")
    return text


Duration = Annotated[str, AfterValidator(_bounded_duration)]


def duration(default: str, description: str) -> Any:
    return Field(default, description=description, pattern=DURATION_PATTERN)


class Method(StrEnum):
    EAGLE3 = "eagle3"
    EAGLE = "eagle"
    NGRAM = "ngram"
    SUFFIX = "suffix"
    DRAFT_MODEL = "draft_model"
    MTP = "mtp"


METHODS_NEEDING_DRAFT = (Method.EAGLE3, Method.EAGLE, Method.DRAFT_MODEL)
METHODS_WITHOUT_DRAFT = (Method.NGRAM, Method.SUFFIX)


class Strategy(StrEnum):
    CANARY = "canary"
    SEQUENTIAL = "sequential"


class Action(StrEnum):
    ROLL_BACK = "RollBack"
    PAUSE = "Pause"


class GuardAction(StrEnum):
    WARN = "Warn"
    ROLL_BACK = "RollBack"


class MeasurementMode(StrEnum):
    TRAFFIC = "traffic"
    BENCHMARK = "benchmark"
    BOTH = "both"


class Dataset(StrEnum):
    RANDOM = "random"
    SHAREGPT = "sharegpt"
    SPEC_BENCH = "spec_bench"
    CUSTOM = "custom"


class ModelSpec(Model):
    name: str = Field(
        min_length=1,
        description="Target model: a Hugging Face id (meta-llama/Llama-3.1-8B-Instruct) or a path "
        "inside the container (/models/llama). Passed to `vllm serve` as the model.",
    )
    served_name: str | None = Field(
        None, description="Name clients use in requests (--served-model-name). Defaults to name."
    )


class GPUResources(Model):
    gpus: int = Field(1, ge=1, description="GPUs per replica (the resource limit).")
    gpu_resource_name: str = Field(
        "nvidia.com/gpu", min_length=1, description="Extended resource name of the GPU."
    )
    cpu: str | None = Field(None, description="CPU request, e.g. '8'.")
    memory: str | None = Field(None, description="Memory request and limit, e.g. '64Gi'.")


class SecretKeyRef(Model):
    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field(min_length=1, description="Key inside the Secret.")
    optional: bool | None = Field(None, description="Start even when the Secret or key is missing.")


class EnvValueFrom(Model):
    secret_key_ref: SecretKeyRef = Field(
        description="Read the value from a Secret (e.g. HF_TOKEN); the value never enters status or logs."
    )


class EnvVar(Model):
    name: str = Field(min_length=1, description="Environment variable name.")
    value: str | None = Field(None, description="Literal value. Exactly one of value and valueFrom.")
    value_from: EnvValueFrom | None = Field(None, description="Value taken from a Secret.")


class ModelCache(Model):
    claim_name: str = Field(
        min_length=1, description="PersistentVolumeClaim holding the model cache (shared by replicas)."
    )
    mount_path: str = Field(
        "/root/.cache/huggingface", description="Where the cache is mounted; HF_HOME points there."
    )


RENDERED_VOLUMES = ("dshm", "model-cache")  # the volumes specgate renders into every vLLM pod


class PodTemplate(Model):
    """Pod fields GPU clusters need, merged into both tracks' pods; what specgate renders (the vLLM
    container, its probes, ports and resources) is not overridden."""

    runtime_class_name: str | None = Field(
        None, description="RuntimeClass of the pods, e.g. nvidia (the NVIDIA container runtime)."
    )
    priority_class_name: str | None = Field(None, description="PriorityClass of the pods.")
    service_account_name: str | None = Field(
        None, description="ServiceAccount the pods run as (e.g. workload identity for a model bucket)."
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list, description="Names of Secrets to pull the vLLM image with."
    )
    affinity: dict[str, Any] | None = Field(None, description="The pods' affinity (Kubernetes' Affinity).")
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The pods' topologySpreadConstraints; select the pods by the label "
        "specgate.dev/deployment: <name> (both tracks) or add specgate.dev/track.",
    )
    security_context: dict[str, Any] | None = Field(None, description="The pods' securityContext.")
    container_security_context: dict[str, Any] | None = Field(
        None, description="The vLLM container's securityContext."
    )
    shm_size_limit: str | None = Field(
        None,
        description="sizeLimit of the memory volume at /dev/shm (tensor-parallel workers exchange data "
        "there), e.g. 16Gi; default: no limit beyond the pod's memory.",
    )
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra pod volumes (Kubernetes' Volume), not named dshm or model-cache.",
    )
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list, description="Extra volumeMounts of the vLLM container."
    )


class Toleration(Model):
    key: str | None = Field(None, description="Taint key.")
    operator: str | None = Field(None, description="Exists or Equal.")
    value: str | None = Field(None, description="Taint value (with Equal).")
    effect: str | None = Field(None, description="NoSchedule, PreferNoSchedule or NoExecute.")
    toleration_seconds: int | None = Field(None, description="How long a NoExecute taint is tolerated.")


class BatchSizeRange(Model):
    min_batch_size: int = Field(ge=1, description="First batch size of the range (inclusive, from 1).")
    max_batch_size: int = Field(ge=1, description="Last batch size of the range (inclusive).")
    num_speculative_tokens: int = Field(
        ge=0,
        le=16,
        description="Draft length K at these batch sizes (0: no drafts), at most numSpeculativeTokens.",
    )


class AcceptanceRatePolicy(StrEnum):
    FIXED = "Fixed"
    BREAK_EVEN = "BreakEven"


class PerBatchSizePolicy(StrEnum):
    EXPLICIT = "Explicit"
    AUTO = "Auto"


class SpeculativeSpec(Model):
    method: Method = Field(
        Method.EAGLE3, description="vLLM speculative method: eagle3, eagle, ngram, suffix, draft_model, mtp."
    )
    draft_model: str | None = Field(
        None,
        description="Draft model or EAGLE head (HF id or path). Required by eagle3, eagle and "
        "draft_model; must be empty for ngram and suffix; optional for mtp.",
    )
    num_speculative_tokens: int = Field(
        3, ge=1, le=16, description="Draft length K: tokens proposed per step (1..16)."
    )
    num_speculative_tokens_per_batch_size: list[BatchSizeRange] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Draft length per batch size (vLLM's num_speculative_tokens_per_batch_size): "
        "non-overlapping inclusive ranges, one starting at 1; a batch size between ranges keeps the "
        "previous range's K, one above the last keeps the last K.",
    )
    num_speculative_tokens_per_batch_size_policy: PerBatchSizePolicy | None = Field(
        None,
        description="Explicit (the default): numSpeculativeTokensPerBatchSize as written, or "
        "numSpeculativeTokens at every batch size. Auto: the operator derives the schedule from the "
        "cost model (accelerator from the nodeSelector or affinity label nvidia.com/gpu.product, "
        "target size from the model name, --max-num-seqs or 256 batch sizes) and the best acceptance "
        "evidence it has when a rollout begins (the last canary of the same draft, else "
        "gates.minAcceptanceRate), K at most numSpeculativeTokens, holds it for the whole rollout and "
        "shows it in status.kSchedule.",
    )
    draft_tensor_parallel_size: int | None = Field(
        None, ge=1, description="Tensor parallel size of the draft (never tensor_parallel_size)."
    )
    prompt_lookup_min: int | None = Field(None, ge=1, description="ngram only: shortest n-gram matched.")
    prompt_lookup_max: int | None = Field(None, ge=1, description="ngram only: longest n-gram matched.")
    extra_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Further --speculative-config keys passed through unchanged (e.g. max_model_len). "
        "Must not repeat the fields above nor set tensor_parallel_size.",
    )


class Gates(Model):
    min_acceptance_rate: float = Field(
        0.55, gt=0, lt=1, description="Promote only when alpha (accepted / draft tokens) is at least this."
    )
    min_acceptance_rate_policy: AcceptanceRatePolicy = Field(
        AcceptanceRatePolicy.FIXED,
        description="Fixed: the acceptance gate is minAcceptanceRate. BreakEven (opt-in): the alpha at which "
        "speculation breaks even by the cost model (the accelerator and target size the spec names, or "
        "this config's measured step costs), at the baseline's measured requests running per pod and "
        "numSpeculativeTokens, plus breakEvenMargin; decided once as the analysis begins and kept in "
        "status.acceptanceGate with how it was derived (it can lie below 0.55 at low load and above it "
        "at high load).",
    )
    break_even_margin: float = Field(
        0.05,
        ge=0,
        le=0.5,
        description="minAcceptanceRatePolicy BreakEven: added to the break-even alpha, as the cost model's "
        "own error and a gain worth the draft's memory.",
    )
    max_p99_per_token_regression: float = Field(
        0.10,
        ge=0,
        description="Tolerated regression of the P99 per-token latency (vllm:request_time_per_output_"
        "token_seconds: each request's pace, what a streaming user feels) of the canary over the "
        "baseline, as a fraction (0.10 = 10 % worse at most).",
    )
    max_p99_itl_regression: float = Field(
        0.50,
        ge=0,
        description="Tolerated regression of the P99 step stall (vllm:inter_token_latency_seconds, one "
        "sample per running request per engine step, judged in engine steps; a speculative step emits "
        "several tokens) of the canary over the baseline, as a fraction. Looser than the per-token gate "
        "because a good draft lengthens each step while tokens arrive sooner (EAGLE on an 8B model: "
        "+33 % step time for 1.43x throughput, the published GPU run in docs/benchmarks.md).",
    )
    max_load_difference: float = Field(
        0.25,
        ge=0,
        description="Latency is compared only when canary and baseline pods carry comparable load: "
        "request rate per pod or requests running per pod within this fraction of each other; "
        "otherwise the latency verdict is InsufficientData naming both loads.",
    )
    min_speedup: float = Field(
        1.0,
        gt=0,
        le=10,
        description="Promote only when the canary is at least this much faster per output token than the "
        "baseline beside it: the baseline's mean time per output token (vllm:request_time_per_output_"
        "token_seconds, sum over count per window) over the canary's, judged by a sequential test on "
        "paired windows within +-0.03 of it. 1.0: never promote a canary that is slower where it serves "
        "(alpha and P99 latency can pass while it is); e.g. 1.05 to demand a margin worth the draft's "
        "memory. Judged only with the baseline measured beside the canary (strategy Canary, traffic "
        "measurement); a Fail rolls back with reason NoSpeedup.",
    )
    min_drafts: int = Field(200, ge=1, description="Drafts to observe before any acceptance verdict.")
    min_latency_samples: int = Field(
        100,
        ge=1,
        description="Latency observations per track before a latency verdict (the step stall counts "
        "engine steps).",
    )
    error_rate: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="Allowed probability of a wrong acceptance verdict, for an alpha at least "
        "indifference away from minAcceptanceRate.",
    )
    indifference: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="Tolerance of the acceptance gate, in alpha: a canary within this of "
        "minAcceptanceRate may get either verdict, one at least this far from it gets the right "
        "verdict with probability 1 - errorRate. Smaller values decide near the gate more reliably "
        "but take longer (at the zone's edges, time to a verdict grows like 1/indifference^2).",
    )
    mix_drift: float = Field(
        0.09,
        ge=0,
        # le, not lt: the API server compares a whole-number value (0, as YAML writes it) with an
        # exclusive maximum truncated to a whole number, and would refuse 0 as "not less than 0".
        le=0.5,
        description="How far the traffic mix moves alpha over minutes (standard deviation, in alpha; "
        "0.09: the prompts' mix swings alpha 0.55 to about 0.46 or 0.64 and back). A swing slower "
        "than the analysis so far moves every window together, so the windows' spread cannot show "
        "it; the acceptance gate adds it to that spread and decides near the gate only once it has "
        "seen several swings. 0 for a steady mix: decides sooner, but wrongly far more often than "
        "errorRate if the mix does drift. The fallback: a rollout that replaces a promoted config "
        "measures the drift on that config's history instead (mixDriftHistory).",
    )
    mix_drift_timescale: Duration = duration(
        "3m", "Correlation time of the traffic mix's drift (mixDrift): how long a swing lasts."
    )
    mix_drift_history: Duration = duration(
        "12h",
        "On a rollout that replaces a promoted config, how much of that config's own alpha history "
        "(its spec-decode counters in Prometheus, up to the new rollout's start) measures the mix's "
        "drift in place of mixDrift and mixDriftTimescale, which stay the fallback for a first rollout "
        "or a history under an hour. 0s: always the fallback.",
    )


class BucketsPolicy(StrEnum):
    AUTO = "Auto"
    RENDER = "Render"
    ENGINE = "Engine"


class LatencyBuckets(Model):
    """The buckets of vLLM's inter_token_latency histograms (the step stall's and the per-token
    latency's, which share them), rendered as --custom-histogram-buckets on both tracks: a geometric
    ladder fine enough for the latency gates' tolerance (docs/concepts/gates.md). Part of what the
    pods run: changing it is a new config, rolled out through a canary."""

    policy: BucketsPolicy = Field(
        BucketsPolicy.AUTO,
        description="Auto: render the ladder where the image's tag names vLLM 0.32 or later (the flag "
        "does not exist before) and vllmArgs sets no --custom-histogram-buckets of its own. Render: "
        "always (an image whose tag names no version). Engine: never, the engine keeps its buckets "
        "(the gates then judge by their resolution).",
    )
    lowest: Duration = duration("5ms", "The lowest finite bucket edge.")
    highest: Duration = duration("5s", "The highest finite bucket edge at most (the ladder stops below it).")
    ratio: float = Field(
        1.08,
        ge=1.02,
        le=2.0,
        description="Each edge over the one below it. At most 1 + maxP99PerTokenRegression for the "
        "gate to read its tolerance inside a bucket; 1.08 from 5ms to 5s is 90 edges, so 91 series "
        "a histogram and pod (vLLM's default: 20).",
    )


class MetricsSource(Model):
    prometheus_url: str | None = Field(
        None,
        description="Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090. "
        "Defaults to the operator's --prometheus-url.",
    )
    namespace_label: str = Field("namespace", description="Target label holding the pod's namespace.")
    deployment_label: str = Field(
        "specgate_dev_deployment", description="Target label holding the pod label specgate.dev/deployment."
    )
    track_label: str = Field(
        "specgate_dev_track", description="Target label holding the pod label specgate.dev/track."
    )
    pod_monitor: bool = Field(
        False, description="Also create a PodMonitor (Prometheus Operator) that produces these labels."
    )
    pod_monitor_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels on the PodMonitor, for the Prometheus that selects it: kube-prometheus-stack "
        "selects by release: <its Helm release> (its podMonitorSelector).",
    )
    scrape_interval: Duration = duration(
        "15s",
        "How often Prometheus scrapes the engines (the PodMonitor's interval). Acceptance windows "
        "are at least this long, or the interval seen between samples when that is longer.",
    )


class Guard(Model):
    enabled: bool = Field(True, description="Keep measuring alpha after promotion and roll back on drift.")
    window: Duration = duration(
        "30m",
        "How far back the guard's latency check looks after promotion (at least 1m is used): the "
        "promoted canary's P99 latencies over this span against the stored baseline's.",
    )
    history: Duration = duration(
        "36h",
        "How far back the guard's alpha check looks after promotion: its change detector runs over "
        "the promoted config's alpha in blocks of a minute (4 scrapes, at least 15s) over this span, "
        "and takes the spread of their noise from its older two thirds, so it must be long beside the "
        "traffic mix's swings (hours, to hold the false-alarm budget; at least 10m, and at most "
        "10,000 blocks are read: a Prometheus range query returns at most 11,000 points).",
    )
    false_alarms_per_month: float = Field(
        0.1,
        gt=0,
        description="The guard's budget of false alarms: how often, per 30 days, it may roll back a "
        "canary whose alpha holds at minAcceptanceRate + indifference, whether the traffic mix drifts "
        "or not (its threshold is calibrated on a traffic model: docs/concepts/gates.md, bench/guard.py). "
        "A drop to minAcceptanceRate - "
        "indifference or below is caught sooner the larger this is (the CUSUM threshold grows with "
        "the log of the blocks between false alarms).",
    )
    on_metrics_unavailable: GuardAction = Field(
        GuardAction.WARN,
        description="When the promoted canary's metrics stay missing for metricsUnavailableBudget: Warn "
        "(Degraded condition and a Warning Event; the gated config keeps serving) or RollBack.",
    )


class DatasetSource(Model):
    config_map: str = Field(
        min_length=1, description="ConfigMap mounted read-only at /datasets in the benchmark pod."
    )


# A Job's result comes back in the pod's termination message (4 KiB), one compact line per point.
MAX_CONCURRENCY_POINTS = 8
DEFAULT_CONCURRENCY = (1, 8, 32)


class Benchmark(Model):
    """`vllm bench serve` run by a Job against one track's pods (Service <name>-<track>)."""

    dataset: Dataset = Field(
        Dataset.RANDOM,
        description="random (synthetic prompts of inputLen tokens), sharegpt, spec_bench, or custom "
        '(JSONL with a "prompt" per line). All but random read datasetPath.',
    )
    dataset_path: str | None = Field(
        None,
        description="File inside the benchmark pod: under /datasets when datasetFrom is set, or on the "
        "modelCache volume. Required unless dataset is random.",
    )
    dataset_from: DatasetSource | None = Field(None, description="Where /datasets comes from.")
    num_prompts: int = Field(200, ge=1, description="Prompts per concurrency point.")
    concurrency: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: list(DEFAULT_CONCURRENCY),
        min_length=1,
        max_length=MAX_CONCURRENCY_POINTS,
        description="Concurrency points (--max-concurrency), each run for baseline and canary. "
        "Speculation tends to help at low concurrency and hurt at high.",
    )
    gate_concurrency: int | None = Field(
        None,
        ge=1,
        description="The production concurrency: the point the gates apply at. Must be one of "
        "concurrency; defaults to the highest point.",
    )
    request_rate: float | None = Field(
        None, gt=0, description="Requests per second (Poisson); unset sends as fast as concurrency allows."
    )
    input_len: int = Field(256, ge=1, description="Prompt tokens (random dataset).")
    output_len: int = Field(128, ge=1, description="Output tokens per request.")
    seed: int = Field(0, description="Seed of prompt sampling: baseline and canary get the same prompts.")
    temperature: float = Field(
        0.0,
        ge=0,
        description="Sampling temperature of the requests: 0 (greedy) makes runs comparable; set your "
        "traffic's to measure the alpha it will see (a greedy draft's alpha falls as temperature rises).",
    )
    image: str | None = Field(None, description="Image with vLLM's benchmark; defaults to spec.image.")
    timeout: Duration = duration("30m", "Longest run of one track's Job (all points) before it fails.")
    max_failed_requests: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="Fraction of failed requests above which the measurement fails (MeasurementFailed).",
    )

    def gate_point(self) -> int:
        return self.gate_concurrency if self.gate_concurrency is not None else max(self.concurrency)


class Router(StrEnum):
    SERVICE = "Service"
    GATEWAY_API = "GatewayAPI"


# Gateway API's patterns (its HTTPRoute CRD, v1.6.3): admission refuses what the route would refuse.
GATEWAY_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
GATEWAY_HOSTNAME = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
GATEWAY_DURATION = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"  # Gateway API's Duration (GEP-2257)
GATEWAY_NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class ParentReference(Model):
    """A Gateway (or a listener of it) the HTTPRoute attaches to: Gateway API's ParentReference."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Gateway.")
    namespace: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        pattern=GATEWAY_NAMESPACE,
        description="Namespace of the Gateway; defaults to the route's.",
    )
    section_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=GATEWAY_SUBDOMAIN,
        description="Listener of the Gateway (its name).",
    )
    port: int | None = Field(None, ge=1, le=65535, description="Port of the Gateway's listener.")


class RouteTimeouts(Model):
    """Gateway API HTTPRouteTimeouts of the owned route's rule: Envoy-based gateways cut a request
    (a token stream too) at 15 s by default."""

    request: str | None = Field(
        None,
        pattern=GATEWAY_DURATION,
        description="The gateway's timeout for the whole request, streamed response included "
        '(Gateway API Duration, e.g. "10m"; "0s": none).',
    )
    backend_request: str | None = Field(
        None,
        pattern=GATEWAY_DURATION,
        description="The timeout of one request from the gateway to a backend (Gateway API Duration).",
    )


class HTTPRouteTemplate(Model):
    """The HTTPRoute <name> specgate creates and owns: one rule, the two tracks' Services as its
    weighted backends."""

    parent_refs: list[ParentReference] = Field(
        min_length=1, max_length=32, description="Gateways the route attaches to."
    )
    hostnames: list[Annotated[str, Field(min_length=1, max_length=253, pattern=GATEWAY_HOSTNAME)]] = Field(
        default_factory=list,
        max_length=16,
        description="Hostnames the route serves; empty: all of the Gateway's.",
    )
    matches: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=64,
        description="The rule's matches (Gateway API HTTPRouteMatch: path, headers, queryParams, "
        "method); empty: every request.",
    )
    timeouts: RouteTimeouts | None = Field(
        None, description="The rule's timeouts; absent: the gateway's defaults (Envoy's cut streams at 15 s)."
    )


class ExistingRoute(Model):
    """An HTTPRoute of the user's in this namespace, one of whose rules specgate routes: it sets that
    rule's backendRefs (the two tracks' Services, weighted) and leaves the rest of the route alone."""

    name: str = Field(min_length=1, max_length=253, description="Name of the HTTPRoute.")
    rule_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=GATEWAY_SUBDOMAIN,
        description="The rule's name (spec.rules[].name).",
    )
    rule_index: int | None = Field(
        None, ge=0, le=15, description="The rule's position in spec.rules, from 0 (rules without names)."
    )


class Backend(StrEnum):
    SERVICE = "Service"
    INFERENCE_POOL = "InferencePool"


class FailureMode(StrEnum):
    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


class EndpointPicker(Model):
    """The endpoint picker of one track's InferencePool (its spec.endpointPickerRef): a Service of
    yours running the picker (Gateway API Inference Extension v1). specgate deploys no picker."""

    name: str = Field(min_length=1, max_length=253, description="Name of the picker's Service.")
    port: int = Field(
        ge=1, le=65535, description="The picker's gRPC port on that Service (ext-proc, e.g. 9002)."
    )
    failure_mode: FailureMode = Field(
        FailureMode.FAIL_CLOSE,
        description="What the gateway does when the picker does not answer: FailClose refuses the "
        "request, FailOpen sends it to an endpoint of the gateway's choosing.",
    )


class EndpointPickers(Model):
    baseline: EndpointPicker | None = Field(None, description="Picker of InferencePool <name>-baseline.")
    canary: EndpointPicker | None = Field(None, description="Picker of InferencePool <name>-canary.")


class InferencePoolTemplate(Model):
    """The InferencePools <name>-baseline and <name>-canary specgate creates and owns (backend
    InferencePool): each selects its track's pods on the engine's port."""

    endpoint_picker: EndpointPickers | None = Field(
        None,
        description="Each pool's endpoint picker (a Service and port): both required. A picker "
        "serves one pool, so each track has its own.",
    )


class Traffic(Model):
    router: Router = Field(
        Router.SERVICE,
        description="Service: both tracks behind Service <name>, traffic by replica ratio. GatewayAPI: "
        "an HTTPRoute splits traffic between Services <name>-baseline and <name>-canary by weight, "
        "load-matched (each track's share of Ready serving pods) so latency is compared at equal load; "
        "a track gives up pods only once the route's Gateways accepted weights it can carry without them.",
    )
    http_route: HTTPRouteTemplate | None = Field(
        None,
        description="GatewayAPI: the HTTPRoute <name> specgate creates. Exactly one of this and existingRoute.",
    )
    backend: Backend = Field(
        Backend.SERVICE,
        description="GatewayAPI: what the rule's two weighted backendRefs are. Service: Services "
        "<name>-baseline and <name>-canary. InferencePool: InferencePools <name>-baseline and "
        "<name>-canary (Gateway API Inference Extension v1, its CRD installed), each with the "
        "endpoint picker inferencePool names; their weights count as carried once the route and "
        "both pools report Accepted and ResolvedRefs.",
    )
    inference_pool: InferencePoolTemplate | None = Field(
        None, description="backend InferencePool: the pools' endpoint pickers."
    )
    existing_route: ExistingRoute | None = Field(
        None,
        description="GatewayAPI: the rule of your HTTPRoute whose backendRefs specgate sets. HTTPRoute "
        "declares spec.rules an atomic list, so your next apply of the route resets them: have your "
        "GitOps tool ignore that rule's backendRefs.",
    )
    initial_canary_weight: int | None = Field(
        None,
        ge=1,
        le=50,
        description="GatewayAPI: a first step at this canary weight (percent, below its load-matched "
        "share), during which alpha alone is judged (the tracks' per-pod loads differ, so latency is "
        "not). Once alpha passes there, the canary gets its load-matched weight and the analysis of "
        "alpha and latency begins again at that weight. Needs measurement traffic or both.",
    )
    max_canary_weight: int | None = Field(
        None,
        ge=1,
        le=100,
        description="GatewayAPI: a hard cap on the canary's share of the route (percent) in Canary and "
        "Analyzing; default: its load-matched share at the spec's replicas (canaryReplicas beside the "
        "baseline's pods). Where the baseline loses Ready pods so that its rest would exceed what the "
        "floor's pods carry, the canary takes what it must (never a backend without Ready pods): the "
        "analysis is held meanwhile (reason CanaryAboveMaxWeight) and past progressDeadline the "
        "rollout rolls back.",
    )
    scale_down_delay: Duration = duration(
        "30s",
        "GatewayAPI: how long the route's Gateways must have accepted the weights that take all "
        "traffic away from a track before that track's last pods go (Argo Rollouts' "
        "scaleDownDelaySeconds): a gateway can report the route Accepted before its data plane "
        "routes it, and a deleted pod leaves its Service's endpoints at once, so a track emptied "
        "sooner can leave the data plane a weight with no endpoint behind it (HTTP 503). A track "
        "that keeps pods keeps endpoints: its other scale-downs do not wait.",
    )


class RolloutSpec(Model):
    strategy: Strategy = Field(
        Strategy.CANARY,
        description="canary: canary pods beside the baseline, traffic by replica ratio. sequential: "
        "the same replicas switched to the candidate (single-replica models).",
    )
    canary_replicas: int = Field(
        1,
        ge=1,
        description="Replicas of the canary (strategy canary): fewer than replicas, so that the baseline "
        "serves beside it. At replicas 1 the canary pod needs a spare GPU (maxSurge 1); with maxSurge 0 "
        "the baseline's pod gives way to it, as maxUnavailable 1 allows, and nothing serves between.",
    )
    max_surge: int = Field(
        1,
        ge=0,
        description="Pods (GPUs) a transition may run above replicas: the side that shrinks shrinks only "
        "as the other side's new pods are Ready, as in a Deployment's rolling update.",
    )
    max_unavailable: int = Field(
        0,
        ge=0,
        description="Ready serving pods a transition may go below replicas. With maxSurge 0 (no spare "
        "GPUs) set 1: pods are then swapped one at a time.",
    )
    warmup: Duration = duration("60s", "Wait after a track is Ready before measuring it.")
    analysis_window: Duration = duration("5m", "Measurement window of the baseline and of each canary look.")
    max_analysis_duration: Duration = duration(
        "60m",
        "Longest canary analysis. A canary whose acceptance test has its data but no verdict by then is "
        "decided by its estimate's side of the gate; one without its data, or with a latency gate "
        "still undecided, takes onInconclusive. 60m: on traffic whose mix drifts over minutes, a "
        "30-minute mean still misses the next hours' alpha by 0.05 about 15 % of the time.",
    )
    progress_deadline: Duration = duration(
        "15m", "Longest wait for a track to become Ready before it counts as unhealthy."
    )
    metrics_unavailable_budget: Duration = duration(
        "5m", "How long metrics may be missing before onMetricsUnavailable is taken."
    )
    on_metrics_unavailable: Action = Field(
        Action.ROLL_BACK, description="RollBack or Pause when Prometheus stays unreachable or empty."
    )
    on_inconclusive: Action = Field(
        Action.ROLL_BACK, description="RollBack or Pause when maxAnalysisDuration passes without a verdict."
    )
    measurement: MeasurementMode = Field(
        MeasurementMode.TRAFFIC,
        description="traffic: measure production traffic in Prometheus. benchmark: run spec.rollout."
        "benchmark as a Job against each track (quiet services, pre-production). both: promote only "
        "when both pass.",
    )
    benchmark: Benchmark = Field(
        default_factory=Benchmark, description="The benchmark run when measurement is benchmark or both."
    )
    traffic: Traffic | None = Field(
        None, description="How traffic reaches the tracks; absent: router Service."
    )
    gates: Gates = Field(default_factory=Gates, description="Promotion gates.")
    metrics: MetricsSource = Field(default_factory=MetricsSource, description="Where metrics come from.")
    guard: Guard = Field(default_factory=Guard, description="Guard after promotion.")
    paused: bool = Field(
        False,
        description="Hold the rollout where it is (phase Paused): no pod changes until unpaused; "
        "unpausing resumes the same phase.",
    )
    retry: int = Field(
        0,
        ge=0,
        description="Bump to re-run a RolledBack or Failed rollout (or one an action paused) of an "
        "otherwise unchanged spec; ignored while a rollout runs or after promotion.",
    )


class ScaleDown(StrEnum):
    """How the referenced Deployment gives way to specgate's pods (Argo Rollouts' workloadRef scaleDown)."""

    NEVER = "never"
    ON_SUCCESS = "onSuccess"
    PROGRESSIVELY = "progressively"


class OnDelete(StrEnum):
    HAND_BACK = "HandBack"
    LEAVE = "Leave"


class WorkloadRef(Model):
    """A running vLLM Deployment that specgate adopts: its pod template becomes the baseline's, and
    its replicas (never its template) are lowered as specgate's pods become Ready."""

    api_version: str = Field(
        "apps/v1", pattern="^apps/v1$", description="API version of the workload: apps/v1."
    )
    kind: str = Field("Deployment", pattern="^Deployment$", description="Kind of the workload: Deployment.")
    name: str = Field(
        min_length=1, max_length=253, description="Name of the Deployment, in the object's namespace."
    )
    container: str | None = Field(
        None,
        min_length=1,
        description="The container that runs vLLM; default: the one named vllm, else the only one.",
    )
    scale_down: ScaleDown = Field(
        ScaleDown.PROGRESSIVELY,
        description="progressively: the Deployment loses a replica as each of specgate's baseline pods "
        "becomes Ready, so that Ready pods behind your Service never fall below replicas - "
        "maxUnavailable. onSuccess: it goes to 0 at once when specgate's baseline is Ready at replicas "
        "(GPUs for both meanwhile). never: it keeps its replicas (you lower them yourself).",
    )
    on_delete: OnDelete = Field(
        OnDelete.HAND_BACK,
        description="HandBack: deleting the SpeculativeDeployment scales the Deployment back to its "
        "replicas from before the adoption and waits (at most progressDeadline) for its pods to be "
        "Ready before specgate's pods go. Leave: its replicas stay as they are.",
    )
    # Not in the CRD: the operator sets it on the spec it decides with (adopt.resolve), so that
    # the pods' template hash follows the referenced pod template (a GitOps edit is a new rollout).
    template_digest: SkipJsonSchema[str | None] = Field(None, exclude=True)


class SpeculativeDeploymentSpec(Model):
    model: ModelSpec | None = Field(
        None, description="The target model served by vLLM. Required unless workloadRef is set."
    )
    image: str | None = Field(
        None,
        min_length=1,
        description="vLLM server image, e.g. vllm/vllm-openai:v0.32.0. Required unless workloadRef is set.",
    )
    workload_ref: WorkloadRef | None = Field(
        None,
        description="Adopt a running vLLM Deployment instead of rendering one from model, image and "
        "vllmArgs: the baseline runs its pod template, the canary the same with the speculative "
        "flags appended to the vLLM container's args (docs/guides/adopting.md).",
    )
    replicas: int = Field(
        1,
        ge=1,
        description="Replicas serving traffic once the rollout settles. With workloadRef, at least the "
        "Deployment's replicas: a hand-over to fewer pods is refused (it would lose capacity).",
    )
    resources: GPUResources = Field(default_factory=GPUResources, description="Per-replica resources.")
    tensor_parallel_size: int = Field(1, ge=1, description="--tensor-parallel-size; at most resources.gpus.")
    vllm_args: list[str] = Field(
        default_factory=list, description="Extra `vllm serve` arguments, e.g. [--max-model-len, '8192']."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Environment of the vLLM container.")
    model_cache: ModelCache | None = Field(None, description="Volume that caches model weights.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Pod tolerations.")
    pod_annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    pod_labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    pod_template: PodTemplate | None = Field(
        None,
        description="Pod fields for GPU clusters (runtimeClassName, priorityClassName, imagePullSecrets, "
        "serviceAccountName, affinity, topology spread, securityContext, /dev/shm size, volumes).",
    )
    latency_buckets: LatencyBuckets | None = Field(
        None,
        description="The latency histograms' buckets specgate renders (--custom-histogram-buckets): "
        "unset, a ladder 8 % apart from 5 ms to 5 s, on pods made from now on (pods already running "
        "keep theirs until their config changes).",
    )
    speculative: SpeculativeSpec = Field(description="The speculative decoding config under test.")
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="How the rollout is staged and gated."
    )

    @property
    def target(self) -> ModelSpec:
        """The model specgate renders the pods for; an adopted Deployment's container names its own."""
        if self.model is None:
            raise SpecError("model", "the model comes from workloadRef's Deployment, not from the spec")
        return self.model

    @property
    def vllm_image(self) -> str:
        if self.image is None:
            raise SpecError("image", "the image comes from workloadRef's Deployment, not from the spec")
        return self.image

    @property
    def served_name(self) -> str:
        return self.target.served_name or self.target.name

    @property
    def benchmarks(self) -> bool:
        return self.rollout.measurement != MeasurementMode.TRAFFIC

    @property
    def measures_traffic(self) -> bool:
        return self.rollout.measurement != MeasurementMode.BENCHMARK


# --- cross-field rules: one declaration, enforced by the API server (CEL) and by the operator ---


@dataclass(frozen=True)
class Rule:
    """A cross-field rule on one object of the spec, stated once in CEL and once in Python.

    cel is None where CEL cannot express the rule: the API server cannot look inside free-form
    maps, so such a rule is enforced by the operator alone (phase Failed, InvalidSpec).
    check is None where only the API server sees the problem (see _whole_number).
    """

    model: type[Model]
    cel: str | None
    message: str
    field: str  # the offending field, relative to the object the rule sits on
    check: Callable[[Any], bool] | None


def _whole_number(model: type[Model], field: str) -> Rule:
    """The API server stores `2.0` for an integer field as a float, and a CEL rule that reads the
    field then fails with "invalid data, expected int, got float64" reported on the rule's object,
    which may not name the field. This rule, on the field's own object, names it and the fix.
    pydantic reads 2.0 as 2, so the operator has nothing to check."""
    return Rule(
        model,
        f"!has(self.{field}) || int(self.{field}) == self.{field}",
        f"{field} must be a whole number without a decimal point: write 2, not 2.0",
        field,
        None,
    )


def is_http_url(url: str) -> bool:
    """An http(s) URL with a host: what the CEL rule on prometheusUrl accepts (isURL and a scheme)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises ValueError
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not any(c.isspace() for c in url)


_RENDERED_KEYS = (
    "method",
    "model",
    "num_speculative_tokens",
    "draft_tensor_parallel_size",
    "num_speculative_tokens_per_batch_size",
)


def _ranges_overlap(a: BatchSizeRange, b: BatchSizeRange) -> bool:
    return a.min_batch_size <= b.max_batch_size and b.min_batch_size <= a.max_batch_size


_PER_BATCH = "numSpeculativeTokensPerBatchSize"

RULES: tuple[Rule, ...] = (
    Rule(
        SpeculativeSpec,
        "!(self.method in ['eagle3', 'eagle', 'draft_model']) || has(self.draftModel)",
        "draftModel is required for methods eagle3, eagle and draft_model: set it to the draft or head",
        "draftModel",
        lambda s: s.method not in METHODS_NEEDING_DRAFT or s.draft_model is not None,
    ),
    Rule(
        SpeculativeSpec,
        "!(self.method in ['ngram', 'suffix']) || !has(self.draftModel)",
        "draftModel must be empty for methods ngram and suffix: they draft from the prompt, remove it",
        "draftModel",
        lambda s: s.method not in METHODS_WITHOUT_DRAFT or s.draft_model is None,
    ),
    Rule(
        SpeculativeSpec,
        "!has(self.promptLookupMin) || !has(self.promptLookupMax) "
        "|| self.promptLookupMin <= self.promptLookupMax",
        "promptLookupMin must not exceed promptLookupMax",
        "promptLookupMin",
        lambda s: s.prompt_lookup_min is None
        or s.prompt_lookup_max is None
        or s.prompt_lookup_min <= s.prompt_lookup_max,
    ),
    Rule(
        SpeculativeSpec,
        "self.method == 'ngram' || (!has(self.promptLookupMin) && !has(self.promptLookupMax))",
        "promptLookupMin and promptLookupMax apply to method ngram only: remove them",
        "promptLookupMin",
        lambda s: s.method == Method.NGRAM or (s.prompt_lookup_min is None and s.prompt_lookup_max is None),
    ),
    Rule(
        SpeculativeSpec,
        None,  # CEL cannot test keys of a free-form map: the operator enforces it
        "extraConfig must not set tensor_parallel_size (use draftTensorParallelSize) nor method, model, "
        "num_speculative_tokens, draft_tensor_parallel_size or num_speculative_tokens_per_batch_size "
        "(use the typed fields)",
        "extraConfig",
        lambda s: not ({"tensor_parallel_size", *_RENDERED_KEYS} & set(s.extra_config)),
    ),
    Rule(
        EnvVar,
        "has(self.value) != has(self.valueFrom)",
        "set exactly one of value and valueFrom",
        "value",
        lambda e: (e.value is None) != (e.value_from is None),
    ),
    Rule(
        SpeculativeDeploymentSpec,
        "!has(self.resources) || !has(self.resources.gpus) || "
        "(has(self.tensorParallelSize) ? self.tensorParallelSize : 1) <= self.resources.gpus",
        "tensorParallelSize must not exceed resources.gpus: request at least as many GPUs as TP ranks",
        "tensorParallelSize",
        lambda s: s.tensor_parallel_size <= s.resources.gpus,
    ),
    # Integer fields that the rules above read: name them when a float stands in one.
    _whole_number(GPUResources, "gpus"),
    _whole_number(SpeculativeDeploymentSpec, "tensorParallelSize"),
    _whole_number(SpeculativeSpec, "promptLookupMin"),
    _whole_number(SpeculativeSpec, "promptLookupMax"),
    Rule(
        Benchmark,
        "!has(self.dataset) || self.dataset == 'random' || has(self.datasetPath)",
        "datasetPath is required for datasets sharegpt, spec_bench and custom: name the file in the pod",
        "datasetPath",
        lambda b: b.dataset == Dataset.RANDOM or b.dataset_path is not None,
    ),
    Rule(
        Benchmark,
        "!has(self.gateConcurrency) || (has(self.concurrency) ? self.concurrency : "
        f"{list(DEFAULT_CONCURRENCY)}).exists(c, c == self.gateConcurrency)",
        "gateConcurrency must be one of concurrency: add it to the points or pick one of them",
        "gateConcurrency",
        lambda b: b.gate_concurrency is None or b.gate_concurrency in b.concurrency,
    ),
    Rule(
        Benchmark,
        "!has(self.concurrency) || self.concurrency.all(c, int(c) == c)",
        "concurrency points must be whole numbers without a decimal point: write 8, not 8.0",
        "concurrency",
        None,  # as _whole_number: pydantic reads 8.0 as 8
    ),
    _whole_number(Benchmark, "gateConcurrency"),
    Rule(
        RolloutSpec,
        "(has(self.maxSurge) ? self.maxSurge : 1) > 0 || (has(self.maxUnavailable) ? self.maxUnavailable : 0) > 0",
        "maxSurge and maxUnavailable cannot both be 0: no pod could ever be swapped; set maxSurge 1 "
        "(one spare GPU pod) or maxUnavailable 1 (swap one pod at a time)",
        "maxSurge",
        lambda r: r.max_surge > 0 or r.max_unavailable > 0,
    ),
    _whole_number(RolloutSpec, "maxSurge"),
    _whole_number(RolloutSpec, "maxUnavailable"),
    Rule(
        MetricsSource,
        "!has(self.prometheusUrl) || (isURL(self.prometheusUrl) && self.prometheusUrl.matches('^https?://') "
        "&& url(self.prometheusUrl).getHostname() != '')",
        "prometheusUrl must be an http:// or https:// URL with a host, "
        "e.g. http://prometheus-operated.monitoring:9090",
        "prometheusUrl",
        lambda m: m.prometheus_url is None or is_http_url(m.prometheus_url),
    ),
    Rule(
        MetricsSource,
        "!has(self.scrapeInterval) || duration(self.scrapeInterval) >= duration('1s')",
        "scrapeInterval must be at least 1s, e.g. 15s (Prometheus' usual interval)",
        "scrapeInterval",
        lambda m: parse_duration(m.scrape_interval) >= 1,
    ),
    Rule(
        Gates,
        "!has(self.mixDriftTimescale) || duration(self.mixDriftTimescale) >= duration('1s')",
        "mixDriftTimescale must be at least 1s, e.g. 3m (how long a swing of the traffic mix lasts)",
        "mixDriftTimescale",
        lambda g: parse_duration(g.mix_drift_timescale) >= 1,
    ),
    Rule(
        PodTemplate,
        None,  # CEL cannot look inside free-form volumes: the operator enforces it
        "every volume needs a name, and dshm and model-cache are specgate's own (/dev/shm and "
        "modelCache): rename the volume",
        "volumes",
        lambda t: all(v.get("name") and v["name"] not in RENDERED_VOLUMES for v in t.volumes),
    ),
    Rule(
        SpeculativeDeploymentSpec,
        "!has(self.rollout) || (has(self.rollout.strategy) && self.rollout.strategy == 'sequential') "
        "|| (has(self.rollout.canaryReplicas) ? self.rollout.canaryReplicas : 1) "
        "< (has(self.replicas) && self.replicas > 1 ? self.replicas : 2)",
        "canaryReplicas must be less than replicas, so that the baseline serves beside the canary (at "
        "replicas 1, canaryReplicas 1 runs beside it on a spare GPU): lower canaryReplicas, raise "
        "replicas, or use strategy sequential",
        "rollout.canaryReplicas",
        lambda s: s.rollout.strategy == Strategy.SEQUENTIAL or s.rollout.canary_replicas < max(s.replicas, 2),
    ),
    _whole_number(SpeculativeDeploymentSpec, "replicas"),
    _whole_number(RolloutSpec, "canaryReplicas"),
    # numSpeculativeTokensPerBatchSize, as vLLM 0.32 validates it
    # (vllm/v1/spec_decode/dynamic/utils.py::validate_and_normalize_dynamic_sd_schedule)
    Rule(
        BatchSizeRange,
        "self.minBatchSize <= self.maxBatchSize",
        "minBatchSize must not exceed maxBatchSize: a range is inclusive at both ends",
        "minBatchSize",
        lambda r: r.min_batch_size <= r.max_batch_size,
    ),
    Rule(
        SpeculativeSpec,
        f"!has(self.{_PER_BATCH}) || self.{_PER_BATCH}.all(a, self.{_PER_BATCH}.filter(b, "
        "b.minBatchSize <= a.maxBatchSize && a.minBatchSize <= b.maxBatchSize).size() <= 1)",
        f"{_PER_BATCH} ranges must not overlap: each batch size takes one K",
        _PER_BATCH,
        lambda s: s.num_speculative_tokens_per_batch_size is None
        or all(
            sum(_ranges_overlap(a, b) for b in s.num_speculative_tokens_per_batch_size) <= 1
            for a in s.num_speculative_tokens_per_batch_size
        ),
    ),
    Rule(
        SpeculativeSpec,
        f"!has(self.{_PER_BATCH}) || self.{_PER_BATCH}.exists(r, r.minBatchSize == 1)",
        f"{_PER_BATCH} needs a range with minBatchSize 1, so that every batch size has a K",
        _PER_BATCH,
        lambda s: s.num_speculative_tokens_per_batch_size is None
        or any(r.min_batch_size == 1 for r in s.num_speculative_tokens_per_batch_size),
    ),
    Rule(
        SpeculativeSpec,
        f"!has(self.{_PER_BATCH}) || self.{_PER_BATCH}.all(r, r.numSpeculativeTokens <= "
        "(has(self.numSpeculativeTokens) ? self.numSpeculativeTokens : 3))",
        f"{_PER_BATCH} K must not exceed numSpeculativeTokens (vLLM would silently lower it): raise "
        "numSpeculativeTokens to the schedule's largest K",
        _PER_BATCH,
        lambda s: s.num_speculative_tokens_per_batch_size is None
        or all(
            r.num_speculative_tokens <= s.num_speculative_tokens
            for r in s.num_speculative_tokens_per_batch_size
        ),
    ),
    _whole_number(BatchSizeRange, "minBatchSize"),
    _whole_number(BatchSizeRange, "maxBatchSize"),
    _whole_number(BatchSizeRange, "numSpeculativeTokens"),
    _whole_number(SpeculativeSpec, "numSpeculativeTokens"),
    Rule(
        SpeculativeSpec,
        f"!has(self.{_PER_BATCH}Policy) || self.{_PER_BATCH}Policy != 'Auto' || !has(self.{_PER_BATCH})",
        f"{_PER_BATCH} must be empty when {_PER_BATCH}Policy is Auto (the operator derives it): remove "
        "the ranges, or the policy to keep them",
        _PER_BATCH,
        lambda s: s.num_speculative_tokens_per_batch_size_policy != PerBatchSizePolicy.AUTO
        or s.num_speculative_tokens_per_batch_size is None,
    ),
    # spec.rollout.traffic: which router, and for GatewayAPI which route
    Rule(
        Traffic,
        "!has(self.router) || self.router != 'GatewayAPI' || has(self.httpRoute) != has(self.existingRoute)",
        "router GatewayAPI needs exactly one of httpRoute (specgate creates the route from parentRefs) "
        "and existingRoute (specgate sets the backendRefs of one rule of your route): set one of them",
        "httpRoute",
        lambda t: t.router != Router.GATEWAY_API or (t.http_route is None) != (t.existing_route is None),
    ),
    Rule(
        Traffic,
        "(has(self.router) && self.router == 'GatewayAPI') "
        "|| !(has(self.httpRoute) || has(self.existingRoute) || has(self.initialCanaryWeight) "
        "|| has(self.maxCanaryWeight))",
        "httpRoute, existingRoute, initialCanaryWeight and maxCanaryWeight apply to router GatewayAPI "
        "only: set router: GatewayAPI or remove them",
        "router",
        lambda t: t.router == Router.GATEWAY_API
        or (
            t.http_route is None
            and t.existing_route is None
            and t.initial_canary_weight is None
            and t.max_canary_weight is None
        ),
    ),
    Rule(
        RolloutSpec,
        "!has(self.traffic) || !has(self.traffic.initialCanaryWeight) "
        "|| !has(self.measurement) || self.measurement != 'benchmark'",
        "traffic.initialCanaryWeight judges alpha on the canary's production traffic, which measurement "
        "benchmark never reads: set measurement traffic (or both), or remove initialCanaryWeight",
        "traffic.initialCanaryWeight",
        lambda r: r.traffic is None
        or r.traffic.initial_canary_weight is None
        or r.measurement != MeasurementMode.BENCHMARK,
    ),
    Rule(
        ExistingRoute,
        "has(self.ruleName) != has(self.ruleIndex)",
        "set exactly one of ruleName (the rule's spec.rules[].name) and ruleIndex (its position, for "
        "a rule without a name)",
        "ruleName",
        lambda r: (r.rule_name is None) != (r.rule_index is None),
    ),
    Rule(
        RolloutSpec,
        "!has(self.traffic) || !has(self.traffic.router) || self.traffic.router != 'GatewayAPI' "
        "|| !has(self.strategy) || self.strategy == 'canary'",
        "traffic.router GatewayAPI splits traffic between baseline and canary pods, which strategy "
        "sequential never runs side by side: use strategy canary, or router Service",
        "traffic.router",
        lambda r: r.traffic is None
        or r.traffic.router != Router.GATEWAY_API
        or r.strategy == Strategy.CANARY,
    ),
    Rule(
        Guard,
        "!has(self.history) || duration(self.history) >= duration('10m')",
        "history must be at least 10m, e.g. 36h (hours of the promoted config's alpha hold the "
        "guard's false-alarm budget)",
        "history",
        lambda g: parse_duration(g.history) >= 600,
    ),
    # spec.rollout.traffic.backend InferencePool (issue 59)
    Rule(
        Traffic,
        "!has(self.backend) || self.backend != 'InferencePool' "
        "|| (has(self.router) && self.router == 'GatewayAPI')",
        "backend InferencePool weights two InferencePools on an HTTPRoute rule, which needs router "
        "GatewayAPI: set router: GatewayAPI (with httpRoute or existingRoute), or backend: Service",
        "backend",
        lambda t: t.backend != Backend.INFERENCE_POOL or t.router == Router.GATEWAY_API,
    ),
    Rule(
        Traffic,
        "!has(self.backend) || self.backend != 'InferencePool' || (has(self.inferencePool) "
        "&& has(self.inferencePool.endpointPicker) && has(self.inferencePool.endpointPicker.baseline) "
        "&& has(self.inferencePool.endpointPicker.canary))",
        "backend InferencePool needs inferencePool.endpointPicker.baseline and .canary, each the name "
        "and port of the Service of that pool's endpoint picker (specgate deploys no picker): set both",
        "inferencePool",
        lambda t: t.backend != Backend.INFERENCE_POOL
        or (
            t.inference_pool is not None
            and t.inference_pool.endpoint_picker is not None
            and t.inference_pool.endpoint_picker.baseline is not None
            and t.inference_pool.endpoint_picker.canary is not None
        ),
    ),
    Rule(
        Traffic,
        "!has(self.inferencePool) || (has(self.backend) && self.backend == 'InferencePool')",
        "inferencePool applies to backend InferencePool only: set backend: InferencePool or remove it",
        "inferencePool",
        lambda t: t.inference_pool is None or t.backend == Backend.INFERENCE_POOL,
    ),
    # spec.workloadRef: adopt a running Deployment (issue 59)
    Rule(
        SpeculativeDeploymentSpec,
        "has(self.model) || has(self.workloadRef)",
        "model is required: set model.name (specgate renders the vLLM pods), or workloadRef to adopt "
        "a running vLLM Deployment",
        "model",
        lambda s: s.model is not None or s.workload_ref is not None,
    ),
    Rule(
        SpeculativeDeploymentSpec,
        "has(self.image) || has(self.workloadRef)",
        "image is required without workloadRef: set the vLLM image, e.g. vllm/vllm-openai:v0.32.0",
        "image",
        lambda s: s.image is not None or s.workload_ref is not None,
    ),
    Rule(
        SpeculativeDeploymentSpec,
        "!has(self.workloadRef) || (!has(self.model) && !has(self.image) "
        "&& (!has(self.vllmArgs) || size(self.vllmArgs) == 0))",
        "workloadRef takes the model, image and args from the referenced Deployment's container: "
        "remove model, image and vllmArgs (change them in your Deployment)",
        "workloadRef",
        lambda s: s.workload_ref is None or (s.model is None and s.image is None and not s.vllm_args),
    ),
    Rule(
        SpeculativeDeploymentSpec,
        "!has(self.workloadRef) || ((!has(self.env) || size(self.env) == 0) && !has(self.modelCache) "
        "&& (!has(self.nodeSelector) || size(self.nodeSelector) == 0) "
        "&& (!has(self.tolerations) || size(self.tolerations) == 0) && !has(self.podTemplate))",
        "workloadRef runs the referenced Deployment's pod template: set env, modelCache, "
        "nodeSelector, tolerations and podTemplate there, and remove them here",
        "workloadRef",
        lambda s: s.workload_ref is None
        or (
            not (s.env or s.node_selector or s.tolerations)
            and s.model_cache is None
            and s.pod_template is None
        ),
    ),
    Rule(
        SpeculativeDeploymentSpec,
        "!has(self.workloadRef) || !has(self.rollout) || !has(self.rollout.measurement) "
        "|| self.rollout.measurement == 'traffic'",
        "workloadRef measures production traffic only (a benchmark Job needs model and image): set "
        "rollout.measurement: traffic",
        "rollout.measurement",
        lambda s: s.workload_ref is None or s.rollout.measurement == MeasurementMode.TRAFFIC,
    ),
    # spec.latencyBuckets (issue 58)
    Rule(
        LatencyBuckets,
        "!has(self.lowest) || !has(self.highest) || duration(self.highest) > duration(self.lowest)",
        "highest must be above lowest, e.g. lowest 5ms and highest 5s",
        "highest",
        lambda b: parse_duration(b.highest) > parse_duration(b.lowest),
    ),
    Rule(
        LatencyBuckets,
        "!has(self.lowest) || duration(self.lowest) >= duration('1ms')",
        "lowest must be at least 1ms, e.g. 5ms (below it vLLM's steps do not fall)",
        "lowest",
        lambda b: parse_duration(b.lowest) >= 0.001,
    ),
)


class SpecError(ValueError):
    """An invalid object, with the path of the offending field under root and how to fix it."""

    def __init__(self, field: str, message: str, root: str = "spec") -> None:
        super().__init__(f"{root}.{field}: {message}")
        self.field = field
        self.message = message


# --- the object's name: it names every child (one declaration, API server and operator) ---

# Children: Services <name>, <name>-baseline, <name>-canary (a Service's name is a DNS-1035 label),
# Deployments of the same names, and the pod label specgate.dev/deployment=<name> (at most 63).
NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_NAME_LENGTH = 63 - len("-baseline")
NAME_MESSAGE = (
    f"must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters (lowercase letters, digits "
    "and '-', starting with a letter, ending with a letter or digit), because it names the Services "
    "<name>, <name>-baseline and <name>-canary: e.g. rename llama-3.1-8b to llama-3-1-8b"
)
# Names cannot change, so only a create is checked (oldSelf absent): an object created before this
# rule keeps accepting updates, among them the finalizer removal that lets it be deleted.
NAME_CEL = (
    f"oldSelf.hasValue() || (self.metadata.name.size() <= {MAX_NAME_LENGTH} "
    f"&& self.metadata.name.matches('{NAME_PATTERN}'))"
)


def check_name(name: str) -> None:
    """Raise SpecError on metadata.name when the name cannot name every child."""
    if len(name) > MAX_NAME_LENGTH or not re.fullmatch(NAME_PATTERN, name):
        raise SpecError("name", NAME_MESSAGE, root="metadata")


def _wire_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts[-1] += f"[{p}]"
        else:
            parts.append(p)
    return ".".join(parts)


def _rule_violations(obj: Any, path: str) -> list[SpecError]:
    """Walk the parsed spec and evaluate every Rule on the objects it sits on."""
    errors: list[SpecError] = []
    if isinstance(obj, Model):
        for rule in RULES:
            if isinstance(obj, rule.model) and rule.check is not None and not rule.check(obj):
                errors.append(SpecError(_join(path, rule.field), rule.message))
        for name, info in type(obj).model_fields.items():
            errors += _rule_violations(getattr(obj, name), _join(path, info.alias or name))
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            errors += _rule_violations(item, f"{path}[{i}]")
    return errors


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def parse_spec(raw: dict[str, Any]) -> SpeculativeDeploymentSpec:
    """Parse and validate a spec as the operator sees it; raise SpecError naming the first bad field."""
    try:
        spec = SpeculativeDeploymentSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SpecError(_wire_path(first["loc"]), first["msg"]) from exc
    violations = _rule_violations(spec, "")
    if violations:
        raise violations[0]
    return spec


# --- requests in annotations: `kubectl specgate pause|resume|retry|abort` ---

# A person's request lives in an annotation, not in the spec: GitOps tools apply the spec from git
# (Argo CD's three-way merge, Flux's server-side apply) and leave annotations they never wrote, so
# the request is not reverted at the next sync. The spec's own fields keep working beside them.
ANNOTATION_PAUSED = f"{GROUP}/paused"  # "true": hold the rollout, as spec.rollout.paused does
ANNOTATION_RETRY = f"{GROUP}/retry"  # a count, added to spec.rollout.retry (only a rise re-runs)
ANNOTATION_ABORT = f"{GROUP}/abort"  # any value (the CLI writes the time): roll back, stay rolled back


@dataclass(frozen=True)
class Requests:
    paused: bool = False
    retries: int = 0
    abort: str | None = None  # the annotation's value, quoted in the rollback's message


def parse_requests(annotations: Mapping[str, str] | None) -> Requests:
    """The requests in an object's annotations; SpecError naming the annotation when one is malformed."""
    notes = annotations or {}
    paused = notes.get(ANNOTATION_PAUSED, "false")
    if paused not in ("true", "false"):
        raise SpecError(
            f"annotations[{ANNOTATION_PAUSED}]",
            f"{paused!r} is neither 'true' nor 'false': `kubectl specgate pause|resume` sets it",
            root="metadata",
        )
    retries = notes.get(ANNOTATION_RETRY, "0")
    if not re.fullmatch("[0-9]{1,9}", retries):  # not str.isdigit: it takes "²", which int() refuses
        raise SpecError(
            f"annotations[{ANNOTATION_RETRY}]",
            f"{retries!r} is not a whole number: `kubectl specgate retry` counts it up",
            root="metadata",
        )
    return Requests(paused == "true", int(retries), notes.get(ANNOTATION_ABORT))


def with_requests(spec: SpeculativeDeploymentSpec, requests: Requests) -> SpeculativeDeploymentSpec:
    """The spec the rollout follows: paused by either, retried by the sum of both counts."""
    rollout = spec.rollout.model_copy(
        update={
            "paused": spec.rollout.paused or requests.paused,
            "retry": spec.rollout.retry + requests.retries,
        }
    )
    return spec.model_copy(update={"rollout": rollout})


# --- status ---


class Phase(StrEnum):
    PENDING = "Pending"
    BASELINE = "Baseline"
    CANARY = "Canary"
    ANALYZING = "Analyzing"
    PROMOTING = "Promoting"
    PROMOTED = "Promoted"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    PAUSED = "Paused"
    FAILED = "Failed"


class StatusModel(Model):
    """Status written by another operator version may carry fields this one does not know: keep going."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Condition(StatusModel):
    type: str = Field(description="Available, Progressing, Degraded or Ready.")
    status: str = Field(description="True, False or Unknown.")
    reason: str = Field(description="Machine-readable CamelCase reason.")
    message: str = Field("", description="Human message.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="Generation the condition describes.")


class LatencyGateStatus(StatusModel):
    """A latency gate at the canary's latest look: the ratio of the tracks' P99s, its interval, the
    tolerance it is judged against, and how far it is from a verdict."""

    verdict: str = Field(description="Pass, Fail or InsufficientData.")
    ratio: float | None = Field(
        None, description="The canary's P99 over the baseline's; absent until both are read."
    )
    ratio_lower: float | None = Field(
        None, description="Lower bound of the ratio: the gate fails when it is above tolerance."
    )
    ratio_upper: float | None = Field(
        None,
        description="Upper bound of the ratio: the gate passes when it is at most tolerance; absent "
        "beside a ratio while unbounded (no rank of the samples bounds the canary's P99 from above).",
    )
    tolerance: float = Field(description="The ratio the gate allows: 1 + its maxP99...Regression.")
    samples: float = Field(
        description="Samples on the smaller track; for the step stall counted in engine steps, where both "
        "tracks' step counts are known."
    )
    samples_needed: float | None = Field(
        None,
        description="How far from a verdict, where the gate says it: the samples a track needs "
        "(minLatencySamples; the samples a rank needs to bound a P99 from above; or at most about this "
        "many to tell the tolerance at this ratio); absent where it says none.",
    )

    def line(self) -> str:
        """The gate's figures on one line for `specgate status`, its ratio written as alpha and speedup are."""
        ratio = "-"
        if self.ratio is not None:
            upper = "inf" if self.ratio_upper is None else self.ratio_upper
            ratio = f"{self.ratio:.3f} [{self.ratio_lower}, {upper}]"
        needed = "" if self.samples_needed is None else f", needs {self.samples_needed:.0f} samples a track"
        return f"ratio={ratio} tolerance={self.tolerance:g} samples={self.samples:.0f} {self.verdict}{needed}"


class Measurement(StatusModel):
    """Figures of one track over one analysis window (traffic measured by Prometheus)."""

    window_start: str | None = Field(None, description="Start of the window (RFC 3339).")
    window_end: str | None = Field(None, description="End of the window (RFC 3339).")
    p99_itl_ms: float | None = Field(None, description="P99 inter-token latency (stall), ms.")
    mean_itl_ms: float | None = Field(None, description="Mean inter-token latency, ms.")
    p99_ttft_ms: float | None = Field(None, description="P99 time to first token, ms.")
    per_token_latency_ms: float | None = Field(
        None, description="Mean request time per output token, ms (comparable across spec on/off)."
    )
    p99_per_token_latency_ms: float | None = Field(
        None, description="P99 of the requests' time per output token, ms (the per-token latency gate)."
    )
    pods: int | None = Field(None, description="Pods (scrape targets) measured.")
    requests_per_second_per_pod: float | None = Field(None, description="Request rate per pod.")
    running_per_pod: float | None = Field(None, description="Mean running requests per pod.")
    scrape_interval_seconds: float | None = Field(
        None, description="Scrape interval used: the spec's, or the samples' spacing when longer."
    )
    acceptance_window_seconds: float | None = Field(
        None, description="Length of the acceptance windows the acceptance gate counted."
    )
    output_tokens_per_second: float | None = Field(None, description="Generated tokens per second.")
    requests_per_second: float | None = Field(None, description="Finished requests per second.")
    concurrency: float | None = Field(None, description="Mean running requests.")
    alpha: float | None = Field(None, description="Acceptance rate: accepted / draft tokens.")
    alpha_lower: float | None = Field(None, description="Lower confidence bound of alpha.")
    alpha_upper: float | None = Field(None, description="Upper confidence bound of alpha.")
    mean_acceptance_length: float | None = Field(None, description="1 + accepted / drafts.")
    acceptance_per_position: list[float] = Field(
        default_factory=list, description="Unconditional acceptance rate of draft position 0..K-1."
    )
    drafts: float | None = Field(None, description="Drafts observed.")
    speedup: float | None = Field(
        None,
        description="Canary: the baseline's mean time per output token over the canary's over the same "
        "windows (the per-request mean of vllm:request_time_per_output_token_seconds, request-weighted "
        "over paired windows); above 1: the canary is faster.",
    )
    speedup_lower: float | None = Field(None, description="Canary: lower confidence bound of the speedup.")
    speedup_upper: float | None = Field(None, description="Canary: upper confidence bound of the speedup.")
    per_token_latency_gate: LatencyGateStatus | None = Field(
        None, description="Canary: the P99 per-token latency gate (maxP99PerTokenRegression) at this look."
    )
    step_stall_gate: LatencyGateStatus | None = Field(
        None, description="Canary: the P99 step-stall gate (maxP99ItlRegression) at this look."
    )
    output_tokens_per_second_per_pod: float | None = Field(
        None, description="Generated tokens per second per measured pod."
    )
    acceptance_log_lr: float | None = Field(
        None,
        description="Canary: the acceptance test's log likelihood ratio of alpha at minAcceptanceRate + "
        "indifference against minAcceptanceRate - indifference; it passes at +acceptanceBound and fails "
        "at -acceptanceBound.",
    )
    acceptance_bound: float | None = Field(
        None,
        description="Canary: the log likelihood ratio's bound, log((1 - errorRate) / errorRate) less its expected overshoot of one window's step.",
    )
    analysis_deadline: str | None = Field(
        None,
        description="Canary: when maxAnalysisDuration ends (RFC 3339): an acceptance test still between "
        "its bounds there is decided by the estimate's side of the gate.",
    )
    itl_samples: float | None = Field(None, description="Inter-token latency observations.")
    itl_steps: float | None = Field(
        None,
        description="Engine steps behind the inter-token latency observations, which come one per running "
        "request per step (the count of vllm:iteration_tokens_total): the step-stall gate's sample size.",
    )
    itl_bucket_bounds: list[float] = Field(
        default_factory=list,
        description="Baseline only: finite ITL histogram bucket bounds in seconds, kept so the guard "
        "and the sequential strategy compare against the baseline's distribution.",
    )
    itl_bucket_counts: list[float] = Field(
        default_factory=list,
        description="Baseline only: cumulative counts per bound, then the +Inf bucket (one more entry).",
    )
    per_token_bucket_bounds: list[float] = Field(
        default_factory=list, description="Baseline only: as itlBucketBounds, for the per-token latency."
    )
    per_token_bucket_counts: list[float] = Field(
        default_factory=list, description="Baseline only: as itlBucketCounts, for the per-token latency."
    )

    def figures(self) -> str:
        """One line of the track's figures, the same in status messages, the CLI and the demo."""
        line = (
            f"p99_itl_ms={self.p99_itl_ms} p99_ttft_ms={self.p99_ttft_ms} "
            f"p99_per_token_ms={self.p99_per_token_latency_ms} per_token_ms={self.per_token_latency_ms} "
            f"tok/s={self.output_tokens_per_second} req/s/pod={self.requests_per_second_per_pod} "
            f"running/pod={self.running_per_pod}"
        )
        if self.alpha is not None:
            line += f" alpha={self.alpha:.3f} [{self.alpha_lower}, {self.alpha_upper}]"
        if self.speedup is not None:
            line += f" speedup={self.speedup:.3f} [{self.speedup_lower}, {self.speedup_upper}]"
        return line

    def closeness(self) -> str | None:
        """How near the acceptance test is to a verdict, for `specgate status`; None before it ran."""
        if self.acceptance_log_lr is None or self.acceptance_bound is None:
            return None
        llr, bound = self.acceptance_log_lr, self.acceptance_bound
        toward = "Pass" if llr >= 0 else "Fail"
        share = min(abs(llr) / bound, 1.0) if bound > 0 else 1.0
        deadline = f"; by its side of the gate at {self.analysis_deadline}" if self.analysis_deadline else ""
        return (
            f"acceptance log-LR {llr:+.2f}: {share:.0%} of the way to {toward} "
            f"(Pass at +{bound:.2f}, Fail at -{bound:.2f}){deadline}"
        )


class HistoryEntry(StatusModel):
    time: str = Field(description="When (RFC 3339).")
    phase: Phase = Field(description="Phase entered.")
    reason: str = Field(description="Why.")
    message: str = Field("", description="Details with the figures.")


class Recommendation(StatusModel):
    num_speculative_tokens: int = Field(description="Recommended draft length K.")
    expected_speedup: float = Field(description="Expected speedup at that K.")
    message: str = Field("", description="How it was derived.")


class StepCost(StatusModel):
    """A canary's mean step time over the baseline's, at the draft length it ran."""

    k: int = Field(description="Draft length K the canary ran.")
    step_ratio: float = Field(description="The canary's mean step time (ITL) over the baseline's.")
    concurrency: int = Field(description="Running requests when measured: the steps' batch.")
    acceptance_per_position: list[float] = Field(
        default_factory=list,
        description="Accepted tokens per draft at each position, as that canary measured.",
    )
    config: str = Field(
        description="Target, image, method and draft measured; only costs of the same are fitted."
    )
    measured_at: str = Field(description="When it was last measured (RFC 3339).")


class ScheduleSource(StrEnum):
    CANARY_MEASUREMENT = "CanaryMeasurement"
    GATE_ALPHA = "GateAlpha"


class KSchedule(StatusModel):
    """The draft length per batch size derived for numSpeculativeTokensPerBatchSizePolicy Auto."""

    ranges: list[list[int]] = Field(
        description="[minBatchSize, maxBatchSize, K] as rendered into vLLM's "
        "num_speculative_tokens_per_batch_size (K 0: no drafts at those batch sizes)."
    )
    source: ScheduleSource = Field(
        description="The acceptance it rests on: CanaryMeasurement (the per-position acceptance of the "
        "last canary of the same draft) or GateAlpha (gates.minAcceptanceRate, the lowest alpha that "
        "can promote, at a constant per-position rate)."
    )
    acceptance_per_position: list[float] = Field(
        description="P(draft positions 0..i all accepted) the derivation used, i = 0..numSpeculativeTokens-1."
    )
    accelerator: str = Field(description="The accelerator priced, and where it was read.")
    target_params_b: float = Field(description="Billions of target parameters read per GPU and step.")
    draft: str = Field(description="Method and draft model the schedule was derived for.")
    template_hash: str = Field(
        description="The template (status.templateHash) it was derived for: held while that rollout runs."
    )
    derived_at: str = Field(description="When it was derived (RFC 3339).")
    message: str = Field("", description="How it was derived.")


class BenchmarkPoint(StatusModel):
    """One concurrency point of one track's benchmark, as `vllm bench serve` reported it."""

    concurrency: int = Field(description="--max-concurrency of the run.")
    completed: int | None = Field(None, description="Requests completed.")
    failed: int | None = Field(None, description="Requests failed.")
    p99_itl_ms: float | None = Field(None, description="P99 inter-token latency, ms.")
    mean_itl_ms: float | None = Field(None, description="Mean inter-token latency, ms.")
    p99_tpot_ms: float | None = Field(None, description="P99 time per output token, ms.")
    mean_tpot_ms: float | None = Field(None, description="Mean time per output token, ms.")
    p99_ttft_ms: float | None = Field(None, description="P99 time to first token, ms.")
    output_throughput: float | None = Field(None, description="Output tokens per second.")
    acceptance_rate: float | None = Field(
        None, description="Alpha the benchmark read from the server (0..1); absent before vLLM 0.11."
    )
    drafts: int | None = Field(None, description="Drafts during the run, as the benchmark counted them.")
    acceptance_per_position: list[float] = Field(
        default_factory=list, description="Acceptance rate of draft position 0..K-1."
    )


class BenchmarkRun(StatusModel):
    """One track's benchmark Job and its results."""

    job: str = Field(description="The Job's name.")
    start_time: str | None = Field(None, description="When the Job started (RFC 3339).")
    completion_time: str | None = Field(None, description="When it finished (RFC 3339).")
    points: list[BenchmarkPoint] = Field(default_factory=list, description="Results per concurrency.")


class PointComparison(StatusModel):
    """Baseline against canary at one concurrency point."""

    concurrency: int = Field(description="The concurrency point.")
    baseline_p99_itl_ms: float | None = Field(None, description="Baseline P99 ITL, ms.")
    canary_p99_itl_ms: float | None = Field(None, description="Canary P99 ITL, ms.")
    baseline_p99_tpot_ms: float | None = Field(None, description="Baseline P99 time per output token, ms.")
    canary_p99_tpot_ms: float | None = Field(None, description="Canary P99 time per output token, ms.")
    baseline_output_throughput: float | None = Field(None, description="Baseline output tokens/s.")
    canary_output_throughput: float | None = Field(None, description="Canary output tokens/s.")
    speedup: float | None = Field(
        None, description="Baseline mean TPOT / canary mean TPOT: above 1, speculation is faster."
    )
    verdict: str = Field(description="Pass or Fail of the latency gates (per-token and ITL) at this point.")


class BenchmarkStatus(StatusModel):
    baseline: BenchmarkRun | None = Field(None, description="The baseline's benchmark.")
    canary: BenchmarkRun | None = Field(None, description="The canary's benchmark.")
    points: list[PointComparison] = Field(default_factory=list, description="Baseline vs canary per point.")
    gate_concurrency: int | None = Field(None, description="The point the gates applied at.")
    break_even_concurrency: int | None = Field(
        None,
        description="The highest point where speculation was still faster (speedup above 1): the "
        "largest concurrency measured when it was faster at every point (the break-even lies beyond "
        "the curve), unset when it was faster at none.",
    )
    alpha: float | None = Field(None, description="Alpha the gate used.")
    benchmark_alpha: float | None = Field(None, description="Alpha reported by the benchmark.")
    prometheus_alpha: float | None = Field(
        None, description="Alpha from the canary's Prometheus counters over the Job's time range."
    )
    alpha_disagreement: float | None = Field(
        None, description="|benchmarkAlpha - prometheusAlpha|; above 0.02 it is reported as a Warning."
    )


class GuardStatus(StatusModel):
    """The guard's change detector at its latest look (Promoted)."""

    statistic: float = Field(
        description="CUSUM of the log likelihood ratio of alpha at minAcceptanceRate - indifference "
        "against minAcceptanceRate + indifference over the guard's history's blocks: 0 while alpha holds."
    )
    threshold: float = Field(description="The guard rolls back when the statistic reaches this.")
    alpha: float | None = Field(None, description="Alpha over the guard's history.")
    windows: int = Field(0, description="Blocks the statistic ran over (quiet ones included).")
    window_seconds: float | None = Field(None, description="Length of each block.")
    spread: float | None = Field(
        None, description="The blocks' noise per draft token (long-run variance) the CUSUM is scaled by."
    )
    spread_source: str | None = Field(
        None, description="Measured over the history's older blocks, or the rollout's drift until an hour is."
    )
    checked_at: str | None = Field(None, description="When the guard last looked (RFC 3339).")


class RouteWeights(StatusModel):
    baseline: int = Field(
        description="Percent of the route's traffic to <name>-baseline (Service or InferencePool)."
    )
    canary: int = Field(
        description="Percent of the route's traffic to <name>-canary (Service or InferencePool)."
    )


class OriginalRule(StatusModel):
    """The backendRefs a rule of the user's HTTPRoute (traffic.existingRoute) had when specgate took
    it over, recorded once: put back when the object is deleted or stops routing that rule."""

    route: str = Field(description="The HTTPRoute.")
    rule_name: str | None = Field(None, description="The rule's name, as existingRoute named it.")
    rule_index: int | None = Field(None, description="The rule's position, as existingRoute gave it.")
    backend_refs: list[dict[str, Any]] = Field(
        default_factory=list, description="The rule's backendRefs then (empty: it had none)."
    )


class WorkloadStatus(StatusModel):
    """spec.workloadRef: what specgate did to the adopted Deployment (its replicas only)."""

    name: str = Field(description="The adopted Deployment.")
    original_replicas: int = Field(
        description="Its replicas before the adoption: what deleting the SpeculativeDeployment hands back."
    )
    replicas: int | None = Field(None, description="The replicas specgate last set (scale subresource).")
    handed_over: bool = Field(False, description="specgate's pods serve in its place (scaleDown done).")
    message: str = Field("", description="What specgate did to it last, with the figures.")


class TrafficStatus(StatusModel):
    """The route's weights (traffic.router GatewayAPI)."""

    route: str = Field(description="The HTTPRoute whose rule specgate weights.")
    desired: RouteWeights | None = Field(
        None, description="Weights specgate sets now: load-matched, or the initial step's."
    )
    actual: RouteWeights | None = Field(
        None,
        description="Weights in the route's rule once its Gateways accepted that generation (Accepted "
        "and ResolvedRefs; with backend InferencePool, both pools' too); absent until then, and pods "
        "of a track losing weight wait for them.",
    )
    actual_since: str | None = Field(
        None,
        description="When the Gateways accepted the weights in actual: a track they take all "
        "traffic from keeps its last pods until traffic.scaleDownDelay after this.",
    )
    original: OriginalRule | None = Field(
        None,
        description="existingRoute: the rule's own backendRefs, recorded as specgate first set them; "
        "put back when the object is deleted or routes another rule (or router Service).",
    )


class AcceptanceGateStatus(StatusModel):
    """The acceptance gate this rollout judges alpha against (minAcceptanceRatePolicy BreakEven)."""

    min_acceptance_rate: float = Field(description="The gate used in place of spec minAcceptanceRate.")
    source: str = Field(description="How it was derived: break-even alpha, concurrency, K and costs.")


class MixDriftStatus(StatusModel):
    """The traffic mix's drift the acceptance gate allows for in this rollout, and where from."""

    standard_deviation: float = Field(description="Of the mix's swings, in alpha.")
    timescale_seconds: float = Field(description="Their correlation time.")
    source: str = Field(description="Measured from the promoted config's history, or the fallback and why.")
    design_effect: float | None = Field(
        None,
        description="Measured with a drift of 0: the history's spread per draft token over that of "
        "independent tokens, which the acceptance test then takes as known (no allowance for a spread "
        "that looks small by chance).",
    )


class SpeculativeDeploymentStatus(StatusModel):
    phase: Phase = Field(Phase.PENDING, description="Where the rollout is.")
    observed_generation: int | None = Field(None, description="Generation this status describes.")
    reason: str | None = Field(None, description="Machine-readable reason of the last decision.")
    message: str | None = Field(None, description="Human message of the last decision.")
    phase_since: str | None = Field(
        None, description="When the current phase began (Analyzing: when its warm-up ends), RFC 3339."
    )
    analysis_since: str | None = Field(
        None,
        description="Analyzing: where the analysis window begins, after the last hold (the route not "
        "accepted, its weights not the desired ones, the canary above its cap); absent: phase_since.",
    )
    held_since: str | None = Field(
        None, description="Analyzing: since when the analysis has been held (its deadline runs from here)."
    )
    ready_since: str | None = Field(None, description="When the track being measured became Ready.")
    resume_phase: Phase | None = Field(
        None, description="Phase to resume when unpaused, or when a spec that failed is restored."
    )
    template_hash: str | None = Field(
        None,
        description="Hash of what the pods run under this rollout (the spec without replicas and "
        "rollout): a change of it begins a new rollout.",
    )
    passed_template_hash: str | None = Field(
        None, description="The last template that passed the gates (the one that may serve all replicas)."
    )
    baseline_template_hash: str | None = Field(None, description="Template the baseline pods run now.")
    canary_template_hash: str | None = Field(None, description="Template the canary pods run now.")
    rollout_generation: int | None = Field(
        None, description="Generation at which this rollout began (names its benchmark Jobs)."
    )
    observed_retry: int | None = Field(None, description="spec.rollout.retry last seen.")
    unready_since: str | None = Field(
        None, description="Promoted: since when the canary has had fewer Ready pods than replicas."
    )
    metrics_unavailable_since: str | None = Field(
        None, description="Since when metrics have been missing, if they are."
    )
    replicas: int | None = Field(
        None,
        description="Pods of both tracks (the scale subresource's status.replicas, read by an "
        "HorizontalPodAutoscaler or KEDA).",
    )
    selector: str | None = Field(
        None, description="Label selector of both tracks' pods (the scale subresource's, for pod metrics)."
    )
    baseline: Measurement | None = Field(None, description="Baseline figures.")
    canary: Measurement | None = Field(None, description="Canary figures (latest look).")
    benchmark: BenchmarkStatus | None = Field(
        None, description="Benchmark results (spec.rollout.measurement benchmark or both)."
    )
    guard: GuardStatus | None = Field(None, description="The guard's change detector (Promoted).")
    traffic: TrafficStatus | None = Field(None, description="Route weights (traffic.router GatewayAPI).")
    workload: WorkloadStatus | None = Field(
        None, description="spec.workloadRef: the adopted Deployment's hand-over."
    )
    initial_step_passed: str | None = Field(
        None,
        description="traffic.initialCanaryWeight: when alpha passed at that weight (RFC 3339); the "
        "analysis then judges alpha and latency at the load-matched weight.",
    )
    incumbent_since: str | None = Field(
        None, description="The promoted config this rollout replaces: when it was promoted (RFC 3339)."
    )
    incumbent_until: str | None = Field(None, description="... and when this rollout began to replace it.")
    mix_drift: MixDriftStatus | None = Field(
        None, description="The mix's drift the acceptance gate allows for, and where it comes from."
    )
    acceptance_gate: AcceptanceGateStatus | None = Field(
        None,
        description="minAcceptanceRatePolicy BreakEven: the gate this rollout uses, decided as its "
        "analysis began, and how.",
    )
    verdict: str | None = Field(None, description="Pass, Fail, InsufficientData or MetricsUnavailable.")
    recommendation: Recommendation | None = Field(None, description="Draft-length recommendation.")
    step_costs: list[StepCost] = Field(
        default_factory=list,
        description="Step costs canaries of this object measured, the latest per draft length K; the "
        "recommendation fits the engine's extra cost to those of the current config (one K cannot tell "
        "a speculative step's fixed extra from a draft pass's; two or more can). Kept across rollouts.",
    )
    k_schedule: KSchedule | None = Field(
        None,
        description="Draft length per batch size derived for numSpeculativeTokensPerBatchSizePolicy Auto.",
    )
    conditions: list[Condition] = Field(default_factory=list, description="Available/Progressing/Degraded.")
    history: list[HistoryEntry] = Field(default_factory=list, description="Phase changes, newest last.")


def parse_status(raw: dict[str, Any] | None) -> SpeculativeDeploymentStatus:
    """Status as stored; unknown keys (kopf's bookkeeping, other versions' fields) are ignored."""
    return SpeculativeDeploymentStatus.model_validate(raw or {})
