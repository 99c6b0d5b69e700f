"""The chart's PrometheusRule as users install it (rendered by helm), evaluated by Prometheus's own
rule engine (`promtool test rules`) on the series the operator exports: each alert fires where its
runbook says, and stays quiet beside it (no cluster)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import ROOT, tool

CACHE = Path(os.environ.get("SPECGATE_CACHE") or Path.home() / ".cache" / "specgate")
CHART = ROOT / "charts" / "specgate"
RELEASE_NS = "specgate-system"
BASE = "https://example.com/runbooks/"


def render(*values: str) -> list[dict[str, Any]]:
    """What `helm install specgate` into specgate-system creates, with the alerts enabled."""
    helm = tool(str(CACHE / "bin" / "helm"), "make binaries")
    done = subprocess.run(
        [helm, "template", "specgate", str(CHART), "--namespace", RELEASE_NS,
         "--set", "metrics.prometheusRule.enabled=true", "--set", f"metrics.prometheusRule.runbookBaseUrl={BASE}",
         *values],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def operator_down(docs: list[dict[str, Any]]) -> str:
    (rule,) = of_kind(docs, "PrometheusRule")
    (down,) = (a for a in alerts(rule) if a["alert"] == "SpecgateOperatorDown")
    expr: str = down["expr"]
    return expr


def alerts(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def annotations(summary: str, description: str, page: str) -> dict[str, str]:
    return {"summary": summary, "description": description, "runbook_url": BASE + page}


ERRORS_TEXT = annotations(
    "specgate cannot reconcile ns/broken",
    "Reconciles keep failing, so the rollout does not advance; the operator log says why.",
    "reconcile-errors.md",
)
ROLLED_BACK_TEXT = annotations(
    "ns/eagle serves without speculative decoding: rolled back",
    "kubectl describe sd -n ns eagle gives the reason; bump spec.rollout.retry to try again.",
    "README.md",
)
DEGRADED_TEXT = annotations(
    "ns/crashing is Degraded",
    "kubectl get sd -n ns crashing -o jsonpath='{.status.reason}: {.status.message}' says why "
    "(BaselineUnhealthy, RollbackStalled, MetricsUnavailable, InvalidSpec, ...); the reason's runbook "
    "page says what to do.",
    "degraded.md",
)
STUCK_TEXT = annotations(
    "ns/waiting has been in Baseline for 2h 1m 0s",
    "Longer than any phase lasts within its deadlines (7200s, metrics.prometheusRule.phaseStuckSeconds); "
    "kubectl describe sd -n ns waiting says what it waits for.",
    "phase-stuck.md",
)
DOWN_TEXT = annotations(
    "specgate's operator is down: no rollout advances, rolls back or is guarded",
    'No target of up{job="specgate-metrics",namespace="specgate-system"} has been up for 5 minutes.',
    "operator-down.md",
)


def mismatch(name: str) -> dict[str, Any]:
    """SpecgateRouteWeightMismatch as it fires for object ns/NAME."""
    text = annotations(
        f"ns/{name}: its Gateways do not route the weights specgate sets",
        "For 15m the weights the HTTPRoute's Gateways accepted have differed from those specgate sets, "
        "or been absent: meanwhile an analysis is held and a track losing weight keeps its pods. "
        f"kubectl get sd -n ns {name} -o jsonpath='{{.status.traffic}}' shows both.",
        "route-weight-mismatch.md",
    )
    return {"exp_labels": {"severity": "warning", "namespace": "ns", "name": name}, "exp_annotations": text}


UP = 'up{job="specgate-metrics",namespace="specgate-system",instance="%s"}'
DOWN_LABELS = {"severity": "warning", "job": "specgate-metrics", "namespace": RELEASE_NS}


def series(metric: str, name: str, values: str, **labels: str) -> dict[str, str]:
    """An input series of object ns/NAME; values in promtool's notation ("0 0 1x10")."""
    matchers = ",".join(f'{k}="{v}"' for k, v in {"namespace": "ns", "name": name, **labels}.items())
    return {"series": f"{metric}{{{matchers}}}", "values": values}


def phase(name: str, value: str, values: str) -> dict[str, str]:
    return series("specgate_rollout_phase", name, values, phase=value)


