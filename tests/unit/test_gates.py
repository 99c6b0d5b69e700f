"""Gate statistics against known cases and simulated streams with known alpha."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate import api
from specgate.gates import (
    MIN_DESIGN_WINDOWS,
    MIN_WINDOWS,
    NO_DRIFT,
    AcceptanceWindow,
    GateResult,
    Histogram,
    Load,
    MixDrift,
    Verdict,
    acceptance_gate,
    acceptance_interval,
    comparable_load,
    confidence_radius,
    decide_at_deadline,
    drift_from_history,
    fallback_drift,
    fixed_sample_acceptance_gate,
    histogram_quantile,
    history_design_effect,
    latency_gate,
    long_run_variance,
    measure_mix_drift,
    mix_drift_variance,
    residual_variance,
    span_seconds,
    spec_acceptance_gate,
    sprt_bounds,
    sprt_log_lr,
    student_t_quantile,
    wald_bounds,
    worst,
)
from specgate_lab.sim.streams import draft_windows

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import traffic

INF = math.inf


def correlated_windows(alpha: float, windows: int, rng: random.Random) -> list[AcceptanceWindow]:
    return draft_windows(alpha, windows, rng)


def true_alpha(windows: list[AcceptanceWindow]) -> float:
    return sum(w.accepted_tokens for w in windows) / sum(w.draft_tokens for w in windows)


def long_run_alpha(alpha: float, **stream: tuple[int, int]) -> float:
    """The alpha a simulated stream converges to (the requests' levels are clipped, so not exactly
    `alpha`): what a verdict is right or wrong about."""
    return true_alpha(draft_windows(alpha, 3000, random.Random(11), **stream))


def first_verdict(
    stream: list[AcceptanceWindow], gate: float, *, error_rate: float = 0.05
) -> tuple[GateResult, int]:
    """The gate looked at after every window, as the operator does at each reconcile: the first
    Pass or Fail and the windows it took, or the last InsufficientData."""
    for m in range(MIN_WINDOWS, len(stream) + 1):
        result = acceptance_gate(stream[:m], gate, error_rate=error_rate)
        if result.verdict in (Verdict.PASS, Verdict.FAIL):
            return result, m
    return result, len(stream)


def test_confidence_sequence_covers_at_every_look() -> None:
    """Over many streams, the interval must contain the stream's long-run alpha at *all* looks in at
    least 1 - error_rate of streams (peeking does not break it)."""
    rng = random.Random(7)
    levels = (0.35, 0.5, 0.6, 0.75)
    long_run = {a: true_alpha(correlated_windows(a, 3000, random.Random(11))) for a in levels}
    misses, streams = 0, 240
    for i in range(streams):
        alpha = levels[i % len(levels)]
        stream = correlated_windows(alpha, 100, rng)
        target = long_run[alpha]
        for m in range(3, len(stream) + 1, 3):
            interval = acceptance_interval(stream[:m], 0.05)
            assert interval is not None
            if not interval[1] <= target <= interval[2]:
                misses += 1
                break
    assert misses / streams <= 0.05, f"{misses} of {streams} streams left the sequence at some look"


def test_radius_grows_like_sqrt_t_log_t() -> None:
    assert confidence_radius(1.0, 0, 0.05, m0=20) == pytest.approx(math.sqrt(20 * math.log(1 / 0.0025)))
    assert confidence_radius(2.0, 80, 0.05, m0=20) == pytest.approx(
        2 * math.sqrt(100 * math.log(100 / (20 * 0.0025)))
    )


@pytest.mark.parametrize(("alpha", "expected"), [(0.80, Verdict.PASS), (0.30, Verdict.FAIL)])
def test_clear_cases_decide(alpha: float, expected: Verdict) -> None:
    windows = correlated_windows(alpha, 40, random.Random(1))
    result = acceptance_gate(windows, 0.55)
    assert result.verdict == expected
    assert result.lower is not None and result.upper is not None
    assert result.lower <= (result.estimate or 0) <= result.upper
    assert "(gate 0.55 +/- 0.05)" in result.message and "SPRT log-LR" in result.message


@pytest.mark.parametrize(("alpha", "expected"), [(0.70, Verdict.PASS), (0.40, Verdict.FAIL)])
def test_clear_cases_decide_within_150_s_at_high_traffic(alpha: float, expected: Verdict) -> None:
    """300 drafts per window (the benchmark's traffic), alpha 0.15 from the gate: at least 90 % of
    streams decide within 10 windows, and none wrongly."""
    rng = random.Random(4)
    verdicts = [
        first_verdict(draft_windows(alpha, 10, rng, drafts_per_window=(300, 300)), 0.55)[0].verdict
        for _ in range(40)
    ]
    assert verdicts.count(expected) >= 36, verdicts
    assert set(verdicts) <= {expected, Verdict.INSUFFICIENT_DATA}


def test_near_the_gate_is_insufficient_not_a_guess() -> None:
    """At alpha = gate (inside the indifference zone) either verdict is allowed eventually, but not
    from the first few windows: after 6 windows (90 s) at least 90 % of streams are still undecided."""
    for stream_kind in ({}, {"drafts_per_window": (300, 300)}):
        gate = long_run_alpha(0.55, **stream_kind)
        rng = random.Random(3)
        early = sum(
            first_verdict(draft_windows(0.55, 6, rng, **stream_kind), gate)[0].verdict
            != Verdict.INSUFFICIENT_DATA
            for _ in range(100)
        )
        assert early <= 10, f"{early} of 100 streams decided within 6 windows at the gate ({stream_kind})"
    result = acceptance_gate(correlated_windows(0.55, 8, random.Random(3)), 0.55)
    assert result.verdict == Verdict.INSUFFICIENT_DATA and result.bound is not None
    assert f"within (-{result.bound:.1f}, {result.bound:.1f})" in result.message


def test_wrong_verdicts_at_the_edges_of_the_zone_are_at_most_error_rate() -> None:
    """The SPRT's promise, on correlated low-traffic streams (20-60 drafts per 15-s window, a request
    spanning windows; the harder case for the spread estimate) looked at after every window: with the
    true alpha exactly delta below the gate a Pass is wrong, exactly delta above a Fail is; each must
    happen in at most error_rate of streams. Alpha 0.75 (gate 0.70 / 0.80) is the skewed case where a
    plug-in spread fails this. A rule that never decides would pass, so most streams must decide."""
    error_rate, delta, windows = 0.05, 0.05, 60
    rng = random.Random(17)
    wrong = {Verdict.PASS: 0, Verdict.FAIL: 0}
    undecided = streams = 0
    for alpha in (0.45, 0.60, 0.75):
        truth = long_run_alpha(alpha)
        for _ in range(300):
            stream = draft_windows(alpha, windows, rng)
            streams += 1
            for gate, wrong_verdict in ((truth + delta, Verdict.PASS), (truth - delta, Verdict.FAIL)):
                verdict = first_verdict(stream, gate, error_rate=error_rate)[0].verdict
                wrong[wrong_verdict] += verdict == wrong_verdict
                undecided += verdict == Verdict.INSUFFICIENT_DATA
    rates = {v.value: n / streams for v, n in wrong.items()}
    assert max(rates.values()) <= error_rate, rates
    assert undecided / (2 * streams) <= 0.05, (
        f"{undecided} of {2 * streams} undecided after {windows} windows"
    )


def test_wald_bounds() -> None:
    assert wald_bounds(0.05) == pytest.approx((math.log(0.05 / 0.95), math.log(0.95 / 0.05)))
    assert wald_bounds(0.05)[1] == pytest.approx(2.944, abs=1e-3)
    assert wald_bounds(0.01) == pytest.approx((-4.595, 4.595), abs=1e-3)


def test_the_sprt_bounds_are_walds_moved_in_by_the_overshoot_of_a_step_at_most_half_way() -> None:
    """Siegmund's rho = -zeta(1/2) / sqrt(2 pi) = 1.46035 / 2.50663 = 0.5826 of a step's sd."""
    assert sprt_bounds(0.05, 0.0) == pytest.approx((-2.9444, 2.9444), abs=1e-4)
    assert sprt_bounds(0.05, 1.0) == pytest.approx((-2.9444 + 0.5826, 2.9444 - 0.5826), abs=1e-4)
    assert sprt_bounds(0.01, 2.0) == pytest.approx((-4.5951 + 1.1652, 4.5951 - 1.1652), abs=1e-4)
    assert sprt_bounds(0.05, 10.0) == pytest.approx((-1.4722, 1.4722), abs=1e-4)  # half of Wald's


@pytest.mark.parametrize("step_sd", [0.5, 1.0, 1.5])
def test_the_sprt_bounds_spend_the_error_rate_that_walds_leave_unspent(step_sd: float) -> None:
    """20,000 log-LR walks of Gaussian steps at the zone's lower edge (mean -sd^2 / 2, the log-LR's
    drift there), each stopped at the first bound it reaches: a wrong Pass is about errorRate 5 %
    likely with the corrected bounds (seen 4.7-5.0 %), where Wald's own give 2.2-3.7 %."""
    rng = np.random.default_rng(1)
    walks = rng.normal(-(step_sd**2) / 2, step_sd, (20_000, 400)).cumsum(axis=1)

    def wrong_pass_rate(bounds: tuple[float, float]) -> float:
        never = walks.shape[1]
        up = np.where((walks >= bounds[1]).any(axis=1), (walks >= bounds[1]).argmax(axis=1), never)
        down = np.where((walks <= bounds[0]).any(axis=1), (walks <= bounds[0]).argmax(axis=1), never)
        return float((up < down).mean())

    assert 0.04 <= wrong_pass_rate(sprt_bounds(0.05, step_sd)) <= 0.055
    assert wrong_pass_rate(wald_bounds(0.05)) < 0.04


