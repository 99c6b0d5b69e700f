"""Speedup, break-even and draft-length planning (pure).

Terms. vLLM's acceptance rate alpha = accepted / draft tokens. Drafts accept as a prefix: with a
constant conditional rate c (position i accepted given all before it were), one draft of length K
yields E[accepted] = c + c^2 + ... + c^K, so alpha = E[accepted] / K, and a step emits 1 + E[accepted]
tokens. The measured per-position counters give u_i = P(positions 0..i accepted) directly, with no
assumption on c: E[accepted | draft length k] = u_0 + ... + u_{k-1}.

Cost. A step costs a fixed part (reading the weights; dominant at small batch), a part per request
and verified token (compute; dominant at large batch) and K draft passes:

    step(B, K) = step_ms + token_ms * B * (1 + K) + K * draft_pass_ms * (1 + 0.05 * B)

so speedup(B, K) = (1 + E[accepted]) * step(B, 0) / step(B, K): high at low concurrency, below one
at high concurrency. The default constants describe a GPU; where the canary's and the baseline's
mean step times are measured, the draft pass is fitted to their ratio (`CostModel.measured`), so a
draft that costs more than the defaults (or a CPU, where verifying K + 1 tokens costs K + 1 times
one) gets advice from its own costs. bench/draft_length.py scores the advice against real engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class CostModel:
    step_ms: float = 12.0
    token_ms: float = 0.5
    draft_pass_ms: float = 0.6

    def step(self, batch: int, k: int) -> float:
        """Milliseconds of one engine step with `batch` running requests and draft length k."""
        drafting = k * self.draft_pass_ms * (1 + 0.05 * batch)
        return self.step_ms + self.token_ms * batch * (1 + k) + drafting

    @classmethod
    def from_overhead(cls, overhead: float) -> CostModel:
        """A model whose draft pass costs `overhead` target steps (at batch 1)."""
        base = cls()
        return cls(step_ms=base.step_ms, token_ms=base.token_ms, draft_pass_ms=overhead * base.step(1, 0))

    @classmethod
    def measured(cls, step_ratio: float, k: int, batch: int) -> CostModel:
        """The model whose step at draft length k costs `step_ratio` times a plain step at this batch,
        as the canary's and the baseline's mean step times (ITL) measured it: the draft pass
        absorbs every extra cost, so other K are extrapolated linearly in K from this one run."""
        plain = cls(draft_pass_ms=0.0)
        per_draft_pass_ms = replace(plain, draft_pass_ms=1.0).step(batch, k) - plain.step(batch, k)
        draft_pass_ms = (step_ratio * plain.step(batch, 0) - plain.step(batch, k)) / per_draft_pass_ms
        return replace(plain, draft_pass_ms=max(draft_pass_ms, 0.0))


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
) -> KRecommendation | None:
    """The draft length with the best expected speedup, from one run's per-position counts."""
    if drafts <= 0 or not accepted_per_position:
        return None
    cost = cost or CostModel()
    batch = max(concurrency, 1)
    prefix = [min(a / drafts, 1.0) for a in accepted_per_position]
    table = tuple(
        (k, round((1 + sum(prefix[:k])) * cost.step(batch, 0) / cost.step(batch, k), 4))
        for k in range(1, len(prefix) + 1)
    )
    best_k, best = max(table, key=lambda row: row[1])
    measured = len(prefix)
    message = (
        f"K={best_k} expects {best:.2f}x at concurrency {batch} "
        f"(per-position acceptance {', '.join(f'{u:.2f}' for u in prefix)}; K above {measured} not measured)"
    )
    return KRecommendation(best_k, best, table, message)
