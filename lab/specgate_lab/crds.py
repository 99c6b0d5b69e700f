"""Install the checked-in CRDs on a cluster, as `kubectl apply --server-side -f crds/` would: the
demo does it before applying its sample, the cluster tests before creating objects."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import yaml
from kubernetes import client

from specgate_lab import checkout

CRD_FILE = "specgate.dev_speculativedeployments.yaml"


def crd_path() -> Path:
    return checkout() / "crds" / CRD_FILE


def peering_crds_path() -> Path:
    return checkout() / "crds" / "kopf.dev_peerings.yaml"


def install_crd(api_client: client.ApiClient, path: Path | None = None, timeout: float = 60) -> None:
    """Apply the CRDs of one file (server-side; the checkout's SpeculativeDeployment CRD unless
    given) and wait until each is Established. A CRD this process applied from the same text and
    nobody has changed since (its resourceVersion) is not applied again: the API server compiles
    every CEL rule of an applied CRD, 20-27 s a test on a loaded machine, even when nothing changed."""
    ext = client.ApiextensionsV1Api(api_client)
    text = (path or crd_path()).read_text()
    for body in yaml.safe_load_all(text):
        name = body["metadata"]["name"]
        key = (name, hashlib.sha256(text.encode()).hexdigest())
        applied_version = _APPLIED.get(key)
        if applied_version is not None and applied_version == _resource_version(ext, name):
            continue
        applied = ext.patch_custom_resource_definition(
            name, body, field_manager="specgate-lab", force=True,
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not _established(ext, name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(0.5)
        _APPLIED[key] = applied.metadata.resource_version if applied.metadata else None


# (CRD name, the applied file's sha256) -> the resourceVersion the apply left: see install_crd.
_APPLIED: dict[tuple[str, str], str | None] = {}


def _resource_version(ext: client.ApiextensionsV1Api, name: str) -> str | None:
    try:
        meta = ext.read_custom_resource_definition(name).metadata
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return meta.resource_version if meta else None


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    conditions = crd.status.conditions if crd.status else None
    return any(c.type == "Established" and c.status == "True" for c in conditions or [])
