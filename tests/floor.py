"""The capacity floor in force (DESIGN.md section 2), one rule for the model (tests/unit/day2_history.py)
and the real cluster (tests/cluster/capacity.py): the Ready serving pods that may not be lost."""

from __future__ import annotations

from dataclasses import dataclass


def protected_after(previous: int, ready: int, floor: int, forgiven: int = 0) -> int:
    """The serving pods that may not be lost after a sample: none until they first reach the floor
    (before the baseline was ever Ready nothing serves); then as many of the floor as were reached,
    lowered at once when the floor is (a scale-down, a deletion), raised only as pods become Ready,
    and not raised while `forgiven` pods that faults took are not yet made up for by newly Ready
    ones: a fault also takes the pod of slack a roll begun before it had counted on."""
    kept = min(previous, floor)
    if forgiven > 0 or (kept == 0 and ready < floor):
        return kept
    return max(kept, min(ready, floor))


@dataclass
class Floor:
    """protected_after over a run of samples, with faults (a crash, a deleted pod) forgiven."""

    protected: int = 0
    ready: int = 0  # the last sample's Ready pods, less those faults took since
    forgiven: int = 0  # pods faults took that no newly Ready pod has made up for yet

    def lose_one(self) -> None:
        """A fault took a Ready pod: no rollout could have kept it."""
        self.protected = max(self.protected - 1, 0)
        self.ready = max(self.ready - 1, 0)
        self.forgiven += 1

    def check(self, ready: int, floor: int) -> str | None:
        """The sample's breach of the floor, described (None: it holds)."""
        kept = min(self.protected, floor)
        self.forgiven = max(self.forgiven - max(ready - self.ready, 0), 0)
        self.ready = ready
        self.protected = protected_after(self.protected, ready, floor, self.forgiven)
        return f"{ready} Ready serving pods of a floor of {kept}" if ready < kept else None
