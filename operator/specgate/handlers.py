"""kopf wiring only: on a timer per object, observe -> decide -> apply.

Reconciliation is level-based: every interval the handler reads the object's children and metrics
and asks rollout.decide() what to do, so a missed event or an operator restart loses nothing. The
children are read from watches (kopf indexes of the Deployments, Services and pods specgate made),
and a child is written only when it differs from what this process last wrote: an object whose
rollout has settled costs the API server nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import kopf

from specgate import (
    adopt,
    api,
    capacity,
    conditions,
    handover,
    kube,
    memory,
    metrics,
    render,
    rollout,
    schedule,
)
from specgate.api import Phase, SpeculativeDeploymentSpec, SpeculativeDeploymentStatus
from specgate.observation import Observation, RouteState, TrackState, Window, Workload
from specgate.prometheus import MetricsUnavailable, PrometheusClient, Selector, guard_step
from specgate.render import Manifest, Owner, Track
from specgate.traffic import Weights, away_from_unready, most_of, route_hold, served_by_a_gateway

log = logging.getLogger(__name__)

INTERVAL_SECONDS = float(os.environ.get("SPECGATE_INTERVAL_SECONDS", "10"))
METRICS_PORT = int(os.environ.get("SPECGATE_METRICS_PORT", "8080"))
VERBOSE = os.environ.get("SPECGATE_VERBOSE") == "1"
# Reconciles raising the same exception in a row before status (ReconcileError) and an Event say so.
RECONCILE_ERRORS_SURFACED = int(os.environ.get("SPECGATE_RECONCILE_ERRORS_SURFACED", "3"))


def default_prometheus_url() -> str | None:
    return os.environ.get("SPECGATE_PROMETHEUS_URL") or None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    kube.load_config()
    kube.warm_up()
    memory.trim_periodically()
    if METRICS_PORT:
        metrics.serve(METRICS_PORT)
    # kopf would post every handler log line as an Event; ours are posted explicitly, with reasons.
    settings.posting.level = logging.WARNING
    # `kubectl describe` shows the component in its From column (kopf's default says "kopf").
    settings.posting.reporting_component = "specgate"
    settings.posting.reporting_instance = socket.gethostname()
    if not VERBOSE:  # "Timer 'reconcile' succeeded" every few seconds per object is noise
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # The children's watches ask the API server for specgate's objects only, not every pod.
    for resource in (("apps", "deployments"), ("apps", "replicasets"), ("", "services"), ("", "pods")):
        settings.watching.label_selectors[resource] = kube.CHILD_SELECTOR


# The children, as the watches last saw them; kopf fills these before the first reconcile.
@kopf.index("apps", "v1", "deployments", labels=render.MANAGED_BY)
def child_deployments(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> object:
    return {(namespace, name): kube.deployment_view(body)}


# A ReplicaSet has its pods' labels: keyed as they are, by (namespace, owner's name, track).
def child_replica_sets(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> object:
    return {kube.pods_key(namespace or "", labels): kube.replica_set_view(body)}


def watch_replica_sets() -> None:
    """Index the ReplicaSets (`specgate run` does, where the RBAC lets it list and watch them): kopf
    runs no handler until every index is filled, so one it may not list would stop every rollout.
    Without it, a rolling track's raise is not judged on its ReplicaSets (capacity.scaled_ready)."""
    kopf.index("apps", "v1", "replicasets", labels=render.MANAGED_BY)(child_replica_sets)


@kopf.index("v1", "services", labels=render.MANAGED_BY)
def child_services(namespace: str | None, name: str, meta: kopf.Meta, **_: Any) -> object:
    return {(namespace, name): meta["resourceVersion"]}


