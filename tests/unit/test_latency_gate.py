"""The latency gate's verdicts and messages (issue 58): a non-inferiority test on the log ratio of the
tracks' P99s, each read on normal probability paper inside its bucket.

Expected figures are derived here from the inputs, never by calling the code under test: a
histogram shaped as a lognormal has, at each edge e, the share Phi((ln e - mu) / sigma) at or below
it, so on probability paper (probit of the share against ln e) its edges lie on one line and the
P99 read on that line is exp(mu + 2.3263 sigma) exactly, wherever it falls inside its bucket. The
bracket of a P99 over n samples reaches the ranks 0.99 -/+ z sqrt(0.99 * 0.01 / n); at the looks'
z of 2.3 no rank bounds it from above below 2.3^2 * 99 = 523.7 samples, so 524.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from specgate.gates import (
    Histogram,
    Verdict,
    histogram_quantile,
    latency_gate,
    probit_quantile,
)

INF = math.inf
Z99 = NormalDist().inv_cdf(0.99)
FINE = (*(round(0.005 * 1.05**k, 9) for k in range(110)), INF)  # 5 % apart, 5 ms to about 1 s
VLLM = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, INF)


def lognormal(p99: float, n: float, bounds: tuple[float, ...] = FINE, sigma: float = 0.3) -> Histogram:
    """Cumulative counts of n samples shaped exactly as a lognormal whose P99 is `p99`."""
    mu = math.log(p99) - Z99 * sigma
    shares = [1.0 if math.isinf(b) else NormalDist(mu, sigma).cdf(math.log(b)) for b in bounds]
    return Histogram(bounds, tuple(n * s for s in shares))


def half_width(n: float, z: float, sigma: float = 0.3) -> float:
    """The asymptotic half-width of a log ratio of two P99s of n samples each, at z: each track's
    log P99 has se sqrt(0.99 * 0.01 / n) / phi(2.3263) * sigma, and the two add in quadrature."""
    per_track = math.sqrt(0.99 * 0.01 / n) / NormalDist().pdf(Z99) * sigma
    return z * math.sqrt(2) * per_track


@pytest.mark.parametrize("p99", [0.040, 0.0425, 0.048, 0.120, 0.241])
@pytest.mark.parametrize("bounds", [FINE, VLLM], ids=["5% buckets", "vLLM default buckets"])
def test_a_lognormal_p99_is_read_exactly_wherever_it_falls_in_its_bucket(
    p99: float, bounds: tuple[float, ...]
) -> None:
    """On probability paper a lognormal's edges lie on a line, so the P99 read on it is exact even
    inside vLLM's 25-50 ms bucket, where Prometheus's flat bucket reads 40 ms and 48 ms far apart
    from the truth."""
    h = lognormal(p99, 1e6, bounds)
    assert probit_quantile(h, 0.99) == pytest.approx(p99, rel=1e-6)


def test_the_flat_bucket_of_prometheus_misreads_the_same_p99() -> None:
    """The reason for probability paper: histogram_quantile puts a 40 ms P99 (sigma 0.3, mu =
    ln 0.040 - 2.3263 * 0.3 = -3.9168; shares at 25 and 50 ms Phi(0.760) = 0.7764 and Phi(3.070) =
    0.99893) at 25 + 25 (0.99 - 0.7764) / (0.99893 - 0.7764) = 49.0 ms."""
    h = lognormal(0.040, 1e6, VLLM)
    mu = math.log(0.040) - Z99 * 0.3
    low, high = (NormalDist(mu, 0.3).cdf(math.log(x)) for x in (0.025, 0.050))
    assert histogram_quantile(h, 0.99) == pytest.approx(0.025 + 0.025 * (0.99 - low) / (high - low), rel=1e-6)
    assert histogram_quantile(h, 0.99) == pytest.approx(0.0490, abs=5e-4)


def test_the_estimate_never_leaves_its_bucket() -> None:
    """Whatever the shares at the edges say, the counts there are exact: a P99 between 20 and 40 ms
    (99 % reached in that bucket) reads between them."""
    h = Histogram((0.01, 0.02, 0.04, INF), (10.0, 500.0, 1000.0, 1000.0))
    assert 0.02 <= (probit_quantile(h, 0.99) or 0) <= 0.04


def test_a_canary_ten_percent_faster_passes_with_the_ratio_and_its_bounds() -> None:
    """P99 36 ms against 40 ms: ratio 0.9. 20,000 samples a track, half-width at 2.3 about
    2.3 * sqrt(2) * sqrt(0.0099 / 20000) / 0.026652 * 0.3 = 0.0273 in log: upper 0.9 e^0.0273 = 0.925,
    within 1.1."""
    result = latency_gate(lognormal(0.040, 20_000), lognormal(0.036, 20_000), max_regression=0.10)
    assert result.verdict == Verdict.PASS
    assert result.estimate == pytest.approx(0.9, rel=1e-3)
    assert result.upper == pytest.approx(0.9 * math.exp(half_width(20_000, 2.3)), rel=0.05)
    assert result.message.startswith("P99 ITL canary 36.0 ms vs baseline 40.0 ms: ratio 0.900 [")
    assert result.message.endswith("over 20000 samples: within 10%")
    assert result.samples_needed is None  # decided: nothing more to wait for


def test_a_canary_twenty_percent_slower_fails() -> None:
    """Ratio 1.2; its lower bound 1.2 e^-0.0273 = 1.168 > 1.1."""
    result = latency_gate(lognormal(0.040, 20_000), lognormal(0.048, 20_000), max_regression=0.10)
    assert result.verdict == Verdict.FAIL
    assert result.estimate == pytest.approx(1.2, rel=1e-3)
    assert result.message.endswith("over 20000 samples: more than 10% worse")
    assert result.samples_needed is None


def test_an_equal_canary_undecided_says_how_many_samples_tell_it_at_most() -> None:
    """Ratio 1 over 600 samples a track: half-width about 2.3 * sqrt(2) * sqrt(0.0099 / 600) /
    0.026652 * 0.3 = 0.158 > ln 1.1 = 0.0953, so undecided. The bracket, near its first rank bound,
    narrows faster than 1/sqrt(n): the count it reports, from the bracket now, is at least the
    asymptotic one, and tracks of that many samples (the same shape) are decided. The result
    carries the count its message states (status shows it)."""
    result = latency_gate(lognormal(0.040, 600), lognormal(0.040, 600), max_regression=0.10)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert "cannot tell 10% yet" in result.message
    reported = result.samples_needed
    assert reported is not None and reported >= 600 * (half_width(600, 2.3) / math.log(1.1)) ** 2
    assert f"at most about {reported:.0f} samples a track tell it at this ratio" in result.message
    bigger = lognormal(0.040, reported)
    assert latency_gate(bigger, bigger, max_regression=0.10).verdict == Verdict.PASS


def test_below_524_samples_no_rank_bounds_a_p99_on_coarse_buckets() -> None:
    """300 samples on vLLM's buckets: no rank reaches 0.99 + 2.3 se, and a line extended across the
    25-50 ms bucket would be a guess: undecided, saying how many samples bound it."""
    result = latency_gate(lognormal(0.040, 300, VLLM), lognormal(0.020, 300, VLLM), max_regression=0.10)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.upper == INF
    assert result.message.endswith("no rank of 300 samples bounds a P99 from above, need 524")
    assert result.samples_needed == 524


def test_on_fine_buckets_a_much_faster_canary_passes_on_the_extended_line() -> None:
    """Also 300 samples, on 5 % buckets: the top bucket's line, extended to the probit of the
    bracket's top, bounds the canary's P99; half the baseline's passes."""
    result = latency_gate(lognormal(0.040, 300), lognormal(0.020, 300), max_regression=0.10)
    assert result.verdict == Verdict.PASS, result.message


