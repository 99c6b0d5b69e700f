"""The tracks' Deployments of an object that adopts a running vLLM Deployment (spec.workloadRef), and
what specgate refuses to adopt (pure: dicts in, dicts out).

The baseline runs the referenced Deployment's pod template as it is (image, args, env, resources,
volumes, probes, scheduling): specgate adds its own labels beside the user's, so that the user's
Service selects both tracks' pods, and never edits the referenced Deployment itself. The canary is
the same with `--speculative-config` appended to the vLLM container's args.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from specgate import api, render
from specgate.observation import TrackState
from specgate.render import Manifest, Owner, Track

SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "busybox"})
SPECULATIVE_FLAGS = ("--speculative-config", "--speculative_config", "-sc")
# specgate's pod labels that a user's Service commonly selects by (a Helm chart's selectorLabels):
# the user's value is kept, so the Service keeps selecting both tracks' pods.
USER_FIRST_LABELS = frozenset({"app.kubernetes.io/name", "app.kubernetes.io/instance"})


class AdoptionError(ValueError):
    """What in the referenced Deployment specgate cannot adopt, and how to fix it."""

    def __init__(self, message: str) -> None:
        super().__init__(f"spec.workloadRef: {message}")
        self.message = message


def serving_selector(owner: Owner) -> dict[str, str]:
    """Both tracks' pods of an adopting object: app.kubernetes.io/name may be the user's there."""
    return {render.LABEL_DEPLOYMENT: owner.name, render.LABEL_ENGINE: "vllm"}


def source_template(ref: api.WorkloadRef, deployment: Manifest, pod_monitor: bool = False) -> dict[str, Any]:
    """The referenced Deployment's pod template, checked (AdoptionError says what to fix); with
    `pod_monitor`, its vLLM container must name the port the PodMonitor scrapes."""
    template = copy.deepcopy(deployment.get("spec", {}).get("template") or {})
    if not template.get("spec", {}).get("containers"):
        raise AdoptionError(f"Deployment {ref.name} has no pod template with containers")
    container = _vllm_container(ref, template)
    _refuse_shell(ref, container)
    if pod_monitor and not any(p.get("name") == "http" for p in container.get("ports") or []):
        raise AdoptionError(
            f"container {container.get('name')!r} of Deployment {ref.name} has no port named http, which "
            "the PodMonitor (rollout.metrics.podMonitor) scrapes /metrics on: name vLLM's port http"
        )
    return template


def pod_template(
    spec: api.SpeculativeDeploymentSpec, owner: Owner, track: Track, source: dict[str, Any]
) -> dict[str, Any]:
    """The track's pod template: the source's, with specgate's labels and annotations added and, on
    the canary, the speculative flags appended to the vLLM container's args."""
    assert spec.workload_ref is not None
    template = copy.deepcopy(source)
    metadata = template.setdefault("metadata", {})
    metadata.pop("creationTimestamp", None)
    metadata["labels"] = pod_labels(spec, owner, track, metadata.get("labels") or {})
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        **spec.pod_annotations,
        render.ANNOTATION_TEMPLATE: template_hash(spec, track, source),
    }
    if track is Track.CANARY:
        container = _vllm_container(spec.workload_ref, template)
        flag = json.dumps(render.speculative_config(spec.speculative), sort_keys=True)
        container["args"] = [*container.get("args", []), "--speculative-config", flag]
    return template


def pod_labels(
    spec: api.SpeculativeDeploymentSpec, owner: Owner, track: Track, user: dict[str, str]
) -> dict[str, str]:
    """The user's labels (what their Service selects) and specgate's; a user label specgate must
    set otherwise (its own domain, managed-by) is refused rather than overwritten."""
    ours = render.pod_labels(spec, owner, track)
    clashes = sorted(k for k, v in user.items() if k in ours and k not in USER_FIRST_LABELS and ours[k] != v)
    if clashes:
        raise AdoptionError(
            f"the Deployment's pod template sets label {', '.join(clashes)}, which specgate sets on its "
            "own pods (it watches and selects them by it): remove it from the pod template, and from "
            "your Service's selector if it is there"
        )
    return {**ours, **user}


def resolve(spec: api.SpeculativeDeploymentSpec, source: dict[str, Any]) -> api.SpeculativeDeploymentSpec:
    """The spec with the referenced pod template's digest, which render.template_hash counts: the
    operator decides with it, so that a GitOps edit of that template is a new rollout."""
    assert spec.workload_ref is not None
    ref = spec.workload_ref.model_copy(update={"template_digest": render.digest(source)})
    return spec.model_copy(update={"workload_ref": ref})


def template_hash(spec: api.SpeculativeDeploymentSpec, track: Track, source: dict[str, Any]) -> str:
    """What the track's pods run (render.template_hash of the resolved spec)."""
    return render.template_hash(resolve(spec, source), track)


def deployment(
    spec: api.SpeculativeDeploymentSpec, owner: Owner, track: Track, replicas: int, source: dict[str, Any]
) -> Manifest:
    """Deployment <name>-<track> running `source` (source_template's result) for the track."""
    template = pod_template(spec, owner, track, source)
    labels = dict(template["metadata"]["labels"])
    annotations = {
        render.ANNOTATION_TEMPLATE: template["metadata"]["annotations"][render.ANNOTATION_TEMPLATE]
    }
    return render.track_deployment(spec, owner, track, replicas, template, labels, annotations)


def track(
    spec: api.SpeculativeDeploymentSpec,
    owner: Owner,
    track: Track,
    replicas: int,
    source: dict[str, Any] | None,
    running: TrackState | None = None,
) -> Manifest:
    """The track's Deployment: rendered from the spec (`running`: its Deployment as observed), or
    from the adopted `source` template."""
    if source is None:
        return render.deployment(spec, owner, track, replicas, running)
    return deployment(spec, owner, track, replicas, source)


def _vllm_container(ref: api.WorkloadRef, template: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = template["spec"]["containers"]
    names = [c.get("name") for c in containers]
    wanted = ref.container or ("vllm" if "vllm" in names or len(containers) > 1 else names[0])
    for container in containers:
        if container.get("name") == wanted:
            return container
    raise AdoptionError(
        f"Deployment {ref.name} has no container {wanted!r} (it has {', '.join(map(str, names))}): set "
        "workloadRef.container to the one that runs vLLM"
    )


def _refuse_shell(ref: api.WorkloadRef, container: dict[str, Any]) -> None:
    command = [*container.get("command", []), *container.get("args", [])]
    program = command[0].rsplit("/", 1)[-1] if command else ""
    if program in SHELLS and "-c" in command:
        raise AdoptionError(
            f"container {container.get('name')!r} of Deployment {ref.name} starts vLLM through a shell "
            "string (sh -c ...), where the canary's appended --speculative-config would not reach "
            "vLLM: start it as command [vllm, serve] with the model and flags as separate args"
        )
    if any(arg.split("=", 1)[0] in SPECULATIVE_FLAGS for arg in command):
        raise AdoptionError(
            f"container {container.get('name')!r} of Deployment {ref.name} already runs speculative "
            "decoding (--speculative-config): remove the flag from the Deployment, specgate appends "
            "spec.speculative's on the canary"
        )
