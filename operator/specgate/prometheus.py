"""The only module that talks to Prometheus: one track's figures over a window.

Every query selects one track of one SpeculativeDeployment by target labels
({namespace, specgate_dev_deployment, specgate_dev_track} by default, see MetricsSource).

Counters and histograms are read as raw samples (one range-vector query per track and window), and
increases are the differences between consecutive scrapes, taken here. increase() would need two
samples inside each range (a 15 s range at a 15 s scrape holds one, and Prometheus 3's ranges are
open on the left) and extrapolates to the range's edges; differences of samples cover exactly the
span between the first and the last scrape in the window, at any scrape interval, on Prometheus 2
and 3 alike. A difference that falls the other way is a counter reset (a restarted engine), and
counts from zero. Acceptance windows are at least one scrape interval long, so each holds a scrape
of every pod; spans to leave out (a benchmark Job's requests in measurement `both`) drop every
difference that overlaps them.

Nothing here raises but MetricsUnavailable, and no figure is NaN or infinite.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import ssl
import statistics
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_client import Counter

from specgate import vllm_metrics
from specgate.api import MetricsSource, is_http_url
from specgate.gates import (
    DRIFT_BLOCK_SECONDS,
    MIN_ACCEPTANCE_WINDOW_SECONDS,
    AcceptanceWindow,
    Histogram,
    Load,
)
from specgate.measurements import ms, p99
from specgate.observation import TrackMetrics, Window
from specgate.vllm_metrics import total

# vLLM >= 0.10.2 names inter-token latency inter_token_latency_seconds; older versions (removed by
# 0.13) call the same per-step histogram time_per_output_token_seconds. The first with data wins.
ITL_METRICS = (vllm_metrics.INTER_TOKEN_LATENCY, vllm_metrics.TIME_PER_OUTPUT_TOKEN)
TTFT = vllm_metrics.TIME_TO_FIRST_TOKEN
PER_TOKEN = vllm_metrics.REQUEST_TIME_PER_OUTPUT_TOKEN
DRAFTS = total(vllm_metrics.SPEC_DECODE_NUM_DRAFTS)
DRAFT_TOKENS = total(vllm_metrics.SPEC_DECODE_NUM_DRAFT_TOKENS)
ACCEPTED = total(vllm_metrics.SPEC_DECODE_NUM_ACCEPTED_TOKENS)
ACCEPTED_PER_POS = total(vllm_metrics.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS)
GENERATED = total(vllm_metrics.GENERATION_TOKENS)
SUCCEEDED = total(vllm_metrics.REQUEST_SUCCESS)
RUNNING = vllm_metrics.NUM_REQUESTS_RUNNING
STEPS = f"{vllm_metrics.ITERATION_TOKENS}_count"  # engine steps: the step stall's sample size
HISTOGRAMS = (*ITL_METRICS, TTFT, PER_TOKEN)
FAMILIES = (
    DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS, GENERATED, SUCCEEDED, RUNNING, STEPS,
    *(f"{h}_{part}" for h in HISTOGRAMS for part in ("bucket", "sum", "count")),
)  # fmt: skip


class MetricsUnavailable(Exception):
    """Prometheus could not be reached or answered with an error."""


# A query's errors: an HTTP status (the client's exception) or the transport and JSON (requests').
# An answer of the wrong shape raises KeyError, TypeError... in parsing: see MALFORMED_ERRORS.
QUERY_ERRORS = (PrometheusApiClientException, requests.RequestException)
MALFORMED_ERRORS = (KeyError, IndexError, TypeError, ValueError)


@dataclass(frozen=True)
class Selector:
    namespace: str
    deployment: str
    track: str
    labels: MetricsSource

    def matchers(self) -> str:
        lab = self.labels
        return (
            f'{lab.namespace_label}="{self.namespace}",{lab.deployment_label}="{self.deployment}",'
            f'{lab.track_label}="{self.track}"'
        )

    def __str__(self) -> str:
        return f"{{{self.matchers()}}}"


@dataclass(frozen=True)
class Increase:
    """A counter's increase between two consecutive scrapes of one series."""

    start: float  # unix seconds of the earlier scrape
    end: float
    value: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]  # (unix seconds, value), ascending

    def increases(self, since: float, leave_out: Sequence[Window]) -> list[Increase]:
        """Differences of consecutive scrapes from `since` on, none overlapping a span left out."""
        spans = _spans(leave_out)
        out = []
        for (t0, v0), (t1, v1) in zip(self.points, self.points[1:], strict=False):
            if t0 < since or any(t0 < end and t1 > begin for begin, end in spans):
                continue
            if math.isfinite(v0) and math.isfinite(v1):
                out.append(Increase(t0, t1, v1 - v0 if v1 >= v0 else v1))
        return out

    def values(self, since: float, leave_out: Sequence[Window]) -> list[float]:
        """A gauge's samples from `since` on, outside the spans left out."""
        spans = _spans(leave_out)
        return [v for t, v in self.points if t >= since and math.isfinite(v) and not _inside(t, spans)]

    def mean(self, since: float, leave_out: Sequence[Window]) -> float | None:
        kept = self.values(since, leave_out)
        return statistics.fmean(kept) if kept else None


