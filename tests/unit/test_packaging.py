"""Static checks of what users install: chart CRD and RBAC, image entrypoint, Argo CD health."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import celpy
import lupa.lua51 as lua51
import pytest
import yaml
from tests.conftest import ROOT

from specgate import api, cli, kube
from specgate.api import Phase

CHART = ROOT / "charts" / "specgate"


# The SpeculativeDeployment CRD is read by templates/crd.yaml (Helm upgrades it); kopf's peering
# CRDs stay in crds/ (Helm installs them before the peering objects it creates).
CHART_CRDS = ["files/specgate.dev_speculativedeployments.yaml", "crds/kopf.dev_peerings.yaml"]


@pytest.mark.parametrize("copy", CHART_CRDS)
def test_chart_ships_the_crds(copy: str) -> None:
    assert (CHART / copy).read_text() == (ROOT / "crds" / Path(copy).name).read_text(), (
        f"copy crds/ into charts/specgate/{Path(copy).parent} (make crd does it)"
    )


def chart_rules() -> set[tuple[str, str, frozenset[str]]]:
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    rules = []
    for name in ("specgate.rules", "specgate.clusterRules"):
        block = text.split(f'define "{name}" -}}}}', 1)[1].split("{{- end -}}", 1)[0]
        rules += yaml.safe_load(block)
    return {
        (group, resource, frozenset(rule["verbs"]))
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_chart_rbac_grants_exactly_the_permissions_kube_py_declares() -> None:
    """kube.PERMISSIONS is kept by hand beside kube.py's calls; that the chart's RBAC is enough for
    a whole rollout is tests/cluster/test_helm_chart.py's (the operator runs on its token)."""
    assert chart_rules() == set(kube.PERMISSIONS)


def test_values_schema_accepts_the_default_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
    assert set(schema["required"]) <= set(values)


def test_the_image_version_label_is_the_package_version() -> None:
    """The Dockerfile's default VERSION labels the image: it is pyproject's version and the chart's appVersion."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    (arg,) = re.findall(r"^ARG VERSION=(\S+)$", (ROOT / "Dockerfile").read_text(), flags=re.M)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert arg == version == chart["appVersion"]


def test_the_chart_points_at_no_address_that_does_not_exist() -> None:
    """No image is published and no runbook site exists: the defaults say so instead of linking."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert "/" not in values["image"]["repository"]  # a local name, not a registry's
    assert values["metrics"]["prometheusRule"]["runbookBaseUrl"] == ""
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "https://" not in notes and "crds/samples/llama-3.1-8b-eagle3.yaml" in notes
    assert (ROOT / "crds" / "samples" / "llama-3.1-8b-eagle3.yaml").is_file()


def test_the_dockerfiles_entrypoint_script_exists_and_parses_run() -> None:
    """The Dockerfile's ENTRYPOINT/CMD (`specgate run`): the installed `specgate` console script
    (the one the image's pip install makes) parses `run`. No image is built here: no Docker engine."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["specgate"]' in dockerfile and 'CMD ["run"]' in dockerfile
    assert "USER 65532:65532" in dockerfile
    out = subprocess.run(
        [str(Path(sys.executable).parent / "specgate"), "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--prometheus-url" in out.stdout


def test_peered_replicas_draw_their_own_priority_unless_given() -> None:
    def priority(*argv: str) -> int | None:
        return cli._priority(cli.build_parser().parse_args(["run", *argv]))

    assert priority() is None  # standalone
    assert priority("--peering", "p", "--priority", "7") == 7
    drawn = {priority("--peering", "p") for _ in range(20)}
    assert len(drawn) > 1 and all(p is not None and p > 0 for p in drawn)


def argo_health(obj: dict[str, Any]) -> dict[str, str]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    script = (ROOT / "integrations" / "argocd" / "health.lua").read_text()
    run = runtime.eval(f"function(obj) {script} end")
    result = run(runtime.table_from(_to_lua(runtime, obj)))
    return {k: result[k] for k in ("status", "message")}


def _to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: (runtime.table_from(_to_lua(runtime, v)) if isinstance(v, dict | list) else v)
            for k, v in value.items()
        }
    return value


def status_object(phase: Phase, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    status = api.SpeculativeDeploymentStatus(
        phase=phase, observed_generation=observed, reason="Why", message="figures"
    )
    return {
        "metadata": {"generation": generation},
        "status": status.model_dump(by_alias=True, mode="json", exclude_none=True),
    }


@pytest.mark.parametrize(
    ("phase", "health"),
    [
        (Phase.PROMOTED, "Healthy"),
        (Phase.ROLLED_BACK, "Degraded"),
        (Phase.FAILED, "Degraded"),
        (Phase.PAUSED, "Suspended"),
        (Phase.ANALYZING, "Progressing"),
    ],
)
def test_argocd_health(phase: Phase, health: str) -> None:
    result = argo_health(status_object(phase))
    assert result["status"] == health
    assert result["message"].startswith(f"{phase.value} (Why)")


def test_argocd_health_waits_for_the_new_generation() -> None:
    assert argo_health(status_object(Phase.PROMOTED, generation=3, observed=2))["status"] == "Progressing"
    assert argo_health({"metadata": {"generation": 1}})["status"] == "Progressing"


def test_timestamps_are_rfc3339() -> None:
    from specgate.api import iso

    assert iso(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05Z"


@pytest.mark.parametrize(("context_namespace", "expected"), [("team-a", "team-a"), (None, "default")])
def test_specgate_status_defaults_to_the_kube_contexts_namespace(
    tmp_path: Path, context_namespace: str | None, expected: str
) -> None:
    """As kubectl does: the current context's namespace, "default" when it names none (read by the
    kubernetes library from a real kubeconfig file, in a fresh process as the CLI runs)."""
    context: dict[str, str] = {"cluster": "c", "user": "u"}
    if context_namespace:
        context["namespace"] = context_namespace
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": context}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    shown = subprocess.run(
        [sys.executable, "-c", "from specgate import kube; print(kube.current_namespace())"],
        env={"KUBECONFIG": str(path), "PYTHONPATH": str(ROOT / "operator")}, capture_output=True, text=True,
    )  # fmt: skip
    assert shown.stdout.strip() == expected, shown.stderr


FLUX_HEALTH = {
    Phase.PENDING: "InProgress",
    Phase.BASELINE: "InProgress",
    Phase.CANARY: "InProgress",
    Phase.ANALYZING: "InProgress",
    Phase.PROMOTING: "InProgress",
    Phase.ROLLING_BACK: "InProgress",
    Phase.PROMOTED: "Current",
    Phase.PAUSED: "Current",
    Phase.ROLLED_BACK: "Failed",
    Phase.FAILED: "Failed",
}


def flux_health(obj: dict[str, Any]) -> str:
    """Flux's order: inProgress, then failed, then current; none true: still in progress."""
    (check,) = yaml.safe_load((ROOT / "integrations" / "flux" / "kustomization.yaml").read_text())["spec"][
        "healthCheckExprs"
    ]
    environment = celpy.Environment()
    activation = {key: celpy.json_to_cel(value) for key, value in obj.items()}
    for field, result in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        if environment.program(environment.compile(check[field])).evaluate(activation):
            return result
    return "InProgress"


