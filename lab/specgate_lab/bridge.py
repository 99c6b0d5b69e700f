"""The bridge between kwok's container-less pods and real local engine processes.

kwok marks pods Running without running anything. For each Running pod that carries the engine
label, the bridge starts one local engine (the simulator or the real vLLM CPU engine) from the
pod's own `vllm serve` arguments and environment, on a free loopback port, and writes a Prometheus
file_sd target with the labels a PodMonitor would produce. When the pod goes, so does its engine.
A pod whose address this host can bind (a node's podCIDR in a range routed to lo, as the gateway
tests make) has its engine on that address and its "http" containerPort instead, as a container
would listen: a gateway routing to the pod's EndpointSlice address then reaches the real engine.

Targets are scraped at the interval the pod's PodMonitor would use: the owning
SpeculativeDeployment's spec.rollout.metrics.scrapeInterval (15s by default). The lab's Prometheus
has one job per interval in SCRAPE_INTERVALS, reading targets/<interval>/*.json; the bridge writes
each target into the directory of its interval (hack/cluster-up.sh reads SCRAPE_INTERVALS from here).

It also routes `/svc/<namespace>/<service>/<path>` to the Ready engines of the pods a Service
selects, round robin, which reproduces Service traffic: weight follows the replica counts.

Each engine's output is also kept as a kubelet keeps a container's: in CRI log format, the current
run's and the previous run's, which kwok serves for `kubectl logs [--previous]` through a Logs object
per pod (hack/cluster-up.sh enables kwok's Logs CRD).

Pods of benchmark Jobs (label specgate.dev/benchmark; the lab's kwok stages leave them Running)
run their `python3 -c <driver>` with the vLLM install, against the router; when it exits, the pod
ends Succeeded or Failed with the driver's termination message, as a kubelet would report it.

Run: python -m specgate_lab.bridge --kubeconfig FILE --state-dir DIR [--port 18080]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes import client, config

from specgate.api import GROUP, PLURAL, VERSION, parse_duration
from specgate.render import LABEL_BENCHMARK, LABEL_DEPLOYMENT, LABEL_ENGINE, LABEL_METHOD, LABEL_TRACK
from specgate_lab.engines import benchmark_command, engine_command

ENGINE_ANNOTATION = "specgate.dev/lab-engine"
# "true": the engine's processes are pinned to one CPU (the one fewest pinned engines use), as a
# Guaranteed pod is to cores of its own by a node's static CPU manager; other processes may still run
# there, and the kernel balances them onto the other cores. A vLLM engine is two busy processes (its
# engine core spins on the queue to its worker while the worker computes a step): floating over two
# cores beside other work, either can take the worker's core; on one core the spinner yields to its
# own worker.
PIN_CPU_ANNOTATION = "specgate.dev/lab-pin-cpu"
TARGET_LABELS = {
    LABEL_DEPLOYMENT: "specgate_dev_deployment",
    LABEL_TRACK: "specgate_dev_track",
    LABEL_METHOD: "specgate_dev_method",
}
# The scrape intervals the lab's Prometheus has a job for (one file_sd directory each), and the one
# a pod gets without a SpeculativeDeployment saying otherwise (the field's default).
SCRAPE_INTERVALS = ("2s", "15s", "30s", "60s")
DEFAULT_SCRAPE_INTERVAL = "15s"
POLL_SECONDS = 1.0
RESTART_BACKOFF_SECONDS = 5.0
# On a cluster a starting pod has its own GPU; here it shares two cores with the engines that serve
# the load, and a vLLM canary took 150 s to start beside a busy baseline against 40 s on an idle
# machine. Until it is first Ready, an engine's processes run at this nice value (the bridge runs
# as root; without the privilege every engine runs at the default).
STARTING_NICE = -5
LOOPBACK = "127.0.0.1"
ENGINE_PORT_NAME = "http"  # the rendered engine container's port (8000), which EndpointSlices name
LOG_TAIL_BYTES = 2048  # terminationMessagePolicy FallbackToLogsOnError: the log's tail on failure
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}

log = logging.getLogger("specgate.bridge")


@dataclass(frozen=True)
class ReadinessProbe:
    """A container's readinessProbe, as a kubelet reads it (Kubernetes' defaults where unset)."""

    period: float = 10.0
    timeout: float = 1.0
    failures: int = 3

    @staticmethod
    def of(container: Any) -> ReadinessProbe:
        probe = container.readiness_probe
        if probe is None:
            return ReadinessProbe()
        return ReadinessProbe(
            float(probe.period_seconds or 10),
            float(probe.timeout_seconds or 1),
            int(probe.failure_threshold or 3),
        )


@dataclass
class Engine:
    """One local engine process standing in for one pod's container."""

    namespace: str
    pod: str
    uid: str
    labels: dict[str, str]
    host: str  # LOOPBACK, or the pod's own address (Bridge._engine_address)
    port: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    scrape_interval: str = DEFAULT_SCRAPE_INTERVAL  # a SCRAPE_INTERVALS entry: the target's directory
    requested_interval: str | None = None  # the owner's scrapeInterval as last seen
    cpu: int | None = None  # the one CPU its processes are pinned to (PIN_CPU_ANNOTATION)
    pre_stop_seconds: float = 0.0  # its container's preStop sleep: it serves this long after its pod goes
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False
    restarts: int = 0
    exited_at: float | None = None
    last_exit_code: int | None = None  # the engine process's, for the pod's lastState
    probe: ReadinessProbe = field(default_factory=ReadinessProbe)
    failures: int = 0  # /health probes failed in a row
    last_probe: float | None = None  # loop time of the last probe counted
    shipped: int = 0  # bytes of log_path already copied to the CRI log

    @property
    def key(self) -> str:
        return f"{self.namespace}_{self.pod}"

    @property
    def address(self) -> str:
        """host:port, where its /health, /metrics and the Service router reach it."""
        return f"{self.host}:{self.port}"

    @property
    def cri_log(self) -> Path:
        return self.log_path.with_suffix(".cri.log")

    @property
    def previous_cri_log(self) -> Path:
        return self.log_path.with_suffix(".previous.cri.log")

    def ship_log(self, partial: bool = False) -> None:
        """Copy the engine's new output lines to the CRI log (a partial last line only once it exited)."""
        with contextlib.suppress(FileNotFoundError), self.log_path.open("rb") as plain:
            plain.seek(self.shipped)
            new = plain.read()
        end = len(new) if partial else new.rfind(b"\n") + 1
        if end <= 0:
            return
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lines = new[:end].decode(errors="replace").splitlines()
        with self.cri_log.open("a") as cri:
            cri.writelines(f"{stamp} stdout F {line}\n" for line in lines)
        self.shipped += end

    def start(self) -> None:
        if self.cri_log.exists():  # as a kubelet keeps the last ended container's log
            self.ship_log(partial=True)
            os.replace(self.cri_log, self.previous_cri_log)
        self.cri_log.touch()
        self.shipped = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.exited_at = None
        self.prioritize(starting=True)  # the engine's own processes fork later and inherit it
        if self.cpu is not None:  # ... as they inherit this: vLLM imports for seconds before it spawns
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.process.pid, {self.cpu})
        log.info(
            "started %s/%s on %s (pid %d%s): %s",
            self.namespace,
            self.pod,
            self.address,
            self.process.pid,
            "" if self.cpu is None else f", CPU {self.cpu}",
            self.argv,
        )

    def stop(self) -> None:
        if self.process is not None:
            _stop(self.process)

    def prioritize(self, *, starting: bool) -> None:
        """STARTING_NICE for the engine's processes while it starts, the default once Ready. The engine
        runs in its own session, which the kernel's autogroup scheduling (where enabled) weighs as one
        unit against the others: its nice is the autogroup's, and a process's own applies only within."""
        if self.process is None:
            return
        nice = STARTING_NICE if starting else 0
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.process.pid}/autogroup").write_text(str(nice))
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PGRP, self.process.pid, nice)

    def target(self) -> list[dict[str, Any]]:
        labels = {"namespace": self.namespace, "pod": self.pod}
        labels |= {target: self.labels[k] for k, target in TARGET_LABELS.items() if k in self.labels}
        return [{"targets": [self.address], "labels": labels}]


