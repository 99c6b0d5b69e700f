"""The acceptance bench's incumbent histories (bench/decisions.py, bench/looks.py): the drifts fitted
on many histories at once are gates.drift_from_history's, and every trial re-rolls out over its own."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import decisions
import traffic
from looks import HistoryDrifts, design_effects, history_drifts
from specgate import api
from specgate.gates import AcceptanceWindow, drift_from_history, history_design_effect

BLOCK_SECONDS = 60.0


def operator_drift(tokens: np.ndarray, accepted: np.ndarray) -> tuple[float, float, float | None, bool]:
    """(sd, timescale, design effect, fell back) from the operator's own function on one history."""
    history = [
        AcceptanceWindow(0.0, float(n), float(a), end=(b + 1) * BLOCK_SECONDS)
        for b, (n, a) in enumerate(zip(tokens, accepted, strict=True))
    ]
    drift = drift_from_history(history, BLOCK_SECONDS, api.Gates(), "the incumbent's")
    return drift.sd, drift.timescale_seconds, drift.design_effect, "fallback" in drift.source


@pytest.mark.parametrize(
    ("requests", "drift_sd", "seed"), [(3, 0.0, 1), (3, traffic.DRIFT_SD, 2), (20, traffic.DRIFT_SD, 3)]
)
def test_the_drifts_fitted_at_once_are_the_operators(requests: int, drift_sd: float, seed: int) -> None:
    """Six 12 h histories of the traffic model (at 3 requests a window some 60 s blocks are empty):
    sd, timescale and design effect agree with gates.drift_from_history on each, to rounding, and at
    least one drifting history measures a drift (the comparison is not of zeros alone)."""
    model = traffic.for_alpha(0.65, requests, window_seconds=15.0, drift_sd=drift_sd)
    tokens, accepted = decisions.incumbent_blocks(model, 6, np.random.default_rng(seed))
    assert tokens.shape == (6, 720)
    drifts = history_drifts(tokens, accepted, BLOCK_SECONDS)
    for i in range(6):
        sd, tau, effect, fell_back = operator_drift(tokens[i], accepted[i])
        assert not fell_back and drifts.measured[i]
        assert drifts.sd[i] == pytest.approx(sd, rel=1e-9, abs=1e-12)
        assert drifts.timescale_seconds[i] == pytest.approx(tau, rel=1e-9)
        assert (effect is None) == math.isnan(drifts.design_effect[i])
        assert effect is None or drifts.design_effect[i] == pytest.approx(effect, rel=1e-9)
    if drift_sd > 0 and requests == 20:
        assert (drifts.sd > 0).any()
    if drift_sd == 0:
        assert (tokens == 0).any() and not np.isnan(drifts.design_effect).all()


def test_a_history_with_too_few_blocks_seen_falls_back_as_the_operator_does() -> None:
    """Under half the blocks with draft tokens: measure_mix_drift finds nothing, the spec's fallback."""
    rng = np.random.default_rng(4)
    tokens = np.where(np.arange(240) % 3 == 0, 2000.0, 0.0)[None, :].repeat(2, axis=0)
    accepted = np.round(tokens * rng.uniform(0.5, 0.7, tokens.shape))
    drifts = history_drifts(tokens, accepted, BLOCK_SECONDS)
    assert not drifts.measured.any()
    assert operator_drift(tokens[0], accepted[0])[3]
    assert decisions.mix_drift(drifts, 0) is decisions.NO_HISTORY


def test_the_design_effect_skips_empty_blocks_as_the_gate_does() -> None:
    """history_design_effect on the judged blocks of a history with holes (its lags run over the
    blocks with draft tokens, not the time grid); None (NaN) under MIN_DESIGN_WINDOWS such blocks."""
    rng = np.random.default_rng(6)
    tokens = rng.choice([0.0, 400.0, 1600.0], size=(3, 240), p=[0.2, 0.4, 0.4])
    tokens[2, 100:] = 0.0  # 80 judged blocks at most
    accepted = np.round(tokens * rng.beta(6, 4, tokens.shape))
    effects = design_effects(tokens, accepted)
    for row in range(2):
        judged = [AcceptanceWindow(0.0, n, a) for n, a in zip(tokens[row], accepted[row], strict=True)]
        assert effects[row] == pytest.approx(history_design_effect(judged), rel=1e-9)
    assert math.isnan(effects[2])


def test_blocks_other_than_the_operators_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="block_seconds must be DRIFT_BLOCK_SECONDS"):
        history_drifts(np.ones((1, 240)), np.ones((1, 240)), 15.0)


def test_the_check_stops_the_bench_on_a_drift_that_is_not_the_operators() -> None:
    """check_histories_against_the_operator passes the vectorized drifts and stops (SystemExit) on
    the same drifts moved by a hundredth of their sd or a second of their timescale."""
    model = traffic.for_alpha(0.65, 20, window_seconds=15.0, drift_sd=traffic.DRIFT_SD)
    tokens, accepted = decisions.incumbent_blocks(model, 3, np.random.default_rng(7))
    drifts = history_drifts(tokens, accepted, BLOCK_SECONDS)
    decisions.check_histories_against_the_operator(tokens, accepted, drifts, random.Random(1))
    moved = [
        HistoryDrifts(drifts.sd + 0.01, drifts.timescale_seconds, drifts.design_effect),
        HistoryDrifts(drifts.sd, drifts.timescale_seconds + 1.0, drifts.design_effect),
    ]
    for wrong in moved:
        with pytest.raises(SystemExit, match="drift_from_history"):
            decisions.check_histories_against_the_operator(tokens, accepted, wrong, random.Random(1))


def test_every_trial_re_rolls_out_over_a_history_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Incumbents draws histories in batches as trials ask: trial t takes history t, and the drifts
    of a drifting traffic's trials differ from one another (no history shared in turn)."""
    monkeypatch.setattr(decisions, "BATCH", 4)
    model = traffic.for_alpha(0.65, 20, window_seconds=15.0, drift_sd=traffic.DRIFT_SD)
    incumbents = decisions.Incumbents(model, np.random.default_rng(8), random.Random(8))
    drifts = [incumbents[t] for t in range(6)]
    assert len(incumbents.drifts) == 8
    assert incumbents[5] is drifts[5]
    assert len({(d.sd, d.timescale_seconds) for d in drifts}) == 6