def test_log_lr_is_the_gaussian_likelihood_ratio_and_decides_at_the_bounds() -> None:
    """The closed form equals sum log N(x_i; +delta n_i, s^2 n_i) - log N(x_i; -delta n_i, s^2 n_i), and
    the verdict changes exactly where it crosses Wald's bounds."""
    windows = correlated_windows(0.6, 12, random.Random(5))
    gate, delta = 0.55, 0.05
    s2 = residual_variance(windows, 0.05)

    def log_density(x: float, mean: float, var: float) -> float:
        return -((x - mean) ** 2) / (2 * var) - math.log(2 * math.pi * var) / 2

    direct = sum(
        log_density(w.accepted_tokens - gate * w.draft_tokens, delta * w.draft_tokens, s2 * w.draft_tokens)
        - log_density(w.accepted_tokens - gate * w.draft_tokens, -delta * w.draft_tokens, s2 * w.draft_tokens)
        for w in windows
    )
    llr = sprt_log_lr(windows, gate, delta, 0.05)
    assert llr == pytest.approx(direct)
    assert sprt_log_lr(windows, gate, delta, 0.05) == pytest.approx(
        -sprt_log_lr(windows, 2 * true_alpha(windows) - gate, delta, 0.05)
    )
    # Move the gate so the log-LR sits just above / below the Pass bound: the verdict follows.
    n = sum(w.draft_tokens for w in windows)
    a = sum(w.accepted_tokens for w in windows)
    # Wald's bounds less the overshoot: 0.5826 of a window's step, 2 delta sqrt(n / 12 s^2) / s^2
    shift = 0.5826 * 2 * delta * math.sqrt(n / len(windows) * s2) / s2
    pass_at = math.log(19) - shift
    at_bound = (a - pass_at * s2 / (2 * delta)) / n  # the gate where the log-LR equals pass_at
    assert acceptance_gate(windows, at_bound - 1e-4, min_drafts=1).verdict == Verdict.PASS
    assert acceptance_gate(windows, at_bound + 1e-4, min_drafts=1).verdict == Verdict.INSUFFICIENT_DATA
    fail_at = -pass_at
    at_fail = (a - fail_at * s2 / (2 * delta)) / n
    assert acceptance_gate(windows, at_fail + 1e-4, min_drafts=1).verdict == Verdict.FAIL
    assert acceptance_gate(windows, at_fail - 1e-4, min_drafts=1).verdict == Verdict.INSUFFICIENT_DATA


def test_min_drafts_and_empty_input() -> None:
    assert acceptance_gate([], 0.55).verdict == Verdict.INSUFFICIENT_DATA
    few = [AcceptanceWindow(10, 40, 40)] * 3
    result = acceptance_gate(few, 0.55, min_drafts=200)
    assert result.verdict == Verdict.INSUFFICIENT_DATA and "need 200 drafts" in result.message
    assert acceptance_gate([AcceptanceWindow(0, 0, 0)] * 10, 0.55).verdict == Verdict.INSUFFICIENT_DATA


def test_self_draft_alpha_one_passes() -> None:
    windows = [AcceptanceWindow(30, 120, 120)] * 10
    result = acceptance_gate(windows, 0.55)
    assert (result.verdict, result.estimate) == (Verdict.PASS, 1.0)
    assert result.upper == 1.0 and result.lower is not None and result.lower < 1.0
    assert "SPRT log-LR" in result.message


def test_alpha_zero_fails() -> None:
    result = acceptance_gate([AcceptanceWindow(30, 120, 0)] * 10, 0.55)
    assert (result.verdict, result.estimate) == (Verdict.FAIL, 0.0)


def test_nan_and_counter_resets_are_dropped_and_said() -> None:
    good = correlated_windows(0.8, 30, random.Random(2))
    broken = [
        AcceptanceWindow(math.nan, math.nan, math.nan),
        AcceptanceWindow(-5, -20, -10),
        AcceptanceWindow(5, 20, 30),
    ]
    result = acceptance_gate(good + broken, 0.55)
    assert result.verdict == Verdict.PASS
    assert "3 windows with NaN or negative increases dropped" in result.message


@given(
    st.lists(st.tuples(st.floats(0, 100), st.floats(0, 400), st.floats(0, 400)), max_size=30),
    st.floats(0.01, 0.49),
)
def test_never_crashes_and_bounds_are_ordered(raw: list[tuple[float, float, float]], delta: float) -> None:
    windows = [AcceptanceWindow(d, n, a) for d, n, a in raw]
    result = acceptance_gate(windows, 0.55, min_drafts=1, indifference=delta)
    if result.lower is not None and result.upper is not None and result.estimate is not None:
        assert 0 <= result.lower <= result.estimate <= result.upper <= 1


@given(
    st.lists(
        st.tuples(
            st.floats(allow_nan=True, allow_infinity=True),
            st.floats(allow_nan=True, allow_infinity=True),
            st.floats(allow_nan=True, allow_infinity=True),
        ),
        max_size=12,
    )
)
def test_never_crashes_on_any_float(raw: list[tuple[float, float, float]]) -> None:
    result = acceptance_gate([AcceptanceWindow(d, n, a) for d, n, a in raw], 0.55, min_drafts=1)
    assert result.verdict in (Verdict.PASS, Verdict.FAIL, Verdict.INSUFFICIENT_DATA)


