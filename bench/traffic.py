"""Request-level traffic model for the decision benchmarks: per-window draft counters from requests.

vLLM reports counters (drafts, draft tokens, accepted tokens); the operator sums their increases
over fixed windows. This module simulates the requests behind those sums:

- Arrivals: a Poisson process whose rate is modulated by a Markov chain of RATE_STATES (normal,
  burst x3 for ~1 min, lull x0.1 for ~2 min, one of the two every ~10 min). `requests_per_window`
  is the long-run mean including bursts and lulls; at a few requests per window some windows are
  empty.
- Acceptance: each request draws its own per-position acceptance q ~ Beta(c*mu, c*(1-mu)) with a
  low concentration c (prompts differ a lot); a draft proposes K tokens and accepts a prefix,
  P(accepted >= j) = q^j.
- Lengths: lognormal output lengths (median OUTPUT_MEDIAN_TOKENS, sigma OUTPUT_SIGMA, capped at
  MAX_OUTPUT_TOKENS like a max_tokens limit), independent of q. A draft step emits accepted + 1
  tokens, so a request makes L / (1 + E[acc|q]) drafts in expectation (stochastically rounded).
  It decodes at DECODE_TOKENS_PER_SECOND from its arrival, so its drafts spread over the windows
  its decode spans, in proportion to time.
- Drift: the traffic mix moves on a minute scale, mu(t) = sigmoid(logit(mu0) + z(t)) with z an
  Ornstein-Uhlenbeck process (timescale DRIFT_SECONDS, stationary sd `drift_sd` in logit units);
  a request keeps the mu of its arrival time.

The long-run alpha (accepted tokens / draft tokens) of this model is computed exactly by
quadrature (`long_run_alpha`), so benchmarks can place canaries at a known alpha (`for_alpha`) and
shift them by a known amount (`shifted_for_alpha` with `windows(..., mu_shift=...)`).

Accepted tokens, per (request, window) piece of d drafts: exactly where d is small or the mean
is near 0 or d*K (N_j ~ Binomial(N_{j-1}, q) drafts accept at least j tokens, N_0 = d, and the
accepted tokens are N_1 + ... + N_K: K binomial draws, whatever d), else a rounded normal with
the exact mean d*m(q) and variance d*v(q), clipped to [0, d*K], which is used only where
d >= NORMAL_MIN_DRAFTS and both clips are NORMAL_CLEARANCE_SD standard deviations away (so the
clip does not bias the mean: Beta(c*mu, c*(1-mu)) with c = 2 puts much mass near q = 0 and 1,
where a normal approximation of a small count would).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Arrival-rate states (multiplier of the base rate, mean sojourn in seconds). From normal the
# chain moves to a burst or a lull with equal probability; both return to normal. Time shares:
# normal 600/690 = 87 %, burst 30/690 = 4.3 %, lull 60/690 = 8.7 %; the mean multiplier (1.009)
# is divided out so that `requests_per_window` is the long-run mean.
RATE_STATES: tuple[tuple[float, float], ...] = (
    (1.0, 600.0),  # normal: ~10 min between episodes
    (3.0, 60.0),  # burst: x3 for ~1 min
    (0.1, 120.0),  # lull: x0.1 for ~2 min
)
BURST_SHARE = 0.5  # of the episodes that leave the normal state, the share that are bursts

OUTPUT_MEDIAN_TOKENS = 250.0
OUTPUT_SIGMA = 1.0  # lognormal: p10 ~70, p90 ~900 tokens, mean ~410
MAX_OUTPUT_TOKENS = 8192  # a max_tokens cap; P(L > cap) ~ 2e-4
DECODE_TOKENS_PER_SECOND = 40.0  # one request's decode speed with speculation (constant)
MAX_DECODE_SECONDS = MAX_OUTPUT_TOKENS / DECODE_TOKENS_PER_SECOND  # also the warm-up before window 0

# Mix drift: OU on logit(mu). +-0.35 logit units (1 sd) moves the mix's alpha from 0.55 to 0.46 /
# 0.64 with K = 4 and c = 2: traffic whose share of easy and hard prompts changes over minutes.
DRIFT_SD = 0.35
DRIFT_SECONDS = 180.0  # OU timescale (1/theta)
DRIFT_STEP_SECONDS = 5.0  # z is simulated exactly on this grid and held between its points

# Quadrature sizes for long_run_alpha (Gauss-Hermite over z, Gauss-Jacobi over q): the integrand
# is analytic on [0, 1] (poles of 1/(1+m(q)) at |q| = 1 off the real axis). Against 80/96 nodes:
# error < 1e-12 for drift_sd <= 1 and c >= 2, < 3e-7 up to drift_sd = 2, c = 0.5, K = 8; the
# tests also check against a Monte Carlo estimate.
HERMITE_NODES = 40
JACOBI_NODES = 48

# Accepted tokens of one request's drafts in one window: exact (chained binomials, see _accepted)
# unless there are at least NORMAL_MIN_DRAFTS drafts and 0 and d*K are both NORMAL_CLEARANCE_SD
# standard deviations from the mean; then a rounded normal with the exact mean and variance.
NORMAL_MIN_DRAFTS = 16
NORMAL_CLEARANCE_SD = 4.0

REQUESTS_PER_CHUNK = 400_000  # requests simulated at once (memory bound, not a model parameter)
MU_EPSILON = 1e-12  # mu is kept in [eps, 1 - eps] so that the Beta shapes stay positive


@dataclass(frozen=True)
class Traffic:
    mu0: float  # Beta mean of q at drift z = 0
    requests_per_window: float  # long-run mean, bursts and lulls included
    window_seconds: float = 15.0
    k: int = 4
    concentration: float = 2.0
    drift_sd: float = DRIFT_SD  # logit units, 0 = no drift
    bursts: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.mu0 < 1.0:
            raise ValueError(f"mu0 must be in (0, 1), got {self.mu0}")
        if self.requests_per_window < 0 or self.window_seconds <= 0:
            raise ValueError("requests_per_window must be >= 0 and window_seconds > 0")
        if self.k < 1 or self.concentration <= 0 or self.drift_sd < 0:
            raise ValueError("k must be >= 1, concentration > 0, drift_sd >= 0")


# --- per-draft acceptance ---


def accepted_mean(q: FloatArray, k: int) -> FloatArray:
    """E[accepted | q] = sum_{j=1..K} P(accepted >= j) = sum_j q^j (= q(1-q^K)/(1-q))."""
    result = np.zeros_like(q)
    for _ in range(k):  # Horner: q(1 + q(1 + ...))
        result = q * (1.0 + result)
    return result


def accepted_variance(q: FloatArray, k: int) -> FloatArray:
    """Var[accepted | q], with E[accepted^2] = sum_j (2j - 1) q^j."""
    second = np.zeros_like(q)
    for j in range(k, 0, -1):
        second = q * (2 * j - 1 + second)
    result: FloatArray = np.maximum(second - accepted_mean(q, k) ** 2, 0.0)
    return result


# --- long-run alpha by quadrature ---


def _sigmoid(x: FloatArray) -> FloatArray:
    result: FloatArray = 0.5 * (1.0 + np.tanh(0.5 * x))
    return result


def _logit(p: float) -> float:
    return math.log(p) - math.log1p(-p)


def _beta_nodes(a: FloatArray, b: FloatArray, n: int = JACOBI_NODES) -> tuple[FloatArray, FloatArray]:
    """Gauss-Jacobi nodes in q and probability weights for Beta(a, b), one row per (a, b).

    Golub-Welsch on the Jacobi weight (1-x)^alpha (1+x)^beta, x = 2q - 1, alpha = b - 1,
    beta = a - 1; weights are normalised to 1, so Beta functions are not needed."""
    al, be = (b - 1.0)[:, None], (a - 1.0)[:, None]
    s = al + be
    idx = np.arange(n, dtype=np.float64)[None, :]
    two = 2.0 * idx + s
    with np.errstate(divide="ignore", invalid="ignore"):
        diag = (be**2 - al**2) / (two * (two + 2.0))
    diag[:, 0] = ((be - al) / (s + 2.0))[:, 0]
    m = np.arange(1, n, dtype=np.float64)[None, :]
    tm = 2.0 * m + s
    with np.errstate(divide="ignore", invalid="ignore"):
        off2 = 4.0 * m * (m + al) * (m + be) * (m + s) / (tm**2 * (tm + 1.0) * (tm - 1.0))
    # m = 1 with alpha + beta = -1 is 0/0: the (1 + s) factors cancel
    off2[:, 0] = (4.0 * (1.0 + al) * (1.0 + be) / ((2.0 + s) ** 2 * (3.0 + s)))[:, 0]
    off = np.sqrt(np.maximum(off2, 0.0))
    jacobi = np.zeros((len(a), n, n))
    rows = np.arange(n)
    jacobi[:, rows, rows] = diag
    jacobi[:, rows[:-1], rows[1:]] = off
    jacobi[:, rows[1:], rows[:-1]] = off
    x, vectors = np.linalg.eigh(jacobi)
    weights = vectors[:, 0, :] ** 2
    weights /= weights.sum(axis=1, keepdims=True)
    q: FloatArray = np.clip((x + 1.0) / 2.0, 0.0, 1.0)
    return q, weights


def _alpha_at(logit_mu0: float, k: int, concentration: float, drift_sd: float) -> float:
    """E[D m(q)] / (K E[D]) with D(q) = 1 / (1 + m(q)), z ~ N(0, drift_sd^2), q ~ Beta."""
    if drift_sd > 0:
        z, wz = np.polynomial.hermite_e.hermegauss(HERMITE_NODES)
        z, wz = z * drift_sd, wz / wz.sum()
    else:
        z, wz = np.zeros(1), np.ones(1)
    mu = np.clip(_sigmoid(logit_mu0 + z), MU_EPSILON, 1.0 - MU_EPSILON)
    q, wq = _beta_nodes(concentration * mu, concentration * (1.0 - mu))
    m = accepted_mean(q, k)
    drafts = 1.0 / (1.0 + m)
    numerator = float(wz @ (wq * drafts * m).sum(axis=1))
    denominator = float(wz @ (wq * drafts).sum(axis=1))
    return numerator / (k * denominator)


def long_run_alpha(t: Traffic) -> float:
    """The model's long-run accepted tokens / draft tokens, by quadrature (not from a sample).

    Per request, E[drafts | q, L] = L / (1 + m(q)) and E[accepted | drafts, q] = drafts * m(q);
    L is independent of q and of the arrival process, so E[L] cancels and
    alpha = E[D m] / (K E[D]), D = 1 / (1 + m(q)), over z ~ N(0, drift_sd^2) at the arrival and
    q ~ Beta(c mu(z), c (1 - mu(z))). Requests with many drafts (low q) weigh more: the long-run
    alpha is below the mean of the requests' own m(q) / K."""
    return _alpha_at(_logit(t.mu0), t.k, t.concentration, t.drift_sd)


