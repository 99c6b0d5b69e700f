"""Figures from raw Prometheus samples (prometheus.py's pure part), on series shaped as Prometheus
returns them: one point per scrape, counters that only grow except when an engine restarts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specgate import api, gates, measurements, prometheus
from specgate.gates import AcceptanceWindow
from specgate.observation import TrackMetrics, Window
from specgate.prometheus import ACCEPTED, DRAFT_TOKENS, DRAFTS, Selector, Series
from specgate.vllm_metrics import INTER_TOKEN_LATENCY, TIME_PER_OUTPUT_TOKEN

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
K = 4  # draft tokens per draft


def counters(
    pod: str,
    interval: float,
    offset: float,
    minutes: float,
    traffic: tuple[float, float],
    job: tuple[float, float, float, float] | None = None,
) -> dict[str, Series]:
    """One pod's drafts, draft tokens and accepted tokens, scraped every `interval` s from T0 +
    offset. traffic: (drafts per second, alpha) all along; job: (start s, end s, drafts per second,
    alpha) of a benchmark's extra requests."""
    rate, alpha = traffic
    points: dict[str, list[tuple[float, float]]] = {DRAFTS: [], DRAFT_TOKENS: [], ACCEPTED: []}
    drafts = accepted = 0.0
    t, last = offset, 0.0
    while t <= minutes * 60:
        span = t - last
        drafts += rate * span
        accepted += rate * span * K * alpha
        if job is not None:
            overlap = max(0.0, min(t, job[1]) - max(last, job[0]))
            drafts += job[2] * overlap
            accepted += job[2] * overlap * K * job[3]
        stamp = T0.timestamp() + t
        points[DRAFTS].append((stamp, drafts))
        points[DRAFT_TOKENS].append((stamp, drafts * K))
        points[ACCEPTED].append((stamp, accepted))
        last, t = t, t + interval
    return {name: Series({"instance": pod, "engine": "0"}, tuple(p)) for name, p in points.items()}


def families(*pods: dict[str, Series]) -> dict[str, list[Series]]:
    out: dict[str, list[Series]] = {}
    for pod in pods:
        for name, series in pod.items():
            out.setdefault(name, []).append(series)
    return out


def alpha(windows: tuple[AcceptanceWindow, ...]) -> float:
    return sum(w.accepted_tokens for w in windows) / sum(w.draft_tokens for w in windows)


@pytest.mark.parametrize("interval", [15.0, 30.0, 60.0])
def test_windows_follow_the_scrape_interval_and_count_every_increase(interval: float) -> None:
    """Two pods scraped at different offsets: the windows are one interval long, and together they
    hold every draft between each pod's first and last scrape in the window (increase() over a
    15 s range at a 15 s scrape returned no window at all)."""
    pods = [
        counters("a:8000", interval, 3.0, 10, (10, 0.7)),
        counters("b:8000", interval, 11.0, 10, (5, 0.7)),
    ]
    start = T0 + timedelta(minutes=2)
    metrics = prometheus._track_metrics(
        families(*pods), Window(start, T0 + timedelta(minutes=10)), interval, ()
    )
    assert metrics.acceptance_window_seconds == max(15.0, interval)
    assert metrics.scrape_interval_seconds == interval
    assert len(metrics.acceptance) == pytest.approx(8 * 60 / max(15.0, interval), abs=1)
    expected = 0.0
    for pod in pods:
        inside = [v for t, v in pod[DRAFTS].points if t >= start.timestamp()]
        expected += inside[-1] - inside[0]
    assert sum(w.drafts for w in metrics.acceptance) == pytest.approx(expected)
    assert alpha(metrics.acceptance) == pytest.approx(0.7)


def test_a_longer_spacing_than_configured_widens_the_windows() -> None:
    pod = counters("a:8000", 30.0, 0.0, 10, (10, 0.7))
    metrics = prometheus._track_metrics(families(pod), Window(T0, T0 + timedelta(minutes=10)), 15.0, ())
    assert (metrics.scrape_interval_seconds, metrics.acceptance_window_seconds) == (30.0, 30.0)


