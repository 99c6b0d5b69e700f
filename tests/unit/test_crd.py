"""The checked-in CRD is what `specgate crd` prints, and it carries what kubectl users rely on."""

from __future__ import annotations

import math
from typing import Any

import yaml
from tests.conftest import ROOT

from specgate import api, crd

CRD_FILE = ROOT / "crds" / "specgate.dev_speculativedeployments.yaml"


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    nodes = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        nodes += walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        nodes += walk(schema["items"], f"{path}[]")
    return nodes


def version() -> dict[str, Any]:
    doc: dict[str, Any] = crd.crd()["spec"]["versions"][0]
    return doc


def test_checked_in_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == crd.crd_yaml(), "run `make crd` and commit the result"


def test_the_crd_yaml_has_no_anchors_or_aliases() -> None:
    """Older kustomize (and some GitOps diffing) rejects YAML anchors; the schema repeats parts
    (the two tracks' measurements), which PyYAML would otherwise write as &id001 / *id001."""
    events = list(yaml.parse(crd.crd_yaml()))
    assert not [e for e in events if isinstance(e, yaml.AliasEvent) or getattr(e, "anchor", None)]


def test_names_columns_and_the_status_and_scale_subresources() -> None:
    doc = crd.crd()
    assert doc["spec"]["names"]["shortNames"] == ["sd", "specdeploy"]
    v = version()
    scale = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
             "labelSelectorPath": ".status.selector"}  # fmt: skip
    assert v["subresources"] == {"status": {}, "scale": scale}
    columns = {c["name"]: c["jsonPath"] for c in v["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Method"] == ".spec.speculative.method"
    assert columns["K"] == ".spec.speculative.numSpeculativeTokens"
    assert columns["Alpha"] == ".status.canary.alpha"
    assert "Age" in columns and "P99-ITL-Base" in columns and "P99-ITL-Canary" in columns


def test_every_spec_and_status_field_has_a_description() -> None:
    root = version()["schema"]["openAPIV3Schema"]
    missing = [
        path
        for path, node in walk(root)
        # scalar array items are described by their array
        if path.startswith((".spec.", ".status.")) and not node.get("description") and not path.endswith("[]")
    ]
    assert missing == []


def test_schema_is_structural() -> None:
    """Every node has a type (or preserves unknown fields); no refs or unions survive."""
    root = version()["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(root)
    assert "$ref" not in text and "anyOf" not in text and "title" not in text
    for path, node in walk(root):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path


def test_every_rule_is_attached_as_cel() -> None:
    root = version()["schema"]["openAPIV3Schema"]
    attached = {v["rule"] for _, node in walk(root) for v in node.get("x-kubernetes-validations", [])}
    assert attached == {rule.cel for rule in api.RULES if rule.cel is not None} | {api.NAME_CEL}


WHOLE = "must be a whole number without a decimal point: write 2, not 2.0"

# Every rule the API server enforces, by the object it sits on, the field it names and its message:
# written out here, not read from api.RULES, so that a rule dropped from RULES (or left without
# CEL) fails here rather than vanishing from both the CRD and the tests that walk RULES.
API_SERVER_RULES = {
    (".spec.latencyBuckets", ".highest", "highest must be above lowest, e.g. lowest 5ms and highest 5s"),
    (".spec.latencyBuckets", ".lowest", "lowest must be at least 1ms, e.g. 5ms (below it vLLM's steps do not fall)"),
    (".spec", ".tensorParallelSize", "tensorParallelSize must not exceed resources.gpus: request at "
     "least as many GPUs as TP ranks"),
    (".spec", ".tensorParallelSize", f"tensorParallelSize {WHOLE}"),
    (".spec", ".rollout.canaryReplicas", "canaryReplicas must be less than replicas, so that the "
     "baseline serves beside the canary (at replicas 1, canaryReplicas 1 runs beside it on a spare "
     "GPU): lower canaryReplicas, raise replicas, or use strategy sequential"),
    (".spec", ".replicas", f"replicas {WHOLE}"),
    (".spec.resources", ".gpus", f"gpus {WHOLE}"),
    (".spec.env[]", ".value", "set exactly one of value and valueFrom"),
    (".spec.speculative", ".draftModel", "draftModel is required for methods eagle3, eagle and "
     "draft_model: set it to the draft or head"),
    (".spec.speculative", ".draftModel", "draftModel must be empty for methods ngram and suffix: they "
     "draft from the prompt, remove it"),
    (".spec.speculative", ".promptLookupMin", "promptLookupMin must not exceed promptLookupMax"),
    (".spec.speculative", ".promptLookupMin", "promptLookupMin and promptLookupMax apply to method "
     "ngram only: remove them"),
    (".spec.speculative", ".promptLookupMin", f"promptLookupMin {WHOLE}"),
    (".spec.speculative", ".promptLookupMax", f"promptLookupMax {WHOLE}"),
    (".spec.rollout", ".maxSurge", "maxSurge and maxUnavailable cannot both be 0: no pod could ever be "
     "swapped; set maxSurge 1 (one spare GPU pod) or maxUnavailable 1 (swap one pod at a time)"),
    (".spec.rollout", ".maxSurge", f"maxSurge {WHOLE}"),
    (".spec.rollout", ".maxUnavailable", f"maxUnavailable {WHOLE}"),
    (".spec.rollout", ".canaryReplicas", f"canaryReplicas {WHOLE}"),
    (".spec.rollout.benchmark", ".datasetPath", "datasetPath is required for datasets sharegpt, "
     "spec_bench and custom: name the file in the pod"),
    (".spec.rollout.benchmark", ".gateConcurrency", "gateConcurrency must be one of concurrency: add it "
     "to the points or pick one of them"),
    (".spec.rollout.benchmark", ".concurrency", "concurrency points must be whole numbers without a "
     "decimal point: write 8, not 8.0"),
    (".spec.rollout.benchmark", ".gateConcurrency", f"gateConcurrency {WHOLE}"),
    (".spec.rollout.gates", ".mixDriftTimescale", "mixDriftTimescale must be at least 1s, e.g. 3m (how "
     "long a swing of the traffic mix lasts)"),
    (".spec.rollout.metrics", ".prometheusUrl", "prometheusUrl must be an http:// or https:// URL with "
     "a host, e.g. http://prometheus-operated.monitoring:9090"),
    (".spec.rollout.metrics", ".scrapeInterval", "scrapeInterval must be at least 1s, e.g. 15s "
     "(Prometheus' usual interval)"),
    # numSpeculativeTokensPerBatchSize, as vLLM 0.32 validates it
    (".spec.speculative.numSpeculativeTokensPerBatchSize[]", ".minBatchSize", "minBatchSize must not "
     "exceed maxBatchSize: a range is inclusive at both ends"),
    (".spec.speculative", ".numSpeculativeTokensPerBatchSize", "numSpeculativeTokensPerBatchSize ranges "
     "must not overlap: each batch size takes one K"),
    (".spec.speculative", ".numSpeculativeTokensPerBatchSize", "numSpeculativeTokensPerBatchSize needs a "
     "range with minBatchSize 1, so that every batch size has a K"),
    (".spec.speculative", ".numSpeculativeTokensPerBatchSize", "numSpeculativeTokensPerBatchSize K must "
     "not exceed numSpeculativeTokens (vLLM would silently lower it): raise numSpeculativeTokens to the "
     "schedule's largest K"),
    (".spec.speculative.numSpeculativeTokensPerBatchSize[]", ".minBatchSize", f"minBatchSize {WHOLE}"),
    (".spec.speculative.numSpeculativeTokensPerBatchSize[]", ".maxBatchSize", f"maxBatchSize {WHOLE}"),
    (".spec.speculative.numSpeculativeTokensPerBatchSize[]", ".numSpeculativeTokens",
     f"numSpeculativeTokens {WHOLE}"),
    (".spec.speculative", ".numSpeculativeTokens", f"numSpeculativeTokens {WHOLE}"),
    (".spec.speculative", ".numSpeculativeTokensPerBatchSize", "numSpeculativeTokensPerBatchSize must be "
     "empty when numSpeculativeTokensPerBatchSizePolicy is Auto (the operator derives it): remove the "
     "ranges, or the policy to keep them"),
    (".spec.rollout.traffic", ".httpRoute", "router GatewayAPI needs exactly one of httpRoute (specgate "
     "creates the route from parentRefs) and existingRoute (specgate sets the backendRefs of one rule of "
     "your route): set one of them"),
    (".spec.rollout.traffic", ".router", "httpRoute, existingRoute, initialCanaryWeight and "
     "maxCanaryWeight apply to router GatewayAPI only: set router: GatewayAPI or remove them"),
    (".spec.rollout", ".traffic.initialCanaryWeight", "traffic.initialCanaryWeight judges alpha on the "
     "canary's production traffic, which measurement benchmark never reads: set measurement traffic (or "
     "both), or remove initialCanaryWeight"),
    (".spec.rollout.traffic.existingRoute", ".ruleName", "set exactly one of ruleName (the rule's "
     "spec.rules[].name) and ruleIndex (its position, for a rule without a name)"),
    (".spec.rollout", ".traffic.router", "traffic.router GatewayAPI splits traffic between baseline and "
     "canary pods, which strategy sequential never runs side by side: use strategy canary, or router "
     "Service"),
    (".spec.rollout.guard", ".history", "history must be at least 10m, e.g. 36h (hours of the promoted "
     "config's alpha hold the guard's false-alarm budget)"),
    (".spec.rollout.traffic", ".backend", "backend InferencePool weights two InferencePools on an HTTPRoute "
     "rule, which needs router GatewayAPI: set router: GatewayAPI (with httpRoute or existingRoute), or "
     "backend: Service"),
    (".spec.rollout.traffic", ".inferencePool", "backend InferencePool needs "
     "inferencePool.endpointPicker.baseline and .canary, each the name and port of the Service of that "
     "pool's endpoint picker (specgate deploys no picker): set both"),
    (".spec.rollout.traffic", ".inferencePool", "inferencePool applies to backend InferencePool only: set "
     "backend: InferencePool or remove it"),
    (".spec", ".model", "model is required: set model.name (specgate renders the vLLM pods), or "
     "workloadRef to adopt a running vLLM Deployment"),
    (".spec", ".image", "image is required without workloadRef: set the vLLM image, e.g. "
     "vllm/vllm-openai:v0.32.0"),
    (".spec", ".workloadRef", "workloadRef takes the model, image and args from the referenced "
     "Deployment's container: remove model, image and vllmArgs (change them in your Deployment)"),
    (".spec", ".workloadRef", "workloadRef runs the referenced Deployment's pod template: set env, "
     "modelCache, nodeSelector, tolerations and podTemplate there, and remove them here"),
    (".spec", ".rollout.measurement", "workloadRef measures production traffic only (a benchmark Job "
     "needs model and image): set rollout.measurement: traffic"),
}  # fmt: skip


def test_the_api_server_enforces_exactly_the_expected_rules() -> None:
    """The checked-in CRD (what `kubectl apply` installs) carries each expected rule where it
    belongs; the name rule on the root is pinned by the test below."""
    root = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    attached = {
        (path, v["fieldPath"], v["message"])
        for path, node in walk(root)
        for v in node.get("x-kubernetes-validations", [])
        if path
    }
    assert attached == API_SERVER_RULES


def test_the_name_rule_sits_on_the_root_and_checks_creates_only() -> None:
    [rule] = version()["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    assert rule == {
        "rule": api.NAME_CEL,
        "message": f"metadata.name {api.NAME_MESSAGE}",
        "fieldPath": ".metadata.name",
        "optionalOldSelf": True,
    }


def test_defaults_and_bounds_reach_the_api_server() -> None:
    spec = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    gates = spec["rollout"]["properties"]["gates"]["properties"]
    assert gates["minAcceptanceRate"] == {
        **gates["minAcceptanceRate"],
        "default": 0.55,
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 1,
        "exclusiveMaximum": True,
    }
    k = spec["speculative"]["properties"]["numSpeculativeTokens"]
    assert (k["minimum"], k["maximum"]) == (1, 16)
    assert spec["rollout"]["default"] == {}
    assert "default" not in spec["speculative"]


def test_no_fractional_exclusive_maximum_refuses_a_whole_number() -> None:
    """The API server compares a whole-number value (`mixDrift: 0`, as YAML and kubectl write it)
    with a maximum truncated to a whole number: under an exclusive maximum of 0.5 it refused 0 as
    "should be less than 0" (seen on the lab's kube-apiserver v1.36). A number field that allows a
    whole number must not carry a fractional exclusive maximum."""
    root = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    traps = [
        path
        for path, node in walk(root)
        if node.get("type") == "number"
        and node.get("exclusiveMaximum")
        and not float(node["maximum"]).is_integer()
        and node.get("minimum", -1) <= math.floor(node["maximum"])
        and not (node.get("exclusiveMinimum") and node.get("minimum") == math.floor(node["maximum"]))
    ]
    assert traps == []
