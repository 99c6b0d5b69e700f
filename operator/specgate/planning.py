"""Speedup, break-even and draft-length planning (pure).

Terms. vLLM's acceptance rate alpha = accepted / draft tokens. Drafts accept as a prefix: with a
constant conditional rate c (position i accepted given all before it were), one draft of length K
yields E[accepted] = c + c^2 + ... + c^K, so alpha = E[accepted] / K, and a step emits 1 + E[accepted]
tokens. The measured per-position counters give u_i = P(positions 0..i accepted) directly, with no
assumption on c: E[accepted | draft length k] = u_0 + ... + u_{k-1}.

Cost (issue 40). One engine step with B running requests and draft length K is

    step(B, K) = target(T = B * (K + 1) tokens)                        the verify pass
               + [K > 0] * (verify_ms + spec_engine_ms + K * draft_pass_ms)
               + [K > 0] * (draft(T = B * (K + 1)) + (K - 1) * draft(T = B))   the draft's passes

and one forward pass of a network over T new tokens of B requests, each with `context` tokens of KV, is

    pass(T, B) = weights_ms * (1 + (T / ridge_tokens) ** knee) ** (1 / knee)
               + kv_ms * max(B, min_attention_batch) * context / 1000

- `weights_ms` reads the weights once: the whole step at small batch (memory bound);
- the roofline: below `ridge_tokens` (peak FLOPs over bandwidth, in tokens) extra tokens ride on the
  weight read almost for free, above it every token costs weights_ms / ridge_tokens of compute. The
  knee (1.5) rounds the corner as real GEMMs do;
- attention reads each request's KV context (`kv_ms` per 1000 tokens); a handful of requests cannot
  fill the GPU, hence the floor `min_attention_batch`;
- `verify_ms`: the fixed extra of a multi-token (q > 1) pass; `spec_engine_ms` and `draft_pass_ms`:
  the serving engine's own overhead for a speculative step and per draft pass (rejection sampler,
  draft bookkeeping), absent from a bare forward-pass table;
- the draft: an EAGLE head (one decoder layer), a draft model, or nothing (ngram, suffix). vLLM's
  EAGLE/draft-model proposer runs its first pass over every verified token, then K - 1 passes of one.

Parameters come from the target's size and the accelerator (`ACCELERATORS`, from the vendors'
datasheets) times efficiencies fitted to a measured H100 table (`bench/gpu/h100-step-costs.jsonl`:
`fit_pass` refits them from any such table), and from measurement wherever the canary's and the
baseline's mean step times exist (`CostModel.measured`: the per-draft-pass overhead absorbs what the
physics does not explain). bench/draft_length.py scores the advice against real engines.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Accelerator:
    name: str
    bf16_tflops: float  # peak dense BF16 tensor throughput (no sparsity)
    hbm_tbps: float  # memory bandwidth, TB/s


# Peak dense BF16 (the datasheets print twice these "with sparsity") and memory bandwidth:
ACCELERATORS: dict[str, Accelerator] = {
    # NVIDIA H100 datasheet, H100 SXM: BF16 1,979 TFLOPS with sparsity, 3.35 TB/s HBM3
    "H100": Accelerator("H100", 989.5, 3.35),
    # NVIDIA H200 datasheet, H200 SXM: BF16 1,979 TFLOPS with sparsity, 4.8 TB/s HBM3e
    "H200": Accelerator("H200", 989.5, 4.8),
    # NVIDIA A100 datasheet, A100 80GB SXM: BF16 312 TFLOPS dense, 2,039 GB/s HBM2e
    "A100": Accelerator("A100", 312.0, 2.039),
    # NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity), 864 GB/s GDDR6
    "L40S": Accelerator("L40S", 362.05, 0.864),
}


@dataclass(frozen=True)
class Network:
    """What a forward pass has to read: the weights and, per token of context, the KV cache."""

    params_b: float  # billions of parameters read per pass
    kv_bytes_per_token: float  # K and V of one context token, all layers
    bytes_per_param: float = 2.0  # bf16; 1 for FP8 weights


def kv_bytes(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> float:
    return 2.0 * layers * kv_heads * head_dim * dtype_bytes


# Llama shapes (config.json of Llama-3.2-1B/3B, Llama-3.1-8B, Llama-3.3-70B), by size: layers,
# hidden width, KV heads, head dimension; and the vocabulary they share.
LLAMA_CONFIGS: dict[float, tuple[int, int, int, int]] = {
    1.24: (16, 2048, 8, 64),
    3.21: (28, 3072, 8, 128),
    8.03: (32, 4096, 8, 128),
    70.6: (80, 8192, 8, 128),
}
LLAMA_SHAPES: dict[float, Network] = {
    size: Network(size, kv_bytes(layers, kv_heads, head_dim))
    for size, (layers, _, kv_heads, head_dim) in LLAMA_CONFIGS.items()
}
LLAMA_VOCABULARY = 128256
# An EAGLE head is one decoder layer of the target, an input fusion of that many hidden states and an
# LM head: EAGLE-3 fuses three and has its own 32000-token draft vocabulary, EAGLE(-1) fuses two and
# uses the target's vocabulary.
HEAD_FUSION_AND_VOCABULARY = {"eagle3": (3, 32000), "eagle": (2, LLAMA_VOCABULARY)}


def eagle_head(params_b: float, method: str) -> Network:
    """The draft head of a Llama-shaped target of this size: 0.40B (EAGLE-3) or 0.78B (EAGLE) for an
    8B target, 1.32B (EAGLE-3) for a 70B one. Of another size, the nearest shape's depth with the
    width grown as the square root of the parameters."""
    nearest = min(LLAMA_CONFIGS, key=lambda size: abs(math.log(size / params_b)))
    layers, width, _, _ = LLAMA_CONFIGS[nearest]
    hidden = width * (params_b / nearest) ** 0.5
    layer_b = (params_b - 2 * LLAMA_VOCABULARY * hidden / 1e9) / layers  # embeddings in, LM head out
    fusion, vocabulary = HEAD_FUSION_AND_VOCABULARY[method]
    return Network(layer_b + (fusion * hidden**2 + vocabulary * hidden) / 1e9, kv_bytes(1, 8, 128))


EAGLE3_HEAD = eagle_head(8.03, "eagle3")


def network_for(params_b: float, bytes_per_param: float = 2.0) -> Network:
    """A Llama-shaped network of this size: the nearest known shape's KV per parameter."""
    nearest = min(LLAMA_SHAPES.values(), key=lambda n: abs(math.log(n.params_b / params_b)))
    return Network(
        params_b, nearest.kv_bytes_per_token * (params_b / nearest.params_b) ** 0.5, bytes_per_param
    )