# --- latency ---

BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, INF)


def test_histogram_quantile_matches_prometheus() -> None:
    # Prometheus: histogram_quantile(0.5) of {0.1: 10, 0.2: 20, +Inf: 20} is 0.1 (rank 10 at the edge)
    h = Histogram((0.1, 0.2, INF), (10, 20, 20))
    assert histogram_quantile(h, 0.5) == pytest.approx(0.1)
    assert histogram_quantile(h, 0.75) == pytest.approx(0.15)
    # rank in the +Inf bucket: the highest finite bound
    assert histogram_quantile(Histogram((0.1, INF), (5, 10)), 0.99) == pytest.approx(0.1)
    # first bucket interpolates from 0
    assert histogram_quantile(Histogram((0.1, INF), (10, 10)), 0.5) == pytest.approx(0.05)
    assert histogram_quantile(Histogram((0.1, INF), (0, 0)), 0.5) is None


def shaped(typical: float, n: float = 1000, spill: float = 0.005) -> Histogram:
    i = next(i for i, b in enumerate(BOUNDS) if typical <= b)
    counts = [0.0 if j < i else (n * (1 - spill) if j == i else n) for j in range(len(BOUNDS))]
    return Histogram(BOUNDS, tuple(counts))


# vLLM 0.32's inter-token latency buckets (seconds), as its /metrics exports them.
VLLM_ITL_BOUNDS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, INF,
)  # fmt: skip


def observed(samples: list[float], bounds: tuple[float, ...] = VLLM_ITL_BOUNDS) -> Histogram:
    """The cumulative bucket counts Prometheus would hold after these samples."""
    return Histogram(bounds, tuple(float(sum(1 for x in samples if x <= b)) for b in bounds))


def lognormal_with_p99(p99: float, n: int, seed: int, sigma: float = 0.25) -> list[float]:
    """n samples of a lognormal whose true 99th percentile is p99."""
    median = p99 / math.exp(2.3263 * sigma)
    rng = random.Random(seed)
    return [rng.lognormvariate(math.log(median), sigma) for _ in range(n)]


def exact_p99(samples: list[float]) -> float:
    return sorted(samples)[math.ceil(0.99 * len(samples)) - 1]


def test_same_distribution_passes() -> None:
    assert latency_gate(shaped(0.04, n=100_000), shaped(0.04, n=100_000)).verdict == Verdict.PASS


def test_clear_regression_fails_with_figures() -> None:
    result = latency_gate(shaped(0.04), shaped(0.14))
    assert result.verdict == Verdict.FAIL
    assert "P99 ITL canary" in result.message and "10%" in result.message


def test_an_87_percent_regression_inside_coarse_buckets_fails() -> None:
    """The case that passed before: baseline P99 28.9 ms, canary 53.9 ms (+87 %) on vLLM's buckets,
    which put them in neighbouring buckets (25-50 ms and 50-75 ms)."""
    baseline = lognormal_with_p99(0.0289, 20_000, seed=1)
    canary = lognormal_with_p99(0.0539, 20_000, seed=2)
    assert exact_p99(canary) / exact_p99(baseline) == pytest.approx(1.87, abs=0.05)
    result = latency_gate(observed(baseline), observed(canary), max_regression=0.10)
    assert result.verdict == Verdict.FAIL, result.message


@pytest.mark.parametrize("baseline_p99_ms", [11, 14, 19, 23, 28.9, 33, 41, 48, 52, 60, 70, 80, 95, 130, 180])
def test_a_large_regression_never_passes_wherever_the_p99_falls(baseline_p99_ms: float) -> None:
    """Regressions of 47 % and 87 % against baselines all over vLLM's bucket grid: the old gate
    passed some of each (it compared bucket edges); none may pass now."""
    for regression in (1.47, 1.87):
        for seed in range(3):
            baseline = lognormal_with_p99(baseline_p99_ms / 1000, 5_000, seed=seed)
            canary = lognormal_with_p99(regression * baseline_p99_ms / 1000, 5_000, seed=100 + seed)
            result = latency_gate(observed(baseline), observed(canary), max_regression=0.10)
            assert result.verdict != Verdict.PASS, (regression, result.message)


def test_too_few_samples_for_the_tolerance_names_the_buckets() -> None:
    """Equal distributions whose P99 sits near a wide bucket's top: 1000 samples cannot tell 10 %,
    and the message names the buckets, wider than the tolerance."""
    result = latency_gate(shaped(0.04), shaped(0.04), max_regression=0.10)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert "cannot tell 10% yet" in result.message
    assert "buckets wider than the tolerance (canary 25-50 ms, baseline 25-50 ms)" in result.message


def test_a_p99_beyond_the_last_bucket_is_never_a_pass() -> None:
    bounds = (0.01, 0.025, INF)
    h = Histogram(bounds, (0.0, 980.0, 100_000.0))
    result = latency_gate(h, h, max_regression=0.10, min_count=1)
    assert result.verdict == Verdict.INSUFFICIENT_DATA and "beyond the last bucket edge" in result.message
    assert "(25 ms); add higher buckets" in result.message  # the last finite edge, in ms


def test_latency_needs_samples_on_both_tracks() -> None:
    result = latency_gate(shaped(0.04, n=50), shaped(0.2, n=5000), min_count=100)
    assert result.verdict == Verdict.INSUFFICIENT_DATA and "need 100" in result.message


def test_worst_verdict_fail_then_unavailable_then_insufficient() -> None:
    order = [Verdict.FAIL, Verdict.METRICS_UNAVAILABLE, Verdict.INSUFFICIENT_DATA, Verdict.PASS]
    for i, expected in enumerate(order):
        assert worst(order[i:]) == worst([*reversed(order[i + 1 :]), expected]) == expected
    assert worst([]) == Verdict.PASS


def test_mix_drift_variance_is_the_variance_of_an_ou_average() -> None:
    """Against a simulated Ornstein-Uhlenbeck path (exact AR(1) steps of 1 s), averaged over spans
    shorter and longer than its timescale."""
    rng = np.random.default_rng(3)
    sd, tau, paths = 0.09, 180.0, 20_000
    rho = math.exp(-1 / tau)
    level = rng.normal(0, sd, paths)
    total = np.zeros(paths)
    for second in range(1, 1801):
        total += level
        level = rho * level + rng.normal(0, sd * math.sqrt(1 - rho**2), paths)
        if second in (60, 300, 1800):
            simulated = float(np.var(total / second))
            assert mix_drift_variance(sd, tau, second) == pytest.approx(simulated, rel=0.05), second
    assert mix_drift_variance(0.0, tau, 60) == 0.0
    assert mix_drift_variance(sd, tau, 0) == pytest.approx(sd**2)


