"""Each latency gate's figures in status (issue 58): the result's ratio, its interval, the tolerance,
the samples and how far from a verdict, kept small and rounded so that an unchanged result writes an
unchanged status. Expected values are written out by hand from the inputs."""

from __future__ import annotations

import math

from specgate import api, measurements
from specgate.api import LatencyGateStatus
from specgate.gates import GateResult, Verdict


def undecided(**changes: float | None) -> GateResult:
    """A per-token gate that cannot tell 10 % yet over 812.4 samples a track."""
    figures: dict[str, float | None] = {
        "estimate": 1.04567,
        "lower": 0.91234,
        "upper": 1.19876,
        "samples_needed": 1693.7,
    }
    figures.update(changes)
    return GateResult(
        Verdict.INSUFFICIENT_DATA,
        figures["estimate"],
        figures["lower"],
        figures["upper"],
        812.4,
        "cannot tell 10% yet",
        samples_needed=figures["samples_needed"],
    )


def test_an_undecided_gate_keeps_its_ratio_to_four_decimals_and_whole_samples() -> None:
    """1.04567 -> 1.0457, 0.91234 -> 0.9123, 1.19876 -> 1.1988; tolerance 1 + 0.10 = 1.1 (not
    1.1000000000000001); 812.4 samples -> 812, 1693.7 needed -> 1694."""
    assert measurements.latency_gate_status(undecided(), 0.10) == LatencyGateStatus(
        verdict="InsufficientData",
        ratio=1.0457,
        ratio_lower=0.9123,
        ratio_upper=1.1988,
        tolerance=1.1,
        samples=812,
        samples_needed=1694,
    )


def test_an_unbounded_interval_keeps_no_upper_bound() -> None:
    """JSON has no infinity: below the samples a rank needs, the upper bound is absent and the lower
    one (e^-inf) is 0; the 524 samples a rank needs are how far it is from a verdict."""
    status = measurements.latency_gate_status(undecided(lower=0.0, upper=math.inf, samples_needed=524), 0.5)
    assert (status.ratio, status.ratio_lower, status.ratio_upper) == (1.0457, 0.0, None)
    assert (status.tolerance, status.samples_needed) == (1.5, 524)


def test_a_gate_without_its_histograms_keeps_its_verdict_and_no_figures() -> None:
    result = GateResult(
        Verdict.INSUFFICIENT_DATA, None, None, None, 0, "no P99 per-token latency histogram yet"
    )
    assert measurements.latency_gate_status(result, 0.10) == LatencyGateStatus(
        verdict="InsufficientData", tolerance=1.1, samples=0
    )


def test_a_decided_gate_says_nothing_more_is_needed() -> None:
    result = GateResult(Verdict.PASS, 0.9, 0.87, 0.93, 20_000, "within 10%")
    status = measurements.latency_gate_status(result, 0.10)
    assert (status.verdict, status.samples_needed) == ("Pass", None)


def test_results_that_differ_below_the_rounding_write_the_same_status() -> None:
    """The status write is skipped when the new status equals the old (handlers.write_status):
    float noise in the sixth decimal and a fraction of a sample must not make it differ."""
    first = measurements.latency_gate_status(undecided(), 0.10)
    noisy = measurements.latency_gate_status(
        undecided(estimate=1.045671, lower=0.912341, upper=1.198759, samples_needed=1693.9), 0.10
    )
    assert noisy == first


def test_the_status_field_is_a_few_numbers_under_their_camel_case_names() -> None:
    dumped = measurements.latency_gate_status(undecided(), 0.10).model_dump(by_alias=True, mode="json")
    assert dumped == {
        "verdict": "InsufficientData",
        "ratio": 1.0457,
        "ratioLower": 0.9123,
        "ratioUpper": 1.1988,
        "tolerance": 1.1,
        "samples": 812.0,
        "samplesNeeded": 1694.0,
    }


def test_the_canary_gets_both_gates_each_with_its_own_tolerance() -> None:
    """The per-token gate against maxP99PerTokenRegression (default 0.10), the step stall against
    maxP99ItlRegression (default 0.50); no canary, nothing to add them to."""
    limits = api.Gates()
    stall = GateResult(Verdict.FAIL, 1.8, 1.6, 2.0, 25_000, "more than 50% worse")
    canary = measurements.with_latency_gates(api.Measurement(alpha=0.8), undecided(), stall, limits)
    assert canary is not None and canary.alpha == 0.8
    assert canary.per_token_latency_gate is not None and canary.per_token_latency_gate.tolerance == 1.1
    assert canary.step_stall_gate == LatencyGateStatus(
        verdict="Fail", ratio=1.8, ratio_lower=1.6, ratio_upper=2.0, tolerance=1.5, samples=25_000
    )
    assert measurements.with_latency_gates(None, undecided(), stall, limits) is None


def test_a_gate_reads_as_one_line_in_the_figures_style() -> None:
    """As alpha=0.800 [lo, hi] and speedup=1.250 [lo, hi] are written; an unbounded top reads inf."""
    undecided_line = measurements.latency_gate_status(undecided(), 0.10).line()
    assert undecided_line == (
        "ratio=1.046 [0.9123, 1.1988] tolerance=1.1 samples=812 InsufficientData, needs 1694 samples a track"
    )
    unbounded = measurements.latency_gate_status(
        undecided(lower=0.0, upper=math.inf, samples_needed=524), 0.5
    )
    assert unbounded.line() == (
        "ratio=1.046 [0.0, inf] tolerance=1.5 samples=812 InsufficientData, needs 524 samples a track"
    )
    none = GateResult(
        Verdict.INSUFFICIENT_DATA, None, None, None, 0, "no P99 per-token latency histogram yet"
    )
    assert (
        measurements.latency_gate_status(none, 0.1).line()
        == "ratio=- tolerance=1.1 samples=0 InsufficientData"
    )