def _spans(leave_out: Sequence[Window]) -> list[tuple[float, float]]:
    return [(w.start.timestamp(), w.end.timestamp()) for w in leave_out]


def _total(series: Iterable[Series], since: float, leave_out: Sequence[Window]) -> float:
    """The summed increases of the series from `since` on, outside the spans left out."""
    return sum(i.value for s in series for i in s.increases(since, leave_out))


def _inside(t: float, spans: Iterable[tuple[float, float]]) -> bool:
    return any(begin <= t <= end for begin, end in spans)


Families = dict[str, list[Series]]  # by metric name


# Set by `specgate run` from --prometheus-header, --prometheus-bearer-token-file and
# --prometheus-basic-auth-file.
HEADERS_ENV, TOKEN_FILE_ENV = "SPECGATE_PROMETHEUS_HEADERS", "SPECGATE_PROMETHEUS_TOKEN_FILE"
BASIC_AUTH_FILE_ENV = "SPECGATE_PROMETHEUS_BASIC_AUTH_FILE"


def request_headers() -> dict[str, str]:
    """Extra headers for every query (a tenant's X-Scope-OrgID for Thanos, Mimir, Cortex) and the
    credentials: a bearer token, or basic auth (what Prometheus' own --web.config.file checks),
    read from their file each time a client is made, so a rotated Secret is picked up."""
    headers: dict[str, str] = json.loads(os.environ.get(HEADERS_ENV) or "{}")
    token_file, basic_auth_file = os.environ.get(TOKEN_FILE_ENV), os.environ.get(BASIC_AUTH_FILE_ENV)
    if token_file and basic_auth_file:
        raise MetricsUnavailable(
            "both --prometheus-bearer-token-file and --prometheus-basic-auth-file are set: give one"
        )
    if token_file:
        headers["Authorization"] = f"Bearer {_read_secret(token_file, 'bearer token').strip()}"
    elif basic_auth_file:
        # One line, username:password; the first colon splits, as in HTTP basic auth (RFC 7617).
        credentials = _read_secret(basic_auth_file, "basic auth").strip("\r\n")
        user, colon, _ = credentials.partition(":")
        if not colon or not user:
            raise MetricsUnavailable(
                f"the Prometheus basic auth file {basic_auth_file} must hold one line username:password"
            )
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    return headers


def _read_secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise MetricsUnavailable(f"cannot read the Prometheus {what} file {path}: {exc}") from exc


_CONNECTIONS: dict[tuple[str, float], PrometheusConnect] = {}
_CONNECTIONS_LOCK = threading.Lock()


def _shared_connection(url: str, timeout: float) -> PrometheusConnect:
    """One connection pool per Prometheus for the whole process: every object's queries reuse its
    kept-alive connections instead of opening (and TLS-handshaking) one per reconcile."""
    with _CONNECTIONS_LOCK:
        connection = _CONNECTIONS.get((url, timeout))
        if connection is None:
            # The constructor cannot raise past is_http_url (it only parses the URL). TLS is
            # verified: a private CA comes through REQUESTS_CA_BUNDLE (a mounted bundle), as for any
            # `requests`.
            connection = PrometheusConnect(url=url, disable_ssl=False, timeout=timeout)
            _CONNECTIONS[(url, timeout)] = connection
        return connection


QUERIES = Counter(
    "specgate_prometheus_queries_total",
    "PromQL queries the operator sent to Prometheus, by track.",
    ["track"],
)


