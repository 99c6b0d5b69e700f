"""The only module that talks to Prometheus: PromQL for one track's figures over a window.

Every query selects one track of one SpeculativeDeployment by target labels
({namespace, specgate_dev_deployment, specgate_dev_track} by default, see MetricsSource) and sums
over pods and engines, because vLLM exports one series per engine and alpha is a ratio of sums.
Counters are read with increase(), which tolerates restarts of the pods (counter resets).

Nothing here raises but MetricsUnavailable, and no figure is NaN or infinite: Prometheus answers
"NaN" for 0/0 (a ratio of rates on an idle track) and "+Inf" for x/0, and neither may reach status.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from specgate.api import MetricsSource, is_http_url
from specgate.gates import AcceptanceWindow, Histogram
from specgate.rollout import TrackMetrics, Window

# vLLM >= 0.10.2 names inter-token latency inter_token_latency_seconds; older versions (removed by
# 0.13) call the same per-step histogram time_per_output_token_seconds. The first with data wins.
ITL_METRICS = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
TTFT = "vllm:time_to_first_token_seconds"
PER_TOKEN = "vllm:request_time_per_output_token_seconds"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATED = "vllm:generation_tokens_total"
SUCCEEDED = "vllm:request_success_total"
RUNNING = "vllm:num_requests_running"

# Acceptance is judged per window of this many seconds: windows, not single tokens, are the
# independent units the gate's statistics count (tokens within a request are correlated).
ACCEPTANCE_STEP_SECONDS = 15


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

    def __str__(self) -> str:
        lab = self.labels
        return (
            f'{{{lab.namespace_label}="{self.namespace}",{lab.deployment_label}="{self.deployment}",'
            f'{lab.track_label}="{self.track}"}}'
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
            # Past that check the constructor cannot raise (it only parses the URL).
            self._connection = PrometheusConnect(url=self._url, disable_ssl=True, timeout=self._timeout)
        return self._connection

    def track_metrics(self, sel: Selector, window: Window) -> TrackMetrics | None:
        """The track's figures over the window; None when the track has no series at all."""
        try:
            return self._track_metrics(sel, window)
        except MALFORMED_ERRORS as exc:
            raise MetricsUnavailable(f"malformed Prometheus response: {exc!r}") from exc

    def acceptance_totals(self, sel: Selector, window: Window) -> AcceptanceWindow | None:
        """The track's spec-decode counter increases over the whole window (e.g. a benchmark Job's
        run); None when the track has no drafts in it."""
        rng = f"[{max(int((window.end - window.start).total_seconds()), 1)}s]"
        try:
            drafts, draft_tokens, accepted = (
                self._scalar(f"sum(increase({name}{sel}{rng}))", window.end)
                for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED)
            )
        except MALFORMED_ERRORS as exc:
            raise MetricsUnavailable(f"malformed Prometheus response: {exc!r}") from exc
        if drafts is None or draft_tokens is None or accepted is None:
            return None
        return AcceptanceWindow(drafts, draft_tokens, accepted)

    def _track_metrics(self, sel: Selector, window: Window) -> TrackMetrics | None:
        seconds = max(int((window.end - window.start).total_seconds()), 1)
        rng = f"[{seconds}s]"
        at = window.end
        found = self._first_histogram(ITL_METRICS, sel, rng, at)
        if found is None:
            return None
        itl_name, histogram = found
        itl = _finite_histogram(histogram)
        ttft = self._scalar(f"histogram_quantile(0.99, sum by (le) (increase({TTFT}_bucket{sel}{rng})))", at)
        acceptance, per_position = self._acceptance_windows(sel, window)
        return TrackMetrics(
            acceptance=acceptance,
            accepted_per_position=per_position,
            itl=itl,
            mean_itl_ms=_ms(self._mean(itl_name, sel, rng, at)),
            window_start=window.start,
            p99_ttft_ms=_ms(ttft),
            per_token_latency_ms=_ms(self._mean(PER_TOKEN, sel, rng, at)),
            output_tokens_per_second=_round(self._scalar(f"sum(rate({GENERATED}{sel}{rng}))", at)),
            requests_per_second=_round(self._scalar(f"sum(rate({SUCCEEDED}{sel}{rng}))", at)),
            concurrency=_round(self._scalar(f"avg_over_time(sum({RUNNING}{sel})[{seconds}s:])", at)),
        )

    # --- queries ---

    def _acceptance_windows(
        self, sel: Selector, window: Window
    ) -> tuple[tuple[AcceptanceWindow, ...], tuple[float, ...]]:
        """Per-step increases of the spec-decode counters over the window, and the accepted tokens
        per draft position summed over the same steps (so that they divide by the same drafts)."""
        step = ACCEPTANCE_STEP_SECONDS
        # Each point covers the step before it, so the first point is one step into the window.
        steps = Window(window.start + timedelta(seconds=step), window.end)
        if steps.start > steps.end:
            return (), ()
        drafts, draft_tokens, accepted = (
            self._range(f"sum(increase({name}{sel}[{step}s]))", steps, step).get("", {})
            for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED)
        )
        times = sorted(set(drafts) & set(draft_tokens) & set(accepted))
        by_position = self._range(
            f"sum by (position) (increase({ACCEPTED_PER_POS}{sel}[{step}s]))", steps, step
        )
        per_position = tuple(
            _finite_sum(by_position[p].get(t, 0.0) for t in times) for p in sorted(by_position, key=_position)
        )
        # NaN windows are kept: the acceptance gate drops them and says how many it dropped.
        windows = tuple(AcceptanceWindow(drafts[t], draft_tokens[t], accepted[t]) for t in times)
        return windows, per_position

    def _first_histogram(
        self, names: tuple[str, ...], sel: Selector, rng: str, at: datetime
    ) -> tuple[str, Histogram] | None:
        """The first of the histograms (by base name) with data, and its bucket increases."""
        for name in names:
            result = self._query(f"sum by (le) (increase({name}_bucket{sel}{rng}))", at)
            if result:
                buckets = sorted((float(r["metric"]["le"]), float(r["value"][1])) for r in result)
                histogram = Histogram(
                    bounds=tuple(b for b, _ in buckets), counts=tuple(c for _, c in buckets)
                )
                return name, histogram
        return None

    def _mean(self, histogram: str, sel: Selector, rng: str, at: datetime) -> float | None:
        return self._scalar(
            f"sum(increase({histogram}_sum{sel}{rng})) / sum(increase({histogram}_count{sel}{rng}))", at
        )

    def _scalar(self, promql: str, at: datetime) -> float | None:
        result = self._query(promql, at)
        return _finite(float(result[0]["value"][1])) if result else None

    def _query(self, promql: str, at: datetime) -> list[dict[str, Any]]:
        prom = self._prom()
        try:
            result: list[dict[str, Any]] = prom.custom_query(promql, params={"time": at.timestamp()})
        except QUERY_ERRORS as exc:
            raise MetricsUnavailable(f"Prometheus query failed: {exc}") from exc
        return result

    def _range(self, promql: str, window: Window, step: int) -> dict[str, dict[float, float]]:
        """A range query's series keyed by the value of the one label it groups by ("" for a plain sum)."""
        prom = self._prom()
        try:
            result = prom.custom_query_range(
                promql, start_time=window.start, end_time=window.end, step=str(step)
            )
        except QUERY_ERRORS as exc:
            raise MetricsUnavailable(f"Prometheus range query failed: {exc}") from exc
        return {
            next(iter(r["metric"].values()), ""): {float(t): float(v) for t, v in r["values"]} for r in result
        }


def _position(label: str) -> int:
    return int(label) if label.isdigit() else 0


def _finite_histogram(histogram: Histogram) -> Histogram | None:
    """The histogram, unless a count is NaN or infinite: such counts say nothing of a quantile."""
    return histogram if all(math.isfinite(c) for c in histogram.counts) else None


def _finite_sum(values: Iterable[float]) -> float:
    return sum(v for v in values if math.isfinite(v))


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _round(value: float | None) -> float | None:
    return None if value is None else _finite(round(value, 3))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else _finite(round(seconds * 1000, 3))
