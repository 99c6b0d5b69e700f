"""How `make demo` fits its load and windows to the machine it runs on (pure: no cluster, no engine).

The latency gates need `minLatencySamples` per-token samples in one analysis window, and a
per-token sample is one finished request: how many a window holds depends on how fast this CPU
serves the model. So the demo measures the baseline engine while it warms up (requests it finished,
the gap between their tokens) and chooses what the demo controls, never a gate: the tokens per
request and the analysis window, so that a window is expected to hold MARGIN times the samples the
gate needs. A machine too slow for that within MAX_WINDOW_S is told so at once, with the figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specgate_lab.loadgen import Completion

MARGIN = 2.0  # samples expected in a window over those the gate needs: room for a slower moment
TOKEN_FRACTIONS = (1.0, 0.75, 0.5)  # of the scenario's tokens a request, longest first
MAX_WINDOW_S = 600  # beyond this a demo takes over half an hour: say so instead
WINDOW_STEP_S = 30
MIN_CALIBRATION_REQUESTS = 3  # after the first one, which may pay for lazy initialisation


TOO_SLOW = "this machine is too slow for an honest run of this sample"
FALLBACK = (
    "Stop what else runs on this machine, or run `make demo SCENARIO=tiny` (the tiny models: the "
    "rollout's mechanics in about 4 minutes, latency gates relaxed)"
)


class TooSlow(Exception):
    """No choice gives an honest run on this machine; the message says what was measured and needed."""


@dataclass(frozen=True)
class Calibration:
    """The baseline engine at the demo's load, from requests finished after it became Ready."""

    requests: int  # finished requests the rate is measured over
    seconds: float  # the span they finished in
    step_s: float  # mean time a token, after the first
    max_tokens: int  # tokens a request while measured
    concurrency: int

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds

    def request_seconds(self, tokens: int) -> float:
        """Seconds one request of `tokens` takes: the measured one, less the steps it no longer waits for."""
        measured = self.concurrency / self.requests_per_second
        return max(measured - (self.max_tokens - tokens) * self.step_s, self.step_s)

    def rate(self, tokens: int) -> float:
        """Requests finished a second (so per-token samples a second) at `tokens` a request."""
        return self.concurrency / self.request_seconds(tokens)


def calibrate(
    completed: Sequence[Completion], since: float, max_tokens: int, concurrency: int
) -> Calibration | None:
    """The calibration from requests started at or after `since` (the baseline Ready), skipping
    the first; None until MIN_CALIBRATION_REQUESTS more have finished."""
    after = sorted((c for c in completed if c.start >= since), key=lambda c: c.end)
    if len(after) < MIN_CALIBRATION_REQUESTS + 1:
        return None
    counted = after[1:]
    seconds = counted[-1].end - after[0].end
    # Per token, not per chunk: the bridge's proxy may send several tokens in one chunk. Tokens that
    # came with the first chunk make this a little short, which only lengthens the window chosen.
    gaps = [(c.end - c.first_chunk) / (c.tokens - 1) for c in counted if c.tokens > 1]
    if seconds <= 0 or not gaps:
        return None
    return Calibration(len(counted), seconds, sum(gaps) / len(gaps), max_tokens, concurrency)


@dataclass(frozen=True)
class Sizing:
    max_tokens: int
    window_s: int
    max_analysis_s: int
    needed: int  # per-token samples the gate needs in a window
    expected: float  # per-token samples a window is expected to hold

    def explain(self, calibration: Calibration) -> str:
        return (
            f"sizing: the baseline finished {calibration.requests} requests in {calibration.seconds:.0f} s "
            f"({calibration.requests_per_second:.2f}/s at {calibration.max_tokens} tokens, "
            f"{calibration.step_s * 1000:.0f} ms a token); chose {self.max_tokens} tokens a request and "
            f"{self.window_s} s analysis windows (maxAnalysisDuration {self.max_analysis_s} s): about "
            f"{self.expected:.0f} per-token samples a window, {self.expected / self.needed:.1f}x the "
            f"{self.needed} the latency gates need"
        )


def size(calibration: Calibration, needed: int, window_s: int, max_analysis_s: int) -> Sizing:
    """The shortest window that is expected to hold MARGIN x `needed` samples (never shorter than
    the sample's), with the longest requests that fit it: fewer tokens a request finish more
    requests a second, and each finished request is one per-token sample. maxAnalysisDuration keeps
    the sample's slack over its window (the baseline's deadline also counts the engine's start)."""
    windows = {
        tokens: _window(calibration, tokens, needed, window_s) for tokens in token_choices(calibration)
    }
    tokens = min(windows, key=lambda t: (windows[t], -t))
    window = windows[tokens]
    if window > MAX_WINDOW_S:
        raise TooSlow(_too_slow(calibration, needed))
    expected = window * calibration.rate(tokens)
    return Sizing(tokens, window, window + max_analysis_s - window_s, needed, expected)


def token_choices(calibration: Calibration) -> list[int]:
    return [round(calibration.max_tokens * fraction) for fraction in TOKEN_FRACTIONS]


def _window(calibration: Calibration, tokens: int, needed: int, floor_s: int) -> int:
    seconds = MARGIN * needed / calibration.rate(tokens)
    return max(floor_s, WINDOW_STEP_S * math.ceil(seconds / WINDOW_STEP_S))


def _too_slow(calibration: Calibration, needed: int) -> str:
    shortest = token_choices(calibration)[-1]
    wanted_rate = MARGIN * needed / MAX_WINDOW_S
    return (
        f"{TOO_SLOW}: its baseline finished "
        f"{calibration.requests_per_second:.3f} requests a second at {calibration.max_tokens} tokens "
        f"({calibration.step_s * 1000:.0f} ms a token), about "
        f"{calibration.rate(shortest):.3f} at {shortest}; the latency "
        f"gates need {needed} per-token samples (one a request) in a window, and {MARGIN:.0f}x that within "
        f"{MAX_WINDOW_S} s needs {wanted_rate:.3f} requests a second. {FALLBACK}"
    )