class PrometheusClient:
    def __init__(self, url: str, timeout_seconds: float = 10.0) -> None:
        self._url = url
        self._timeout = timeout_seconds
        self._connection: PrometheusConnect | None = None

    def _prom(self) -> PrometheusConnect:
        """Connect on first query, inside the callers' MetricsUnavailable handling: a malformed URL
        (from --prometheus-url, or a spec the API server did not check) must not crash a reconcile."""
        if self._connection is None:
            if not is_http_url(self._url):
                raise MetricsUnavailable(
                    f"Prometheus URL {self._url!r} is not an http:// or https:// URL with a host: "
                    "fix spec.rollout.metrics.prometheusUrl or --prometheus-url"
                )
            self._connection = _shared_connection(self._url, self._timeout)
        self._connection.headers = request_headers()  # read for every query: a rotated Secret counts
        return self._connection

    def track_metrics(
        self, sel: Selector, window: Window, scrape_interval: float, leave_out: Sequence[Window] = ()
    ) -> TrackMetrics | None:
        """The track's figures over the window (spans in leave_out excluded); None when the track
        has no series at all. scrape_interval (seconds) is the one configured: windows are at least
        that long, or as long as the samples' spacing when that is longer."""
        try:
            families = self._samples(sel, window, scrape_interval)
            return None if not families else _track_metrics(families, window, scrape_interval, leave_out)
        except MALFORMED_ERRORS as exc:
            raise MetricsUnavailable(f"malformed Prometheus response: {exc!r}") from exc

    def job_windows(
        self, sel: Selector, window: Window, scrape_interval: float
    ) -> tuple[tuple[AcceptanceWindow, ...], float | None]:
        """The track's spec-decode counter increases over a benchmark Job's run, in the acceptance
        windows traffic is judged in (benchmark.evaluate judges them once, by a fixed-sample test),
        and the requests it finished in it (None without the counter)."""
        try:
            families = self._samples(sel, window, scrape_interval)
        except MALFORMED_ERRORS as exc:
            raise MetricsUnavailable(f"malformed Prometheus response: {exc!r}") from exc
        since = window.start.timestamp()
        step = window_step(scrape_spacing(families, scrape_interval), scrape_interval)
        windows, _ = acceptance_windows(families, since, step, ())
        finished = _total(families.get(SUCCEEDED, ()), since, ())
        return windows, finished if families.get(SUCCEEDED) else None

    def history_windows(
        self, sel: Selector, window: Window, scrape_interval: float, step: float | None = None
    ) -> tuple[tuple[AcceptanceWindow, ...], float]:
        """The track's draft and accepted tokens over a long window (hours: the mix's drift is
        measured on them, the guard judges them), summed over pods in windows of `step` seconds
        (`history_step` unless given), and that step.
        A range query of increases, computed by Prometheus: hours of raw samples of every pod would
        be thousands of points a series, and a few percent of extrapolation at a window's edges
        cancels in the ratio of two counters scraped together."""
        step = step or history_step(scrape_interval)
        answers = [
            self._query_range(f"sum(increase({name}{sel}[{step:g}s]))", window, step, sel.track)
            for name in (DRAFT_TOKENS, ACCEPTED)
        ]
        try:
            return history_blocks(*answers), step
        except MALFORMED_ERRORS as exc:
            raise MetricsUnavailable(f"malformed Prometheus response: {exc!r}") from exc

    def _query_range(self, promql: str, window: Window, step: float, track: str) -> list[dict[str, Any]]:
        prom = self._prom()
        QUERIES.labels(track).inc()
        try:
            result: list[dict[str, Any]] = prom.custom_query_range(
                promql, start_time=window.start, end_time=window.end, step=f"{step:g}s"
            )
        except QUERY_ERRORS as exc:
            raise MetricsUnavailable(query_failure(self._url, exc)) from exc
        return result

    def _samples(self, sel: Selector, window: Window, scrape_interval: float) -> Families:
        """Every sample of the track's families in the window, by metric name. The range reaches
        two scrape intervals further back, so that a track with no scrape inside a short window yet
        still shows its series (a window too short to measure, not missing metrics)."""
        seconds = math.ceil((window.end - window.start).total_seconds() + 2 * scrape_interval)
        names = "|".join(FAMILIES)
        result = self._query(f'{{__name__=~"{names}",{sel.matchers()}}}[{seconds}s]', window.end, sel.track)
        families: dict[str, list[Series]] = defaultdict(list)
        for r in result:
            labels = dict(r["metric"])
            points = tuple((float(t), float(v)) for t, v in r["values"])
            families[labels.pop("__name__")].append(Series(labels, points))
        return families

    def _query(self, promql: str, at: datetime, track: str) -> list[dict[str, Any]]:
        prom = self._prom()
        QUERIES.labels(track).inc()
        try:
            result: list[dict[str, Any]] = prom.custom_query(promql, params={"time": at.timestamp()})
        except QUERY_ERRORS as exc:
            raise MetricsUnavailable(query_failure(self._url, exc)) from exc
        return result


