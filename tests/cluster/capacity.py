"""The capacity invariant (DESIGN.md section 2, issue 14), checked over a whole cluster test: the Ready
serving pods behind a Service never drop below `replicas - maxUnavailable` once they have reached it.

CapacityMonitor watches (list, then watch from that resourceVersion, list again on 410 Gone) the
namespace's pods, Services and, unless the test gives fixed floors, SpeculativeDeployments, in
background threads from entering to leaving its `with` block, and keeps a timeline per Service.
Leaving the block reports the figures and raises AssertionError with the timeline around any drop.

Pods, not EndpointSlices: the lab's Service router (the bridge) routes to the Ready pods that the
Service's selector matches, as kube-proxy would, with no controller's batching in between."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from tests.cluster.figures import report
from tests.cluster.operator_process import wait_for
from tests.floor import protected_after

from specgate import api
from specgate.render import LABEL_ENGINE, LABEL_TRACK

WATCH_SECONDS = 2  # each watch request's server-side timeout: how long leaving the block may take
CONTEXT = 4  # timeline lines shown either side of a drop
MAX_DROPS_SHOWN = 3

Obj = dict[str, Any]


def sd_floor(obj: Mapping[str, Any]) -> int:
    """`replicas - maxUnavailable` of a SpeculativeDeployment; 0 once it is being deleted (its owner
    asked for nothing to serve)."""
    if obj["metadata"].get("deletionTimestamp"):
        return 0
    spec = obj.get("spec") or {}
    unavailable = int((spec.get("rollout") or {}).get("maxUnavailable", 0))
    return max(0, int(spec.get("replicas", 1)) - unavailable)


def _history(obj: Obj) -> str:
    """The object's status.history: each phase entered, when, its reason and message (cut short)."""
    entries = (obj.get("status") or {}).get("history") or []
    return "".join(
        f"\n    {h.get('time', '?')} {h.get('phase')} {h.get('reason', '')}: {h.get('message', '')[:200]}"
        for h in entries
    )


PYTEST_VARIABLE = "PYTEST_CURRENT_TEST"  # set and removed by pytest around each test phase


@dataclass(frozen=True)
class Pod:
    labels: Mapping[str, str]
    serving: bool
    state: str  # why it does not serve, for the report

    @property
    def track(self) -> str:
        return self.labels.get(LABEL_TRACK, "no track")


def pod_state(obj: Obj) -> Pod:
    """Serving: condition Ready=True and no deletionTimestamp. The bridge's engine pods (engine label)
    also need the bridge's own status (containerStatuses[].started): kwok marks every pod Ready the
    moment it runs, before the bridge has looked at its engine, which is not yet serving then."""
    meta, status = obj["metadata"], obj.get("status") or {}
    labels = meta.get("labels") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
    statuses = status.get("containerStatuses") or []
    if LABEL_ENGINE in labels and not (statuses and all(s.get("started") for s in statuses)):
        ready = False
    if meta.get("deletionTimestamp"):
        return Pod(labels, False, "terminating")
    return Pod(labels, ready, "Ready" if ready else "not Ready")


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the monitor started
    serving: Mapping[str, str]  # pod -> track
    floor: int
    protected: int  # see protected_after
    came: tuple[str, ...]  # "pod (track)" that began serving since the previous sample
    gone: tuple[str, ...]  # "pod (track, why)" that stopped serving since the previous sample
    forgiven: int = 0  # pods a test's faults took that no newly serving pod has made up for yet

    @property
    def ready(self) -> int:
        return len(self.serving)

    @property
    def below(self) -> bool:
        return self.ready < self.protected

    def line(self) -> str:
        changes = " ".join([f"-{p}" for p in self.gone] + [f"+{p}" for p in self.came])
        mark = "   <-- below the floor" if self.below else ""
        return f"  {self.at:+8.1f}s ready={self.ready} floor={self.floor} {changes}{mark}"


