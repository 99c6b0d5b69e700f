"""prometheus.py against real Prometheus servers (3.x and Debian's 2.x) scraping real vLLM and
simulated engines at production intervals (no cluster).

What the operator computes through Prometheus must equal what the engines' own counters and
histograms say over the same span.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import last_minute
from tests.integration.engines import scrape, sim_engine, spec_args
from tests.integration.prometheus_server import prometheus_server
from tests.local_server import serving

from specgate.api import MetricsSource
from specgate.gates import Histogram, acceptance_gate
from specgate.observation import Window
from specgate.prometheus import (
    ACCEPTED,
    ACCEPTED_PER_POS,
    DRAFT_TOKENS,
    DRAFTS,
    GENERATED,
    RUNNING,
    SUCCEEDED,
    MetricsUnavailable,
    PrometheusClient,
    Selector,
)
from specgate.vllm_metrics import INTER_TOKEN_LATENCY
from specgate_lab.calibrate import complete
from specgate_lab.loadgen import run_load

SPEC = {"method": "eagle3", "model": "specgate/tiny-llama-eagle3", "num_speculative_tokens": 3}


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Prometheus 3 scraping every second (what the idle-track check needs, not a production interval)."""
    with prometheus_server(tmp_path, 1.0) as server:
        yield server


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            body: bytes = resp.read()
            return body
    except OSError:
        return None


def _wait(predicate: Callable[..., object], timeout: float, what: str) -> object:
    """The predicate's first truthy value, polled every 0.5 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
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
                if sample.name == ITL_BUCKET:
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + sample.value
    bounds = tuple(sorted(buckets))
    return counters, Histogram(bounds, tuple(buckets[b] for b in bounds))


# Prometheus servers scraping the same engines at once: the intervals production uses, on
# Prometheus 3 (the lab's default) and on Debian's 2.x.
SERVERS = (("3", 15.0), ("3", 30.0), ("3", 60.0), ("2", 15.0))


def target(url: str, deployment: str) -> dict[str, object]:
    labels = {
        "namespace": "ns",
        "pod": deployment,
        "specgate_dev_deployment": deployment,
        "specgate_dev_track": "canary",
    }
    return {"targets": [url.removeprefix("http://")], "labels": labels}


def scrapes_after(prom_url: str, moment: float) -> bool:
    """Every target's last scrape is after `moment` (unix seconds)."""
    body = _get(f"{prom_url}/api/v1/targets?state=active") or b"{}"
    active = json.loads(body).get("data", {}).get("activeTargets", [])
    return bool(active) and all(
        datetime.fromisoformat(t["lastScrape"].replace("Z", "+00:00")).timestamp() > moment for t in active
    )


