"""Start local engines for integration tests: the real vLLM CPU engine or the simulator."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from specgate import vllm_metrics
from specgate_lab.calibrate import _healthy, free_port, real_engine

__all__ = ["SPEC_FAMILIES", "metric_families", "real_engine", "scrape", "sim_engine", "spec_args"]


# The spec-decode families vLLM exports only when a speculative config is set.
SPEC_FAMILIES = {
    vllm_metrics.SPEC_DECODE_NUM_DRAFTS,
    vllm_metrics.SPEC_DECODE_NUM_DRAFT_TOKENS,
    vllm_metrics.SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    vllm_metrics.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
}


def spec_args(speculative: dict[str, object] | None = None, *extra: str) -> list[str]:
    args = ["specgate/tiny-llama", "--served-model-name", "tiny", "--max-model-len", "512", *extra]
    return args + (["--speculative-config", json.dumps(speculative)] if speculative else [])


@contextmanager
def sim_engine(serve_args: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgate_lab.sim", *serve_args, "--port", str(port)],
        env={**__import__("os").environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while not _healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, "simulator did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def metric_families(text: str) -> dict[str, tuple[str, frozenset[str], tuple[float, ...]]]:
    """name -> (type, label names, histogram bucket bounds) of the vllm: families in a scrape."""
    families = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:"):
            continue
        labels = frozenset(k for s in family.samples for k in s.labels if k not in ("le", "quantile"))
        bounds = tuple(sorted({float(s.labels["le"]) for s in family.samples if "le" in s.labels}))
        families[family.name] = (family.type, labels, bounds)
    return families


def log_dir(tmp: Path) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp
