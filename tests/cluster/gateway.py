"""The lab's gateway (issue 41) for cluster tests: specgate_lab.gateway (Traefik, the Gateway API CRDs,
the pod range routed to lo; its docstring says why), re-exported where the tests have always
imported it from, and what only tests read: the route's status, plain GETs, and the window of
failed requests around an event (issue 57).

Needs `make gateway` (Traefik and the CRDs into the cache)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from specgate_lab.gateway import CLASS_LABEL as CLASS_LABEL
from specgate_lab.gateway import CONTROLLER as CONTROLLER
from specgate_lab.gateway import GATEWAY as GATEWAY
from specgate_lab.gateway import GROUP as GROUP
from specgate_lab.gateway import LISTENER as LISTENER
from specgate_lab.gateway import VERSION as VERSION
from specgate_lab.gateway import condition as condition
from specgate_lab.gateway import gateway_class as gateway_class
from specgate_lab.gateway import gateway_lab as gateway_lab
from specgate_lab.gateway import install_gateway_api_crds as install_gateway_api_crds
from specgate_lab.gateway import lab_gateway as lab_gateway
from specgate_lab.gateway import pod_cidr as pod_cidr
from specgate_lab.gateway import route_pod_range as route_pod_range
from specgate_lab.gateway import traefik as traefik


def route_parent(api_client: client.ApiClient, namespace: str, route: str) -> dict[str, Any] | None:
    """Traefik's entry in the HTTPRoute's status.parents, once it wrote one."""
    found = cast(
        dict[str, Any],
        client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "httproutes", route
        ),
    )
    parents: list[dict[str, Any]] = found.get("status", {}).get("parents", [])
    return next((p for p in parents if p.get("controllerName") == CONTROLLER), None)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# Traefik applies a provider's new configuration at most once per providers.providersThrottleDuration
# (2 s by default; the lab sets only the kubernetesGateway provider's own throttleDuration, to 0):
# Traefik v3.7 pkg/provider/aggregator (maybeThrottledProvide sleeps that long after each message
# and keeps only the latest). A route write therefore reaches the data plane within 2 s of the
# informer's event, plus the provider's rebuild; a second is allowed for that and for the informer.
# tests/cluster/test_gateway_routing.py measures it (Window.figures propagation_s: from the
# operator's route write, seen by a 0.2 s poll of the API server, to the last failed request at the
# gateway): 0.36-1.03 s in three runs on the lab (2026-11-28, 2 cores shared with other tests).
PROPAGATION_SECONDS = 3.0

T = TypeVar("T")


class Poll(Generic[T]):
    """fn() every `period` seconds in a background thread from start() to stop(); each change of
    its value is kept with its time.monotonic(). What an API server read shows, when it changed."""

    def __init__(self, fn: Callable[[], T], period: float = 0.2) -> None:
        self.fn, self.period = fn, period
        self.changes: list[tuple[float, T]] = []
        self.errors = 0  # reads that failed (an API server's hiccup): a time is then late by a period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                value = self.fn()
            except ApiException:
                self.errors += 1
            else:
                if not self.changes or self.changes[-1][1] != value:
                    self.changes.append((time.monotonic(), value))
            self._stop.wait(self.period)

    def start(self) -> Poll[T]:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def first(self, test: Callable[[T], bool], after: float = 0.0) -> float | None:
        """When the value first met `test` at or after `after` (a change, or the value it had then)."""
        before = [(at, value) for at, value in self.changes if at < after][-1:]
        for at, value in before + [(at, value) for at, value in self.changes if at >= after]:
            if test(value):
                return max(at, after)
        return None

    @property
    def value(self) -> T | None:
        return self.changes[-1][1] if self.changes else None


def route_state(
    api_client: client.ApiClient, namespace: str, route: str, index: int = 0
) -> RouteState | None:
    """An HTTPRoute's uid (a route deleted and created again has a new one) and the weights of one
    rule's backendRefs, by Service; None where there is no route."""
    try:
        found = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, "httproutes", route
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    obj = cast(dict[str, Any], found)
    refs = obj["spec"]["rules"][index].get("backendRefs") or []
    return RouteState(obj["metadata"]["uid"], {ref["name"]: int(ref.get("weight", 1)) for ref in refs})


@dataclass(frozen=True)
class RouteState:
    uid: str
    weights: dict[str, int]


@dataclass
class Window:
    """The requests that failed at the gateway around an event the operator only reacts to (issue 57):
    from when the test made the fault to the window's end, in time.monotonic() seconds."""

    event: str
    made_at: float  # the test made the fault (deleted the route, killed the engine)
    event_at: float | None = (
        None  # the event the operator reacts to was seen (the route gone, a pod NotReady)
    )
    repaired_at: float | None = None  # the operator's route write that moved the traffic was seen
    failures: list[float] = field(default_factory=list)
    ended_at: float | None = None

    def end(self, failed_at: list[float]) -> None:
        self.ended_at = time.monotonic()
        self.failures = [t for t in list(failed_at) if self.made_at <= t <= self.ended_at]

    @property
    def last_failure(self) -> float | None:
        return self.failures[-1] if self.failures else None

    def quiet_since(self, failed_at: list[float]) -> float:
        """Since when no request failed (the repair, or the last failure after it)."""
        assert self.repaired_at is not None
        return max([self.repaired_at, *(t for t in list(failed_at) if t >= self.made_at)])

    def after_event(self) -> float | None:
        """Seconds from the event to the last failure (0 where none failed after it)."""
        if self.event_at is None or self.ended_at is None:
            return None
        last = self.last_failure
        return max(0.0, last - self.event_at) if last is not None else 0.0

    def figures(self) -> dict[str, str]:
        def s(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        first, last = (self.failures[0], self.failures[-1]) if self.failures else (None, None)
        window = None if first is None or last is None else last - first
        return {
            "event": self.event.replace(" ", "_"),
            "non_2xx": str(len(self.failures)),
            "window_s": s(window),  # first to last failure
            "event_s": s(None if self.event_at is None else self.event_at - self.made_at),
            "repair_s": s(
                None
                if self.repaired_at is None or self.event_at is None
                else self.repaired_at - self.event_at
            ),
            "propagation_s": s(None if last is None or self.repaired_at is None else last - self.repaired_at),
            "after_event_s": s(self.after_event()),
        }
