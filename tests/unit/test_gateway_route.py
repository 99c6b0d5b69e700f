"""The HTTPRoute specgate renders and the patch of a user's route rule, checked against Gateway API's
own HTTPRoute CRD (standard channel), read from the sigs.k8s.io/gateway-api Go module at test time.

openapi_check applies the schema as the API server would (defaults, structure, bounds, CEL); the
authoritative check, a create against a real API server with these CRDs, is a cluster test. Reading a
route back (its rule's weights for the two tracks, and whether its Gateways accepted them) is here too."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.unit.handler_fakes import json_patched
from tests.unit.openapi_check import problems

from specgate import api, render
from specgate.observation import RouteState
from specgate.render import Owner
from specgate.traffic import Weights

GATEWAY_API = "sigs.k8s.io/gateway-api@v1.6.3"  # the CRDs the lab installs (issue 41)
OWNER = Owner(name="llama", namespace="ml", uid="u-1")
TEMPLATE = api.HTTPRouteTemplate.model_validate(
    {
        "parentRefs": [{"name": "inference", "namespace": "gateways", "sectionName": "http", "port": 80}],
        "hostnames": ["llm.example.com"],
        "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
    }
)


@pytest.fixture(scope="module")
def httproute_schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """HTTPRoute v1's openAPIV3Schema, from the module in the Go module cache (downloaded from the
    Go module proxy on first use, as CI can)."""
    if shutil.which("go") is None:
        pytest.skip("no `go` on PATH to download the Gateway API CRDs (sigs.k8s.io/gateway-api)")
    download = subprocess.run(
        ["go", "mod", "download", "-json", GATEWAY_API],
        cwd=tmp_path_factory.mktemp("gateway-api"),  # outside any module: nothing to resolve
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    crd_file = (
        Path(json.loads(download.stdout)["Dir"])
        / "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml"
    )
    crd = yaml.safe_load(crd_file.read_text())
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema


def test_the_owned_route_is_one_rule_over_both_tracks_services() -> None:
    assert render.http_route(OWNER, TEMPLATE, Weights(75, 25)) == {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {
            "name": "llama",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/managed-by": "specgate"},
            "ownerReferences": [OWNER.reference()],
        },
        "spec": {
            "parentRefs": [{"name": "inference", "namespace": "gateways", "sectionName": "http", "port": 80}],
            "hostnames": ["llm.example.com"],
            "rules": [
                {
                    "backendRefs": [
                        {"kind": "Service", "name": "llama-baseline", "port": 8000, "weight": 75},
                        {"kind": "Service", "name": "llama-canary", "port": 8000, "weight": 25},
                    ],
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                }
            ],
        },
    }


@pytest.mark.parametrize("weights", [Weights(100, 0), Weights(75, 25), Weights(0, 100)])
def test_the_owned_route_validates_against_the_httproute_crd(
    httproute_schema: dict[str, Any], weights: Weights
) -> None:
    assert problems(render.http_route(OWNER, TEMPLATE, weights), httproute_schema) == []
    minimal = api.HTTPRouteTemplate.model_validate({"parentRefs": [{"name": "inference"}]})
    assert problems(render.http_route(OWNER, minimal, weights), httproute_schema) == []
    pools = render.http_route(OWNER, TEMPLATE, weights, api.Backend.INFERENCE_POOL)  # issue 59
    assert problems(pools, httproute_schema) == []


def test_the_check_refuses_what_the_api_server_refuses(httproute_schema: dict[str, Any]) -> None:
    """The check can fail: a Service backend without a port (a CEL rule), a negative weight (a
    bound), a field HTTPRoute does not have (structure)."""
    route = render.http_route(OWNER, TEMPLATE, Weights(75, 25))
    refs = route["spec"]["rules"][0]["backendRefs"]
    del refs[0]["port"]
    refs[1]["weight"] = -1
    route["spec"]["rules"][0]["weights"] = [75, 25]
    assert problems(route, httproute_schema) == [
        "<root>.spec.rules[0].backendRefs[0]: Must have port for Service reference",
        "<root>.spec.rules[0].backendRefs[1].weight: -1 fails minimum 0",
        "<root>.spec.rules[0].weights: unknown field (the API server would drop it)",
    ]


USERS_ROUTE: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "chat", "namespace": "ml", "resourceVersion": "41"},
    "spec": {
        "parentRefs": [{"name": "inference"}],
        "rules": [
            {"name": "health", "matches": [{"path": {"type": "Exact", "value": "/health"}}],
             "backendRefs": [{"name": "status-page", "port": 80}]},
            {"name": "chat", "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
             "backendRefs": [{"name": "llama", "port": 8000}],
             "timeouts": {"request": "300s"}},
        ],
    },
}  # fmt: skip


def existing(**rule: Any) -> api.ExistingRoute:
    return api.ExistingRoute.model_validate({"name": "chat", **rule})


def test_the_patch_of_a_users_rule_sets_its_backends_and_nothing_else(
    httproute_schema: dict[str, Any],
) -> None:
    patch = render.rule_patch(USERS_ROUTE, existing(ruleName="chat"), OWNER, Weights(80, 20))
    assert patch == [
        {"op": "test", "path": "/spec/rules/1/name", "value": "chat"},
        {
            "op": "add",
            "path": "/spec/rules/1/backendRefs",
            "value": [
                {"kind": "Service", "name": "llama-baseline", "port": 8000, "weight": 80},
                {"kind": "Service", "name": "llama-canary", "port": 8000, "weight": 20},
            ],
        },
    ]
    after = json_patched(USERS_ROUTE, patch)
    assert problems(after, httproute_schema) == []
    before = copy.deepcopy(USERS_ROUTE)
    before["spec"]["rules"][1]["backendRefs"] = after["spec"]["rules"][1]["backendRefs"]
    assert after == before  # the other rule, the matches, timeouts and parents are the user's


def test_a_rule_by_position_is_guarded_by_the_routes_version() -> None:
    """A rule without a name has nothing of its own to test: the whole route must be as read."""
    patch = render.rule_patch(USERS_ROUTE, existing(ruleIndex=0), OWNER, Weights(100, 0))
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert patch[1]["path"] == "/spec/rules/0/backendRefs"


def test_a_missing_rule_names_the_field_and_the_rules_there_are() -> None:
    with pytest.raises(
        LookupError,
        match=r"^spec.rollout.traffic.existingRoute.ruleName: HTTPRoute chat has no rule named 'chats' \(its rules: \['health', 'chat'\]\)",
    ):
        render.rule_index(USERS_ROUTE, existing(ruleName="chats"))
    with pytest.raises(
        LookupError,
        match=r"^spec.rollout.traffic.existingRoute.ruleIndex: HTTPRoute chat has 2 rules, so no rule 2",
    ):
        render.rule_index(USERS_ROUTE, existing(ruleIndex=2))


def test_the_routes_weights_are_read_as_shares_of_the_two_tracks() -> None:
    route = json_patched(
        USERS_ROUTE, render.rule_patch(USERS_ROUTE, existing(ruleName="chat"), OWNER, Weights(80, 20))
    )
    assert render.route_weights(route, 1, OWNER) == Weights(80, 20)
    refs = route["spec"]["rules"][1]["backendRefs"]
    refs[0]["weight"], refs[1]["weight"] = 3, 1  # relative weights, as a person may write them
    assert render.route_weights(route, 1, OWNER) == Weights(75, 25)
    del refs[0]["weight"], refs[1]["weight"]  # Gateway API's default weight is 1
    assert render.route_weights(route, 1, OWNER) == Weights(50, 50)
    assert render.route_weights(USERS_ROUTE, 1, OWNER) is None  # not (yet) the tracks' Services
    assert render.route_weights(USERS_ROUTE, 5, OWNER) is None


def test_without_a_rule_at_the_index_there_are_no_weights() -> None:
    """A position past the route's rules (one the route lost since) routes to no track: no weights,
    not a crash of the reconcile."""
    assert render.route_weights(USERS_ROUTE, 2, OWNER) is None  # rules 0 and 1 only


def with_refs(*refs: dict[str, Any]) -> dict[str, Any]:
    """USERS_ROUTE with the chat rule's backendRefs replaced by `refs`."""
    route = copy.deepcopy(USERS_ROUTE)
    route["spec"]["rules"][1]["backendRefs"] = list(refs)
    return route


