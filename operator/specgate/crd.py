"""Generate the SpeculativeDeployment CRD from the pydantic models in api.py.

pydantic emits JSON Schema 2020-12; Kubernetes wants a structural OpenAPI v3.0 schema. The
conversion inlines $refs, turns Optional[X] into X, numeric exclusive bounds into the v3.0 boolean
form, free-form maps into x-kubernetes-preserve-unknown-fields, and attaches the CEL rules.
"""

from __future__ import annotations

from typing import Any

import yaml

from specgate import api

Schema = dict[str, Any]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Method", "type": "string", "jsonPath": ".spec.speculative.method"},
    {"name": "K", "type": "integer", "jsonPath": ".spec.speculative.numSpeculativeTokens"},
    {"name": "Alpha", "type": "number", "jsonPath": ".status.canary.alpha"},
    {
        "name": "P99-ITL-Base",
        "type": "number",
        "jsonPath": ".status.baseline.p99ItlMs",
        "description": "Baseline P99 inter-token latency, ms",
    },
    {
        "name": "P99-ITL-Canary",
        "type": "number",
        "jsonPath": ".status.canary.p99ItlMs",
        "description": "Canary P99 inter-token latency, ms",
    },
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


# The root may read metadata.name; oldSelf makes it a rule on create only (see api.NAME_CEL).
# fieldPath needs the name in the schema, and then the error names it instead of "<nil>".
NAME_VALIDATION: dict[str, Any] = {
    "rule": api.NAME_CEL,
    "message": f"metadata.name {api.NAME_MESSAGE}",
    "fieldPath": ".metadata.name",
    "optionalOldSelf": True,
}
METADATA: Schema = {"type": "object", "properties": {"name": {"type": "string"}}}


def _rules_by_model() -> dict[str, list[dict[str, str]]]:
    rules: dict[str, list[dict[str, str]]] = {}
    for rule in api.RULES:
        if rule.cel is None:
            continue
        entry = {"rule": rule.cel, "message": rule.message, "fieldPath": f".{rule.field}"}
        rules.setdefault(rule.model.__name__, []).append(entry)
    return rules


class _Converter:
    def __init__(self, defs: dict[str, Schema]) -> None:
        self.defs = defs
        self.rules = _rules_by_model()

    def convert(self, node: Schema) -> Schema:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            merged = {**self.defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            out = self.convert(merged)
            if name in self.rules:
                out["x-kubernetes-validations"] = self.rules[name]
            return out
        if "anyOf" in node:  # Optional[X]: absent means None, so X alone describes it
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            assert len(options) == 1, f"unsupported union {node}"
            rest = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
            return self.convert({**options[0], **rest})
        return self._convert_plain(node)

    def _convert_plain(self, node: Schema) -> Schema:
        out: Schema = {}
        for key, value in node.items():
            if key in ("title", "$defs"):
                continue
            if key in ("exclusiveMinimum", "exclusiveMaximum"):
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif key == "properties":
                required = set(node.get("required", []))
                out[key] = {name: self._property(sub, name in required) for name, sub in value.items()}
            elif key == "items":
                out[key] = self.convert(value)
            elif key == "additionalProperties":
                if value is False:  # extra="forbid": the API server prunes unknown fields instead
                    continue
                out[key] = self.convert(value) if isinstance(value, dict) and value else _free_form()
            else:
                out[key] = value
        if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
            out["x-kubernetes-preserve-unknown-fields"] = True
        return out

    def _property(self, sub: Schema, required: bool) -> Schema:
        converted = self.convert(sub)
        # An optional, non-nullable sub-object whose fields all have defaults gets `default: {}`,
        # so the API server fills in those defaults and `kubectl get -o yaml` shows them.
        optional_object = not required and "anyOf" not in sub and converted.get("type") == "object"
        if optional_object and "properties" in converted and not converted.get("required"):
            converted.setdefault("default", {})
        return converted


def _free_form() -> Schema:
    return {"x-kubernetes-preserve-unknown-fields": True}


def openapi_schema(model: type[api.Model]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    converter = _Converter(raw.get("$defs", {}))
    schema = converter.convert(raw)
    if model.__name__ in converter.rules:
        schema["x-kubernetes-validations"] = converter.rules[model.__name__]
    return schema


def crd() -> Schema:
    spec_schema = openapi_schema(api.SpeculativeDeploymentSpec)
    status_schema = openapi_schema(api.SpeculativeDeploymentStatus)
    # A new object reads {observedGeneration: 0, phase: Pending} from its creation (the API server
    # defaults it on every read), not an empty status: kstatus, and so Flux and `kubectl wait`, see
    # generation 1 not yet observed (InProgress) instead of a resource with no status (Current).
    status_schema["default"] = {"observedGeneration": 0}
    root: Schema = {
        "type": "object",
        "description": "A vLLM model server whose speculative decoding config is rolled out in stages: "
        "baseline, canary, gate on acceptance rate and P99 inter-token latency, promote or roll back.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": METADATA,
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": [NAME_VALIDATION],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.KIND.lower(),
                "shortNames": ["sd", "specdeploy"],
                "categories": ["all", "specgate"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    # scale: `kubectl scale`, an HPA or KEDA own spec.replicas (a change of
                    # replicas alone rescales the tracks in place, never a new rollout).
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


class _NoAliases(yaml.SafeDumper):
    """Repeated schema parts written out each time: older kustomize rejects YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml() -> str:
    header = "# Generated by `specgate crd` from operator/specgate/api.py. Do not edit by hand.\n"
    return header + yaml.dump(crd(), Dumper=_NoAliases, sort_keys=False, width=100)
