"""The README, docs/ and the runbooks name only what exists: make targets, spec fields, Helm values,
commands, files, links and metrics.

A newcomer copies what the docs say. These checks read README.md, docs/**/*.md and runbooks/*.md and
hold every name they use against its source: `make X` against the Makefile and hack/*.mk, field paths
against the CRD schema generated from api.py (and the chart's values for Helm settings), `specgate`
commands against its parser, links (and their anchors) and paths against the repository, metric names
against the operator's registry and vLLM's families, the `kubectl get sd` header against the CRD's
printer columns.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.conftest import ROOT
from tests.docs_text import (
    DOCS,
    DOCS_DIR,
    FIELD_GUIDE,
    README,
    RUNBOOKS,
    doc_id,
    fenced_blocks,
    operator_metrics,
    vllm_samples,
)

from specgate import api, cli, crd


def all_text() -> str:
    return "\n".join(doc.read_text() for doc in DOCS)


Node = dict[str, Any]


def code_spans(text: str) -> list[str]:
    """The inline code spans and the fenced code blocks of a Markdown text."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return fenced + re.findall(r"`([^`\n]+)`", prose)


# --- make targets ---


def make_targets() -> set[str]:
    targets: set[str] = set()
    for path in [ROOT / "Makefile", *sorted((ROOT / "hack").glob("*.mk"))]:
        for line in path.read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", line)
            if match and not match.group(1).startswith("."):
                targets.add(match.group(1))
    return targets


def make_invocations(text: str) -> set[str]:
    """Targets of `make [VAR=value ...] target` in the code of a text (`make help`, `make demo KEEP=1`)."""
    found: set[str] = set()
    for code in code_spans(text):
        for match in re.finditer(r"(?:^|[\s;&|(])make\s+((?:[A-Z_]+=\S*\s+)*)([a-z][a-z0-9_-]*)", code):
            found.add(match.group(2))
    return found


def test_every_make_target_named_exists() -> None:
    named = set().union(*(make_invocations(doc.read_text()) for doc in DOCS))
    assert {"demo", "test", "cluster-up", "api-docs"} <= named, "the docs' own make commands were not found"
    assert named - make_targets() == set()


# --- field paths ---


def spec_schema() -> Node:
    node: Node = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return node


def nodes(schema: Node) -> Iterator[Node]:
    yield schema
    for sub in schema.get("properties", {}).values():
        yield from nodes(sub)
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"])


def resolve(schema: Node, parts: list[str]) -> bool:
    node = schema
    for part in parts:
        while "items" in node and "properties" not in node:  # a list: its items' fields
            node = node["items"]
        properties = node.get("properties", {})
        if part not in properties:
            return False
        node = properties[part]
    return True


def helm_values() -> Node:
    values: Node = yaml.safe_load((ROOT / "charts" / "specgate" / "values.yaml").read_text())
    return values


def resolve_values(values: Any, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(values, dict) or part not in values:
            return False
        values = values[part]
    return True


FIELD_PATH = re.compile(r"^[a-z][A-Za-z0-9]*(?:\.[a-z][A-Za-z0-9]*)+(?:\.\*)?$")


def field_paths(text: str) -> set[str]:
    """Dotted camelCase names in code spans: `spec.rollout.gates.minDrafts`, `metrics.scrapeInterval`."""
    found: set[str] = set()
    for code in code_spans(text):
        for token in re.split(r"[\s,;()'\"=:{}\[\]]+", code.strip()):
            token = token.rstrip(".")
            if FIELD_PATH.match(token):
                found.add(token.removesuffix(".*"))
    return found


def field_problem(path: str, root: Node, values: Node) -> str | None:
    """Why path names nothing, or None. spec./status. paths must resolve from the object's root;
    other paths whose first name is a field or a Helm value must resolve somewhere below it."""
    parts = path.split(".")
    properties = root["properties"]
    if parts[0] in ("spec", "status"):
        return None if resolve(root, parts) else f"{path}: not in the CRD schema"
    known_names = {name for node in nodes(root) for name in node.get("properties", {})}
    if parts[0] not in known_names and parts[0] not in values:
        return None  # not a field path: a file name, a Python module, kubectl's `sd.spec`
    if resolve_values(values, parts):
        return None
    for node in nodes(properties["spec"]):
        if resolve(node, parts):
            return None
    for node in nodes(properties["status"]):
        if resolve(node, parts):
            return None
    return f"{path}: neither a spec or status field (relative to any object) nor a Helm value"


def test_every_field_path_named_exists_in_the_crd_schema() -> None:
    root, values = spec_schema(), helm_values()
    problems = []
    for doc in DOCS:
        paths = field_paths(doc.read_text())
        problems += [
            f"{doc_id(doc)}: {p}" for path in sorted(paths) if (p := field_problem(path, root, values))
        ]
    assert problems == []


def test_the_field_check_sees_the_readme_fields() -> None:
    """The docs' field names are found, and one misspelled is caught (the check is not vacuous)."""
    paths = field_paths(all_text())
    assert {"rollout.metrics.scrapeInterval", "rollout.gates.minAcceptanceRate", "guard.window"} <= paths
    root, values = spec_schema(), helm_values()
    assert field_problem("rollout.metrics.scrapeInterval", root, values) is None
    assert field_problem("rollout.metrics.scrapeIntervall", root, values) is not None
    assert field_problem("gates.maxP99PerTokenRegresion", root, values) is not None
    assert field_problem("spec.rollout.gates.minDraft", root, values) is not None
    assert field_problem("metrics.prometheusRule.enabled", root, values) is None  # a Helm value


def table_fields(text: str) -> set[str]:
    """The names in the first column of the guide's field table (`promptLookupMin/Max` is two)."""
    section = text.split("# A SpeculativeDeployment", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in re.findall(r"^\| (`.*?) \|", section, flags=re.M):
        for token in re.findall(r"`([^`]+)`", row):
            left, _, right = token.partition("/")
            names.add(left.removesuffix(".*"))
            if right:
                names.add(re.sub(r"[A-Z][a-z0-9]*$", right, left))
    return names