@pytest.mark.parametrize(("drift", "most_wrong"), [(0.0, None), (0.09, 6)])
def test_a_drifting_mix_at_the_zones_lower_edge_is_rarely_passed(
    drift: float, most_wrong: int | None
) -> None:
    """bench/traffic.py's drifting mix (sd 0.35 logit, 3 min) at 200 requests per 15 s window and a
    long-run alpha of gate - indifference, looked at every window for 30 minutes. Without the mix's
    drift in the spread (mixDrift 0) the gate passes a fifth of these canaries on a swing of the
    mix; with the default it passes at most about errorRate of them."""
    t = traffic.for_alpha(0.50, 200, window_seconds=15.0, drift_sd=traffic.DRIFT_SD)
    rng = np.random.default_rng(11)
    trials, looks, gap = 100, 120, 40
    stream = traffic.windows(t, trials * (looks + gap), rng)
    wrong = 0
    for trial in range(trials):
        rows = stream[trial * (looks + gap) : trial * (looks + gap) + looks]
        windows = [AcceptanceWindow(*map(float, row)) for row in rows]
        for m in range(1, looks + 1):
            verdict = acceptance_gate(windows[:m], 0.55, mix_drift=drift, mix_drift_seconds=180.0).verdict
            if verdict != Verdict.INSUFFICIENT_DATA:
                wrong += verdict == Verdict.PASS
                break
    if most_wrong is None:
        assert wrong >= 10  # the failure the drift term exists for
    else:
        assert wrong <= most_wrong


# Three minutes of a steady canary at alpha 0.62: 12 windows of 15 s, 50 drafts of K=4 each.
THREE_MINUTES_AT_062 = [AcceptanceWindow(50, 200, 124) for _ in range(12)]


def test_the_drift_term_holds_a_verdict_until_the_mix_has_swung() -> None:
    """Over one timescale (180 s) the mix's drift adds 0.09^2 * 2 e^-1 = 0.00596 to the variance of
    the mean alpha, against alpha (1 - alpha) / N = 0.2356 / 2400 = 0.0000982 from the windows: the
    log-LR 2 * 0.05 * (0.62 - 0.55) / variance falls from 71.3 (a Pass) to 1.2, short of Wald's 2.9.
    (Without the drift one window's step has sd 0.1 * sqrt(200 * 0.2356) / 0.2356 = 2.91, so the
    bounds move in by half of Wald's, the most they move: 1.5; with it, by 0.03.)"""
    drifting = acceptance_gate(THREE_MINUTES_AT_062, 0.55, mix_drift=0.09, mix_drift_seconds=180.0)
    steady = acceptance_gate(THREE_MINUTES_AT_062, 0.55, mix_drift=0.0, mix_drift_seconds=180.0)
    assert (drifting.verdict, steady.verdict) == (Verdict.INSUFFICIENT_DATA, Verdict.PASS)
    assert "SPRT log-LR 1.2 within (-2.9, 2.9)" in drifting.message
    assert "mix drift sd 0.09 over 180s" in drifting.message
    assert "SPRT log-LR 71.3 >= 1.5" in steady.message


@pytest.mark.parametrize(
    ("gates", "verdict"),
    [({}, Verdict.INSUFFICIENT_DATA), ({"mixDrift": 0}, Verdict.PASS), ({"mixDrift": 0.02}, Verdict.PASS)],
    ids=["default", "steady", "nearly-steady"],
)
def test_the_specs_mix_drift_reaches_the_acceptance_gate(gates: dict[str, float], verdict: Verdict) -> None:
    """spec_acceptance_gate passes the spec's mixDrift on (0.09 by default): three minutes at 0.62
    are not yet a Pass under the default drift, and are under a steady or nearly steady mix."""
    limits = api.Gates.model_validate(gates)
    drift = fallback_drift(limits, "a first rollout")
    assert spec_acceptance_gate(THREE_MINUTES_AT_062, limits, drift, window_seconds=15.0).verdict == verdict


def test_a_benchmark_judges_without_the_mix_drift() -> None:
    """A benchmark replays a fixed dataset, whose mix does not drift (DESIGN: "benchmark mode replays
    a fixed dataset and has none"), and is read once: twelve identical windows spread as independent
    tokens, se sqrt(0.62 * 0.38 / 2400) = 0.00991 (pseudo-counts: 0.00990), times t(0.95, 11 dof)
    = 1.796 is 0.0178, well within the 0.12 from 0.62 to the zone's far edge 0.50."""
    result = fixed_sample_acceptance_gate(THREE_MINUTES_AT_062, api.Gates())
    assert result.verdict == Verdict.PASS and result.statistic is None
    assert (result.lower, result.upper) == pytest.approx((0.62 - 0.0178, 0.62 + 0.0178), abs=2e-4)


@pytest.mark.parametrize(
    ("dof", "p", "table"),  # Student's t table (e.g. Abramowitz and Stegun, table 26.10)
    [(1, 0.95, 6.314), (2, 0.95, 2.920), (3, 0.95, 2.353), (4, 0.975, 2.776), (7, 0.99, 2.998),
     (10, 0.95, 1.812), (30, 0.995, 2.750), (120, 0.95, 1.658)],
)  # fmt: skip
def test_student_t_quantiles_match_the_table(dof: int, p: float, table: float) -> None:
    assert student_t_quantile(p, dof) == pytest.approx(table, abs=6e-4)


def benchmark_windows(
    rng: np.random.Generator, alpha: float, windows: int, sd: float
) -> list[AcceptanceWindow]:
    """A benchmark's windows: 300-1500 draft tokens each, accepted binomially at alpha plus the
    window's prompts' own N(0, sd) (prompts differ in how well the draft guesses them)."""
    tokens = rng.integers(300, 1500, windows)
    accepted = rng.binomial(tokens, np.clip(alpha + rng.normal(0, sd, windows), 0, 1))
    return [AcceptanceWindow(n / 3, n, a) for n, a in zip(tokens, accepted, strict=True)]


@pytest.mark.parametrize(("alpha", "wrong"), [(0.50, Verdict.PASS), (0.60, Verdict.FAIL)])
def test_the_fixed_sample_test_errs_about_error_rate_at_the_zones_edges(alpha: float, wrong: Verdict) -> None:
    """Four windows whose alphas spread by 0.1 (gate 0.55 +/- 0.05, errorRate 0.05): a wrong verdict
    at an edge of the zone is about 5 % likely (seen 4.6-5.2 % over 10,000 runs), so neither over nor
    far under the budget (a two-sided quantile would spend 2.5 %); about half the runs stay undecided,
    which a benchmark reports as MeasurementFailed asking for more prompts."""
    rng = np.random.default_rng(11)
    verdicts = [fixed_sample_acceptance_gate(benchmark_windows(rng, alpha, 4, 0.1), api.Gates()).verdict
                for _ in range(4000)]  # fmt: skip
    assert 0.035 <= verdicts.count(wrong) / len(verdicts) <= 0.062
    assert 0.35 <= verdicts.count(Verdict.INSUFFICIENT_DATA) / len(verdicts) <= 0.65


def test_a_benchmark_far_from_the_gate_decides_from_few_windows_where_the_sprt_would_not() -> None:
    """The cluster benchmark's shape (alpha 0.44 against a gate of 0.25, windows 0.03 apart, 300-1500
    draft tokens): its four 15 s windows leave the sequential test undecided about half the time (its
    spread raised to a chi-square bound fit for looking at every window: 32 times the windows' own
    from 3 degrees of freedom); a benchmark read once decides them all."""
    rng = np.random.default_rng(5)
    limits = api.Gates.model_validate({"minAcceptanceRate": 0.25, "minDrafts": 100})
    runs = [benchmark_windows(rng, 0.44, 4, 0.03) for _ in range(400)]
    assert all(fixed_sample_acceptance_gate(w, limits).verdict == Verdict.PASS for w in runs)
    sequential = [spec_acceptance_gate(w, limits, NO_DRIFT).verdict for w in runs]
    assert sequential.count(Verdict.INSUFFICIENT_DATA) > len(runs) / 4


