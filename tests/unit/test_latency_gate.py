"""The latency gate's verdicts and messages on small hand-built histograms (issue 42).

Every expected figure below is derived by hand from the bucket counts (the arithmetic is in the
comments), never by calling the code under test. Conventions used throughout:

* bounds are 10/20/40/80 ms and +Inf unless a test says otherwise; counts are cumulative;
* a quantile is interpolated inside its bucket: lo + (hi - lo) * (rank - count_lo) / (count_hi - count_lo),
  and a rank in the +Inf bucket reads as the last finite edge;
* the P99 bracket sits at the ranks (0.99 -/+ 1.96 * se) * n with se = sqrt(0.99 * 0.01 / n), the upper
  rank clipped at n. With n = 396, se = sqrt(0.0099 / 396) = 0.005 exactly, so the ranks are
  0.9802 * 396 = 388.1592, 0.99 * 396 = 392.04 and 0.9998 * 396 = 395.9208;
* the heavier-tail check reads the canary at each edge E against the baseline at E / 1.1 (tolerance 10 %):
  80 / 1.1 = 72.727 ms, 40 / 1.1 = 36.364 ms, 20 / 1.1 = 18.182 ms, each 9/11 of the way up its bucket.
"""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from specgate.gates import Histogram, Verdict, cdf, latency_gate
from specgate.gates.latency import _heavier_tail, _quantile_se

INF = math.inf
BOUNDS = (0.01, 0.02, 0.04, 0.08, INF)
CANNOT_TELL_TAIL = "more traffic, or finer buckets (vLLM --custom-histogram-buckets)"


def hist(*counts: float, bounds: tuple[float, ...] = BOUNDS) -> Histogram:
    """A histogram over `bounds` from its cumulative counts (the last is the total)."""
    assert len(counts) == len(bounds)
    assert all(a <= b for a, b in pairwise(counts)), "cumulative counts only"
    return Histogram(bounds, tuple(float(c) for c in counts))


# --- the figures in every message ---


def test_pass_message_reports_both_p99_brackets_in_ms_with_the_default_tolerance() -> None:
    """The figures a user reads (each P99 and its bracket, in ms) and the default 10 % tolerance.
    Figures of 50 ms and more, so that a figure off by 0.1 % shows in the first decimal."""
    bounds = (0.01, 0.02, 0.04, 0.08, 0.16, INF)
    canary = hist(50, 200, 380, 396, 396, 396, bounds=bounds)
    baseline = hist(0, 100, 300, 380, 396, 396, bounds=bounds)
    # canary, bucket 40-80 ms holding 380..396: P99 40 + 40 * 12.04 / 16 = 70.1,
    #   low 40 + 40 * 8.1592 / 16 = 60.398, high 40 + 40 * 15.9208 / 16 = 79.802
    # baseline, bucket 80-160 ms holding 380..396: P99 80 + 80 * 12.04 / 16 = 140.2,
    #   low 80 + 80 * 8.1592 / 16 = 120.796, high 80 + 80 * 15.9208 / 16 = 159.604
    # no heavier tail (at each edge a larger share of the canary is below than of the baseline), no overflow (both upper ranks
    # end at or before 396 in a finite bucket), and 79.802 <= 1.1 * 120.796 = 132.9: Pass
    result = latency_gate(baseline, canary)
    assert result.verdict == Verdict.PASS
    assert result.message == (
        "P99 ITL canary 70.1 ms [60.4, 79.8] vs baseline 140.2 ms [120.8, 159.6]: within 10%"
    )
    assert (result.estimate, result.lower, result.upper) == pytest.approx((0.0701, 0.060398, 0.079802))
    assert result.samples == 396


def test_identical_tracks_with_many_samples_pass_with_a_narrow_bracket() -> None:
    """Where the upper rank of the bracket stays below the +Inf bucket, a few samples above the last
    edge do not make the quantile unknown: the gate can still pass."""
    # n = 1584: se = sqrt(0.0099 / 1584) = 0.0025, 1.96 * se = 0.0049: ranks 0.9851 * 1584 = 1560.3984,
    # 0.99 * 1584 = 1568.16 and 0.9949 * 1584 = 1575.9816, all at or below the 1580 samples up to 80 ms.
    # In 40-80 ms (1400..1580, 180 samples): P99 40 + 40 * 168.16 / 180 = 77.369,
    # low 40 + 40 * 160.3984 / 180 = 75.644, high 40 + 40 * 175.9816 / 180 = 79.107.
    # 79.107 <= 1.1 * 75.644 = 83.2: Pass.
    h = hist(160, 800, 1400, 1580, 1584)
    result = latency_gate(h, h)
    assert result.verdict == Verdict.PASS
    assert (
        result.message == "P99 ITL canary 77.4 ms [75.6, 79.1] vs baseline 77.4 ms [75.6, 79.1]: within 10%"
    )


# --- too few samples ---


def test_too_few_samples_names_the_smaller_track_count_and_the_minimum() -> None:
    """Below min_count the gate waits, and reports how many samples the smaller track has."""
    result = latency_gate(hist(10, 40, 70, 80, 80), hist(50, 200, 350, 400, 400))
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.samples == 80
    assert (result.estimate, result.lower, result.upper) == (None, None, None)
    assert result.message == "80 P99 ITL samples on the smaller track, need 100"


def test_exactly_min_count_samples_are_judged_and_wide_buckets_cannot_tell() -> None:
    """100 samples meet the default minimum of 100. With so few, the bracket spans most of the
    40-80 ms bucket, so the gate names the buckets and asks for more traffic or finer buckets."""
    h = hist(10, 50, 90, 100, 100)
    # n = 100: se = sqrt(0.0099 / 100) = 0.0099499, 1.96 * se = 0.0195018: ranks 97.0498, 99, and
    # 100.95 clipped to 100. In 40-80 ms (90..100): P99 40 + 40 * 9 / 10 = 76.0,
    # low 40 + 40 * 7.0498 / 10 = 68.199, high 40 + 40 * 10 / 10 = 80.0.
    # Heavier tail: at 40 ms the baseline at 36.364 reads (50 + 40 * 9/11) / 100 = 0.827 < 0.9; at 80 ms
    # (90 + 10 * 9/11) / 100 = 0.982 < 1.0: none. Pass needs 80.0 <= 1.1 * 68.199 = 75.02: no.
    result = latency_gate(h, h)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.samples == 100
    assert result.message == (
        "P99 ITL canary 76.0 ms [68.2, 80.0] vs baseline 76.0 ms [68.2, 80.0]: cannot tell 10% yet with "
        "buckets 40-80 ms (canary) and 40-80 ms (baseline) over 100 samples: " + CANNOT_TELL_TAIL
    )
    assert (result.estimate, result.lower, result.upper) == pytest.approx((0.076, 0.0681993, 0.080), rel=1e-5)


# --- quantiles beyond the last finite edge ---


def test_canary_upper_estimate_in_the_inf_bucket_is_never_a_pass() -> None:
    """Two canary samples above 80 ms put its upper P99 estimate beyond the last edge: the gate asks
    for higher buckets even though the tracks are identical and the low estimates are finite."""
    h = hist(40, 200, 352, 394, 396)
    # n = 396, 40-80 ms holds 352..394 (42 samples): P99 40 + 40 * 40.04 / 42 = 78.133,
    # low 40 + 40 * 36.1592 / 42 = 74.437; the upper rank 395.9208 > 394 lies in +Inf, read as 80.0.
    # Overflow: the canary's upper rank is in +Inf, the baseline's lower rank 388.16 is not.
    # (A canary judged at its lower rank would pass: 80.0 <= 1.1 * 74.437 = 81.9.)
    result = latency_gate(h, h)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.message == (
        "P99 ITL canary 78.1 ms [74.4, 80.0] vs baseline 78.1 ms [74.4, 80.0]: the canary quantile lies "
        "beyond the last bucket edge (40-80 ms); add higher buckets"
    )


def test_the_overflow_message_names_the_overflowing_tracks_bucket() -> None:
    """Only the canary's upper estimate lies beyond the last edge: the message names the canary's
    P99 bucket (40-80 ms), not the baseline's (20-40 ms), as the bucket a user should split."""
    canary = hist(200, 300, 388, 394, 396)
    baseline = hist(0, 304, 396, 396, 396)
    # n = 396, ranks 388.1592, 392.04, 395.9208.
    # canary, 40-80 ms holds 388..394 (6): P99 40 + 40 * 4.04 / 6 = 66.933, low 40 + 40 * 0.1592 / 6
    #   = 41.061; the upper rank 395.92 > 394 lies in +Inf: 80.0, so the canary overflows.
    # baseline, 20-40 ms holds 304..396 (92): P99 20 + 20 * 88.04 / 92 = 39.139, low 20 + 20 * 84.1592
    #   / 92 = 38.296, high 20 + 20 * 91.9208 / 92 = 39.983: finite.
    # Heavier tail: at 20 ms the baseline at 18.18 reads 304 * 9/11 / 396 = 0.628 < 300 / 396 = 0.758;
    # at 40 ms (304 + 92 * 9/11) / 396 = 0.958 < 388 / 396 = 0.980; at 80 ms 1.0 (skipped): none.
    # Fail needs 41.061 > 1.1 * 39.983 = 43.98: no.
    result = latency_gate(baseline, canary)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.message == (
        "P99 ITL canary 66.9 ms [41.1, 80.0] vs baseline 39.1 ms [38.3, 40.0]: the canary quantile lies "
        "beyond the last bucket edge (40-80 ms); add higher buckets"
    )
    assert result.samples == 396


def test_a_canary_whose_low_estimate_is_above_the_baselines_high_one_by_the_tolerance_fails() -> None:
    """No edge shows a heavier tail (most of the canary is fast), but even the canary's low P99
    estimate is more than 10 % above the baseline's high one: Fail, with both figures."""
    canary = hist(0, 376, 396, 396, 396)
    baseline = hist(0, 396, 396, 396, 396)
    # n = 396, ranks 388.1592, 392.04, 395.9208.
    # baseline, 10-20 ms holds 0..396: P99 10 + 10 * 392.04 / 396 = 19.9, low 19.802, high 19.998.
    # canary, 20-40 ms holds 376..396 (20): P99 20 + 20 * 16.04 / 20 = 36.04, low 20 + 12.1592 = 32.159,
    #   high 20 + 19.9208 = 39.921.
    # Heavier tail: at 20 ms the baseline at 18.18 reads 0.818, the canary 376 / 396 = 0.949; at 40 ms
    # and above the baseline reads 1.0 (skipped): none. 32.159 > 1.1 * 19.998 = 21.998: Fail (and not
    # above 2.1 * 19.998 = 42.0, so the tolerance is 10 %, not 110 %).
    result = latency_gate(baseline, canary)
    assert result.verdict == Verdict.FAIL
    assert result.message == (
        "P99 ITL canary 36.0 ms [32.2, 39.9] vs baseline 19.9 ms [19.8, 20.0]: more than 10% worse "
        "(32.2 > 20.0 ms + 10%)"
    )
    assert (result.estimate, result.lower, result.upper) == pytest.approx((0.03604, 0.0321592, 0.0399208))
    assert result.samples == 396


