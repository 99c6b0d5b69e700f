"""prometheus.py's PromQL against a real Prometheus scraping simulated engines (no cluster).

What the operator computes through Prometheus must equal what the engines' own counters and
histograms say over the same window.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.engines import scrape, sim_engine, spec_args

from specgate.api import MetricsSource
from specgate.gates import Histogram, histogram_quantile
from specgate.lab.calibrate import free_port
from specgate.loadgen import run_load
from specgate.prometheus import MetricsUnavailable, PrometheusClient, Selector
from specgate.rollout import Window

SPEC = {"method": "eagle3", "model": "specgate/tiny-llama-eagle3", "num_speculative_tokens": 3}


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is not installed: run `make cluster-up` (it installs Debian's prometheus)"
    targets = tmp_path / "targets"
    targets.mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: vllm, file_sd_configs: [{{files: ['{targets}/*.json'], refresh_interval: 1s}}]}}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _get(f"{url}/-/ready") is not None, 30, "Prometheus ready")
        yield url, targets
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            body: bytes = resp.read()
            return body
    except OSError:
        return None


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _up_targets(url: str) -> int:
    body = _get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': 'sum(up)'})}")
    result = json.loads(body or b"{}").get("data", {}).get("result", [])
    return int(float(result[0]["value"][1])) if result else 0


def engine_totals(urls: list[str]) -> tuple[dict[str, float], Histogram]:
    """Counters (and histogram sums and counts) summed over engines, and the summed ITL histogram,
    straight from /metrics."""
    counters: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for url in urls:
        for family in text_string_to_metric_families(scrape(url)):
            for sample in family.samples:
                if sample.name.endswith(("_total", "_sum", "_count")):
                    counters[sample.name] = counters.get(sample.name, 0.0) + sample.value
                if sample.name == "vllm:inter_token_latency_seconds_bucket":
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + sample.value
    bounds = tuple(sorted(buckets))
    return counters, Histogram(bounds, tuple(buckets[b] for b in bounds))


async def load_all(urls: list[str]) -> None:
    """Both engines loaded at once, like the pods behind one Service."""
    await asyncio.gather(*(run_load(url, "tiny", concurrency=4, duration=25, max_tokens=32) for url in urls))


def test_alpha_and_p99_through_prometheus_equal_the_engines_own(prometheus: tuple[str, Path]) -> None:
    prom_url, targets = prometheus
    with ExitStack() as stack:
        urls = [
            stack.enter_context(
                sim_engine(spec_args(SPEC), {"SPECGATE_SIM_ALPHA": "0.7", "SPECGATE_SIM_SEED": str(i)})
            )
            for i in range(2)
        ]
        for i, url in enumerate(urls):
            labels = {
                "namespace": "ns",
                "pod": f"p{i}",
                "specgate_dev_deployment": "d",
                "specgate_dev_track": "canary",
            }
            (targets / f"p{i}.json").write_text(
                json.dumps([{"targets": [url.removeprefix("http://")], "labels": labels}])
            )
        _wait(lambda: _up_targets(prom_url) == 2, 30, "both engines scraped")
        time.sleep(2)
        start, (c0, h0) = datetime.now(UTC), engine_totals(urls)
        asyncio.run(load_all(urls))
        time.sleep(3)  # let the last scrapes land; the counters are quiet from here on
        end, (c1, h1) = datetime.now(UTC), engine_totals(urls)
        selector, client = Selector("ns", "d", "canary", MetricsSource()), PrometheusClient(prom_url)
        metrics = client.track_metrics(selector, Window(start, end))
        totals = client.acceptance_totals(selector, Window(start, end))  # a benchmark Job's range

    assert metrics is not None
    drafted = c1["vllm:spec_decode_num_draft_tokens_total"] - c0["vllm:spec_decode_num_draft_tokens_total"]
    accepted = (
        c1["vllm:spec_decode_num_accepted_tokens_total"] - c0["vllm:spec_decode_num_accepted_tokens_total"]
    )
    prom_drafted = sum(w.draft_tokens for w in metrics.acceptance)
    prom_accepted = sum(w.accepted_tokens for w in metrics.acceptance)
    assert drafted > 500
    assert prom_accepted / prom_drafted == pytest.approx(accepted / drafted, abs=0.01)
    assert totals is not None
    assert totals.accepted_tokens / totals.draft_tokens == pytest.approx(accepted / drafted, abs=0.01)

    assert metrics.itl is not None
    engine_itl = Histogram(h1.bounds, tuple(b - a for a, b in zip(h0.counts, h1.counts, strict=True)))
    engine_p99, prom_p99 = histogram_quantile(engine_itl, 0.99), histogram_quantile(metrics.itl, 0.99)
    assert engine_p99 is not None and prom_p99 is not None
    assert prom_p99 == pytest.approx(engine_p99, rel=0.05)
    assert metrics.itl.total == pytest.approx(engine_itl.total, rel=0.05)
    itl_sum, itl_count = (
        c1[f"vllm:inter_token_latency_seconds_{part}"] - c0[f"vllm:inter_token_latency_seconds_{part}"]
        for part in ("sum", "count")
    )
    assert metrics.mean_itl_ms == pytest.approx(1000 * itl_sum / itl_count, rel=0.05)
    assert metrics.window_start == start


MALFORMED = {
    "not JSON": b"<html>proxy error</html>",
    "no data": b'{"status": "success"}',
    "value without a number": b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"le":"0.1"},"value":[1]}]}}',
    "bucket without le": b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"2"]}]}}',
    "not a number": b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"le":"x"},"value":[1,"y"]}]}}',
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_prometheus_answer_is_metrics_unavailable(body: bytes) -> None:
    """A proxy's error page or a broken answer is MetricsUnavailable (never a verdict, never a crash)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        prom = PrometheusClient(f"http://127.0.0.1:{server.server_address[1]}")
        now = datetime.now(UTC)
        with pytest.raises(MetricsUnavailable, match="Prometheus"):
            prom.track_metrics(
                Selector("ns", "d", "canary", MetricsSource()), Window(now - timedelta(minutes=1), now)
            )
    finally:
        server.shutdown()