def test_a_counter_reset_counts_from_zero() -> None:
    points = ((0.0, 100.0), (15.0, 160.0), (30.0, 20.0), (45.0, 50.0))
    increases = Series({}, points).increases(0.0, ())
    assert [i.value for i in increases] == [60.0, 20.0, 30.0]


def test_a_scrape_on_a_windows_end_counts_in_the_window_it_ends() -> None:
    """Windows from `since` are (start, end]: an increase whose later scrape falls exactly on a
    window's end belongs to the window ending there. Counted in the next one, every figure of a
    pod scraped on the grid would move a window late, and the latest into a window not yet over
    (which the guard leaves for its next look)."""
    since = T0.timestamp()
    stamps = (since, since + 15, since + 30, since + 45)
    drafts, accepted = (0.0, 10.0, 30.0, 60.0), (0.0, 30.0, 60.0, 150.0)
    pod = {
        DRAFTS: Series({"instance": "a:8000"}, tuple(zip(stamps, drafts, strict=True))),
        DRAFT_TOKENS: Series(
            {"instance": "a:8000"}, tuple((t, K * d) for t, d in zip(stamps, drafts, strict=True))
        ),
        ACCEPTED: Series({"instance": "a:8000"}, tuple(zip(stamps, accepted, strict=True))),
    }
    windows, _ = prometheus.acceptance_windows(families(pod), since, 15.0, ())
    assert windows == (
        AcceptanceWindow(10, 40, 30),
        AcceptanceWindow(20, 80, 30),
        AcceptanceWindow(30, 120, 90),
    )
    assert [w.end for w in windows] == [since + 15, since + 30, since + 45]


def test_benchmark_requests_do_not_move_the_traffic_alpha() -> None:
    """Production traffic at alpha 0.6 and a benchmark Job at alpha 0.95 on the same canary pod: with
    the Job's span left out the traffic alpha is the traffic's; without, the Job drags it up."""
    job = (200.0, 380.0, 40.0, 0.95)
    pod = counters("a:8000", 15.0, 4.0, 10, (10, 0.6), job=job)
    window = Window(T0, T0 + timedelta(minutes=10))
    job_span = Window(T0 + timedelta(seconds=job[0] - 15), T0 + timedelta(seconds=job[1] + 30))
    clean = prometheus._track_metrics(families(pod), window, 15.0, [job_span])
    mixed = prometheus._track_metrics(families(pod), window, 15.0, [])
    assert alpha(clean.acceptance) == pytest.approx(0.6)
    # traffic counted from the first scrape (4 s) to the last (589 s): 585 s of it, and all 180 s of the Job
    assert alpha(mixed.acceptance) == pytest.approx(
        (10 * 585 * 0.6 + 40 * 180 * 0.95) / (10 * 585 + 40 * 180)
    )
    assert len(clean.acceptance) < len(mixed.acceptance)


def served(pod: str, scrapes: range, requests_per_second: float, running: float) -> dict[str, Series]:
    """One pod's finished requests (two finished_reason series, as vLLM exports) and its running
    gauge, scraped every 15 s at the seconds in `scrapes` after T0."""
    stamps = [T0.timestamp() + t for t in scrapes]
    finished = {
        reason: Series(
            {"instance": pod, "finished_reason": reason},
            tuple((stamp, share * requests_per_second * t) for stamp, t in zip(stamps, scrapes, strict=True)),
        )
        for reason, share in (("stop", 0.75), ("length", 0.25))
    }
    return {f"{prometheus.SUCCEEDED}#{reason}": series for reason, series in finished.items()} | {
        prometheus.RUNNING: Series({"instance": pod}, tuple((stamp, running) for stamp in stamps))
    }