# Efficiencies fitted to the H100 table (`fit_pass`, tests/unit/test_cost_model.py): an 8B target's
# pass there reads its 16.06 GB of weights in 7.25 ms (66 % of 3.35 TB/s), computes a token past the
# ridge in 7.25 / 275 ms (62 % of 989.5 TFLOPS) and reads KV context at 0.0406 ms per request and 1000
# tokens (96 % of the bandwidth); a pass over 1 to 12 requests reads KV no faster than 12 would.
WEIGHTS_BANDWIDTH_EFFICIENCY = 0.661
FLOPS_EFFICIENCY = 0.616
KV_BANDWIDTH_EFFICIENCY = 0.96
MIN_ATTENTION_BATCH = 12
KNEE = 1.5
VERIFY_MS_H100 = 0.31  # the H100 table's fixed extra of a q > 1 pass


@dataclass(frozen=True)
class Pass:
    """The cost of one forward pass of one network (see the module doc)."""

    weights_ms: float
    ridge_tokens: float
    kv_ms: float  # per request and 1000 tokens of context
    min_attention_batch: int = MIN_ATTENTION_BATCH
    knee: float = KNEE

    def ms(self, tokens: int, batch: int, context: int) -> float:
        compute: float = (1 + (max(tokens, 0) / self.ridge_tokens) ** self.knee) ** (1 / self.knee)
        return self.weights_ms * compute + self.kv_ms * max(batch, self.min_attention_batch) * context / 1000

    @classmethod
    def physics(cls, network: Network, accelerator: Accelerator) -> Pass:
        """From the network's size and the accelerator's datasheet, at the H100-fitted efficiencies.
        An FP8 network (1 byte a parameter) reads half the bytes and, on FP8 tensor cores, computes
        twice as fast: its ridge in tokens stays where bf16's is."""
        bandwidth = accelerator.hbm_tbps * 1e12 * WEIGHTS_BANDWIDTH_EFFICIENCY  # bytes/s
        flops = accelerator.bf16_tflops * 1e12 * FLOPS_EFFICIENCY * (2.0 / network.bytes_per_param)
        weight_bytes = network.params_b * 1e9 * network.bytes_per_param
        weights_ms = weight_bytes / bandwidth * 1e3
        token_ms = 2 * network.params_b * 1e9 / flops * 1e3
        kv_ms = (
            network.kv_bytes_per_token * 1000 / (accelerator.hbm_tbps * 1e12 * KV_BANDWIDTH_EFFICIENCY) * 1e3
        )
        return cls(weights_ms=weights_ms, ridge_tokens=weights_ms / token_ms, kv_ms=kv_ms)