def test_baseline_lower_estimate_in_the_inf_bucket_is_never_a_pass() -> None:
    """A baseline with 16 of 396 samples above 80 ms has even its low P99 estimate beyond the last
    edge: its P99 is unknown, so a faster-looking canary cannot pass."""
    canary = hist(0, 150, 360, 396, 396)
    baseline = hist(0, 100, 300, 380, 396)
    # canary, 40-80 ms holding 360..396 (36): P99 40 + 40 * 32.04 / 36 = 75.6,
    #   low 40 + 40 * 28.1592 / 36 = 71.288, high 40 + 40 * 35.9208 / 36 = 79.912
    # baseline: ranks 388.16, 392.04, 395.92 all above its 380 samples up to 80 ms: 80.0 each.
    # Heavier tail: at 40 ms the baseline reads (100 + 200 * 9/11) / 396 = 0.666 < 360 / 396; at 80 ms
    # (300 + 80 * 9/11) / 396 = 0.923 < 1.0: none. Fail needs 71.288 > 88: no.
    result = latency_gate(baseline, canary)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.message == (
        "P99 ITL canary 75.6 ms [71.3, 79.9] vs baseline 80.0 ms [80.0, 80.0]: the baseline quantile lies "
        "beyond the last bucket edge (above 80 ms); add higher buckets"
    )


def test_histograms_with_only_the_inf_bucket_report_zero_and_ask_for_buckets() -> None:
    """A histogram without finite buckets tells nothing about its P99: it reads 0 ms (no finite edge
    below it) and both tracks are reported beyond the last edge."""
    h = hist(200, bounds=(INF,))
    result = latency_gate(h, h)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert (result.estimate, result.lower, result.upper) == (0.0, 0.0, 0.0)
    assert result.message == (
        "P99 ITL canary 0.0 ms [0.0, 0.0] vs baseline 0.0 ms [0.0, 0.0]: the canary and baseline quantile "
        "lies beyond the last bucket edge (above 0 ms); add higher buckets"
    )


# --- the heavier tail: messages and boundaries ---


def test_heavier_tail_at_level_exactly_the_quantile_fails_at_the_last_finite_edge() -> None:
    """The baseline has exactly 99 % of its samples at or below 72.7 ms (80 / 1.1): that level is
    still inside [0.5, 0.99], so the canary's 2.5 % above 80 ms fails it."""
    canary = hist(100, 300, 380, 390, 400)
    baseline = hist(100, 300, 396, 396, 400)
    # n = 400: se = sqrt(0.0099 / 400) = 0.0049749, 1.96 * se = 0.0097509: ranks 392.0996, 396, 399.9004.
    # Baseline level at 72.727 ms: 40-80 ms is empty, so (396 + 0 * 9/11) / 400 = 0.99 exactly.
    # Canary below 80 ms: 390 / 400 = 0.975; spread 1.96 * sqrt(0.99 * 0.01 * (1/400 + 1/400)) = 0.01379;
    # 0.975 < 0.99 - 0.01379 = 0.97621: Fail. Lower edges pass: at 40 ms (300 + 96 * 9/11) / 400 = 0.946
    # against 0.95; at 20 ms (100 + 200 * 9/11) / 400 = 0.659 against 0.75.
    # Figures: the canary's ranks all exceed its 390 samples up to 80 ms: 80.0 each. The baseline's
    # P99 rank 396 tops 20-40 ms (300..396): 40.0; low 20 + 20 * 92.0996 / 96 = 39.187; high in +Inf: 80.0.
    result = latency_gate(baseline, canary)
    assert result.verdict == Verdict.FAIL
    assert result.message == (
        "P99 ITL canary 80.0 ms [80.0, 80.0] vs baseline 40.0 ms [39.2, 80.0]: 2.5% of the canary's "
        "samples exceed 80 ms, against 1.0% of the baseline's above 72.7 ms (tolerance 10%)"
    )
    assert (result.estimate, result.lower, result.upper, result.samples) == (0.08, 0.08, 0.08, 400)


