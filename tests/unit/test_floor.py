"""The floor rule (tests/floor.py) shared by the model and the cluster's CapacityMonitor, and the
monitor's forgiveness of a fault a test makes (Timeline.lose)."""

from __future__ import annotations

from tests.cluster.capacity import Timeline
from tests.floor import Floor

THREE = {"a": "baseline", "b": "baseline", "c": "canary"}
TWO = {"a": "baseline", "b": "baseline"}


def test_a_pod_lost_below_the_floor_is_a_drop_unless_a_fault_took_it() -> None:
    """Floor 3 reached with 3 serving; pod c stops serving: a drop, unless the test said that its
    fault took c (then 2 of a floor forgiven to 2), and the floor is owed again once c is back."""
    for faulted, drops in ((False, 1), (True, 0)):
        timeline = Timeline("ns/web")
        timeline.record(1.0, THREE, 3, lambda _: "not Ready")
        if faulted:
            timeline.lose(2.0, "c")
        timeline.record(3.0, TWO, 3, lambda _: "not Ready")
        assert len(timeline.drops()) == drops
    timeline.record(4.0, THREE, 3, lambda _: "Ready")
    timeline.record(5.0, TWO, 3, lambda _: "not Ready")
    assert len(timeline.drops()) == 1
    assert (
        timeline.min_ready() == 2 and timeline.min_ready(since=4.0) == 2 and timeline.min_ready(9.0) is None
    )


def test_the_models_floor_follows_the_same_rule() -> None:
    """Nothing owed before the floor is first reached; then a replicas change lowers it at once, a
    fault by one, and Ready pods raise it back."""
    floor = Floor()
    assert floor.check(1, 3) is None and floor.protected == 0
    assert floor.check(3, 3) is None and floor.protected == 3
    assert floor.check(2, 3) == "2 Ready serving pods of a floor of 3"
    floor = Floor(3)
    floor.lose_one()
    assert floor.check(2, 3) is None and floor.protected == 2
    assert floor.check(2, 2) is None and floor.check(3, 4) is None and floor.protected == 3


def test_a_fault_also_takes_the_slack_a_roll_begun_before_it_counted_on() -> None:
    """Found by `make fuzz` (seed 3027): floor 3 with 4 Ready, an operator upgrade's roll begun on the
    one pod to spare, then a crash takes a canary pod (3 Ready) before the Deployment removes its
    pod (2 Ready). The fault is forgiven until a newly Ready pod makes up for it, not raised back at
    once because 3 still serve; then the floor is owed again."""
    floor = Floor()
    assert floor.check(4, 3) is None and floor.protected == 3
    floor.lose_one()
    assert floor.check(3, 3) is None and floor.protected == 2
    assert floor.check(2, 3) is None and floor.protected == 2
    assert floor.check(3, 3) is None and floor.protected == 3
    assert floor.check(2, 3) == "2 Ready serving pods of a floor of 3"
