"""The simulator's behaviour model (pure): draft acceptance per position, step cost, knob scripts.

Acceptance: a workload profile gives the conditional probability that draft position i is accepted
given positions < i were, c_i = first * decay**i (acceptance falls along the draft, as measured for
EAGLE-3 in the seeds). A method scales it (ngram drafts from the prompt: good on repetitive text,
poor on chat). An override alpha (accepted / draft tokens) solves for the constant c that gives it.

Cost: a linear step model (planning's CostModel before issue 40; the simulator keeps it so its
scripted scenarios stay as they were). One engine step verifies K+1 tokens for each of B running
requests: a fixed part (reading the weights, dominant at small B), a part per request and verified
token (compute, dominant at large B) and the draft's K passes. So speculation pays at low
concurrency and hurts at high concurrency, as the seeds describe.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from specgate.planning import conditional_for_alpha

PROFILES: dict[str, tuple[float, float]] = {
    # name: (conditional acceptance of position 0, decay per position)
    "chat": (0.80, 0.90),
    "code": (0.88, 0.94),
    "translation": (0.65, 0.85),
    "repetitive": (0.92, 0.97),
}
METHOD_FACTOR: dict[str, float] = {
    "eagle3": 1.0,
    "eagle": 0.92,
    "mtp": 1.0,
    "draft_model": 0.95,
    "ngram": 0.55,
    "suffix": 0.6,
}
# ngram and suffix drafts need no forward pass; model drafts cost one small pass per position.
DRAFT_PASS_MS: dict[str, float] = {"ngram": 0.05, "suffix": 0.05, "eagle3": 0.6, "eagle": 0.6, "mtp": 0.6}
DEFAULT_DRAFT_PASS_MS = 1.5  # a separate draft model


@dataclass(frozen=True)
class Knobs:
    """Everything that shapes the simulated engine; environment variables map onto these."""

    profile: str = "chat"
    alpha: float | None = None  # override: target accepted / draft tokens
    step_ms: float = 12.0  # fixed cost of a step (weights read once per step)
    token_ms: float = 0.5  # compute per request per verified token
    prefill_ms_per_token: float = 0.02
    draft_pass_ms: float | None = None  # per draft position; None: by method
    max_num_seqs: int = 64
    seed: int = 0


@dataclass(frozen=True)
class Speculation:
    method: str
    k: int


def conditional_rates(knobs: Knobs, spec: Speculation) -> list[float]:
    """c_i for i in 0..K-1: P(position i accepted | all earlier accepted)."""
    if knobs.alpha is not None:
        c = conditional_for_alpha(knobs.alpha, spec.k)
        return [c] * spec.k
    first, decay = PROFILES[knobs.profile]
    factor = METHOD_FACTOR.get(spec.method, 1.0)
    return [min(first * factor * decay**i, 0.999) for i in range(spec.k)]


def sample_accepted(rates: list[float], rng: random.Random) -> int:
    """Accepted positions of one draft: stop at the first rejection."""
    for i, c in enumerate(rates):
        if rng.random() >= c:
            return i
    return len(rates)


def step_seconds(knobs: Knobs, spec: Speculation | None, batch: int, prefill_tokens: int) -> float:
    """Wall time of one engine step for `batch` running requests (the linear model above)."""
    k = spec.k if spec else 0
    per_pass = knobs.draft_pass_ms
    if per_pass is None:
        per_pass = DRAFT_PASS_MS.get(spec.method, DEFAULT_DRAFT_PASS_MS) if spec else 0.0
    drafting = k * per_pass * (1 + 0.05 * batch)
    step_ms = knobs.step_ms + knobs.token_ms * batch * (1 + k) + drafting
    return (step_ms + knobs.prefill_ms_per_token * prefill_tokens) / 1000


@dataclass(frozen=True)
class ScriptStep:
    at_seconds: float
    changes: dict[str, float]
    if_exists: str | None = None  # a file step: applies while this file exists, whatever the time


def parse_script(text: str) -> list[ScriptStep]:
    """ "0s:alpha=0.8;120s:alpha=0.3,step_ms=20;if:/tmp/drift:alpha=0.15" -> steps, timed ones by time,
    then the file steps: a file step, once its file exists, overrides the time script (a test
    triggers a change at a moment it chooses, whatever the machine's speed)."""
    steps: list[ScriptStep] = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        when, _, assignments = part.rpartition(":")  # knobs have no colon, a path may
        changes = {}
        for assignment in filter(None, assignments.split(",")):
            key, _, value = assignment.partition("=")
            if key.strip() not in {"alpha", "step_ms", "token_ms", "draft_pass_ms"}:
                raise ValueError(f"script step {part!r}: unknown knob {key!r}")
            changes[key.strip()] = float(value)
        if when.startswith("if:") and len(when) > 3:
            steps.append(ScriptStep(0.0, changes, if_exists=when[3:]))
        elif when.endswith("s"):
            steps.append(ScriptStep(float(when[:-1]), changes))
        else:
            raise ValueError(f"script step {part!r}: a time in seconds (120s) or if:<path> must come first")
    return sorted(steps, key=lambda s: (s.if_exists is not None, s.at_seconds))


def knobs_at(
    base: Knobs, script: list[ScriptStep], elapsed_seconds: float, exists: Callable[[str], bool]
) -> Knobs:
    """The knobs `elapsed_seconds` after the engine started, with `exists` telling which files are
    there (os.path.exists in the simulator)."""
    knobs = base
    for step in script:
        due = exists(step.if_exists) if step.if_exists is not None else step.at_seconds <= elapsed_seconds
        if due:
            knobs = replace(knobs, **step.changes)  # type: ignore[arg-type]
    return knobs
