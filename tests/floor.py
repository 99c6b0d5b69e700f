"""The capacity floor in force (DESIGN.md section 2), one rule for the model (tests/unit/day2_history.py)
and the real cluster (tests/cluster/capacity.py): the Ready serving pods that may not be lost."""

from __future__ import annotations

from dataclasses import dataclass


def protected_after(previous: int, ready: int, floor: int) -> int:
    """The serving pods that may not be lost after a sample: none until they first reach the floor
    (before the baseline was ever Ready nothing serves); then as many of the floor as were reached,
    lowered at once when the floor is (a scale-down, a deletion), raised only as pods become Ready."""
    kept = min(previous, floor)
    if kept == 0 and ready < floor:
        return 0
    return max(kept, min(ready, floor))


@dataclass
class Floor:
    """protected_after over a run of samples, with faults (a crash, a deleted pod) forgiven."""

    protected: int = 0

    def lose_one(self) -> None:
        """A fault took a Ready pod: no rollout could have kept it."""
        self.protected = max(self.protected - 1, 0)

    def check(self, ready: int, floor: int) -> str | None:
        """The sample's breach of the floor, described (None: it holds)."""
        kept = min(self.protected, floor)
        self.protected = protected_after(self.protected, ready, floor)
        return f"{ready} Ready serving pods of a floor of {kept}" if ready < kept else None
