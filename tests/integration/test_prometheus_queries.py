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
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.integration.engines import scrape, sim_engine, spec_args

from specgate.api import MetricsSource
from specgate.gates import Histogram, acceptance_gate, histogram_quantile
from specgate.lab.calibrate import complete, free_port
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


@contextmanager
def canned_prometheus(answer: Callable[[str], bytes]) -> Iterator[str]:
    """A local HTTP server answering each query with answer(query): PrometheusClient's real HTTP and
    JSON parsing, with the answers chosen by the test."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0]
            body = answer(query)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def last_minute() -> Window:
    now = datetime.now(UTC)
    return Window(now - timedelta(minutes=1), now)


SELECTOR = Selector("ns", "d", "canary", MetricsSource())


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_prometheus_answer_is_metrics_unavailable(body: bytes) -> None:
    """A proxy's error page or a broken answer is MetricsUnavailable (never a verdict, never a crash)."""
    with canned_prometheus(lambda _: body) as url, pytest.raises(MetricsUnavailable, match="Prometheus"):
        PrometheusClient(url).track_metrics(SELECTOR, last_minute())


def vector(*samples: tuple[dict[str, str], str]) -> bytes:
    result = [{"metric": labels, "value": [0, value]} for labels, value in samples]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def matrix(*series: tuple[dict[str, str], list[str]]) -> bytes:
    result = [
        {"metric": labels, "values": [[t, v] for t, v in enumerate(values)]} for labels, values in series
    ]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def non_finite_answer(query: str) -> bytes:
    """What Prometheus says of a track whose ratios divide by zero and whose counters hold NaN:
    "NaN" for 0/0 (a mean of an empty histogram, a quantile of no observations), "+Inf" for x/0."""
    if query.startswith("sum by (le) (increase(vllm:inter_token_latency_seconds_bucket"):
        return vector(({"le": "0.01"}, "1"), ({"le": "0.025"}, "NaN"), ({"le": "+Inf"}, "3"))
    if "[15s]" in query and "per_pos" in query:
        return matrix(({"position": "0"}, ["5", "NaN"]), ({"position": "1"}, ["+Inf", "2"]))
    if "[15s]" in query:  # the acceptance windows: the second one's counters hold NaN
        return matrix(({}, ["10", "NaN"]))
    if "generation_tokens" in query:
        return vector(({}, "+Inf"))
    if "request_success" in query:
        return vector(({}, "-Inf"))
    return vector(({}, "NaN"))  # TTFT quantile, mean ITL and per-token latency, concurrency


def test_nan_and_infinities_never_become_figures() -> None:
    with canned_prometheus(non_finite_answer) as url:
        prom = PrometheusClient(url)
        metrics = prom.track_metrics(SELECTOR, last_minute())
        totals = prom.acceptance_totals(SELECTOR, last_minute())
    assert metrics is not None
    figures = (
        metrics.mean_itl_ms,
        metrics.p99_ttft_ms,
        metrics.per_token_latency_ms,
        metrics.output_tokens_per_second,
        metrics.requests_per_second,
        metrics.concurrency,
    )
    assert figures == (None,) * len(figures)
    assert metrics.itl is None  # a NaN bucket says nothing of the P99
    assert metrics.accepted_per_position == (5.0, 2.0)
    # The NaN window is passed on: the gate drops it and says so.
    assert len(metrics.acceptance) == 2
    assert (
        "1 windows with NaN or negative increases dropped"
        in acceptance_gate(metrics.acceptance, 0.55).message
    )
    assert totals is None


@pytest.mark.parametrize("url", ["not a url", "http://[::1", "http://prom:port"])
def test_a_malformed_url_is_metrics_unavailable_naming_the_fix(url: str) -> None:
    prom = PrometheusClient(url)  # never raises ("http://[::1" did): the callers guard the queries
    for query in (prom.track_metrics, prom.acceptance_totals):
        with pytest.raises(
            MetricsUnavailable, match=r"spec\.rollout\.metrics\.prometheusUrl or --prometheus-url"
        ):
            query(SELECTOR, last_minute())


def test_an_idle_track_reads_none_where_prometheus_says_nan(prometheus: tuple[str, Path]) -> None:
    """A real Prometheus divides 0 by 0 for the means of a track that served a request, then none."""
    prom_url, targets = prometheus
    with sim_engine(spec_args(SPEC)) as url:
        labels = {
            "namespace": "ns",
            "pod": "p0",
            "specgate_dev_deployment": "d",
            "specgate_dev_track": "canary",
        }
        target = [{"targets": [url.removeprefix("http://")], "labels": labels}]
        (targets / "p0.json").write_text(json.dumps(target))
        _wait(lambda: _up_targets(prom_url) == 1, 30, "the engine scraped")
        complete(url, "tiny", "one request, so that the series exist", max_tokens=4)
        time.sleep(5)  # idle scrapes after it
        end = datetime.now(UTC)
        window = Window(end - timedelta(seconds=3), end)
        itl = "vllm:inter_token_latency_seconds"
        mean = f"sum(increase({itl}_sum{SELECTOR}[3s])) / sum(increase({itl}_count{SELECTOR}[3s]))"
        raw = _get(
            f"{prom_url}/api/v1/query?{urllib.parse.urlencode({'query': mean, 'time': end.timestamp()})}"
        )
        metrics = PrometheusClient(prom_url).track_metrics(SELECTOR, window)
    assert raw is not None and json.loads(raw)["data"]["result"][0]["value"][1] == "NaN"
    assert metrics is not None
    assert (metrics.mean_itl_ms, metrics.per_token_latency_ms, metrics.p99_ttft_ms) == (None, None, None)
    assert metrics.itl is not None and metrics.itl.total == 0
