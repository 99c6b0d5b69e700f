"""Figures the cluster tests measured (kills survived, fuzz cases, verdicts, capacity, ...), printed in
the session's summary (tests/cluster/conftest.py). Under pytest-xdist a worker's figures travel to
the summary on the reports of the test that measured them."""

from __future__ import annotations

FIGURES: list[str] = []


def report(**figures: object) -> None:
    """Record a test's measured figures for the summary."""
    FIGURES.append(" ".join(f"{k}={v}" for k, v in figures.items()))