@dataclass(frozen=True)
class StepPoint:
    """One measured forward pass: `batch` requests, `q` new tokens each, `context` tokens of KV."""

    batch: int
    q: int
    context: int
    ms: float


@dataclass(frozen=True)
class PassFit:
    fitted: Pass
    verify_ms: float  # the fixed extra of a q > 1 pass (0 when every point has q = 1)
    worst_relative_error: float


def fit_pass(points: Sequence[StepPoint]) -> PassFit:
    """Fit a Pass (and the q > 1 extra) to measured passes: for each ridge and attention floor on a
    grid, the linear parameters by least squares on relative error; the grid point with the smallest
    worst relative error wins."""
    if not points:
        raise ValueError("no points to fit")
    multi = any(p.q > 1 for p in points)
    ridges = [25.0 * i for i in range(1, 41)]
    best: PassFit | None = None
    for ridge, floor in itertools.product(ridges, (1, 4, 8, 12, 16)):

        def features(p: StepPoint, ridge: float = ridge, floor: int = floor) -> list[float]:
            row = [
                Pass(1.0, ridge, 0.0, floor).ms(p.batch * p.q, p.batch, p.context),  # per weights_ms
                Pass(0.0, ridge, 1.0, floor).ms(p.batch * p.q, p.batch, p.context),  # per kv_ms
            ]
            return row + ([1.0 if p.q > 1 else 0.0] if multi else [])  # per verify_ms

        rows = [[x / p.ms for x in features(p)] for p in points]
        coef = _least_squares(rows, [1.0] * len(points))
        if coef is None or coef[0] <= 0 or coef[1] < 0:
            continue
        worst = max(
            abs(sum(c * x for c, x in zip(coef, features(p), strict=True)) / p.ms - 1) for p in points
        )
        if best is None or worst < best.worst_relative_error:
            fitted = Pass(weights_ms=coef[0], ridge_tokens=ridge, kv_ms=coef[1], min_attention_batch=floor)
            best = PassFit(fitted, coef[2] if multi else 0.0, worst)
    if best is None:
        raise ValueError("no fit: the points do not grow with tokens and context")
    return best