def test_every_name_in_the_field_table_is_a_spec_field() -> None:
    spec = spec_schema()["properties"]["spec"]
    known = {name for node in nodes(spec) for name in node.get("properties", {})}
    names = table_fields(FIELD_GUIDE.read_text())
    assert {"canaryReplicas", "promptLookupMax", "maxP99ItlRegression"} <= names
    unknown = [n for n in sorted(names) if not all(part in known for part in n.split("."))]
    assert unknown == []


def test_the_docs_yaml_is_a_valid_spec() -> None:
    """The SpeculativeDeployments (the README's minimal one, the guide's) and the benchmark snippet
    parse with the operator's own models (which refuse unknown fields)."""
    checked = 0
    for block in fenced_blocks(all_text(), "yaml"):
        doc = yaml.safe_load(block)
        if isinstance(doc, dict) and doc.get("kind") == api.KIND:
            api.parse_spec(doc["spec"])
            checked += 1
        elif isinstance(doc, dict) and set(doc) == {"rollout"}:
            api.RolloutSpec.model_validate(doc["rollout"])
            checked += 1
    assert checked >= 3


def test_helm_settings_are_chart_values() -> None:
    values = helm_values()
    settings = set(re.findall(r"--set\s+([A-Za-z][\w.]*)=", all_text()))
    assert "metrics.prometheusRule.enabled" in settings
    # kube-prometheus-stack's settings are that chart's, not ours
    ours = {s for s in settings if not s.startswith("prometheus.prometheusSpec.")}
    assert [s for s in sorted(ours) if not resolve_values(values, s.split("."))] == []


def test_the_example_values_files_set_only_chart_values() -> None:
    """examples/specgate-values.yaml sets only values the chart has; the kube-prometheus-stack one
    sets the three selector settings the GPU guide's --set chain gives."""
    values = helm_values()

    def leaves(node: Any, path: list[str]) -> Iterator[list[str]]:
        if isinstance(node, dict) and node and path[-1:] != ["monitorLabels"]:  # free-form labels
            for key, sub in node.items():
                yield from leaves(sub, [*path, key])
        else:
            yield path

    ours = yaml.safe_load((ROOT / "examples" / "specgate-values.yaml").read_text())
    paths = [".".join(p) for p in leaves(ours, [])]
    assert "metrics.prometheusRule.enabled" in paths
    assert [p for p in paths if not resolve_values(values, p.split("."))] == []
    kps = yaml.safe_load((ROOT / "examples" / "kube-prometheus-stack-values.yaml").read_text())
    guide = (DOCS_DIR / "install" / "gpu-cluster.md").read_text()
    for key, value in kps["prometheus"]["prometheusSpec"].items():
        assert f"--set prometheus.prometheusSpec.{key}={str(value).lower()}" in guide


