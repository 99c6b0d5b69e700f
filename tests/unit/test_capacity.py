"""Capacity-safe moves between the tracks, walked step by step against a model of a cluster."""

from __future__ import annotations

import pytest

from specgate.capacity import Budget, Side, step_toward


def walk(budget: Budget, start: tuple[int, int], target: tuple[int, int]) -> list[int]:
    """Apply step_toward until the target holds; pods removed stop serving at once, pods added
    become Ready one step later (as they load the model). Returns the Ready total after each step."""
    (b, c), (rb, rc) = start, start
    serving = []
    for _ in range(50):
        nb, nc = step_toward(budget, Side(b, rb), Side(c, rc), target)
        # Shrinking removes unready pods first (a ReplicaSet's choice); Ready ones only beyond them.
        rb, rc = min(rb, nb), min(rc, nc)
        serving.append(rb + rc)
        if (b, c) == (nb, nc) == target and (rb, rc) == target:
            return serving
        rb, rc = (nb if nb > b else rb), (nc if nc > c else rc)  # last step's new pods are Ready now
        b, c = nb, nc
    raise AssertionError(f"never reached {target}: stuck at {(b, c)}")


@pytest.mark.parametrize(
    ("surge", "unavailable", "floor"),
    [(1, 0, 4), (2, 0, 4), (0, 1, 3), (1, 1, 3)],
)
def test_rollback_after_promotion_never_drops_below_the_floor(
    surge: int, unavailable: int, floor: int
) -> None:
    serving = walk(Budget(4, surge, unavailable), start=(0, 4), target=(4, 0))
    assert min(serving) == floor  # the floor is used (pods are swapped) but never crossed


def test_no_spare_gpu_swaps_one_pod_at_a_time() -> None:
    budget = Budget(4, max_surge=0, max_unavailable=1)
    moves = []
    b, c = 0, 4
    while (b, c) != (4, 0):
        b, c = step_toward(budget, Side(b, b), Side(c, c), (4, 0))
        moves.append((b, c))
    assert moves[0] == (1, 3) and all(nb + nc == 4 for nb, nc in moves)


def test_shrinking_side_waits_for_the_growing_sides_ready_pods() -> None:
    budget = Budget(4, max_surge=1, max_unavailable=0)
    # Canary strategy: the canary pod is not Ready yet, so the baseline keeps all four.
    assert step_toward(budget, Side(4, 4), Side(1, 0), (3, 1)) == (4, 1)
    assert step_toward(budget, Side(4, 4), Side(1, 1), (3, 1)) == (3, 1)


def test_unready_pods_of_the_shrinking_side_go_at_once() -> None:
    """A crash-looping canary serves nothing: keeping it protects no capacity."""
    budget = Budget(4, max_surge=1, max_unavailable=0)
    assert step_toward(budget, Side(0, 0), Side(4, 0), (4, 0)) == (4, 0)
    assert step_toward(budget, Side(0, 0), Side(4, 2), (4, 0)) == (3, 2)


def test_scaling_up_and_down_in_place() -> None:
    budget = Budget(8, max_surge=1, max_unavailable=0)
    assert step_toward(budget, Side(0, 0), Side(4, 4), (0, 8)) == (0, 8)
    assert step_toward(Budget(2, 1, 0), Side(0, 0), Side(4, 4), (0, 2)) == (0, 2)
