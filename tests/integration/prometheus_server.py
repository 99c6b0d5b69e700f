"""A private Prometheus for a test: one scrape job at a chosen interval over file_sd targets.

Flavour "3" is the lab's Prometheus 3 ($SPECGATE_CACHE/bin/prometheus3, built by `make binaries`);
"2" is Debian's 2.x (/usr/bin/prometheus, installed by `make cluster-up`). Targets are JSON files in
the yielded directory, in the shape the lab's bridge writes (write_target).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from specgate_lab.calibrate import answers_ok, free_port, stop

CACHE = Path(os.environ.get("SPECGATE_CACHE") or Path.home() / ".cache" / "specgate")
BINARIES = {
    "3": (CACHE / "bin" / "prometheus3", "make binaries"),
    "2": (Path("/usr/bin/prometheus"), "make cluster-up"),
}
READY_TIMEOUT_S = 60.0


def prometheus_binary(flavour: str) -> Path:
    """The Prometheus of a flavour ("3" or "2"); the test fails, saying how to get it, without it."""
    if flavour not in BINARIES:
        raise ValueError(f"Prometheus flavour {flavour!r}: expected one of {sorted(BINARIES)}")
    binary, how = BINARIES[flavour]
    if not os.access(binary, os.X_OK):
        pytest.fail(f"Prometheus {flavour} is missing: no {binary} (run `{how}`)", pytrace=False)
    return binary


def prometheus_version(flavour: str) -> str:
    """What `prometheus --version` reports, e.g. "3.16.0"."""
    out = subprocess.run(
        [prometheus_binary(flavour), "--version"], capture_output=True, text=True, check=True, timeout=30
    )
    first = (out.stdout or out.stderr).splitlines()[0]  # "prometheus, version 3.16.0 (branch: ...)"
    return first.split("version ", 1)[1].split()[0]


def write_target(targets: Path, name: str, url: str, labels: Mapping[str, str]) -> Path:
    """Write one file_sd target group as the bridge does (atomically: Prometheus never reads half a
    file): [{"targets": ["127.0.0.1:PORT"], "labels": {...}}]."""
    path = targets / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": [url.removeprefix("http://")], "labels": dict(labels)}], indent=1))
    tmp.replace(path)
    return path


def _duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as "15s", anything else in milliseconds."""
    if seconds <= 0:
        raise ValueError(f"scrape interval must be positive, got {seconds}")
    return f"{seconds:.0f}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


@contextmanager
def prometheus_server(
    tmp_path: Path,
    scrape_interval_s: float,
    flavour: str = "3",
    *,
    web_config: Path | None = None,
    ready: Callable[[str], bool] | None = None,
    targets: Path | None = None,
) -> Iterator[tuple[str, Path]]:
    """Start a Prometheus of `flavour` on a free loopback port, scraping the targets in
    tmp_path/targets/*.json (file_sd, re-read every second) every `scrape_interval_s` seconds; yield
    its base URL and the targets directory; stop it at exit. With `web_config` (--web.config.file,
    which must set tls_server_config) the URL is https:// and `ready(url)` tells when it answers,
    since /-/ready then needs the test's CA and credentials. With `targets`, it scrapes that
    directory's target files instead (e.g. those the lab's bridge writes for one interval)."""
    binary = prometheus_binary(flavour)
    tmp_path.mkdir(parents=True, exist_ok=True)
    targets = targets or tmp_path / "targets"
    targets.mkdir(parents=True, exist_ok=True)
    interval = _duration(scrape_interval_s)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
        "scrape_configs:\n"
        f"  - job_name: vllm\n    scrape_interval: {interval}\n"
        f"    file_sd_configs:\n      - files: [{json.dumps(str(targets / '*.json'))}]\n"
        "        refresh_interval: 1s\n"
    )
    port = free_port()
    url = f"{'https' if web_config else 'http'}://127.0.0.1:{port}"
    is_ready = ready or (lambda base: answers_ok(f"{base}/-/ready"))
    log_path = tmp_path / "prometheus.log"
    argv = [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        *([f"--web.config.file={web_config}"] if web_config else []),
    ]
    with log_path.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not is_ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                how = f"exited with {proc.returncode}" if proc.poll() is not None else "not ready in time"
                raise RuntimeError(f"Prometheus {flavour} ({binary}) {how}; its log ends:\n{tail}")
            time.sleep(0.2)
        yield url, targets
    finally:
        stop(proc, timeout=15)