# --- specgate commands ---

# `specgate SUBCOMMAND` (or `pause|resume|retry|abort`) as typed: the program alone, `.venv/bin/specgate`
# or `kubectl specgate`, not `kubectl-specgate`, `deploy/specgate` or `helm install specgate charts/...`.
SPECGATE_COMMAND = re.compile(
    r"(?:^|(?<=[\s;&(])|(?<=bin/))specgate\s+([a-z][a-z-]*(?:\|[a-z][a-z-]*)*)(?=\s|$)(.*)"
)


def specgate_invocations(text: str) -> list[str]:
    """The arguments of each `specgate SUBCOMMAND ...` in the code of a text, without the `[...]`
    optional parts and cut at a pipe or a comment; `pause|resume NAME` is one per subcommand."""
    found: list[str] = []
    for code in code_spans(text):
        for line in code.splitlines():
            for match in SPECGATE_COMMAND.finditer(line):
                rest = re.split(r"[|#]", re.sub(r"\[[^\]]*\]", "", match.group(2)))[0]
                rest = rest.strip().removesuffix("\\").strip()
                found += [f"{subcommand} {rest}".strip() for subcommand in match.group(1).split("|")]
    return found


def parse_problem(arguments: str) -> str | None:
    """What `specgate`'s own parser says against the arguments, or None when it takes them."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            cli.build_parser().parse_args(shlex.split(arguments))
    except SystemExit as exit_:  # argparse's error (code 2); --help exits 0
        return stderr.getvalue().strip().splitlines()[-1] if exit_.code else None
    except ValueError as error:  # shlex: an unclosed quote
        return str(error)
    return None


def test_every_specgate_command_named_parses() -> None:
    commands = [(doc_id(doc), args) for doc in DOCS for args in specgate_invocations(doc.read_text())]
    assert {"run", "status", "plan", "pause", "retry", "abort"} <= {args.split()[0] for _, args in commands}
    problems = [f"{name}: specgate {args}: {p}" for name, args in commands if (p := parse_problem(args))]
    assert problems == []


def test_the_command_check_cuts_notation_and_catches_a_bad_flag() -> None:
    text = (
        "`kubectl specgate pause|resume NAME`, `specgate run --peering NAME [--priority N]`, "
        "`helm install specgate charts/specgate`\n```bash\n.venv/bin/specgate plan --alpha 0.6 --k 3  # K\n"
        "specgate status NAME -o json | jq .phase\nkubectl logs deploy/specgate -n specgate-system\n```\n"
    )
    assert sorted(specgate_invocations(text)) == sorted(
        ["pause NAME", "resume NAME", "run --peering NAME", "plan --alpha 0.6 --k 3", "status NAME -o json"]
    )
    assert parse_problem("plan --alpha 0.6 --k 3 --concurrency 8") is None
    assert "--concurency" in (parse_problem("plan --alpha 0.6 --k 3 --concurency 8") or "")
    assert parse_problem("plan --alpha A --k K") is not None
    assert parse_problem("status") is not None  # NAME is required


# --- links and paths ---


def links(text: str) -> list[str]:
    """Relative link targets (`page.md`, `page.md#anchor`, `#anchor`), outside code blocks."""
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return [
        t
        for t in re.findall(r"\]\(([^)\s]+)\)", prose)
        if not t.startswith(("http://", "https://", "mailto:"))
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```[^\n]*\n.*?^```", "", path.read_text(), flags=re.S | re.M)
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_problem(doc: Path, target: str) -> str | None:
    """Why a relative link from doc does not resolve (a missing file or anchor), or None."""
    file_part, _, anchor = target.partition("#")
    path = (doc.parent / file_part).resolve() if file_part else doc
    if not path.exists():
        return f"{target}: no such file"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{target}: no heading with that anchor in {path.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_relative_link_resolves(doc: Path) -> None:
    """Every relative link in README, docs/ and runbooks/ names an existing file, and an existing
    heading when it has an anchor."""
    problems = [p for t in links(doc.read_text()) if (p := link_problem(doc, t))]
    assert problems == []


def test_the_link_check_catches_a_missing_file_and_anchor() -> None:
    assert slug("What one operator costs the cluster (`make bench-scale`)") == (
        "what-one-operator-costs-the-cluster-make-bench-scale"
    )
    assert link_problem(README, "docs/benchmarks.md#make-demo-and-make-test") is None
    assert link_problem(README, "docs/benchmark.md") is not None
    assert link_problem(README, "docs/benchmarks.md#no-such-heading") is not None
    assert link_problem(README, "#support-matrix") is None


def test_every_doc_is_reachable_from_the_readme_index() -> None:
    """Every page under docs/ is linked from the README's documentation index."""
    linked = {(README.parent / t.split("#")[0]).resolve() for t in links(README.read_text())}
    assert [doc_id(d) for d in sorted(DOCS_DIR.rglob("*.md")) if d.resolve() not in linked] == []


