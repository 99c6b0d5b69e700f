"""Many rollouts at once, and two operator replicas peering so that only one acts. Real API server,
operator processes and Prometheus; simulated engines (the figures are about the operator)."""

from __future__ import annotations

import time
from collections import Counter
from statistics import median
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.capacity import CapacityMonitor
from tests.cluster.operator_process import RECONCILE_LINE, Operator, create_sd, wait_for
from tests.cluster.rollouts import (
    SETTLED,
    Load,
    fake_gpu_node,
    history_phases,
    lab_operator,
    orphaned_pods,
    phase_spans,
    pin_to_node,
    report,
    run_rollout,
    service_urls,
    settled_as,
    short_of,
    sim_rollout,
    timeline,
)

from specgate import api
from specgate_lab.crds import install_crd, peering_crds_path

pytestmark = pytest.mark.cluster

ROLLOUTS = 50
# Every object settled within it: 578 s on a two-core lab here with the operator reading stale
# copies again; a CI machine twice as slow needs about twice that.
SETTLE_SECONDS = 1800
GOOD_ALPHA, BAD_ALPHA = 0.8, 0.3
TAKEOVER = "Resuming operations"  # kopf logs it when no live peer outranks the replica any more


@pytest.mark.cluster_wide  # a hundred engines load both cores: nothing but the unit tests beside it
def test_fifty_rollouts_at_once_reach_their_verdicts(lab: dict[str, Any]) -> None:
    """Half the drafts are good, half are not: every object gets the verdict its own data implies,
    none is lost. How many reach minDrafts and minLatencySamples within maxAnalysisDuration is the
    machine's speed (50 objects share its cores); that those short of them end Inconclusive, and only
    those, is the operator's (fits_its_data)."""
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
            # The verdicts here are about alpha: the latency gates keep fast_rollout's wide
            # tolerances (100 engines on two cores make each pod's P99 pace a measure of the
            # machine's contention more than of its config; a CI run once rolled one low-alpha
            # object back for another reason than AcceptanceBelowGate). Nor are the loads
            # comparable: an engine starved past its readiness probe's failure threshold leaves the
            # Service's round robin for a while, and a CI run's four good objects ended
            # Inconclusive on "loads differ by more than 25%" (canary 0.81 req/s per pod, baseline
            # 0.57) with alpha decided.
            gates = {"maxLoadDifference": 1.0}
            # 15m to get Ready: the lab's API server once held every write for some five minutes
            # under these hundred pods (handler timeouts on leases, EndpointSlices, pod status; etcd
            # idle), and with 8m, 36 canaries created in it rolled back as CanaryUnhealthy.
            body = sim_rollout(name, env, maxAnalysisDuration="8m", progressDeadline="15m", gates=gates)
            pin_to_node(body, node, taint=namespace)
            create_sd(api_client, namespace, body)
        started = time.monotonic()
        with (
            operator,
            Load(
                service_urls(lab["bridge_url"], namespace, names),
                "tiny",
                concurrency=1,
                duration=SETTLE_SECONDS,
            ),
        ):
            objects = wait_until_settled(api_client, namespace, SETTLE_SECONDS)
        took = time.monotonic() - started

    statuses = {o["metadata"]["name"]: o["status"] for o in objects}
    wrong = {
        name: (*settled_as(status), status.get("message"))
        for name, status in statuses.items()
        if not fits_its_data(alphas[name], status)
    }
    false_promotions = [n for n, s in statuses.items() if s["phase"] == "Promoted" and alphas[n] == BAD_ALPHA]
    inconclusive = [n for n, s in statuses.items() if settled_as(s)[1] == "Inconclusive"]
    orphans = orphaned_pods(api_client, namespace)
    report(
        concurrent_rollouts=len(objects),
        verdicts=dict(Counter(settled_as(s) for s in statuses.values())),
        wrong_verdicts=len(wrong),
        false_promotions=len(false_promotions),
        inconclusive_for_too_little_data=len(inconclusive),
        orphaned_pods=len(orphans),
        seconds_to_all_settled=round(took),
    )
    assert len(objects) == ROLLOUTS
    assert wrong == {}, f"verdicts their data does not imply: {wrong}"
    assert false_promotions == [] and orphans == []
    check_alphas([o for o in objects if o["metadata"]["name"] not in inconclusive], alphas)