def _solve_logit(target: float, k: int, concentration: float, drift_sd: float) -> float:
    """logit(mu0) with _alpha_at == target within 1e-6, by bisection (alpha increases with mu0)."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {target}")
    lo, hi = -30.0, 30.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        value = _alpha_at(mid, k, concentration, drift_sd)
        if abs(value - target) < 1e-9 or hi - lo < 1e-12:
            break
        if value < target:
            lo = mid
        else:
            hi = mid
    if abs(value - target) >= 1e-6:
        raise ValueError(f"alpha {target} is out of this model's reach (got {value})")
    return mid


def for_alpha(alpha: float, requests_per_window: float, **kw: Any) -> Traffic:
    """The Traffic (other fields from kw) whose long-run alpha is `alpha` within 1e-6."""
    base = Traffic(mu0=0.5, requests_per_window=requests_per_window, **kw)
    logit_mu0 = _solve_logit(alpha, base.k, base.concentration, base.drift_sd)
    return replace(base, mu0=float(_sigmoid(np.array(logit_mu0))))


def shifted_for_alpha(t: Traffic, alpha: float) -> float:
    """The constant logit shift of every request's mu that makes the long-run alpha `alpha`."""
    return _solve_logit(alpha, t.k, t.concentration, t.drift_sd) - _logit(t.mu0)


