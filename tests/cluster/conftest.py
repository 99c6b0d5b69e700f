"""Fixtures for tests on the local real cluster (hack/cluster-up.sh): brought up once per session."""

from __future__ import annotations

import fcntl
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from tests.cluster.figures import FIGURES
from tests.conftest import ROOT

from specgate import api
from specgate_lab.crds import install_crd

CACHE = Path(os.environ.get("SPECGATE_CACHE", Path.home() / ".cache" / "specgate"))
PROMETHEUS_URL = f"http://127.0.0.1:{os.environ.get('SPECGATE_PROMETHEUS_PORT', '19090')}"
BRIDGE_URL = f"http://127.0.0.1:{os.environ.get('SPECGATE_BRIDGE_PORT', '18080')}"


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    """Bring the lab up (a no-op when it runs already); failing to do so fails the tests. One
    pytest-xdist worker at a time (they start together)."""
    env = {**os.environ, "PY": str(ROOT / ".venv" / "bin" / "python")}
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "cluster-up.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run([str(ROOT / "hack" / "cluster-up.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"cluster-up failed:\n{done.stderr[-3000:]}"
    return str(CACHE / "kubeconfig")


@pytest.fixture(scope="session")
def kubectl() -> str:
    return str(CACHE / "bin" / "kubectl")


@pytest.fixture(scope="session")
def prometheus_url(kubeconfig: str) -> str:
    return PROMETHEUS_URL


@pytest.fixture(scope="session")
def bridge_url(kubeconfig: str) -> str:
    return BRIDGE_URL


@pytest.fixture(scope="session")
def api_client(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]


@contextmanager
def fresh_namespace(api_client: client.ApiClient) -> Iterator[str]:
    """A new namespace, deleted afterwards (with everything in it)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    release_finalizers(api_client, name)
    core.delete_namespace(name)


@pytest.fixture
def crd(api_client: client.ApiClient) -> None:
    """The CRD installed (or updated) from this checkout, for modules that create objects without
    an operator: `pytestmark = pytest.mark.usefixtures("crd")`."""
    install_crd(api_client)


@pytest.fixture
def namespace(api_client: client.ApiClient) -> Iterator[str]:
    """A fresh namespace per test."""
    with fresh_namespace(api_client) as name:
        yield name


def release_finalizers(api_client: client.ApiClient, namespace: str) -> None:
    """kopf puts a finalizer on objects with timers; each test's operator is gone by teardown."""
    objects = client.CustomObjectsApi(api_client)
    try:
        items = objects.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)["items"]
    except ApiException as exc:
        if exc.status == 404:  # the CRD is not installed
            return
        raise
    for item in items:
        patch = {"metadata": {"finalizers": None}}
        objects.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, item["metadata"]["name"], patch
        )


@contextmanager
def cluster_classes(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """A RuntimeClass and a PriorityClass, as a GPU cluster has (the API server's admission checks
    that a pod's classes exist), named after the namespace and deleted after it."""
    node = client.NodeV1Api(api_client)
    scheduling = client.SchedulingV1Api(api_client)
    node.create_runtime_class({"metadata": {"name": namespace}, "handler": "nvidia"})
    scheduling.create_priority_class({"metadata": {"name": namespace}, "value": 1000})
    try:
        yield namespace
    finally:
        node.delete_runtime_class(namespace)
        scheduling.delete_priority_class(namespace)


@pytest.fixture
def gpu_cluster_classes(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    with cluster_classes(api_client, namespace) as name:
        yield name


@pytest.fixture
def lab(
    api_client: client.ApiClient,
    namespace: str,
    kubeconfig: str,
    bridge_url: str,
    prometheus_url: str,
    tmp_path: Path,
) -> dict[str, Any]:
    """Everything run_rollout needs, for `run_rollout(body=..., **lab)`."""
    return lab_in(namespace, api_client, kubeconfig, bridge_url, prometheus_url, tmp_path)


def lab_in(
    namespace: str,
    api_client: client.ApiClient,
    kubeconfig: str,
    bridge_url: str,
    prometheus_url: str,
    log_dir: Path,
) -> dict[str, Any]:
    return {
        "api_client": api_client,
        "namespace": namespace,
        "kubeconfig": kubeconfig,
        "bridge_url": bridge_url,
        "prometheus_url": prometheus_url,
        "log_dir": log_dir,
    }


Run = Callable[[dict[str, Any]], Any]  # given its lab, drives a rollout and returns what it saw
Rollouts = dict[str, Future[tuple[dict[str, Any], Any]]]  # by name: (its lab, what its Run returned)


def side_by_side(runs: dict[str, Run]) -> Any:
    """A module fixture, `rollouts`, that starts every run at once, each in its own namespace,
    thread and operator: a simulated rollout spends its minutes waiting for windows, so the module
    pays for its longest rollout, not their sum. Each test takes (lab, what its run returned) from
    its future, which re-raises what the run raised; the namespaces go after the last run has ended.
    Assign it in the module, after the runs: `rollouts = side_by_side({...})`."""

    @pytest.fixture(scope="module", name="rollouts")
    def rollouts(
        api_client: client.ApiClient,
        kubeconfig: str,
        bridge_url: str,
        prometheus_url: str,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[Rollouts]:
        with ExitStack() as namespaces, ThreadPoolExecutor(len(runs), thread_name_prefix="rollout") as pool:
            futures = {}
            for name, run in runs.items():
                namespace = namespaces.enter_context(fresh_namespace(api_client))
                log_dir = tmp_path_factory.mktemp(name)
                lab = lab_in(namespace, api_client, kubeconfig, bridge_url, prometheus_url, log_dir)
                futures[name] = pool.submit(lambda run=run, lab=lab: (lab, run(lab)))
            yield futures

    return rollouts


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Figures measured so far ride on the report (a worker's reach the controller that way)."""
    report: pytest.TestReport = yield
    report.user_properties.extend(("figure", line) for line in FIGURES)
    FIGURES.clear()
    return report


SUMMARY: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    SUMMARY.extend(str(value) for key, value in report.user_properties if key == "figure")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures the cluster tests measured, for CI's log and the issues' notes."""
    if SUMMARY:
        terminalreporter.section("figures measured by the cluster tests")
        for line in SUMMARY:
            terminalreporter.write_line(line)
