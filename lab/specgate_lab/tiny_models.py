"""Tiny models made offline, for the real vLLM CPU engine: no hub, no downloads.

- `tiny-llama`: a byte-level BPE tokenizer trained here and a random LlamaForCausalLM (hidden 128,
  8 layers: enough for EAGLE-3's default auxiliary hidden-state layers), fixed seed.
- `tiny-llama-eagle3`: an EAGLE-3 head config only (served with --load-format dummy): alpha ~ 0.
- `tiny-llama-noise-<scale>`: the target's weights plus Gaussian noise of `scale` times each
  tensor's standard deviation: a draft with a tunable acceptance rate (scale 0 drafts itself).
- `wide-llama`: a target where speculation pays on a CPU (the benchmark test's): hidden 1024, 12 layers,
  136M parameters, so one decode step reads ~0.5 GB of weights and is bound by memory, not by
  vLLM's per-step overhead; verifying K+1 tokens then costs little more than one. Layers after
  the first write almost nothing to the residual stream (their output projections scaled by
  QUIET_LAYER_SCALE), so a draft made of the first layer predicts the target well.
- `wide-llama-draft-<scale>`: that draft (embeddings, layer 0, final norm and head of the
  target; 12M parameters) plus noise as above.
- `heavy-llama`, `heavy-llama-draft-<scale>`: the same with an MLP three times wider (intermediate
  8192; 1.4 GB, ~80 ms a step on one core), the demo's model: a speculative step there costs 1.26x
  a plain one at concurrency 1 (1.45x on wide-llama), within the default 50 % stall tolerance.

Runs inside the vLLM virtualenv (torch, transformers, tokenizers): `python -m
specgate_lab.tiny_models DIR NAME...`. Heavy imports stay inside functions so the operator's
environment can import this module (for names and paths) without them.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

TARGET = "tiny-llama"
EAGLE3 = "tiny-llama-eagle3"
NOISE_PREFIX = "tiny-llama-noise-"
SEED = 1234
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, MAX_POSITIONS = 128, 8, 4, 2, 256, 2048, 2048
WIDE = "wide-llama"
WIDE_SHAPE = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 12,
              "num_attention_heads": 16, "num_key_value_heads": 4}  # fmt: skip
HEAVY = "heavy-llama"
HEAVY_SHAPE = {**WIDE_SHAPE, "intermediate_size": 8192}
WEIGHT_BOUND = {WIDE: WIDE_SHAPE, HEAVY: HEAVY_SHAPE}  # targets whose drafts are <target>-draft-<scale>
QUIET_LAYER_SCALE = 1e-3
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_WORDS = [
    "the",
    "a",
    "model",
    "draft",
    "token",
    "target",
    "verify",
    "accept",
    "reject",
    "step",
    "fast",
    "slow",
    "cache",
    "serve",
    "request",
    "reply",
    "user",
    "system",
    "prompt",
    "code",
    "function",
    "return",
    "value",
    "list",
    "map",
    "key",
    "data",
    "error",
    "test",
    "build",
    "run",
    "deploy",
    "cluster",
    "node",
    "pod",
    "gpu",
    "memory",
    "batch",
    "queue",
    "latency",
    "tail",
    "rate",
    "speed",
    "good",
    "bad",
    "more",
    "less",
    "time",
    "day",
]


def corpus(lines: int = 4000) -> list[str]:
    """Deterministic text for training the tokenizer: sentences of a small vocabulary."""
    rng = random.Random(SEED)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 20))) for _ in range(lines)]


def make_target(out: Path) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>", "<pad>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    _save_random_llama(out, _llama_shape(len(tokenizer)), tokenizer)


def make_weight_bound_target(tiny: Path, out: Path, shape: dict[str, int]) -> None:
    """A wide or heavy target, with the tiny target's tokenizer; layers 1.. nearly silent (see above)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    _save_random_llama(out, {**_llama_shape(len(tokenizer)), **shape}, tokenizer, quiet_from_layer=1)


