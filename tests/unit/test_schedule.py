"""numSpeculativeTokensPerBatchSizePolicy Auto: derivation, holding per rollout, rendering."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.rollout_driver import T0

from specgate import api, planning, render, schedule
from specgate.api import Measurement, ScheduleSource, SpeculativeDeploymentStatus
from specgate.cli import render_timeline
from specgate.render import Track

EAGLE_HEAD = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
OWNER = render.Owner(name="llama", namespace="ml", uid="u-1")


def auto_spec(**fields: Any) -> api.SpeculativeDeploymentSpec:
    raw: dict[str, Any] = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "image": "vllm/vllm-openai:v0.32.0",
        "speculative": {
            "method": "eagle3",
            "draftModel": EAGLE_HEAD,
            "numSpeculativeTokens": 7,
            "numSpeculativeTokensPerBatchSizePolicy": "Auto",
        },
        "rollout": {"gates": {"minDrafts": 200}},
    }
    raw.update(fields)
    return api.parse_spec(raw)


def canary(per_position: list[float], drafts: float) -> Measurement:
    return Measurement(acceptance_per_position=per_position, drafts=drafts)


def covers_every_batch_size(ranges: list[list[int]], max_batch: int) -> bool:
    starts = [r[0] for r in ranges]
    ends = [r[1] for r in ranges]
    return (
        starts[0] == 1
        and ends[-1] == max_batch
        and all(s == e + 1 for s, e in zip(starts[1:], ends[:-1], strict=True))
    )


def test_without_evidence_the_gate_alpha_prices_an_h100_8b_target() -> None:
    """No canary yet: gates.minAcceptanceRate. With the physics of an H100 (a verify pass nearly
    free at small batch, not at 256), long drafts at batch 1 and shorter ones at the largest batch."""
    spec = auto_spec()
    _, derived = schedule.resolve(spec, SpeculativeDeploymentStatus(), T0)
    assert derived is not None
    assert derived.source == ScheduleSource.GATE_ALPHA
    assert derived.accelerator.startswith("H100 (assumed")
    assert derived.target_params_b == 8
    assert covers_every_batch_size(derived.ranges, 256)
    ks = [k for _, _, k in derived.ranges]
    assert ks == sorted(ks, reverse=True), "K never grows with the batch"
    assert 3 <= ks[0] <= 7 and ks[-1] < ks[0]
    assert len(derived.acceptance_per_position) == 7
    assert "gates.minAcceptanceRate 0.55" in derived.message


def test_the_accelerator_size_and_batch_bound_come_from_the_spec() -> None:
    spec = auto_spec(
        model={"name": "meta-llama/Llama-3.3-70B-Instruct"},
        tensorParallelSize=2,
        resources={"gpus": 2},
        nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        vllmArgs=["--max-num-seqs", "64"],
    )
    hw = schedule.hardware(spec)
    assert (hw.accelerator, hw.params_b, hw.max_batch) == ("A100", 35.0, 64)
    assert "nodeSelector nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB" in hw.accelerator_from
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L40S"]}]}
    ]}}}  # fmt: skip
    spec = auto_spec(podTemplate={"affinity": affinity}, vllmArgs=["--max-num-seqs=32"])
    hw = schedule.hardware(spec)
    assert (hw.accelerator, hw.max_batch) == ("L40S", 32)


def test_a_canary_that_accepts_everything_drafts_the_longest_k_at_batch_1() -> None:
    """Every draft accepted: at batch 1 on an H100 the verify pass costs about a plain step, so the
    longest draft allowed wins there."""
    spec = auto_spec()
    held = schedule.derive(spec, SpeculativeDeploymentStatus(), T0).model_copy(
        update={"template_hash": "old"}
    )
    status = SpeculativeDeploymentStatus(k_schedule=held, canary=canary([1.0] * 7, 5000))
    derived = schedule.derive(spec, status, T0)
    assert derived.source == ScheduleSource.CANARY_MEASUREMENT
    assert derived.ranges[0][:1] == [1] and derived.ranges[0][2] == 7


def test_a_canary_that_accepts_almost_nothing_turns_drafting_off() -> None:
    """5 % of first positions accepted: no batch size gains from drafting (K 0 everywhere)."""
    spec = auto_spec()
    held = schedule.derive(spec, SpeculativeDeploymentStatus(), T0).model_copy(
        update={"template_hash": "old"}
    )
    status = SpeculativeDeploymentStatus(k_schedule=held, canary=canary([0.05, 0.0025], 5000))
    assert schedule.derive(spec, status, T0).ranges == [[1, 256, 0]]


@pytest.mark.parametrize(
    ("draft", "drafts"),
    [("other/head", 5000), (EAGLE_HEAD, 100)],  # another draft's canary; too few drafts (minDrafts 200)
)
def test_a_canary_of_another_draft_or_with_too_few_drafts_is_no_evidence(draft: str, drafts: float) -> None:
    spec = auto_spec()
    other = auto_spec(speculative={**spec.speculative.model_dump(by_alias=True), "draftModel": draft})
    held = schedule.derive(other, SpeculativeDeploymentStatus(), T0).model_copy(update={"template_hash": "x"})
    status = SpeculativeDeploymentStatus(k_schedule=held, canary=canary([1.0] * 7, drafts))
    assert schedule.derive(spec, status, T0).source == ScheduleSource.GATE_ALPHA


def test_measured_positions_extend_at_the_last_conditional_rate() -> None:
    assert planning.extend_prefix([0.8, 0.4], 4) == [0.8, 0.4, 0.2, 0.1]
    assert planning.extend_prefix([0.5], 3) == [0.5, 0.25, 0.125]
    assert planning.extend_prefix([0.9, 0.8, 0.7], 2) == [0.9, 0.8]


def test_a_held_schedule_stays_for_its_rollout_whatever_the_canary_measures() -> None:
    """Within one template the schedule never changes: the canary's pods would restart mid-analysis."""
    spec = auto_spec()
    _, first = schedule.resolve(spec, SpeculativeDeploymentStatus(), T0)
    assert first is not None
    measured = SpeculativeDeploymentStatus(k_schedule=first, canary=canary([0.05, 0.0025], 5000))
    resolved, held = schedule.resolve(spec, measured, T0 + timedelta(hours=1))
    assert held == first
    assert render.deployment(resolved, OWNER, Track.CANARY, 1) == render.deployment(
        schedule.resolve(spec, SpeculativeDeploymentStatus(), T0)[0], OWNER, Track.CANARY, 1
    )


