"""Issue 57's sequences 1, 3, 5 and 9 through the lab's Traefik, with the load through the gateway
only: every request the gateway answers non-2xx, or cuts, counts. Each sequence is an event the
operator causes or must act on with live traffic on the route; on 1be5013 each sent requests to a
Service with no Ready pod (503s), or held a rollout with no deadline:

1. a user's rule (`existingRoute`) is taken over only once the baseline can carry it, then given
   back on a router switch and on the object's deletion: 0 non-2xx throughout;
3. a hold in Analyzing on a route one of whose Gateways never accepts it has a deadline
   (`progressDeadline`) and a reason of its own: RouteNotAccepted;
5. switching an owned route's router to Service re-points its rule at Service NAME before anything
   else moves: 0 non-2xx;
9. a template edit while Analyzing at 50/50 (replicas 2, maxSurge 0, maxUnavailable 1) rolls no
   track the route still weights: 0 non-2xx.

Needs `make gateway` and root (the pod range's route)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from kubernetes import client
from tests.cluster.conftest import Rollouts, side_by_side
from tests.cluster.gateway import GROUP, VERSION, gateway_lab, get, route_parent
from tests.cluster.gateway_rollouts import (
    CANARY,
    GATEWAY_PARENT,
    RULE,
    Fault,
    Watched,
    gateway_rollout,
    routed_at,
    settled_and_routed,
    user_route,
)
from tests.cluster.operator_process import create_sd, get_sd, sd_gone, wait_for
from tests.cluster.rollouts import Load, lab_operator, patch_rollout, pin_to_node, report, sim_rollout
from tests.conftest import ROOT

from specgate import api
from specgate_lab.adopt_lab import NAME as USER_NAME
from specgate_lab.adopt_lab import SERVED_MODEL, user_deployment, user_service
from specgate_lab.loadgen import LoadResult

pytestmark = [pytest.mark.cluster, pytest.mark.gateway, pytest.mark.after_lines]  # hack/test.sh

USER_REPLICAS = 2  # the user's own engines behind their rule, before specgate
EXISTING = {"router": "GatewayAPI", "existingRoute": {"name": USER_NAME, "ruleName": RULE}}
NOWHERE = "nowhere"  # a Gateway no controller serves: it never accepts the route
SEQUENCE_TIMEOUT_S = 600.0


def owned_route(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    routes = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "httproutes", field_selector=f"metadata.name={name}"
    )["items"]
    return cast(dict[str, Any], routes[0]) if routes else None


def backend_names(route: dict[str, Any] | None, rule: int = 0) -> list[str]:
    if route is None:
        return []
    return [ref["name"] for ref in route["spec"]["rules"][rule].get("backendRefs") or []]


def accepted_as_written(api_client: client.ApiClient, namespace: str, route: str) -> bool:
    """Traefik accepted the route's current generation (it serves what the route says)."""
    generation = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "httproutes", route
    )["metadata"]["generation"]
    parent = route_parent(api_client, namespace, route) or {}
    return any(
        c.get("type") == "Accepted"
        and c.get("status") == "True"
        and c.get("observedGeneration") == generation
        for c in parent.get("conditions") or []
    )


@dataclass
class RouterSwitch(Fault):
    """Sequence 5: promoted on its owned route, the router is switched to Service; recovered once
    the route's rule points at Service NAME alone, Traefik serves that, and specgate let it go."""

    def cause(self, obj: dict[str, Any]) -> bool:
        if not settled_and_routed(obj):
            return False
        # httpRoute is refused beside router Service: a merge patch's null removes it.
        patch = {"rollout": {"traffic": {"router": "Service", "httpRoute": None}}}
        patch_rollout(self.api_client, self.namespace, self.name, patch)
        return True

    def recovered(self, obj: dict[str, Any]) -> bool:
        route = owned_route(self.api_client, self.namespace, self.name)
        return (
            "traffic" not in obj.get("status", {})
            and backend_names(route) == [self.name]
            and accepted_as_written(self.api_client, self.namespace, self.name)
        )