def _save_random_llama(
    out: Path, shape: dict[str, Any], tokenizer: Any, quiet_from_layer: int | None = None
) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**shape, bos_token_id=0, eos_token_id=1, pad_token_id=3))
    if quiet_from_layer is not None:
        with torch.no_grad():
            for layer in model.model.layers[quiet_from_layer:]:
                layer.self_attn.o_proj.weight.mul_(QUIET_LAYER_SCALE)
                layer.mlp.down_proj.weight.mul_(QUIET_LAYER_SCALE)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.replace(out)


def _llama_shape(vocab: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": False,
    }


def make_eagle3_head(target: Path, out: Path) -> None:
    """Config only: vLLM serves it with --load-format dummy (random weights)."""
    base = json.loads((target / "config.json").read_text())
    config = {
        **_llama_shape(base["vocab_size"]),
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "draft_vocab_size": base["vocab_size"],
        "target_hidden_size": HIDDEN,
        "torch_dtype": base.get("torch_dtype", "float32"),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))


def make_noise_draft(target: Path, out: Path, scale: float, layers: int | None = None) -> None:
    """The target's weights plus noise; with `layers`, only its first layers (a prefix draft)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(SEED + int(scale * 1e6))
    weights = load_file(str(target / "model.safetensors"))
    noisy = {}
    for name, tensor in weights.items():
        if layers is not None and _layer_index(name) >= layers:
            continue
        std = tensor.float().std() if tensor.numel() > 1 else torch.tensor(0.0)
        noise = torch.randn(tensor.shape, generator=generator) * std * scale
        noisy[name] = (tensor.float() + noise).to(tensor.dtype).contiguous()
    tmp = out.with_name(out.name + ".tmp")
    shutil.copytree(target, tmp, ignore=shutil.ignore_patterns("model.safetensors"), dirs_exist_ok=True)
    save_file(noisy, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if layers is not None:
        config = json.loads((tmp / "config.json").read_text())
        (tmp / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}, indent=2))
    tmp.replace(out)


def _layer_index(tensor_name: str) -> int:
    """model.layers.<i>.… -> i; -1 for tensors outside the layers (embeddings, norm, head)."""
    parts = tensor_name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else -1


def noise_scale(name: str, prefix: str = NOISE_PREFIX) -> float | None:
    return float(name.removeprefix(prefix)) if name.startswith(prefix) else None


def draft_prefix(target: str) -> str:
    return f"{target}-draft-"


def _prefix_draft(name: str) -> tuple[str, float] | None:
    """(target, noise scale) for a first-layer draft of a WEIGHT_BOUND target, else None."""
    for target in WEIGHT_BOUND:
        scale = noise_scale(name, draft_prefix(target))
        if scale is not None:
            return target, scale
    return None


def ensure(models: Path, name: str) -> Path:
    """Make the named tiny model under `models` unless it is there already."""
    out = models / name
    if out.exists():
        return out
    models.mkdir(parents=True, exist_ok=True)
    target = models / TARGET
    if name != TARGET:
        ensure(models, TARGET)
    scale, prefix_draft = noise_scale(name), _prefix_draft(name)
    if name == TARGET:
        make_target(out)
    elif name == EAGLE3:
        make_eagle3_head(target, out)
    elif scale is not None:
        make_noise_draft(target, out, scale)
    elif name in WEIGHT_BOUND:
        make_weight_bound_target(target, out, WEIGHT_BOUND[name])
    elif prefix_draft is not None:
        big, big_scale = prefix_draft
        make_noise_draft(ensure(models, big), out, big_scale, layers=1)
    else:
        known = ", ".join(f"{big}, {draft_prefix(big)}<scale>" for big in WEIGHT_BOUND)
        raise ValueError(f"unknown lab model {name!r}: {TARGET}, {EAGLE3}, {NOISE_PREFIX}<scale>, {known}")
    return out


def main(argv: list[str]) -> None:
    models = Path(argv[0])
    for name in argv[1:] or [TARGET, EAGLE3]:
        print(ensure(models, name))


if __name__ == "__main__":
    main(sys.argv[1:])
