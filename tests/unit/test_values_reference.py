"""docs/reference/helm-values.md is what hack/values_reference.py renders from the chart: regenerate
with `make api-docs`."""

from __future__ import annotations

from hack import values_reference
from tests.conftest import ROOT


def test_the_checked_in_values_reference_matches_the_generator() -> None:
    page = (ROOT / "docs" / "reference" / "helm-values.md").read_text()
    assert page == values_reference.render(), "docs/reference/helm-values.md is stale: run `make api-docs`"


def test_values_comments_defaults_and_limits_reach_the_page() -> None:
    page = values_reference.render()
    assert "| `watchNamespaces` | []string | Namespaces to watch; empty watches the whole cluster" in page
    assert "| `metrics.prometheusRule.phaseStuckSeconds` | integer | SpecgatePhaseStuck fires when" in page
    assert "default `7200`" in page
    assert '| `logLevel` | string | info or debug | default `"info"`; one of `info`, `debug` |' in page
    assert '| `image.repository` | string |  | required; default `"specgate"` |' in page


def test_a_comment_block_belongs_to_the_key_under_it_and_a_blank_line_ends_it() -> None:
    text = "# -- first\n# more\na:\n  b: 1  # inline\n\n# plain comment\nc: 2\n# -- orphan\n\nd: 3\n"
    assert values_reference.comments(text) == {"a": "first more", "a.b": "inline"}