@dataclass
class Timeline:
    """One Service's serving pods and floor, a sample whenever either changes."""

    service: str
    samples: list[Sample] = field(default_factory=list)

    def record(self, at: float, serving: Mapping[str, str], floor: int, why: Callable[[str], str]) -> None:
        last = self.samples[-1] if self.samples else None
        before: Mapping[str, str] = last.serving if last else {}
        if last is not None and before == serving and last.floor == floor:
            return
        came = tuple(f"{p} ({track})" for p, track in serving.items() if p not in before)
        gone = tuple(f"{p} ({track}, {why(p)})" for p, track in before.items() if p not in serving)
        forgiven = max(last.forgiven - len(came), 0) if last else 0
        protected = protected_after(last.protected if last else 0, len(serving), floor, forgiven)
        self.samples.append(Sample(at, dict(serving), floor, protected, came, gone, forgiven))

    def lose(self, at: float, pod: str) -> None:
        """A test's fault (a kill, a deletion) takes `pod`: no rollout could have kept it, so the pods
        protected go down by one with it, and stay down until a newly serving pod makes up for it
        (protected_after)."""
        if not self.samples:
            return
        last = self.samples[-1]
        serving = {name: track for name, track in last.serving.items() if name != pod}
        gone = tuple(
            f"{pod} ({track}, a fault the test made)" for name, track in last.serving.items() if name == pod
        )
        protected = max(last.protected - len(gone), 0)
        self.samples.append(Sample(at, serving, last.floor, protected, (), gone, last.forgiven + len(gone)))

    @property
    def reached(self) -> bool:
        return any(s.protected > 0 for s in self.samples)

    def min_ready(self, since: float = 0.0) -> int | None:
        """The fewest serving pods once the floor was reached and from `since` (seconds since the
        monitor started) on (None: it never was)."""
        return min((s.ready for s in self.samples if s.protected > 0 and s.at >= since), default=None)

    def drops(self) -> list[int]:
        """Indices of the samples where a drop below the floor began."""
        below = [s.below for s in self.samples]
        return [i for i, b in enumerate(below) if b and (i == 0 or not below[i - 1])]

    def describe(self, index: int) -> str:
        drop = self.samples[index]
        lines = [s.line() for s in self.samples[max(0, index - CONTEXT) : index + CONTEXT + 1]]
        head = (
            f"Service {self.service}: {drop.ready} Ready serving pods at {drop.at:+.1f}s, fewer than the "
            f"{drop.protected} already reached of its floor {drop.floor} (replicas - maxUnavailable)"
        )
        return "\n".join([head, *lines])


class _Watch:
    """One kind's list and watch, applied to the monitor's state under its lock."""

    def __init__(
        self,
        kind: str,
        list_fn: Callable[..., Any],
        args: tuple[str, ...],
        reset: Callable[[list[Obj]], None],
        apply: Callable[[str, Obj], None],
        stop: threading.Event,
    ) -> None:
        self.kind, self.list_fn, self.args = kind, list_fn, args
        self.reset, self.apply, self.stop = reset, apply, stop
        self.relists = 0
        self.error: BaseException | None = None
        self.version = self.list()  # before the test acts: nothing it does can be missed
        self.thread = threading.Thread(target=self.run, name=f"capacity-{kind}", daemon=True)

    def list(self) -> str:
        response = self.list_fn(*self.args, _preload_content=False)  # raw: dicts, as the watch's
        if not 200 <= response.status < 300:  # a raw response is not checked by the client
            raise ApiException(status=response.status, reason=response.data.decode(errors="replace"))
        body = json.loads(response.data)
        self.reset(body["items"])
        version: str = body["metadata"]["resourceVersion"]
        return version

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    self.version = self.stream(self.version)
                except (ApiException, urllib3.exceptions.HTTPError, KeyError) as exc:
                    if isinstance(exc, ApiException) and exc.status != 410:
                        raise
                    if isinstance(exc, KeyError) and exc.args != (PYTEST_VARIABLE,):
                        raise
                    # Expired (410 Gone) or cut off: events were missed, a fresh list resumes. So
                    # for a request that read os.environ while pytest removed its per-test variable
                    # (the client iterates the environment for proxies: CI's run lost a watch so).
                    self.relists += 1
                    self.version = self.list()
        except BaseException as exc:  # check() raises it: a monitor gone blind must not pass
            self.error = exc

    def stream(self, version: str) -> str:
        events = watch.Watch().stream(  # type: ignore[no-untyped-call]
            self.list_fn, *self.args, resource_version=version, timeout_seconds=WATCH_SECONDS,
            allow_watch_bookmarks=True, _request_timeout=WATCH_SECONDS + 30,
        )  # fmt: skip
        with closing(events):
            for event in events:
                if not event:  # a blank line of the stream (kubernetes 37 yields None for it)
                    continue
                obj = event.get("raw_object", event["object"])  # a dict, whatever the client version
                version = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    self.apply(event["type"], obj)
                if self.stop.is_set():
                    break
        return version