# PrometheusApiClientException carries the status only in its text: "HTTP Status Code 401 (b'...')".
_REFUSED = re.compile(r"HTTP Status Code (401|403)\b")


def query_failure(url: str, exc: Exception) -> str:
    """What a failed query says in the MetricsUnavailable status: for the failures a setting fixes
    (an untrusted certificate, refused credentials), the problem and the setting, not a traceback."""
    if isinstance(exc, requests.exceptions.SSLError):
        return (
            f"TLS with Prometheus {url} failed: {_tls_reason(exc)}; if its certificate comes from a "
            "private CA, give the operator that CA (Helm value prometheusCA.configMap, or "
            "REQUESTS_CA_BUNDLE=/path/to/ca.crt for `specgate run`)"
        )
    refused = _REFUSED.match(str(exc))
    if refused:
        return (
            f"Prometheus {url} refused the query (HTTP {refused.group(1)}): the credentials are missing, "
            "wrong or not allowed; check the Helm value prometheusAuth.basicAuthSecret or "
            ".bearerTokenSecret (--prometheus-basic-auth-file or --prometheus-bearer-token-file)"
        )
    return f"Prometheus query failed: {exc}"


def _tls_reason(exc: BaseException) -> str:
    """The ssl module's error under requests' and urllib3's wrappers, e.g.
    "CERTIFICATE_VERIFY_FAILED: self-signed certificate"."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"{cause.reason}: {cause.verify_message}"
    return str(cause or exc)


# --- figures from samples (pure) ---


def _track_metrics(
    families: Families, window: Window, configured_interval: float, leave_out: Sequence[Window]
) -> TrackMetrics:
    since = window.start.timestamp()
    interval = scrape_spacing(families, configured_interval)
    step = window_step(interval, configured_interval)
    acceptance, per_position = acceptance_windows(families, since, step, leave_out)
    itl_name = next((name for name in ITL_METRICS if families.get(f"{name}_bucket")), ITL_METRICS[0])
    requests_per_second = _rate(families.get(SUCCEEDED, []), since, leave_out)
    means = [m for s in families.get(RUNNING, []) if (m := s.mean(since, leave_out)) is not None]
    running = _finite_sum(means) if means else None
    first, last = measured_span(families, since, leave_out) or (since, None)
    return TrackMetrics(
        acceptance=acceptance,
        accepted_per_position=per_position,
        itl=histogram(families, itl_name, since, leave_out),
        engine_steps=engine_steps(families, since, leave_out),
        per_token=histogram(families, PER_TOKEN, since, leave_out),
        per_token_windows=per_token_windows(families, since, step, leave_out),
        mean_itl_ms=ms(_mean(families, itl_name, since, leave_out)),
        window_start=datetime.fromtimestamp(first, UTC),
        window_end=None if last is None else datetime.fromtimestamp(last, UTC),
        p99_ttft_ms=ms(p99(histogram(families, TTFT, since, leave_out))),
        per_token_latency_ms=ms(_mean(families, PER_TOKEN, since, leave_out)),
        output_tokens_per_second=_round(_rate(families.get(GENERATED, []), since, leave_out)),
        requests_per_second=_round(requests_per_second),
        concurrency=_round(running),
        load=_load(families, since, leave_out),
        scrape_interval_seconds=round(interval, 3),
        acceptance_window_seconds=round(step, 3),
    )


def measured_span(
    families: Families, since: float, leave_out: Sequence[Window]
) -> tuple[float, float] | None:
    """The first and last scrape the figures count (the earlier scrape of the first increase, the
    later of the last), None without one. The query's own window is wider: a scrape stamped before
    its end may not be in Prometheus yet (a loaded engine answers /metrics seconds late, and
    Prometheus stamps the scrape when it starts), so the window a status reports is this span."""
    increases = [i for series in families.values() for s in series for i in s.increases(since, leave_out)]
    if not increases:
        return None
    return min(i.start for i in increases), max(i.end for i in increases)


def history_step(scrape_interval: float) -> float:
    """The history's windows: a block of gates.DRIFT_BLOCK_SECONDS, and at least 4 scrapes (an
    increase needs two samples in its range)."""
    return max(DRIFT_BLOCK_SECONDS, 4 * scrape_interval)


def guard_step(scrape_interval: float) -> float:
    """The guard's blocks: an acceptance window, and at least 4 scrapes (as history_step)."""
    return max(MIN_ACCEPTANCE_WINDOW_SECONDS, 4 * scrape_interval)