def test_a_backend_without_weight_or_kind_is_a_service_of_weight_1() -> None:
    """Gateway API's BackendRef defaults: kind Service (group core) and weight 1, as a person writing
    the rule may leave them out."""
    route = with_refs(
        {"name": "llama-baseline", "port": 8000, "weight": 3}, {"name": "llama-canary", "port": 8000}
    )
    assert render.route_weights(route, 1, OWNER) == Weights(75, 25)


def test_a_rule_with_another_backend_than_the_tracks_services_has_no_track_weights() -> None:
    """Traffic that goes elsewhere too (a third backend, or a backend of another kind that shares the
    canary Service's name) is not split between the two tracks: no weights to measure by."""
    baseline = {"kind": "Service", "name": "llama-baseline", "port": 8000, "weight": 50}
    canary = {"kind": "Service", "name": "llama-canary", "port": 8000, "weight": 50}
    pool = {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": "llama-canary",
        "weight": 50,
    }
    assert render.route_weights(with_refs(baseline, canary), 1, OWNER) == Weights(50, 50)
    assert render.route_weights(with_refs(baseline, pool), 1, OWNER) is None
    assert render.route_weights(with_refs(baseline, canary, {**pool, "name": "llama-pool"}), 1, OWNER) is None


# --- route_state: the rule's weights as its Gateways accepted them ---

