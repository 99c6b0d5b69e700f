"""The lab's wide and heavy models are what the README says: a target whose later layers barely write to the
residual stream, and a draft that is its first layer (read from the files `make engines` made)."""

from __future__ import annotations

import json
import subprocess

import pytest

from specgate_lab.engines import MODELS, VLLM_VENV
from specgate_lab.tiny_models import HEAVY, QUIET_LAYER_SCALE, WEIGHT_BOUND, WIDE, draft_prefix

pytestmark = pytest.mark.engine

# Runs in the vLLM venv (torch): per tensor, the draft's relative distance from the target's, and
# the ratio of each quiet layer's output projections to the first layer's.
PROBE = """
import json, sys, torch
from safetensors.torch import load_file
target, draft = load_file(sys.argv[1]), load_file(sys.argv[2])
def rms(t): return t.float().pow(2).mean().sqrt().item()
noise = {k: rms(draft[k] - target[k]) / rms(target[k]) for k in draft}
first = {p: rms(target[f"model.layers.0.{p}.weight"]) for p in ("self_attn.o_proj", "mlp.down_proj")}
layers = int(sys.argv[3])
quiet = [rms(target[f"model.layers.{i}.{p}.weight"]) / first[p] for i in range(1, layers) for p in first]
print(json.dumps({"noise": noise, "quiet": quiet, "target": sorted(target)}))
"""


@pytest.mark.parametrize(("name", "noise"), [(WIDE, 0.05), (HEAVY, 0.03)])
def test_the_draft_is_the_targets_first_layer_with_noise(name: str, noise: float) -> None:
    shape = WEIGHT_BOUND[name]
    target, draft = MODELS / name, MODELS / f"{draft_prefix(name)}{noise}"
    config, draft_config = (json.loads((d / "config.json").read_text()) for d in (target, draft))
    assert config["intermediate_size"] == shape["intermediate_size"]
    layers = shape["num_hidden_layers"]
    assert config["num_hidden_layers"] == layers and draft_config["num_hidden_layers"] == 1
    assert {k: v for k, v in draft_config.items() if k != "num_hidden_layers"} == {
        k: v for k, v in config.items() if k != "num_hidden_layers"
    }
    out = subprocess.run(
        [str(VLLM_VENV / "bin" / "python"), "-c", PROBE,
         str(target / "model.safetensors"), str(draft / "model.safetensors"), str(layers)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    probe = json.loads(out.stdout)
    outside_layers = {k for k in probe["target"] if not k.startswith("model.layers.")}
    first_layer = {k for k in probe["target"] if k.startswith("model.layers.0.")}
    assert set(probe["noise"]) == outside_layers | first_layer
    # Noise of each tensor's spread (norm weights are constant: no spread, no noise).
    noisy = {k for k, v in probe["noise"].items() if v == pytest.approx(noise, rel=0.1)}
    assert noisy == {k for k in probe["noise"] if not k.endswith("norm.weight")}, probe["noise"]
    assert all(probe["noise"][k] == 0 for k in set(probe["noise"]) - noisy)
    assert len(probe["quiet"]) == 2 * (layers - 1)
    assert max(probe["quiet"]) == pytest.approx(QUIET_LAYER_SCALE, rel=0.1)
    assert min(probe["quiet"]) == pytest.approx(QUIET_LAYER_SCALE, rel=0.1)
