"""Day 2 on the local cluster: edits, pauses and failures after promotion, with the capacity floor
(run_rollout's CapacityMonitor) checked across each whole timeline."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.conftest import CACHE, Rollouts, side_by_side
from tests.cluster.figures import report
from tests.cluster.operator_process import OPERATOR_INTERVAL_SECONDS, get_sd, live_pods, run, wait_for
from tests.cluster.rollouts import history_time, lab_operator, patch_rollout, run_rollout, sim_rollout

from specgate import api, kube, render
from specgate.render import (
    ANNOTATION_RENDERED,
    ANNOTATION_TEMPLATE,
    LABEL_TRACK,
    Owner,
    Track,
)

pytestmark = pytest.mark.cluster

GOOD = {"SPECGATE_SIM_ALPHA": "0.8"}


def crash_loop_after_promotion(lab: dict[str, Any]) -> None:
    """replicas 4, maxSurge 0, maxUnavailable 1: one promoted pod starts crash-looping; the rollback
    swaps pods one at a time and never has fewer than 3 Ready behind the Service."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    crash_flag = lab["log_dir"] / "crash"
    body = sim_rollout("crashlate", {**GOOD, "SPECGATE_SIM_EXIT": f"speculative-if:{crash_flag}"})
    body["spec"]["replicas"] = 4
    body["spec"]["rollout"] |= {"maxSurge": 0, "maxUnavailable": 1}
    # The question is the crash after promotion: a CI-like run rolled this canary back for its step
    # stall (197 ms against 47 ms, the machine's contention on simulated engines) before it promoted.
    body["spec"]["rollout"].setdefault("gates", {}).update(
        maxP99ItlRegression=50, maxP99PerTokenRegression=10
    )
    killed: list[str] = []

    def crash_one_canary_once_promoted(obj: dict[str, Any]) -> None:
        if obj.get("status", {}).get("phase") != "Promoted" or killed:
            return
        crash_flag.touch()  # every canary engine started from now on exits at once
        state = json.loads((CACHE / "cluster" / "bridge-state.json").read_text())
        canary = sorted(
            k
            for k, e in state.items()
            if k.startswith(f"{namespace}/") and e["labels"].get(LABEL_TRACK) == "canary"
        )
        os.kill(state[canary[0]]["pid"], signal.SIGKILL)
        killed.append(canary[0])

    run = run_rollout(
        body=body,
        during=crash_one_canary_once_promoted,
        until=lambda obj: obj.get("status", {}).get("phase") in ("RolledBack", "Failed"),
        timeout=480,
        **lab,
    )
    status = run.status
    assert killed and "Promoted" in run.phases, (run.phases, status.get("message"))
    assert (status["phase"], status["reason"]) == ("RolledBack", "CanaryUnhealthy"), status.get("message")
    assert "promoted canary is unhealthy" in status["message"] and "CrashLoopBackOff" in status["message"]
    tracks = [p.metadata.labels[LABEL_TRACK] for p in live_pods(api_client, namespace, "crashlate")]
    assert sorted(tracks) == ["baseline"] * 4
    report(test="crash_after_promotion", replicas=4, max_surge=0, floor=3, killed=killed[0])


