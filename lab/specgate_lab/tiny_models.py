"""Tiny models made offline, for the real vLLM CPU engine: no hub, no downloads.

- `tiny-llama`: a byte-level BPE tokenizer trained here and a random LlamaForCausalLM (hidden 128,
  8 layers: enough for EAGLE-3's default auxiliary hidden-state layers), fixed seed.
- `tiny-llama-eagle3`: an EAGLE-3 head config only (served with --load-format dummy): alpha ~ 0.
- `tiny-llama-noise-<scale>`: the target's weights plus Gaussian noise of `scale` times each
  tensor's standard deviation: a draft with a tunable acceptance rate (scale 0 drafts itself).

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
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>", "<pad>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(SEED)
    config = LlamaConfig(**_llama_shape(len(tokenizer)), bos_token_id=0, eos_token_id=1, pad_token_id=3)
    model = LlamaForCausalLM(config)
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


def make_noise_draft(target: Path, out: Path, scale: float) -> None:
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(SEED + int(scale * 1e6))
    weights = load_file(str(target / "model.safetensors"))
    noisy = {}
    for name, tensor in weights.items():
        std = tensor.float().std() if tensor.numel() > 1 else torch.tensor(0.0)
        noise = torch.randn(tensor.shape, generator=generator) * std * scale
        noisy[name] = (tensor.float() + noise).to(tensor.dtype).contiguous()
    tmp = out.with_name(out.name + ".tmp")
    shutil.copytree(target, tmp, dirs_exist_ok=True)
    save_file(noisy, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tmp.replace(out)


def noise_scale(name: str) -> float | None:
    return float(name.removeprefix(NOISE_PREFIX)) if name.startswith(NOISE_PREFIX) else None


def ensure(models: Path, name: str) -> Path:
    """Make the named tiny model under `models` unless it is there already."""
    out = models / name
    if out.exists():
        return out
    models.mkdir(parents=True, exist_ok=True)
    target = models / TARGET
    if name != TARGET:
        ensure(models, TARGET)
    scale = noise_scale(name)
    if name == TARGET:
        make_target(out)
    elif name == EAGLE3:
        make_eagle3_head(target, out)
    elif scale is not None:
        make_noise_draft(target, out, scale)
    else:
        raise ValueError(f"unknown tiny model {name!r}: {TARGET}, {EAGLE3} or {NOISE_PREFIX}<scale>")
    return out


def main(argv: list[str]) -> None:
    models = Path(argv[0])
    for name in argv[1:] or [TARGET, EAGLE3]:
        print(ensure(models, name))


if __name__ == "__main__":
    main(sys.argv[1:])
