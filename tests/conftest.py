"""Shared test helpers: the repository root and the samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "crds" / "samples"

# Hypothesis fails an example slower than 200 ms by default: a limit on the machine's speed, not a
# property of the code under test.
settings.register_profile("any-machine", deadline=None)
settings.load_profile("any-machine")


def load_sample(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text())
    return doc


@pytest.fixture
def eagle3_sample() -> dict[str, Any]:
    return load_sample("llama-3.1-8b-eagle3.yaml")


@pytest.fixture
def tiny_sample() -> dict[str, Any]:
    return load_sample("tiny-cpu.yaml")