def baseline_crash_loop_after_an_edit(lab: dict[str, Any]) -> None:
    """replicas 2, Promoted, then an edit whose engines exit at start (a gated model's 401): the new
    rollout's baseline crash-loops. BaselineUnhealthy at once (the pods' state, not the deadline):
    Degraded, a Warning Event, still in Baseline a few reconciles later (nothing to roll back to),
    and the promoted canary's pods keep serving the floor of 2 throughout (CapacityMonitor)."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    body = sim_rollout("badbase", GOOD)
    body["spec"]["replicas"] = 2
    crashing_env = [*body["spec"]["env"], {"name": "SPECGATE_SIM_EXIT", "value": "startup"}]
    unhealthy_at: list[float] = []

    def edit_once_promoted(obj: dict[str, Any]) -> None:
        status = obj.get("status", {})
        if status.get("phase") == "Promoted" and obj["metadata"]["generation"] == 1:
            patch_rollout(api_client, namespace, "badbase", {"env": crashing_env})
        if status.get("reason") == "BaselineUnhealthy" and not unhealthy_at:
            unhealthy_at.append(time.monotonic())

    def held_a_while(obj: dict[str, Any]) -> bool:
        # Three reconciles after BaselineUnhealthy: it waits, it does not move on or roll back.
        return bool(unhealthy_at) and time.monotonic() - unhealthy_at[0] > 3 * OPERATOR_INTERVAL_SECONDS

    run = run_rollout(body=body, during=edit_once_promoted, until=held_a_while, timeout=480, **lab)
    status = run.status
    after_edit = run.phases[run.phases.index("Promoted") + 1 :]
    assert after_edit == ["Baseline"], run.phases
    assert (status["phase"], status["reason"]) == ("Baseline", "BaselineUnhealthy"), status.get("message")
    assert "baseline is unhealthy" in status["message"] and "CrashLoopBackOff" in status["message"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "BaselineUnhealthy")
    since = api.parse_time(degraded["lastTransitionTime"])
    assert since is not None
    took = (since - history_time(status, "Baseline")).total_seconds()
    assert took < api.parse_duration(body["spec"]["rollout"]["progressDeadline"])  # not the deadline
    events = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    warnings = [e for e in events if e.reason == "BaselineUnhealthy" and e.involved_object.name == "badbase"]
    assert warnings and all(e.type == "Warning" for e in warnings), warnings
    tracks = [p.metadata.labels[LABEL_TRACK] for p in live_pods(api_client, namespace, "badbase")]
    assert tracks.count("canary") == 2, tracks  # the gated pods still serve
    report(test="baseline_crash_loop_after_edit", replicas=2, floor=2, unhealthy_after_s=round(took))


def pause_edit_abort_retry(lab: dict[str, Any]) -> None:
    """Promoted: pause and unpause in the spec, then with `kubectl specgate pause|resume` across a
    GitOps sync of the unchanged spec (server-side apply by another field manager, as Flux does,
    keeps the annotation): no pod changes, nothing restarts. Then a new draft length serves on
    canaryReplicas pods at most until its own gates pass, while the gated pods keep their template;
    `kubectl specgate abort` rolls it back (Aborted) and `kubectl specgate retry` runs it again."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    kubectl, tmp_path = str(CACHE / "bin" / "kubectl"), lab["log_dir"]
    body = sim_rollout("day2", GOOD)
    body["spec"]["replicas"] = 2
    from_git = tmp_path / "from-git.yaml"
    from_git.write_text(json.dumps({"apiVersion": api.API_VERSION, "kind": api.KIND, **body}))
    plugin_env = {
        "KUBECONFIG": lab["kubeconfig"],
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",  # kubectl finds kubectl-specgate here
        "HOME": str(tmp_path),
    }

    def kubectl_run(*argv: str) -> str:
        return run(kubectl, *argv, "-n", namespace, env=plugin_env)

    def sync_then_resume() -> None:
        kubectl_run(
            "apply", "--server-side", "--field-manager=gitops", "--force-conflicts", "-f", str(from_git)
        )
        notes = get_sd(api_client, namespace, "day2")["metadata"]["annotations"]
        assert notes.get(api.ANNOTATION_PAUSED) == "true", "the sync reverted the pause"
        # kubectl runs kubectl_complete-specgate; the word being typed is "".
        words = run(
            kubectl, "__complete", "specgate", "resume", "-n", namespace, "", env=plugin_env
        ).splitlines()
        assert "day2" in words and words[-1] == ":4", words
        kubectl_run("specgate", "resume", "day2")

    steps = iter(
        [
            ("Promoted", lambda: patch_rollout(api_client, namespace, "day2", {"rollout": {"paused": True}})),
            ("Paused", lambda: patch_rollout(api_client, namespace, "day2", {"rollout": {"paused": False}})),
            ("Promoted", lambda: kubectl_run("specgate", "pause", "day2")),
            ("Paused", sync_then_resume),
            ("Promoted", lambda: patch_rollout(api_client, namespace, "day2", {"speculative": {"numSpeculativeTokens": 2}})),
        ]
    )  # fmt: skip
    seen: dict[str, Any] = {"pods": None, "next": next(steps), "edit": None, "most_new": 0, "new_hash": None}

    def drive(obj: dict[str, Any]) -> None:
        status = obj.get("status", {})
        pods = {p.metadata.uid for p in live_pods(api_client, namespace, "day2")}
        if seen["edit"] is None:
            if status.get("phase") not in ("Promoted", "Paused") or _pending_generation(obj):
                return
            if seen["pods"] is None:
                seen["pods"] = pods
            assert pods == seen["pods"], "pausing or unpausing changed the pods"
            assert "NewGeneration" not in [h["reason"] for h in status["history"][1:]]
            phase, action = seen["next"]
            if status["phase"] == phase:  # the last step took effect (a request bumps no generation)
                seen["next"] = next(steps, None)
                if seen["next"] is None:
                    seen["edit"] = obj["metadata"]["generation"] + 1
                action()
            return
        new_hash = status.get("templateHash")
        if status.get("observedGeneration") == seen["edit"] and new_hash != status.get("passedTemplateHash"):
            seen["new_hash"] = new_hash
            running_new = [
                p
                for p in live_pods(api_client, namespace, "day2")
                if (p.metadata.annotations or {}).get(ANNOTATION_TEMPLATE) == new_hash
            ]
            # obj was read before the pods were listed: in between, the gates may have passed and
            # Promoting may have added canary pods. Only a status read after the list proves them ungated.
            if len(running_new) > 1:
                after = get_sd(api_client, namespace, "day2").get("status", {})
                gated_since = after.get("passedTemplateHash") == new_hash
                assert gated_since, f"ungated config on {len(running_new)} pods in {after.get('phase')}"
            else:
                seen["most_new"] = max(seen["most_new"], len(running_new))
            notes = obj["metadata"].get("annotations") or {}
            if (
                status["phase"] == "Analyzing"
                and api.ANNOTATION_RETRY not in notes
                and api.ANNOTATION_ABORT not in notes
            ):
                kubectl_run("specgate", "abort", "day2")
            elif (status["phase"], status["reason"]) == (
                "RolledBack",
                "Aborted",
            ) and api.ANNOTATION_ABORT in notes:
                kubectl_run("specgate", "retry", "day2")

    def promoted_again(obj: dict[str, Any]) -> bool:
        status = obj.get("status", {})
        return (
            seen["new_hash"] is not None
            and status.get("passedTemplateHash") == seen["new_hash"]
            and (status.get("phase") == "Promoted")
        )

    rollout = run_rollout(body=body, during=drive, until=promoted_again, timeout=720, **lab)
    phases = rollout.phases
    assert phases.count("Paused") == 2 and phases.count("Baseline") == 3, phases
    assert "RolledBack" in phases and phases[-1] == "Promoted", phases
    assert "Aborted" in [h["reason"] for h in rollout.status["history"]]
    assert seen["most_new"] == 1  # the new config did run, on the canary's share only
    notes = get_sd(api_client, namespace, "day2")["metadata"]["annotations"]
    assert api.ANNOTATION_ABORT not in notes and notes[api.ANNOTATION_RETRY] == "1"
    report(test="day2_pauses_edit_abort_retry", phases="-".join(phases), most_pods_on_new_config=1)


