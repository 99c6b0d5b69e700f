"""The only module that talks to the Kubernetes API (besides kopf's own watching and status patches).

Children are written with server-side apply under one field manager, so reconciling is idempotent
and fields that other controllers own (e.g. an HPA's replicas would be) are not fought over.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from specgate import api
from specgate.observation import BenchmarkJob, TrackState
from specgate.render import ANNOTATION_TEMPLATE, LABEL_DEPLOYMENT, Manifest, Owner

FIELD_MANAGER = "specgate"
MONITORING_GROUP = "monitoring.coreos.com"
APPLY = "application/apply-patch+yaml"  # a JSON body is valid YAML

# Waiting reasons that will not clear up by themselves: the pod needs a different spec.
FATAL_WAITING_REASONS = frozenset(
    {"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "InvalidImageName"}
)


# Every (API group, resource, verbs) the operator uses: this module's calls, kopf's watch of the
# objects and its status patches, and Events. The Helm chart grants exactly these (a test diffs them).
PERMISSIONS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("specgate.dev", "speculativedeployments", frozenset({"get", "list", "watch", "patch"})),
    ("specgate.dev", "speculativedeployments/status", frozenset({"get", "patch"})),
    ("apps", "deployments", frozenset({"get", "create", "patch"})),
    ("apps", "deployments/scale", frozenset({"patch"})),
    ("", "services", frozenset({"get", "create", "patch"})),
    ("", "pods", frozenset({"list"})),
    ("batch", "jobs", frozenset({"get", "list", "create", "delete"})),
    ("", "events", frozenset({"create"})),
    ("events.k8s.io", "events", frozenset({"create"})),
    ("monitoring.coreos.com", "podmonitors", frozenset({"get", "create", "patch"})),
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


# Children seen to carry their owner's reference: (kind, namespace, name, owner uid). An object
# cannot lose its owner but by an edit, so each is checked once per process; absent ones each time.
_OWNED: set[tuple[str, str, str, str]] = set()


def foreign_children(manifests: list[Manifest], owner_uid: str) -> list[str]:
    """The children that exist already without an ownerReference to owner_uid, described: a
    Service someone else made under the same name must not be taken over (nor its selector)."""
    foreign = []
    for manifest in manifests:
        key = _owned_key(manifest, owner_uid)
        if key in _OWNED:
            continue
        kind, namespace, name, _ = key
        owners = _owner_uids(kind, namespace, name)
        if owners is None:
            continue
        if owner_uid in owners:
            _OWNED.add(key)
        else:
            foreign.append(f"{kind} {namespace}/{name} (not created by this SpeculativeDeployment)")
    return foreign


def serves_pod_monitors() -> bool:
    """Whether the API server serves PodMonitors (the Prometheus Operator's CRDs are installed), by
    discovery, which every authenticated client may read."""
    try:
        found = client.CustomObjectsApi().get_api_resources(MONITORING_GROUP, "v1")
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(resource.name == "podmonitors" for resource in found.resources)


def _owned_key(manifest: Manifest, owner_uid: str) -> tuple[str, str, str, str]:
    meta = manifest["metadata"]
    return manifest["kind"], meta["namespace"], meta["name"], owner_uid


def _owner_uids(kind: str, namespace: str, name: str) -> set[str] | None:
    """The uids in the object's ownerReferences; None when it (or its resource, for a PodMonitor
    without the Prometheus Operator's CRD) does not exist."""
    try:
        if kind == "PodMonitor":
            obj = client.CustomObjectsApi().get_namespaced_custom_object(
                MONITORING_GROUP, "v1", namespace, "podmonitors", name
            )
            return {ref["uid"] for ref in cast(dict[str, Any], obj)["metadata"].get("ownerReferences") or []}
        readers: dict[str, Callable[[str, str], Any]] = {
            "Deployment": client.AppsV1Api().read_namespaced_deployment,
            "Service": client.CoreV1Api().read_namespaced_service,
            "Job": client.BatchV1Api().read_namespaced_job,
        }
        refs = readers[kind](name, namespace).metadata.owner_references or []
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {ref.uid for ref in refs}


def apply(manifest: Manifest) -> None:
    """Create or update one child by server-side apply.

    Force takes over fields other managers set (replicas set through the scale subresource, say):
    only on a child that is ours or absent. On someone else's object a conflict is an error instead
    (the caller is expected to have refused it already, see foreign_children)."""
    meta = manifest["metadata"]
    name, namespace, kind = meta["name"], meta["namespace"], manifest["kind"]
    force = not foreign_children([manifest], meta["ownerReferences"][0]["uid"])
    common: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force": force, "_content_type": APPLY}
    if kind == "Deployment":
        client.AppsV1Api().patch_namespaced_deployment(name, namespace, manifest, **common)
    elif kind == "Service":
        client.CoreV1Api().patch_namespaced_service(name, namespace, manifest, **common)
    elif kind == "Job":  # immutable once created; its name carries the generation it measures
        try:
            client.BatchV1Api().create_namespaced_job(
                namespace, cast(Any, manifest), field_manager=FIELD_MANAGER
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
    elif kind == "PodMonitor":
        client.CustomObjectsApi().patch_namespaced_custom_object(
            MONITORING_GROUP, "v1", namespace, "podmonitors", name, manifest, **common
        )
    else:
        raise ValueError(f"specgate does not manage {kind} objects")


def scale_deployment(namespace: str, name: str, replicas: int) -> None:
    """Change only the replicas (the scale subresource): the pod template stays as it is."""
    client.AppsV1Api().patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}})


