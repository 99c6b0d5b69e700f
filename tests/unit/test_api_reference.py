"""docs/reference/api.md is what hack/api_reference.py renders from the CRD: regenerate with `make api-docs`."""

from __future__ import annotations

from hack import api_reference
from tests.conftest import ROOT

from specgate import crd


def test_the_checked_in_api_reference_matches_the_generator() -> None:
    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    assert page == api_reference.render(), "docs/reference/api.md is stale: run `make api-docs`"


def test_every_spec_field_with_a_description_is_in_the_reference() -> None:
    page = api_reference.render()
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for name in spec["properties"]:
        assert f"| `spec.{name}` |" in page
    assert "| `spec.rollout.gates.minAcceptanceRate` | number |" in page
