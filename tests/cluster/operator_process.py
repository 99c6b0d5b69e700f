"""Run the operator as a real process against the local cluster, as a user would (`specgate run`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.conftest import ROOT

from specgate import api
from specgate.render import LABEL_DEPLOYMENT, LABEL_TRACK, Track
from specgate_lab.kube import wait_for as wait_for  # where the tests have always imported it from


def run(*argv: str, **kwargs: Any) -> str:
    """A command that must succeed: its stdout, or a failure showing both outputs."""
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


OPERATOR_INTERVAL_SECONDS = 2  # between reconciles of one object
RECONCILE_LINE = re.compile(r"Timer 'reconcile' (succeeded|failed)")  # logged with --verbose


def reconciles_of(log: str, namespace: str, name: str) -> list[str]:
    """The reconcile lines of one object in a --verbose log (kopf prefixes them `[ns/name]`)."""
    line = rf"\[{re.escape(namespace)}/{re.escape(name)}\] Timer 'reconcile' (?:succeeded|failed)"
    return re.findall(line, log)


def _spawn(kubeconfig: str, log_path: Path, extra: tuple[str, ...]) -> subprocess.Popen[bytes]:
    # This checkout's operator, also where the virtualenv's editable install points at another one.
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONPATH": str(ROOT / "operator")}
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specgate.cli",
                "run",
                "--interval",
                str(OPERATOR_INTERVAL_SECONDS),
                "--metrics-port",
                "0",
                *extra,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def operator_process(kubeconfig: str, log_path: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """`specgate run` in the background for the duration of a test, its log kept for failures."""
    proc = _spawn(kubeconfig, log_path, extra)
    try:
        yield proc
    finally:
        _stop(proc)


class Operator:
    """`specgate run` that a test can SIGKILL and start again mid-rollout; one log file per run."""

    def __init__(self, kubeconfig: str, log_dir: Path, *extra: str) -> None:
        self.kubeconfig, self.log_dir, self.extra = kubeconfig, log_dir, extra
        self.logs: list[Path] = []
        self.kills = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        suffix = f".{len(self.logs)}" if self.logs else ""  # operator.log, operator.1.log, ...
        self.logs.append(self.log_dir / f"operator{suffix}.log")
        self.proc = _spawn(self.kubeconfig, self.logs[-1], self.extra)

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node loss would: no shutdown handlers run."""
        assert self.proc is not None and self.proc.poll() is None, "the operator died by itself"
        _stop(self.proc, signal.SIGKILL)
        self.kills += 1

    def kill_and_restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        """SIGTERM, as a rolling update or a drained node does: kopf says goodbye to its peers."""
        assert self.proc is not None
        _stop(self.proc)

    def log_text(self) -> str:
        return "".join(path.read_text(errors="replace") for path in self.logs)

    def __enter__(self) -> Operator:
        if self.proc is None or self.proc.poll() is not None:  # entering a running one keeps it
            self.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc is not None:
            _stop(self.proc)


def service_account_kubeconfig(
    kubectl: str, kubeconfig: str, namespace: str, account: str, path: Path
) -> str:
    """A kubeconfig at `path` that acts as ServiceAccount `account` (a token from `kubectl create
    token`), as the operator runs in the cluster: exactly that account's RBAC."""
    token = run(kubectl, "--kubeconfig", kubeconfig, "-n", namespace, "create", "token", account).strip()
    config = yaml.safe_load(Path(kubeconfig).read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    for ctx in config["contexts"]:
        ctx["context"]["user"] = account
    path.write_text(yaml.safe_dump(config))
    return str(path)


def custom_objects(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def create_sd(
    api_client: client.ApiClient, namespace: str, body: dict[str, Any], dry_run: bool = False
) -> Any:
    """Create the object, asking again while a loaded lab's API server answers 5xx (as kubectl's
    users would): its 504 may come after the object was stored, so a 409 then is the object made."""
    kwargs: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
    deadline = time.monotonic() + CREATE_RETRY_SECONDS
    answered_5xx = False
    while True:
        try:
            return custom_objects(api_client).create_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, body, **kwargs
            )
        except ApiException as exc:
            if exc.status == 409 and answered_5xx and not dry_run:
                return get_sd(api_client, namespace, body["metadata"]["name"])
            if exc.status < 500 or time.monotonic() > deadline:
                raise
            answered_5xx = True
        time.sleep(2)


CREATE_RETRY_SECONDS = 180


def get_sd(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom_objects(api_client).get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name
    )
    return obj


def live_pods(
    api_client: client.ApiClient, namespace: str, name: str, track: Track | None = None
) -> list[Any]:
    """The pods of a SpeculativeDeployment (of one track) not being deleted."""
    selector = f"{LABEL_DEPLOYMENT}={name}" + (f",{LABEL_TRACK}={track.value}" if track else "")
    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def sd_gone(api_client: client.ApiClient, namespace: str, name: str) -> bool:
    """The SpeculativeDeployment is deleted (the API server answers 404 for it)."""
    try:
        get_sd(api_client, namespace, name)
    except ApiException as exc:
        return exc.status == 404
    return False


def specgate_status(
    kubeconfig: str, namespace: str, name: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    """`specgate status` as a user (or a pipeline) runs it: the installed console script."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "specgate"), "status", name, "-n", namespace, *flags],
        env={**os.environ, "KUBECONFIG": kubeconfig, "PYTHONPATH": str(ROOT / "operator")},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