def track(*pods: dict[str, Series], start: float) -> TrackMetrics:
    """The track's figures over the window from T0 + start, its pods' series merged by family."""
    merged: dict[str, list[Series]] = {}
    for pod in pods:
        for name, series in pod.items():
            merged.setdefault(name.split("#")[0], []).append(series)
    window = Window(T0 + timedelta(seconds=start), T0 + timedelta(minutes=10))
    return prometheus._track_metrics(merged, window, 15.0, ())


def load(*pods: dict[str, Series], start: float) -> gates.Load:
    return track(*pods, start=start).load


def test_a_tracks_request_rate_and_concurrency_sum_its_pods() -> None:
    """Two pods serving 2 and 1 requests a second, running 4 and 2 at a time: the track serves 3 a
    second with 6 running; a track whose pods finished no request has no request rate (not 0)."""
    scrapes = range(0, 600, 15)
    figures = track(served("a:8000", scrapes, 2.0, 4.0), served("b:8000", scrapes, 1.0, 2.0), start=150.0)
    assert (figures.requests_per_second, figures.concurrency) == (pytest.approx(3.0), pytest.approx(6.0))
    idle = track({prometheus.RUNNING: gauge({"instance": "a:8000"}, scrapes, 0.0)}, start=150.0)
    assert (idle.requests_per_second, idle.concurrency) == (None, 0.0)


def test_a_pod_gone_before_the_window_is_not_a_pod_of_it() -> None:
    """The query reaches two scrapes before the window: a baseline pod scaled down just before the
    analysis began is in the answer, but carried nothing in the window, so it must not halve the
    per-pod load (that kept a canary's latency uncompared until maxAnalysisDuration)."""
    stayed = served("a:8000", range(0, 600, 15), requests_per_second=2.0, running=3.0)
    gone = served("b:8000", range(0, 120, 15), requests_per_second=2.0, running=3.0)
    assert load(stayed, gone, start=120.0) == gates.Load(1, 2.0, 3.0)


def test_a_pod_drained_early_in_the_window_weighs_by_the_seconds_it_was_scraped() -> None:
    """A pod taken out of the Service still answers scrapes, with no traffic, for 30 s of the
    window, beside one that serves 2 requests a second and runs 4 at a time, scraped over 435 s: per
    pod and second scraped, 870 requests in 465 s, and 4 running in 30 of 33 scrapes."""
    serving = served("a:8000", range(150, 600, 15), requests_per_second=2.0, running=4.0)
    drained = served("b:8000", range(150, 181, 15), requests_per_second=0.0, running=0.0)
    figures = load(serving, drained, start=150.0)
    assert figures.pods == 2
    assert figures.requests_per_second_per_pod == pytest.approx(870 / 465, abs=1e-3)
    assert figures.running_per_pod == pytest.approx(4.0 * 30 / 33, abs=1e-3)


def gauge(labels: dict[str, str], scrapes: range, value: float) -> Series:
    return Series(labels, tuple((T0.timestamp() + t, value) for t in scrapes))


def test_a_pod_counts_once_for_all_its_engines_and_before_its_first_finished_request() -> None:
    """Pod a runs two engines (a running gauge each: 2 and 4); pod b has finished no request yet, so
    it has no success series, only its gauge (3). Two pods, a's 2 requests a second over a's
    scraped seconds, and 3 running on average over every gauge's samples."""
    stamps = range(0, 600, 15)
    two_engines = served("a:8000", stamps, requests_per_second=2.0, running=2.0)
    two_engines[f"{prometheus.RUNNING}#1"] = gauge({"instance": "a:8000", "engine": "1"}, stamps, 4.0)
    starting = {prometheus.RUNNING: gauge({"instance": "b:8000"}, stamps, 3.0)}
    assert load(two_engines, starting, start=150.0) == gates.Load(2, 2.0, 3.0)