@dataclass
class BenchmarkPod:
    """One benchmark Job pod's program, run locally; reported once when it exits."""

    namespace: str
    pod: str
    container: str
    image: str
    process: subprocess.Popen[bytes]
    log_path: Path
    message_path: Path
    started_at: str
    reported: bool = False

    def message(self, exit_code: int) -> str:
        text = self.message_path.read_text() if self.message_path.exists() else ""
        if not text and exit_code != 0 and self.log_path.exists():
            text = self.log_path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
        return text


@dataclass
class Bridge:
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    state_dir: Path
    default_engine: str
    router_url: str
    engines: dict[str, Engine] = field(default_factory=dict)  # by pod uid
    draining: dict[str, Engine] = field(
        default_factory=dict
    )  # gone pods' engines in their preStop, by address
    benchmarks: dict[str, BenchmarkPod] = field(default_factory=dict)  # by pod uid
    services: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    _round_robin: dict[tuple[str, str], itertools.count[int]] = field(default_factory=dict)

    @property
    def targets_dir(self) -> Path:
        return self.state_dir / "targets"

    def target_path(self, engine: Engine) -> Path:
        return self.targets_dir / engine.scrape_interval / f"{engine.key}.json"

    # --- reconcile pods into engines ---

    async def run(self) -> None:
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "engines").mkdir(parents=True, exist_ok=True)
        for stale in self.targets_dir.rglob("*.json"):
            stale.unlink()
        for interval in SCRAPE_INTERVALS:
            (self.targets_dir / interval).mkdir(exist_ok=True)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
            while True:
                try:
                    await self.reconcile(session)
                except Exception:  # the API server may restart under us; try again next tick
                    log.exception("reconcile failed")
                await asyncio.sleep(POLL_SECONDS)

    async def reconcile(self, session: aiohttp.ClientSession) -> None:
        pods = await asyncio.to_thread(
            self.core.list_pod_for_all_namespaces, label_selector=f"{LABEL_ENGINE}=vllm"
        )
        items: list[Any] = pods.items
        running = {p.metadata.uid: p for p in items if _is_running(p)}
        for uid in list(self.engines):
            if uid not in running:
                self._remove(self.engines.pop(uid))
        intervals = await self._scrape_intervals() if running else {}
        for uid, pod in running.items():
            engine = self.engines.get(uid) or self._add(pod)
            if engine is None:
                continue  # its address is still a gone pod's, in its preStop: next tick
            self._place_target(engine, intervals.get((engine.namespace, engine.labels.get(LABEL_DEPLOYMENT))))
        await asyncio.gather(*(self._check(e, session) for e in self.engines.values()))
        for uid, engine in self.engines.items():
            await self._sync_pod_status(running[uid], engine)
        svcs: list[Any] = (await asyncio.to_thread(self.core.list_service_for_all_namespaces)).items
        self.services = {(s.metadata.namespace, s.metadata.name): dict(s.spec.selector or {}) for s in svcs}
        await self._run_benchmarks()
        self._write_state()

    # --- benchmark Job pods ---

    async def _run_benchmarks(self) -> None:
        pods: list[Any] = (
            await asyncio.to_thread(self.core.list_pod_for_all_namespaces, label_selector=LABEL_BENCHMARK)
        ).items
        present = {p.metadata.uid: p for p in pods if p.metadata.deletion_timestamp is None}
        for uid in list(self.benchmarks):
            if uid not in present:
                _stop(self.benchmarks.pop(uid).process)
        for uid, pod in present.items():
            if uid not in self.benchmarks and pod.status and pod.status.phase == "Running":
                self.benchmarks[uid] = self._start_benchmark(pod)
        for run in self.benchmarks.values():
            if not run.reported and run.process.poll() is not None:
                await self._report_benchmark(run)

    def _start_benchmark(self, pod: Any) -> BenchmarkPod:
        container = pod.spec.containers[0]
        env = {e.name: e.value for e in container.env or [] if e.value is not None}
        key = f"{pod.metadata.namespace}_{pod.metadata.name}"
        log_path = self.state_dir / "engines" / f"{key}.log"
        message_path = self.state_dir / "engines" / f"{key}.termination-log"
        message_path.unlink(missing_ok=True)
        argv, run_env = benchmark_command(list(container.command or []), env, self.router_url)
        run_env["SPECGATE_TERMINATION_LOG"] = str(message_path)
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                argv, env=run_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        log.info("benchmark %s/%s started (pid %d)", pod.metadata.namespace, pod.metadata.name, process.pid)
        return BenchmarkPod(
            namespace=pod.metadata.namespace,
            pod=pod.metadata.name,
            container=container.name,
            image=container.image,
            process=process,
            log_path=log_path,
            message_path=message_path,
            started_at=_now(),
        )

    async def _report_benchmark(self, run: BenchmarkPod) -> None:
        code = run.process.returncode
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": run.message(code),
            "startedAt": run.started_at,
            "finishedAt": _now(),
        }
        body = {
            "status": {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [
                    {"type": kind, "status": "False", "lastTransitionTime": _now()} for kind in ("Ready", "ContainersReady")
                ],
                "containerStatuses": [
                    {"name": run.container, "image": run.image, "imageID": "", "ready": False, "restartCount": 0,
                     "started": False, "state": {"terminated": terminated}}
                ],
            }
        }  # fmt: skip
        try:
            await asyncio.to_thread(self.core.patch_namespaced_pod_status, run.pod, run.namespace, body)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        run.reported = True
        log.info("benchmark %s/%s exited with %s", run.namespace, run.pod, code)

    # --- scrape intervals ---

    async def _scrape_intervals(self) -> dict[tuple[str, str | None], str | None]:
        """Each SpeculativeDeployment's spec.rollout.metrics.scrapeInterval (None where unset), by
        namespace and name."""
        try:
            found: Any = await asyncio.to_thread(
                self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL
            )
        except client.ApiException as exc:
            if exc.status != 404:  # 404: the CRD is not installed, so no pod has an owner
                raise
            return {}
        intervals: dict[tuple[str, str | None], str | None] = {}
        for item in found.get("items", []):
            meta, spec = item.get("metadata", {}), item.get("spec") or {}
            metrics = (spec.get("rollout") or {}).get("metrics") or {}
            intervals[(meta.get("namespace", ""), meta.get("name"))] = metrics.get("scrapeInterval")
        return intervals

    def _place_target(self, engine: Engine, requested: str | None) -> None:
        """Write the engine's target into the directory of its owner's scrape interval, moving it when
        that interval changed (a PodMonitor's new interval applies to running pods too)."""
        interval = scrape_interval_dir(requested)
        if requested != engine.requested_interval and interval is None:
            log.warning(
                "%s/%s: scrapeInterval %r is not one the lab's Prometheus scrapes at (%s); using %s",
                engine.namespace,
                engine.pod,
                requested,
                ", ".join(SCRAPE_INTERVALS),
                DEFAULT_SCRAPE_INTERVAL,
            )
        engine.requested_interval = requested
        interval = interval or DEFAULT_SCRAPE_INTERVAL
        path = self.target_path(engine)
        if interval == engine.scrape_interval and path.exists():
            return
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        if interval != engine.scrape_interval:
            log.info("%s/%s scraped every %s", engine.namespace, engine.pod, interval)
        engine.scrape_interval = interval
        _write_json(self.target_path(engine), engine.target())

    def _add(self, pod: Any) -> Engine | None:
        """The pod's engine, started; None while its address is still a gone pod's engine's (kwok
        hands a freed address out again at once, where a node frees it once the old pod has ended)."""
        container = pod.spec.containers[0]
        annotations = pod.metadata.annotations or {}
        kind = annotations.get(ENGINE_ANNOTATION, self.default_engine)
        host, port = self._engine_address(pod.status.pod_ip, container)
        if f"{host}:{port}" in self.draining:
            return None
        pod_env = {e.name: e.value for e in container.env or [] if e.value is not None}
        argv, env = engine_command(kind, list(container.args or []), port, pod_env, host)
        engine = Engine(
            namespace=pod.metadata.namespace,
            pod=pod.metadata.name,
            uid=pod.metadata.uid,
            labels=dict(pod.metadata.labels or {}),
            host=host,
            port=port,
            argv=argv,
            env=env,
            log_path=self.state_dir / "engines" / f"{pod.metadata.namespace}_{pod.metadata.name}.log",
            cpu=self._free_cpu() if annotations.get(PIN_CPU_ANNOTATION) == "true" else None,
            pre_stop_seconds=_pre_stop_seconds(container),
            probe=ReadinessProbe.of(container),
        )
        engine.start()
        self.engines[engine.uid] = engine
        self._serve_logs(engine, container.name)
        return engine

    def _engine_address(self, pod_ip: str, container: Any) -> tuple[str, int]:
        """The pod's address and "http" containerPort where this host can bind that address, so that
        what an EndpointSlice names is the engine; otherwise (kwok's default pod addresses exist
        nowhere here) a free loopback port."""
        port = next((p.container_port for p in container.ports or [] if p.name == ENGINE_PORT_NAME), None)
        if port is not None and _can_bind(pod_ip):
            return pod_ip, port
        return LOOPBACK, _free_port({e.port for e in self.engines.values() if e.host == LOOPBACK})

    def _free_cpu(self) -> int:
        """The CPU the fewest engines with a CPU of their own use (the lowest of equals)."""
        used = [e.cpu for e in self.engines.values() if e.cpu is not None]
        return min(sorted(os.sched_getaffinity(0)), key=used.count)

    def _serve_logs(self, engine: Engine, container: str) -> None:
        """A kwok Logs object naming the engine's CRI logs, owned by the pod (gone with it)."""
        owner = {"apiVersion": "v1", "kind": "Pod", "name": engine.pod, "uid": engine.uid}
        logs = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {"name": engine.pod, "namespace": engine.namespace, "ownerReferences": [owner]},
            "spec": {
                "logs": [
                    {
                        "containers": [container],
                        "logsFile": str(engine.cri_log),
                        "previousLogsFile": str(engine.previous_cri_log),
                        "follow": True,
                    }
                ]
            },
        }
        try:
            self.custom.create_namespaced_custom_object(
                "kwok.x-k8s.io", "v1alpha1", engine.namespace, "logs", logs
            )
        except client.ApiException as exc:
            if exc.status != 409:  # a bridge restarted: the pod's Logs object is there already
                log.warning(
                    "kubectl logs will not work for %s/%s: %s", engine.namespace, engine.pod, exc.reason
                )

    def _remove(self, engine: Engine, at_once: bool = False) -> None:
        """Its pod is gone: no more routing or scraping; the engine keeps serving what a gateway still
        sends it for its preStop sleep, as a kubelet runs the hook before SIGTERM (then it finishes
        what is in flight, as vLLM does)."""
        with contextlib.suppress(FileNotFoundError):
            self.target_path(engine).unlink()
        if at_once or engine.pre_stop_seconds <= 0:
            self._stop_engine(engine)
            return
        self.draining[engine.address] = engine
        timer = threading.Timer(engine.pre_stop_seconds, self._stop_engine, (engine,))
        timer.daemon = True
        timer.start()

    def _stop_engine(self, engine: Engine) -> None:
        engine.stop()
        self.draining.pop(engine.address, None)
        log.info("stopped %s/%s", engine.namespace, engine.pod)

    async def _check(self, engine: Engine, session: aiohttp.ClientSession) -> None:
        """Ready when /health answers 200; an engine that died is restarted after a back-off."""
        proc = engine.process
        if proc is not None and proc.poll() is not None:
            engine.ready = False
            loop_time = asyncio.get_running_loop().time()
            if engine.exited_at is None:
                engine.ship_log(partial=True)
                engine.exited_at = loop_time
                engine.last_exit_code = proc.returncode
                log.warning("%s/%s exited with %s", engine.namespace, engine.pod, proc.returncode)
            elif loop_time - engine.exited_at >= RESTART_BACKOFF_SECONDS * (engine.restarts + 1):
                engine.restarts += 1
                engine.start()
            return
        engine.ship_log()
        now = asyncio.get_running_loop().time()
        if engine.ready and engine.last_probe is not None and now - engine.last_probe < engine.probe.period:
            return  # a kubelet probes a Ready pod once a period
        engine.last_probe = now
        try:
            timeout = aiohttp.ClientTimeout(total=engine.probe.timeout)
            async with session.get(f"http://{engine.address}/health", timeout=timeout) as resp:
                healthy = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            healthy = False
        if healthy:
            if not engine.ready:
                engine.prioritize(starting=False)
            engine.ready, engine.failures = True, 0
            return
        # As a kubelet: a Ready pod turns unready after failureThreshold probes in a row, each
        # given the probe's timeoutSeconds; a pod that never was Ready stays unready.
        engine.failures += 1
        if engine.failures >= engine.probe.failures:
            engine.ready = False

    async def _sync_pod_status(self, pod: Any, engine: Engine) -> None:
        """Pod readiness follows the engine's /health, as a readinessProbe would; a crashing engine
        shows CrashLoopBackOff. (kwok marks pods Ready at once and does not touch them afterwards.)"""
        crashing = engine.restarts > 0 and not engine.ready
        ready = "True" if engine.ready else "False"
        current = next((c.status for c in pod.status.conditions or [] if c.type == "Ready"), None)
        statuses = pod.status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses and statuses[0].state else None
        if current == ready and (waiting is not None) == crashing:
            return
        now = _now()
        state: dict[str, Any] = {"running": {"startedAt": now}}
        if crashing:
            state = {
                "waiting": {"reason": "CrashLoopBackOff", "message": f"engine exited; see {engine.log_path}"}
            }
        container = pod.spec.containers[0]
        # As the kubelet reports a container that ended: exit code, and "Error" for a non-zero one.
        last = (
            {"terminated": {"exitCode": engine.last_exit_code, "reason": "Error" if engine.last_exit_code else "Completed",
                            "finishedAt": now}}
            if crashing and engine.last_exit_code is not None
            else {}
        )  # fmt: skip
        body = {
            "status": {
                "conditions": [
                    {"type": kind, "status": ready, "lastTransitionTime": now} for kind in ("Ready", "ContainersReady")
                ],
                "containerStatuses": [
                    {"name": container.name, "image": container.image, "imageID": "", "ready": engine.ready,
                     "restartCount": engine.restarts, "started": not crashing, "state": state, "lastState": last}
                ],
            }
        }  # fmt: skip
        try:
            await asyncio.to_thread(self.core.patch_namespaced_pod_status, engine.pod, engine.namespace, body)
        except client.ApiException as exc:
            if exc.status != 404:  # the pod went away meanwhile
                raise

    def _write_state(self) -> None:
        state = {
            f"{e.namespace}/{e.pod}": {
                "host": e.host,
                "port": e.port,
                "pid": e.process.pid if e.process else None,
                "ready": e.ready,
                "restarts": e.restarts,
                "scrapeInterval": e.scrape_interval,
                "labels": e.labels,
                "log": str(e.log_path),
            }
            for e in self.engines.values()
        }
        _write_json(self.state_dir / "bridge-state.json", state)

    # --- Service router ---

    def pick(self, namespace: str, service: str) -> Engine | None:
        selector = self.services.get((namespace, service))
        if not selector:
            return None
        ready = sorted(
            (
                e
                for e in self.engines.values()
                if e.namespace == namespace and e.ready and selector.items() <= e.labels.items()
            ),
            key=lambda e: e.pod,
        )
        if not ready:
            return None
        counter = self._round_robin.setdefault((namespace, service), itertools.count())
        return ready[next(counter) % len(ready)]


