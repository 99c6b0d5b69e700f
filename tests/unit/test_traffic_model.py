"""The request-level traffic model of the benchmarks (bench/traffic.py): its quadrature alpha, the
solvers, and simulated windows whose pooled alpha lands on it."""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import traffic
from traffic import (
    Traffic,
    expected_drafts_per_window,
    for_alpha,
    long_run_alpha,
    shifted_for_alpha,
    windows,
)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def pooled(counts: np.ndarray, batches: int = 40) -> tuple[float, float]:
    """Pooled alpha and its standard error from batch means (ratio estimator, delta method).

    Batches of 1,000 15-s windows (4 h) are long against everything that correlates windows (a
    request's decode <= 205 s, drift 3 min, burst cycle ~11 min), so their residuals
    accepted - alpha * draft_tokens are close to independent; 40 of them estimate the standard
    error within about +-11 % (1 sd), so 3 standard errors is a two-sided test at about 0.3 %.
    """
    usable = len(counts) // batches * batches
    accepted = counts[:usable, 2].reshape(batches, -1).sum(axis=1)
    tokens = counts[:usable, 1].reshape(batches, -1).sum(axis=1)
    alpha = accepted.sum() / tokens.sum()
    residual = accepted - alpha * tokens
    se = math.sqrt((residual**2).sum() / (batches * (batches - 1))) / tokens.mean()
    return float(alpha), se


# --- quadrature ---


@pytest.mark.parametrize(
    ("a", "b"), [(0.02, 1.98), (0.6, 1.4), (1.64, 0.36), (2.0, 1e-4), (0.5, 0.5), (3.0, 7.0)]
)
def test_beta_nodes_reproduce_the_beta_moments(a: float, b: float) -> None:
    q, w = traffic._beta_nodes(np.array([a]), np.array([b]))
    assert np.all((q >= 0) & (q <= 1)) and math.isclose(w.sum(), 1.0)
    for p in range(1, 9):
        exact = math.prod((a + r) / (a + b + r) for r in range(p))
        assert (w[0] * q[0] ** p).sum() == pytest.approx(exact, rel=1e-10, abs=1e-14)


def test_acceptance_moments_match_the_prefix_model() -> None:
    q = np.linspace(0.0, 1.0, 21)
    for k in (1, 4, 8):
        levels = np.arange(k + 1)
        # P(accepted = j) = q^j (1 - q) for j < K, q^K for j = K
        pmf = q[:, None] ** levels * np.where(levels < k, 1.0 - q[:, None], 1.0)
        mean = (pmf * levels).sum(axis=1)
        variance = (pmf * levels**2).sum(axis=1) - mean**2
        np.testing.assert_allclose(traffic.accepted_mean(q, k), mean, atol=1e-12)
        np.testing.assert_allclose(traffic.accepted_variance(q, k), variance, atol=1e-12)


@pytest.mark.parametrize(("mu0", "drift_sd"), [(0.3, 0.0), (0.82, 0.35), (0.6, 1.0)])
def test_long_run_alpha_agrees_with_monte_carlo(mu0: float, drift_sd: float) -> None:
    t = Traffic(mu0=mu0, requests_per_window=20, drift_sd=drift_sd)
    rng = np.random.default_rng(7)
    n = 400_000
    mu = 1.0 / (1.0 + np.exp(-(logit(mu0) + drift_sd * rng.standard_normal(n))))
    m = traffic.accepted_mean(rng.beta(2 * mu, 2 * (1 - mu)), 4)
    drafts = 1.0 / (1.0 + m)  # drafts per request, L cancels
    estimate = (drafts * m).sum() / (4 * drafts.sum())
    residual = drafts * m - 4 * estimate * drafts
    se = residual.std() / math.sqrt(n) / (4 * drafts.mean())
    assert abs(long_run_alpha(t) - estimate) < 4 * se
    # the draft weighting matters: the requests' own mean acceptance is far higher
    assert m.mean() / 4 - long_run_alpha(t) > 0.05


@pytest.mark.parametrize(
    ("k", "concentration", "drift_sd"), [(4, 2.0, 0.0), (4, 2.0, 0.35), (1, 0.5, 1.0), (8, 10.0, 0.35)]
)
def test_long_run_alpha_increases_with_mu0(k: int, concentration: float, drift_sd: float) -> None:
    alphas = [
        long_run_alpha(
            Traffic(mu0=mu0, requests_per_window=3, k=k, concentration=concentration, drift_sd=drift_sd)
        )
        for mu0 in np.linspace(0.01, 0.99, 50)
    ]
    assert all(b > a for a, b in itertools.pairwise(alphas))
    assert 0 < alphas[0] < 0.05 and 0.9 < alphas[-1] < 1


# --- solvers ---


@pytest.mark.parametrize("alpha", [0.05, 0.45, 0.55, 0.7, 0.95])
@pytest.mark.parametrize(
    "kw", [{}, {"drift_sd": 0.0, "bursts": False}, {"window_seconds": 30.0, "k": 3, "concentration": 5.0}]
)
def test_for_alpha_round_trips(alpha: float, kw: dict[str, float]) -> None:
    t = for_alpha(alpha, 20, **kw)
    assert abs(long_run_alpha(t) - alpha) < 1e-6
    assert t.requests_per_window == 20 and all(getattr(t, key) == value for key, value in kw.items())


def test_for_alpha_rejects_impossible_alphas() -> None:
    for alpha in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            for_alpha(alpha, 20)


@pytest.mark.parametrize("target", [0.3, 0.5, 0.7])
def test_shifted_for_alpha_moves_the_long_run_alpha(target: float) -> None:
    healthy = for_alpha(0.6, 20)
    shift = shifted_for_alpha(healthy, target)
    shifted = replace(healthy, mu0=sigmoid(logit(healthy.mu0) + shift))
    assert abs(long_run_alpha(shifted) - target) < 1e-6
    assert (shift < 0) == (target < 0.6)


