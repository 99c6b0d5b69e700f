"""Render the Helm chart's values as docs/reference/helm-values.md.

`python -m hack.values_reference > docs/reference/helm-values.md` (or `make api-docs`); a unit test
fails when the checked-in page differs. Types and constraints come from values.schema.json (what Helm
enforces), defaults from values.yaml, and descriptions from values.yaml's `# --` comments (the
helm-docs convention), so the page says what the chart itself says.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from hack.api_reference import Node, table

CHART = Path(__file__).resolve().parent.parent / "charts" / "specgate"
KEY = re.compile(r"^(\s*)([A-Za-z]\w*):[^#]*(?:#\s*(.*))?$")  # key: value  # an inline note

HEADER = """# Helm values reference: charts/specgate

Generated from `charts/specgate/values.schema.json` (types and limits, which `helm install` and
`helm upgrade` enforce), `values.yaml` (defaults) and its `# --` comments by
`hack/values_reference.py`: do not edit by hand; run `make api-docs`. Example values files for a GPU
cluster: [examples/](../../examples/); the install guide: [install/gpu-cluster.md](../install/gpu-cluster.md).

| value | type | description | notes |
|---|---|---|---|
"""


def comments(text: str) -> dict[str, str]:
    """Each key's `# --` comment block (continued by the `#` lines under it), or else the comment on
    its own line, by dotted path."""
    found: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    block: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            block = [stripped[4:].strip()]
            continue
        if block is not None and stripped.startswith("#"):
            block.append(stripped[1:].strip())
            continue
        key = KEY.match(line)
        if key:
            indent = len(key.group(1))
            path = [(i, k) for i, k in path if i < indent] + [(indent, key.group(2))]
            note = " ".join(block) if block else key.group(3)
            if note:
                found[".".join(k for _, k in path)] = note
        block = None
    return found


def annotated(schema: Node, values: Any, notes: dict[str, str], path: str = "") -> Node:
    """The schema with each value's comment as its description and values.yaml's value as its
    default (leaves, and objects whose keys the schema leaves open)."""
    node = copy.deepcopy(schema)
    if path in notes:
        node["description"] = notes[path]
    if path and not node.get("properties") and values is not None:
        node["default"] = values
    for name, sub in node.get("properties", {}).items():
        below = values.get(name) if isinstance(values, dict) else None
        node["properties"][name] = annotated(sub, below, notes, f"{path}.{name}" if path else name)
    return node


def render() -> str:
    text = (CHART / "values.yaml").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    node = annotated(schema, yaml.safe_load(text), comments(text))
    return HEADER + table(node, "")


if __name__ == "__main__":
    sys.stdout.write(render())