def scrape_interval_dir(requested: str | None) -> str | None:
    """The SCRAPE_INTERVALS entry equal to a scrapeInterval ("1m" is "60s"); the default for None;
    None for an interval the lab does not scrape at, or not a duration."""
    if requested is None:
        return DEFAULT_SCRAPE_INTERVAL
    try:
        seconds = parse_duration(requested)
    except (TypeError, ValueError):
        return None
    return next((i for i in SCRAPE_INTERVALS if parse_duration(i) == seconds), None)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL after 15 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _pre_stop_seconds(container: Any) -> float:
    """The container's preStop sleep (the rendered pods have one), 0 without."""
    sleep = container.lifecycle and container.lifecycle.pre_stop and container.lifecycle.pre_stop.sleep
    return float(sleep.seconds) if sleep else 0.0


def _is_running(pod: Any) -> bool:
    """Running with an address (kwok sets both in one update): an engine may bind the pod's address."""
    return bool(
        pod.status
        and pod.status.phase == "Running"
        and pod.status.pod_ip
        and pod.metadata.deletion_timestamp is None
    )


# Engine ports come from below Linux's ephemeral range (32768 and up by default): a port the kernel
# picked (bind to 0) was free then, but any outgoing connection could take it before the engine
# bound it, and that engine crash-looped. Ports are handed out in turn, so a freed one rests.
_ENGINE_PORTS = itertools.cycle(range(20000, 32768))


