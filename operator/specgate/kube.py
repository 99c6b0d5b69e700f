"""The only module that talks to the Kubernetes API (besides kopf's own watching and its patches).

Children are written with server-side apply under one field manager, so reconciling is idempotent
and fields that other controllers own (e.g. an HPA's replicas would be) are not fought over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

import specgate
from specgate import api
from specgate.capacity import ReplicaSetState
from specgate.observation import BenchmarkJob, TrackState, Workload
from specgate.render import (
    ANNOTATION_RENDERED,
    ANNOTATION_TEMPLATE,
    GATEWAY_API_VERSION,
    INFERENCE_GROUP,
    INFERENCE_POOL_VERSION,
    LABEL_DEPLOYMENT,
    LABEL_TRACK,
    MANAGED_BY,
    VLLM_CONTAINER,
    Manifest,
    Owner,
)

log = logging.getLogger(__name__)
FIELD_MANAGER = "specgate"
# The watches' label selector: the children specgate made and their pods, and nothing else.
CHILD_SELECTOR = ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())
MONITORING_GROUP = "monitoring.coreos.com"
APPLY = "application/apply-patch+yaml"  # a JSON body is valid YAML
# The Deployment controller's note on a ReplicaSet: the Deployment's replicas + maxSurge when it last
# scaled the ReplicaSet (deploymentutil.MaxReplicasAnnotation), its base in a scaling event.
ANNOTATION_MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"

# Waiting reasons that will not clear up by themselves: the pod needs a different spec.
FATAL_WAITING_REASONS = frozenset(
    {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "InvalidImageName"}
)


# Every (API group, resource, verbs) the operator uses: this module's calls, kopf's watches of the
# objects and of their children (handlers.py), its status patches, and Events. The Helm chart grants
# exactly these (a test diffs them).
PERMISSIONS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("specgate.dev", "speculativedeployments", frozenset({"get", "list", "watch", "patch"})),
    ("specgate.dev", "speculativedeployments/status", frozenset({"get", "patch"})),
    ("apps", "deployments", frozenset({"get", "list", "watch", "create", "patch"})),
    ("apps", "deployments/scale", frozenset({"patch"})),
    # A rolling Deployment's ReplicaSets: what its next scaling event takes (capacity.scaled_ready).
    ("apps", "replicasets", frozenset({"list", "watch"})),
    ("", "services", frozenset({"get", "list", "watch", "create", "patch"})),
    ("", "pods", frozenset({"list", "watch"})),
    ("", "pods/log", frozenset({"get"})),  # a crashed container's last lines, on failure only
    ("batch", "jobs", frozenset({"get", "list", "create", "delete"})),
    ("", "events", frozenset({"create"})),
    ("events.k8s.io", "events", frozenset({"create"})),
    ("monitoring.coreos.com", "podmonitors", frozenset({"get", "create", "patch"})),
    ("gateway.networking.k8s.io", "httproutes", frozenset({"get", "create", "patch"})),  # router GatewayAPI
    (INFERENCE_GROUP, "inferencepools", frozenset({"get", "create", "patch"})),  # backend InferencePool
    # spec.workloadRef: an autoscaler on the adopted Deployment would fight the hand-over
    ("autoscaling", "horizontalpodautoscalers", frozenset({"list"})),
    ("keda.sh", "scaledobjects", frozenset({"list"})),
    # Peering (several replicas, one acting): kopf's heartbeats in the peering object's status.
    ("kopf.dev", "kopfpeerings", frozenset({"get", "list", "watch", "patch"})),
    # kopf lists and watches namespaces (to resolve what it watches) and CRDs (to notice new
    # resources): cluster scope, even when it watches a list of namespaces.
    ("", "namespaces", frozenset({"list", "watch"})),
    ("apiextensions.k8s.io", "customresourcedefinitions", frozenset({"list", "watch"})),
    ("kopf.dev", "clusterkopfpeerings", frozenset({"get", "list", "watch", "patch"})),
)


def load_config() -> None:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    _API.clear()


USER_AGENT = f"specgate/{specgate.__version__}"  # how the API server's audit log names our requests
_API: list[client.ApiClient] = []


def _api() -> client.ApiClient:
    """One client for every call: one connection pool (a client per call opened a connection per
    call), made after load_config so that it carries the configuration loaded."""
    if not _API:
        _API.append(client.ApiClient())
        _API[0].user_agent = USER_AGENT
    return _API[0]


def warm_up() -> None:
    """Open the client's first connection now (the TLS handshake and certificate loading take most
    of a second): the first object created after a start does not wait for it."""
    try:
        serves_pod_monitors()
    except (ApiException, OSError) as exc:  # the reconciles report it, with the object it concerns
        log.warning("the API server did not answer at start: %s", exc)


ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def may_list_and_watch(group: str, resource: str, namespaces: Sequence[str]) -> bool:
    """Whether this process's RBAC lets it list and watch `resource` in each of `namespaces` ("":
    cluster-wide), as SelfSubjectAccessReviews answer (every authenticated user may ask). An API
    server that does not answer counts as yes: kopf's own watches then report what is wrong."""
    for namespace in namespaces:
        for verb in ("list", "watch"):
            attributes = {"group": group, "resource": resource, "verb": verb, "namespace": namespace}
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview"}
            try:
                answer = _request(
                    "POST", ACCESS_REVIEWS, review | {"spec": {"resourceAttributes": attributes}}
                )
            except (ApiException, OSError) as exc:
                log.warning("could not ask whether %s may be watched: %s", resource, exc)
                return True
            if not (answer.get("status") or {}).get("allowed"):
                return False
    return True