def _pending_generation(obj: dict[str, Any]) -> bool:
    return obj.get("status", {}).get("observedGeneration") != obj["metadata"]["generation"]


OLDER_RENDER = "specgate.dev/rendered-by"  # what the older version's pods carry that ours do not


def apply_as_older_operator(api_client: client.ApiClient, obj: dict[str, Any], track: Track) -> None:
    """Write a Deployment as an older operator version would have: the same spec rendered with one
    pod annotation more and no rendered digest, by server-side apply under the operator's own field
    manager (so that the new version's apply removes what it no longer renders, as on a real upgrade)."""
    meta = obj["metadata"]
    owner = Owner(meta["name"], meta["namespace"], meta["uid"])
    apps = client.AppsV1Api(api_client)
    name = render.deployment_name(owner, track)
    live = apps.read_namespaced_deployment(name, owner.namespace)
    manifest = render.deployment(api.parse_spec(obj["spec"]), owner, track, live.spec.replicas)
    del manifest["metadata"]["annotations"][ANNOTATION_RENDERED]
    manifest["spec"]["template"]["metadata"]["annotations"][OLDER_RENDER] = "specgate 0.1"
    apps.patch_namespaced_deployment(
        name,
        owner.namespace,
        manifest,
        field_manager=kube.FIELD_MANAGER,
        force=True,
        _content_type=kube.APPLY,
    )


