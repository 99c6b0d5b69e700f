"""specgate.kube faked at its module seam for the handler tests (handlers.step with the calls it makes
recorded), and handlers.step driven from a Run's spec and status."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.rollout_driver import Run

from specgate import handlers, kube
from specgate.observation import TrackState
from specgate.render import Manifest, Owner
from specgate.rollout import Decision

OWNER = Owner(name="llama", namespace="ml", uid="u-1")


@dataclass
class FakeKube:
    """The functions handlers.py calls on specgate.kube: reads answer from `tracks` (by Deployment
    name) and `taken`; writes are recorded in `calls`."""

    tracks: dict[str, TrackState] = field(default_factory=dict)
    taken: list[str] = field(default_factory=list)
    pod_monitor_crd: bool = True
    http_route_crd: bool = True
    inference_pool_crd: bool = True
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)  # HTTPRoutes by name, as read
    missing_services: set[str] = field(default_factory=set)  # Services that do not exist (others do)
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)  # InferencePools by name, as read
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    # Tracks as the API server has them now where the watches' cache (`tracks`) lags behind
    read_now: dict[str, TrackState] = field(default_factory=dict)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeKube:
        for name in (
            "track_state",
            "track_state_now",
            "foreign_children",
            "serves_pod_monitors",
            "serves_http_routes",
            "serves_inference_pools",
            "read_route",
            "read_inference_pool",
            "patch_route",
            "service_exists",
            "apply",
            "scale_deployment",
            "delete_benchmark_jobs",
        ):
            monkeypatch.setattr(kube, name, getattr(self, name))
        return self

    def track_state(
        self, children: kube.Children, namespace: str, name: str, selector: dict[str, str]
    ) -> TrackState:
        return self.tracks.get(name, TrackState())

    def track_state_now(self, namespace: str, name: str, selector: dict[str, str]) -> TrackState:
        self.calls.append(("read now", name))
        return self.read_now.get(name, self.tracks.get(name, TrackState()))

    def foreign_children(self, manifests: list[Manifest], owner_uid: str) -> list[str]:
        return list(self.taken)

    def serves_pod_monitors(self) -> bool:
        return self.pod_monitor_crd

    def serves_http_routes(self) -> bool:
        return self.http_route_crd

    def serves_inference_pools(self) -> bool:
        return self.inference_pool_crd

    def read_route(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.routes.get(name)

    def read_inference_pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pools.get(name)

    def service_exists(self, namespace: str, name: str) -> bool:
        return name not in self.missing_services

    def patch_route(self, namespace: str, name: str, operations: list[dict[str, Any]]) -> None:
        """Applied to the stored route as the API server would: all or nothing, and kube.Conflict
        where a test op fails (the call is recorded either way)."""
        self.calls.append(("patch route", name, operations))
        if name in self.routes:
            self.routes[name] = json_patched(self.routes[name], operations)

    def apply(self, manifest: Manifest, children: kube.Children | None = None) -> None:
        if manifest["kind"] in ("HTTPRoute", "InferencePool"):
            name = manifest["metadata"]["name"]
            self.calls.append(("apply", manifest["kind"], name, manifest["spec"]))
            if manifest["kind"] == "InferencePool":  # created or updated: read back so next time
                self.pools[name] = {**self.pools.get(name, {}), **copy.deepcopy(manifest)}
            return
        replicas = manifest["spec"].get("replicas")
        self.calls.append(("apply", manifest["kind"], manifest["metadata"]["name"], replicas))

    def scale_deployment(
        self, namespace: str, name: str, replicas: int, children: kube.Children | None = None
    ) -> None:
        self.calls.append(("scale", name, replicas))

    def delete_benchmark_jobs(self, owner: Owner, keep: set[str]) -> None:
        self.calls.append(("delete jobs but", frozenset(keep)))


def json_patched(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 as specgate's patches use it (test, add, replace, remove of object members), on a copy."""
    patched = copy.deepcopy(document)
    for op in operations:
        *parents, last = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].split("/")[1:]]
        target: Any = patched
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        key: Any = int(last) if isinstance(target, list) else last
        if op["op"] == "test":
            present = key < len(target) if isinstance(target, list) else key in target
            if not present or target[key] != op["value"]:
                raise kube.Conflict(f"test of {op['path']} failed")
        elif op["op"] == "remove":
            del target[key]
        else:  # add or replace
            target[key] = copy.deepcopy(op["value"])
    return patched


def reconcile_step(run: Run, after: float) -> Decision:
    """handlers.step on the run's spec and status, `after` seconds after its last step."""
    raw = run.spec.model_dump(by_alias=True, mode="json")
    later = run.now + timedelta(seconds=after)
    return handlers.step(raw, run.status, OWNER, run.generation, later, {}, kube.Children())