def ou_history(
    rng: np.random.Generator, sd: float, tau: float, *, hours: float = 4.0, tokens: int = 200
) -> list[AcceptanceWindow]:
    """`hours` of 15 s windows of a mix whose alpha is 0.6 plus an Ornstein-Uhlenbeck path (sd, tau:
    exact AR(1) steps), each window `tokens` draft tokens accepted binomially at its alpha."""
    count, rho = int(hours * 3600 / 15), math.exp(-15 / tau)
    steps = rng.normal(0, sd * math.sqrt(1 - rho**2), count)
    level = np.empty(count)
    level[0] = rng.normal(0, sd)
    for i in range(1, count):
        level[i] = rho * level[i - 1] + steps[i]
    accepted = rng.binomial(tokens, np.clip(0.6 + level, 0.0, 1.0))
    return [
        AcceptanceWindow(tokens / 4, tokens, float(a), end=15.0 * (i + 1)) for i, a in enumerate(accepted)
    ]


@pytest.mark.parametrize(("sd", "tau"), [(0.09, 180.0), (0.05, 600.0)])
def test_the_drift_measured_in_four_hours_is_the_ou_paths(sd: float, tau: float) -> None:
    """30 simulated 4 h histories with known parameters and sampling noise (200 draft tokens a window,
    an sd of 0.035 per window, of the drift's size). In 4 h an OU of 3 min swings about 40 times
    independently, so one history's sd is known to about 25 % (seen: 0.095 +- 0.023 at sd 0.09): the
    mean over 30 is held to 10 % (about 2 standard errors) and the median timescale to a factor 1.5
    (4 h holds only 12 swings of 10 min, and short histories shorten the fitted timescale)."""
    rng = np.random.default_rng(7)
    measured = [measure_mix_drift(ou_history(rng, sd, tau), 15.0) for _ in range(30)]
    assert all(m is not None for m in measured)
    sds = [m[0] for m in measured if m is not None]
    taus = [m[1] for m in measured if m is not None]
    assert float(np.mean(sds)) == pytest.approx(sd, rel=0.10)
    assert tau / 1.5 <= float(np.median(taus)) <= tau * 1.5


def test_a_steady_mix_measures_almost_no_drift() -> None:
    """Sampling noise alone (no drift, the same 0.035 per window) is not read as drift: blocks two
    minutes apart share no request, so the noise leaves their covariance at 0 on average. One
    history's covariances still scatter around 0 (the fit then reads a few as a small slow drift,
    seen up to 0.036 in 20): the median is held to 0.01, every one to under 0.05 (the drift of
    traffic.py's drifting mix is 0.09)."""
    rng = np.random.default_rng(8)
    sds = [m[0] for _ in range(10) if (m := measure_mix_drift(ou_history(rng, 0.0, 180.0), 15.0))]
    assert len(sds) == 10 and float(np.median(sds)) <= 0.01 and max(sds) < 0.05


def test_a_steady_mix_measures_exactly_no_drift_where_the_fit_is_noise() -> None:
    """A variance fitted within DRIFT_SIGNIFICANCE standard errors of 0 is no drift: most steady
    histories measure sd 0 exactly (so the rollout takes their design effect), while a drift of
    0.09 is always found (test_the_drift_measured_in_four_hours_is_the_ou_paths)."""
    rng = np.random.default_rng(8)
    sds = [m[0] for _ in range(10) if (m := measure_mix_drift(ou_history(rng, 0.0, 180.0), 15.0))]
    assert sum(sd == 0 for sd in sds) >= 8
    drifting = [measure_mix_drift(ou_history(rng, 0.09, 180.0), 15.0) for _ in range(5)]
    assert all(m is not None and m[0] > 0.05 for m in drifting)


def traffic_histories(seed: int, count: int, drift_sd: float) -> list[list[AcceptanceWindow]]:
    """`count` 4 h histories of bench/traffic.py's requests (20 a 15 s window, a promoted config at
    alpha 0.65) in the 60 s blocks the operator's range query reads."""
    model = traffic.for_alpha(0.65, 20, window_seconds=15.0, drift_sd=drift_sd)
    stream = traffic.windows(model, count * 960, np.random.default_rng(seed))
    blocks = stream.reshape(-1, 4, 3).sum(axis=1)
    return [
        [AcceptanceWindow(0.0, n, a, end=60.0 * (i + 1)) for i, (_, n, a) in enumerate(history.tolist())]
        for history in np.split(blocks, count)
    ]


def test_steady_request_traffic_reads_as_no_drift_and_a_drifting_mix_mostly_as_one() -> None:
    """DRIFT_SIGNIFICANCE against long requests, not white noise: 40 steady histories of the
    traffic model, of which 3 read as a drift at 3 standard errors (their heavy-tailed covariances
    at neighbouring lags err together), all measure sd 0; of 10 histories of its drifting mix
    (sd 0.35 logit over 3 min, about 0.09 in alpha), most still measure a drift (7 here)."""
    steady = [measure_mix_drift(h, 60.0) for h in traffic_histories(5, 40, 0.0)]
    assert all(m is not None and m[0] == 0.0 for m in steady)
    drifting = [measure_mix_drift(h, 60.0) for h in traffic_histories(105, 10, traffic.DRIFT_SD)]
    assert sum(m is not None and m[0] > 0.03 for m in drifting) >= 6


def clustered_windows(
    rng: np.random.Generator, count: int, *, requests: int, tokens: int, mean: float, concentration: float
) -> list[AcceptanceWindow]:
    """Windows of `requests` requests of `tokens` draft tokens each, a request's tokens accepted
    independently at its own q ~ Beta(c mean, c (1 - mean)): tokens of one request correlate, so the
    spread per token is 1 + (tokens - 1) / (c + 1) times the binomial (Var q = mean (1 - mean) / (c + 1))."""
    q = rng.beta(concentration * mean, concentration * (1 - mean), (count, requests))
    accepted = rng.binomial(tokens, q).sum(axis=1)
    return [AcceptanceWindow(requests * tokens / 4, requests * tokens, float(a)) for a in accepted]


def test_the_design_effect_is_the_spread_of_clustered_tokens() -> None:
    """history_design_effect against the closed form for requests whose tokens share a q: 1 + 49 / 3
    = 17.3 for 50 tokens at c = 2 (within 15 %: 960 windows estimate a variance to about 5 %, the
    Newey-West weights take a little); independent tokens give 1; under MIN_DESIGN_WINDOWS, None."""
    rng = np.random.default_rng(21)
    clustered = clustered_windows(rng, 960, requests=20, tokens=50, mean=0.6, concentration=2.0)
    assert history_design_effect(clustered) == pytest.approx(1 + 49 / 3, rel=0.15)
    independent = [AcceptanceWindow(250, 1000, float(a)) for a in rng.binomial(1000, 0.6, 960)]
    assert history_design_effect(independent) == pytest.approx(1.0, abs=0.15)
    assert history_design_effect(clustered[:100]) is None