def test_every_runbook_named_exists() -> None:
    text = all_text()
    named = set(re.findall(r"runbooks/([\w-]+\.md)", text))
    assert "metrics-unavailable.md" in named
    assert [n for n in sorted(named) if not (RUNBOOKS / n).exists()] == []
    index = (RUNBOOKS / "README.md").read_text()
    pages = {p.name for p in RUNBOOKS.glob("*.md")} - {"README.md"}
    assert pages <= set(links(index)), "every runbook is listed in runbooks/README.md"


def test_repository_paths_in_code_exist() -> None:
    """`operator/specgate/gates/latency.py`, `hack/cluster-up.sh`, `integrations/argocd/health.lua`, ..."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    missing = []
    for doc in DOCS:
        for code in code_spans(doc.read_text()):
            for token in re.findall(r"[\w.-]+(?:/[\w.*-]+)+/?", code):
                if token.split("/")[0] in tops and "*" not in token and not (ROOT / token).exists():
                    missing.append(f"{doc_id(doc)}: {token}")
    assert missing == []


# --- what kubectl shows ---


def test_the_kubectl_get_sample_has_the_crd_columns() -> None:
    columns = crd.PRINTER_COLUMNS
    plain = ["NAME", *(c["name"].upper() for c in columns if not c.get("priority"))]
    wide = ["NAME", *(c["name"].upper() for c in columns)]
    headers = [line.split() for line in all_text().splitlines() if line.startswith("NAME ")]
    assert plain in headers and wide in headers
    assert all(h in (plain, wide) for h in headers)


# --- metric names ---


# Target labels the PodMonitor (and the lab) put on vLLM series, and the lab's package: not metrics.
NOT_METRICS = re.compile(r"^specgate_(dev_|lab\b)")  # specgate_dev_track, the specgate_lab package


def metric_names(text: str, prefix: str) -> set[str]:
    found = set(re.findall(rf"(?<![\w:.]){re.escape(prefix)}[A-Za-z0-9_:]+", "\n".join(code_spans(text))))
    return {name for name in found if not NOT_METRICS.match(name)}


def test_the_metrics_reference_lists_every_operator_metric() -> None:
    exported = operator_metrics(samples=False)
    assert {
        "specgate_reconcile_seconds",
        "specgate_reconcile_errors_total",
        "specgate_build_info",
    } <= exported
    listed = metric_names((DOCS_DIR / "reference" / "metrics.md").read_text(), "specgate_")
    assert sorted(exported - listed) == [], "docs/reference/metrics.md misses a metric the operator exports"


def test_every_metric_named_exists() -> None:
    """specgate_* names are the operator's metrics; vllm:* names are vLLM's families."""
    exported, vllm = operator_metrics(), vllm_samples()
    problems = []
    for doc in DOCS:
        text = doc.read_text()
        problems += [
            f"{doc_id(doc)}: {m}" for m in sorted(metric_names(text, "specgate_")) if m not in exported
        ]
        problems += [f"{doc_id(doc)}: {m}" for m in sorted(metric_names(text, "vllm:")) if m not in vllm]
    assert problems == []


def test_the_metric_check_catches_a_misspelling() -> None:
    assert metric_names(
        "`specgate_reconcile_second` and `vllm:spec_decode_num_drafts_total`", "specgate_"
    ) == {"specgate_reconcile_second"}
    assert "specgate_reconcile_second" not in operator_metrics()
    assert "vllm:spec_decode_num_drafts_total" in vllm_samples()
    assert "vllm:spec_decode_num_draft_total" not in vllm_samples()
