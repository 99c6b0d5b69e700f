"""Scale benchmark (`make bench-scale`): N SpeculativeDeployments on one operator, on a control plane
of its own (kwokctl: etcd, kube-apiserver with an audit log, controller manager, scheduler, kwok's
fake nodes and pods, which turn Ready at once: no engine runs, the point is the operator and the API
server).

Each object goes Pending -> Baseline (its Deployment, a pod) and, as its Prometheus (a real one,
scraping nothing) has no series of it, on to RolledBack (MetricsUnavailable after
metricsUnavailableBudget 20s): a settled phase. A tenth stay measuring (a budget of hours), each
sending its Baseline query every tick. Another tenth are guarded: no engine runs here to pass an
analysis, so once such an object is in Baseline the bench writes its status as a promotion leaves it
(phase Promoted, its template hash passed); from then on the operator guards it as any promoted
object, querying the canary's metrics every tick (its guard stays blind: Warn keeps it Promoted).
Then nothing is changed for IDLE seconds, and the API server's audit log counts the operator's
requests (user agents specgate/* and kopf/*).

Then ONE_BY_ONE more objects are applied one at a time beside the N.

Figures: idle API requests per minute per object (all objects, measuring ones included), PromQL
queries per minute per measuring and per guarded object (the operator's
specgate_prometheus_queries_total, by track: baseline for the measuring, canary for the guarded), the
operator's RSS (with the image's MALLOC_ARENA_MAX), reconcile latency p50/p99
(specgate_reconcile_seconds, bucket upper bounds), and the time from a create call's return to the
watch's first sight of the object's Deployment (p50, p99): for the objects applied one at a time
beside N (apply_to_deployment_*), and for the N applied at once (burst_*: as fast as the API server
takes them, so the operator's throughput on this machine, not its reaction time).

    .venv/bin/python bench/scale.py [--objects 500] [--idle 180]
    BENCH_MEMPROBE=1 make bench-scale    # also print what holds the operator's memory (bench/memprobe.py)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config, watch

from specgate.api import iso
from specgate_lab.calibrate import stop
from specgate_lab.crds import install_crd

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SPECGATE_CACHE", Path.home() / ".cache" / "specgate"))
BIN = CACHE / "bin"
CLUSTER = "specgate-scale"
WORKDIR = CACHE / "scale"
NAMESPACE = "scale"
PROMETHEUS_PORT = 18098
METRICS_PORT = 18099
# The Dockerfile's MALLOC_ARENA_MAX (glibc-default: unset, to compare)
ARENAS = os.environ.get("BENCH_MALLOC_ARENA_MAX", "1")
# Run the operator under bench/memprobe.py and print what holds its memory at the end, after the
# RSS figure is read (the probe's walk over every object allocates).
MEMPROBE = os.environ.get("BENCH_MEMPROBE") == "1"
SD_RESOURCE = ("specgate.dev", "v1alpha1", NAMESPACE, "speculativedeployments")
ONE_BY_ONE, ONE_BY_ONE_GAP_S = 20, 3.0  # objects applied one at a time beside the N settled ones
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
"""
OPERATOR_AGENTS = ("specgate/", "kopf/")