def test_a_measured_design_effect_spares_the_chi_square_allowance_but_not_a_larger_own_spread() -> None:
    """With the history's design effect the spread is that effect's (no chi-square bound on a few
    windows), so a clear canary decides in fewer windows; a canary whose own windows spread more
    than the history said is judged on its own spread."""
    rng = np.random.default_rng(22)
    canary = clustered_windows(rng, 12, requests=20, tokens=50, mean=0.66, concentration=2.0)
    effect = 1 + 49 / 3
    p = sum(w.accepted_tokens for w in canary) / sum(w.draft_tokens for w in canary)
    assert residual_variance(canary, 0.05, effect) >= effect * p * (1 - p)
    assert residual_variance(canary, 0.05, effect) < residual_variance(canary, 0.05)
    understated = residual_variance(canary, 0.05, 1.0)
    residuals = [w.accepted_tokens - p * w.draft_tokens for w in canary]
    own = long_run_variance(residuals) * len(canary) / sum(w.draft_tokens for w in canary)
    assert understated == pytest.approx(own)
    known = sprt_log_lr(canary, 0.55, 0.05, 0.05, design_effect=effect)
    assert known > sprt_log_lr(canary, 0.55, 0.05, 0.05)


def test_only_a_steady_history_gives_its_design_effect() -> None:
    """drift_from_history measures the design effect where the mix does not drift (the source says
    so) and leaves it out where it drifts: there the drift's share of the windows' spread would
    rest on its fitted timescale."""
    rng = np.random.default_rng(23)
    limits = api.Gates()
    steady = drift_from_history(
        clustered_windows(rng, 960, requests=20, tokens=50, mean=0.6, concentration=2.0), 15.0, limits, "its"
    )
    assert steady.sd == 0 and steady.design_effect == pytest.approx(1 + 49 / 3, rel=0.15)
    assert steady.source.endswith(f"(15s windows, design effect {steady.design_effect:.0f})")
    assert drift_from_history(ou_history(rng, 0.09, 180.0), 15.0, limits, "its").design_effect is None


def test_a_short_or_sparse_history_measures_nothing() -> None:
    """Under an hour of history, or more holes than blocks with data, is no measurement (the
    rollout falls back to mixDrift)."""
    rng = np.random.default_rng(9)
    assert measure_mix_drift(ou_history(rng, 0.09, 180.0, hours=0.9), 15.0) is None
    sparse = [w for i, w in enumerate(ou_history(rng, 0.09, 180.0)) if i % 12 < 4]  # 1 min of every 3
    assert measure_mix_drift(sparse, 15.0) is None


def test_the_measured_drift_replaces_the_fallback_and_says_so() -> None:
    """drift_from_history: a measurement where the history allows it, else the spec's mixDrift with
    why; the gate's message names which."""
    rng = np.random.default_rng(10)
    limits = api.Gates()
    measured = drift_from_history(ou_history(rng, 0.09, 180.0), 15.0, limits, "the incumbent's")
    assert measured.source == "measured over 4.0 h of the incumbent's alpha (15s windows)"
    assert 0.05 < measured.sd < 0.15
    short = drift_from_history(ou_history(rng, 0.09, 180.0, hours=0.5), 15.0, limits, "the incumbent's")
    assert (short.sd, short.timescale_seconds) == (0.09, 180.0)
    assert (
        short.source
        == "spec mixDrift (fallback: the incumbent's history of 0.5 h is too short or too sparse)"
    )
    result = spec_acceptance_gate(THREE_MINUTES_AT_062, limits, short, window_seconds=15.0)
    assert result.message.endswith("; drift: " + short.source)


def test_a_load_prints_its_figures_or_a_question_mark_where_unmeasured() -> None:
    """The load comparison's message names both loads; a figure Prometheus did not give is '?'."""
    assert str(Load(3, 1.234, 5.0)) == "1.23 req/s and 5.00 running per pod (3 pods)"
    assert str(Load(2, None, None)) == "? req/s and ? running per pod (2 pods)"
    assert str(Load(1, None, 0.5)) == "? req/s and 0.50 running per pod (1 pods)"


def deadline_case(estimate: float, verdict: Verdict = Verdict.INSUFFICIENT_DATA) -> GateResult:
    """An acceptance result with its estimate and interval (the SPRT ran) and the given verdict."""
    return GateResult(verdict, estimate, estimate - 0.1, estimate + 0.1, 5000, "SPRT log-LR 0.1")


@pytest.mark.parametrize(
    ("estimate", "verdict", "zone"),
    [
        (0.5, Verdict.PASS, "at or above 0.5, inside"),  # exactly at the gate: the gate is a minimum
        (0.75, Verdict.PASS, "at or above 0.5, inside"),  # on the zone's edge (0.25 exactly in binary)
        (0.76, Verdict.PASS, "at or above 0.5, outside"),
        (0.25, Verdict.FAIL, "below 0.5, inside"),
        (0.2, Verdict.FAIL, "below 0.5, outside"),
    ],
)
def test_the_deadline_decides_by_the_estimates_side_and_says_where_it_lay(
    estimate: float, verdict: Verdict, zone: str
) -> None:
    """At maxAnalysisDuration an undecided test with its data takes the estimate's side of the gate
    (at the gate counts as above, as minAcceptanceRate is a minimum) and says whether the estimate lay
    inside the indifference zone (its edges included) or outside it."""
    result = decide_at_deadline(deadline_case(estimate), 0.5, 0.25)
    assert result.verdict == verdict
    assert result.message == (
        f"SPRT log-LR 0.1; decided at maxAnalysisDuration by the estimate's side of the gate ({zone} "
        "the indifference zone)"
    )


def test_the_deadline_leaves_a_verdict_and_a_test_without_its_data_as_they_are() -> None:
    """A Pass or Fail stands as it is, whatever the estimate's side; a test that has an estimate but
    not yet its interval (too few drafts or windows: acceptance_gate's early answer) stays
    InsufficientData, which rolls back as Inconclusive."""
    for verdict in (Verdict.PASS, Verdict.FAIL):
        decided = deadline_case(0.3 if verdict == Verdict.PASS else 0.7, verdict)
        assert decide_at_deadline(decided, 0.5, 0.05) == decided
    windows = [AcceptanceWindow(10, 40, 30)] * 2  # fewer than MIN_WINDOWS
    short = acceptance_gate(windows, 0.5)
    assert short.verdict == Verdict.INSUFFICIENT_DATA and short.estimate == 0.75 and short.lower is None
    assert decide_at_deadline(short, 0.5, 0.05) == short
    assert (
        decide_at_deadline(
            GateResult(Verdict.INSUFFICIENT_DATA, None, None, None, 0, "no drafts"), 0.5, 0.05
        ).verdict
        == Verdict.INSUFFICIENT_DATA
    )


def test_a_design_effect_needs_its_windows_and_an_alpha_strictly_between_0_and_1() -> None:
    """MIN_DESIGN_WINDOWS windows are enough; a history where every draft token was accepted, or none
    was, has no binomial spread to compare with, so no design effect."""
    rng = np.random.default_rng(23)
    enough = clustered_windows(rng, MIN_DESIGN_WINDOWS, requests=20, tokens=50, mean=0.6, concentration=2.0)
    assert history_design_effect(enough) is not None
    assert history_design_effect(enough[:-1]) is None
    for accepted in (0.0, 1000.0):
        assert history_design_effect([AcceptanceWindow(250, 1000, accepted)] * MIN_DESIGN_WINDOWS) is None