def test_accepted_tokens_per_position_sum_the_pods_in_the_positions_order() -> None:
    """Position labels sort as numbers (10 after 2), and a position sums every pod's series: two
    pods, 4 increases each of 5, 3 and 1 accepted tokens at positions 0, 2 and 10."""
    per_scrape = {"10": 1.0, "2": 3.0, "0": 5.0}
    series = [
        Series(
            {"instance": pod, "position": position}, tuple((T0.timestamp() + 15 * i, n * i) for i in range(5))
        )
        for pod in ("a:8000", "b:8000")
        for position, n in per_scrape.items()
    ]
    families = {prometheus.ACCEPTED_PER_POS: series}
    _, per_position = prometheus.acceptance_windows(families, T0.timestamp(), 15.0, ())
    assert per_position == (40.0, 24.0, 8.0)


# --- the ITL histogram's older name and custom target labels ---

OLD_ITL = TIME_PER_OUTPUT_TOKEN  # vLLM before 0.10.2 (removed by 0.13)
NEW_ITL = INTER_TOKEN_LATENCY


def itl_series(
    name: str, per_scrape: tuple[float, float], minutes: float = 2, instance: str = "a:8000"
) -> dict[str, list[Series]]:
    """One pod's ITL histogram scraped every 15 s from T0: per scrape, per_scrape[0] samples at most
    25 ms and per_scrape[1] between 25 and 50 ms, 1.2 s of ITL in all (40 samples, 30 ms mean)."""
    fast, slow = per_scrape
    stamps = [T0.timestamp() + 15 * i for i in range(int(minutes * 4) + 1)]
    cumulative = {"0.025": fast, "0.05": fast + slow, "+Inf": fast + slow}
    pod = {"instance": instance}
    return {
        f"{name}_bucket": [
            Series({**pod, "le": le}, tuple((t, per * i) for i, t in enumerate(stamps)))
            for le, per in cumulative.items()
        ],
        f"{name}_sum": [Series(pod, tuple((t, 1.2 * i) for i, t in enumerate(stamps)))],
        f"{name}_count": [Series(pod, tuple((t, (fast + slow) * i) for i, t in enumerate(stamps)))],
    }


def test_the_older_itl_name_is_read_when_the_newer_is_absent() -> None:
    """A vLLM older than 0.10.2 exports only time_per_output_token_seconds: 8 scrape increases of
    (10, 30) samples give buckets (80, 320, 320) and a 30 ms mean."""
    window = Window(T0, T0 + timedelta(minutes=2))
    metrics = prometheus._track_metrics(itl_series(OLD_ITL, (10, 30)), window, 15.0, ())
    assert metrics.itl is not None
    assert (metrics.itl.bounds, metrics.itl.counts) == ((0.025, 0.05, math.inf), (80.0, 320.0, 320.0))
    assert metrics.mean_itl_ms == pytest.approx(30.0)


def test_the_newer_itl_name_wins_when_both_are_exported() -> None:
    families = {**itl_series(OLD_ITL, (10, 30)), **itl_series(NEW_ITL, (30, 10))}
    metrics = prometheus._track_metrics(families, Window(T0, T0 + timedelta(minutes=2)), 15.0, ())
    assert metrics.itl is not None and metrics.itl.counts == (240.0, 320.0, 320.0)


def test_a_tracks_histogram_sums_the_buckets_of_its_pods() -> None:
    """Two pods' ITL buckets at the same bounds add up (each pod's alone: (80, 320, 320) and
    (240, 320, 320)), as `sum by (le)` would; kills the mutant that overwrote one pod's counts."""
    one, other = itl_series(NEW_ITL, (10, 30)), itl_series(NEW_ITL, (30, 10), instance="b:8000")
    families = {name: one[name] + other[name] for name in one}
    metrics = prometheus._track_metrics(families, Window(T0, T0 + timedelta(minutes=2)), 15.0, ())
    assert metrics.itl is not None and metrics.itl.counts == (320.0, 640.0, 640.0)