def test_a_new_template_derives_again_from_the_last_canary() -> None:
    spec = auto_spec()
    _, first = schedule.resolve(spec, SpeculativeDeploymentStatus(), T0)
    assert first is not None
    edited = auto_spec(image="vllm/vllm-openai:v0.32.1")
    status = SpeculativeDeploymentStatus(k_schedule=first, canary=canary([0.05, 0.0025], 5000))
    _, second = schedule.resolve(edited, status, T0 + timedelta(hours=1))
    assert second is not None
    assert (second.source, second.ranges, second.template_hash) == (
        ScheduleSource.CANARY_MEASUREMENT,
        [[1, 256, 0]],
        render.template_hash(edited),
    )


def test_the_derived_ranges_are_rendered_but_start_no_rollout() -> None:
    spec = auto_spec()
    resolved, derived = schedule.resolve(spec, SpeculativeDeploymentStatus(), T0)
    assert derived is not None
    config = json.loads(render.vllm_args(resolved, Track.CANARY)[-1])
    assert config["num_speculative_tokens_per_batch_size"] == derived.ranges
    assert config["num_speculative_tokens"] == 7
    assert render.template_hash(resolved) == render.template_hash(spec) == derived.template_hash
    assert "--speculative-config" not in render.vllm_args(resolved, Track.BASELINE)


def test_explicit_and_unset_policies_derive_nothing() -> None:
    explicit = auto_spec(
        speculative={"method": "ngram", "numSpeculativeTokensPerBatchSizePolicy": "Explicit"}
    )
    unset = auto_spec(speculative={"method": "ngram"})
    for spec in (explicit, unset):
        assert schedule.resolve(spec, SpeculativeDeploymentStatus(), T0) == (spec, None)
    # Explicit is what unset means: writing it out starts no rollout; Auto does
    assert render.template_hash(explicit) == render.template_hash(unset)
    auto = auto_spec(speculative={"method": "ngram", "numSpeculativeTokensPerBatchSizePolicy": "Auto"})
    assert render.template_hash(auto) != render.template_hash(unset)


def test_specgate_status_shows_the_schedule_and_its_source() -> None:
    _, derived = schedule.resolve(auto_spec(), SpeculativeDeploymentStatus(), T0)
    assert derived is not None
    held = derived.model_copy(update={"ranges": [[1, 64, 7], [65, 256, 4]]})
    text = render_timeline("llama", SpeculativeDeploymentStatus(k_schedule=held))
    assert "  schedule [[1, 64, 7], [65, 256, 4]] (GateAlpha: from gates.minAcceptanceRate 0.55" in text


@pytest.mark.parametrize("method", list(api.Method))
def test_every_method_is_priced(method: api.Method) -> None:
    """A method the cost model cannot price would fail every reconcile of an Auto object."""
    draft = None if method in api.METHODS_WITHOUT_DRAFT else "org/Llama-3.2-1B"
    spec = auto_spec(speculative={"method": method.value, "draftModel": draft, "numSpeculativeTokens": 3,
                                  "numSpeculativeTokensPerBatchSizePolicy": "Auto"})  # fmt: skip
    _, derived = schedule.resolve(spec, SpeculativeDeploymentStatus(), T0)
    assert derived is not None and derived.ranges[0][0] == 1
