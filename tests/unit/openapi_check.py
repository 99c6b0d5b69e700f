"""A small check of an object against a CRD's structural openAPIV3Schema, as the API server checks a
create: defaults filled in, then types, unknown fields, required fields, bounds, patterns and the
x-kubernetes-validations CEL rules (with cel-python). Enough to catch a rendered object that a real
API server would refuse; the authoritative check is a create against one (a cluster test)."""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import celpy

Schema = dict[str, Any]
# Kubernetes' CEL escapes property names that are CEL reserved words (apiserver/pkg/cel: escaping).
CEL_RESERVED = {"namespace", "as", "break", "const", "continue", "else", "for", "function", "if",
                "import", "let", "loop", "package", "return", "var", "void", "while"}  # fmt: skip
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def problems(obj: dict[str, Any], schema: Schema) -> list[str]:
    """What the API server would refuse in object `obj` (defaults applied to a copy first). Its
    metadata is left out: the API server checks it as ObjectMeta, not by the CRD's schema."""
    value = with_defaults({k: copy.deepcopy(v) for k, v in obj.items() if k != "metadata"}, schema)
    return _check(value, schema, "<root>")


def with_defaults(value: Any, schema: Schema) -> Any:
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = with_defaults(value[name], sub)
    if isinstance(value, list) and "items" in schema:
        return [with_defaults(item, schema["items"]) for item in value]
    return value


def _check(value: Any, schema: Schema, path: str) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields") and "type" not in schema:
        return []
    kind = schema.get("type")
    if kind == "integer" and not (isinstance(value, int) and not isinstance(value, bool)):
        return [f"{path}: {value!r} is not an integer"]
    if kind in TYPES and not isinstance(value, TYPES[kind]):
        return [f"{path}: {value!r} is not of type {kind}"]
    found = _bounds(value, schema, path)
    if isinstance(value, dict):
        found += _object(value, schema, path)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += _check(item, schema["items"], f"{path}[{i}]")
    if not found:  # the API server runs CEL rules only on values that passed the schema
        found += [
            f"{path}: {r['message']}"
            for r in schema.get("x-kubernetes-validations", [])
            if not _cel(r, value)
        ]
    return found


def _object(value: dict[str, Any], schema: Schema, path: str) -> list[str]:
    found = [f"{path}.{name}: Required value" for name in schema.get("required", []) if name not in value]
    properties = schema.get("properties", {})
    for name, item in value.items():
        if name in properties:
            found += _check(item, properties[name], f"{path}.{name}")
        elif isinstance(schema.get("additionalProperties"), dict):
            found += _check(item, schema["additionalProperties"], f"{path}.{name}")
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            found.append(f"{path}.{name}: unknown field (the API server would drop it)")
    return found


def _bounds(value: Any, schema: Schema, path: str) -> list[str]:
    checks = [
        ("enum", lambda v, e: v in e),
        ("minimum", lambda v, m: not isinstance(v, int | float) or v >= m),
        ("maximum", lambda v, m: not isinstance(v, int | float) or v <= m),
        ("minLength", lambda v, m: not isinstance(v, str) or len(v) >= m),
        ("maxLength", lambda v, m: not isinstance(v, str) or len(v) <= m),
        ("minItems", lambda v, m: not isinstance(v, list) or len(v) >= m),
        ("maxItems", lambda v, m: not isinstance(v, list) or len(v) <= m),
        ("pattern", lambda v, p: not isinstance(v, str) or re.search(p, v) is not None),
    ]
    return [
        f"{path}: {value!r} fails {key} {schema[key]!r}"
        for key, ok in checks
        if key in schema and not ok(value, schema[key])
    ]


def _cel(rule: dict[str, str], value: Any) -> bool:
    return bool(_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(_escaped(value))}))


@functools.cache
def _program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def _escaped(value: Any) -> Any:
    if isinstance(value, dict):
        return {(f"__{k}__" if k in CEL_RESERVED else k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    return value