def test_a_fail_never_rests_on_an_extended_line() -> None:
    """A canary three times slower over 300 samples: its lower bound needs the baseline's upper
    one, which no rank gives: undecided, not failed."""
    result = latency_gate(lognormal(0.040, 300), lognormal(0.120, 300), max_regression=0.10)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.lower == 0.0


def test_the_last_look_decides_what_the_looks_could_not() -> None:
    """Equal tracks: undecided at 2.3 while half_width(n, 2.3) > ln 1.1, that is n < 1455; decided
    at 1.645 once half_width(n, 1.645) <= ln 1.1, n >= 745. At 1100 samples a track only the last
    look passes."""
    assert half_width(1100, 2.3) > math.log(1.1) >= half_width(1100, 1.645)
    h = lognormal(0.040, 1100)
    assert latency_gate(h, h, max_regression=0.10).verdict == Verdict.INSUFFICIENT_DATA
    last = latency_gate(h, h, max_regression=0.10, last_look=True)
    assert last.verdict == Verdict.PASS
    assert last.message.endswith("within 10% (at maxAnalysisDuration, a last look at 1.64 sd)")


def test_the_last_look_on_buckets_wider_than_the_tolerance_is_at_1_96() -> None:
    h = lognormal(0.040, 1100, VLLM)
    last = latency_gate(h, h, max_regression=0.10, last_look=True)
    assert "(at maxAnalysisDuration, a last look at 1.96 sd)" in last.message


def test_a_p99_beyond_the_last_edge_asks_for_higher_buckets() -> None:
    bounds = (0.01, 0.025, INF)
    h = Histogram(bounds, (0.0, 980.0, 100_000.0))
    result = latency_gate(h, h, max_regression=0.10, min_count=1)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.message == (
        "P99 ITL: the canary and baseline quantile lies beyond the last bucket edge (25 ms); add higher buckets"
    )
    assert result.samples_needed is None  # more samples will not tell it: higher buckets will


def test_too_few_samples_name_the_smaller_track_and_the_minimum() -> None:
    result = latency_gate(lognormal(0.040, 50), lognormal(0.040, 5000), min_count=100)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.message == "50 P99 ITL samples on the smaller track, need 100"
    assert result.samples_needed == 100