def degraded(name: str, values: str) -> dict[str, str]:
    return series("specgate_condition", name, values, type="Degraded")


def since(name: str, values: str) -> dict[str, str]:
    return series("specgate_phase_since_timestamp_seconds", name, values)


def weight(name: str, track: str, source: str, values: str) -> dict[str, str]:
    return series("specgate_route_weight_percent", name, values, track=track, source=source)


def route(name: str, source: str, canary: str) -> list[dict[str, str]]:
    """Both tracks' series of one source, the canary's percent given and the baseline's the rest."""
    rest = " ".join(
        f"{100 - int(value)}x{count}" for value, count in (part.split("x") for part in canary.split())
    )
    return [weight(name, "canary", source, canary), weight(name, "baseline", source, rest)]


def quiet(alert: str, *minutes: int) -> list[dict[str, Any]]:
    return [{"eval_time": f"{m}m", "alertname": alert, "exp_alerts": []} for m in minutes]


def fires(alert: str, minute: int, labels: dict[str, str], text: dict[str, str]) -> dict[str, Any]:
    return {
        "eval_time": f"{minute}m",
        "alertname": alert,
        "exp_alerts": [{"exp_labels": labels, "exp_annotations": text}],
    }


# Each alert's test groups (promtool's `tests`, 1-minute samples): the case that fires and, beside
# it in the same group, the ones that must not.
CASES: dict[str, list[dict[str, Any]]] = {
    # Errors for 10 minutes fire; an old error count that stopped rising does not.
    "SpecgateReconcileErrors": [{"input_series": [
        series("specgate_reconcile_errors_total", "broken", "0+1x40"),
        series("specgate_reconcile_errors_total", "fine", "3x40"),
    ], "alert_rule_test": [
        *quiet("SpecgateReconcileErrors", 5),
        fires("SpecgateReconcileErrors", 25, {"severity": "warning", "namespace": "ns", "name": "broken"}, ERRORS_TEXT),
    ]}],
    "SpecgateRolledBack": [{"input_series": [
        phase("eagle", "RolledBack", "0 0 1x10"), phase("good", "RolledBack", "0x12"),
    ], "alert_rule_test": [
        *quiet("SpecgateRolledBack", 1),
        fires("SpecgateRolledBack", 5, {"severity": "info", "namespace": "ns", "name": "eagle"}, ROLLED_BACK_TEXT),
    ]}],
    # A baseline crash-looping from minute 2 (BaselineUnhealthy) fires 15 minutes later; a rollback
    # Degraded for 10 minutes while it runs does not, nor a RolledBack object (its own alert).
    "SpecgateDegraded": [{"input_series": [
        degraded("crashing", "0 0 1x30"), phase("crashing", "Baseline", "1x32"),
        degraded("rolling", "1x10 0x20"), phase("rolling", "RollingBack", "1x10 0x20"),
        degraded("rolled", "1x30"), phase("rolled", "RolledBack", "1x30"),
        degraded("fine", "0x30"), phase("fine", "Promoted", "1x30"),
    ], "alert_rule_test": [
        *quiet("SpecgateDegraded", 10, 16),
        fires("SpecgateDegraded", 20, {"severity": "warning", "namespace": "ns", "name": "crashing"}, DEGRADED_TEXT),
    ]}],
    # In Baseline since time 0 fires past 2h; one that moved on to Canary at minute 30, and one
    # Promoted (a phase that lasts) since time 0, do not.
    "SpecgatePhaseStuck": [{"input_series": [
        phase("waiting", "Baseline", "1x130"), since("waiting", "0x130"),
        phase("moved", "Baseline", "1x30 0x100"), phase("moved", "Canary", "0x30 1x100"), since("moved", "0x30 1800x100"),
        phase("done", "Promoted", "1x130"), since("done", "0x130"),
    ], "alert_rule_test": [
        *quiet("SpecgatePhaseStuck", 119),
        fires("SpecgatePhaseStuck", 121, {"severity": "warning", "namespace": "ns", "name": "waiting", "phase": "Baseline"}, STUCK_TEXT),
    ]}],
    # A route its Gateway never accepts (accepted absent) fires 15 minutes on; one edited by hand
    # from minute 8 fires later (a different object, so at minute 20 only the first); rounding
    # (33 against 34) does not, nor a weight change the Gateway accepts a minute later, nor an
    # object whose desired weights are unset (Paused long ago on an older operator, router Service).
    "SpecgateRouteWeightMismatch": [{"input_series": [
        *route("refused", "desired", "25x40"),
        *route("edited", "desired", "50x40"), *route("edited", "accepted", "50x8 20x32"),
        *route("rounded", "desired", "33x40"), *route("rounded", "accepted", "34x40"),
        *route("moving", "desired", "0x10 50x30"), *route("moving", "accepted", "0x11 50x29"),
        weight("unset", "canary", "accepted", "25x40"),
    ], "alert_rule_test": [
        *quiet("SpecgateRouteWeightMismatch", 10, 14),
        {"eval_time": "20m", "alertname": "SpecgateRouteWeightMismatch", "exp_alerts": [mismatch("refused")]},
        {"eval_time": "30m", "alertname": "SpecgateRouteWeightMismatch", "exp_alerts": [mismatch("refused"), mismatch("edited")]},
    ]}],
    # Two peered replicas: one down is not an outage; both down for 5 minutes is. Then the targets
    # gone from Prometheus altogether (the Deployment deleted, the ServiceMonitor's selector wrong).
    "SpecgateOperatorDown": [
        {"input_series": [
            {"series": UP % "a", "values": "1x10 0x30"}, {"series": UP % "b", "values": "1x15 0x25"},
        ], "alert_rule_test": [*quiet("SpecgateOperatorDown", 12, 18), fires("SpecgateOperatorDown", 25, DOWN_LABELS, DOWN_TEXT)]},
        {"input_series": [
            {"series": UP % "a", "values": "1x10 _x30"}, {"series": 'up{job="other",namespace="specgate-system"}', "values": "1x40"},
        ], "alert_rule_test": [*quiet("SpecgateOperatorDown", 12), fires("SpecgateOperatorDown", 25, DOWN_LABELS, DOWN_TEXT)]},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def rule() -> dict[str, Any]:
    (prometheus_rule,) = of_kind(render(), "PrometheusRule")
    return prometheus_rule


def test_every_alert_links_its_runbook_and_has_a_case(rule: dict[str, Any]) -> None:
    for alert in alerts(rule):
        page = alert["annotations"]["runbook_url"].removeprefix(BASE)
        assert (ROOT / "runbooks" / page).is_file(), f"{alert['alert']} links a missing page {page}"
    assert sorted(a["alert"] for a in alerts(rule)) == sorted(CASES)


@pytest.mark.parametrize("alert", sorted(CASES))
def test_the_alert_fires_as_its_runbook_says(alert: str, rule: dict[str, Any], tmp_path: Path) -> None:
    promtool = tool(shutil.which("promtool"), "make cluster-up")  # Debian's prometheus ships it
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    groups = [{"interval": "1m", **group} for group in CASES[alert]]
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": groups}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_operator_down_alert_reads_the_job_the_service_monitor_scrapes() -> None:
    """The Prometheus Operator names a ServiceMonitor's job after the Service it scrapes (without a
    jobLabel): the alert's default `up` selector is that Service's name, in the release's namespace."""
    docs = render("--set", "metrics.serviceMonitor=true")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert "jobLabel" not in monitor["spec"]
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    (service,) = (s for s in of_kind(docs, "Service") if wanted <= s["metadata"]["labels"].items())
    selector = f'up{{job="{service["metadata"]["name"]}",namespace="{RELEASE_NS}"}}'
    assert operator_down(docs) == f"max by (job, namespace) ({selector}) == 0 or absent({selector})"


def test_the_operator_down_alert_reads_the_up_series_it_is_given() -> None:
    """operatorUpSelector, for an operator scraped by another scrape config than the chart's
    ServiceMonitor."""
    docs = render("--set", 'metrics.prometheusRule.operatorUpSelector=job="specgate"')
    assert (
        operator_down(docs)
        == 'max by (job, namespace) (up{job="specgate"}) == 0 or absent(up{job="specgate"})'
    )