def test_heavier_tail_at_level_exactly_one_half_fails_a_canary_beyond_sampling_error() -> None:
    """The baseline's median sits exactly at 36.4 ms (no samples between 20 and 40 ms), and the check
    starts at the median. The two P99s look alike (79.3 vs 79.2 ms), yet 57.6 % of the canary's
    samples are above 40 ms where only half the baseline's are above 36.4 ms: a real regression."""
    canary = hist(0, 100, 168, 396, 396)
    baseline = hist(0, 198, 198, 396, 396)
    # Level at 36.364 ms: (198 + 0 * 9/11) / 396 = 0.5 exactly; canary below 40 ms: 168 / 396 = 0.42424.
    # spread = 1.96 * sqrt(0.25 * 2 / 396) = 1.96 * 0.035533 = 0.069646; 0.42424 < 0.43035: Fail.
    # With 1.5 times that variance (sqrt 1.2247: 0.0853) or more the canary would be within error.
    # At 20 ms the level is 198 * 9/11 / 396 = 0.409, below the median: not compared.
    # Canary figures, 40-80 ms holding 168..396 (228): P99 40 + 40 * 224.04 / 228 = 79.305,
    #   low 40 + 40 * 220.1592 / 228 = 78.624, high 40 + 40 * 227.9208 / 228 = 79.986
    # baseline, 198..396 (198): P99 40 + 40 * 194.04 / 198 = 79.2, low 40 + 40 * 190.1592 / 198 = 78.416,
    #   high 40 + 40 * 197.9208 / 198 = 79.984
    result = latency_gate(baseline, canary)
    assert result.verdict == Verdict.FAIL
    assert result.message == (
        "P99 ITL canary 79.3 ms [78.6, 80.0] vs baseline 79.2 ms [78.4, 80.0]: 57.6% of the canary's "
        "samples exceed 40 ms, against 50.0% of the baseline's above 36.4 ms (tolerance 10%)"
    )


def test_canary_within_sampling_error_at_the_median_passes() -> None:
    """Four more canary samples below 40 ms than in the failing case put it inside sampling error
    (the spread is of both tracks' counts, so equal tracks do not cancel it): not a heavier tail."""
    canary = hist(0, 100, 172, 396, 396)
    baseline = hist(0, 198, 198, 396, 396)
    # Canary below 40 ms: 172 / 396 = 0.43434 >= 0.5 - 0.069646 = 0.43035 (and < 0.5 + 0.0696).
    # At 80 ms: level (198 + 198 * 9/11) / 396 = 0.909 against 1.0.
    # Canary figures, 172..396 (224): P99 40 + 40 * 220.04 / 224 = 79.293,
    #   low 40 + 40 * 216.1592 / 224 = 78.600, high 40 + 40 * 223.9208 / 224 = 79.986
    # Pass: 79.986 <= 1.1 * 78.416 = 86.3.
    result = latency_gate(baseline, canary)
    assert result.verdict == Verdict.PASS
    assert (
        result.message == "P99 ITL canary 79.3 ms [78.6, 80.0] vs baseline 79.2 ms [78.4, 80.0]: within 10%"
    )


def test_canary_exactly_at_the_edge_of_sampling_error_is_not_a_heavier_tail() -> None:
    """The rule is strict: a canary exactly z standard errors below the baseline's level is still
    within error (z = 2 makes the boundary exact: 0.5 - 2 * sqrt(0.25 * 2 / 200) = 0.4)."""
    baseline = hist(0, 100, 100, 200, 200)
    at_boundary = hist(0, 50, 80, 200, 200)  # 80 / 200 = 0.4 below 40 ms
    just_beyond = hist(0, 50, 79, 200, 200)  # 79 / 200 = 0.395
    assert _heavier_tail(baseline, at_boundary, 0.99, 0.10, 2.0) is None
    assert _heavier_tail(baseline, just_beyond, 0.99, 0.10, 2.0) == (
        "60.5% of the canary's samples exceed 40 ms, against 50.0% of the baseline's above 36.4 ms"
    )


