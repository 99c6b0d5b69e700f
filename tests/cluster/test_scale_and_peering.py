"""Many rollouts at once, and two operator replicas peering so that only one acts. Real API server,
operator processes and Prometheus; simulated engines (the figures are about the operator)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.operator_process import RECONCILE_LINE, create_sd, wait_for
from tests.cluster.rollouts import (
    SETTLED,
    Load,
    fake_gpu_node,
    lab_operator,
    orphaned_pods,
    pin_to_node,
    report,
    run_rollout,
    sim_rollout,
)

from specgate import api
from specgate.lab.crds import PEERING_CRDS_PATH, install_crd

pytestmark = pytest.mark.cluster

ROLLOUTS = 50
GOOD_ALPHA, BAD_ALPHA = 0.8, 0.3


def test_fifty_rollouts_at_once_reach_their_verdicts(lab: dict[str, Any]) -> None:
    """Half the drafts are good, half are not: every object gets its own verdict, none is lost."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    install_crd(api_client)
    names = [f"r{i:02d}" for i in range(ROLLOUTS)]
    alphas = {name: GOOD_ALPHA if i % 2 == 0 else BAD_ALPHA for i, name in enumerate(names)}
    operator = lab_operator(
        lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"], "--interval", "5"
    )
    # One baseline and one canary pod per object, one GPU each, on a node no other test uses. Every
    # Service keeps its floor until the node goes (which takes every pod with it).
    with (
        fake_gpu_node(api_client, f"scale-{namespace}", gpus=2 * ROLLOUTS + 10, taint=namespace) as node,
        CapacityMonitor(api_client, namespace),
    ):
        for i, name in enumerate(names):
            env = {"SPECGATE_SIM_ALPHA": str(alphas[name]), "SPECGATE_SIM_SEED": str(i)}
            # The verdicts here are about alpha. The simulated step stall (+10 %) falls inside vLLM's
            # 25-50 ms bucket, where telling it from the default 50 % takes more steps than 50
            # objects' share of two cores serves in 8 min; and 100 engines on two cores make each
            # pod's P99 pace a measure of the machine's contention more than of its config (the
            # latency gates have their own tests). A CI run once rolled one low-alpha object back
            # for another reason than AcceptanceBelowGate (the verdict right, the reason not kept).
            gates = {"maxP99ItlRegression": 1.0, "maxP99PerTokenRegression": 1.0}
            body = sim_rollout(name, env, maxAnalysisDuration="8m", progressDeadline="8m", gates=gates)
            pin_to_node(body, node, taint=namespace)
            create_sd(api_client, namespace, body)
        started = time.monotonic()
        with operator, Load(lab["bridge_url"], namespace, names, "tiny", concurrency=1, duration=1200):
            objects = wait_for(lambda: all_settled(api_client, namespace), 1200, "every rollout settled", 5)
        took = time.monotonic() - started

    verdicts = {o["metadata"]["name"]: (o["status"]["phase"], o["status"].get("reason")) for o in objects}
    messages = {o["metadata"]["name"]: o["status"].get("message") for o in objects}
    # A promoted object's reason tells how it is guarded since; a rolled-back one's why.
    expected = {name: "Promoted" if alpha == GOOD_ALPHA else "RolledBack" for name, alpha in alphas.items()}
    wrong = {name: (*verdicts[name], messages[name]) for name in names if verdicts[name][0] != expected[name]}
    false_promotions = sum(1 for n in names if verdicts[n][0] == "Promoted" and alphas[n] == BAD_ALPHA)
    orphans = orphaned_pods(api_client, namespace)
    report(
        concurrent_rollouts=len(objects),
        verdicts=dict(Counter(v for v, _ in verdicts.values())),
        wrong_verdicts=len(wrong),
        false_promotions=false_promotions,
        orphaned_pods=len(orphans),
        seconds_to_all_settled=round(took),
    )
    assert len(objects) == ROLLOUTS
    assert wrong == {}, f"wrong verdicts: {wrong}"
    other_reasons = {
        name: (reason, messages[name])
        for name, (phase, reason) in verdicts.items()
        if phase == "RolledBack" and reason != "AcceptanceBelowGate"
    }
    assert other_reasons == {}, other_reasons
    for obj in objects:
        alpha = obj["status"]["canary"]["alpha"]
        assert alpha == pytest.approx(alphas[obj["metadata"]["name"]], abs=0.08), obj["metadata"]["name"]
    assert false_promotions == 0 and orphans == []


def all_settled(api_client: client.ApiClient, namespace: str) -> list[dict[str, Any]] | None:
    items: list[dict[str, Any]] = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL
    )["items"]
    settled = [o for o in items if o.get("status", {}).get("phase") in SETTLED]
    return items if len(settled) == len(items) == ROLLOUTS else None


def test_two_peered_replicas_one_acts_and_the_standby_takes_over(lab: dict[str, Any]) -> None:
    """kopf peering: the replica of the higher priority acts, the other one waits; when the active
    one stops mid-analysis, the standby resumes from status and reaches the verdict."""
    api_client, namespace, log_dir = lab["api_client"], lab["namespace"], lab["log_dir"]
    install_crd(api_client, PEERING_CRDS_PATH)
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "specgate"}}
    objects = client.CustomObjectsApi(api_client)
    objects.create_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", peering)

    def replica(role: str, priority: int) -> Any:
        (log_dir / role).mkdir()
        args = ("--peering", "specgate", "--priority", str(priority), "--verbose")
        return lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], log_dir / role, *args)

    def heartbeats() -> int:
        peers = objects.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", "specgate")
        return len(peers.get("status") or {})

    active, standby = replica("active", 200), replica("standby", 100)
    stopped_at: list[str] = []

    def stop_active_mid_analysis(obj: dict[str, Any]) -> None:
        if not stopped_at and (obj.get("status", {}).get("canary") or {}).get("windowEnd"):
            active.stop()
            stopped_at.append(obj["status"]["phase"])

    with active:
        wait_for(lambda: heartbeats() == 1, 60, "the active replica's heartbeat")
        with standby:
            # With a named peering kopf starts paused and resumes only when no live peer outranks it.
            wait_for(lambda: heartbeats() == 2, 60, "the standby's heartbeat")
            body = sim_rollout("peered", {"SPECGATE_SIM_ALPHA": str(GOOD_ALPHA)})
            run = run_rollout(body=body, operator=active, during=stop_active_mid_analysis, timeout=480, **lab)

    status = run.status
    assert status["phase"] == "Promoted", status.get("message")
    assert stopped_at == ["Analyzing"]
    active_log, standby_log = active.log_text(), standby.log_text()
    waiting, _, resumed = standby_log.partition("Resuming operations")
    assert resumed, f"the standby never resumed:\n{standby_log[-2000:]}"
    report(
        active_reconciles=len(RECONCILE_LINE.findall(active_log)),
        standby_reconciles_while_active=len(RECONCILE_LINE.findall(waiting)),
        standby_reconciles_after_takeover=len(RECONCILE_LINE.findall(resumed)),
    )
    assert RECONCILE_LINE.search(active_log), active_log[-2000:]
    assert not RECONCILE_LINE.search(waiting), "the standby acted while the active replica was alive"
    assert RECONCILE_LINE.search(resumed), "the standby did not take over"
    assert orphaned_pods(api_client, namespace) == []
