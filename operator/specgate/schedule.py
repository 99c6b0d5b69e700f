"""numSpeculativeTokensPerBatchSizePolicy Auto: the draft length per batch size (pure).

When it is derived. Once per rollout: when the pods' template (status.templateHash) changes, from the
evidence the status holds at that moment, and then held in status.kSchedule until the next rollout.
The template hash leaves the derived ranges out, so a schedule never starts a rollout by itself, and
holding it keeps the canary's rendered pod template fixed, so it never restarts one in flight (an
operator restart or upgrade reads it back from status). A new schedule reaches pods only as the next
rollout's canary, through its gates.

What it rests on, best first:
- CanaryMeasurement: the per-position acceptance the last canary of the same method and draft
  model measured (at least gates.minDrafts drafts), positions past those measured extended at the
  last measured conditional rate. Under a schedule the deeper positions are drafted at fewer batch
  sizes than vLLM's drafts counter counts, so they read low: the evidence errs towards shorter K;
- GateAlpha: gates.minAcceptanceRate at a constant conditional rate over numSpeculativeTokens, the
  lowest alpha that can promote, so the schedule is right for the worst canary the gates let through.
The cost model prices the accelerator named by the nodeSelector or affinity label
nvidia.com/gpu.product, a target of the size in the model's name (per GPU under tensor parallelism)
and the method's draft, over batch sizes 1 to --max-num-seqs (vLLM's default 256 otherwise).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from specgate import planning, render
from specgate.api import (
    BatchSizeRange,
    KSchedule,
    Method,
    PerBatchSizePolicy,
    ScheduleSource,
    SpeculativeDeploymentSpec,
    SpeculativeDeploymentStatus,
    iso,
)

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # NVIDIA GPU feature discovery, e.g. NVIDIA-H100-80GB-HBM3
DEFAULT_ACCELERATOR = "H100"
DEFAULT_PARAMS_B = 8.03
DEFAULT_MAX_BATCH = 256  # vLLM's max_num_seqs when --max-num-seqs is not given
_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z0-9])")  # "Llama-3.1-8B" -> 8
_DRAFTS = {
    Method.EAGLE3: "eagle3",
    Method.EAGLE: "eagle",
    Method.MTP: "eagle",  # one decoder layer and the target's LM head, as an EAGLE head
    Method.DRAFT_MODEL: "draft_model",
    Method.NGRAM: "none",
    Method.SUFFIX: "none",
}


@dataclass(frozen=True)
class Hardware:
    accelerator: str
    accelerator_from: str
    params_b: float  # per GPU
    params_from: str
    max_batch: int


@dataclass(frozen=True)
class Evidence:
    prefix: list[float]  # P(positions 0..i accepted)
    source: ScheduleSource
    description: str


def resolve(
    spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus, now: datetime
) -> tuple[SpeculativeDeploymentSpec, KSchedule | None]:
    """The spec the pods render (Auto's ranges filled in) and the schedule status shows: the one
    held for this template, or one derived now for a template that has none."""
    if spec.speculative.num_speculative_tokens_per_batch_size_policy != PerBatchSizePolicy.AUTO:
        return spec, None
    template = render.template_hash(spec)
    held = status.k_schedule
    schedule = held if held is not None and held.template_hash == template else derive(spec, status, now)
    ranges = [
        BatchSizeRange(min_batch_size=a, max_batch_size=b, num_speculative_tokens=k)
        for a, b, k in schedule.ranges
    ]
    speculative = spec.speculative.model_copy(update={"num_speculative_tokens_per_batch_size": ranges})
    return spec.model_copy(update={"speculative": speculative}), schedule


def derive(spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus, now: datetime) -> KSchedule:
    hw = hardware(spec)
    evidence = acceptance_evidence(spec, status)
    ranges = planning.k_schedule(cost_model(spec, hw), evidence.prefix, hw.max_batch)
    return KSchedule(
        ranges=[list(r) for r in ranges],
        source=evidence.source,
        acceptance_per_position=[round(u, 4) for u in evidence.prefix],
        accelerator=f"{hw.accelerator} ({hw.accelerator_from})",
        target_params_b=round(hw.params_b, 3),
        draft=draft_key(spec),
        template_hash=render.template_hash(spec),
        derived_at=iso(now),
        message=f"from {evidence.description}; {hw.accelerator} ({hw.accelerator_from}), "
        f"{hw.params_b:g}B target per GPU ({hw.params_from}), {_DRAFTS[spec.speculative.method]} drafts, "
        f"batch sizes 1..{hw.max_batch}",
    )


def draft_key(spec: SpeculativeDeploymentSpec) -> str:
    return f"{spec.speculative.method.value} {spec.speculative.draft_model or '-'}"


def acceptance_evidence(spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus) -> Evidence:
    k = spec.speculative.num_speculative_tokens
    canary, held = status.canary, status.k_schedule
    same_draft = held is not None and held.draft == draft_key(spec)
    drafts = canary.drafts if canary is not None and canary.acceptance_per_position else None
    if same_draft and canary is not None and drafts is not None and drafts >= spec.rollout.gates.min_drafts:
        measured = [min(max(u, 0.0), 1.0) for u in canary.acceptance_per_position[:k]]
        return Evidence(
            planning.extend_prefix(measured, k),
            ScheduleSource.CANARY_MEASUREMENT,
            f"the last canary's per-position acceptance ({drafts:g} drafts, {len(measured)} positions measured)",
        )
    gate = spec.rollout.gates.min_acceptance_rate
    rate = planning.conditional_for_alpha(gate, k)
    return Evidence(
        planning.prefix_from_conditional([rate] * k),
        ScheduleSource.GATE_ALPHA,
        f"gates.minAcceptanceRate {gate} at K={k} (conditional rate {rate:.3f}; no canary of this "
        "draft measured yet)",
    )


def _model_name(spec: SpeculativeDeploymentSpec) -> str:
    """The model's name, where the spec has it (an adopted Deployment's is in its container args)."""
    return spec.model.name if spec.model is not None else ""


def hardware(spec: SpeculativeDeploymentSpec) -> Hardware:
    accelerator, accelerator_from = _accelerator(spec)
    match = _SIZE.search(_model_name(spec))
    params_b = float(match.group(1)) if match else DEFAULT_PARAMS_B
    params_from = "the model name" if match else f"assumed {DEFAULT_PARAMS_B}B: no size in the model name"
    if spec.tensor_parallel_size > 1:
        params_from += f", split over tensorParallelSize {spec.tensor_parallel_size}"
    return Hardware(
        accelerator,
        accelerator_from,
        params_b / spec.tensor_parallel_size,
        params_from,
        _max_num_seqs(spec.vllm_args) or DEFAULT_MAX_BATCH,
    )


def cost_model(spec: SpeculativeDeploymentSpec, hw: Hardware) -> planning.CostModel:
    fp8 = "fp8" in _model_name(spec).lower()
    draft_size = _SIZE.search(spec.speculative.draft_model or "")
    return planning.CostModel.for_hardware(
        hw.accelerator,
        hw.params_b,
        _DRAFTS[spec.speculative.method],
        float(draft_size.group(1)) if draft_size else 1.24,
        1.0 if fp8 else 2.0,
    )


def _accelerator(spec: SpeculativeDeploymentSpec) -> tuple[str, str]:
    for where, product in _gpu_products(spec):
        known = next((name for name in planning.ACCELERATORS if name in product.upper()), None)
        if known is not None:
            return known, f"{where} {GPU_PRODUCT_LABEL}={product}"
    return DEFAULT_ACCELERATOR, f"assumed: no known {GPU_PRODUCT_LABEL} in nodeSelector or affinity"


def _gpu_products(spec: SpeculativeDeploymentSpec) -> Iterator[tuple[str, str]]:
    if GPU_PRODUCT_LABEL in spec.node_selector:
        yield "nodeSelector", spec.node_selector[GPU_PRODUCT_LABEL]
    affinity: dict[str, Any] = (spec.pod_template.affinity if spec.pod_template else None) or {}
    required = affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
    for term in required.get("nodeSelectorTerms", []):
        for expression in term.get("matchExpressions", []):
            if expression.get("key") == GPU_PRODUCT_LABEL and expression.get("operator") == "In":
                yield from (("podTemplate.affinity", str(v)) for v in expression.get("values", []))


def _max_num_seqs(args: list[str]) -> int | None:
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--max-num-seqs=") else None
        if arg == "--max-num-seqs" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return None
