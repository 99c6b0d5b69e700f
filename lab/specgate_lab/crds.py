"""Install the checked-in CRDs on a cluster, as `kubectl apply --server-side -f crds/` would: the
demo does it before applying its sample, the cluster tests before creating objects."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from specgate_lab import checkout
from specgate_lab.kube import wait_for

CRD_FILE = "specgate.dev_speculativedeployments.yaml"


def crd_path() -> Path:
    return checkout() / "crds" / CRD_FILE


def peering_crds_path() -> Path:
    return checkout() / "crds" / "kopf.dev_peerings.yaml"


def install_crd(api_client: client.ApiClient, path: Path | None = None, timeout: float = 120) -> None:
    """Apply the CRDs of one file (server-side; the checkout's SpeculativeDeployment CRD unless
    given) and wait until each is Established. A CRD that already holds every field of the file is
    not applied again: the API server compiles every CEL rule of an applied CRD even when nothing
    changed (20-27 s a test on a loaded lab, past its 60 s limit on a slower one), and a test module
    starting on each worker would apply it at once. An apply the API server answers 5xx is retried."""
    ext = client.ApiextensionsV1Api(api_client)
    for body in yaml.safe_load_all((path or crd_path()).read_text()):
        name = body["metadata"]["name"]
        wait_for(partial(_applied, ext, body), timeout, f"CRD {name} applied")
        wait_for(partial(_established, ext, name), timeout, f"CRD {name} Established", interval=0.5)


def _applied(ext: client.ApiextensionsV1Api, body: dict[str, Any]) -> bool:
    """Apply `body` unless the live CRD holds it already (a 5xx raises: wait_for asks again)."""
    name = body["metadata"]["name"]
    if holds(_live(ext, name), body):
        return True
    ext.patch_custom_resource_definition(
        name, body, field_manager="specgate-lab", force=True, _content_type="application/apply-patch+yaml"
    )
    return True


def _live(ext: client.ApiextensionsV1Api, name: str) -> Any:
    """The CRD as the API server serves it (JSON, not the client's models), None where absent."""
    try:
        answer = ext.read_custom_resource_definition(name, _preload_content=False)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return json.loads(answer.data)  # type: ignore[attr-defined]  # the raw urllib3 answer


def holds(live: Any, body: dict[str, Any]) -> bool:
    """The live CRD serves the file's spec exactly (beside the API server's defaults, such as
    spec.conversion) and carries the file's labels and annotations (beside others')."""
    if live is None:
        return False
    spec_same = all(live["spec"].get(key) == value for key, value in body["spec"].items())
    marks = [
        (live["metadata"].get(field) or {}, wanted)
        for field, wanted in body["metadata"].items()
        if field in _MARKS
    ]
    return spec_same and all(
        have.get(key) == value for have, wanted in marks for key, value in wanted.items()
    )


_MARKS = ("labels", "annotations")


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    conditions = crd.status.conditions if crd.status else None
    return any(c.type == "Established" and c.status == "True" for c in conditions or [])
