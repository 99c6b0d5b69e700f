"""Drive a whole rollout on the local cluster: the operator as a process, load through the Service."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.figures import report as report  # where the tests have always imported it from
from tests.cluster.operator_process import Operator, create_sd, get_sd
from tests.conftest import ROOT, tiny

from specgate import api
from specgate.rollout import HISTORY_LIMIT
from specgate_lab.crds import install_crd
from specgate_lab.kube import fake_gpu_node as fake_gpu_node  # where the tests have always imported them from
from specgate_lab.kube import pin_to_node as pin_to_node
from specgate_lab.loadgen import LoadResult, run_load

SETTLED = {"Promoted", "RolledBack", "Failed", "Paused"}
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def sim_rollout(name: str, env: dict[str, str], **rollout: Any) -> dict[str, Any]:
    """A SpeculativeDeployment served by simulated engines, with short windows for tests."""
    body = tiny(name)
    spec = body["spec"]
    spec["podAnnotations"] = {"specgate.dev/lab-engine": "sim"}
    # The bridge starts engines with the pod's env: run this checkout's simulator, wherever the
    # bridge itself was started from.
    env = {"PYTHONPATH": f"{ROOT / 'lab'}:{ROOT / 'operator'}", **env}
    spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    spec["speculative"] = {
        "method": "eagle3",
        "draftModel": "specgate/tiny-llama-eagle3",
        "numSpeculativeTokens": 3,
    }
    spec["rollout"] = fast_rollout(**rollout)
    return body


def lab_operator(
    kubeconfig: str, namespace: str, prometheus_url: str, log_dir: Path, *extra: str
) -> Operator:
    """The operator as the cluster tests run it: scoped to the test's namespace."""
    return Operator(kubeconfig, log_dir, "--namespace", namespace, "--prometheus-url", prometheus_url, *extra)


def service_urls(bridge_url: str, namespace: str, services: Sequence[str]) -> list[str]:
    """The bridge's router to each Service's Ready pods (round robin, as kube-proxy spreads them)."""
    return [f"{bridge_url}/svc/{namespace}/{service}" for service in services]


def fast_rollout(**overrides: Any) -> dict[str, Any]:
    rollout: dict[str, Any] = {
        "warmup": "5s",
        "analysisWindow": "20s",
        "maxAnalysisDuration": "4m",
        "progressDeadline": "3m",
        "metricsUnavailableBudget": "30s",
        # The latency gates on simulated engines read the machine more than the draft. The step
        # stall (P99 ITL): the sim's eagle3 step at K=3 is 1.3-1.6x a plain one (sim/model.py
        # step_seconds), and a loaded CI machine starved one track's simulator into 190-200 ms
        # stalls against 41-47 ms (a day-2 test's guard and another's analysis rolled good canaries
        # back for it). The per-token P99 sits in vLLM's 10-25 ms or 25-50 ms bucket, where a few
        # minutes of the lab's traffic cannot tell 10 % (issue 58: the adoption and near-gate tests
        # ended Inconclusive on "cannot tell 10% yet ... over 632 samples", with alpha and the
        # speedup decided). Tests whose question is a latency gate set theirs (the heavy draft's
        # stall: 1.0).
        "gates": {
            "minDrafts": 100,
            "minLatencySamples": 50,
            "maxP99ItlRegression": 50,
            "maxP99PerTokenRegression": 10,
        },
        "guard": {"window": "60s"},
        # Speed only: the lab scrapes these at 2 s. Claims about measurement are tested at 15-60 s.
        "metrics": {"scrapeInterval": "2s"},
    }
    for key, value in overrides.items():
        rollout[key] = {**rollout[key], **value} if isinstance(value, dict) and key in rollout else value
    return rollout


