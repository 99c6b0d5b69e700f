"""Draft-outcome streams with a known long-run alpha and realistic correlation (pure).

Requests differ: each has its own acceptance level around alpha (LEVEL_SD apart), kept for its
drafts; drafts accept as a prefix. Windows sum the counters like the operator's 15-s windows.
Used by the gate's coverage tests and the decision benchmark.
"""

from __future__ import annotations

import random

from specgate.gates import AcceptanceWindow
from specgate.planning import conditional_for_alpha

LEVEL_SD = 0.12


def draft_windows(
    alpha: float,
    windows: int,
    rng: random.Random,
    *,
    k: int = 4,
    drafts_per_window: tuple[int, int] = (20, 60),
    request_drafts: int = 60,
) -> list[AcceptanceWindow]:
    out = []
    c, left = 0.0, 0
    for _ in range(windows):
        drafts = rng.randint(*drafts_per_window)
        accepted = 0
        for _ in range(drafts):
            if left == 0:  # the next request, with its own acceptance level
                level = min(max(rng.gauss(alpha, LEVEL_SD), 0.01), 0.99)
                c, left = conditional_for_alpha(level, k), request_drafts
            left -= 1
            for _ in range(k):
                if rng.random() >= c:
                    break
                accepted += 1
        out.append(AcceptanceWindow(drafts, drafts * k, accepted))
    return out
