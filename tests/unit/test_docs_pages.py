"""The pages issue 62 added hold what they promise: the README's front door (short, with its
maturity line and links), LICENSE and CHANGELOG.md against pyproject and the chart, and the GitOps
page's manifests against the chart's values, the CRD and the Flux health checks' one home.

The docs tests of test_readme.py already check every page under docs/ (fields, commands, links,
SpeculativeDeployments); these add what those cannot see: the values inside an Argo CD Application
or a HelmRelease, what each tool is told to ignore, and the files outside docs/.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from tests.conftest import ROOT
from tests.docs_text import DOCS_DIR, README, fenced_blocks

from specgate import api, render

GITOPS = DOCS_DIR / "guides" / "gitops.md"
CHANGELOG = ROOT / "CHANGELOG.md"
CHART = ROOT / "charts" / "specgate"


def chart() -> dict[str, Any]:
    meta: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return meta


def pyproject() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


# --- README, LICENSE, CHANGELOG ---


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 170
    assert "**Maturity.**" in text and "Not yet run\non a GPU with vLLM" in text
    for target in ("CHANGELOG.md", "LICENSE", "docs/guides/gitops.md", "docs/benchmarks.md"):
        assert f"]({target}" in text, target


def test_the_license_is_the_one_pyproject_names() -> None:
    assert pyproject()["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def changelog_versions(text: str) -> list[str]:
    return re.findall(r"^## (\d+\.\d+\.\d+)\b", text, flags=re.M)


def test_the_changelog_has_every_version_and_the_next() -> None:
    """A heading per version from 0.1.0 to the chart's, and the next one above it; the chart's and
    the package's versions agree."""
    version = chart()["version"]
    assert version == chart()["appVersion"] == pyproject()["version"]
    versions = changelog_versions(CHANGELOG.read_text())
    assert versions[0] != version and version in versions and versions[-1] == "0.1.0"
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)


def test_the_changelogs_links_resolve() -> None:
    text = CHANGELOG.read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith("http")]
    assert targets and [t for t in targets if not (ROOT / t).exists()] == []


def test_the_changelog_checks_catch_a_missing_version() -> None:
    assert changelog_versions("## 0.3.0 (unreleased)\n\n## 0.1.0\n") == ["0.3.0", "0.1.0"]
    assert chart()["version"] not in changelog_versions("## 0.3.0 (unreleased)\n\n## 0.1.0\n")


# --- the GitOps page ---


def manifests_of(page: Path) -> list[dict[str, Any]]:
    return [
        doc
        for block in fenced_blocks(page.read_text(), "yaml")
        if isinstance(doc := yaml.safe_load(block), dict)
    ]


def manifests() -> list[dict[str, Any]]:
    return manifests_of(GITOPS)


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests() if m.get("kind") == kind]


def leaves(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(node, dict) and node:
        for key, sub in node.items():
            yield from leaves(sub, (*path, key))
    else:
        yield path


def unknown_values(values: dict[str, Any]) -> list[str]:
    """The paths of values that the chart's values.yaml does not have."""
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())

    def known(path: tuple[str, ...]) -> bool:
        node = chart_values
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    return [".".join(p) for p in leaves(values) if not known(p)]


def chart_values_set() -> list[dict[str, Any]]:
    """The values the Argo CD Application and the HelmRelease give the chart."""
    found = [app["spec"]["source"]["helm"]["valuesObject"] for app in by_kind("Application")
             if app["spec"]["source"].get("path") == "charts/specgate"]  # fmt: skip
    found += [release["spec"]["values"] for release in by_kind("HelmRelease")]
    return found


def test_the_gitops_page_gives_the_chart_only_its_values() -> None:
    values = chart_values_set()
    assert len(values) == 2
    assert [p for v in values for p in unknown_values(v)] == []
    assert {v["image"]["tag"] for v in values} == {chart()["appVersion"]}


def test_the_gitops_page_has_both_tools_ignore_the_existing_routes_backend_refs() -> None:
    """Argo CD: ignoreDifferences on the rule's backendRefs with RespectIgnoreDifferences=true, for
    the route and rule its SpeculativeDeployment names; Flux: the route kept out of its applies."""
    (sd,) = by_kind("SpeculativeDeployment")
    route = sd["spec"]["rollout"]["traffic"]["existingRoute"]
    (models,) = [app for app in by_kind("Application") if app["spec"].get("ignoreDifferences")]
    (ignored,) = models["spec"]["ignoreDifferences"]
    assert (ignored["group"], ignored["kind"], ignored["name"]) == (
        "gateway.networking.k8s.io",
        "HTTPRoute",
        route["name"],
    )
    (expression,) = ignored["jqPathExpressions"]
    assert f'select(.name == "{route["ruleName"]}")' in expression and expression.endswith(".backendRefs")
    assert "RespectIgnoreDifferences=true" in models["spec"]["syncPolicy"]["syncOptions"]
    text = GITOPS.read_text()
    for annotation in (
        "kustomize.toolkit.fluxcd.io/reconcile: disabled",
        "kustomize.toolkit.fluxcd.io/ssa: IfNotPresent",
    ):
        assert annotation in text