def expected_drafts_per_window(t: Traffic) -> float:
    """Long-run mean drafts per window: requests_per_window * E[L] * E[1 / (1 + m(q))] (L capped,
    its rounding to whole tokens neglected)."""
    mu, s, cap = math.log(OUTPUT_MEDIAN_TOKENS), OUTPUT_SIGMA, MAX_OUTPUT_TOKENS

    def phi(x: float) -> float:
        return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))

    lc = math.log(cap)
    mean_length = math.exp(mu + s * s / 2) * phi((lc - mu - s * s) / s) + cap * (1 - phi((lc - mu) / s))
    alpha = long_run_alpha(t)
    # alpha K E[D] = E[D m] and E[D] + E[D m] = E[(1 + m) / (1 + m)] = 1, so E[D] = 1 / (1 + alpha K)
    return t.requests_per_window * mean_length / (1.0 + alpha * t.k)


# --- simulation ---


def _rate_segments(t: Traffic, start: float, end: float, rng: np.random.Generator) -> FloatArray:
    """Rows (begin, end, requests per second) covering [start, end), the chain started stationary."""
    mean_rate = t.requests_per_window / t.window_seconds
    if not t.bursts:
        return np.array([[start, end, mean_rate]])
    multipliers = np.array([m for m, _ in RATE_STATES])
    dwell = np.array([d for _, d in RATE_STATES])
    visits = np.array([1.0, BURST_SHARE, 1.0 - BURST_SHARE])  # per cycle normal -> episode
    share = visits * dwell / (visits * dwell).sum()  # time shares
    base = mean_rate / float(share @ multipliers)
    first = int(rng.choice(len(RATE_STATES), p=share))  # sojourns are memoryless: a fresh one is right
    states = [np.array([first], dtype=np.int64)] if first else []
    durations = [rng.exponential(dwell[states[0]])] if first else []
    covered = float(durations[0].sum()) if first else 0.0
    while covered < end - start:
        n = int((end - start - covered) / float(visits @ dwell) * 1.1) + 4
        cycle = np.column_stack(
            (np.zeros(n, dtype=np.int64), np.where(rng.random(n) < BURST_SHARE, 1, 2))
        ).ravel()
        states.append(cycle)
        durations.append(rng.exponential(dwell[cycle]))
        covered += float(durations[-1].sum())
    sequence = np.concatenate(states)
    ends = start + np.cumsum(np.concatenate(durations))
    last = int(np.searchsorted(ends, end)) + 1
    sequence, ends = sequence[:last], np.minimum(ends[:last], end)
    begins = np.concatenate(([start], ends[:-1]))
    return np.column_stack((begins, ends, base * multipliers[sequence]))