def test_a_history_too_short_for_a_drift_names_its_length_in_hours() -> None:
    """27 one-minute blocks are 0.45 h, shown as 0.5 h, with the spec's fallback drift."""
    history = [AcceptanceWindow(50, 1000, 600, end=60.0 * (i + 1)) for i in range(27)]
    drift = drift_from_history(history, 60.0, api.Gates(), "the incumbent's")
    assert (
        drift.source
        == "spec mixDrift (fallback: the incumbent's history of 0.5 h is too short or too sparse)"
    )


def test_a_p99_in_the_first_bucket_is_named_from_0_ms() -> None:
    """99.5 % of the samples at or below 10 ms: the P99 lies in the first bucket, which starts at 0,
    so the undecided message names 0-10 ms."""
    result = latency_gate(shaped(0.005), shaped(0.005))
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert "(canary 0-10 ms, baseline 0-10 ms)" in result.message


def test_a_p99_exactly_at_a_bucket_edge_lies_in_the_bucket_below_it() -> None:
    """990 of 1000 samples at or below 10 ms: the P99's rank 990 is reached at the edge le=10 ms
    (Prometheus counts a sample at the edge in the bucket below), so that bucket, 0-10 ms, holds it."""
    h = Histogram(BOUNDS, (990.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0))
    result = latency_gate(h, h)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.message.startswith("P99 ITL canary 10.0 ms vs baseline 10.0 ms: ratio 1.000")
    assert "(canary 0-10 ms, baseline 0-10 ms)" in result.message


def test_one_sample_a_track_lies_in_the_bucket_that_counted_it() -> None:
    """minLatencySamples 1 allows a verdict on one sample a track: the P99 lies in the bucket that
    counted the sample (5 ms: 0-10 ms), not beyond the last edge, and no rank bounds it."""
    h = observed([0.005], BOUNDS)
    result = latency_gate(h, h, min_count=1)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert "beyond the last bucket edge" not in result.message
    assert result.message.endswith("no rank of 1 samples bounds a P99 from above, need 524")


@pytest.mark.parametrize(
    ("canary", "baseline"),
    [
        (Load(2, 10.0, 8.0), Load(2, 9.0, 4.0)),  # request rates 10 % apart, running 50 %
        (Load(2, 1.0, 8.0), Load(2, 2.0, 7.0)),  # running 12.5 % apart, request rates 50 %
        (Load(2, 0.75, None), Load(2, 1.0, None)),  # exactly the tolerance: 0.25 of the larger, 1
        (Load(2, None, 8.0), Load(2, 2.0, 7.0)),  # no canary request rate: running decides
        (Load(2, 0.0, 0.0), Load(2, 0.0, 0.0)),  # idle pods carry the same load
    ],
    ids=["rates", "running", "at-the-tolerance", "canary-rate-unknown", "idle"],
)
def test_loads_are_comparable_when_either_figure_is_within_the_tolerance(
    canary: Load, baseline: Load
) -> None:
    """Comparable: the request rate per pod or the running requests per pod within the tolerance
    (25 % here) of the larger, its edge included; a figure unmeasured on either side is not held
    against the comparison; two idle tracks differ by nothing."""
    assert comparable_load(canary, baseline, 0.25) is None


@pytest.mark.parametrize(
    ("canary", "baseline"),
    [
        (Load(2, 0.5, 8.0), Load(2, 0.2, None)),  # 0.3 / 0.5 = 60 % apart at under 1 req/s
        (Load(2, 2.0, 8.0), Load(2, 1.0, 5.0)),  # 50 % and 37.5 % apart
    ],
    ids=["slow-rates", "both-figures"],
)
def test_loads_further_apart_than_the_tolerance_are_not_comparable(canary: Load, baseline: Load) -> None:
    """Relative differences are of the larger load, whatever its size (0.5 req/s is no less a
    load than 5): beyond the tolerance on every figure measured on both sides, the loads differ."""
    assert comparable_load(canary, baseline, 0.25) == (
        f"loads differ by more than 25%: canary {canary}, baseline {baseline}"
    )


def test_the_specs_min_drafts_and_error_rate_reach_the_acceptance_gate() -> None:
    """spec_acceptance_gate judges with the spec's minDrafts and errorRate: three minutes at 0.62
    hold 600 drafts, short of minDrafts 1000; at errorRate 0.01 Wald's Pass bound is
    log(0.99 / 0.01) = 4.6, less the overshoot of a window's step of sd 2.91 (0.5826 * 2.91 = 1.70):
    2.9, and the steady windows' log-LR 71.3 (their binomial spread, whatever the error rate)
    clears it."""
    fewer = spec_acceptance_gate(
        THREE_MINUTES_AT_062, api.Gates.model_validate({"minDrafts": 1000}), NO_DRIFT
    )
    assert fewer.verdict == Verdict.INSUFFICIENT_DATA
    assert fewer.message.startswith("600 drafts in 12 windows, need 1000 drafts")
    strict = spec_acceptance_gate(
        THREE_MINUTES_AT_062, api.Gates.model_validate({"errorRate": 0.01}), NO_DRIFT
    )
    assert strict.verdict == Verdict.PASS and "SPRT log-LR 71.3 >= 2.9" in strict.message


@pytest.mark.parametrize(
    ("timescale", "window_seconds", "log_lr"),
    [(720.0, 15.0, "0.9"), (180.0, 60.0, "2.2")],
    ids=["12-minute-timescale", "minute-windows"],
)
def test_the_drifts_timescale_and_the_windows_length_reach_the_acceptance_gate(
    timescale: float, window_seconds: float, log_lr: str
) -> None:
    """The drift's variance over the span seen is sd^2 * 2 (x - 1 + e^-x) / x^2, x = span / tau,
    and the log-LR 2 * 0.05 * (1488 - 0.55 * 2400) / (0.2356 + 2400 * that) (the binomial spread
    with pseudo-counts, 1489 * 913 / 2402^2 = 0.2356). Twelve 15 s windows against tau 12 min:
    x = 0.25, variance 0.0081 * 0.9216 = 0.007465, log-LR 0.93. Twelve 1-minute windows span
    12 minutes against tau 3 min: x = 4, variance 0.0081 * 0.3773 = 0.003056, log-LR 2.22."""
    drift = MixDrift(0.09, timescale, "spec mixDrift (fallback: a first rollout)")
    result = spec_acceptance_gate(THREE_MINUTES_AT_062, api.Gates(), drift, window_seconds=window_seconds)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert f"SPRT log-LR {log_lr} within (-2.9, 2.9)" in result.message
    assert f"mix drift sd 0.09 over {timescale:g}s" in result.message


def test_a_measured_design_effect_reaches_the_acceptance_gate_and_is_named() -> None:
    """A steady history's design effect of 100 sets the spread at 100 * 0.62 * 0.38 = 23.56 per
    draft token (the identical windows show none of their own), so the log-LR is
    2 * 0.05 * 168 / 23.56 = 0.71, not the binomial spread's 71.3; a window's step has sd
    0.1 * sqrt(200 * 23.56) / 23.56 = 0.291, so the bounds are 2.944 - 0.5826 * 0.291 = 2.77; the
    message names the source."""
    drift = MixDrift(0.0, 180.0, "measured over 4.0 h of its alpha (15s windows, design effect 100)", 100.0)
    result = spec_acceptance_gate(THREE_MINUTES_AT_062, api.Gates(), drift, window_seconds=15.0)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert "SPRT log-LR 0.7 within (-2.8, 2.8)" in result.message
    assert result.message.endswith("; drift: " + drift.source)