def test_figures_through_prometheus_equal_the_engines_own_at_15_30_and_60_s(
    engines: dict[str, str], tmp_path: Path
) -> None:
    """A real vLLM engine (the target drafting for itself) and a simulated one (alpha 0.7) under
    load, with quiet scrapes before and after it: each server's drafts, draft tokens, accepted
    tokens and ITL bucket counts over the window equal the engines' own counter increases exactly,
    alpha within 0.01, and the acceptance windows are one scrape interval long (at least 15 s).
    increase() over 15 s windows returned no window at all at a 15 s scrape."""
    with ExitStack() as stack:
        sim = stack.enter_context(sim_engine(spec_args(SPEC), {"SPECGATE_SIM_ALPHA": "0.7"}))
        urls = {"real": engines["self"], "sim": sim}
        begin = datetime.now(UTC)
        servers = []
        for i, (flavour, interval) in enumerate(SERVERS):
            prom_url, targets = stack.enter_context(prometheus_server(tmp_path / f"p{i}", interval, flavour))
            for name, url in urls.items():
                (targets / f"{name}.json").write_text(json.dumps([target(url, name)]))
            servers.append((flavour, interval, prom_url))
        for _, interval, prom_url in servers:
            _wait(lambda u=prom_url: _up_targets(u) == 2, interval + 30, "both engines scraped")
        before = {name: engine_totals([url]) for name, url in urls.items()}
        asyncio.run(load_all(list(urls.values())))
        quiet = time.time()
        for _, interval, prom_url in servers:
            _wait(lambda u=prom_url: scrapes_after(u, quiet), interval + 30, "a scrape after the load")
        after = {name: engine_totals([url]) for name, url in urls.items()}
        end = datetime.now(UTC)
        figures = {
            (flavour, interval, name): PrometheusClient(prom_url).track_metrics(
                Selector("ns", name, "canary", MetricsSource()), Window(begin, end), interval
            )
            for flavour, interval, prom_url in servers
            for name in urls
        }

    for (flavour, interval, name), metrics in figures.items():
        where = f"Prometheus {flavour} at {interval:g} s, {name} engine"
        (c0, h0), (c1, h1) = before[name], after[name]
        assert metrics is not None, where
        for family, summed in (
            (DRAFTS, sum(w.drafts for w in metrics.acceptance)),
            (DRAFT_TOKENS, sum(w.draft_tokens for w in metrics.acceptance)),
            (
                ACCEPTED,
                sum(w.accepted_tokens for w in metrics.acceptance),
            ),
        ):
            assert summed == c1[family] - c0[family], (where, family)
        drafted = c1[DRAFT_TOKENS] - c0[DRAFT_TOKENS]
        accepted = c1[ACCEPTED] - c0[ACCEPTED]
        assert drafted > 0, where  # how many the load drew in 75 s is the machine's speed
        result = acceptance_gate(metrics.acceptance, 0.55, min_drafts=1)
        assert result.estimate == pytest.approx(accepted / drafted, abs=0.01), where
        # Both are the scrapes' measured spacing (at least 15 s for the windows): a loaded
        # Prometheus scraped 60.01 s apart.
        assert metrics.acceptance_window_seconds == pytest.approx(max(15.0, interval), abs=1), where
        assert metrics.scrape_interval_seconds == pytest.approx(interval, abs=1), where
        engine_itl = Histogram(h1.bounds, tuple(b - a for a, b in zip(h0.counts, h1.counts, strict=True)))
        assert metrics.itl == engine_itl, where
        itl_sum, itl_count = (
            c1[f"{INTER_TOKEN_LATENCY}_{part}"] - c0[f"{INTER_TOKEN_LATENCY}_{part}"]
            for part in ("sum", "count")
        )
        assert metrics.mean_itl_ms == pytest.approx(1000 * itl_sum / itl_count, abs=0.001), (
            where
        )  # ms, 3 decimals
        assert metrics.load is not None and metrics.load.pods == 1, where
        # the first and last scrapes counted, inside the window asked about
        assert metrics.window_end is not None, where
        assert begin <= metrics.window_start < metrics.window_end <= end, where


async def load_all(urls: list[str]) -> None:
    """The engines loaded at once across at least one whole 60 s scrape interval."""
    await asyncio.gather(*(run_load(url, "tiny", concurrency=2, duration=75, max_tokens=32) for url in urls))


ITL_BUCKET = f"{INTER_TOKEN_LATENCY}_bucket"
MALFORMED = {
    "not JSON": b"<html>proxy error</html>",
    "no data": b'{"status": "success"}',
    "values without a number": b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"'
    + DRAFTS.encode()
    + b'"},"values":[[1]]}]}}',
    "bucket without le": b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"'
    + ITL_BUCKET.encode()
    + b'"},"values":[[1,"2"]]}]}}',
    "series without a name": b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"2"]]}]}}',
    "not a number": b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"x"},"values":[[1,"y"]]}]}}',
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

    with serving(Handler) as url:
        yield url


SELECTOR = Selector("ns", "d", "canary", MetricsSource())


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_prometheus_answer_is_metrics_unavailable(body: bytes) -> None:
    """A proxy's error page or a broken answer is MetricsUnavailable (never a verdict, never a crash)."""
    with canned_prometheus(lambda _: body) as url, pytest.raises(MetricsUnavailable, match="Prometheus"):
        PrometheusClient(url).track_metrics(SELECTOR, last_minute(), 15.0)


