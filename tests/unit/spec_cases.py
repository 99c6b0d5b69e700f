"""Specs for the API's tests: a valid base spec, one field changed, and for every rule in api.RULES a
spec it rejects and one it accepts (the unit tests check them with pydantic, the cluster tests on
the API server)."""

from __future__ import annotations

import copy
from typing import Any

BASE: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "image": "vllm/vllm-openai:v0.11.0",
    "speculative": {"method": "eagle3", "draftModel": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
}


def with_(path: str, value: Any) -> dict[str, Any]:
    """BASE with one field (dotted path) set; None removes it."""
    spec = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return spec


AUTO = "numSpeculativeTokensPerBatchSizePolicy"


def per_batch(*ranges: list[float]) -> dict[str, Any]:
    """BASE with numSpeculativeTokensPerBatchSize: [minBatchSize, maxBatchSize, numSpeculativeTokens]."""
    schedule = [
        dict(zip(("minBatchSize", "maxBatchSize", "numSpeculativeTokens"), r, strict=True)) for r in ranges
    ]
    return with_("speculative.numSpeculativeTokensPerBatchSize", schedule)


def ngram(**fields: Any) -> dict[str, Any]:
    return {**BASE, "speculative": {"method": "ngram", **fields}}


def sized(replicas: int, canary: int, strategy: str = "canary") -> dict[str, Any]:
    return {**BASE, "replicas": replicas, "rollout": {"canaryReplicas": canary, "strategy": strategy}}


GATEWAY: dict[str, Any] = {"router": "GatewayAPI", "httpRoute": {"parentRefs": [{"name": "inference"}]}}


def traffic(**fields: Any) -> dict[str, Any]:
    return with_("rollout.traffic", fields)


PICKER: dict[str, Any] = {"name": "llama-epp", "port": 9002}
POOL: dict[str, Any] = {
    "endpointPicker": {"baseline": PICKER, "canary": {**PICKER, "name": "llama-canary-epp"}}
}
POOLS: dict[str, Any] = {**GATEWAY, "backend": "InferencePool", "inferencePool": POOL}


def pools(**pickers: Any) -> dict[str, Any]:
    """backend InferencePool with the pickers given (None: that track's left out)."""
    chosen = {**POOL["endpointPicker"], **pickers}
    picked = {track: picker for track, picker in chosen.items() if picker is not None}
    return traffic(**{**POOLS, "inferencePool": {"endpointPicker": picked}})


WORKLOAD_REF: dict[str, Any] = {"name": "llama"}
ADOPTING: dict[str, Any] = {"workloadRef": WORKLOAD_REF, "speculative": BASE["speculative"]}


def adopting(**fields: Any) -> dict[str, Any]:
    """A spec adopting Deployment llama (workloadRef), with more fields."""
    return {**ADOPTING, **fields}


def existing_route(**rule: Any) -> dict[str, Any]:
    return traffic(router="GatewayAPI", existingRoute={"name": "chat", **rule})