@pytest.mark.parametrize(
    "drift",
    [NO_DRIFT, MixDrift(0.0, 180.0, "measured over 4.0 h of its alpha (15s windows)")],
    ids=["benchmark", "steady-without-design-effect"],
)
def test_no_drift_and_no_design_effect_leave_the_message_without_a_drift_source(drift: MixDrift) -> None:
    """The drift's source is named only where a drift or a design effect was measured: with
    neither, the gate judged the windows' own spread alone and says nothing of a drift."""
    result = spec_acceptance_gate(THREE_MINUTES_AT_062, api.Gates(), drift, window_seconds=15.0)
    assert result.verdict == Verdict.PASS
    assert "drift" not in result.message


def minute_windows(
    alphas: list[float | None], tokens: float = 1000.0, seconds: float = 60.0
) -> list[AcceptanceWindow]:
    """A history of windows of `seconds` at the given alphas (None: a window without drafts),
    `tokens` draft tokens each, accepted tokens rounded to a whole count as counters hold them."""
    return [
        AcceptanceWindow(0.0, 0.0, 0.0, end=seconds * (i + 1))
        if alpha is None
        else AcceptanceWindow(tokens / 4, tokens, float(round(alpha * tokens)), end=seconds * (i + 1))
        for i, alpha in enumerate(alphas)
    ]


def test_exactly_an_hour_of_history_is_enough_to_measure_the_drift() -> None:
    """MIN_DRIFT_HISTORY_SECONDS is the least history measured: 60 one-minute windows are 60 blocks
    of a minute, an hour exactly, and measured (a constant alpha: no drift)."""
    measured = measure_mix_drift(minute_windows([0.6] * 60), 60.0)
    assert measured is not None and measured[0] == 0.0


def test_an_hour_of_a_slow_scrapes_windows_is_enough_to_measure_the_drift() -> None:
    """A 2-minute scrape gives 8-minute history windows (4 scrapes each), each its own block: 8 of
    them span 64 minutes, over an hour, and blocks 2 apart (16 min, within a quarter of the blocks
    and within 30 minutes) share no request, so their covariance is fitted: a measurement."""
    measured = measure_mix_drift(minute_windows([0.6] * 8, seconds=480.0), 480.0)
    assert measured is not None and measured[0] == 0.0


def test_a_history_with_an_alpha_in_exactly_half_its_blocks_is_measured() -> None:
    """Two hours of one-minute blocks, every other minute without drafts and the last one with:
    60 of 120 blocks have an alpha, exactly half, which is enough. One of them holds a single
    draft token (accepted): a quiet minute's alpha, 1, is still an alpha."""
    alphas: list[float | None] = [None if i % 2 == 0 else 0.6 for i in range(120)]
    history = minute_windows(alphas)
    history[1] = AcceptanceWindow(1.0, 1.0, 1.0, end=120.0)
    assert measure_mix_drift(history, 60.0) is not None


def test_a_constant_alpha_seen_two_minutes_of_every_four_measures_no_drift() -> None:
    """Blocks two minutes apart are never both seen (two minutes on, two off): that lag has no
    covariance to fit and adds nothing; the others are 0 for a constant alpha, so no drift."""
    alphas: list[float | None] = [0.6 if i % 4 < 2 else None for i in range(240)]
    measured = measure_mix_drift(minute_windows(alphas), 60.0)
    assert measured is not None and measured[0] == 0.0


def test_a_swing_seen_two_minutes_of_every_four_is_measured() -> None:
    """alpha 0.6 + 0.1 sin(2 pi t / 40 min) over 4 h (sd 0.1 / sqrt(2) = 0.071), seen two minutes of
    every four at a million draft tokens a minute: no pair of blocks two minutes apart, but the
    longer lags still show the swing, measured within a factor of about 1.5."""
    alphas: list[float | None] = [
        0.6 + 0.1 * math.sin(2 * math.pi * i / 40) if i % 4 < 2 else None for i in range(240)
    ]
    measured = measure_mix_drift(minute_windows(alphas, tokens=1e6), 60.0)
    assert measured is not None and 0.05 < measured[0] < 0.11


@pytest.mark.parametrize(("amplitude", "drifts"), [(0.0003, False), (0.005, True)])
def test_a_swing_under_a_tenth_of_a_point_is_no_drift(amplitude: float, drifts: bool) -> None:
    """MIN_DRIFT_SD: a tenth of a point of alpha is no drift for any gate. alpha 0.6 +- 0.0003,
    switching every 10 minutes for 4 h at a million draft tokens a minute (no sampling noise to
    speak of), is a clear swing far under it: sd 0. The same swing at +- 0.005 is measured."""
    alphas: list[float | None] = [0.6 + amplitude * (1 if (i // 10) % 2 == 0 else -1) for i in range(240)]
    measured = measure_mix_drift(minute_windows(alphas, tokens=1e6), 60.0)
    assert measured is not None and (measured[0] > 0.001 if drifts else measured[0] == 0.0)


def test_a_steady_ramp_is_fitted_at_the_longest_timescale_tried() -> None:
    """alpha rising steadily from 0.5 to 0.6 over 4 h moves slower than any swing the history can
    tell from a level, so the fit takes the slowest timescale it tries: an eighth of the history
    (30 min) at most, and on the grid of factors 1.1 more than a ninth of it (26.7 min)."""
    measured = measure_mix_drift(minute_windows([0.5 + 0.1 * i / 240 for i in range(240)], tokens=1e6), 60.0)
    assert measured is not None and 4 * 3600 / 9 < measured[1] <= 4 * 3600 / 8


def test_the_span_runs_from_the_first_windows_start_to_the_last_ones_end() -> None:
    """The drift allowance fades with the span the windows cover, gaps included: 15 s windows ending
    at 115, 130 and 175 s (those ending at 145 and 160 s were dropped) span 100 to 175 s, 75 s,
    not the 45 s three windows would; without end times (a benchmark's) it is their count's."""
    ends = [AcceptanceWindow(4, 16, 10, end=e) for e in (115.0, 130.0, 175.0)]
    assert span_seconds(ends, 15.0) == 75.0
    assert span_seconds(ends[:1], 15.0) == 15.0
    assert span_seconds([AcceptanceWindow(4, 16, 10)] * 3, 15.0) == 45.0
    assert span_seconds([], 15.0) == 0.0


def test_exactly_min_drafts_in_exactly_min_windows_are_judged_one_less_of_either_is_not() -> None:
    """minDrafts (200) and MIN_WINDOWS (3) are minimums: at them the SPRT runs (its message gives the
    estimate); one draft or one window fewer and the gate says what it has and needs."""
    judged = [AcceptanceWindow(66, 264, 240), AcceptanceWindow(67, 268, 244), AcceptanceWindow(67, 268, 244)]
    assert acceptance_gate(judged, 0.55).message.startswith("alpha 0.910 ")
    fewer_drafts = [*judged[:2], AcceptanceWindow(66, 264, 240)]
    assert (
        acceptance_gate(fewer_drafts, 0.55).message
        == "199 drafts in 3 windows, need 200 drafts and 3 windows"
    )
    two = [AcceptanceWindow(100, 400, 364)] * 2 + [AcceptanceWindow(math.nan, 400, 364)]
    assert acceptance_gate(two, 0.55).message == (
        "200 drafts in 2 windows, need 200 drafts and 3 windows (1 windows with NaN or negative increases dropped)"
    )