def test_the_gitops_kustomization_is_the_integrations_one() -> None:
    """The page's Flux Kustomization waits as integrations/flux/kustomization.yaml does and takes
    its health checks from there (one home), depending on the chart's."""
    (page,) = by_kind("Kustomization")
    home = yaml.safe_load((ROOT / "integrations" / "flux" / "kustomization.yaml").read_text())
    assert {k: page["spec"][k] for k in ("wait", "timeout", "prune")} == {
        k: home["spec"][k] for k in ("wait", "timeout", "prune")
    }
    assert home["spec"]["healthCheckExprs"] and "integrations/flux/kustomization.yaml" in GITOPS.read_text()
    assert page["spec"]["dependsOn"] == [{"name": "specgate"}]


def test_the_gitops_checks_catch_an_unknown_value() -> None:
    assert unknown_values({"image": {"tag": "0.2.0"}, "metrics": {"prometheusRule": {"enabled": True}}}) == []
    assert unknown_values({"metrics": {"prometheusRules": {"enabled": True}}}) == [
        "metrics.prometheusRules.enabled"
    ]


# --- figures cite their source ---

BENCHMARKS = DOCS_DIR / "benchmarks.md"
# Each page of figures, and the files its figures must come from (the measured ones and, for the
# draft sizes, the cost model's shapes).
FIGURE_SOURCES = {
    DOCS_DIR / "concepts" / "what-the-gates-mean.md": [BENCHMARKS, ROOT / "bench" / "gpu" / "README.md"],
    DOCS_DIR / "concepts" / "choosing-a-draft.md": [
        BENCHMARKS,
        ROOT / "operator" / "specgate" / "planning.py",
    ],
    DOCS_DIR / "concepts" / "how-it-compares.md": [BENCHMARKS],
}


def figures(text: str) -> set[str]:
    """The decimal figures of a text's prose (outside code spans and blocks)."""
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]+`", "", prose)
    return set(re.findall(r"(?<![\w.])\d+\.\d+(?![\d.])", prose))


def test_every_figure_on_the_pages_of_figures_is_in_their_sources() -> None:
    """Each decimal figure of the pages of figures (what the gates mean, choosing a draft, how it
    compares) is one their sources record: docs/benchmarks.md, bench/gpu/, the cost model's shapes."""
    problems = []
    for page, sources in FIGURE_SOURCES.items():
        recorded = set().union(*(figures(source.read_text()) for source in sources))
        problems += [f"{page.name}: {f}" for f in sorted(figures(page.read_text()) - recorded)]
    assert problems == []
    pages = {page.name: figures(page.read_text()) for page in FIGURE_SOURCES}
    assert {"1.49", "0.47"} <= pages["what-the-gates-mean.md"] and {"1.57", "0.40"} <= pages[
        "choosing-a-draft.md"
    ]
    assert figures("1.50x and `--alpha 0.6`") == {"1.50"}


# --- a plain scrape_config ---


def sd_label(pod_label: str) -> str:
    """Kubernetes service discovery's meta label for a pod label (dots and slashes to underscores)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", pod_label)


def test_the_plain_scrape_config_gives_the_labels_the_operator_selects_by() -> None:
    """The scrape_config of guides/prometheus.md keeps the pods render.py marks as vLLM engines and
    writes each label the operator's selector reads (MetricsSource's defaults) from its pod label."""
    (config,) = [m for m in manifests_of(DOCS_DIR / "guides" / "prometheus.md") if "scrape_configs" in m]
    (job,) = config["scrape_configs"]
    rules = job["relabel_configs"]
    keeps = {r["source_labels"][0]: r["regex"] for r in rules if r.get("action") == "keep"}
    assert keeps[sd_label(render.LABEL_ENGINE)] == "vllm"
    written = {r["target_label"]: r["source_labels"][0] for r in rules if "target_label" in r}
    source = api.MetricsSource()
    assert written == {
        source.namespace_label: "__meta_kubernetes_namespace",
        source.deployment_label: sd_label(render.LABEL_DEPLOYMENT),
        source.track_label: sd_label(render.LABEL_TRACK),
    }
    assert job["scrape_interval"] == api.MetricsSource.model_fields["scrape_interval"].default


# --- sizing: the cold start's clocks ---


def test_the_sizing_page_states_the_startup_probe_and_the_deadline_rendered() -> None:
    """install/sizing.md's '10 s x 180', '30 minutes' and '15m' are what render.py gives the vLLM
    container and api.py's progressDeadline default."""
    spec = api.parse_spec(
        {"model": {"name": "m"}, "image": "vllm/vllm-openai:v0.32.0", "speculative": {"method": "ngram"}}
    )
    owner = render.Owner(name="m", namespace="ns", uid="0")
    (container,) = render.deployment(spec, owner, render.Track.BASELINE, 1)["spec"]["template"]["spec"][
        "containers"
    ]
    probe = container["startupProbe"]
    text = (DOCS_DIR / "install" / "sizing.md").read_text()
    assert f"{probe['periodSeconds']} s x {probe['failureThreshold']}" in text
    assert f"{probe['periodSeconds'] * probe['failureThreshold'] // 60} minutes" in text
    assert f"`rollout.progressDeadline`** ({api.RolloutSpec().progress_deadline} by default)" in text