# --- simulated windows ---


@pytest.mark.parametrize(
    ("requests_per_window", "drift_sd", "bursts"),
    [(20, 0.35, True), (20, 0.0, False), (20, 0.35, False), (20, 0.0, True), (3, 0.35, True)],
)
def test_pooled_alpha_lands_on_the_long_run_alpha(
    requests_per_window: float, drift_sd: float, bursts: bool
) -> None:
    t = for_alpha(0.55, requests_per_window, drift_sd=drift_sd, bursts=bursts)
    counts = windows(
        t, 40_000, np.random.default_rng(int(requests_per_window * 10 + drift_sd * 100 + bursts))
    )
    alpha, se = pooled(counts)
    assert abs(alpha - 0.55) < 3 * se
    # and the test has power: the requests' own mean acceptance (unweighted by drafts) is far away
    assert se < 0.006


def test_pooled_alpha_at_200_requests_per_window() -> None:
    t = for_alpha(0.55, 200, drift_sd=0.0)
    alpha, se = pooled(windows(t, 4_000, np.random.default_rng(200)))
    assert abs(alpha - 0.55) < 3 * se and se < 0.002


def test_the_mean_draft_rate_includes_bursts_and_lulls() -> None:
    t = for_alpha(0.55, 20)
    counts = windows(t, 40_000, np.random.default_rng(3))
    batches = counts[:, 0].reshape(40, -1).mean(axis=1)
    se = batches.std(ddof=1) / math.sqrt(len(batches))
    assert abs(batches.mean() - expected_drafts_per_window(t)) < 3 * se + 0.002 * batches.mean()


def test_counters_are_consistent() -> None:
    for k in (1, 4, 8):
        t = for_alpha(0.55, 20, k=k)
        counts = windows(t, 5_000, np.random.default_rng(k))
        drafts, tokens, accepted = counts.T
        assert counts.shape == (5_000, 3) and counts.dtype == np.float64
        assert np.array_equal(tokens, k * drafts)
        assert np.all(accepted >= 0) and np.all(accepted <= tokens)
        assert np.array_equal(counts, np.rint(counts)) and drafts.mean() > 100


def test_low_rates_leave_windows_empty() -> None:
    share = {}
    for rpw, count in ((3, 40_000), (20, 20_000), (200, 2_000)):
        counts = windows(for_alpha(0.55, rpw), count, np.random.default_rng(rpw))
        share[rpw] = float(np.mean(counts[:, 0] == 0))
    # 3 per window: Poisson(3) has P(0) = 5 %, requests spanning windows fill some, lulls empty more
    assert 0.02 < share[3] < 0.10
    assert share[20] < 0.01 and share[200] == 0.0


def test_a_step_in_the_mix_moves_alpha_after_it() -> None:
    healthy = for_alpha(0.6, 200, drift_sd=0.0)
    shift = shifted_for_alpha(healthy, 0.45)
    t0 = 1_000 * healthy.window_seconds
    counts = windows(
        healthy, 2_000, np.random.default_rng(11), mu_shift=lambda a: np.where(a >= t0, shift, 0.0)
    )
    settled = 1_000 + math.ceil(traffic.MAX_DECODE_SECONDS / healthy.window_seconds)  # older requests done
    before, se_before = pooled(counts[:1_000], batches=20)
    after, se_after = pooled(counts[settled:], batches=20)
    assert abs(before - 0.6) < 3 * se_before and abs(after - 0.45) < 3 * se_after


def test_windows_are_reproducible_and_the_shift_draws_nothing() -> None:
    t = for_alpha(0.55, 20)
    first = windows(t, 500, np.random.default_rng(5))
    assert np.array_equal(first, windows(t, 500, np.random.default_rng(5)))
    assert np.array_equal(
        first, windows(t, 500, np.random.default_rng(5), mu_shift=lambda a: np.zeros_like(a))
    )
    assert windows(t, 0, np.random.default_rng(5)).shape == (0, 3)


@pytest.mark.parametrize(("d", "q"), [(3, 0.6), (200, 0.6), (200, 0.01), (200, 0.995), (40, 1.0), (40, 0.0)])
def test_accepted_sampling_has_the_exact_mean_and_variance(d: int, q: float) -> None:
    n = 200_000
    drafts = np.full(n, d, dtype=np.int64)
    qs = np.full(n, q)
    m = traffic.accepted_mean(qs, 4)
    sample = traffic._accepted(drafts, qs, m, 4, np.random.default_rng(d))
    mean, variance = d * m[0], d * traffic.accepted_variance(qs, 4)[0]
    assert np.all((sample >= 0) & (sample <= 4 * d))
    assert abs(sample.mean() - mean) <= 4 * math.sqrt(variance / n) + 1e-12
    assert sample.var() == pytest.approx(variance, rel=0.02, abs=0.1)  # rounding adds ~1/12 at most


def test_chunks_cover_the_rate_segments() -> None:
    t = Traffic(mu0=0.5, requests_per_window=200)
    segments = traffic._rate_segments(t, -100.0, 2e6, np.random.default_rng(1))
    groups = traffic._split(segments)
    pieces = np.concatenate(groups)
    assert len(groups) > 10 and pieces[0, 0] == -100.0 and pieces[-1, 1] == 2e6
    assert np.array_equal(pieces[1:, 0], pieces[:-1, 1])
    assert math.isclose(((pieces[:, 1] - pieces[:, 0]) * pieces[:, 2]).sum(), 2e6 / 15 * 200, rel_tol=0.02)