@pytest.mark.parametrize("phase", list(Phase))
def test_flux_health_check_for_every_phase(phase: Phase) -> None:
    """Every phase has its Flux status (a new phase without one fails here), and a status of an
    older generation, or none yet, is in progress whatever its phase."""
    assert flux_health(status_object(phase)) == FLUX_HEALTH[phase]
    assert flux_health(status_object(phase, generation=3, observed=2)) == "InProgress"
    assert flux_health({"metadata": {"generation": 1}, "status": {}}) == "InProgress"


@pytest.mark.parametrize(
    ("phase", "observed", "code"),
    [
        (Phase.PROMOTED, 2, 0),
        (Phase.ROLLED_BACK, 2, 1),
        (Phase.FAILED, 2, 1),
        (Phase.ANALYZING, 2, None),
        (Phase.PAUSED, 2, None),  # a person or onInconclusive: Pause: waits for them, or the timeout
        (Phase.PROMOTED, 1, None),  # the verdict of the last generation, not of this one
    ],
)
def test_status_watch_exits_on_the_current_generations_verdict(
    phase: Phase, observed: int, code: int | None
) -> None:
    assert cli.watch_exit_code(status_object(phase, generation=2, observed=observed)) == code
    assert cli.watch_exit_code({"metadata": {"generation": 1}}) is None  # no status yet


def test_a_prometheus_header_is_name_colon_value_and_a_bad_one_names_the_flag() -> None:
    assert cli._header("X-Scope-OrgID: team-a") == ("X-Scope-OrgID", "team-a")
    with pytest.raises(SystemExit, match=r"--prometheus-header 'X-Scope-OrgID=team-a'.*'Name: value'"):
        cli._header("X-Scope-OrgID=team-a")


# Imports a distribution does not declare: its own and its sibling's packages, and what runs in the
# vLLM image or venv (bench_driver.py in a benchmark Job's container; the lab's tiny_models and
# vllm_launch in the lab's vLLM CPU venv).
VLLM_SIDE = {"vllm", "torch", "transformers", "safetensors", "tokenizers"}
DISTRIBUTIONS = {"yaml": "pyyaml"}  # import names that differ from their distribution's


def _requirement_names(pyproject: Path) -> set[str]:
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~ ;\[]", d)[0].lower().replace("_", "-") for d in dependencies}


def _third_party_imports(package: Path) -> set[str]:
    imported: set[str] = set()
    for module in package.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    return {name for name in imported if name not in sys.stdlib_module_names}


@pytest.mark.parametrize(
    ("package", "pyproject", "own"),
    [
        ("operator/specgate", "pyproject.toml", {"specgate", "vllm"}),
        ("lab/specgate_lab", "lab/pyproject.toml", {"specgate", "specgate_lab"} | VLLM_SIDE),
    ],
)
def test_every_third_party_module_imported_is_a_declared_dependency(
    package: str, pyproject: str, own: set[str]
) -> None:
    """The operator's modules and the lab's: every import outside the standard library is in the
    distribution's pyproject.toml."""
    declared = _requirement_names(ROOT / pyproject)
    undeclared = {
        name
        for name in _third_party_imports(ROOT / package) - own
        if DISTRIBUTIONS.get(name, name).replace("_", "-") not in declared
    }
    assert undeclared == set()


def test_the_operators_wheel_holds_the_operator_only(tmp_path: Path) -> None:
    """What `pip install .` and the image install: the specgate package, and no lab, simulator or
    load generator (they are the lab distribution's, lab/)."""
    # What the Dockerfile copies, into a clean directory: a checkout's build/ would leak stale files.
    source = tmp_path / "src"
    shutil.copytree(
        ROOT / "operator", source / "operator", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("specgate-*.whl")
    modules = {name for name in zipfile.ZipFile(wheel).namelist() if not name.startswith("specgate-")}
    assert modules and all(name.startswith("specgate/") for name in modules), modules
    shipped = {Path(name).stem for name in modules} | {Path(name).parent.name for name in modules}
    assert shipped.isdisjoint({"lab", "specgate_lab", "sim", "loadgen"}), shipped
    assert "specgate/rollout.py" in modules