def _least_squares(rows: Sequence[Sequence[float]], target: Sequence[float]) -> list[float] | None:
    """Solve the normal equations by Gaussian elimination; None when singular."""
    n = len(rows[0])
    m = [
        [sum(r[i] * r[j] for r in rows) for j in range(n)]
        + [sum(r[i] * t for r, t in zip(rows, target, strict=True))]
        for i in range(n)
    ]
    for i in range(n):
        pivot = max(range(i, n), key=lambda r: abs(m[r][i]))
        if abs(m[pivot][i]) < 1e-12:
            return None
        m[i], m[pivot] = m[pivot], m[i]
        for r in range(n):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [a - f * b for a, b in zip(m[r], m[i], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


H100_8B = Pass.physics(LLAMA_SHAPES[8.03], ACCELERATORS["H100"])
H100_EAGLE3_HEAD = Pass.physics(EAGLE3_HEAD, ACCELERATORS["H100"])

# The serving engine's extra for a speculative step, absent from a bare forward-pass table. Set from
# the one real vLLM point we have, seed 004 (Llama-3.1-8B, EAGLE K=2, L40S, concurrency 10: a step
# 1.33x a plain one), where the physics alone gives 1.21x of a 30.1 ms plain step: (1.33 - 1.21) x 30.1
# = 3.6 ms. One point: a calibration, not a validation; `measured` replaces it wherever step times exist.
SPEC_ENGINE_MS = 3.6

DRAFTS = ("eagle3", "eagle", "draft_model", "ngram", "suffix", "none")


@dataclass(frozen=True)
class CostModel:
    """Milliseconds of one engine step (see the module doc). The default: a Llama-3.1-8B-shaped
    target with an EAGLE-3 head on an H100, 1024 tokens of context."""

    target: Pass = H100_8B
    draft: Pass | None = H100_EAGLE3_HEAD
    context: int = 1024
    verify_ms: float = VERIFY_MS_H100
    spec_engine_ms: float = SPEC_ENGINE_MS
    draft_pass_ms: float = 0.0  # the engine's extra per draft pass; `measured` fits it

    def step(self, batch: int, k: int) -> float:
        """Milliseconds of one engine step with `batch` running requests and draft length k."""
        batch = max(batch, 1)
        total = self.target.ms(batch * (k + 1), batch, self.context)
        if k <= 0:
            return total
        total += self.verify_ms + self.spec_engine_ms + k * self.draft_pass_ms
        if self.draft is not None:
            total += self.draft.ms(batch * (k + 1), batch, self.context)
            total += (k - 1) * self.draft.ms(batch, batch, self.context)
        return total

    def verify_ratio(self, batch: int, k: int) -> float:
        """The target's verify pass over a plain one, without draft or engine costs (what a bare
        forward-pass table such as the H100 one measures)."""
        plain = self.target.ms(batch, batch, self.context)
        return (self.target.ms(batch * (k + 1), batch, self.context) + self.verify_ms) / plain

    @classmethod
    def for_hardware(
        cls,
        accelerator: str = "H100",
        params_b: float = 8.03,
        draft: str = "eagle3",
        draft_params_b: float = 1.24,
        bytes_per_param: float = 2.0,
        context: int = 1024,
    ) -> CostModel:
        """From the datasheet of `accelerator` (a key of ACCELERATORS), the target's size in billions
        of parameters and the draft method: eagle3 / eagle heads sized for the target, a
        draft_model of draft_params_b, or none (ngram, suffix: no forward pass)."""
        if accelerator not in ACCELERATORS:
            raise ValueError(f"unknown accelerator {accelerator!r}; known: {', '.join(ACCELERATORS)}")
        if draft not in DRAFTS:
            raise ValueError(f"unknown draft {draft!r}; known: {', '.join(DRAFTS)}")
        chip = ACCELERATORS[accelerator]
        target = network_for(params_b, bytes_per_param)
        draft_pass: Pass | None = None
        if draft in HEAD_FUSION_AND_VOCABULARY:
            draft_pass = Pass.physics(eagle_head(params_b, draft), chip)
        elif draft == "draft_model":
            draft_pass = Pass.physics(network_for(draft_params_b), chip)
        return cls(target=Pass.physics(target, chip), draft=draft_pass, context=context)

    @classmethod
    def from_overhead(cls, overhead: float) -> CostModel:
        """A model whose draft pass costs `overhead` target steps (at batch 1), engine included."""
        base = replace(cls(), draft=None, spec_engine_ms=0.0)
        return replace(base, draft_pass_ms=overhead * base.step(1, 0))

    @classmethod
    def measured(cls, steps: Sequence[MeasuredStep], base: CostModel | None = None) -> CostModel:
        """The model whose steps cost what canaries measured: each MeasuredStep a canary's mean step
        at its draft length over the baseline's at its batch. The engine's extra over the physics
        is a fixed part a speculative step (E) plus a part a draft pass (D), both at least zero,
        fitted by least squares on (ratio x plain - physics) = E + k D. One draft length cannot
        tell E from D: all of it goes on D (the cautious reading: longer drafts cost more), so
        other K are extrapolated from one run along the physics' own shape; two or more K fit both."""
        physics = replace(base or cls(), spec_engine_ms=0.0, draft_pass_ms=0.0)
        points = [
            (m.k, m.step_ratio * physics.step(m.batch, 0) - physics.step(m.batch, m.k))
            for m in steps
            if m.k > 0
        ]
        if not points:
            return physics
        fixed, per_pass = _fixed_and_per_pass(points)
        return replace(physics, spec_engine_ms=fixed, draft_pass_ms=per_pass)


# How far a measured step may lie from the physics' price and still be read as the physics: the
# physics is within 10 % of every pass the H100 table measured (tests/unit/test_cost_model.py), and
# one canary's step at one K cannot tell which K a smaller difference belongs to (or whether it is
# the window's noise). Replayed on the GPU tables (bench/draft_length_gpu.py, 3 % noise), the worst
# advice reached 0.904 of the best K's speedup when every difference was fitted, 0.946 with this.
PHYSICS_TOLERANCE = 0.10


def within_physics(
    cost: CostModel, steps: Sequence[MeasuredStep], tolerance: float = PHYSICS_TOLERANCE
) -> bool:
    """Every measured step within `tolerance` (relative) of what `cost` prices it at."""
    return all(
        abs(m.step_ratio * cost.step(m.batch, 0) / cost.step(m.batch, m.k) - 1) <= tolerance for m in steps
    )


@dataclass(frozen=True)
class MeasuredStep:
    """A canary's mean step time at draft length k over the baseline's, at `batch` running requests."""

    k: int
    step_ratio: float
    batch: int


def _fixed_and_per_pass(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(E, D) >= 0 minimising the squared error of E + k D against the measured extras. Where both
    cannot be fitted (one K, or one part would go below zero), the better of D alone and E alone,
    D on a tie: one K is read as all per pass."""
    coef = _least_squares([[1.0, float(k)] for k, _ in points], [extra for _, extra in points])
    if coef is not None and coef[0] >= 0 and coef[1] >= 0:
        return coef[0], coef[1]
    per_pass = sum(k * extra for k, extra in points) / sum(k * k for k, _ in points)  # E = 0
    if len({k for k, _ in points}) == 1:  # both fit exactly; compared, rounding picked either
        return 0.0, max(per_pass, 0.0)
    fixed = sum(extra for _, extra in points) / len(points)  # D = 0
    on_pass = sum((extra - per_pass * k) ** 2 for k, extra in points)
    on_fixed = sum((extra - fixed) ** 2 for _, extra in points)
    return (0.0, max(per_pass, 0.0)) if on_pass <= on_fixed else (max(fixed, 0.0), 0.0)


def expected_accepted(conditional: Sequence[float]) -> float:
    """E[accepted tokens per draft] for conditional rates c_0..c_{K-1}."""
    total, run = 0.0, 1.0
    for c in conditional:
        run *= c
        total += run
    return total


def conditional_for_alpha(alpha: float, k: int) -> float:
    """The constant conditional rate c whose (c + ... + c^k) / k equals alpha (bisection)."""
    alpha = min(max(alpha, 0.0), 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_accepted([mid] * k) / k < alpha else (lo, mid)
    return (lo + hi) / 2


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """1 + E[accepted] for a measured acceptance rate alpha (= k * alpha accepted on average)."""
    return 1 + alpha * k


def expected_speedup(alpha: float, k: int, overhead: float, concurrency: int = 1) -> float:
    """Tokens per unit time with speculation over without, at this concurrency."""
    cost = CostModel.from_overhead(overhead)
    return expected_tokens_per_step(alpha, k) * cost.step(concurrency, 0) / cost.step(concurrency, k)


def break_even_alpha(k: int, overhead: float, concurrency: int = 1) -> float | None:
    """The alpha below which speculation slows decoding down; None if even alpha = 1 loses."""
    if expected_speedup(1.0, k, overhead, concurrency) < 1:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_speedup(mid, k, overhead, concurrency) < 1 else (lo, mid)
    return hi


# The longest draft the advice considers when the canary measured fewer positions: the longest the
# GPU tables measured (bench/gpu, q up to 8), where a batch of one still gains from each position.
ADVICE_K_MAX = 7


@dataclass(frozen=True)
class KRecommendation:
    k: int
    expected_speedup: float
    table: tuple[tuple[int, float], ...]  # (k, expected speedup) for every k measured
    message: str


def recommend_k(
    accepted_per_position: Sequence[float],
    drafts: float,
    cost: CostModel | None = None,
    concurrency: int = 1,
    k_max: int | None = None,
) -> KRecommendation | None:
    """The draft length with the best expected speedup, from one run's per-position counts."""
    if drafts <= 0 or not accepted_per_position:
        return None
    cost = cost or CostModel()
    batch = max(concurrency, 1)
    measured = [min(a / drafts, 1.0) for a in accepted_per_position]
    prefix = extend_prefix(measured, k_max) if k_max else measured
    table = tuple(
        (k, round((1 + sum(prefix[:k])) * cost.step(batch, 0) / cost.step(batch, k), 4))
        for k in range(1, len(prefix) + 1)
    )
    best_k, best = max(table, key=lambda row: row[1])
    beyond = (
        f"positions past {len(measured)} at the last measured conditional rate"
        if len(prefix) > len(measured)
        else f"K above {len(prefix)} not measured"
    )
    message = (
        f"K={best_k} expects {best:.2f}x at concurrency {batch} "
        f"(per-position acceptance {', '.join(f'{u:.2f}' for u in prefix)}; {beyond})"
    )
    return KRecommendation(best_k, best, table, message)


def step_speedup(cost: CostModel, batch: int, prefix: Sequence[float]) -> float:
    """Tokens per unit time with draft length len(prefix) over without, where prefix[i] is
    P(positions 0..i accepted)."""
    k = len(prefix)
    return (1 + sum(prefix)) * cost.step(batch, 0) / cost.step(batch, k)


def break_even_alpha_for(cost: CostModel, k: int, batch: int) -> float | None:
    """The vLLM alpha (accepted / draft tokens) below which draft length k slows this batch down;
    None if even alpha = 1 loses."""
    ratio = cost.step(batch, k) / cost.step(batch, 0)
    if 1 + k < ratio:
        return None
    return max((ratio - 1) / k, 0.0)


def extend_prefix(prefix: Sequence[float], k: int) -> list[float]:
    """The first k positions: those past the measured ones at the last measured conditional rate."""
    if not prefix or len(prefix) >= k:
        return list(prefix[:k])
    rate = prefix[-1] / prefix[-2] if len(prefix) > 1 and prefix[-2] > 0 else prefix[-1]
    out = list(prefix)
    while len(out) < k:
        out.append(out[-1] * rate)
    return out


def prefix_from_conditional(conditional: Sequence[float]) -> list[float]:
    """u_i = c_0 * ... * c_i."""
    out, run = [], 1.0
    for c in conditional:
        run *= c
        out.append(run)
    return out


def best_k(cost: CostModel, batch: int, prefix: Sequence[float]) -> tuple[int, float]:
    """The draft length (0: do not speculate) with the best expected speedup at this batch."""
    table = [(0, 1.0)] + [(k, step_speedup(cost, batch, prefix[:k])) for k in range(1, len(prefix) + 1)]
    return max(table, key=lambda row: row[1])


def hedged_k(costs: Sequence[CostModel], batch: int, prefix: Sequence[float]) -> int:
    """The draft length (0: do not speculate) whose speedup is the largest share of each model's
    best at this batch, in the model where that share is smallest (least regret whichever holds)."""
    bests = [best_k(cost, batch, prefix)[1] for cost in costs]

    def worst_share(k: int) -> float:
        return min(
            (step_speedup(cost, batch, prefix[:k]) if k else 1.0) / best
            for cost, best in zip(costs, bests, strict=True)
        )

    return max(range(len(prefix) + 1), key=worst_share)


def k_schedule(cost: CostModel, prefix: Sequence[float], max_batch: int) -> list[tuple[int, int, int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: inclusive batch-size ranges 1..max_batch, each
    with a draft length there (0 where speculation loses), neighbours with one K merged.

    Chosen before any step of this config is measured, so the engine's extra a speculative step
    (spec_engine_ms) is a guess from one L40S point: each K is the one that loses least whether the
    engine adds that or nothing (hedged_k). Replayed on the GPU tables (bench/draft_length_gpu.py),
    the K best with the extra alone lost 0.4 % to the best static K on the H100 8B mix; hedged, it
    loses nothing on either table."""
    models = [cost] if cost.spec_engine_ms <= 0 else [replace(cost, spec_engine_ms=0.0), cost]
    ranges: list[tuple[int, int, int]] = []
    for batch in range(1, max(max_batch, 1) + 1):
        k = hedged_k(models, batch, prefix)
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], batch, k)
        else:
            ranges.append((batch, batch, k))
    return ranges
