"""make mutate: mutmut over the core (capacity, gates, rollout, render and prometheus.py's windowing)
against tests/unit, then the kill rate per module and every surviving mutant.

mutmut names a mutant after its file's path and strips only a leading `src/`, while the code imports
`specgate` from `operator/`: so it runs in a copy of the checkout's files (build/mutate/) where
operator/ is src/. Its configuration is pyproject.toml's [tool.mutmut]; its results stay in
build/mutate/mutants/, so a second run goes on with the mutants not judged yet (after a change to a
module, name its mutants to judge them again). `--report` prints the last run's figures;
`-- NAME...` runs only the mutants matching those mutmut names (fnmatch).
Equivalent mutants (no test can tell them apart) are listed in EQUIVALENT with the reason.
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "build" / "mutate"
MUTANTS = STAGE / "mutants" / "src" / "specgate"
# Dotted below specgate: gates is a package, one module per concern.
GATES = ("common", "acceptance", "drift", "guard", "latency", "load")
MODULES = ("capacity", *(f"gates.{m}" for m in GATES), "rollout", "render", "prometheus")
# prometheus.py is mutated only where it turns samples into windows, not where it does HTTP.
WINDOWING = (
    "Series.increases", "Series.values", "Series.mean", "_spans", "_total", "_inside", "scrape_spacing",
    "observed_interval", "acceptance_windows", "histogram", "_mean", "_rate", "_load",
)  # fmt: skip
# mutmut's exit codes: 1 and 3 a test failed (killed), 36 and the SIGXCPU ones a timeout (killed:
# the mutant made the code loop), 0 survived, 5 and 33 survived as no unit test runs the code;
# anything else (not checked, skipped, a crash) was not judged.
# The day-2 property test covers every function of rollout, and its 500 histories take minutes a
# mutant: mutants get 25 (seconds). A mutant only the full 500 would catch shows as a survivor, so
# this can hide no survivor, only add one to check by hand.
FUZZ_HISTORIES = "25"
KILLED = {1, 3, 36, 24, -24, 152, 255}
SURVIVED = {0, 5, 33}
# mutant name -> why no test can kill it (mutmut numbers a function's mutants anew when it changes).
EQUIVALENT: dict[str, str] = {
    "specgate.capacity.x__shrink__mutmut_1": "`target > replicas`: at target == replicas the rest "
    "of _shrink returns min(replicas, max(replicas, ...)) = replicas too",
    "specgate.capacity.x_step_toward__mutmut_39": "`want_c >= canary.replicas`: at equality _grow "
    "returns min(want_c, max(want_c, room)) = want_c, which _shrink returned already",
    "specgate.capacity.x_step_toward__mutmut_50": "`want_b >= baseline.replicas`: as mutant 39, for "
    "the baseline",
    **{
        f"specgate.capacity.x_step_toward__mutmut_{n}": "the baseline's growth computed also where "
        "want_b <= its replicas: _grow then gives at most want_b, and the shrink's b is at least that"
        for n in (53, 65)
    },
    **{
        f"specgate.capacity.x__baseline_kept_above_its_replicas__mutmut_{n}": "computed also where "
        "the baseline's Ready pods are at most its replicas: _shrink then keeps at least the pods "
        "_needed gives, so the max in step_toward is unchanged"
        for n in (2, 9)
    },
    "specgate.render.x_route_state__mutmut_28": "`http_route is not None or existing is None`: "
    "httpRoute and existingRoute exclude each other (api.RULES, a CEL rule), so `or` reads as `and`",
    **{
        f"specgate.rollout.x_failed__mutmut_{n}": "the baseline's replicas 0 -> None or 1 in a decision "
        "with touch_children=False: the handler applies no replica count"
        for n in (69, 77)
    },
    "specgate.rollout.x__benchmark_gates__mutmut_12": "`or` -> `and`: differs only for a completed "
    "Job without completionTime, which Kubernetes always sets (a failed Job takes the failure branch)",
    **{
        f"specgate.rollout.x__benchmark_run__mutmut_{n}": "`... or True`: differs only for a completed "
        "Job without startTime or completionTime, which Kubernetes always sets"
        for n in (64, 67)
    },
    **{
        name: "samples 0 -> None or 1 on an InsufficientData result whose samples nothing reads (its "
        "verdict and message do not use it, the deadline leaves a result without estimate as it is)"
        for name in (
            "specgate.rollout.x__benchmark_gates__mutmut_28",
            "specgate.rollout.x__benchmark_gates__mutmut_36",
            "specgate.rollout.x__insufficient__mutmut_2",
            "specgate.rollout.x__insufficient__mutmut_10",
        )
    },
    **{
        f"specgate.rollout.x__benchmark_figures__mutmut_{n}": "`... or True`: called only right after "
        "the run was stored, so neither the runs nor the run is ever None there"
        for n in (3, 12)
    },
    "specgate.rollout.x__benchmark_figures__mutmut_15": "next() without its default: gateConcurrency "
    "must be one of the concurrency points (api) and parse_report refuses a report missing one",
    "specgate.rollout.x_incumbent_window__mutmut_6": "`or` -> `and`: _restart sets incumbent_since and "
    "incumbent_until together, so one is never None without the other",
    **{
        f"specgate.rollout.x__rolled_back__mutmut_{n}": "the canary's target always None: with a canary "
        "Deployment None and 0 both scale it to 0, without one both create none"
        for n in (2, 6)
    },
    "specgate.rollout.x__analyzing__mutmut_33": "`results = traffic` for `results += traffic`: "
    "results is the empty list there",
    **{
        f"specgate.rollout.x__figures__mutmut_{n}": "the branch for no baseline figures: _figures runs "
        "only from _baseline right after _traffic_baseline stored them"
        for n in (2, 4, 5)
    },
    **{
        f"specgate.gates.latency.x__bracket__mutmut_{n}": "`low or 1.0` / `high or 1.0`: the operator's ranks "
        "(q 0.99, z 1.96, at least one sample) are above 0, so no estimate is 0 or None"
        for n in (31, 33)
    },
    "specgate.gates.latency.x__heavier_tail__mutmut_16": "`break` for the first `continue`: bounds ascend, so "
    "once an edge is skipped as beyond the baseline's last finite one, every later edge is too",
    "specgate.gates.latency.x__bucket_edges__mutmut_24": "`count >= 0`: the ranks passed are above 0, so "
    "`count >= rank` already means count > 0",
    "specgate.gates.drift.x__drift_blocks__mutmut_21": "`and` for `or`: differs only where some windows have "
    "an end and others not; the operator sets end on every window",
    "specgate.gates.drift.x__drift_blocks__mutmut_31": "accepted tokens negated: every block's alpha and the "
    "mean flip sign, and the fit reads only products of centred values",
    "specgate.gates.drift.x_measure_mix_drift__mutmut_42": "`/` for `//` inside int(): equal for the "
    "positive block lengths a history has",
    "specgate.gates.drift.x_measure_mix_drift__mutmut_57": "`<` for `<=` history / 8: a timescale of the "
    "grid equals it only for histories under the hour measure_mix_drift needs",
    **{
        f"specgate.gates.drift.x_measure_mix_drift__mutmut_{n}": "`>=` for `>`: differs only at an exact "
        "float tie of the fitted variance with its bound"
        for n in (131, 133)
    },
    **{
        f"specgate.rollout.xǁ_Stepǁenter__mutmut_{n}": "the branch for entering the current phase: no "
        "handler enters its own phase"
        for n in (8, 9, 10, 11)
    },
    **{
        f"specgate.rollout.x__baseline__mutmut_{n}": "a canary target of None for 0: _replicas reads "
        "`canary_replicas or 0`, and gives None where no canary Deployment exists either way"
        for n in (4, 8)
    },
    **{
        f"specgate.rollout.x__roll_back__mutmut_{n}": "warning=None or left out: both make a Normal Event"
        for n in (20, 24)
    },
    "specgate.rollout.x__roll_back__mutmut_11": "canary target None for 0: differs only without a "
    "canary Deployment, where neither runs a pod, and the next _rolling_back asks for 0",
    "specgate.rollout.x_templates_to_wait__mutmut_3": "max_surge: not read on this path (roll_keeps_floor, "
    "may_roll and _side use replicas and maxUnavailable)",
    "specgate.rollout.x__baseline_replicas_beside_canary__mutmut_10": "the dropped 0 of max(0, rest): "
    "the API keeps canaryReplicas below max(replicas, 2), so rest is never negative",
    "specgate.rollout.x__traffic_gates__mutmut_1": "latency's default: its one caller passes latency",
    "specgate.rollout.x__initial_weight__mutmut_7": "the phase check: outside Canary and Analyzing the "
    "canary's target is 0 (Baseline, a rollback), its pods are held (Paused), or the baseline shrinks "
    "below the floor's share (Promoting, Promoted), so traffic.capped lowers no weight",
    **{
        f"specgate.rollout.x__restart__mutmut_{n}": "phase_since or metrics_unavailable_since left or "
        "None: pending.enter(BASELINE) sets both again at once"
        for n in (15, 23, 30)
    },
    "specgate.render.x_benchmark_job_name__mutmut_6": "rstrip('XX-.XX') strips '-' and '.' as "
    "rstrip('-.') does, and a resource name has no 'X' (lowercase DNS)",
    **{
        f"specgate.render.x_template_hash__mutmut_{n}": "the spec dumped in python mode, not json: it "
        "holds only str, int, float, bool, str enums, lists and dicts, which both modes give alike"
        for n in (17, 20, 23, 24)
    },
    **{
        name: "`route.get('spec', None)` for `route.get('spec', {})`: the HTTPRoute CRD requires spec, "
        "so the default is never read"
        for name in (
            "specgate.render.x_rule_index__mutmut_5",
            "specgate.render.x_rule_index__mutmut_7",
            "specgate.render.x__rule_refs__mutmut_5",
            "specgate.render.x__rule_refs__mutmut_7",
        )
    },
}


# zip's strict only checks lengths: those this code zips are equal by construction (strict=True
# asserts it), and strict=None or left out is not strict, as strict=False.
ZIP_STRICT = re.compile(r",\s*strict=(True|False|None)|,\s*(?=\))")
ZIP_STRICT_REASON = "only zip's strict changes, over sequences of equal length by construction"


def why_equivalent(mutant: str) -> str | None:
    """Why no test can kill `mutant` (EQUIVALENT, or a change of zip's strict alone), else None."""
    if mutant in EQUIVALENT:
        return EQUIVALENT[mutant]
    removed, added = changed_lines(mutant)
    stripped = [ZIP_STRICT.sub("", line) for line in removed], [ZIP_STRICT.sub("", line) for line in added]
    zips = any("zip(" in line for line in removed)
    return ZIP_STRICT_REASON if zips and removed and stripped[0] == stripped[1] else None


def _path(module: str, suffix: str) -> Path:
    """mutmut's copy of a dotted module below specgate (`gates.latency`), or its results (.py.meta)."""
    return MUTANTS / f"{module.replace('.', '/')}{suffix}"


@functools.cache
def functions(module: str) -> dict[str, list[str]]:
    """The lines of every function in mutmut's copy of `module` (its mutants and originals), by name."""
    source = _path(module, ".py").read_text()
    lines = source.splitlines()
    nodes = (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return {n.name: lines[n.lineno : n.end_lineno] for n in nodes}


def changed_lines(mutant: str) -> tuple[list[str], list[str]]:
    """(the original's lines the mutant removes, the lines it adds), below the def line."""
    module, name = mutant.split(".", 1)[1].rsplit(".", 1)
    table = functions(module)
    original, mutated = table[name.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"], table[name]
    blocks = difflib.SequenceMatcher(None, original, mutated, autojunk=False).get_opcodes()
    changed = [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in blocks if tag != "equal"]
    return [line for i1, i2, _, _ in changed for line in original[i1:i2]], [
        line for _, _, j1, j2 in changed for line in mutated[j1:j2]
    ]


def function_of(mutant: str) -> str:
    """`specgate.prometheus.xǁSeriesǁmean__mutmut_3` -> `Series.mean`."""
    name = mutant.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[1]
    return name.removeprefix("x_").removeprefix("xǁ").replace("ǁ", ".")


def patterns() -> list[str]:
    """mutmut's mutant-name filters for the code under test."""
    core = [f"specgate.{module}.*" for module in MODULES if module != "prometheus"]
    windowing = [
        f"specgate.prometheus.x{'ǁ' + name.replace('.', 'ǁ') if '.' in name else '_' + name}__mutmut_*"
        for name in WINDOWING
    ]
    return core + windowing


def results(module: str) -> dict[str, int | None]:
    meta = _path(module, ".py.meta")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    if module == "prometheus":
        codes = {name: code for name, code in codes.items() if function_of(name) in WINDOWING}
    return codes


def report() -> int:
    """Print each module's kill rate and its survivors; the number of survivors not marked equivalent."""
    unexplained = 0
    for module in MODULES:
        codes = results(module)
        judged = {name: code for name, code in codes.items() if code in KILLED | SURVIVED}
        if not judged:
            print(f"{module}: not run")
            continue
        killed = sum(code in KILLED for code in judged.values())
        survivors = sorted(name for name, code in judged.items() if code in SURVIVED)
        reasons = {name: why_equivalent(name) for name in survivors}
        equivalent = [name for name in survivors if reasons[name]]
        rate = (killed + len(equivalent)) / len(judged)
        others = Counter(code for code in codes.values() if code not in KILLED | SURVIVED)
        print(f"{module}: {rate:.1%} killed or equivalent ({killed} killed, {len(equivalent)} equivalent, "
              f"{len(survivors) - len(equivalent)} survived of {len(judged)}; not judged: {dict(others)})")  # fmt: skip
        for name in survivors:
            print(f"  {'equivalent' if reasons[name] else 'SURVIVED'}: {name}  {reasons[name] or ''}")
        unexplained += len(survivors) - len(equivalent)
    print("show one: mutmut show NAME")
    return unexplained


def pending() -> list[str]:
    """The mutants of patterns() that have no result yet: mutmut reruns every mutant named on its
    command line, judged or not, so a second run names only these (all patterns on a first run)."""
    names = [name for module in MODULES for name, code in results(module).items() if code is None]
    have_results = any(_path(module, ".py.meta").exists() for module in MODULES)
    return names if have_results else patterns()


def stage() -> None:
    """The checkout's tracked files as they are now into STAGE, operator/ as src/."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True)
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = STAGE / ("src" + name.removeprefix("operator") if name.startswith("operator/") else name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def main() -> int:
    args = sys.argv[1:]
    if args != ["--report"]:
        stage()
        mutmut = Path(sys.executable).with_name("mutmut")
        names = args[1:] if args[:1] == ["--"] else pending()
        if names:
            subprocess.run(
                [str(mutmut), "run", *names],
                cwd=STAGE,
                check=False,
                env={
                    **os.environ,
                    "SPECGATE_FUZZ_HISTORIES": os.environ.get("SPECGATE_FUZZ_HISTORIES", FUZZ_HISTORIES),
                },
            )
    return 1 if report() else 0


if __name__ == "__main__":
    sys.exit(main())