def _free_port(taken: set[int]) -> int:
    for _ in range(32768 - 20000):
        port = next(_ENGINE_PORTS)
        if port not in taken and _can_bind(LOOPBACK, port):
            return port
    raise RuntimeError("no free engine port in 20000-32767")


def _can_bind(host: str, port: int = 0) -> bool:
    """Whether this host can listen on host:port (port 0: whether the address is one of its own)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:  # an address not here (EADDRNOTAVAIL), a port in use, or not IPv4
            return False
    return True


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)  # atomic: Prometheus never reads half a file


def make_app(bridge: Bridge) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def state(_: web.Request) -> web.Response:
        return web.json_response(
            {
                f"{e.namespace}/{e.pod}": {
                    "host": e.host,
                    "port": e.port,
                    "ready": e.ready,
                    "pid": e.process.pid if e.process else None,
                    "cpu": e.cpu,
                }
                for e in bridge.engines.values()
            }
        )

    async def proxy(request: web.Request) -> web.StreamResponse:
        ns, svc, tail = request.match_info["ns"], request.match_info["svc"], request.match_info["tail"]
        engine = bridge.pick(ns, svc)
        if engine is None:
            return web.json_response({"error": f"service {ns}/{svc} has no Ready endpoints"}, status=503)
        url = f"http://{engine.address}/{tail}"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        session: aiohttp.ClientSession = request.app["session"]
        async with session.request(
            request.method, url, params=request.query, data=await request.read(), headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.headers.update(
                {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
            )
            response.headers["X-Specgate-Pod"] = engine.pod
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def on_startup(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        app["loop_task"] = asyncio.create_task(bridge.run())

    async def on_cleanup(app: web.Application) -> None:
        app["loop_task"].cancel()
        await app["session"].close()
        for engine in [*bridge.engines.values(), *bridge.draining.values()]:
            bridge._remove(engine, at_once=True)
        for run in bridge.benchmarks.values():
            _stop(run.process)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/state", state)
    app.router.add_route("*", "/svc/{ns}/{svc}/{tail:.*}", proxy)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument(
        "--default-engine", default=os.environ.get("SPECGATE_LAB_ENGINE", "sim"), choices=["sim", "vllm"]
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config.load_kube_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    bridge = Bridge(
        core=client.CoreV1Api(),
        custom=client.CustomObjectsApi(),
        state_dir=args.state_dir,
        default_engine=args.default_engine,
        router_url=f"http://127.0.0.1:{args.port}",
    )
    web.run_app(make_app(bridge), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