def matrix(*series: tuple[dict[str, str], list[str]]) -> bytes:
    """A range-vector answer whose samples are a second apart and end now."""
    now = time.time()
    result = [
        {"metric": labels, "values": [[now - len(values) + t, v] for t, v in enumerate(values)]}
        for labels, values in series
    ]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def non_finite_answer(_: str) -> bytes:
    """Samples Prometheus can hold: NaN and infinities in counters, histograms and gauges."""
    itl = INTER_TOKEN_LATENCY
    return matrix(
        ({"__name__": f"{itl}_bucket", "le": "0.01"}, ["0", "1", "2"]),
        ({"__name__": f"{itl}_bucket", "le": "0.025"}, ["0", "NaN", "3"]),
        ({"__name__": f"{itl}_bucket", "le": "+Inf"}, ["0", "3", "4"]),
        ({"__name__": f"{itl}_sum"}, ["NaN", "NaN", "NaN"]),
        ({"__name__": f"{itl}_count"}, ["0", "0", "0"]),
        ({"__name__": DRAFTS}, ["10", "NaN", "20"]),
        ({"__name__": DRAFT_TOKENS}, ["+Inf", "40", "80"]),
        ({"__name__": ACCEPTED}, ["5", "20", "NaN"]),
        ({"__name__": ACCEPTED_PER_POS, "position": "0"}, ["5", "NaN"]),
        ({"__name__": ACCEPTED_PER_POS, "position": "1"}, ["+Inf", "2"]),
        ({"__name__": GENERATED}, ["0", "+Inf"]),
        ({"__name__": SUCCEEDED}, ["-Inf", "NaN"]),
        ({"__name__": RUNNING}, ["NaN"]),
    )


def test_nan_and_infinities_never_become_figures() -> None:
    with canned_prometheus(non_finite_answer) as url:
        prom = PrometheusClient(url)
        metrics = prom.track_metrics(SELECTOR, last_minute(), 1.0)
        job_windows, finished = prom.job_windows(SELECTOR, last_minute(), 1.0)
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
    assert metrics.accepted_per_position == (0.0, 0.0)
    counts = [(w.drafts, w.draft_tokens, w.accepted_tokens) for w in metrics.acceptance]
    assert all(math.isfinite(v) for window in counts for v in window)
    job_counts = [(w.drafts, w.draft_tokens, w.accepted_tokens) for w in job_windows]
    assert all(math.isfinite(v) for window in job_counts for v in window)
    assert sum(drafts for drafts, _, _ in job_counts) == 0  # no finite increase of drafts
    assert finished == 0.0  # -Inf and NaN samples are no increase


@pytest.mark.parametrize("url", ["not a url", "http://[::1", "http://prom:port"])
def test_a_malformed_url_is_metrics_unavailable_naming_the_fix(url: str) -> None:
    prom = PrometheusClient(url)  # never raises ("http://[::1" did): the callers guard the queries
    for query in (prom.track_metrics, prom.job_windows):
        with pytest.raises(
            MetricsUnavailable, match=r"spec\.rollout\.metrics\.prometheusUrl or --prometheus-url"
        ):
            query(SELECTOR, last_minute(), 15.0)


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
        served = datetime.now(UTC)
        itl = INTER_TOKEN_LATENCY

        def idle_window_end() -> datetime | None:
            """Now, once the 3-s window ending now is all after the request and holds two scrapes:
            a slow machine's late scrapes only make the wait longer."""
            end = datetime.now(UTC)
            count = f"count_over_time({itl}_count{SELECTOR}[3s])"
            body = _get(
                f"{prom_url}/api/v1/query?{urllib.parse.urlencode({'query': count, 'time': end.timestamp()})}"
            )
            result = json.loads(body or b"{}").get("data", {}).get("result", [])
            scrapes = float(result[0]["value"][1]) if result else 0.0
            return end if end - timedelta(seconds=3) >= served and scrapes >= 2 else None

        end = _wait(idle_window_end, 60, "two idle scrapes in a 3 s window after the request")
        assert isinstance(end, datetime)
        window = Window(end - timedelta(seconds=3), end)
        mean = f"sum(increase({itl}_sum{SELECTOR}[3s])) / sum(increase({itl}_count{SELECTOR}[3s]))"
        raw = _get(
            f"{prom_url}/api/v1/query?{urllib.parse.urlencode({'query': mean, 'time': end.timestamp()})}"
        )
        metrics = PrometheusClient(prom_url).track_metrics(SELECTOR, window, 1.0)
    assert raw is not None and json.loads(raw)["data"]["result"][0]["value"][1] == "NaN"
    assert metrics is not None
    assert (metrics.mean_itl_ms, metrics.per_token_latency_ms, metrics.p99_ttft_ms) == (None, None, None)
    assert metrics.itl is not None and metrics.itl.total == 0
