"""Shared test helpers: the repository root and the samples."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

from specgate.observation import Window

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "crds" / "samples"

# Hypothesis fails an example slower than 200 ms by default: a limit on the machine's speed, not a
# property of the code under test.
settings.register_profile("any-machine", deadline=None)
settings.load_profile("any-machine")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes the real integration engines is an `engine` test, marked or not: `make
    test` runs those in a line of their own (hack/test.sh) and `make test-fast` deselects them.
    Under `make mutate` (mutmut sets MUTANT_UNDER_TEST), a mutant's tests run fastest first, as
    mutmut's stats timed them, so a mutant dies on its quickest killing test, not after minutes of
    the property test that happens to come first in file order."""
    for item in items:
        if "engines" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)
    stats = Path("mutmut-stats.json")
    if os.environ.get("MUTANT_UNDER_TEST") and stats.exists():
        durations = json.loads(stats.read_text()).get("duration_by_test", {})
        items.sort(key=lambda item: durations.get(item.nodeid, 0.0))


def load_sample(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text())
    return doc


def tiny(name: str = "tiny") -> dict[str, Any]:
    """The tiny CPU sample (crds/samples/tiny-cpu.yaml) as an object named `name`."""
    body = load_sample("tiny-cpu.yaml")
    body["metadata"]["name"] = name
    return body


def tool(path: str | None, how: str) -> str:
    """The executable at path; the test fails naming the command that installs it where it is none."""
    if path is None or not os.access(path, os.X_OK):
        pytest.fail(f"{path or 'promtool'} is missing (run `{how}`)", pytrace=False)
    return path


def last_minute() -> Window:
    """The minute up to now, the window a test asks Prometheus about."""
    now = datetime.now(UTC)
    return Window(now - timedelta(minutes=1), now)


@pytest.fixture
def eagle3_sample() -> dict[str, Any]:
    return load_sample("llama-3.1-8b-eagle3.yaml")


@pytest.fixture
def tiny_sample() -> dict[str, Any]:
    return tiny()
