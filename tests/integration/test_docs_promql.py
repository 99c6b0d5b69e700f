"""Every PromQL query in docs/** and runbooks/** (the ```promql blocks) parses with Prometheus's own
parser (`promtool check rules`, each query a recording rule) and names only metrics and labels that
exist: specgate_* and vllm:* names from the sets tests/unit/test_readme.py checks the docs against,
label names from the metrics' own labels (the operator's registry, the simulator's vLLM families) and
the target labels Prometheus puts on them (the PodMonitor's podTargetLabels, MetricsSource's label
names, the Prometheus Operator's own). A query copied from a runbook then runs as written, once its
placeholders are filled in (no cluster)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import prometheus_client
import yaml
from tests.conftest import tool
from tests.docs_text import DOCS, doc_id, fenced_blocks, operator_metrics, vllm_samples

from specgate import api, render

# The placeholders the runbooks tell the reader to replace (runbooks/README.md: "replace NS, NAME"
# and the rollback's unix time), with a value of each kind. `@ <time>`, `@ T` and `@ $T` are the
# spellings a page might use for the time; the pages use a concrete example, 1764150000.
PLACEHOLDERS = {
    r"\bNS\b": "llm",
    r"\bNAME\b": "eagle",
    r"\bGEN\b": "3",
    r"@\s*(?:<time>|\$T\b|\bT\b|\$\{T\})": "@ 1764150000",
}

# The labels the Prometheus Operator gives every target it scrapes (a PodMonitor's vLLM pods, the
# chart's ServiceMonitor's operator): its own, not this project's, so listed here.
OPERATOR_TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service"}

SAMPLE_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info")


def queries() -> list[tuple[str, str]]:
    """(page, query) for each ```promql block of docs/** and runbooks/**, placeholders filled in."""
    found = []
    for doc in DOCS:
        for block in fenced_blocks(doc.read_text(), "promql"):
            query = block.strip()
            for pattern, value in PLACEHOLDERS.items():
                query = re.sub(pattern, value, query)
            found.append((doc_id(doc), query))
    return found


def prometheus_label_name(label: str) -> str:
    """A Kubernetes label as the Prometheus Operator turns it into a target label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def target_labels() -> set[str]:
    """The labels on every scraped series: the PodMonitor specgate renders (its podTargetLabels,
    specgate.dev/track as specgate_dev_track), the label names the operator selects by (MetricsSource's
    defaults) and the Prometheus Operator's own target labels."""
    monitor = render.pod_monitor(render.Owner("x", "ns", "uid"), "15s")
    labels = {prometheus_label_name(label) for label in monitor["spec"]["podTargetLabels"]}
    source = api.MetricsSource()
    labels |= {source.namespace_label, source.deployment_label, source.track_label}
    return labels | OPERATOR_TARGET_LABELS


def family_labels(registry: prometheus_client.CollectorRegistry, prefix: str) -> dict[str, set[str]]:
    """Each metric family of a registry (by its name without a sample suffix) with its label names:
    those it is declared with and those its samples carry (an Info's; a histogram's `le` is its
    _bucket samples', see labels_of)."""
    families: dict[str, set[str]] = {}
    for collector in list(registry._collector_to_names):
        declared = set(getattr(collector, "_labelnames", ()))
        for family in collector.collect():
            if family.name.startswith(prefix):
                sampled = {label for sample in family.samples for label in sample.labels} - {"le"}
                families.setdefault(family.name, set()).update(declared | sampled)
    return families


def metric_labels() -> dict[str, set[str]]:
    """specgate_* families from the operator's registry, vllm:* families as the simulator exports
    them (vLLM's labels: model_name, engine, finished_reason, position)."""
    from specgate import metrics, prometheus, vllm_metrics  # noqa: F401  (importing registers them)
    from specgate_lab.sim.metrics import LABELS, EngineMetrics

    families = family_labels(prometheus_client.REGISTRY, "specgate_")
    # vLLM's families the simulator does not export (the per-step histogram's name before vLLM
    # 0.10.2) carry the labels every vLLM family has.
    families |= {v: set(LABELS) for k, v in vars(vllm_metrics).items() if k.isupper() and isinstance(v, str)}
    families |= family_labels(EngineMetrics.create(speculative=True).registry, "vllm:")
    families["up"] = set()  # Prometheus's own, per target: only target labels
    return families


def labels_of(name: str, families: dict[str, set[str]]) -> set[str]:
    """The label names of a sample name's family (with `le` for a histogram's _bucket)."""
    for candidate in (name, *(name.removesuffix(s) for s in SAMPLE_SUFFIXES if name.endswith(s))):
        if candidate in families:
            return families[candidate] | ({"le"} if name.endswith("_bucket") else set())
    return set()


def without_strings(query: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', query)


def metric_names(query: str) -> list[str]:
    """The specgate_*, vllm:* and `up` names a query selects (not its label names)."""
    bare = GROUPING.sub("", re.sub(r"\{[^}]*\}", "", without_strings(query)))
    return re.findall(r"(?<![\w:])(?:specgate_[\w:]*|vllm:[\w:]*|up\b)", bare)


SELECTOR = re.compile(r"(?<![\w:])([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def label_problems(query: str, families: dict[str, set[str]], targets: set[str]) -> list[str]:
    """Each metric selector's matchers name labels of that metric (or target labels); every label
    of a by/without/on/ignoring/group_left clause is a label of some metric in the query."""
    problems = []
    in_query = set(targets)
    for name in metric_names(query):
        in_query |= labels_of(name, families)
    for metric, matchers in SELECTOR.findall(query):
        allowed = targets | labels_of(metric, families)
        for label in re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", without_strings(matchers)):
            if label != "__name__" and label not in allowed:
                problems.append(f"{metric or '{}'} has no label {label}")
    for labels in GROUPING.findall(without_strings(query)):
        for label in re.findall(r"[A-Za-z_]\w*", labels):
            if label not in in_query:
                problems.append(f"no metric in the query has a label {label} (grouped by)")
    return problems


def metric_problems(query: str, known: set[str]) -> list[str]:
    return [f"unknown metric {name}" for name in metric_names(query) if name not in known]


def test_the_docs_have_their_queries() -> None:
    """The runbooks' queries are found: the check is not vacuous."""
    pages = {page for page, _ in queries()}
    assert len(queries()) >= 14
    assert {"runbooks/latency-regression.md", "runbooks/acceptance-below-gate.md"} <= pages
    assert not [q for _, q in queries() if re.search(r"\b(NS|NAME|GEN)\b", q)], "a placeholder was left"


def test_every_query_parses(tmp_path: Path) -> None:
    """Prometheus's own parser takes each query (as a recording rule's expr: `promtool check rules`)."""
    promtool = tool(shutil.which("promtool"), "make cluster-up")  # Debian's prometheus ships it
    found = queries()
    rules = [{"record": f"docs_query_{i}", "expr": query} for i, (_, query) in enumerate(found)]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "docs", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    failed = {int(i) for i in re.findall(r'"docs_query_(\d+)"', done.stdout + done.stderr)}
    assert [f"{found[i][0]}: {found[i][1]}" for i in sorted(failed)] == []
    output = done.stdout + done.stderr
    assert done.returncode == 0 and f"SUCCESS: {len(found)} rules found" in done.stdout, output


def test_the_parse_check_catches_a_broken_query(tmp_path: Path) -> None:
    promtool = tool(shutil.which("promtool"), "make cluster-up")
    rules = [{"record": "docs_query_0", "expr": 'sum by (le (rate(up{job="x"}[5m] @ 1764150000))'}]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "docs", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode != 0 and "docs_query_0" in done.stdout + done.stderr


def test_every_query_names_known_metrics_and_labels() -> None:
    known = operator_metrics() | vllm_samples() | {"up"}
    families, targets = metric_labels(), target_labels()
    problems = [
        f"{page}: {problem}: {query}"
        for page, query in queries()
        for problem in metric_problems(query, known) + label_problems(query, families, targets)
    ]
    assert problems == []


def test_the_label_check_knows_the_labels_and_catches_a_wrong_one() -> None:
    families, targets = metric_labels(), target_labels()
    assert {"namespace", "specgate_dev_deployment", "specgate_dev_track", "pod", "job"} <= targets
    assert {"model_name", "engine", "position"} <= families["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert {"namespace", "name", "type"} <= families["specgate_condition"]

    def problems(query: str) -> list[str]:
        return label_problems(query, families, targets)

    good = 'sum by (le, specgate_dev_track) (increase(vllm:inter_token_latency_seconds_bucket{namespace="x"}[10m]))'
    assert problems(good) == []
    # the track's label is specgate_dev_track, the condition's is type
    assert problems('vllm:num_requests_running{specgate_track="canary"}') != []
    assert problems('specgate_condition{phase="Degraded"}') != []
    assert problems('sum by (position) (vllm:spec_decode_num_drafts_total{namespace="x"})') != []
    assert problems('vllm:num_requests_running{le="0.1"}') != []  # le is a histogram bucket's
    known = operator_metrics() | vllm_samples()
    assert metric_problems("rate(vllm:spec_decode_num_draft_total[5m])", known) != []