class CapacityMonitor:
    """Ready serving pods behind Services of `namespace`, for the duration of a `with` block.

    floors=None: every SpeculativeDeployment's Service <name>, its floor read from the object as it
    changes (sd_floor); otherwise the Services named there, with fixed floors. Leaving the block
    (without an exception) reports the figures and runs check(require_reached)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        floors: Mapping[str, int] | None = None,
        require_reached: bool = True,
    ) -> None:
        self.api_client, self.namespace, self.require_reached = api_client, namespace, require_reached
        self.fixed = dict(floors) if floors is not None else None
        self.sd_floors: dict[str, int] = {}
        self.histories: dict[str, str] = {}  # each object's status.history as last seen, for a drop's report
        self.pods: dict[str, Pod] = {}
        self.selectors: dict[str, Mapping[str, str]] = {}
        self.timelines: dict[str, Timeline] = {}
        self.faulted: set[str] = set()  # pods a test is taking down (fault), until seen not serving
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.watches: list[_Watch] = []
        self.started = time.monotonic()

    # --- for tests ---

    def wait_for_floor(self, service: str, timeout: float) -> None:
        """Until the Service's serving pods first reach its floor (from then on the invariant holds)."""
        wait_for(lambda: self._reached(service), timeout, f"Service {service} to reach its floor")

    def ready(self, service: str) -> int:
        """The Service's serving pods now."""
        with self.lock:
            samples = self._timeline(service).samples
            return samples[-1].ready if samples else 0

    def floor(self, service: str) -> int:
        """The Service's floor now (0 before any is known)."""
        with self.lock:
            samples = self._timeline(service).samples
            return samples[-1].floor if samples else 0

    def serving(self, service: str) -> list[str]:
        """The Service's serving pods now, by name."""
        with self.lock:
            return sorted(self._serving(service))

    def fault(self, service: str, pod: str) -> None:
        """Before a test takes a serving pod down: it no longer counts, and the floor it held is
        forgiven (Timeline.lose), until the pod is seen not serving (then Ready again, it counts)."""
        with self.lock:
            self.faulted.add(pod)
            self._timeline(service).lose(time.monotonic() - self.started, pod)

    def _reached(self, service: str) -> bool:
        with self.lock:
            return self._timeline(service).reached

    def min_ready(self, service: str, since: float = 0.0) -> int | None:
        with self.lock:
            return self._timeline(service).min_ready(since)

    def elapsed(self) -> float:
        """Seconds since the monitor started: the time its samples carry."""
        return time.monotonic() - self.started

    def check(self, require_reached: bool = True) -> None:
        """Raise AssertionError for any drop below the floor (with the timeline around it), a watch
        that failed, and with require_reached, a Service that never reached its floor (nothing
        was checked there)."""
        problems = [f"the {w.kind} watch failed: {w.error!r}" for w in self.watches if w.error]
        with self.lock:
            for service, timeline in self.timelines.items():
                drops = [timeline.describe(i) for i in timeline.drops()[:MAX_DROPS_SHOWN]]
                if drops and service in self.histories:
                    drops.append(f"  its status.history:{self.histories[service]}")
                problems += drops
                if require_reached and not timeline.reached:
                    problems.append(
                        f"Service {timeline.service} never reached its floor: nothing was checked"
                    )
            if require_reached and not self.timelines:
                problems.append(f"no Service to check in {self.namespace}")
        assert not problems, "capacity invariant:\n" + "\n".join(problems)

    def figures(self) -> dict[str, object]:
        with self.lock:
            timelines = list(self.timelines.values())
        names = [t.service for t in timelines]
        reached = [m for m in (t.min_ready() for t in timelines) if m is not None]
        floors = sorted({s.floor for t in timelines for s in t.samples if s.floor})
        return {
            "capacity": ",".join(names) if len(names) <= 3 else f"{len(names)}_services",
            "floor": ",".join(map(str, floors)) or "none",
            "min_ready_after_floor": min(reached) if reached else "never_reached",
            "drops": sum(len(t.drops()) for t in timelines),
            "relists": sum(w.relists for w in self.watches),
        }

    # --- the context manager ---

    def __enter__(self) -> CapacityMonitor:
        core, ns = client.CoreV1Api(self.api_client), (self.namespace,)
        pods = self._mirror(self.pods, pod_state)
        services = self._mirror(self.selectors, lambda o: o["spec"].get("selector") or {})
        self.watches = [
            _Watch("pods", core.list_namespaced_pod, ns, *pods, self.stop),
            _Watch("services", core.list_namespaced_service, ns, *services, self.stop),
        ]
        if self.fixed is None:
            objects = client.CustomObjectsApi(self.api_client).list_namespaced_custom_object
            args = (api.GROUP, api.VERSION, self.namespace, api.PLURAL)
            self.watches.append(_Watch("objects", objects, args, self._reset_sds, self._apply_sd, self.stop))
        for w in self.watches:
            w.thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop.set()
        for w in self.watches:
            w.thread.join(timeout=WATCH_SECONDS + 40)
            if w.thread.is_alive() and w.error is None:
                w.error = TimeoutError("the watch did not stop")
        if kind is None:
            report(**self.figures())
            self.check(self.require_reached)

    # --- state, under the lock; a sample per Service after every change ---

    def _mirror(
        self, table: dict[str, Any], value: Callable[[Obj], Any]
    ) -> tuple[Callable[[list[Obj]], None], Callable[[str, Obj], None]]:
        """A watch's list and events kept in table (by name, as value(obj)), then a sample."""

        def reset(items: list[Obj]) -> None:
            with self.lock:
                table.clear()
                table.update((o["metadata"]["name"], value(o)) for o in items)
                self._record()

        def apply(kind: str, obj: Obj) -> None:
            with self.lock:
                name = obj["metadata"]["name"]
                if kind == "DELETED":
                    table.pop(name, None)
                else:
                    table[name] = value(obj)
                self._record()

        return reset, apply

    def _reset_sds(self, items: list[Obj]) -> None:
        with self.lock:
            listed = {o["metadata"]["name"]: sd_floor(o) for o in items}
            self.histories.update((o["metadata"]["name"], _history(o)) for o in items)
            self.sd_floors = {**dict.fromkeys(self.sd_floors, 0), **listed}  # gone meanwhile: floor 0
            self._record()

    def _apply_sd(self, kind: str, obj: Obj) -> None:
        with self.lock:
            self.sd_floors[obj["metadata"]["name"]] = 0 if kind == "DELETED" else sd_floor(obj)
            self.histories[obj["metadata"]["name"]] = _history(obj)
            self._record()

    def _record(self) -> None:
        at = time.monotonic() - self.started
        floors = self.fixed if self.fixed is not None else self.sd_floors
        for service, floor in floors.items():
            self._timeline(service).record(at, self._serving(service), floor, self._why(service))

    def _serving(self, service: str) -> dict[str, str]:
        selector = self.selectors.get(service)
        if not selector:  # no Service (yet, or any more), or one without a selector: nothing behind it
            return {}
        self.faulted &= {name for name, pod in self.pods.items() if pod.serving}
        return {
            name: pod.track
            for name, pod in sorted(self.pods.items())
            if pod.serving and name not in self.faulted and selector.items() <= pod.labels.items()
        }

    def _why(self, service: str) -> Callable[[str], str]:
        def why(name: str) -> str:
            pod = self.pods.get(name)
            if service not in self.selectors:
                return "no Service"
            if pod is None:
                return "deleted"
            return pod.state if not pod.serving else "no longer selected"

        return why

    def _timeline(self, service: str) -> Timeline:
        return self.timelines.setdefault(service, Timeline(f"{self.namespace}/{service}"))
