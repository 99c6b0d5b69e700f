"""Measure noise scale -> alpha for the noisy tiny drafts with the real vLLM CPU engine.

`python -m specgate_lab.calibrate [SCALE ...]` starts one engine per scale (draft_model, K=4),
sends the fixed prompt set greedily, reads alpha from the engine's own counters and writes
lab/specgate_lab/calibration.json. Tests then ask for "a draft with alpha about 0.6".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from specgate.vllm_metrics import SPEC_DECODE_NUM_ACCEPTED_TOKENS, SPEC_DECODE_NUM_DRAFT_TOKENS, total
from specgate_lab.engines import engine_command
from specgate_lab.tiny_models import NOISE_PREFIX

CALIBRATION = Path(__file__).with_name("calibration.json")
K = 4
PROMPTS = (
    "the model drafts token target",
    "cluster node pod gpu memory",
    "user system prompt code function",
    "latency tail rate speed good",
    "build run deploy test data",
)
MAX_TOKENS = 64


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def real_engine(serve_args: list[str], log: Path, startup_timeout: float = 600) -> Iterator[str]:
    """A real vLLM CPU engine on a free loopback port for the duration of the block."""
    port = free_port()
    argv, env = engine_command("vllm", serve_args, port, {})
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"engine did not start ({argv}); log tail:\n{log.read_text()[-3000:]}")
            time.sleep(2)
        yield url
    finally:
        stop(proc, timeout=30)


def stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def answers_ok(url: str) -> bool:
    """The URL answers 200 within 2 s (a health or readiness endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _healthy(url: str) -> bool:
    return answers_ok(f"{url}/health")


def complete(url: str, model: str, prompt: str, max_tokens: int = MAX_TOKENS) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as resp:
        resp.read()


def concurrent_completions(url: str, model: str, clients: int, requests: int, max_tokens: int) -> None:
    """`clients` clients at once, each sending `requests` completions one after another (prompts in
    turn), returning when all are answered."""

    def client(index: int) -> None:
        for r in range(requests):
            complete(url, model, PROMPTS[(index + r) % len(PROMPTS)], max_tokens=max_tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def counter(url: str, name: str) -> float:
    """Sum of a counter over its series (engines, labels) in the engine's own /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def measured_alpha(url: str, model: str) -> float:
    for prompt in PROMPTS:
        complete(url, model, prompt)
    drafted = counter(url, total(SPEC_DECODE_NUM_DRAFT_TOKENS))
    return counter(url, total(SPEC_DECODE_NUM_ACCEPTED_TOKENS)) / drafted


def draft_args(draft: str) -> list[str]:
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": K}
    return ["specgate/tiny-llama", "--served-model-name", "tiny", "--max-model-len", "512",
            "--speculative-config", json.dumps(config)]  # fmt: skip


def calibrate(scales: list[float], log_dir: Path) -> dict[str, float]:
    table: dict[str, float] = {}
    for scale in scales:
        draft = f"specgate/{NOISE_PREFIX}{scale:g}"
        with real_engine(draft_args(draft), log_dir / f"calibrate-{scale:g}.log") as url:
            table[f"{scale:g}"] = round(measured_alpha(url, "tiny"), 4)
        print(f"noise {scale:g}: alpha {table[f'{scale:g}']}", flush=True)
    return table


def draft_for_alpha(target_alpha: float) -> tuple[str, float]:
    """The calibrated noisy draft whose alpha is closest to target_alpha: (model name, its alpha)."""
    table: dict[str, float] = json.loads(CALIBRATION.read_text())["alpha_by_noise"]
    scale, alpha = min(table.items(), key=lambda item: abs(item[1] - target_alpha))
    return f"specgate/{NOISE_PREFIX}{scale}", alpha


def cpu_model() -> str:
    """The CPU a calibration holds for: random tiny models have tiny logit margins, so the CPU's
    bf16 kernels decide some greedy tokens, and a draft's alpha differs from one CPU to another."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


DEFAULT_SCALES = [0.0, 0.01, 0.02, 0.03, 0.05, 0.1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="specgate_lab.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "scales", metavar="SCALE", type=float, nargs="*", default=DEFAULT_SCALES,
        help=f"noise scales of the tiny drafts to measure (default: {' '.join(map(str, DEFAULT_SCALES))}); "
        "engine logs go to /tmp/calibrate-SCALE.log",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    scales: list[float] = parse_args(argv).scales
    table = calibrate(scales, Path("/tmp"))
    CALIBRATION.write_text(
        json.dumps(
            {"method": "draft_model", "num_speculative_tokens": K, "max_tokens": MAX_TOKENS,
             "prompts": list(PROMPTS), "greedy": True, "cpu": cpu_model(), "alpha_by_noise": table},
            indent=2,
        ) + "\n"
    )  # fmt: skip


if __name__ == "__main__":
    main()
