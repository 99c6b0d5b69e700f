"""Real vLLM CPU engines shared by the integration tests: each start costs about a minute and 3 GB."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from tests.integration.engines import real_engine, spec_args

from specgate_lab.calibrate import complete

SELF_DRAFT = {"method": "draft_model", "model": "specgate/tiny-llama", "num_speculative_tokens": 4}
PROMPTS = ("the model drafts token target", "cluster node pod gpu memory", "build run deploy")


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two real engines, started once: speculation off ("off") and the target drafting for itself
    ("self"), each with a few greedy requests served."""
    logs = tmp_path_factory.mktemp("engines")
    with ExitStack() as stack:
        urls = {
            "off": stack.enter_context(real_engine(spec_args(), logs / "off.log")),
            "self": stack.enter_context(real_engine(spec_args(SELF_DRAFT), logs / "self.log")),
        }
        for url in urls.values():
            for prompt in PROMPTS:
                complete(url, "tiny", prompt, max_tokens=48)
        yield urls