def deployment_view(api_client: client.ApiClient, namespace: str, track: Track) -> kube.DeploymentView:
    body = client.AppsV1Api(api_client).read_namespaced_deployment(f"upgrade-{track.value}", namespace)
    return kube.deployment_view(api_client.sanitize_for_serialization(body))


def settled(view: kube.DeploymentView) -> bool:
    return not view.rolling and view.ready_replicas == view.replicas


def upgrade_the_operator_mid_analysis(lab: dict[str, Any]) -> None:
    """replicas 4, canary 1, maxSurge 0, maxUnavailable 1, mid-analysis: the operator stops, both
    tracks' pods are rolled (one track at a time) onto an older version's rendering, and the
    operator starts again. Its first reconcile would re-render both Deployments at once, each taking
    a Ready pod: 2 of 4 serving. It rolls the baseline, then the canary, and 3 of 4 always serve."""
    api_client, namespace = lab["api_client"], lab["namespace"]
    # Drafts the analysis never reaches: it stays Analyzing, both tracks serving, until the end.
    body = sim_rollout("upgrade", GOOD, gates={"minDrafts": 10**9}, maxAnalysisDuration="15m")
    body["spec"]["replicas"] = 4
    body["spec"]["rollout"] |= {"maxSurge": 0, "maxUnavailable": 1}
    operator = lab_operator(lab["kubeconfig"], namespace, lab["prometheus_url"], lab["log_dir"])
    rolling_at_once: list[float] = []
    upgraded: list[float] = []

    def views() -> list[kube.DeploymentView]:
        return [deployment_view(api_client, namespace, track) for track in Track]

    def upgrade_mid_analysis(obj: dict[str, Any]) -> None:
        if upgraded:
            if all(view.rolling for view in views()):
                rolling_at_once.append(time.monotonic())
            return
        if obj.get("status", {}).get("phase") != "Analyzing" or not all(settled(v) for v in views()):
            return
        operator.stop()
        for track in Track:
            apply_as_older_operator(api_client, obj, track)
            wait_for(
                lambda t=track: settled(deployment_view(api_client, namespace, t)), 120, f"{track} rolled"
            )
        operator.start()
        upgraded.append(time.monotonic())

    def on_new_render(obj: dict[str, Any]) -> bool:
        pods = live_pods(api_client, namespace, "upgrade")
        done = len(pods) == 4 and not any(OLDER_RENDER in (p.metadata.annotations or {}) for p in pods)
        return bool(upgraded) and done and all(settled(v) for v in views())

    run = run_rollout(
        body=body, during=upgrade_mid_analysis, until=on_new_render, operator=operator, timeout=480, **lab
    )
    assert run.phases == ["Baseline", "Canary", "Analyzing"], run.phases  # the upgrade restarted nothing
    assert not rolling_at_once, f"both tracks rolled at once {len(rolling_at_once)} times"
    report(
        test="operator_upgrade_re_render", replicas=4, floor=3, seconds=round(time.monotonic() - upgraded[0])
    )


# The four rollouts above run side by side, each asserting as it goes; a test takes its rollout's
# outcome, re-raising its failure.
rollouts = side_by_side(
    {
        "day2": pause_edit_abort_retry,
        "crashlate": crash_loop_after_promotion,
        "upgrade": upgrade_the_operator_mid_analysis,
        "badbase": baseline_crash_loop_after_an_edit,
    }
)


def test_pauses_change_no_pod_an_edit_reaches_only_the_canary_and_abort_and_retry_go_through_kubectl(
    rollouts: Rollouts,
) -> None:
    rollouts["day2"].result()


def test_a_crash_looping_canary_after_promotion_rolls_back_with_no_spare_gpu(rollouts: Rollouts) -> None:
    rollouts["crashlate"].result()


def test_an_operator_upgrade_that_renders_pods_differently_rolls_one_track_at_a_time(
    rollouts: Rollouts,
) -> None:
    rollouts["upgrade"].result()


def test_a_crash_looping_baseline_after_an_edit_is_baseline_unhealthy_while_the_canary_serves(
    rollouts: Rollouts,
) -> None:
    rollouts["badbase"].result()