def _drift_path(t: Traffic, start: float, end: float, rng: np.random.Generator) -> FloatArray:
    """Stationary OU z on the grid start + i * DRIFT_STEP_SECONDS (exact transition)."""
    n = math.ceil((end - start) / DRIFT_STEP_SECONDS) + 1
    if t.drift_sd == 0:
        return np.zeros(n)
    rho = math.exp(-DRIFT_STEP_SECONDS / DRIFT_SECONDS)
    noise = rng.standard_normal(n) * t.drift_sd
    noise[1:] *= math.sqrt(1.0 - rho * rho)
    # z_i = rho z_{i-1} + e_i as a linear filter, in blocks to keep rho^i away from underflow
    z = np.empty(n)
    block = 256
    powers = rho ** np.arange(block)
    previous = 0.0  # rho * z just before the block
    for s in range(0, n, block):
        e = noise[s : s + block]
        p = powers[: len(e)]
        z[s : s + len(e)] = p * (previous + np.cumsum(e / p))
        previous = z[s + len(e) - 1] * rho
    return z


def _split(segments: FloatArray) -> list[FloatArray]:
    """Groups of segments with about REQUESTS_PER_CHUNK expected arrivals each."""
    expected = (segments[:, 1] - segments[:, 0]) * segments[:, 2]
    if expected.sum() <= REQUESTS_PER_CHUNK:
        return [segments]
    # cut long segments first so that every group stays near the size
    cut = np.maximum(1, np.ceil(expected / (REQUESTS_PER_CHUNK / 4))).astype(np.int64)
    index = np.repeat(np.arange(len(segments)), cut)
    offset = np.arange(len(index)) - np.repeat(np.cumsum(cut) - cut, cut)
    width = (segments[:, 1] - segments[:, 0]) / cut
    begins = segments[index, 0] + offset * width[index]
    pieces = np.column_stack((begins, begins + width[index], segments[index, 2]))
    if len(pieces):
        pieces[np.cumsum(cut) - 1, 1] = segments[:, 1]
    load = np.cumsum((pieces[:, 1] - pieces[:, 0]) * pieces[:, 2])
    group = (load // REQUESTS_PER_CHUNK).astype(np.int64)
    bounds = np.flatnonzero(np.diff(group)) + 1
    return np.split(pieces, bounds)


def _accepted(
    d: npt.NDArray[np.int64], q: FloatArray, m: FloatArray, k: int, rng: np.random.Generator
) -> FloatArray:
    """Accepted tokens of d drafts at acceptance q (m = E[accepted | q]), per piece.

    Exact where d or the clearance is small: N_j ~ Binomial(N_{j-1}, q) drafts accept at least j
    tokens (N_0 = d) and the accepted tokens are N_1 + ... + N_K. Elsewhere the normal
    approximation N(d m, d v) rounded and clipped to [0, d K], only where d >= NORMAL_MIN_DRAFTS
    and both clips lie NORMAL_CLEARANCE_SD standard deviations away: the clip moves the mean by
    < 1e-5 sd, and the piece's skewness, about 1 / NORMAL_CLEARANCE_SD at the border (Poisson-
    like counts near q = 0 or 1), is diluted further in a window's sum over many pieces."""
    mean = d * m
    sd = np.sqrt(d * accepted_variance(q, k))
    normal = (
        (d >= NORMAL_MIN_DRAFTS)
        & (mean - NORMAL_CLEARANCE_SD * sd >= 0.0)
        & (mean + NORMAL_CLEARANCE_SD * sd <= d * k)
    )
    out = np.empty(len(d))
    approx = np.flatnonzero(normal)
    out[approx] = np.clip(
        np.rint(mean[approx] + sd[approx] * rng.standard_normal(len(approx))), 0.0, d[approx] * k
    )
    exact = np.flatnonzero(~normal)
    reached, qe = d[exact], q[exact]
    total = np.zeros(len(exact), dtype=np.int64)
    for _ in range(k):
        reached = rng.binomial(reached, qe)
        total += reached
    out[exact] = total
    return out


def windows(
    t: Traffic,
    count: int,
    rng: np.random.Generator,
    mu_shift: Callable[[npt.NDArray[Any]], npt.NDArray[Any]] | None = None,
) -> FloatArray:
    """`count` consecutive windows from a stationary start: columns drafts, draft_tokens,
    accepted_tokens (floats, the increases vLLM's counters would show, summed over the window).

    Window i covers [i * window_seconds, (i + 1) * window_seconds); requests arrive from
    -MAX_DECODE_SECONDS on so that window 0 already sees requests in flight. mu_shift(arrival
    seconds) returns an additive logit shift per request (e.g. a step at t0 for a drop in alpha)."""
    out = np.zeros((count, 3))
    if count <= 0:
        return out
    w = t.window_seconds
    start, end = -MAX_DECODE_SECONDS, count * w
    segments = _rate_segments(t, start, end, rng)
    z_path = _drift_path(t, start, end, rng)
    logit_mu0 = _logit(t.mu0)
    drafts_sum = np.zeros(count)
    accepted_sum = np.zeros(count)
    for group in _split(segments):
        lengths_s = group[:, 1] - group[:, 0]
        n = rng.poisson(lengths_s * group[:, 2])
        arrival = np.repeat(group[:, 0], n) + rng.random(int(n.sum())) * np.repeat(lengths_s, n)
        if len(arrival) == 0:
            continue
        zi = np.minimum(((arrival - start) / DRIFT_STEP_SECONDS).astype(np.int64), len(z_path) - 1)
        logit_mu = logit_mu0 + z_path[zi]
        if mu_shift is not None:
            logit_mu = logit_mu + np.broadcast_to(
                np.asarray(mu_shift(arrival), dtype=np.float64), arrival.shape
            )
        mu = np.clip(_sigmoid(logit_mu), MU_EPSILON, 1.0 - MU_EPSILON)
        q = rng.beta(t.concentration * mu, t.concentration * (1.0 - mu))
        length = np.rint(rng.lognormal(math.log(OUTPUT_MEDIAN_TOKENS), OUTPUT_SIGMA, len(arrival)))
        length = np.clip(length, 1.0, MAX_OUTPUT_TOKENS)
        per_draft = 1.0 + accepted_mean(q, t.k)
        drafts = np.floor(length / per_draft + rng.random(len(arrival)))  # E[drafts] = L / (1 + m)
        duration = length / DECODE_TOKENS_PER_SECOND
        finish = arrival + duration
        first = np.floor(arrival / w).astype(np.int64)
        spans = np.floor(finish / w).astype(np.int64) - first + 1
        # one piece per (request, window it decodes in)
        req = np.repeat(np.arange(len(arrival)), spans)
        window = np.repeat(first, spans) + (np.arange(len(req)) - np.repeat(np.cumsum(spans) - spans, spans))
        lo = np.maximum(arrival[req], window * w)
        hi = np.minimum(finish[req], (window + 1) * w)
        total, a0, dur = drafts[req], arrival[req], duration[req]
        d = np.rint(total * (hi - a0) / dur) - np.rint(total * (lo - a0) / dur)  # cumulative rounding
        keep = (window >= 0) & (window < count) & (d > 0)
        req, window, d = req[keep], window[keep], d[keep].astype(np.int64)
        accepted = _accepted(d, q[req], per_draft[req] - 1.0, t.k, rng)
        drafts_sum += np.bincount(window, weights=d, minlength=count)
        accepted_sum += np.bincount(window, weights=accepted, minlength=count)
    out[:, 0] = drafts_sum
    out[:, 1] = drafts_sum * t.k
    out[:, 2] = accepted_sum
    return out