def fits_its_data(alpha: float, status: dict[str, Any]) -> bool:
    """A good alpha Promoted through GatesPassed, a bad one RolledBack as AcceptanceBelowGate; either
    RolledBack as Inconclusive only where its message names data short of the gates' minimum. At
    maxAnalysisDuration an analysed canary's drafts alone decide a bad alpha (the estimate's side
    of the gate), so such a canary may be Inconclusive for too few drafts only."""
    phase, reason = settled_as(status)
    if reason == "Inconclusive":
        short = short_of(status["message"])
        if alpha == BAD_ALPHA and "Analyzing" in history_phases(status):
            short &= {"drafts"}
        return phase == "RolledBack" and bool(short)
    if alpha == BAD_ALPHA:
        return (phase, reason) == ("RolledBack", "AcceptanceBelowGate")
    gated = any(h["phase"] == "Promoting" and h["reason"] == "GatesPassed" for h in status["history"])
    return phase == "Promoted" and gated


def check_alphas(objects: list[dict[str, Any]], alphas: dict[str, float]) -> None:
    """Each object's alpha is its own engine's: pooled over the objects of one true alpha (weighted by
    drafts) it is that alpha, and no object's is nearer the other group's. One object's own figure
    is not held to a tight bound: the SPRT stops after a few hundred drafts from a handful of
    requests, each with its own acceptance level (the simulator's per-request spread), and stopping
    when the evidence is strong picks the samples that stray away from the gate."""
    groups: dict[float, list[tuple[float, float]]] = {}
    for obj in objects:
        canary = obj["status"]["canary"]
        groups.setdefault(alphas[obj["metadata"]["name"]], []).append((canary["alpha"], canary["drafts"]))
    midpoint = (GOOD_ALPHA + BAD_ALPHA) / 2
    for true_alpha, figures in groups.items():
        pooled = sum(a * d for a, d in figures) / sum(d for _, d in figures)
        report(
            **{
                f"alpha_{true_alpha}": f"pooled={pooled:.3f} min={min(a for a, _ in figures):.3f} "
                f"max={max(a for a, _ in figures):.3f} drafts_min={min(d for _, d in figures):.0f}"
            }
        )
        assert pooled == pytest.approx(true_alpha, abs=0.04), figures
        assert all((a > midpoint) == (true_alpha > midpoint) for a, _ in figures), figures


def wait_until_settled(api_client: client.ApiClient, namespace: str, timeout: float) -> list[dict[str, Any]]:
    """Every object once all are settled, with where their time went (per phase: the median and the
    slowest object's seconds); past `timeout`, an AssertionError naming each unsettled object's phase,
    timeline and message."""
    seen: list[dict[str, Any]] = []

    def all_settled() -> list[dict[str, Any]] | None:
        seen[:] = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL
        )["items"]
        settled = [o for o in seen if o.get("status", {}).get("phase") in SETTLED]
        return seen if len(settled) == len(seen) == ROLLOUTS else None

    try:
        objects = wait_for(all_settled, timeout, "every rollout settled", 5)
    except AssertionError as late:
        unsettled = {
            o["metadata"]["name"]: (timeline(o.get("status", {})), o.get("status", {}).get("message"))
            for o in seen
            if o.get("status", {}).get("phase") not in SETTLED
        }
        report(phase_seconds=phase_seconds(seen))
        raise AssertionError(f"{late}; {len(unsettled)} of {len(seen)} unsettled: {unsettled}") from None
    report(phase_seconds=phase_seconds(objects))
    return objects