def test_the_engine_steps_sum_the_step_histograms_count_over_the_pods() -> None:
    """vllm:iteration_tokens_total's count rising 5 a scrape on one pod and 7 on another: 8
    increases each in 2 minutes, 40 + 56 = 96 steps; without the family no step count at all."""
    stamps = [T0.timestamp() + 15 * i for i in range(9)]
    steps = [
        Series({"instance": pod}, tuple((t, per * i) for i, t in enumerate(stamps)))
        for pod, per in (("a:8000", 5.0), ("b:8000", 7.0))
    ]
    window = Window(T0, T0 + timedelta(minutes=2))
    families = {**itl_series(NEW_ITL, (10, 30)), prometheus.STEPS: steps}
    assert prometheus._track_metrics(families, window, 15.0, ()).engine_steps == 96.0
    assert prometheus._track_metrics(itl_series(NEW_ITL, (10, 30)), window, 15.0, ()).engine_steps is None


def test_a_counter_that_did_not_move_adds_nothing() -> None:
    """Equal consecutive scrapes are no increase, not a reset (which would count the whole value
    again): 5, 5, 7 is an increase of 2."""
    stamps = [T0.timestamp() + 15 * i for i in range(3)]
    series = Series({"instance": "a:8000"}, tuple(zip(stamps, (5.0, 5.0, 7.0), strict=True)))
    assert [i.value for i in series.increases(stamps[0], ())] == [0.0, 2.0]


CUSTOM_LABELS = {"namespaceLabel": "kubernetes_namespace", "deploymentLabel": "app", "trackLabel": "role"}


def custom_selector() -> Selector:
    source = api.MetricsSource.model_validate(CUSTOM_LABELS)
    return Selector("ml", "llama", "canary", source)


def test_custom_target_labels_name_the_matchers() -> None:
    assert custom_selector().matchers() == 'kubernetes_namespace="ml",app="llama",role="canary"'


