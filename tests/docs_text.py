"""The documentation's files (README.md, docs/**/*.md, runbooks/*.md), their code blocks, and the
metric names the operator and vLLM export: what the doc tests hold the docs' names against."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

README = ROOT / "README.md"
RUNBOOKS = ROOT / "runbooks"
DOCS_DIR = ROOT / "docs"
FIELD_GUIDE = DOCS_DIR / "guides" / "speculativedeployment.md"
DOCS = [README, *sorted(DOCS_DIR.rglob("*.md")), *sorted(RUNBOOKS.glob("*.md"))]


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def operator_metrics(samples: bool = True) -> set[str]:
    """The metrics the operator registers with prometheus_client, as Prometheus names them
    (a counter's _total, an Info's _info), with a histogram's _bucket, _sum and _count when samples."""
    import prometheus_client

    from specgate import metrics, prometheus  # noqa: F401  (importing registers them)

    names: set[str] = set()
    for collector in list(prometheus_client.REGISTRY._collector_to_names):
        for family in collector.describe() if hasattr(collector, "describe") else []:
            if family.name.startswith("specgate_"):
                histogram = ("", "_bucket", "_sum", "_count") if samples else ("",)
                suffixes = {"info": ("_info",), "counter": ("_total",), "histogram": histogram}
                names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


def vllm_samples() -> set[str]:
    """Every sample name vLLM's families can have: counters end in _total, histograms have
    _bucket, _sum and _count."""
    from specgate import vllm_metrics

    families = {v for k, v in vars(vllm_metrics).items() if k.isupper() and isinstance(v, str)}
    suffixes = ("", "_total", "_bucket", "_sum", "_count", "_created")
    return {family + suffix for family in families for suffix in suffixes}
