"""Render the SpeculativeDeployment CRD's openAPIV3Schema descriptions as docs/reference/api.md.

`python hack/api_reference.py > docs/reference/api.md` (or `make api-docs`); a unit test fails when the
checked-in page differs from this output. The schema is the one `specgate crd` prints (from api.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

from specgate import crd

Node = dict[str, Any]

HEADER = """# API reference: SpeculativeDeployment (specgate.dev/v1alpha1)

Generated from the CRD's openAPIV3Schema (`crds/specgate.dev_speculativedeployments.yaml`, itself
generated from `operator/specgate/api.py`) by `hack/api_reference.py`: do not edit by hand; run
`make api-docs`. `kubectl explain sd.spec --recursive` shows the same on a cluster. A guide to the
fields: [guides/speculativedeployment.md](../guides/speculativedeployment.md).
"""


def _type(node: Node) -> str:
    kind = node.get("type", "")
    if kind == "array" and isinstance(node.get("items"), dict):
        return f"[]{_type(node['items'])}"
    if node.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    if node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties"):
        return kind or "any"
    return kind or "any"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def rows(node: Node, path: str, required: set[str]) -> Iterator[tuple[str, str, str, str]]:
    for name, sub in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        facts = []
        if name in required:
            facts.append("required")
        if "default" in sub:
            facts.append(f"default `{_cell(json.dumps(sub['default']))}`")
        if "enum" in sub:
            facts.append("one of " + ", ".join(f"`{v}`" for v in sub["enum"]))
        yield here, _type(sub), _cell(sub.get("description", "")), "; ".join(facts)
        target = sub["items"] if sub.get("type") == "array" and isinstance(sub.get("items"), dict) else sub
        suffix = "[]" if target is not sub else ""
        yield from rows(target, here + suffix, set(target.get("required", [])))


def table(node: Node, path: str) -> str:
    """The markdown table rows of a schema node's fields, named below `path`."""
    found = rows(node, path, set(node.get("required", [])))
    return "".join(
        f"| `{here}` | {kind} | {description} | {facts} |\n" for here, kind, description, facts in found
    )


def render() -> str:
    version = crd.crd()["spec"]["versions"][0]
    schema: Node = version["schema"]["openAPIV3Schema"]
    out = [HEADER]
    for top in ("spec", "status"):
        node = schema["properties"][top]
        out.append(f"\n## {top}\n\n| field | type | description | notes |\n|---|---|---|---|\n")
        out.append(table(node, top))
    return "".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