def track_state(namespace: str, name: str, selector: dict[str, str]) -> TrackState:
    """The Deployment's replica counts and the first fatal reason among its pods."""
    try:
        dep = client.AppsV1Api().read_namespaced_deployment(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return TrackState()
        raise
    label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    pods = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=label_selector).items
    template = ((dep.metadata and dep.metadata.annotations) or {}).get(ANNOTATION_TEMPLATE)
    return TrackState(
        exists=True,
        replicas=dep.spec.replicas or 0,
        ready_replicas=_ready_on_template(pods, template, dep),
        failure=next((f for f in map(_pod_failure, pods) if f), None),
        waiting=next((w for w in map(_pod_unscheduled, pods) if w), None),
        template_hash=template,
    )


def _ready_on_template(pods: list[Any], template: str | None, dep: Any) -> int:
    """Ready pods that run the Deployment's current template and are not going away: during a
    rolling update readyReplicas still counts the old template's pods, which are not what was
    asked for (and not what is being measured)."""
    if template is None:  # a Deployment from before template hashes
        return (dep.status.ready_replicas or 0) if dep.status else 0
    return sum(
        1
        for pod in pods
        if pod.metadata.deletion_timestamp is None
        and (pod.metadata.annotations or {}).get(ANNOTATION_TEMPLATE) == template
        and any(
            c.type == "Ready" and c.status == "True" for c in ((pod.status and pod.status.conditions) or [])
        )
    )


def delete_benchmark_jobs(owner: Owner, keep: set[str]) -> None:
    """Delete the owner's benchmark Jobs (and, in the background, their pods) but those in keep."""
    batch = client.BatchV1Api()
    jobs = batch.list_namespaced_job(owner.namespace, label_selector=f"{LABEL_DEPLOYMENT}={owner.name}").items
    for job in jobs:
        meta = job.metadata
        if meta is None or meta.name is None or meta.name in keep or meta.deletion_timestamp is not None:
            continue
        if any(ref.uid == owner.uid for ref in (meta.owner_references or [])):
            try:
                batch.delete_namespaced_job(meta.name, owner.namespace, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise


def benchmark_job(namespace: str, name: str) -> BenchmarkJob:
    """The Job's outcome and its pod's termination message (the driver's report)."""
    try:
        job = client.BatchV1Api().read_namespaced_job(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return BenchmarkJob(name)
        raise
    status = job.status or client.V1JobStatus()
    conditions = {c.type: c for c in (status.conditions or []) if c.status == "True"}
    pods = client.CoreV1Api().list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
    terminated = next(filter(None, map(_terminated, pods)), None)
    failure = next((f for f in map(_pod_failure, pods) if f), None)
    if "Failed" in conditions:
        failed = conditions["Failed"]
        failure = f"Job {failed.reason}: {failed.message or ''}".strip()
    return BenchmarkJob(
        name,
        exists=True,
        finished=bool({"Complete", "Failed"} & set(conditions)) or failure is not None,
        failure=failure,
        report=terminated.message if terminated is not None else None,
        start=status.start_time,
        end=status.completion_time,
    )


def _terminated(pod: Any) -> Any:
    statuses = (pod.status.container_statuses or []) if pod.status else []
    return statuses[0].state.terminated if statuses and statuses[0].state else None


def _pod_failure(pod: Any) -> str | None:
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        waiting = cs.state.waiting if cs.state else None
        if waiting is not None and waiting.reason in FATAL_WAITING_REASONS:
            failure = f"pod {pod.metadata.name}: {waiting.reason}: {waiting.message or ''}".strip()
            return failure + _last_exit(cs)
    return None


LAST_MESSAGE_CHARS = 300  # of the container's termination message: status and Events stay short


def _last_exit(container_status: Any) -> str:
    """How the container last ended (exit code, reason such as OOMKilled, its termination message):
    kept in status and the rollback's Event, it outlives the pods the rollback deletes."""
    last = container_status.last_state.terminated if container_status.last_state else None
    if last is None:
        return ""
    message = " ".join((last.message or "").split())[-LAST_MESSAGE_CHARS:]
    return f"; last exit {last.exit_code} ({last.reason or 'unknown'})" + (f": {message}" if message else "")


def _pod_unscheduled(pod: Any) -> str | None:
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return f"pod {pod.metadata.name}: {cond.reason}: {cond.message or ''}".strip()
    return None


def get_speculative_deployment(namespace: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi().get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name
    )
    return cast(dict[str, Any], obj)


class Conflict(Exception):
    """The object changed since it was read."""


def annotate(namespace: str, name: str, changes: dict[str, str | None], resource_version: str) -> None:
    """Set (None: remove) annotations of a SpeculativeDeployment, as of the version that was read:
    a concurrent change raises Conflict rather than being overwritten."""
    body = {"metadata": {"annotations": changes, "resourceVersion": resource_version}}
    try:
        client.CustomObjectsApi().patch_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, body
        )
    except ApiException as exc:
        if exc.status == 409:
            raise Conflict(str(exc.reason)) from exc
        raise


def speculative_deployment_names(namespace: str) -> list[str]:
    listed = client.CustomObjectsApi().list_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, _request_timeout=5
    )
    return [item["metadata"]["name"] for item in cast(dict[str, Any], listed)["items"]]
