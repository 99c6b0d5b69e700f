"""Whether two tracks carried comparable load (pure).

Latency is compared only at comparable load: a pod serving half the requests of another has a
shorter tail whatever it runs (see comparable_load).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """What one track's pods carried over a window."""

    pods: int
    requests_per_second_per_pod: float | None
    running_per_pod: float | None

    def __str__(self) -> str:
        rate = "?" if self.requests_per_second_per_pod is None else f"{self.requests_per_second_per_pod:.2f}"
        running = "?" if self.running_per_pod is None else f"{self.running_per_pod:.2f}"
        return f"{rate} req/s and {running} running per pod ({self.pods} pods)"


def _relative_difference(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    larger = max(a, b)
    return abs(a - b) / larger if larger > 0 else 0.0


def comparable_load(canary: Load, baseline: Load, tolerance: float) -> str | None:
    """None when the pods carried comparable load, else why not, naming both loads. Comparable:
    the request rate per pod (open-loop traffic, split evenly) or the running requests per pod
    (closed-loop clients, where a faster pod finishes more) within `tolerance` of each other.
    Loads not measured on either side are not held against the comparison."""
    differences = [
        d
        for d in (
            _relative_difference(canary.requests_per_second_per_pod, baseline.requests_per_second_per_pod),
            _relative_difference(canary.running_per_pod, baseline.running_per_pod),
        )
        if d is not None
    ]
    if not differences or min(differences) <= tolerance:
        return None
    return f"loads differ by more than {tolerance:.0%}: canary {canary}, baseline {baseline}"