def log(message: str) -> None:
    print(f"[bench-scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def kwokctl(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run([str(BIN / "kwokctl"), *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"kwokctl {' '.join(args[:3])} failed:\n{done.stderr[-3000:]}")


def cluster_env() -> dict[str, str]:
    version = subprocess.run(
        [str(BIN / "kubectl"), "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        **os.environ,
        "KWOK_WORKDIR": str(WORKDIR),
        "KWOK_KUBE_VERSION": json.loads(version.stdout)["clientVersion"]["gitVersion"],
        "KWOK_KUBECTL_BINARY": str(BIN / "kubectl"),
    }


def create_cluster(env: dict[str, str], kubeconfig: Path) -> Path:
    """A fresh control plane with an audit log; returns the log's path."""
    delete_cluster(env)
    WORKDIR.mkdir(parents=True, exist_ok=True)
    policy = WORKDIR / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    log("creating the control plane (kwokctl, with an audit log)")
    components = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
    kwokctl(
        "create", "cluster", "--name", CLUSTER, "--runtime", "binary",
        *(arg for c in components for arg in (f"--{c}-binary", str(BIN / c))),
        "--kwok-controller-binary", str(BIN / "kwok"),
        "--kube-audit-policy", str(policy),
        "--extra-args", "kube-apiserver=service-cluster-ip-range=10.96.0.0/16",  # a Service each
        "--extra-args", "kube-controller-manager=leader-elect=false",
        "--extra-args", "kube-scheduler=leader-elect=false",
        "--kubeconfig", str(kubeconfig), "--wait", "3m", "--timeout", "5m",
        env=env,
    )  # fmt: skip
    found = list((WORKDIR / "clusters" / CLUSTER).rglob("audit.log"))
    if not found:
        raise SystemExit(
            f"no audit.log under {WORKDIR / 'clusters' / CLUSTER}: kwokctl did not enable auditing"
        )
    return found[0]


def delete_cluster(env: dict[str, str]) -> None:
    subprocess.run(
        [str(BIN / "kwokctl"), "delete", "cluster", "--name", CLUSTER],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def bench_client(kubeconfig: Path) -> client.ApiClient:
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    api.user_agent = "specgate-bench"
    api.configuration.connection_pool_maxsize = 8
    return api  # type: ignore[no-any-return]


def add_node(api: client.ApiClient, pods: int) -> None:
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": str(pods), "nvidia.com/gpu": str(pods)}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "scale-node",
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": "scale-node"},
        },
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
        "status": {"allocatable": capacity, "capacity": capacity},
    }
    client.CoreV1Api(api).create_node(node)


def sample(name: str, budget: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((ROOT / "crds" / "samples" / "tiny-cpu.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": NAMESPACE}
    body["spec"]["rollout"].update(
        warmup="0s",
        analysisWindow="10s",
        metricsUnavailableBudget=budget,
        metrics={"prometheusUrl": f"http://127.0.0.1:{PROMETHEUS_PORT}", "scrapeInterval": "15s"},
    )
    return body


class DeploymentWatch(threading.Thread):
    """When each baseline Deployment was first seen, by the watch of a client of our own."""

    def __init__(self, api: client.ApiClient) -> None:
        super().__init__(daemon=True)
        self.apps = client.AppsV1Api(api)
        self.seen: dict[str, float] = {}

    def run(self) -> None:
        # The bench's end takes the control plane away, and the watch with it.
        with contextlib.suppress(urllib3.exceptions.HTTPError, OSError):
            while True:
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.apps.list_namespaced_deployment, NAMESPACE, timeout_seconds=300
                )
                for event in stream:
                    name = event["object"].metadata.name
                    if name.endswith("-baseline"):
                        self.seen.setdefault(name.removesuffix("-baseline"), time.monotonic())


def start_prometheus(state: Path) -> subprocess.Popen[bytes]:
    """A real Prometheus that scrapes nothing: every track's query answers, with no series."""
    (state / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    command = [
        str(BIN / "prometheus3"),
        f"--config.file={state / 'prometheus.yml'}",
        f"--storage.tsdb.path={state / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}",
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=(state / "prometheus.log").open("wb"))


def start_operator(kubeconfig: Path, log_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    if ARENAS != "glibc-default":
        env["MALLOC_ARENA_MAX"] = ARENAS  # as the image runs it
    command = [str(ROOT / ".venv" / "bin" / "specgate")]
    if MEMPROBE:
        command = [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "bench" / "memprobe.py")]
        env["SPECGATE_MEMPROBE_OUT"] = str(log_path.with_name("memprobe.txt"))
    command += ["run", "--interval", "10"]
    command += ["--metrics-port", str(METRICS_PORT)] + (["-v"] if os.environ.get("BENCH_VERBOSE") else [])
    return subprocess.Popen(command, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)


def phases(api: client.ApiClient) -> collections.Counter[str]:
    listed: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "specgate.dev", "v1alpha1", NAMESPACE, "speculativedeployments"
    )
    return collections.Counter((item.get("status") or {}).get("phase", "none") for item in listed["items"])


def promote(api: client.ApiClient, names: list[str]) -> None:
    """Write the status a promotion leaves to each of these objects the operator has in Baseline.
    Called until all are Promoted: during the burst the operator's watch lags by seconds, and a
    reconcile from that older view writes its whole status back over this one (only the operator
    writes status in a real cluster)."""
    objects_api = client.CustomObjectsApi(api)
    for name in names:
        status = objects_api.get_namespaced_custom_object(*SD_RESOURCE, name).get("status") or {}
        if status.get("phase") != "Baseline" or not status.get("templateHash"):
            continue
        promoted = {
            "phase": "Promoted",
            "reason": "Promoted",
            "passedTemplateHash": status["templateHash"],
            "phaseSince": iso(datetime.now(UTC)),
        }
        objects_api.patch_namespaced_custom_object_status(*SD_RESOURCE, name, {"status": promoted})


def operator_metrics() -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).read().decode()
    figures = {}
    for line in text.splitlines():
        match = re.fullmatch(
            r"(specgate_(?:reconcile_seconds_bucket|prometheus_queries_total)\S*) (\S+)", line
        )
        if match:
            figures[match[1]] = float(match[2])
    return figures


def quantile_bound(figures: dict[str, float], q: float) -> float:
    """The smallest bucket bound holding q of the reconciles (an upper bound of the quantile)."""
    buckets = sorted(
        (float(m[1]), count)
        for key, count in figures.items()
        if (m := re.search(r'le="([^"]+)"', key)) and key.startswith("specgate_reconcile_seconds_bucket")
    )
    total = buckets[-1][1]
    return next(bound for bound, count in buckets if count >= q * total)


def operator_requests(audit_log: Path, since: float, until: float) -> collections.Counter[str]:
    """The operator's requests the API server completed in [since, until] (wall clock), by verb and
    resource."""
    counts: collections.Counter[str] = collections.Counter()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        if not event.get("userAgent", "").startswith(OPERATOR_AGENTS):
            continue
        stamp = datetime.fromisoformat(event["stageTimestamp"]).timestamp()
        if since <= stamp <= until:
            ref = event.get("objectRef") or {}
            what = (
                "/".join(filter(None, (ref.get("resource"), ref.get("subresource")))) or event["requestURI"]
            )
            counts[f"{event['verb']} {what} {event['userAgent'].split(' ')[0]}"] += 1
    return counts


def seen_after(deployments: DeploymentWatch, created: dict[str, float]) -> list[float]:
    """Seconds from each create call's return to the watch's first sight of its Deployment (a
    minute at most for the last)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not created.keys() <= deployments.seen.keys():
        time.sleep(1)
    return [deployments.seen[name] - t for name, t in created.items() if name in deployments.seen]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) / 1024  # type: ignore[index]


def print_memprobe(operator: subprocess.Popen[bytes], report: Path) -> None:
    operator.send_signal(signal.SIGUSR1)
    for _ in range(300):
        if report.exists():
            time.sleep(1)  # written in one call; let it finish
            print(report.read_text(), flush=True)
            return
        time.sleep(1)
    log(f"no memory report at {report}")


def run(objects: int, idle: float, measuring_share: float) -> dict[str, Any]:
    env = cluster_env()
    state = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    kubeconfig = state / "kubeconfig"
    audit_log = create_cluster(env, kubeconfig)
    operator: subprocess.Popen[bytes] | None = None
    prometheus = start_prometheus(state)
    try:
        api = bench_client(kubeconfig)
        install_crd(api)
        add_node(api, pods=objects * 2)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        for _ in range(60):  # the namespace's ServiceAccount comes from the controller manager
            if client.CoreV1Api(api).list_namespaced_service_account(NAMESPACE).items:
                break
            time.sleep(1)
        operator = start_operator(kubeconfig, state / "operator.log")
        deployments = DeploymentWatch(api)
        deployments.start()
        time.sleep(5)
        objects_api = client.CustomObjectsApi(api)
        measuring = guarded = max(1, round(objects * measuring_share))
        created: dict[str, float] = {}
        log(f"creating {objects} SpeculativeDeployments ({measuring} kept measuring, {guarded} guarded)")
        for i in range(objects):
            name = f"sd-{i:04d}"
            body = sample(name, "6h" if i < measuring + guarded else "20s")
            objects_api.create_namespaced_custom_object(
                "specgate.dev", "v1alpha1", NAMESPACE, "speculativedeployments", body
            )
            created[name] = time.monotonic()
        to_guard = [f"sd-{i:04d}" for i in range(measuring, measuring + guarded)]
        deadline = time.monotonic() + 600 + objects
        settled = objects - measuring - guarded
        while (counts := phases(api))["RolledBack"] < settled or counts["Promoted"] < guarded:
            log(f"phases: {dict(counts)}")
            promote(api, to_guard)
            if operator.poll() is not None:
                raise SystemExit(f"the operator exited ({operator.returncode}); see {state / 'operator.log'}")
            if time.monotonic() > deadline:
                raise SystemExit(f"not settled in time: {dict(counts)}; see {state / 'operator.log'}")
            time.sleep(15)
        log(f"settled: {dict(counts)}; idle for {idle:.0f}s")
        time.sleep(30)  # the last settling writes leave the audit window
        before, since = operator_metrics(), time.time()
        time.sleep(idle)
        after, until = operator_metrics(), time.time()
        requests = operator_requests(audit_log, since, until)

        def queries(track: str) -> float:
            key = f'specgate_prometheus_queries_total{{track="{track}"}}'
            return after.get(key, 0.0) - before.get(key, 0.0)

        log(f"creating {ONE_BY_ONE} more, one every {ONE_BY_ONE_GAP_S:.0f}s, beside the {objects}")
        one_by_one: dict[str, float] = {}
        for i in range(ONE_BY_ONE):
            name = f"late-{i:02d}"
            objects_api.create_namespaced_custom_object(*SD_RESOURCE, sample(name, "20s"))
            one_by_one[name] = time.monotonic()
            time.sleep(ONE_BY_ONE_GAP_S)
        burst, late = seen_after(deployments, created), seen_after(deployments, one_by_one)
        minutes = (until - since) / 60
        if (counts := phases(api))["Promoted"] != guarded:
            raise SystemExit(f"guarded objects left Promoted in the idle window: {dict(counts)}")
        log(f"operator requests in the idle window, by verb and resource: {dict(requests.most_common())}")
        rss = rss_mb(operator.pid)
        if MEMPROBE:
            print_memprobe(operator, state / "memprobe.txt")
        return {
            "objects": objects,
            "settled": settled,
            "measuring": measuring,
            "guarded": guarded,
            "idle_window_s": round(until - since),
            "idle_api_calls_per_min_per_object": round(sum(requests.values()) / minutes / objects, 4),
            "promql_per_min_per_measuring_object": round(queries("baseline") / minutes / measuring, 2),
            "promql_per_min_per_guarded_object": round(queries("canary") / minutes / guarded, 2),
            "operator_rss_mb": round(rss, 1),
            "reconcile_p50_s_at_most": quantile_bound(after, 0.5),
            "reconcile_p99_s_at_most": quantile_bound(after, 0.99),
            "apply_to_deployment_p50_s": round(percentile(late, 0.5), 2),
            "apply_to_deployment_p99_s": round(percentile(late, 0.99), 2),
            "burst_apply_to_deployment_p50_s": round(percentile(burst, 0.5), 2),
            "burst_apply_to_deployment_p99_s": round(percentile(burst, 0.99), 2),
            "deployments_never_seen": objects + ONE_BY_ONE - len(burst) - len(late),
        }
    finally:
        if operator is not None:
            stop(operator, timeout=30)
        stop(prometheus, timeout=30)
        delete_cluster(env)
        shutil.rmtree(WORKDIR, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--idle", type=float, default=180, help="seconds of the idle window")
    parser.add_argument("--measuring-share", type=float, default=0.1)
    args = parser.parse_args()
    figures = run(args.objects, args.idle, args.measuring_share)
    print(" ".join(f"{key}={value}" for key, value in figures.items()))


if __name__ == "__main__":
    main()