@dataclass
class RouteHeldByAParent(Fault):
    """Sequence 3: in Analyzing at the load-matched weights, the route is attached to a second
    Gateway that never accepts it; the hold must end at progressDeadline in a rollback for
    RouteNotAccepted. Then the user detaches it and the rollback completes; recovered once
    RolledBack on the route."""

    held_until: float | None = None  # when the rollout left Analyzing
    reason: str | None = None
    detached: bool = False

    def cause(self, obj: dict[str, Any]) -> bool:
        weights = routed_at(obj)
        if obj.get("status", {}).get("phase") != "Analyzing" or not weights or not weights.get("canary"):
            return False
        parents = [GATEWAY_PARENT, {"name": NOWHERE}]
        patch = {"rollout": {"traffic": {"httpRoute": {"parentRefs": parents}}}}
        patch_rollout(self.api_client, self.namespace, self.name, patch)
        return True

    def recovered(self, obj: dict[str, Any]) -> bool:
        status = obj.get("status", {})
        if self.held_until is None and status.get("phase") not in ("Analyzing", None):
            self.held_until, self.reason = time.time(), status.get("reason")
        if self.held_until is not None and not self.detached:
            patch = {"rollout": {"traffic": {"httpRoute": {"parentRefs": [GATEWAY_PARENT]}}}}
            patch_rollout(self.api_client, self.namespace, self.name, patch)
            self.detached = True
        return self.detached and settled_and_routed(obj)


@dataclass
class TemplateRoll(Fault):
    """Sequence 9: Analyzing at 50/50 with one pod a track (replicas 2, maxSurge 0, maxUnavailable
    1), the pod template is edited (an env var, as an image bump would); recovered once the new
    generation's rollout has settled on the route."""

    generation: int | None = None

    def cause(self, obj: dict[str, Any]) -> bool:
        weights = routed_at(obj)
        if obj.get("status", {}).get("phase") != "Analyzing" or weights != {"baseline": 50, "canary": 50}:
            return False
        env = [*obj["spec"]["env"], {"name": "SPECGATE_SIM_EDITED", "value": "1"}]
        patch_rollout(self.api_client, self.namespace, self.name, {"env": env})
        self.generation = obj["metadata"]["generation"] + 1
        return True

    def recovered(self, obj: dict[str, Any]) -> bool:
        observed = obj.get("status", {}).get("observedGeneration")
        return observed == self.generation and settled_and_routed(obj)


@dataclass
class ExistingRouteRun:
    """The sequence on a user's rule: the load through the gateway, and when each step was reached."""

    load: LoadResult
    steps: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)


def existing_route_sequence(lab: dict[str, Any]) -> ExistingRouteRun:
    """A user's engines serve their route through Traefik under load; a SpeculativeDeployment takes
    the rule over, promotes, is switched to router Service (the rule given back), back to the rule,
    and deleted (the rule given back again)."""
    api_client, namespace, name = lab["api_client"], lab["namespace"], "tookgw"
    objects = client.CustomObjectsApi(api_client)
    env = {"PYTHONPATH": f"{ROOT / 'lab'}:{ROOT / 'operator'}", "SPECGATE_SIM_ALPHA": "0.8"}
    deployment = user_deployment(USER_REPLICAS, env)
    body = sim_rollout(name, {"SPECGATE_SIM_ALPHA": "0.8"}, traffic=EXISTING)
    body["spec"]["replicas"] = 2
    body["spec"]["rollout"] |= {"canaryReplicas": CANARY}
    node = f"gw-{namespace}"
    run = ExistingRouteRun(LoadResult())
    tracks = [f"{name}-baseline", f"{name}-canary"]

    def rule_backends() -> list[str]:
        return backend_names(owned_route(api_client, namespace, USER_NAME))

    def step(what: str, reached: Any, timeout: float = 300) -> None:
        wait_for(reached, timeout, what, interval=2)
        run.steps[what] = time.time()
        if not sd_gone(api_client, namespace, name):
            run.statuses[what] = get_sd(api_client, namespace, name).get("status", {})

    log = lab["log_dir"] / "traefik.log"
    with gateway_lab(api_client, lab["kubeconfig"], namespace, node, USER_REPLICAS + 3, log) as port:
        pin_to_node({"spec": deployment["spec"]["template"]["spec"]}, node, namespace)
        pin_to_node(body, node, namespace)
        client.AppsV1Api(api_client).create_namespaced_deployment(namespace, deployment)
        client.CoreV1Api(api_client).create_namespaced_service(namespace, user_service())
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, "httproutes", user_route(RULE))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: get(f"{url}/v1/models")[0] == 200, 180, "the user's engines served through Traefik")
        operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"])
        with operator, Load([url], SERVED_MODEL, 4, SEQUENCE_TIMEOUT_S, [run.load]):
            time.sleep(5)  # requests on the user's engines alone first
            create_sd(api_client, namespace, body)
            run.steps["created"] = time.time()
            step("rule taken over", lambda: rule_backends() == tracks)
            step("promoted on the rule", lambda: settled_and_routed(get_sd(api_client, namespace, name)))
            to_service = {"router": "Service", "existingRoute": None}
            patch_rollout(api_client, namespace, name, {"rollout": {"traffic": to_service}})
            step("rule given back (router Service)", lambda: rule_backends() == [USER_NAME])
            time.sleep(10)  # requests on the given-back rule
            patch_rollout(api_client, namespace, name, {"rollout": {"traffic": EXISTING}})
            step("rule taken over again", lambda: routed_at(get_sd(api_client, namespace, name)))
            objects.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
            step("object gone, rule given back", lambda: sd_gone(api_client, namespace, name), 120)
            assert rule_backends() == [USER_NAME], rule_backends()
            time.sleep(10)  # requests on the user's engines alone again
        report(existing_route_timeline=timeline_of(run.steps))
    return run