def history_blocks(
    tokens: Sequence[dict[str, Any]], accepted: Sequence[dict[str, Any]]
) -> tuple[AcceptanceWindow, ...]:
    """Windows from two range queries' matrices (draft tokens, accepted tokens; one series each,
    summed over pods), matched by timestamp: a step where either has no value (no pod scraped) is
    left out. Drafts are not read (the drift needs only the ratio) and stay 0."""

    def by_time(answer: Sequence[dict[str, Any]]) -> dict[float, float]:
        return {float(t): float(v) for series in answer for t, v in series["values"]}

    n, a = by_time(tokens), by_time(accepted)
    return tuple(AcceptanceWindow(0.0, n[t], a[t], end=t) for t in sorted(n.keys() & a.keys()))


def scrape_spacing(families: Families, configured_interval: float) -> float:
    """The scrape interval: the one configured, or the samples' spacing when that is longer."""
    return max(configured_interval, observed_interval(families) or 0.0)


def window_step(spacing: float, configured_interval: float) -> float:
    """The acceptance (and per-token) windows' length: the scrape spacing on the configured
    interval's grid (its nearest whole multiple), at least MIN_ACCEPTANCE_WINDOW_SECONDS. Each
    track's spacing is its own samples' median; off the grid, a few milliseconds of a loaded
    Prometheus's jitter in one track's median put every one of its windows' ends off the other
    track's, and the speedup gate, which pairs windows by their end, paired none."""
    if configured_interval > 0:
        spacing = configured_interval * max(1, round(spacing / configured_interval))
    return max(MIN_ACCEPTANCE_WINDOW_SECONDS, spacing)


def observed_interval(families: Families) -> float | None:
    """The median spacing of consecutive scrapes over all series (robust to a missed scrape)."""
    gaps = [
        t1 - t0
        for series in families.values()
        for s in series
        for (t0, _), (t1, _) in zip(s.points, s.points[1:], strict=False)
    ]
    return statistics.median(gaps) if gaps else None


def acceptance_windows(
    families: Families, since: float, step: float, leave_out: Sequence[Window]
) -> tuple[tuple[AcceptanceWindow, ...], tuple[float, ...]]:
    """Increases of the spec-decode counters binned by the time of their later scrape into windows
    of `step` seconds from `since`, summed over pods and engines; and the accepted tokens per draft
    position over the same increases (so that they divide by the same drafts). A scrape's counters
    share its timestamp, so drafts and accepted tokens of one scrape fall in the same window."""
    bins = _binned(families, (DRAFTS, DRAFT_TOKENS, ACCEPTED), since, step, leave_out)
    windows = tuple(
        AcceptanceWindow(drafts, tokens, accepted, end=since + (k + 1) * step)
        for k, (drafts, tokens, accepted) in sorted(bins.items())
    )
    by_position: dict[str, float] = defaultdict(float)
    for series in families.get(ACCEPTED_PER_POS, []):
        by_position[series.labels.get("position", "0")] += _total([series], since, leave_out)
    per_position = tuple(by_position[p] for p in sorted(by_position, key=_position))
    return windows, per_position


