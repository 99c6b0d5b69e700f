"""The chart and the tools that check it, shared by the chart's cluster tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.cluster.conftest import CACHE
from tests.conftest import ROOT

CHART = ROOT / "charts" / "specgate"
HELM = str(CACHE / "bin" / "helm")
KUBECONFORM = str(CACHE / "bin" / "kubeconform")


def strict(schema: Any) -> Any:
    """An OpenAPI schema as a JSON schema for kubeconform -strict, which only refuses what a schema
    refuses: an object that lists its properties takes no others (the API server drops or refuses
    them) unless it says x-kubernetes-preserve-unknown-fields. The walk follows the schema's
    structure, so a field named like a keyword ("items", "properties") stays a field."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: strict(sub) for name, sub in out["properties"].items()}
        if not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = strict(out[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [strict(sub) for sub in out[key]]
    return out


def schema_location(schemas: Path) -> str:
    """kubeconform's -schema-location for a directory of <kind><suffix>.json schemas."""
    return f"{schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json"