def phase_seconds(objects: list[dict[str, Any]]) -> str:
    """Per phase, over the objects that left it: the median and the most seconds spent in it."""
    spans: dict[str, list[float]] = {}
    for obj in objects:
        for phase, seconds in phase_spans(obj.get("status", {})):
            spans.setdefault(phase, []).append(seconds)
    return ",".join(f"{phase}:{median(s):.0f}/{max(s):.0f}" for phase, s in spans.items())


def test_three_peered_replicas_hand_over_on_sigterm_and_after_a_sigkill(lab: dict[str, Any]) -> None:
    """kopf peering: only the live replica of the highest priority acts. The first one stops with
    SIGTERM once the canary runs, before the analysis has figures (a rolling update: it says goodbye,
    the second takes over at once); the second is SIGKILLed mid-analysis (an OOM kill or a lost
    node: no goodbye, so the third waits until the dead peer's heartbeat is older than kopf's
    peering lifetime, 60 s). Each resumes from status, and the rollout reaches its verdict."""
    api_client, namespace, log_dir = lab["api_client"], lab["namespace"], lab["log_dir"]
    install_crd(api_client, peering_crds_path())
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "specgate"}}
    objects = client.CustomObjectsApi(api_client)
    objects.create_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", peering)

    def replica(role: str, priority: int) -> Operator:
        (log_dir / role).mkdir()
        args = ("--peering", "specgate", "--priority", str(priority), "--verbose")
        return lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], log_dir / role, *args)

    def heartbeats() -> int:
        peers = objects.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", "specgate")
        return len(peers.get("status") or {})

    first, second, third = replica("first", 300), replica("second", 200), replica("third", 100)
    stopped_at: dict[str, str] = {}

    def hand_over(obj: dict[str, Any]) -> None:
        # The Canary phase may be shorter than a poll; with the warm-up that begins Analyzing (no
        # figures yet) it is not. Analyzing lasts analysisWindow more, with figures.
        status = obj.get("status", {})
        analysed = bool((status.get("canary") or {}).get("windowEnd"))
        if not stopped_at and status.get("phase") in ("Canary", "Analyzing") and not analysed:
            first.stop()
            stopped_at["first"] = status["phase"]
        elif (
            len(stopped_at) == 1
            and status.get("phase") == "Analyzing"
            and analysed
            and TAKEOVER in second.log_text()
        ):
            second.kill()
            stopped_at["second"] = status["phase"]

    with first:
        wait_for(lambda: heartbeats() == 1, 60, "the first replica's heartbeat")
        # With a named peering kopf starts paused and resumes only when no live peer outranks it.
        with second, third:
            wait_for(lambda: heartbeats() == 3, 60, "the standbys' heartbeats")
            body = sim_rollout("peered", {"SPECGATE_SIM_ALPHA": str(GOOD_ALPHA)})
            run = run_rollout(body=body, operator=first, during=hand_over, timeout=480, **lab)

    status = run.status
    assert status["phase"] == "Promoted", status.get("message")
    assert list(stopped_at) == ["first", "second"], (stopped_at, status["history"])
    report(first_stopped_in=stopped_at["first"])
    # Two handovers restarted nothing: each phase entered once, in order.
    assert run.phases == ["Baseline", "Canary", "Analyzing", "Promoting", "Promoted"], status["history"]
    first_log = first.log_text()
    assert RECONCILE_LINE.search(first_log), first_log[-2000:]
    for role, standby in (("second", second), ("third", third)):
        waiting, _, resumed = standby.log_text().partition(TAKEOVER)
        assert resumed, f"the {role} replica never resumed:\n{waiting[-2000:]}"
        report(
            replica=role,
            reconciles_while_outranked=len(RECONCILE_LINE.findall(waiting)),
            reconciles_after_takeover=len(RECONCILE_LINE.findall(resumed)),
        )
        assert not RECONCILE_LINE.search(waiting), f"the {role} replica acted while outranked"
        assert RECONCILE_LINE.search(resumed), f"the {role} replica did not take over"
    assert orphaned_pods(api_client, namespace) == []