def _custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(_api())


DEPLOYMENT = "/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
SERVICE = "/api/v1/namespaces/{namespace}/services/{name}"
JOBS = "/apis/batch/v1/namespaces/{namespace}/jobs"
JOB = JOBS + "/{name}"
PODS = "/api/v1/namespaces/{namespace}/pods"
POD_MONITOR = f"/apis/{MONITORING_GROUP}/v1/namespaces/{{namespace}}/podmonitors/{{name}}"
HTTP_ROUTE = f"/apis/{GATEWAY_API_VERSION}/namespaces/{{namespace}}/httproutes/{{name}}"
INFERENCE_POOL = f"/apis/{INFERENCE_POOL_VERSION}/namespaces/{{namespace}}/inferencepools/{{name}}"
HPAS = "/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers"
SCALED_OBJECTS = "/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects"  # KEDA, where installed
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
CHILD_PATHS = {
    "Deployment": DEPLOYMENT,
    "Service": SERVICE,
    "Job": JOB,
    "PodMonitor": POD_MONITOR,
    "HTTPRoute": HTTP_ROUTE,
    "InferencePool": INFERENCE_POOL,
}


def _request(
    method: str,
    path: str,
    body: object = None,
    *,
    content_type: str | None = None,
    query: Mapping[str, str | bool | int] | None = None,
    **path_params: str,
) -> dict[str, Any]:
    """One API call through the shared client, its answer as plain JSON. Not the client's typed
    methods: their argument validation builds the pydantic models of their whole signature (some
    300 classes for a Deployment and a Service, or a pod's log: 25 MB of the operator's memory on
    first use) and they validate every answer into models, of which the operator reads a field or
    two."""
    answer = _call(method, path, path_params, body, content_type=content_type, query=query)
    return cast(dict[str, Any], json.loads(answer or b"{}"))