class Load:
    """Closed-loop load on each URL (an OpenAI server's base: the bridge's Service router or a
    gateway), in a background thread from entering to leaving the `with` block (at most `duration`
    seconds); `results` fill in as it runs, one per URL."""

    def __init__(
        self,
        urls: Sequence[str],
        model: str,
        concurrency: int,
        duration: float,
        results: Sequence[LoadResult] | None = None,
    ) -> None:
        self.results = list(results) if results is not None else [LoadResult() for _ in urls]
        loads = (
            run_load(url, model, concurrency=concurrency, duration=duration, max_tokens=48, result=result)
            for url, result in zip(urls, self.results, strict=True)
        )

        async def drive() -> None:
            await asyncio.gather(*loads)

        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(drive())
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._task)
        self._loop.close()

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        with suppress(RuntimeError):  # the loop is closed already: the load ran its duration
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=30)


@dataclass
class Rollout:
    """What a test saw: the object at the end, and the operator's log."""

    obj: dict[str, Any]
    operator_log: str = ""
    load: LoadResult | None = None  # the client's side of the load, where there was load

    @property
    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.obj.get("status", {})
        return status

    @property
    def phases(self) -> list[str]:
        """Every phase the object entered, in order, as the operator recorded it in status.history:
        a phase shorter than the test's poll is there too, on any machine."""
        return history_phases(self.status)


def history_phases(status: dict[str, Any]) -> list[str]:
    """The phases of status.history, oldest first; fails where the history reached its limit and
    may have dropped its oldest entries."""
    phases = [h["phase"] for h in status.get("history", [])]
    assert len(phases) < HISTORY_LIMIT, f"status.history is at its limit ({HISTORY_LIMIT}): {phases}"
    return phases


def run_rollout(
    api_client: client.ApiClient,
    namespace: str,
    kubeconfig: str,
    bridge_url: str,
    prometheus_url: str,
    body: dict[str, Any],
    log_dir: Path,
    *,
    until: Callable[[dict[str, Any]], bool] = lambda obj: obj.get("status", {}).get("phase") in SETTLED,
    timeout: float = 600,
    concurrency: int = 4,
    during: Callable[[dict[str, Any]], None] | None = None,
    operator: Operator | None = None,
    monitor: CapacityMonitor | None = None,
    load_url: str | None = None,
    load_result: LoadResult | None = None,
) -> Rollout:
    """Create the object, run the operator and load until `until(obj)`; fails with the operator log.

    Pass `operator` (see lab_operator) to act on the operator process from `during`; concurrency 0
    sends no traffic (a quiet service). Throughout, the Service's Ready serving pods may never drop
    below the object's `replicas - maxUnavailable` once reached (CapacityMonitor; pass `monitor` to
    read its figures or tell it of faults from `during`), whatever the verdict. The load goes to
    Service <name> through the bridge, or to `load_url` (a gateway); Rollout.load has its result
    (`load_result`, where given, filling in as the load runs: for `during` to read)."""
    install_crd(api_client)
    body = copy.deepcopy(body)
    name = body["metadata"]["name"]
    served = body["spec"]["model"].get("servedName", body["spec"]["model"]["name"])
    op = operator or lab_operator(kubeconfig, namespace, prometheus_url, log_dir)
    urls = [load_url] if load_url else service_urls(bridge_url, namespace, [name])
    results = [load_result] if load_result is not None else None
    load = Load(urls, served, concurrency, timeout, results) if concurrency else None
    with monitor or CapacityMonitor(api_client, namespace):
        create_sd(api_client, namespace, body)
        with op, load or nullcontext():
            deadline = time.monotonic() + timeout
            obj: dict[str, Any] = {}
            while time.monotonic() < deadline:
                try:
                    obj = get_sd(api_client, namespace, name)
                except ApiException as busy:  # a loaded lab's API server: the next poll reads it
                    if busy.status < 500:
                        raise
                    time.sleep(2)
                    continue
                except urllib3.exceptions.ProtocolError:  # its answer cut off mid-body: the same
                    time.sleep(2)
                    continue
                if during is not None:
                    during(obj)
                if until(obj):
                    report(rollout=f"{namespace}/{name}", timeline=timeline(obj.get("status", {})))
                    return Rollout(obj, op.log_text(), load.results[0] if load else None)
                time.sleep(2)
        raise AssertionError(
            f"rollout did not finish in {timeout:.0f}s; status {obj.get('status')}\n"
            f"operator log tail:\n{op.log_text()[-3000:]}"
        )