@dataclass
class FakeConnection:
    """PrometheusConnect's custom_query: records the query, answers with raw JSON-shaped series."""

    result: list[dict[str, Any]]
    queries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def custom_query(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        self.queries.append((query, params))
        return self.result


def as_json(families: dict[str, list[Series]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """The series as Prometheus's API returns them: __name__ among the labels, values as strings."""
    return [
        {"metric": {"__name__": name, **labels, **s.labels}, "values": [[t, str(v)] for t, v in s.points]}
        for name, series in families.items()
        for s in series
    ]


def test_a_track_is_queried_and_read_by_custom_target_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The range query selects the track by the configured label names (none of the defaults), over
    the 2 min window plus two 15 s scrapes, at the window's end; the older ITL name in the answer is
    read as the ITL."""
    labels = {"kubernetes_namespace": "ml", "app": "llama", "role": "canary"}
    connection = FakeConnection(as_json(itl_series(OLD_ITL, (10, 30)), labels))
    client = prometheus.PrometheusClient("http://prometheus:9090")
    monkeypatch.setattr(client, "_connection", connection)
    end = T0 + timedelta(minutes=2)
    metrics = client.track_metrics(custom_selector(), Window(T0, end), 15.0)
    [(query, params)] = connection.queries
    assert query.endswith(',kubernetes_namespace="ml",app="llama",role="canary"}[150s]'), query
    assert "specgate_dev" not in query and params == {"time": end.timestamp()}
    assert metrics is not None and metrics.itl is not None
    assert metrics.itl.counts == (80.0, 320.0, 320.0)


@dataclass
class FakeRangeConnection:
    """PrometheusConnect's custom_query_range: records each query, answers from `answers` by the
    counter it names (the matrix shape of /api/v1/query_range, values as strings)."""

    answers: dict[str, list[dict[str, Any]]]
    queries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def custom_query_range(self, query: str, **kw: Any) -> list[dict[str, Any]]:
        self.queries.append((query, kw))
        return next(answer for name, answer in self.answers.items() if f"({name}{{" in query)


def matrix(points: list[tuple[float, float]]) -> list[dict[str, Any]]:
    return [{"metric": {}, "values": [[t, str(v)] for t, v in points]}]


def test_the_incumbents_history_is_one_range_query_per_counter_in_minute_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four hours back at a 60 s step (a 15 s scrape: four scrapes a block), increases summed over
    pods by Prometheus; the two answers are matched by timestamp and a step missing from either
    (no pod scraped) is left out, not shifted."""
    start, end = T0, T0 + timedelta(hours=4)
    stamps = [start.timestamp() + 60 * i for i in range(1, 5)]
    tokens = [(stamps[0], 400.0), (stamps[1], 800.0), (stamps[3], 200.0)]
    accepted = [(stamps[0], 220.0), (stamps[1], 480.0), (stamps[2], 30.0), (stamps[3], 100.0)]
    connection = FakeRangeConnection({DRAFT_TOKENS: matrix(tokens), ACCEPTED: matrix(accepted)})
    client = prometheus.PrometheusClient("http://prometheus:9090")
    monkeypatch.setattr(client, "_connection", connection)
    selector = Selector("ml", "llama", "canary", api.MetricsSource())
    history, step = client.history_windows(selector, Window(start, end), 15.0)
    assert step == 60.0
    assert history == (
        AcceptanceWindow(0.0, 400.0, 220.0, end=stamps[0]),
        AcceptanceWindow(0.0, 800.0, 480.0, end=stamps[1]),
        AcceptanceWindow(0.0, 200.0, 100.0, end=stamps[3]),
    )
    assert [e.end for e in history] == [stamps[0], stamps[1], stamps[3]]
    queries = [q for q, _ in connection.queries]
    assert queries == [
        f"sum(increase({name}{{{selector.matchers()}}}[60s]))" for name in (DRAFT_TOKENS, ACCEPTED)
    ]
    assert all(kw == {"start_time": start, "end_time": end, "step": "60s"} for _, kw in connection.queries)


def test_a_slow_scrape_widens_the_historys_blocks() -> None:
    """At a 30 s scrape a 60 s range holds two samples at best: the blocks grow to four scrapes."""
    assert prometheus.history_step(30.0) == 120.0
    assert prometheus.history_step(15.0) == gates.DRIFT_BLOCK_SECONDS == 60.0


def test_a_malformed_history_answer_is_metrics_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    connection = FakeRangeConnection({DRAFT_TOKENS: [{"metric": {}}], ACCEPTED: matrix([])})
    client = prometheus.PrometheusClient("http://prometheus:9090")
    monkeypatch.setattr(client, "_connection", connection)
    selector = Selector("ml", "llama", "canary", api.MetricsSource())
    with pytest.raises(prometheus.MetricsUnavailable, match="malformed"):
        client.history_windows(selector, Window(T0, T0 + timedelta(hours=4)), 15.0)


def test_status_reports_the_scrapes_it_counted_not_the_querys_window() -> None:
    """A reading at 12:02:30.6 over a window from 12:00:31.4: the scrapes at 12:00:30 (before the
    window) and 12:02:30 (stamped before the reading, still in flight: a loaded engine answers
    /metrics late, and Prometheus stamps a scrape when it starts) are not in what the operator
    counts. Status says the figures run from the 12:00:45 scrape to the 12:02:15 one, so anyone
    who sets the engine's own counters beside them (the real-engine cluster test does) compares the
    same span; the query's edges would add a scrape interval at either end."""
    pod = counters("a:8000", 15.0, 0.0, 2.25, (20, 0.7))  # scrapes at 12:00:00, :15, ... 12:02:15
    window = Window(T0 + timedelta(seconds=31.4), T0 + timedelta(seconds=150.6))
    metrics = prometheus._track_metrics(families(pod), window, 15.0, ())
    status = measurements.measurement(metrics, window.end)
    assert (status.window_start, status.window_end) == ("2026-11-23T12:00:45Z", "2026-11-23T12:02:15Z")
    assert sum(w.drafts for w in metrics.acceptance) == pytest.approx(20 * 90)


def test_without_a_scrape_in_the_window_status_keeps_the_querys_window() -> None:
    pod = counters("a:8000", 15.0, 0.0, 0.5, (20, 0.7))  # the last scrape at 12:00:30
    window = Window(T0 + timedelta(seconds=31.4), T0 + timedelta(seconds=40.2))
    status = measurements.measurement(prometheus._track_metrics(families(pod), window, 15.0, ()), window.end)
    assert (status.window_start, status.window_end) == ("2026-11-23T12:00:31Z", "2026-11-23T12:00:40Z")


def test_per_token_sums_and_counts_are_binned_as_the_acceptance_windows_and_pair_by_end() -> None:
    """request_time_per_output_token's sum and count scraped at 0, 10, 20 and 40 s: increases of
    (1.0 s, 40 requests) ending at 10 s, (0.5, 20) at 20 s and (0.5, 20) at 40 s fall in the 15-s
    windows ending at 15, 30 and 45 s. A baseline with windows ending at 15 and 30 s pairs with two."""
    name = prometheus.PER_TOKEN
    times = (0.0, 10.0, 20.0, 40.0)
    families = {
        f"{name}_sum": [prometheus.Series({}, tuple(zip(times, (0.0, 1.0, 1.5, 2.0), strict=True)))],
        f"{name}_count": [prometheus.Series({}, tuple(zip(times, (0.0, 40.0, 60.0, 80.0), strict=True)))],
    }
    canary = prometheus.per_token_windows(families, 0.0, 15.0, ())
    assert canary == ((15.0, 1.0, 40.0), (30.0, 0.5, 20.0), (45.0, 0.5, 20.0))
    baseline = TrackMetrics(per_token_windows=((15.0, 1.2, 40.0), (30.0, 0.6, 20.0)))
    pairs = measurements.paired_per_token(baseline, TrackMetrics(per_token_windows=canary))
    assert [
        (w.baseline_seconds, w.baseline_requests, w.canary_seconds, w.canary_requests) for w in pairs
    ] == [
        (1.2, 40.0, 1.0, 40.0),
        (0.6, 20.0, 0.5, 20.0),
    ]


def per_token_pod(stamps: list[float], seconds_per_request: float) -> dict[str, list[Series]]:
    """A pod's request_time_per_output_token sum and count, one request finished per scrape."""
    name = prometheus.PER_TOKEN
    count = [float(i) for i in range(len(stamps))]
    total = [c * seconds_per_request for c in count]
    return {
        f"{name}_sum": [Series({}, tuple(zip(stamps, total, strict=True)))],
        f"{name}_count": [Series({}, tuple(zip(stamps, count, strict=True)))],
    }


def test_two_tracks_windows_pair_though_a_loaded_prometheus_stamps_one_a_few_ms_late() -> None:
    """CI's real-engine rollout at a 15 s scrape: the canary's scrapes stamped 2-4 ms late (its
    median spacing 15.001 s), the baseline's on time. Each track's windows were as long as its own
    median spacing, so none of the canary's ended where the baseline's did, and the speedup gate
    paired no window in 8 minutes ("0 windows with requests on both tracks"). On the configured
    interval's grid both tracks' windows end together."""
    start = T0.timestamp()
    on_time = [start + 15.0 * i for i in range(40)]
    late = [start + 15.0 * i + 0.002 + 0.001 * (i % 3) for i in range(40)]
    window = Window(T0, T0 + timedelta(minutes=10))
    baseline = prometheus._track_metrics(per_token_pod(on_time, 0.050), window, 15.0, ())
    canary = prometheus._track_metrics(per_token_pod(late, 0.040), window, 15.0, ())
    assert canary.scrape_interval_seconds > 15.0  # the spacing as observed
    assert baseline.acceptance_window_seconds == canary.acceptance_window_seconds == 15.0
    pairs = measurements.paired_per_token(baseline, canary)
    assert len(pairs) >= 35
    assert sum(w.baseline_mean for w in pairs) / sum(w.canary_mean for w in pairs) == pytest.approx(1.25)