def _call(
    method: str,
    path: str,
    path_params: Mapping[str, str],
    body: object = None,
    *,
    content_type: str | None = None,
    query: Mapping[str, str | bool | int] | None = None,
    timeout: float | None = None,
) -> bytes:
    """_request's call, its answer's bytes; ApiException on an HTTP error status."""
    api_client = _api()
    headers = {"Accept": "application/json"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    request = api_client.param_serialize(
        method=method,
        resource_path=path,
        path_params=path_params,
        query_params=list((query or {}).items()),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*request, _request_timeout=timeout)
    response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.data or b""


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def current_namespace() -> str:
    """The namespace kubectl would use: the kubeconfig's current context's, else the pod's own
    (in a cluster), else "default"."""
    try:
        _, context = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        if SERVICE_ACCOUNT_NAMESPACE.exists():
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        return "default"
    return str(context.get("context", {}).get("namespace") or "default")


# What this process knows of children, by (owner uid, kind, namespace, name): ones seen to carry
# their owner's reference (an object loses its owner only by an edit), ones seen absent and when (a
# name taken later is still refused when a child is written, see apply), and the write that left
# each as it is.
ChildKey = tuple[str, str, str, str]
_OWNED: set[ChildKey] = set()
_FREE: dict[ChildKey, float] = {}  # when it was seen absent (time.monotonic)
_APPLIED: dict[ChildKey, tuple[str, str | None]] = {}  # manifest digest, generation or resourceVersion
_CLEANED: set[tuple[str, frozenset[str]]] = set()  # (owner uid, the Jobs kept): old Jobs deleted
FRESH_SECONDS = 10.0  # a name seen free this recently is not read again before it is written


class ForeignChild(Exception):
    """A child's name is taken by an object this SpeculativeDeployment did not create."""


def foreign_children(manifests: list[Manifest], owner_uid: str, fresh: bool = False) -> list[str]:
    """The children that exist already without an ownerReference to owner_uid, described: a
    Service someone else made under the same name must not be taken over (nor its selector).
    Each is read once per process (fresh: absent ones again unless seen so just now)."""
    foreign = []
    for manifest in manifests:
        key = _child_key(manifest, owner_uid)
        seen_free = _FREE.get(key)
        if key in _OWNED or (seen_free and (not fresh or time.monotonic() - seen_free < FRESH_SECONDS)):
            continue
        _, kind, namespace, name = key
        owners = _owner_uids(kind, namespace, name)
        if owners is None:
            _FREE[key] = time.monotonic()
        elif owner_uid in owners:
            _OWNED.add(key)
        else:
            _FREE.pop(key, None)
            foreign.append(_foreign(kind, namespace, name))
    return foreign


def _foreign(kind: str, namespace: str, name: str) -> str:
    return f"{kind} {namespace}/{name} (not created by this SpeculativeDeployment)"


def forget(owner_uid: str) -> None:
    """Drop what this process knew of a deleted SpeculativeDeployment's children."""
    _OWNED.difference_update({key for key in _OWNED if key[0] == owner_uid})
    _CLEANED.difference_update({done for done in _CLEANED if done[0] == owner_uid})
    _KNOWN_VERSIONS.pop(owner_uid, None)
    for known in (_FREE, _APPLIED):
        for key in [key for key in known if key[0] == owner_uid]:
            del known[key]


DISCOVERY_SECONDS = 60.0  # one discovery read a minute per API group, whatever the number of objects
_DISCOVERED: dict[str, tuple[float, bool]] = {}


def serves(group_version: str, plural: str) -> bool:
    """Whether the API server serves `plural` in `group_version` (its CRD is installed), by
    discovery, which every authenticated client may read."""
    now = time.monotonic()
    key = f"{group_version}/{plural}"
    if key in _DISCOVERED and now - _DISCOVERED[key][0] < DISCOVERY_SECONDS:
        return _DISCOVERED[key][1]
    try:
        found = _request("GET", f"/apis/{group_version}")
        served = any(resource.get("name") == plural for resource in found.get("resources") or [])
    except ApiException as exc:
        if exc.status != 404:
            raise
        served = False
    _DISCOVERED[key] = (now, served)
    return served


def serves_pod_monitors() -> bool:
    """Whether the Prometheus Operator's CRDs are installed."""
    return serves(f"{MONITORING_GROUP}/v1", "podmonitors")


def serves_http_routes() -> bool:
    """Whether Gateway API's CRDs are installed."""
    return serves(GATEWAY_API_VERSION, "httproutes")


def serves_inference_pools() -> bool:
    """Whether the Gateway API Inference Extension's InferencePool CRD (v1) is installed."""
    return serves(INFERENCE_POOL_VERSION, "inferencepools")


def _child_key(manifest: Manifest, owner_uid: str) -> ChildKey:
    meta = manifest["metadata"]
    return owner_uid, manifest["kind"], meta["namespace"], meta["name"]


def _owner_uids(kind: str, namespace: str, name: str) -> set[str] | None:
    """The uids in the object's ownerReferences; None when it (or its resource, for a PodMonitor
    without the Prometheus Operator's CRD) does not exist."""
    try:
        obj = _request("GET", CHILD_PATHS[kind], namespace=namespace, name=name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {ref["uid"] for ref in obj["metadata"].get("ownerReferences") or []}


def apply(manifest: Manifest, children: Children | None = None) -> None:
    """Create or update one child by server-side apply, unless this process wrote the same manifest
    and the watch shows the child unchanged since (idle objects cost the API server nothing).

    Force takes over fields other managers set (replicas set through the scale subresource, say):
    only on a child that is ours or absent; someone else's object raises ForeignChild."""
    meta = manifest["metadata"]
    name, namespace, kind = meta["name"], meta["namespace"], manifest["kind"]
    key = _child_key(manifest, meta["ownerReferences"][0]["uid"])
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    # An HTTPRoute or InferencePool is not watched, so nothing would show that it was deleted or
    # edited since this process wrote it: handlers read it every reconcile and apply it only where
    # it differs.
    unwatched = kind in ("Job", "HTTPRoute", "InferencePool")
    if not unwatched and _APPLIED.get(key) == (digest, _written_as(children or Children(), key)):
        return
    if foreign_children([manifest], key[0], fresh=True):
        raise ForeignChild(_foreign(kind, namespace, name))
    written: str | None = None
    if kind == "Job":  # immutable once created; its name carries the generation it measures
        try:
            _request("POST", JOBS, manifest, query={"fieldManager": FIELD_MANAGER}, namespace=namespace)
        except ApiException as exc:
            if exc.status != 409:
                raise
    elif kind in CHILD_PATHS:  # a PodMonitor is not watched: written again after a change or a restart
        applied: dict[str, str | bool] = {"fieldManager": FIELD_MANAGER, "force": True}
        answer = _request(
            "PATCH",
            CHILD_PATHS[kind],
            manifest,
            content_type=APPLY,
            query=applied,
            namespace=namespace,
            name=name,
        )
        written = _write_mark(kind, answer["metadata"])
    else:
        raise ValueError(f"specgate does not manage {kind} objects")
    _APPLIED[key] = (digest, written)


def _write_mark(kind: str, meta: Mapping[str, Any]) -> str | None:
    """What a write left that the watch will show (see _written_as): a Deployment's generation, a
    Service's resourceVersion; None for what is not watched."""
    if kind == "Deployment":
        return str(meta["generation"])
    if kind == "Service":
        return str(meta["resourceVersion"])
    return None


def _written_as(children: Children, key: ChildKey) -> str | None:
    """The watched child's generation (Deployment) or resourceVersion (Service), to compare with
    what this process's last write left; None for what is not watched."""
    _, kind, namespace, name = key
    if kind == "Deployment":
        dep = children.deployment(namespace, name)
        return str(dep.generation) if dep else "absent"
    if kind == "Service":
        return children.service_version(namespace, name) or "absent"
    return None


def scale_deployment(namespace: str, name: str, replicas: int, children: Children | None = None) -> None:
    """Change only the replicas (the scale subresource): the pod template stays as it is."""
    dep = (children or Children()).deployment(namespace, name)
    if dep is None or dep.replicas != replicas:
        scale = {"spec": {"replicas": replicas}}
        _request(
            "PATCH", DEPLOYMENT + "/scale", scale, content_type=MERGE_PATCH, namespace=namespace, name=name
        )


@dataclass(frozen=True)
class DeploymentView:
    """What the operator reads of a child Deployment, kept from the watch."""

    replicas: int
    ready_replicas: int
    template: str | None  # ANNOTATION_TEMPLATE: the template it asks for
    generation: int  # bumped by every change of its spec: ours, or anyone's
    rendered: str | None = None  # ANNOTATION_RENDERED
    rolling: bool = False


@dataclass(frozen=True)
class PodView:
    """What the operator reads of a child pod, kept from the watch."""

    name: str
    template: str | None
    ready: bool  # Ready and not being deleted
    failure: str | None
    unscheduled: str | None
    crashed: bool  # its container has ended at least once: a previous log may exist


@dataclass(frozen=True)
class Children:
    """The children as the watches last saw them (kopf indexes, filled before the first reconcile):
    Deployments and Services by (namespace, name), pods and ReplicaSets by (namespace, owner's name,
    track)."""

    deployments: Mapping[tuple[str, str], Collection[DeploymentView]] = field(default_factory=dict)
    services: Mapping[tuple[str, str], Collection[str]] = field(default_factory=dict)  # resourceVersions
    pods: Mapping[tuple[str, str, str], Collection[PodView]] = field(default_factory=dict)
    replica_sets: Mapping[tuple[str, str, str], Collection[ReplicaSetState]] = field(default_factory=dict)

    def deployment(self, namespace: str, name: str) -> DeploymentView | None:
        return next(iter(self.deployments.get((namespace, name), ())), None)

    def service_version(self, namespace: str, name: str) -> str | None:
        return next(iter(self.services.get((namespace, name), ())), None)


def deployment_view(body: Mapping[str, Any]) -> DeploymentView:
    meta, status = body.get("metadata", {}), body.get("status") or {}
    annotations, generation = meta.get("annotations") or {}, int(meta.get("generation") or 0)
    return DeploymentView(
        replicas=int((body.get("spec") or {}).get("replicas") or 0),
        ready_replicas=int(status.get("readyReplicas") or 0),
        template=annotations.get(ANNOTATION_TEMPLATE),
        generation=generation,
        rendered=annotations.get(ANNOTATION_RENDERED),
        # As `kubectl rollout status` reads it: the controller has not seen the last change yet, or
        # pods of an older ReplicaSet remain (a scale-up alone leaves none).
        rolling=int(status.get("observedGeneration") or 0) < generation
        or int(status.get("replicas") or 0) > int(status.get("updatedReplicas") or 0),
    )


def workload_state(body: Mapping[str, Any] | None) -> Workload:
    """An adopted Deployment (spec.workloadRef) from its body as read (None: not found)."""
    if body is None:
        return Workload()
    view = deployment_view(body)
    pods = int((body.get("status") or {}).get("replicas") or 0)
    return Workload(True, view.replicas, view.ready_replicas, view.rolling, pods)


def pod_view(body: Mapping[str, Any]) -> PodView:
    meta, status = body.get("metadata", {}), body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return PodView(
        name=meta.get("name", ""),
        template=(meta.get("annotations") or {}).get(ANNOTATION_TEMPLATE),
        ready=ready and meta.get("deletionTimestamp") is None,
        failure=_pod_failure(body),
        unscheduled=_pod_unscheduled(body),
        crashed=any(
            (cs.get("lastState") or {}).get("terminated") for cs in status.get("containerStatuses") or []
        ),
    )


def replica_set_view(body: Mapping[str, Any]) -> ReplicaSetState:
    """A ReplicaSet as its Deployment's next scaling event reads it (its labels are its pods')."""
    meta, status = body.get("metadata", {}), body.get("status") or {}
    annotated = (meta.get("annotations") or {}).get(ANNOTATION_MAX_REPLICAS)
    created = api.parse_time(meta.get("creationTimestamp"))
    return ReplicaSetState(
        replicas=int((body.get("spec") or {}).get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        max_replicas=int(annotated) if annotated and str(annotated).isdigit() else None,
        # One form of the time, so that the strings sort as the times do.
        created=f"{api.iso(created) if created else ''} {meta.get('name') or ''}",
    )


def pods_key(namespace: str, labels: Mapping[str, str]) -> tuple[str, str, str]:
    return namespace, labels.get(LABEL_DEPLOYMENT, ""), labels.get(LABEL_TRACK, "")


def track_state(children: Children, namespace: str, name: str, selector: dict[str, str]) -> TrackState:
    """The Deployment's replica counts and the first fatal reason among its pods, as watched."""
    dep = children.deployment(namespace, name)
    if dep is None:
        return TrackState()
    pods = children.pods.get(pods_key(namespace, selector), ())
    failing = next((p for p in pods if p.failure), None)
    return TrackState(
        exists=True,
        replicas=dep.replicas,
        ready_replicas=_ready_on_template(pods, dep),
        serving_ready=sum(1 for pod in pods if pod.ready) if dep.template is not None else None,
        failure=f"{failing.failure}{_last_log_lines(namespace, failing)}" if failing else None,
        waiting=next((p.unscheduled for p in pods if p.unscheduled), None),
        template_hash=dep.template,
        rendered=dep.rendered,
        rolling=dep.rolling,
        replica_sets=tuple(
            rs for rs in children.replica_sets.get(pods_key(namespace, selector), ()) if rs.replicas
        ),
    )


def track_state_now(namespace: str, name: str, selector: dict[str, str]) -> TrackState:
    """track_state read from the API server now, not from the watches' cache: on a loaded API server
    the cache can lag a pod's deletion or its readiness by tens of seconds, counting as Ready a pod
    that has gone (what a shrink must not count on)."""
    body = read_deployment(namespace, name)
    if body is None:
        return TrackState()
    labels = ",".join([CHILD_SELECTOR, *(f"{k}={v}" for k, v in sorted(selector.items()))])
    items = _request("GET", PODS, query={"labelSelector": labels}, namespace=namespace).get("items") or []
    now = Children(
        deployments={(namespace, name): [deployment_view(body)]},
        pods={pods_key(namespace, selector): [pod_view(item) for item in items]},
    )
    return track_state(now, namespace, name, selector)


def _ready_on_template(pods: Collection[PodView], dep: DeploymentView) -> int:
    """Ready pods that run the Deployment's current template and are not going away: during a
    rolling update readyReplicas still counts the old template's pods, which are not what was
    asked for (and not what is being measured)."""
    if dep.template is None:  # a Deployment from before template hashes
        return dep.ready_replicas
    return sum(1 for pod in pods if pod.ready and pod.template == dep.template)


def delete_benchmark_jobs(owner: Owner, keep: set[str]) -> None:
    """Delete the owner's benchmark Jobs (and, in the background, their pods) but those in keep;
    once per rollout: only the rollout's own Jobs are ever created after."""
    done = (owner.uid, frozenset(keep))
    if done in _CLEANED:
        return
    selector = {"labelSelector": f"{LABEL_DEPLOYMENT}={owner.name}"}
    for job in _request("GET", JOBS, query=selector, namespace=owner.namespace).get("items") or []:
        meta = job["metadata"]
        if meta["name"] in keep or meta.get("deletionTimestamp") is not None:
            continue
        if any(ref["uid"] == owner.uid for ref in meta.get("ownerReferences") or []):
            background = {"propagationPolicy": "Background"}
            try:
                _request("DELETE", JOB, query=background, namespace=owner.namespace, name=meta["name"])
            except ApiException as exc:
                if exc.status != 404:
                    raise
    _CLEANED.add(done)


def benchmark_job(owner: Owner, name: str) -> BenchmarkJob:
    """The Job's outcome and its pod's termination message (the driver's report). A Job of that
    name that another object owns (one of an earlier object of the same name, orphaned) raises
    ForeignChild: its report is not this rollout's measurement."""
    namespace = owner.namespace
    try:
        job = _request("GET", JOB, namespace=namespace, name=name)
    except ApiException as exc:
        if exc.status == 404:
            return BenchmarkJob(name)
        raise
    if owner.uid not in {ref["uid"] for ref in job["metadata"].get("ownerReferences") or []}:
        raise ForeignChild(_foreign("Job", namespace, name))
    status = job.get("status") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or [] if c.get("status") == "True"}
    job_pods = {"labelSelector": f"job-name={name}"}
    pods = _request("GET", PODS, query=job_pods, namespace=namespace).get("items") or []
    terminated = next(filter(None, map(_terminated, pods)), None)
    failure = next((f for f in map(_pod_failure, pods) if f), None)
    if "Failed" in conditions:
        failed = conditions["Failed"]
        failure = f"Job {failed.get('reason')}: {failed.get('message') or ''}".strip()
    return BenchmarkJob(
        name,
        exists=True,
        finished=bool({"Complete", "Failed"} & set(conditions)) or failure is not None,
        failure=failure,
        report=terminated.get("message") if terminated is not None else None,
        start=api.parse_time(status.get("startTime")),
        end=api.parse_time(status.get("completionTime")),
    )


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return (
        cast(Mapping[str, Any] | None, (statuses[0].get("state") or {}).get("terminated"))
        if statuses
        else None
    )


def _pod_failure(pod: Mapping[str, Any]) -> str | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING_REASONS:
            name = pod["metadata"]["name"]
            failure = f"pod {name}: {waiting['reason']}: {waiting.get('message') or ''}".strip()
            return failure + _last_exit(cs)
    return None


LAST_MESSAGE_CHARS = 300  # of the container's termination message: status and Events stay short


def _last_exit(container_status: Mapping[str, Any]) -> str:
    """How the container last ended (exit code, reason such as OOMKilled, its termination message):
    kept in status and the rollback's Event, it outlives the pods the rollback deletes."""
    last = (container_status.get("lastState") or {}).get("terminated")
    if not last:
        return ""
    message = " ".join((last.get("message") or "").split())[-LAST_MESSAGE_CHARS:]
    ended = f"; last exit {last.get('exitCode')} ({last.get('reason') or 'unknown'})"
    return ended + (f": {message}" if message else "")


LAST_LOG_LINES = 5  # the end of a crashed vLLM's log: the exception it died of, usually
LAST_LOG_CHARS = 400  # status and Events stay short (kopf cuts an Event at 1024)
# (namespace, pod, failure) -> the lines read: one API call per crash, not one per reconcile.
_LAST_LOGS: dict[tuple[str, str, str], str] = {}


def _last_log_lines(namespace: str, pod: PodView) -> str:
    """The last lines the crashed container logged, kept in status and the rollback's Event: the pod
    and its log are gone once the rollback scales the track down. Read on failure only."""
    if not pod.crashed or pod.failure is None:
        return ""
    key = (namespace, pod.name, pod.failure)
    if key not in _LAST_LOGS:
        if len(_LAST_LOGS) > 1000:
            _LAST_LOGS.clear()
        _LAST_LOGS[key] = _read_previous_log(namespace, pod.name)
    return _LAST_LOGS[key]


def _read_previous_log(namespace: str, pod: str) -> str:
    try:
        previous: dict[str, str | bool | int] = {
            "container": VLLM_CONTAINER,
            "previous": True,
            "tailLines": LAST_LOG_LINES,
        }
        where = {"namespace": namespace, "name": pod}
        answer = _call("GET", PODS + "/{name}/log", where, query=previous, timeout=5)
    except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:  # e.g. the kubelet keeps no log
        log.info("no previous log of pod %s/%s: %s", namespace, pod, getattr(exc, "reason", exc))
        return ""
    text = answer.decode(errors="replace")
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    return f"; its last log lines: {' | '.join(lines)[-LAST_LOG_CHARS:]}" if lines else ""


def _pod_unscheduled(pod: Mapping[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            name = pod["metadata"]["name"]
            return f"pod {name}: {cond.get('reason')}: {cond.get('message') or ''}".strip()
    return None


# Per object (uid): the resourceVersion this process last wrote its status at, or read it fresh at.
_KNOWN_VERSIONS: dict[str, str] = {}
_STALE = ""  # no object has this version: the next reconcile reads the object again


def current_object(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object as the API server holds it now. kopf's timer hands over the watch's last copy,
    which under a loaded API server lags behind the status this process wrote: decided on, a copy
    two writes old wrote its old status back (the lab's fifty rollouts went from Canary back to
    Baseline and measured it again). A copy at another version than the one this process last wrote
    or read is read again; the first copy after a start is the watch's fresh list."""
    meta = body["metadata"]
    known = _KNOWN_VERSIONS.get(meta["uid"])
    if known is None or known == meta["resourceVersion"]:
        return body
    try:
        fresh = get_speculative_deployment(meta["namespace"], meta["name"])
    except ApiException as exc:
        if exc.status == 404:  # deleted: kopf's watch ends its timer
            return body
        raise
    _KNOWN_VERSIONS[meta["uid"]] = fresh["metadata"]["resourceVersion"]
    return fresh


def write_status(meta: Mapping[str, Any], status: dict[str, Any]) -> bool:
    """Merge-patch the object's status as of the version `meta` was read at (its resourceVersion in
    the patch is the API server's precondition); False, with nothing written, where the object
    changed since: the next reconcile reads it again and decides on it."""
    body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
    try:  # a dict body goes as a merge patch, as annotate's does
        written = cast(
            dict[str, Any],
            _custom().patch_namespaced_custom_object_status(
                api.GROUP, api.VERSION, meta["namespace"], api.PLURAL, meta["name"], body
            ),
        )
    except ApiException as exc:
        _KNOWN_VERSIONS[meta["uid"]] = _STALE  # a 5xx may have written it: read what there is
        if exc.status == 409:
            return False
        raise
    _KNOWN_VERSIONS[meta["uid"]] = written["metadata"]["resourceVersion"]
    return True


def get_speculative_deployment(namespace: str, name: str) -> dict[str, Any]:
    obj = _custom().get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    return cast(dict[str, Any], obj)


class Conflict(Exception):
    """The object changed since it was read."""


def annotate(namespace: str, name: str, changes: dict[str, str | None], resource_version: str) -> None:
    """Set (None: remove) annotations of a SpeculativeDeployment, as of the version that was read:
    a concurrent change raises Conflict rather than being overwritten."""
    body = {"metadata": {"annotations": changes, "resourceVersion": resource_version}}
    try:
        _custom().patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name, body)
    except ApiException as exc:
        if exc.status == 409:
            raise Conflict(str(exc.reason)) from exc
        raise


def read_route(namespace: str, name: str) -> dict[str, Any] | None:
    """The HTTPRoute as the API server has it (spec and its Gateways' status); None when absent."""
    return _read(HTTP_ROUTE, namespace, name)


def read_inference_pool(namespace: str, name: str) -> dict[str, Any] | None:
    """The InferencePool as the API server has it (spec and its Gateways' status); None when absent."""
    return _read(INFERENCE_POOL, namespace, name)


def read_deployment(namespace: str, name: str) -> dict[str, Any] | None:
    """A Deployment specgate does not own (spec.workloadRef), as the API server has it; None when absent."""
    return _read(DEPLOYMENT, namespace, name)


def autoscalers(namespace: str) -> tuple[list[Manifest], list[Manifest]]:
    """The namespace's HorizontalPodAutoscalers and KEDA ScaledObjects (none where KEDA is absent)."""
    hpas = _request("GET", HPAS, namespace=namespace).get("items") or []
    try:
        scaled = _request("GET", SCALED_OBJECTS, namespace=namespace).get("items") or []
    except ApiException as exc:
        if exc.status != 404:
            raise
        scaled = []
    return hpas, scaled


def _read(path: str, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return _request("GET", path, namespace=namespace, name=name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


class Invalid(Exception):
    """The API server's validation (the CRD's schema or CEL rules) refused the object as patched."""


def service_exists(namespace: str, name: str) -> bool:
    """Whether Service namespace/name exists (a backend a rule is about to be pointed back at)."""
    try:
        _request("GET", SERVICE, namespace=namespace, name=name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def patch_route(namespace: str, name: str, operations: list[dict[str, Any]]) -> None:
    """Apply a JSON patch (render.rule_patch) to a user's HTTPRoute. Conflict when its test ops
    fail: the route's rules moved since it was read, and the next reconcile reads it again. Invalid,
    with the API server's message, where the route as patched fails its validation: both are 422."""
    try:
        _request("PATCH", HTTP_ROUTE, operations, content_type=JSON_PATCH, namespace=namespace, name=name)
    except ApiException as exc:
        refused = _validation_message(exc) if exc.status == 422 else None
        if refused is not None:
            raise Invalid(refused) from exc
        if exc.status in (409, 422):
            raise Conflict(f"HTTPRoute {namespace}/{name} changed since it was read: {exc.reason}") from exc
        raise


def _validation_message(exc: ApiException) -> str | None:
    """A 422's message where validation refused the object (its Status names the object and the
    fields); None where the JSON patch itself could not apply (a failed test, a path that is gone:
    the API server answers those with one UnexpectedServerResponse cause and no name)."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return None
    details = body.get("details") if isinstance(body, dict) else None
    if not isinstance(details, dict):
        return None
    causes = details.get("causes") or []
    if not details.get("name") or any(c.get("type") == "UnexpectedServerResponse" for c in causes):
        return None
    return str(body.get("message") or exc.reason)


def speculative_deployment_names(namespace: str) -> list[str]:
    listed = _custom().list_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, _request_timeout=5
    )
    return [item["metadata"]["name"] for item in cast(dict[str, Any], listed)["items"]]
