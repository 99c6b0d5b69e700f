"""The real handlers.step, driven tick by tick through random day-2 histories against a fake cluster
whose Deployments roll as the controller-manager rolls them: the histories, the model and the
invariants checked every tick are in day2_history.py.

SPECGATE_FUZZ_HISTORIES sets the number of histories (`make fuzz`), SPECGATE_FUZZ_SEED replays one.
A reconcile that raises is a violation like a broken invariant (issue 61).
"""

from __future__ import annotations

import os

import pytest
from tests.unit.day2_history import (
    FAULTS,
    LAB_KINDS,
    REPLAY_MODEL_TICKS,
    History,
    generate,
    lab_problems,
    replay_history,
)

# `make test` plays 150 (80 s on 2 cores quiet, under 2 minutes beside the engines' start); `make fuzz` thousands.
HISTORIES = int(os.environ.get("SPECGATE_FUZZ_HISTORIES", "150"))
LAGGING_HISTORIES = max(HISTORIES // 3, 1)


def seeds() -> list[int]:
    replay = os.environ.get("SPECGATE_FUZZ_SEED")
    return [int(replay)] if replay else list(range(HISTORIES))


def test_random_day2_histories_keep_the_safety_invariants(monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in seeds():
        with History(generate(seed)).wired(monkeypatch) as history:
            broken = next(history.run(), None)
        if broken is not None:
            trail = "\n".join(history.log[-60:])
            pytest.fail(
                f"seed {seed} (SPECGATE_FUZZ_SEED={seed} to replay), tick {history.tick}: {broken}\n{trail}"
            )


def test_day2_histories_keep_the_safety_invariants_with_the_watches_a_tick_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's cache of its pods and Deployments a tick (10 s) behind the cluster, as a loaded
    API server's watch can be: a shrink is decided on the tracks read now, so capacity holds."""
    for seed in seeds()[:LAGGING_HISTORIES]:
        with History(generate(seed), watch_lags=True).wired(monkeypatch) as history:
            broken = next(history.run(), None)
        if broken is not None:
            trail = "\n".join(history.log[-60:])
            pytest.fail(
                f"seed {seed} (SPECGATE_FUZZ_SEED={seed} to replay), tick {history.tick}: {broken}\n{trail}"
            )


def test_the_history_the_cluster_replays_is_one_the_lab_can_perform(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay's history (tests/cluster/test_day2_replay.py) has only what the lab performs, every
    spec passes admission, and it holds the invariants on the model, its floor reached and tested by
    at least one fault, a replicas change and an edit."""
    generated = replay_history()
    assert lab_problems(generated) == []
    kinds = {event.kind for event in generated.events}
    assert kinds <= set(LAB_KINDS) and {"hpa", "speculative"} <= kinds and kinds & FAULTS
    replicas = generated.spec["replicas"]
    with History(generated, REPLAY_MODEL_TICKS, begin_at_ready=replicas).wired(monkeypatch) as history:
        assert list(history.run()) == [], "\n".join(history.log[-60:])
    assert history.began is not None and history.min_ready is not None