# (rule index, a spec the rule rejects, a spec it accepts); every rule in api.RULES appears.
RULE_CASES: list[tuple[int, dict[str, Any], dict[str, Any]]] = [
    (0, with_("speculative.draftModel", None), BASE),
    (1, ngram(draftModel="x"), ngram()),
    (2, ngram(promptLookupMin=5, promptLookupMax=2), ngram(promptLookupMin=2, promptLookupMax=5)),
    (3, with_("speculative.promptLookupMax", 4), ngram(promptLookupMax=4)),
    (
        4,
        with_("speculative.extraConfig", {"tensor_parallel_size": 2}),
        with_("speculative.extraConfig", {"max_model_len": 4096}),
    ),
    (4, with_("speculative.extraConfig", {"method": "ngram"}), BASE),
    (5, with_("env", [{"name": "A"}]), with_("env", [{"name": "A", "value": "1"}])),
    (
        5,
        with_(
            "env",
            [{"name": "HF_TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        ),
        with_("env", [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
    ),
    (6, with_("tensorParallelSize", 2), {**with_("tensorParallelSize", 2), "resources": {"gpus": 2}}),
    # API server only (check is None): the operator reads 2.0 as 2 and accepts both.
    (7, with_("resources.gpus", 2.0), with_("resources.gpus", 2)),
    (8, with_("tensorParallelSize", 1.0), with_("tensorParallelSize", 1)),
    (9, ngram(promptLookupMin=2.0), ngram(promptLookupMin=2)),
    (10, ngram(promptLookupMax=4.0), ngram(promptLookupMax=4)),
    (
        11,
        with_("rollout.benchmark", {"dataset": "sharegpt"}),
        with_("rollout.benchmark", {"dataset": "random"}),
    ),
    (
        12,
        with_("rollout.benchmark", {"concurrency": [1, 8], "gateConcurrency": 4}),
        with_("rollout.benchmark", {"concurrency": [1, 8], "gateConcurrency": 8}),
    ),
    (
        12,
        with_("rollout.benchmark", {"gateConcurrency": 4}),
        with_("rollout.benchmark", {"gateConcurrency": 8}),
    ),
    (13, with_("rollout.benchmark.concurrency", [1.0, 8]), with_("rollout.benchmark.concurrency", [1, 8])),
    (
        14,
        with_("rollout.benchmark", {"gateConcurrency": 32.0}),
        with_("rollout.benchmark", {"gateConcurrency": 32}),
    ),
    (15, with_("rollout", {"maxSurge": 0}), with_("rollout", {"maxSurge": 0, "maxUnavailable": 1})),
    (16, with_("rollout", {"maxSurge": 2.0}), with_("rollout", {"maxSurge": 2})),
    (17, with_("rollout", {"maxUnavailable": 1.0}), with_("rollout", {"maxUnavailable": 1})),
    (
        18,
        with_("rollout.metrics", {"prometheusUrl": "not a url"}),
        with_("rollout.metrics", {"prometheusUrl": "http://prometheus-operated.monitoring:9090"}),
    ),
    (
        19,
        with_("rollout.metrics", {"scrapeInterval": "500ms"}),
        with_("rollout.metrics", {"scrapeInterval": "1s"}),
    ),
    (
        20,
        with_("rollout.gates", {"mixDriftTimescale": "0s"}),
        with_("rollout.gates", {"mixDriftTimescale": "1s"}),
    ),
    (
        21,
        with_("podTemplate", {"volumes": [{"name": "dshm", "emptyDir": {}}]}),
        with_("podTemplate", {"volumes": [{"name": "scratch", "emptyDir": {}}]}),
    ),
    (21, with_("podTemplate", {"volumes": [{"emptyDir": {}}]}), with_("podTemplate", {"volumes": []})),
    (22, sized(2, canary=2), sized(2, canary=1)),
    (22, sized(1, canary=2), sized(1, canary=1)),  # at replicas 1, 1 canary pod beside the baseline's
    (22, sized(4, canary=5), sized(4, canary=5, strategy="sequential")),  # sequential: every pod in turn
    (23, with_("replicas", 3.0), with_("replicas", 3)),
    (24, with_("rollout.canaryReplicas", 1.0), with_("rollout.canaryReplicas", 1)),
    (25, per_batch([1, 8, 3], [16, 9, 2]), per_batch([1, 8, 3], [9, 16, 2])),
    (26, per_batch([1, 16, 3], [8, 32, 2]), per_batch([1, 16, 3], [17, 32, 2])),
    (26, per_batch([1, 8, 3], [1, 8, 3]), per_batch([1, 8, 3])),  # a duplicate overlaps itself
    (27, per_batch([2, 8, 3]), per_batch([9, 64, 1], [1, 8, 3])),  # vLLM sorts the ranges
    (28, per_batch([1, 8, 5]), per_batch([1, 8, 3])),  # numSpeculativeTokens 3 caps K
    (29, per_batch([1.0, 8, 3]), per_batch([1, 8, 3])),
    (30, per_batch([1, 8.0, 3]), per_batch([1, 8, 3])),
    (31, per_batch([1, 8, 3.0]), per_batch([1, 8, 3])),
    (32, with_("speculative.numSpeculativeTokens", 3.0), with_("speculative.numSpeculativeTokens", 3)),
    (
        33,
        {**per_batch([1, 8, 3]), "speculative": {**per_batch([1, 8, 3])["speculative"], AUTO: "Auto"}},
        with_(f"speculative.{AUTO}", "Auto"),
    ),
    (34, traffic(router="GatewayAPI"), traffic(**GATEWAY)),
    (34, traffic(**GATEWAY, existingRoute={"name": "chat", "ruleIndex": 0}), traffic(**GATEWAY)),
    (35, traffic(initialCanaryWeight=5), traffic(**GATEWAY, initialCanaryWeight=5)),
    (35, traffic(router="Service", httpRoute=GATEWAY["httpRoute"]), traffic(router="Service")),
    (
        36,
        with_("rollout", {"measurement": "benchmark", "traffic": {**GATEWAY, "initialCanaryWeight": 5}}),
        with_("rollout", {"measurement": "both", "traffic": {**GATEWAY, "initialCanaryWeight": 5}}),
    ),
    (37, existing_route(ruleName="chat", ruleIndex=0), existing_route(ruleName="chat")),
    (37, existing_route(), existing_route(ruleIndex=0)),
    (
        38,
        with_("rollout", {"strategy": "sequential", "traffic": GATEWAY}),
        with_("rollout", {"traffic": GATEWAY}),
    ),
    (39, with_("rollout.guard", {"history": "9m"}), with_("rollout.guard", {"history": "10m"})),
    (40, traffic(backend="InferencePool", inferencePool=POOL), traffic(**POOLS)),
    (
        40,
        traffic(router="Service", backend="InferencePool", inferencePool=POOL),
        traffic(router="Service", backend="Service"),
    ),
    (41, traffic(**GATEWAY, backend="InferencePool"), traffic(**POOLS)),
    (41, traffic(**GATEWAY, backend="InferencePool", inferencePool={}), traffic(**POOLS)),
    (41, pools(canary=None), traffic(**POOLS)),
    (41, pools(baseline=None), traffic(**POOLS)),
    (42, traffic(**GATEWAY, inferencePool=POOL), traffic(**POOLS)),
    (43, with_("model", None), adopting()),
    (44, with_("image", None), adopting()),
    (45, adopting(model=BASE["model"]), adopting()),
    (45, adopting(image=BASE["image"]), adopting()),
    (45, adopting(vllmArgs=["--max-model-len", "8192"]), adopting(vllmArgs=[])),
    (46, adopting(env=[{"name": "A", "value": "1"}]), adopting(env=[])),
    (46, adopting(modelCache={"claimName": "weights"}), adopting()),
    (46, adopting(nodeSelector={"gpu": "h100"}), adopting(nodeSelector={})),
    (46, adopting(tolerations=[{"key": "gpu"}]), adopting(tolerations=[])),
    (46, adopting(podTemplate={}), adopting()),
    (47, adopting(rollout={"measurement": "both"}), adopting(rollout={"measurement": "traffic"})),
    (
        48,
        with_("latencyBuckets", {"lowest": "5s", "highest": "5ms"}),
        with_("latencyBuckets", {"lowest": "5ms", "highest": "5s"}),
    ),
    (48, with_("latencyBuckets", {"lowest": "6s"}), with_("latencyBuckets", {"lowest": "4s"})),
    (49, with_("latencyBuckets", {"lowest": "0ms"}), with_("latencyBuckets", {"lowest": "1ms"})),
]