INFERENCE = {"name": "inference", "namespace": "gateways", "sectionName": "http"}
INTERNAL = {"name": "internal", "namespace": "gateways"}
OWNED_TRAFFIC = api.Traffic.model_validate(
    {"router": "GatewayAPI", "httpRoute": {"parentRefs": [INFERENCE, INTERNAL]}}
)
OWNED_ROUTE: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "llama", "namespace": "ml"},
    "spec": {
        "parentRefs": [INFERENCE, INTERNAL],
        "rules": [
            {
                "backendRefs": [
                    {"kind": "Service", "name": "llama-baseline", "port": 8000, "weight": 75},
                    {"kind": "Service", "name": "llama-canary", "port": 8000, "weight": 25},
                ]
            }
        ],
    },
}  # HTTPRoute llama as specgate applies it for OWNED_TRAFFIC (labels, ownerReferences left out)
EXISTING_TRAFFIC = api.Traffic.model_validate(
    {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleName": "chat"}}
)


def reported(route: dict[str, Any], *parent_refs: dict[str, Any]) -> dict[str, Any]:
    """The route Accepted and ResolvedRefs at its generation by the Gateways of parent_refs (as
    status.parents names them: namespace and sectionName as set in the route's parentRef)."""
    generation = 4
    conditions = [
        {"type": kind, "status": "True", "reason": kind, "observedGeneration": generation}
        for kind in ("Accepted", "ResolvedRefs")
    ]
    return {
        **route,
        "metadata": {**route["metadata"], "generation": generation},
        "status": {
            "parents": [
                {"parentRef": ref, "controllerName": "example.com/gateway", "conditions": conditions}
                for ref in parent_refs
            ]
        },
    }


def test_a_missing_route_holds_the_analysis_and_only_specgates_own_is_yet_to_come() -> None:
    """specgate creates its own route (it does not exist *yet*); the user's route is the user's to
    create or to name rightly."""
    assert render.route_state(None, OWNED_TRAFFIC, OWNER) == RouteState(
        hold="HTTPRoute llama does not exist yet"
    )
    assert render.route_state(None, EXISTING_TRAFFIC, OWNER) == RouteState(
        hold="HTTPRoute chat does not exist"
    )


def test_the_owned_routes_weights_count_once_every_gateway_it_names_accepted_them() -> None:
    """The owned route's one rule (index 0) is read once both Gateways of its parentRefs, each named
    by name, namespace and sectionName as the route names it, accepted its generation; a Gateway yet
    to report holds the analysis, whatever the other reported."""
    both = render.route_state(reported(OWNED_ROUTE, INFERENCE, INTERNAL), OWNED_TRAFFIC, OWNER)
    assert both == RouteState(weights=Weights(75, 25))
    one = render.route_state(reported(OWNED_ROUTE, INFERENCE), OWNED_TRAFFIC, OWNER)
    held = "parent Gateway internal: has not reported on the HTTPRoute yet"
    assert one == RouteState(hold=held, written=Weights(75, 25))  # its spec's weights (issue 57)


def test_the_users_routes_rule_is_read_once_its_gateways_accepted_it() -> None:
    """existingRoute: the named rule's weights once every Gateway in the route's status accepted it;
    a rule that is not there holds the analysis with the field to fix."""
    patch = render.rule_patch(USERS_ROUTE, existing(ruleName="chat"), OWNER, Weights(80, 20))
    route = reported(json_patched(USERS_ROUTE, patch), {"name": "inference"})
    assert render.route_state(route, EXISTING_TRAFFIC, OWNER) == RouteState(weights=Weights(80, 20))
    renamed = api.Traffic.model_validate(
        {"router": "GatewayAPI", "existingRoute": {"name": "chat", "ruleName": "completions"}}
    )
    assert render.route_state(route, renamed, OWNER) == RouteState(
        hold="spec.rollout.traffic.existingRoute.ruleName: HTTPRoute chat has no rule named 'completions' "
        "(its rules: ['health', 'chat']): name the rule in the route or fix ruleName"
    )