@kopf.index("v1", "pods", labels=render.MANAGED_BY)
def child_pods(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> object:
    return {kube.pods_key(namespace or "", labels): kube.pod_view(body)}


# backoff: after an exception kopf retries after this, not its 60 s default, so a failed
# reconcile is retried on the next tick as the comment in reconcile() says.
@kopf.timer(
    api.GROUP, api.VERSION, api.PLURAL, interval=INTERVAL_SECONDS, initial_delay=0, backoff=INTERVAL_SECONDS
)
def reconcile(
    body: kopf.Body,
    patch: kopf.Patch,
    **indexes: Any,  # kopf passes each index by its function's name (and meta, spec, status: body's)
) -> None:
    now = datetime.now(UTC)
    obj = kube.current_object(body)
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    generation = int(meta.get("generation", 0))
    current = api.parse_status(dict(status))
    children = kube.Children(
        indexes["child_deployments"],
        indexes["child_services"],
        indexes["child_pods"],
        indexes.get("child_replica_sets", {}),  # not watched where the RBAC does not let it
    )
    annotations = dict(meta.get("annotations") or {})
    try:
        with metrics.RECONCILE_SECONDS.time():
            decision = step(dict(spec), current, owner, generation, now, annotations, children)
    except Exception as error:
        metrics.RECONCILE_ERRORS.labels(owner.namespace, owner.name).inc()
        event = reconcile_failed(owner.uid, error, current, patch, generation, now)
        if event is not None:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
            metrics.CONDITION.labels(owner.namespace, owner.name, conditions.RECONCILE_ERROR).set(1)
        raise  # kopf logs it and retries on the next tick (it applies the patch either way)
    _FAILURES.pop(owner.uid, None)
    recovered = conditions.reconcile_succeeded(decision.status.conditions, generation, api.iso(now))
    decision = replace(decision, status=decision.status.model_copy(update={"conditions": recovered}))
    if not write_status(meta, current, decision.status):
        log.info(
            "%s/%s changed since it was read; deciding again on the next tick", owner.namespace, owner.name
        )
        return
    for event in decision.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    analysis_start = api.parse_time(current.phase_since)
    analysis_seconds = (now - analysis_start).total_seconds() if analysis_start else None
    metrics.record(owner.namespace, owner.name, current.phase, decision, analysis_seconds)


# The exception each object's last reconciles raised, and how many in a row: a count that restarts
# with the operator only delays ReconcileError by RECONCILE_ERRORS_SURFACED ticks (status keeps it).
_FAILURES: dict[str, tuple[str, int]] = {}


def reconcile_failed(
    uid: str,
    error: Exception,
    current: SpeculativeDeploymentStatus,
    patch: kopf.Patch,
    generation: int,
    now: datetime,
) -> rollout.Event | None:
    """Count the failure; the RECONCILE_ERRORS_SURFACED-th in a row of the same exception sets
    ReconcileError True in status (with the phase's conditions as they were) and returns the
    Warning Event that says so, once."""
    text = f"{type(error).__name__}: {error}"
    last, count = _FAILURES.get(uid, ("", 0))
    count = count + 1 if last == text else 1
    _FAILURES[uid] = (text, count)
    if count != RECONCILE_ERRORS_SURFACED:
        return None
    failing = conditions.reconcile_failing(current.conditions, text, count, generation, api.iso(now))
    patch.status["conditions"] = [c.model_dump(by_alias=True, mode="json") for c in failing]
    return rollout.Event("Warning", conditions.RECONCILE_ERROR, failing[-1].message)


# An event handler, not kopf.on.delete: kopf keeps a copy of every object a change handler matches
# (even an optional delete) in an annotation, a patch per spec change, for an object whose deletion
# needs no more than this. The change handlers, restore_rule and hand_back, match only objects that
# need them.
@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
def forget(type: str, meta: kopf.Meta, **_: Any) -> None:
    if type == "DELETED":
        metrics.forget(meta["namespace"], meta["name"])
        kube.forget(meta["uid"])
        _FAILURES.pop(meta["uid"], None)


def _holds_a_rule(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    """Routes a rule of the user's HTTPRoute (traffic.existingRoute), or keeps the record of one."""
    traffic = (spec.get("rollout") or {}).get("traffic") or {}
    return "existingRoute" in traffic or bool((status.get("traffic") or {}).get("original"))


# Only objects that hold a user's rule match (`when`), and only they get the annotation (see
# forget). kopf's finalizer, there for the timer already, keeps the object (and in a background
# deletion its track Services) until the rule is back. The object's progressDeadline, not a count
# of retries, bounds how long a rule that keeps moving, or an API server that fails, holds a
# deletion (a minute was shorter than an API server's restart): then a Warning Event says the rule
# was left as it is, and the object goes.
@kopf.on.delete(
    api.GROUP, api.VERSION, api.PLURAL, when=_holds_a_rule, retries=None, backoff=INTERVAL_SECONDS
)
def restore_rule(
    body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, runtime: timedelta, **_: Any
) -> None:
    """On deletion, put the user's rule's recorded backendRefs back (traffic.existingRoute)."""
    recorded = api.parse_status(dict(status)).traffic
    if recorded is None or recorded.original is None:
        return  # the rule was never taken over (or was put back already): nothing to restore
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    deadline = restore_deadline(dict(spec))
    try:
        event = _restore_rule(owner, recorded.original, deleting=True)
    except Exception as failed:  # every failure is tried again, until the deadline
        if runtime < deadline:
            raise kopf.TemporaryError(f"{failed}; trying again", delay=INTERVAL_SECONDS) from failed
        rule = render.describe_rule(render.recorded_rule(recorded.original))
        message = (
            f"{rule}: its backendRefs could not be put back within progressDeadline "
            f"({deadline.total_seconds():.0f} s) of the deletion and were left as they are: {failed}"
        )
        event = rollout.Event("Warning", rollout.Reason.ROUTE_RULE_NOT_RESTORED, message)
    if event is not None:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _adopts(spec: kopf.Spec, **_: Any) -> bool:
    return "workloadRef" in spec


# As restore_rule: only adopting objects match, and kopf's finalizer keeps the object (so, in a
# background deletion, its track Deployments and their pods) until the adopted Deployment is back.
@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, when=_adopts, retries=None, backoff=INTERVAL_SECONDS)
def hand_back(
    body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status, runtime: timedelta, **_: Any
) -> None:
    """On deletion, scale the adopted Deployment back to its replicas from before the adoption and
    wait (at most progressDeadline) for its Ready pods to keep the floor before specgate's pods go."""
    recorded = api.parse_status(dict(status)).workload
    try:
        parsed = api.parse_spec(dict(spec))
    except api.SpecError:
        return  # an invalid spec never touched the Deployment's replicas since it became invalid
    ref = parsed.workload_ref
    if recorded is None or ref is None:
        return  # never adopted: nothing to hand back
    workload = kube.workload_state(kube.read_deployment(meta["namespace"], recorded.name))
    rollout_spec = parsed.rollout
    budget = capacity.Budget(parsed.replicas, rollout_spec.max_surge, rollout_spec.max_unavailable)
    deadline = restore_deadline(dict(spec)).total_seconds()
    back = handover.hand_back(
        ref.on_delete, recorded.original_replicas, budget, workload, runtime.total_seconds(), deadline
    )
    if workload.exists and back.workload_replicas != workload.replicas:
        kube.scale_deployment(meta["namespace"], recorded.name, back.workload_replicas)
    if not back.release:
        raise kopf.TemporaryError(back.message, delay=INTERVAL_SECONDS)
    reason = rollout.Reason.HANDED_BACK
    kopf.event(body, type="Warning" if back.timed_out else "Normal", reason=reason, message=back.message)


def restore_deadline(spec: dict[str, Any]) -> timedelta:
    """How long a deletion may try to put the user's rule back: the object's progressDeadline, or
    its default where the spec cannot be read."""
    try:
        deadline = api.parse_spec(spec).rollout.progress_deadline
    except api.SpecError:
        deadline = api.RolloutSpec.model_fields["progress_deadline"].default
    return timedelta(seconds=api.parse_duration(deadline))


def step(
    raw_spec: dict[str, Any],
    current: SpeculativeDeploymentStatus,
    owner: Owner,
    generation: int,
    now: datetime,
    annotations: dict[str, str],
    children: kube.Children,
) -> rollout.Decision:
    """Observe, decide, apply; an invalid spec or a name taken by another object touches no child."""
    try:
        api.check_name(owner.name)
        requests = api.parse_requests(annotations)
        spec = api.with_requests(api.parse_spec(raw_spec), requests)
    except api.SpecError as error:
        _route_while_failed(owner, current, children)
        return rollout.invalid_spec(error, current, generation, now)
    spec, k_schedule = schedule.resolve(spec, current, now)  # Auto: held per rollout, see schedule.py
    failed = partial(_failed, owner, current, children, generation, now)
    try:
        adopted = _adopted(spec, owner) if spec.workload_ref is not None else None
        spec = adopt.resolve(spec, adopted.source) if adopted is not None else spec
        source = adopted.source if adopted is not None else None
        deployments = [adopt.track(spec, owner, track, 0, source) for track in Track]
    except adopt.AdoptionError as not_adoptable:
        return failed(rollout.Reason.WORKLOAD_NOT_ADOPTABLE, str(not_adoptable))
    traffic = spec.rollout.traffic if rollout.routes_by_weight(spec) else None
    pools = render.inference_pools(owner, traffic) if traffic is not None else []
    conflicts = kube.foreign_children([*deployments, *_named_children(spec, owner), *pools], owner.uid)
    if conflicts:
        message = f"{'; '.join(conflicts)}: rename this object or remove the other; nothing was changed"
        return failed(rollout.Reason.NAME_CONFLICT, message)
    if spec.rollout.metrics.pod_monitor and not kube.serves_pod_monitors():
        return failed(rollout.Reason.POD_MONITOR_CRD_MISSING, NO_POD_MONITOR_CRD)
    if traffic is not None and not kube.serves_http_routes():
        return rollout.failed(
            rollout.Reason.GATEWAY_API_CRD_MISSING, NO_GATEWAY_API_CRD, current, generation, now
        )
    if pools and not kube.serves_inference_pools():
        return failed(rollout.Reason.INFERENCE_POOL_CRD_MISSING, NO_INFERENCE_POOL_CRD)
    original = current.traffic.original if current.traffic else None
    released: tuple[rollout.Event, ...] = ()
    if original is not None and render.releases(original, traffic):
        original, released = _release_rule(owner, original)
    try:
        route = kube.read_route(owner.namespace, render.route_name(owner, traffic)) if traffic else None
        refused = _refused_rule(traffic, route, owner)
        if refused is not None:
            return failed(*refused)
        pools_read = {pool["metadata"]["name"]: _read_pool(owner, pool) for pool in pools}
        observation = replace(
            observe(spec, current, owner, generation, now, children),
            abort=requests.abort,
            route=_route_state(route, traffic, owner, pools_read) if traffic else None,
            workload=adopted.workload if adopted is not None else None,
            workload_autoscaler=adopted.autoscaler if adopted is not None else None,
        )
        releasing = _owned_route_left(owner, current, traffic)
        decision = _decide(spec, current, observation, now, releasing is not None)
        left = releasing if decision.touch_children else None
        plan = plan_tracks(spec, owner, decision, observation, source)
        if _takes_pods(decision, observation, plan):
            observation, decision, plan = _decided_on_tracks_now(
                spec, current, owner, observation, decision, plan, now, source, releasing is not None
            )
        if decision.touch_children:
            apply_children(spec, owner, decision, observation, plan, children)
            _scale_workload(spec, owner, decision, observation)
            for pool in pools:  # before the route names them
                if render.spec_differs(pools_read[pool["metadata"]["name"]], pool):
                    kube.apply(pool)
            if traffic is not None and decision.stage_rule:
                original = _stage_rule(traffic, owner, route, original)
            elif traffic is not None and decision.route_weights is not None:
                written = current.traffic.desired if current.traffic else None
                original, repaired = _route_traffic(
                    traffic, owner, route, decision.route_weights, original, written
                )
                released += repaired
    except kube.ForeignChild as taken:  # a benchmark Job read, or a child taken since it was read free
        return failed(rollout.Reason.NAME_CONFLICT, f"{taken}: rename this object or remove the other")
    except kube.Invalid as refused:  # the route's own validation refuses the weights: not a race
        message = (
            f"HTTPRoute {render.route_name(owner, traffic) if traffic else ''} refused the weights: {refused}"
        )
        return rollout.failed(rollout.Reason.INVALID_SPEC, message, current, generation, now)
    # A router switched back to Service leaves no route's weights in status once the route specgate
    # owned points at Service <name> and its Gateways have served that for scaleDownDelay (until
    # then its record stays, the pods are held, and the release is tried again).
    route_name = render.route_name(owner, traffic) if traffic else None
    route_status = rollout.traffic_status(route_name, decision, observation, original, current.traffic, now)
    if left is not None and current.traffic is not None:
        done, event = _release_owned_route(owner, left)
        released += (event,) if event else ()
        if route_status is None:
            route_status = _release_record(spec, owner, left, current.traffic, done, now)
    update = {
        **scale_status(owner, observation, adopting=adopted is not None),
        "k_schedule": k_schedule,
        "traffic": route_status,
    }
    return replace(
        decision, status=decision.status.model_copy(update=update), events=decision.events + released
    )


def _decide(
    spec: SpeculativeDeploymentSpec,
    current: SpeculativeDeploymentStatus,
    observation: Observation,
    now: datetime,
    releasing: bool,
) -> rollout.Decision:
    """rollout.decide, with every track's pods held while the owned route is released (releasing:
    _owned_route_left names one)."""
    decision = rollout.decide(spec, current, observation, now)
    return _held_for_release(decision, observation) if releasing and decision.touch_children else decision


def _decided_on_tracks_now(
    spec: SpeculativeDeploymentSpec,
    current: SpeculativeDeploymentStatus,
    owner: Owner,
    observation: Observation,
    decision: rollout.Decision,
    plan: TrackPlan,
    now: datetime,
    source: dict[str, Any] | None,
    releasing: bool,
) -> tuple[Observation, rollout.Decision, TrackPlan]:
    """A decision that takes pods away or sends traffic to a track anew (_takes_pods) counts on the
    Ready pods there are: where the tracks as the API server has them now differ from the watches'
    cache, it is decided (and planned) again on them, holding what _decide holds."""
    tracks = {track: _track_now(owner, track) for track in Track}
    read_now = replace(observation, baseline=tracks[Track.BASELINE], canary=tracks[Track.CANARY])
    if (read_now.baseline, read_now.canary) == (observation.baseline, observation.canary):
        return observation, decision, plan
    decision = _decide(spec, current, read_now, now, releasing)
    return read_now, decision, plan_tracks(spec, owner, decision, read_now, source)


def _takes_pods(decision: rollout.Decision, observation: Observation, plan: TrackPlan) -> bool:
    """Whether applying the decision removes pods: the adopted Deployment or a track scaled down,
    or a track rolled to another pod template (its old pods go as the new ones come); or sends a
    route's traffic to a track it gave none, which needs that track's Ready pods as they are now."""
    if not decision.touch_children:
        return False
    if _adds_weight(decision.route_weights, observation.route):
        return True
    workload, wanted = observation.workload, decision.workload_replicas
    if workload is not None and wanted is not None and wanted < workload.replicas:
        return True
    states = _tracks(observation)
    for track, manifest in plan.manifests.items():
        state = states[track]
        if not state.exists:
            continue
        if manifest["spec"]["replicas"] < state.replicas:
            return True
        # A Deployment from before template hashes is not rolled by us.
        if track not in plan.kept and state.template_hash is not None and _rolls(manifest, state):
            return True
    return False


def _adds_weight(weights: Weights | None, route: RouteState | None) -> bool:
    """Whether `weights` give a track traffic the route's rule gives it none of (or no rule yet)."""
    if weights is None:
        return False
    had = route.in_spec if route is not None else None
    before = (0, 0) if had is None else (had.baseline, had.canary)
    return any(
        new > 0 and old == 0 for new, old in zip((weights.baseline, weights.canary), before, strict=True)
    )


def _rolls(manifest: Manifest, state: TrackState) -> bool:
    """Whether applying a track's manifest changes its pod template (its hash, or a re-render)."""
    annotations = manifest["metadata"]["annotations"]
    return bool(
        annotations.get(render.ANNOTATION_TEMPLATE) != state.template_hash
        or annotations[render.ANNOTATION_RENDERED] != state.rendered
    )


def _tracks(observation: Observation) -> dict[Track, TrackState]:
    return {Track.BASELINE: observation.baseline, Track.CANARY: observation.canary}


def _track_now(owner: Owner, track: Track) -> TrackState:
    name = render.deployment_name(owner, track)
    return kube.track_state_now(owner.namespace, name, render.selector_labels(owner, track))


def _route_state(
    route: dict[str, Any] | None,
    traffic: api.Traffic,
    owner: Owner,
    pools_read: dict[str, dict[str, Any] | None],
) -> RouteState:
    """render.route_state, with the cause of a pool's hold where its picker's Service is absent:
    looked up only for pools whose Gateways have not resolved them (a settled rollout reads none)."""
    missing = {
        name: render.missing_picker(owner, track, picker)
        for track, picker in render.pool_pickers(traffic).items()
        if route_hold(pools_read.get(name := render.deployment_name(owner, track)), None) is not None
        and not kube.service_exists(owner.namespace, picker.name)
    }
    return render.route_state(route, traffic, owner, pools_read, missing)


def _read_pool(owner: Owner, pool: Manifest) -> dict[str, Any] | None:
    return kube.read_inference_pool(owner.namespace, pool["metadata"]["name"])


def _route_traffic(
    traffic: api.Traffic,
    owner: Owner,
    route: dict[str, Any] | None,
    weights: Weights,
    original: api.OriginalRule | None,
    written: api.RouteWeights | None = None,
) -> tuple[api.OriginalRule | None, tuple[rollout.Event, ...]]:
    """Set the rule's weights: apply the HTTPRoute specgate owns where the route as read differs
    from it (deleted, edited, other weights: repaired, with a Warning Event where it is not what
    specgate last wrote, `written`), or patch the backendRefs of the user's rule where they differ
    (a rule that moved since it was read waits for the next reconcile). The record of the user's
    rule: `original`, or taken as specgate first sets its backendRefs."""
    if traffic.http_route is not None:
        manifest = render.http_route(owner, traffic.http_route, weights, traffic.backend)
        if not render.route_differs(route, manifest):
            return original, ()
        kube.apply(manifest)
        last = None if written is None else Weights(written.baseline, written.canary)
        if last is None or not render.route_differs(
            route, render.http_route(owner, traffic.http_route, last, traffic.backend)
        ):
            return original, ()  # created, or moved on from what specgate wrote itself
        what = "was deleted" if route is None else "was changed by someone else"
        message = f"HTTPRoute {owner.name} {what}; applied again as specgate sets it"
        return original, (rollout.Event("Warning", rollout.Reason.ROUTE_REPAIRED, message),)
    existing = traffic.existing_route
    if route is None or existing is None:
        return original, ()  # status says the route is missing (rollout: RouteNotAccepted)
    try:
        index = render.rule_index(route, existing)
    except LookupError:
        return original, ()  # status names the field to fix
    if render.route_weights(route, index, owner, traffic.backend) == weights:
        return original, ()
    operations = render.rule_patch(route, existing, owner, weights, traffic.backend)
    try:
        kube.patch_route(owner.namespace, existing.name, operations)
    except kube.Conflict as moved:
        log.info("%s; weights set again on the next reconcile", moved)
        return original, ()
    # Kept in status by this reconcile: an operator killed before its status write loses it (the
    # next read finds the tracks' Services in the rule, rule_record None: the rule is left so).
    return original or render.rule_record(route, existing, owner), ()


def _stage_rule(
    traffic: api.Traffic, owner: Owner, route: dict[str, Any] | None, original: api.OriginalRule | None
) -> api.OriginalRule | None:
    """Stage the user's rule for the tracks' pools (render.stage_patch), where it is not staged so
    already; the record of the user's rule, taken as specgate first writes it."""
    existing = traffic.existing_route
    if route is None or existing is None:
        return original  # status says the route is missing (rollout: RouteNotAccepted)
    try:
        operations = render.stage_patch(route, existing, owner)
    except LookupError:
        return original  # status names the field to fix
    if not operations:
        return original or render.rule_record(route, existing, owner)
    try:
        kube.patch_route(owner.namespace, existing.name, operations)
    except kube.Conflict as moved:
        log.info("%s; staged again on the next reconcile", moved)
        return original
    return original or render.rule_record(route, existing, owner)


def _refused_rule(
    traffic: api.Traffic | None, route: dict[str, Any] | None, owner: Owner
) -> tuple[str, str] | None:
    """existingRoute naming a rule whose backends specgate would bypass (InvalidSpec), that another
    SpeculativeDeployment routes (NameConflict), or of the user's InferencePool whose endpoint
    picker the spec names for a pool of specgate's (InvalidSpec): the reason and why it is refused."""
    if traffic is None or traffic.existing_route is None or route is None:
        return None
    existing = traffic.existing_route
    try:
        foreign = render.foreign_backends(route, existing, owner, traffic.backend)
        taken = render.routed_by_another(route, existing, owner)
        adopted = render.users_pool(route, existing, owner)
    except LookupError:
        return None  # route_state names the field to fix
    if foreign is not None:
        return rollout.Reason.INVALID_SPEC, foreign
    if taken is not None:
        return rollout.Reason.NAME_CONFLICT, taken
    if adopted is not None:
        shared = render.shared_picker(
            kube.read_inference_pool(owner.namespace, adopted), adopted, owner, traffic
        )
        return None if shared is None else (rollout.Reason.INVALID_SPEC, shared)
    return None


def _owned_route_left(
    owner: Owner, current: SpeculativeDeploymentStatus, traffic: api.Traffic | None
) -> str | None:
    """The HTTPRoute specgate owned and weighted until this spec, which no longer has it weight one
    (router Service, or an existingRoute of another name); None otherwise."""
    recorded = current.traffic
    if recorded is None or recorded.original is not None or recorded.desired is None:
        return None  # no route, or a user's rule (put back by _release_rule)
    if recorded.route != owner.name:
        return None
    if traffic is not None and (
        traffic.http_route is not None or render.route_name(owner, traffic) == owner.name
    ):
        return None
    return recorded.route


def _held_for_release(decision: rollout.Decision, observation: Observation) -> rollout.Decision:
    """While the owned route's release is under way its Gateways may still send each track the old
    weights: no track gives up pods (replicas only rise, templates stay) until they serve Service
    <name> (_release_record)."""
    held = {
        track: max(wanted or 0, state.replicas) if state.exists else wanted
        for track, wanted, state in (
            (Track.BASELINE, decision.baseline_replicas, observation.baseline),
            (Track.CANARY, decision.canary_replicas, observation.canary),
        )
    }
    return replace(
        decision,
        baseline_replicas=held[Track.BASELINE] or 0,
        canary_replicas=held[Track.CANARY],
        keep_template=frozenset(Track),
    )


def _release_record(
    spec: SpeculativeDeploymentSpec,
    owner: Owner,
    name: str,
    recorded: api.TrafficStatus,
    done: bool,
    now: datetime,
) -> api.TrafficStatus | None:
    """status.traffic while the owned route is released: kept (with actualSince: when its Gateways
    accepted the rule pointed at Service <name>) until they have served it for scaleDownDelay, as a
    track's last pods wait after its weight went; None once released, or where the route is gone or
    no Gateway accepts it at all (nothing serves it: a hold would never end)."""
    if not done:
        return recorded
    route = kube.read_route(owner.namespace, name)
    if route is None or not render.owned_by(route, owner):
        return None
    if route_hold(route, None) is not None:
        if not served_by_a_gateway(route):
            return None
        return recorded.model_copy(update={"actual": None, "actual_since": None})
    since = api.parse_time(recorded.actual_since) if recorded.actual is None else None
    if since is None:
        return recorded.model_copy(update={"actual": None, "actual_since": api.iso(now)})
    delay = api.parse_duration((spec.rollout.traffic or api.Traffic()).scale_down_delay)
    return None if (now - since).total_seconds() >= delay else recorded


def _release_owned_route(owner: Owner, name: str) -> tuple[bool, rollout.Event | None]:
    """Point the owned route's rule that weights the tracks at Service <name>, then stop managing the
    route (it goes with the object): clients of the gateway keep being served by the same pods.
    False where the route changed since it was read (tried again on the next reconcile)."""
    route = kube.read_route(owner.namespace, name)
    index = render.tracks_rule(route, owner) if route is not None and render.owned_by(route, owner) else None
    if route is None or index is None:
        return True, None  # gone, someone else's, or pointed elsewhere already
    try:
        kube.patch_route(owner.namespace, name, render.repoint_patch(route, index, owner))
    except kube.Conflict as moved:
        log.info("%s; pointed at Service %s on the next reconcile", moved, owner.name)
        return False, None
    message = (
        f"HTTPRoute {name} is no longer weighted by specgate: it now sends its traffic to Service "
        f"{owner.name} (both tracks' serving pods) and is deleted with this object"
    )
    return True, rollout.Event("Normal", rollout.Reason.ROUTE_RELEASED, message)


def _failed(
    owner: Owner,
    current: SpeculativeDeploymentStatus,
    children: kube.Children,
    generation: int,
    now: datetime,
    reason: str,
    message: str,
) -> rollout.Decision:
    """Phase Failed for bad input (rollout.failed): no child is changed, the route aside
    (_route_while_failed)."""
    _route_while_failed(owner, current, children)
    return rollout.failed(reason, message, current, generation, now)


def _route_while_failed(owner: Owner, current: SpeculativeDeploymentStatus, children: kube.Children) -> None:
    """Failed (the spec cannot be read, or is refused): no child is changed, but the route that
    status.traffic names must not send traffic to a track without Ready pods. The rule that routes
    the tracks' Services gives that track's weight to the other one (traffic.away_from_unready),
    whatever status says was set last (a pause before may have left it empty); a route that moved
    since it was read is looked at again on the next reconcile."""
    recorded = current.traffic
    if recorded is None:
        return
    route = kube.read_route(owner.namespace, recorded.route)
    index = render.tracks_rule(route, owner) if route is not None else None
    if route is None or index is None:
        return
    ready = [
        kube.track_state(
            children,
            owner.namespace,
            render.deployment_name(owner, track),
            render.selector_labels(owner, track),
        ).serving
        for track in (Track.BASELINE, Track.CANARY)
    ]
    weights = away_from_unready(render.route_weights(route, index, owner), *ready)
    if weights is None:
        return
    try:
        kube.patch_route(owner.namespace, recorded.route, render.weights_patch(route, index, owner, weights))
    except kube.Conflict as moved:
        log.info("%s; looked at again on the next reconcile", moved)


def _release_rule(
    owner: Owner, original: api.OriginalRule
) -> tuple[api.OriginalRule | None, tuple[rollout.Event, ...]]:
    """Put back the rule specgate no longer routes; the record is kept (tried again on the next
    reconcile) only where the rules moved since they were read."""
    try:
        event = _restore_rule(owner, original, deleting=False)
    except kube.Conflict as moved:
        log.info("%s; its backendRefs are put back on the next reconcile", moved)
        return original, ()
    return None, (event,) if event else ()


def _restore_rule(owner: Owner, original: api.OriginalRule, deleting: bool) -> rollout.Event | None:
    """Put the recorded backendRefs back on their rule (render.restore_patch): the Event saying so,
    or why they were left; None when the route is gone. Where the recorded Services are gone, the
    rule routes to Service <name> instead (`deleting`: the object's deletion, which takes it too).
    kube.Conflict: the rules moved since read."""
    rule = render.describe_rule(render.recorded_rule(original))
    route = kube.read_route(owner.namespace, original.route)
    if route is None:
        log.info("HTTPRoute %s/%s is gone: no backendRefs to put back", owner.namespace, original.route)
        return None
    try:
        operations = render.restore_patch(route, original, owner)
    except LookupError as why:
        message = f"{why}: its backendRefs were left as they are, not put back to what they were"
        return rollout.Event("Warning", rollout.Reason.ROUTE_RULE_NOT_RESTORED, message)
    gone = _gone_backends(owner, original)
    if gone:  # a rule pointed back at a backend that is gone answers nothing
        kube.patch_route(
            owner.namespace,
            original.route,
            render.restore_patch(route, original, owner, render.shared_service_refs(owner)),
        )
        until = (
            "until this object's deletion takes that Service with it"
            if deleting
            else "which keeps serving both tracks' pods"
        )
        message = (
            f"{rule}: its own backends ({', '.join(gone)}) no longer exist, "
            f"so it routes to Service {owner.name} instead, {until}; point the rule at a Service that serves"
        )
        return rollout.Event("Warning", rollout.Reason.ROUTE_RULE_NOT_RESTORED, message)
    kube.patch_route(owner.namespace, original.route, operations)
    message = f"{rule}: its own backendRefs are back, as before specgate routed it"
    return rollout.Event("Normal", rollout.Reason.ROUTE_RULE_RESTORED, message)


def _gone_backends(owner: Owner, original: api.OriginalRule) -> list[str]:
    """The core Services and InferencePools among the recorded backendRefs that no longer exist."""
    return [
        f"{kind.value} {ref['name']}"
        for ref in original.backend_refs
        if (kind := render.backend_of(ref)) is not None and not _backend_exists(owner, ref, kind)
    ]


def _backend_exists(owner: Owner, ref: dict[str, Any], kind: api.Backend) -> bool:
    namespace = ref.get("namespace") or owner.namespace
    if kind is api.Backend.SERVICE:
        return kube.service_exists(namespace, ref["name"])
    return kube.read_inference_pool(namespace, ref["name"]) is not None


def scale_status(owner: Owner, observation: Observation, adopting: bool = False) -> dict[str, Any]:
    """What the scale subresource reads (an HPA, KEDA, `kubectl scale`): the pods both tracks ask
    for as observed, and the selector of their pods."""
    labels = adopt.serving_selector(owner) if adopting else render.serving_selector(owner)
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return {"replicas": observation.baseline.replicas + observation.canary.replicas, "selector": selector}


def observe(
    spec: SpeculativeDeploymentSpec,
    status: SpeculativeDeploymentStatus,
    owner: Owner,
    generation: int,
    now: datetime,
    children: kube.Children,
) -> Observation:
    tracks = {
        track: kube.track_state(
            children,
            owner.namespace,
            render.deployment_name(owner, track),
            render.selector_labels(owner, track),
        )
        for track in Track
    }
    observation = Observation(generation, tracks[Track.BASELINE], tracks[Track.CANARY])
    if rollout.begins_new_rollout(spec, status, generation):
        return observation  # the last rollout's figures are about to be forgotten
    if status.phase == Phase.FAILED and status.resume_phase is not None:
        # The spec is valid again (or step() would have returned): decide() resumes the phase in
        # this reconcile, and must see that phase's figures, not none (read as metrics lost).
        status = status.model_copy(update={"phase": status.resume_phase})
    if spec.benchmarks:
        observation = _observe_benchmarks(spec, status, owner, observation, now)
    window = rollout.measurement_window(spec, status, now)
    if window is None or (not spec.measures_traffic and status.phase != Phase.PROMOTED):
        return observation
    url = prometheus_url(spec)
    if url is None:
        return replace(observation, metrics_error=NO_PROMETHEUS)
    prom = PrometheusClient(url)
    interval = rollout.scrape_interval(spec).total_seconds()
    leave_out = _benchmark_spans(spec, observation, now)
    try:
        baseline = canary = None
        if status.phase == Phase.BASELINE or (
            status.phase == Phase.ANALYZING and rollout.baseline_beside_canary(observation)
        ):
            baseline = prom.track_metrics(_selector(spec, owner, Track.BASELINE), window, interval, leave_out)
        if status.phase in (Phase.ANALYZING, Phase.PROMOTED):
            canary = prom.track_metrics(_selector(spec, owner, Track.CANARY), window, interval, leave_out)
        observation = _observe_guard_history(spec, status, owner, observation, prom, interval, now)
    except MetricsUnavailable as exc:
        return replace(observation, metrics_error=str(exc))
    observation = replace(observation, baseline_metrics=baseline, canary_metrics=canary)
    return _observe_incumbent(spec, status, owner, observation, prom, interval)


def _observe_guard_history(
    spec: SpeculativeDeploymentSpec,
    status: SpeculativeDeploymentStatus,
    owner: Owner,
    observation: Observation,
    prom: PrometheusClient,
    interval: float,
    now: datetime,
) -> Observation:
    """After promotion, the promoted canary's alpha over guard.history, in the guard's blocks."""
    step = guard_step(interval)
    window = rollout.guard_history_window(spec, status, now, step)
    if window is None:
        return observation
    history, step = prom.history_windows(_selector(spec, owner, Track.CANARY), window, interval, step)
    return replace(observation, guard_acceptance=history, guard_block_seconds=step)


def _observe_incumbent(
    spec: SpeculativeDeploymentSpec,
    status: SpeculativeDeploymentStatus,
    owner: Owner,
    observation: Observation,
    prom: PrometheusClient,
    interval: float,
) -> Observation:
    """The replaced promoted config's alpha history, once per rollout (rollout.incumbent_window):
    it served on the canary track until this rollout began. Unreadable, the drift falls back."""
    window = rollout.incumbent_window(spec, status)
    if window is None:
        return observation
    try:
        history, step = prom.history_windows(_selector(spec, owner, Track.CANARY), window, interval)
    except MetricsUnavailable as exc:
        return replace(observation, incumbent_error=str(exc))
    return replace(observation, incumbent_acceptance=history, incumbent_window_seconds=step)


NO_POD_MONITOR_CRD = (
    "spec.rollout.metrics.podMonitor is true but this cluster has no PodMonitor resource "
    "(monitoring.coreos.com/v1): install the Prometheus Operator's CRDs, or set podMonitor: false "
    "and have Prometheus scrape the pods another way; nothing was changed"
)
NO_GATEWAY_API_CRD = (
    "spec.rollout.traffic.router is GatewayAPI but this cluster has no HTTPRoute resource "
    f"({render.GATEWAY_API_VERSION}): install the Gateway API CRDs (and a Gateway implementation), "
    "or use router: Service; nothing was changed"
)
NO_INFERENCE_POOL_CRD = (
    "spec.rollout.traffic.backend is InferencePool but this cluster has no InferencePool resource "
    f"({render.INFERENCE_POOL_VERSION}): install the Gateway API Inference Extension's CRDs (v1.0 or "
    "later, and a gateway that implements InferencePool), or set backend: Service; nothing was changed"
)
NO_PROMETHEUS = "no Prometheus URL: set spec.rollout.metrics.prometheusUrl or run with --prometheus-url"


def _benchmark_spans(
    spec: SpeculativeDeploymentSpec, observation: Observation, now: datetime
) -> list[Window]:
    """The benchmark Jobs' runs, which the traffic windows leave out (measurement `both`), from a
    scrape interval before each Job to the scrapes that saw its last requests."""
    before, after = rollout.scrape_interval(spec), rollout.benchmark_settle(spec)
    return [
        Window(job.start - before, (job.end or now) + after)
        for job in (observation.baseline_job, observation.canary_job)
        if job is not None and job.start is not None
    ]


def prometheus_url(spec: SpeculativeDeploymentSpec) -> str | None:
    return spec.rollout.metrics.prometheus_url or default_prometheus_url()


def _observe_benchmarks(
    spec: SpeculativeDeploymentSpec,
    status: SpeculativeDeploymentStatus,
    owner: Owner,
    observation: Observation,
    now: datetime,
) -> Observation:
    """The benchmark Job of the phase's track and, once the canary's has run, its alpha in Prometheus."""
    rollout_generation = status.rollout_generation or observation.generation
    if status.phase == Phase.BASELINE:
        job = kube.benchmark_job(owner, render.benchmark_job_name(owner, Track.BASELINE, rollout_generation))
        return replace(observation, baseline_job=job)
    if status.phase != Phase.ANALYZING:
        return observation
    job = kube.benchmark_job(owner, render.benchmark_job_name(owner, Track.CANARY, rollout_generation))
    observation = replace(observation, canary_job=job)
    url = prometheus_url(spec)
    if not job.finished or job.start is None or url is None:
        return observation
    # The scrape before the Job starts the first increase; the scrapes after it end the last.
    interval = rollout.scrape_interval(spec)
    window = Window(job.start - interval, max(job.end or now, now))
    try:
        selector = _selector(spec, owner, Track.CANARY)
        windows, finished = PrometheusClient(url).job_windows(selector, window, interval.total_seconds())
    except MetricsUnavailable as exc:  # the acceptance gate waits for it, within metricsUnavailableBudget
        return replace(observation, metrics_error=str(exc))
    return replace(observation, canary_job_acceptance=windows or None, canary_job_requests=finished)


def _selector(spec: SpeculativeDeploymentSpec, owner: Owner, track: Track) -> Selector:
    return Selector(owner.namespace, owner.name, track.value, spec.rollout.metrics)


@dataclass(frozen=True)
class Adopted:
    """spec.workloadRef as read: the Deployment's pod template, its state, and an autoscaler on it."""

    source: dict[str, Any]
    workload: Workload
    autoscaler: str | None


def _adopted(spec: SpeculativeDeploymentSpec, owner: Owner) -> Adopted:
    ref = spec.workload_ref
    assert ref is not None
    body = kube.read_deployment(owner.namespace, ref.name)
    if body is None:
        raise adopt.AdoptionError(
            f"Deployment {ref.name} does not exist in namespace {owner.namespace}: specgate runs its pod "
            "template; create it, or fix workloadRef.name"
        )
    hpas, scaled_objects = kube.autoscalers(owner.namespace)
    return Adopted(
        adopt.source_template(ref, body, spec.rollout.metrics.pod_monitor),
        kube.workload_state(body),
        handover.autoscaler(ref.name, hpas, scaled_objects),
    )


def _scale_workload(
    spec: SpeculativeDeploymentSpec, owner: Owner, decision: rollout.Decision, observation: Observation
) -> None:
    """The adopted Deployment's replicas, through its scale subresource: never its template."""
    wanted, workload = decision.workload_replicas, observation.workload
    if spec.workload_ref is None or wanted is None or workload is None or wanted == workload.replicas:
        return
    kube.scale_deployment(owner.namespace, spec.workload_ref.name, wanted)


@dataclass(frozen=True)
class TrackPlan:
    """The Deployments a decision applies, rendered once: each track's manifest (the tracks it sets
    replicas for), and the tracks only scaled, their pod template kept (decision.keep_template, or
    a new template or re-render that must wait: rollout.templates_to_wait)."""

    manifests: dict[Track, Manifest]
    kept: frozenset[Track]


def plan_tracks(
    spec: SpeculativeDeploymentSpec,
    owner: Owner,
    decision: rollout.Decision,
    observation: Observation,
    source: dict[str, Any] | None = None,
) -> TrackPlan:
    """`source`: the adopted Deployment's pod template (spec.workloadRef)."""
    counts = {Track.BASELINE: decision.baseline_replicas, Track.CANARY: decision.canary_replicas}
    wanted = {track: n for track, n in counts.items() if n is not None}
    states = _tracks(observation)
    manifests = {
        track: adopt.track(spec, owner, track, n, source, states[track]) for track, n in wanted.items()
    }
    rendered = {
        track: m["metadata"]["annotations"][render.ANNOTATION_RENDERED] for track, m in manifests.items()
    }
    routed = _routed(decision, observation)
    waiting = rollout.templates_to_wait(spec, rendered, states, wanted, routed)
    unavailable = rollout.rendered_unavailable(spec, states, wanted, rendered, routed)
    manifests = {track: render.with_max_unavailable(m, unavailable[track]) for track, m in manifests.items()}
    return TrackPlan(manifests, frozenset(decision.keep_template | waiting))


def _routed(decision: rollout.Decision, observation: Observation) -> dict[Track, int] | None:
    """Each track's largest percent of the route the Gateways may send it now: as this decision sets
    it and as the rule's spec has it; while its Gateways have not accepted the rule's spec, whatever
    they accepted before may still serve, so each track as if it had all of it. None: no route
    weights the tracks."""
    route = observation.route
    if route is not None and route.hold is not None and route.written is not None:
        return {Track.BASELINE: 100, Track.CANARY: 100}
    weights = most_of(decision.route_weights, route.in_spec if route is not None else None)
    return None if weights is None else {Track.BASELINE: weights.baseline, Track.CANARY: weights.canary}


def apply_children(
    spec: SpeculativeDeploymentSpec,
    owner: Owner,
    decision: rollout.Decision,
    observation: Observation,
    plan: TrackPlan,
    children: kube.Children,
) -> None:
    """Shrinking Deployments first (their GPUs free up sooner), then the rest. A Deployment whose
    template is kept (plan.kept) is only scaled: its pods keep what they run."""
    states = _tracks(observation)
    replicas = {track: int(m["spec"]["replicas"]) for track, m in plan.manifests.items()}
    for track, n in sorted(replicas.items(), key=lambda item: item[1] >= states[item[0]].replicas):
        if track in plan.kept and states[track].exists:
            kube.scale_deployment(owner.namespace, render.deployment_name(owner, track), n, children)
        else:
            kube.apply(plan.manifests[track], children)
    for manifest in _other_children(spec, owner, decision):
        kube.apply(manifest, children)
    if decision.status.rollout_generation is not None:
        # Benchmark Jobs of earlier rollouts: their pods and results are the last rollout's.
        current = {
            render.benchmark_job_name(owner, track, decision.status.rollout_generation) for track in Track
        }
        kube.delete_benchmark_jobs(owner, keep=current)


def _named_children(spec: SpeculativeDeploymentSpec, owner: Owner) -> list[Manifest]:
    """The children besides the Deployments whose names do not change with the rollout. An adopting
    object has no Service <name>: the user's own Service serves both tracks' pods."""
    children = [] if spec.workload_ref is not None else [render.service(owner)]
    if spec.benchmarks or rollout.routes_by_weight(spec):  # a Job or the route reaches one track
        children += [render.service(owner, track) for track in Track]
    if spec.rollout.metrics.pod_monitor:
        metrics_source = spec.rollout.metrics
        children.append(
            render.pod_monitor(owner, metrics_source.scrape_interval, metrics_source.pod_monitor_labels)
        )
    return children


def _other_children(
    spec: SpeculativeDeploymentSpec, owner: Owner, decision: rollout.Decision
) -> list[Manifest]:
    children = _named_children(spec, owner)
    if decision.benchmark_track is not None:
        generation = decision.status.rollout_generation or decision.status.observed_generation or 0
        children.append(render.benchmark_job(spec, owner, decision.benchmark_track, generation))
    return children


def write_status(
    meta: Mapping[str, Any], current: SpeculativeDeploymentStatus, new: SpeculativeDeploymentStatus
) -> bool:
    """The new status, where it differs, written as of the version read (kube.write_status): False
    where the object changed since, and nothing was written."""
    if new == current:
        return True
    # None values stay in the dump: in a merge patch they delete what the last rollout left.
    return kube.write_status(meta, new.model_dump(by_alias=True, mode="json"))