def patch_rollout(api_client: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    """A merge patch of the object's spec, as `kubectl patch --type merge` sends it."""
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"spec": spec}
    )


def history_time(status: dict[str, Any], phase: str) -> datetime:
    """When the object last entered `phase`, from status.history."""
    entry = next(h for h in reversed(status["history"]) if h["phase"] == phase)
    parsed = api.parse_time(entry["time"])
    assert parsed is not None
    return parsed


def phase_spans(status: dict[str, Any]) -> list[tuple[str, float]]:
    """Seconds spent in each phase left so far, from status.history."""
    entries = [
        (h["phase"], datetime.fromisoformat(h["time"].replace("Z", "+00:00")))
        for h in status.get("history", [])
    ]
    return [(phase, (later - at).total_seconds()) for (phase, at), (_, later) in pairwise(entries)]


def timeline(status: dict[str, Any]) -> str:
    """Seconds spent in each phase, then the phase it is in: where a rollout's test time goes."""
    spans = [f"{phase}:{seconds:.0f}" for phase, seconds in phase_spans(status)]
    history = status.get("history", [])
    return ",".join([*spans, history[-1]["phase"]] if history else spans)


def orphaned_pods(api_client: client.ApiClient, namespace: str) -> list[str]:
    """Pods whose ReplicaSet, or whose ReplicaSet's Deployment, no longer exists (Job pods aside)."""
    apps = client.AppsV1Api(api_client)
    deployments = {d.metadata.uid for d in apps.list_namespaced_deployment(namespace).items}
    replica_sets = {
        rs.metadata.uid
        for rs in apps.list_namespaced_replica_set(namespace).items
        if any(ref.uid in deployments for ref in rs.metadata.owner_references or [])
    }
    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace).items
    return [
        p.metadata.name
        for p in pods
        if not any(ref.uid in replica_sets or ref.kind == "Job" for ref in p.metadata.owner_references or [])
    ]


# The counts an InsufficientData gate names beside what it needs (gates/, rollout.py): the
# acceptance gate's drafts and windows, a latency histogram's samples (the canary's or a baseline's).
DRAFTS_NEEDED = re.compile(r"(\d+) drafts in (\d+) windows, need (\d+) drafts and (\d+) windows")
SAMPLES_NEEDED = re.compile(r"(\d+) [^;:]*?samples[^;:]*?, need (\d+)")


def short_of(message: str) -> set[str]:
    """What a status message names as short of its need: "drafts", "latency" (samples), or neither."""
    short = set()
    if any(int(d) < int(nd) or int(w) < int(nw) for d, w, nd, nw in DRAFTS_NEEDED.findall(message)):
        short.add("drafts")
    if any(int(n) < int(need) for n, need in SAMPLES_NEEDED.findall(message)):
        short.add("latency")
    return short


def settled_as(status: dict[str, Any]) -> tuple[str, str]:
    """(phase, the reason it was entered with): once Promoted, status.reason follows the guard
    (Guarding), while the history keeps why the phase began."""
    return status["phase"], status["history"][-1]["reason"]


def bucket_edges(prometheus_url: str, namespace: str, name: str, histogram: str) -> dict[str, list[float]]:
    """Each track's finite `le` edges of `histogram` (e.g. vllm:inter_token_latency_seconds) as
    Prometheus scraped them from the object's engines over the last hour, by track."""
    query = f'count by (specgate_dev_track, le) (last_over_time({histogram}_bucket{{namespace="{namespace}",specgate_dev_deployment="{name}"}}[1h]))'
    params = urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/query?{params}", timeout=10) as resp:
        result = json.loads(resp.read())["data"]["result"]
    edges: dict[str, list[float]] = {}
    for series in result:
        le = float(series["metric"]["le"])
        if math.isfinite(le):
            edges.setdefault(series["metric"]["specgate_dev_track"], []).append(le)
    return {track: sorted(values) for track, values in edges.items()}