def _binned(
    families: Families, names: Sequence[str], since: float, step: float, leave_out: Sequence[Window]
) -> dict[int, list[float]]:
    """The counters' increases binned by the time of their later scrape into windows of `step`
    seconds from `since`, summed over pods and engines: window index -> one sum per name."""
    bins: dict[int, list[float]] = defaultdict(lambda: [0.0] * len(names))
    for column, name in enumerate(names):
        for series in families.get(name, []):
            for inc in series.increases(since, leave_out):
                bins[math.ceil((inc.end - since) / step) - 1][column] += inc.value
    return bins


def per_token_windows(
    families: Families, since: float, step: float, leave_out: Sequence[Window]
) -> tuple[tuple[float, float, float], ...]:
    """(window end, seconds, requests) per window: the increases of request_time_per_output_token's
    sum and count, binned as the acceptance windows are, so that two tracks' windows pair by their end."""
    bins = _binned(families, (f"{PER_TOKEN}_sum", f"{PER_TOKEN}_count"), since, step, leave_out)
    return tuple((since + (k + 1) * step, total, count) for k, (total, count) in sorted(bins.items()))


def histogram(families: Families, name: str, since: float, leave_out: Sequence[Window]) -> Histogram | None:
    """A histogram's bucket increases over the window, summed over pods; None without buckets."""
    counts: dict[float, float] = defaultdict(float)
    for series in families.get(f"{name}_bucket", []):
        if any(not math.isfinite(v) for t, v in series.points if t >= since):
            return None  # a NaN bucket says nothing of a quantile (and would break the cumulation)
        bound = float(series.labels["le"])
        counts[bound] += _total([series], since, leave_out)
    if not counts:
        return None
    bounds = sorted(counts)
    return Histogram(bounds=tuple(bounds), counts=tuple(counts[b] for b in bounds))


def engine_steps(families: Families, since: float, leave_out: Sequence[Window]) -> float | None:
    """The engine steps over the window, summed over pods (the step histogram's count); None where
    no engine exports it, so that the stall gate says it counts samples instead."""
    series = families.get(STEPS, [])
    return _finite(_total(series, since, leave_out)) if series else None


def _mean(families: Families, name: str, since: float, leave_out: Sequence[Window]) -> float | None:
    total, count = (_total(families.get(f"{name}_{part}", []), since, leave_out) for part in ("sum", "count"))
    return total / count if count > 0 else None


def _rate(series: Iterable[Series], since: float, leave_out: Sequence[Window]) -> float | None:
    """Per second, summed over series: each series' increases over the time they cover."""
    rates = []
    for s in series:
        increases = s.increases(since, leave_out)
        covered = sum(i.end - i.start for i in increases)
        if covered > 0:
            rates.append(sum(i.value for i in increases) / covered)
    return sum(rates) if rates else None


def _load(families: Families, since: float, leave_out: Sequence[Window]) -> Load:
    """What the track's pods carried per pod, each weighed by the time it was scraped in the window:
    a pod that left (scaled down, replaced, drained) or came late counts for the seconds it was
    there, and one whose last scrape fell before the window (the query reaches back) not at all. A
    pod counted whole would halve the per-pod load for as long as the window lasts."""
    finished: dict[str, float] = defaultdict(float)
    seconds: dict[str, float] = defaultdict(float)  # by instance: the longest of its series' spans
    for s in families.get(SUCCEEDED, []):
        increases = s.increases(since, leave_out)
        pod = s.labels.get("instance", "")
        finished[pod] += sum(i.value for i in increases)
        seconds[pod] = max(seconds[pod], sum(i.end - i.start for i in increases))
    running: dict[str, list[float]] = defaultdict(list)  # by instance: its samples in the window
    for s in families.get(RUNNING, []):
        running[s.labels.get("instance", "")] += s.values(since, leave_out)
    scraped = sum(seconds.values())
    samples = [v for values in running.values() for v in values]
    pods = {pod for pod, covered in seconds.items() if covered > 0} | {pod for pod, v in running.items() if v}
    return Load(
        len(pods),
        _round(sum(finished.values()) / scraped) if scraped > 0 else None,
        _round(statistics.fmean(samples)) if samples else None,
    )


def _position(label: str) -> int:
    return int(label) if label.isdigit() else 0


def _finite_sum(values: Iterable[float]) -> float:
    return sum(v for v in values if math.isfinite(v))


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _round(value: float | None) -> float | None:
    return None if value is None else _finite(round(value, 3))