def timeline_of(steps: dict[str, float]) -> str:
    first = min(steps.values())
    return ", ".join(f"{what} +{at - first:.0f}s" for what, at in steps.items())


rollouts = side_by_side(
    {
        "existing": existing_route_sequence,
        "switch": lambda lab: gateway_rollout(lab, "switchgw", "0.8", RouterSwitch),
        "held": lambda lab: gateway_rollout(lab, "heldgw", "0.8", RouteHeldByAParent),
        # One pod a track at 50/50, nothing to spare: the edit must not roll a weighted track's pod.
        "roll": lambda lab: gateway_rollout(
            lab, "rollgw", "0.8", TemplateRoll, {"maxSurge": 0, "maxUnavailable": 1}, replicas=2
        ),
    }
)


def check_no_request_failed_after_routed(watched: Watched, figure: str) -> None:
    """From the first poll where the route gave the canary weight to the end, the fault included:
    0 failed requests through the gateway."""
    routed = next(s for s in watched.samples if s.weights and s.weights[1] > 0)
    last = watched.samples[-1]
    load = watched.run.load
    report(
        **{
            f"{figure}_failed_requests": last.errors - routed.errors,
            f"{figure}_requests": load and load.requests,
        }
    )
    failed = {kind: n - routed.failures.get(kind, 0) for kind, n in last.failures.items()}
    assert last.errors == routed.errors, ({k: n for k, n in failed.items() if n}, watched.failed_at_gateway)


def test_a_users_rule_is_taken_given_back_and_given_back_on_deletion_with_no_request_failed(
    rollouts: Rollouts,
) -> None:
    """Sequence 1 and the existingRoute side of 5: on 1be5013 the rule went to the tracks' Services
    on the first reconcile, with no pod Ready (503s for the engines' load time)."""
    _, run = rollouts["existing"].result()
    report(existing_route_requests=run.load.requests, existing_route_failed_requests=run.load.errors)
    assert run.statuses["promoted on the rule"]["phase"] == "Promoted", run.statuses
    assert run.load.requests > 0 and run.load.errors == 0, dict(run.load.failures)


def test_switching_an_owned_route_to_the_service_router_re_points_it_with_no_request_failed(
    rollouts: Rollouts,
) -> None:
    """Sequence 5: on 1be5013 the owned route was orphaned at its weights (no delete verb), and
    after a later promotion 75 % of the gateway's traffic went to an empty baseline Service."""
    _, watched = rollouts["switch"].result()
    assert isinstance(watched.fault, RouterSwitch)
    check_no_request_failed_after_routed(watched, "router_switch")
    status = watched.run.status
    assert status["phase"] == "Promoted" and "traffic" not in status, status


def test_a_route_hold_in_analyzing_ends_at_the_progress_deadline(rollouts: Rollouts) -> None:
    """Sequence 3: on 1be5013 a route one Gateway refused held Analyzing for hours (phase_since
    reset every tick); now the hold rolls back for RouteNotAccepted past progressDeadline."""
    _, watched = rollouts["held"].result()
    fault = watched.fault
    assert isinstance(fault, RouteHeldByAParent)
    assert fault.fault_at is not None and fault.held_until is not None
    held_for = fault.held_until - fault.fault_at
    deadline = api.parse_duration(watched.run.obj["spec"]["rollout"]["progressDeadline"])
    report(route_hold_s=f"{held_for:.0f}", route_hold_reason=fault.reason)
    assert fault.reason == "RouteNotAccepted", watched.run.status
    assert deadline <= held_for <= deadline + 60, held_for
    assert watched.run.status["phase"] == "RolledBack", watched.run.status
    check_no_request_failed_after_routed(watched, "route_hold")


def test_a_template_edit_at_50_50_rolls_no_weighted_pod_from_under_the_route(rollouts: Rollouts) -> None:
    """Sequence 9: on 1be5013 the edit moved the route to 100/0 and swapped the baseline's only pod
    in the same reconcile: for about 10 s the route's traffic went to a Service with no Ready pod."""
    _, watched = rollouts["roll"].result()
    assert isinstance(watched.fault, TemplateRoll)
    check_no_request_failed_after_routed(watched, "template_roll")
    assert watched.run.status["phase"] in ("Promoted", "RolledBack"), watched.run.status