def test_no_tolerance_compares_the_last_finite_edge_count_for_count() -> None:
    """With max_regression 0 the canary's 80 ms edge is read against the baseline's own 80 ms edge,
    an exact count (not one beyond the last edge): 5 % of the canary's samples above 80 ms against
    2 % fails, although both P99s lie beyond 80 ms."""
    canary = hist(100, 200, 360, 380, 400)
    baseline = hist(100, 200, 360, 392, 400)
    # Levels are the baseline's counts at the same edges: 0.25 (below the median), 0.5 and 0.9 (the
    # canary equal there), 392 / 400 = 0.98 at 80 ms. Canary 380 / 400 = 0.95;
    # spread 1.96 * sqrt(0.98 * 0.02 * 2 / 400) = 0.019403; 0.95 < 0.9606: Fail.
    # Figures (n = 400, ranks 392.0996 / 396 / 399.9004): all above 380 and 392 samples up to 80 ms.
    result = latency_gate(baseline, canary, max_regression=0.0)
    assert result.verdict == Verdict.FAIL
    assert result.message == (
        "P99 ITL canary 80.0 ms [80.0, 80.0] vs baseline 80.0 ms [80.0, 80.0]: 5.0% of the canary's "
        "samples exceed 80 ms, against 2.0% of the baseline's above 80 ms (tolerance 0%)"
    )


@pytest.mark.parametrize("quantile", [0.99, 1.0])
@pytest.mark.parametrize(
    "baseline",
    [
        pytest.param(hist(400, bounds=(INF,)), id="only-inf-bucket"),
        pytest.param(hist(0, 0, 400, bounds=(0.01, 0.02, INF)), id="finite-edges-below-all-samples"),
    ],
)
def test_no_canary_edge_is_read_beyond_the_baselines_last_finite_edge(
    baseline: Histogram, quantile: float
) -> None:
    """Beyond its last finite edge the baseline's samples could lie anywhere (cdf counts all of them
    there), so no canary edge above that edge times 1.1 is compared, even for the maximum (q = 1),
    where a level of 1.0 would pass the [0.5, q] window and blame the canary."""
    canary = hist(0, 100, 300, 390, 400)
    assert _heavier_tail(baseline, canary, quantile, 0.10, 1.96) is None


# --- cdf ---


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        pytest.param(0.005, 50 / 400, id="below-first-edge"),  # 100 * (5 / 10) from 0
        pytest.param(0.02, 200 / 400, id="at-an-edge"),
        pytest.param(0.03, 250 / 400, id="between-edges"),  # 200 + 100 * (10 / 20)
        pytest.param(0.08, 380 / 400, id="at-the-last-finite-edge"),
        pytest.param(0.1, 1.0, id="beyond-the-last-finite-edge"),  # the +Inf bucket's count: all
    ],
)
def test_cdf_reads_counts_at_edges_and_interpolates_between(x: float, expected: float) -> None:
    """The share of samples at or below x, exact at edges, linear inside a bucket."""
    assert cdf(hist(100, 200, 300, 380, 400), x) == pytest.approx(expected)


def test_cdf_of_a_zero_width_bucket_at_le_zero_reads_its_count() -> None:
    """A bucket at le=0 (samples of exactly 0 s) has no width to interpolate over: at 0 it holds all
    its count, and above it the next bucket interpolates from 0."""
    h = hist(40, 100, 200, bounds=(0.0, 0.01, INF))
    assert cdf(h, 0.0) == pytest.approx(40 / 200)
    assert cdf(h, 0.005) == pytest.approx((40 + 60 * 0.5) / 200)


# --- the quantile's standard error ---


@pytest.mark.parametrize(
    ("q", "n", "expected"),
    [
        (0.99, 396.0, 0.005),  # sqrt(0.0099 / 396) = sqrt(0.000025)
        (0.5, 100.0, 0.05),  # sqrt(0.25 / 100)
        (0.99, 1.0, math.sqrt(0.0099)),  # a single sample still has a spread
        (0.99, 0.0, 0.0),  # no samples: no spread (and no division by zero)
    ],
)
def test_quantile_se_is_sqrt_q_one_minus_q_over_n(q: float, n: float, expected: float) -> None:
    """The standard error of a quantile's rank share: sqrt(q (1 - q) / n), 0 without samples."""
    assert _quantile_se(q, n) == pytest.approx(expected)
