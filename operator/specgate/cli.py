"""`specgate run | crd | plan | status`."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import yaml

from specgate.api import BenchmarkStatus, Measurement, SpeculativeDeploymentStatus, parse_status


def _run(args: argparse.Namespace) -> int:
    if args.prometheus_url:
        os.environ["SPECGATE_PROMETHEUS_URL"] = args.prometheus_url
    from specgate import prometheus

    os.environ[prometheus.HEADERS_ENV] = json.dumps(dict(_header(h) for h in args.prometheus_header or []))
    if args.prometheus_bearer_token_file:
        os.environ[prometheus.TOKEN_FILE_ENV] = args.prometheus_bearer_token_file
    os.environ["SPECGATE_INTERVAL_SECONDS"] = str(args.interval)
    os.environ["SPECGATE_METRICS_PORT"] = str(args.metrics_port)
    os.environ["SPECGATE_VERBOSE"] = "1" if args.verbose else "0"
    import kopf

    import specgate.handlers  # noqa: F401  (registers the handlers with kopf)

    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or [],
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=_priority(args),
        liveness_endpoint=args.liveness,
    )
    return 0


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise SystemExit(
            f"--prometheus-header {text!r}: write it as 'Name: value' (e.g. 'X-Scope-OrgID: team-a')"
        )
    return name.strip(), value.strip()


def _priority(args: argparse.Namespace) -> int | None:
    """With peering, the live replica of the highest priority acts and the others stand by.

    Replicas of one Deployment share their arguments, so without --priority each draws its own at
    random: kopf freezes every replica when two share a priority."""
    if args.priority is not None or args.peering is None:
        return args.priority  # type: ignore[no-any-return]
    return random.SystemRandom().randint(1, 2**31 - 1)


def _crd(_: argparse.Namespace) -> int:
    from specgate.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


# `specgate status --watch` exit codes, for pipelines that wait on a rollout's verdict.
EXIT_PROMOTED, EXIT_ROLLED_BACK, EXIT_TIMEOUT = 0, 1, 2


def watch_exit_code(obj: dict[str, Any]) -> int | None:
    """The verdict of the object's current generation as an exit code; None while it is undecided
    (a status of an older generation, or a rollout still running or paused)."""
    status = obj.get("status") or {}
    if status.get("observedGeneration") != obj.get("metadata", {}).get("generation"):
        return None
    return {"Promoted": EXIT_PROMOTED, "RolledBack": EXIT_ROLLED_BACK, "Failed": EXIT_ROLLED_BACK}.get(
        status.get("phase", "")
    )


def _status(args: argparse.Namespace) -> int:
    from specgate import kube

    kube.load_config()
    namespace = args.namespace or kube.current_namespace()
    deadline = time.monotonic() + args.timeout if args.timeout else math.inf
    shown = None
    while True:
        obj = kube.get_speculative_deployment(namespace, args.name)
        text = _format(args.name, obj, args.output)
        if text != shown:
            sys.stdout.write(text)
            sys.stdout.flush()
            shown = text
        if not args.watch:
            return 0
        code = watch_exit_code(obj)
        if code is not None:
            return code
        if time.monotonic() >= deadline:
            sys.stderr.write(f"{args.name}: no verdict within {args.timeout:g}s\n")
            return EXIT_TIMEOUT
        time.sleep(min(args.interval, max(deadline - time.monotonic(), 0)))


def _format(name: str, obj: dict[str, Any], output: str) -> str:
    status = obj.get("status") or {}
    if output == "json":
        return json.dumps(status, indent=2) + "\n"
    if output == "yaml":
        return yaml.safe_dump(status, sort_keys=False)
    return render_timeline(name, parse_status(status))


def render_timeline(name: str, status: SpeculativeDeploymentStatus) -> str:
    """A readable story of one rollout: phase changes with figures, then where it stands."""
    lines = [f"{name}: {status.phase.value} ({status.reason or '-'})"]
    for entry in status.history:
        lines.append(f"  {entry.time}  {entry.phase.value:<12} {entry.reason}: {entry.message}")

    def figures(track: str, m: Measurement | None) -> None:
        if m is not None:
            alpha = "" if m.alpha is None else f" alpha={m.alpha:.3f} [{m.alpha_lower}, {m.alpha_upper}]"
            lines.append(
                f"  {track:<8} p99_itl_ms={m.p99_itl_ms} p99_per_token_ms={m.p99_per_token_latency_ms} "
                f"per_token_ms={m.per_token_latency_ms} tok/s={m.output_tokens_per_second} "
                f"req/s/pod={m.requests_per_second_per_pod} running/pod={m.running_per_pod}{alpha}"
            )

    figures("baseline", status.baseline)
    figures("canary", status.canary)
    lines += _benchmark_lines(status.benchmark)
    if status.guard:
        g = status.guard
        lines.append(
            f"  guard    CUSUM {g.statistic:.1f} of {g.threshold:.1f} (trips there) over {g.windows} "
            f"windows of {_num(g.window_seconds)}s, alpha={_num(g.alpha)}, at {g.checked_at}"
        )
    if status.verdict:
        lines.append(f"  verdict  {status.verdict}: {status.message}")
    if status.recommendation:
        lines.append(
            f"  advice   K={status.recommendation.num_speculative_tokens}: {status.recommendation.message}"
        )
    return "\n".join(lines) + "\n"


def _benchmark_lines(bench: BenchmarkStatus | None) -> list[str]:
    """Baseline against canary per concurrency point, then where speculation stops paying."""
    if bench is None or not bench.points:
        return []
    lines = [
        "  benchmark  concurrency  p99_tpot_ms base/canary  p99_itl_ms base/canary  tok/s base/canary  "
        "speedup  verdict"
    ]
    for p in bench.points:
        gate = " (gate)" if p.concurrency == bench.gate_concurrency else ""
        lines.append(
            f"  {p.concurrency:>22}  {_num(p.baseline_p99_tpot_ms)}/{_num(p.canary_p99_tpot_ms)}  "
            f"{_num(p.baseline_p99_itl_ms)}/{_num(p.canary_p99_itl_ms)}  "
            f"{_num(p.baseline_output_throughput)}/{_num(p.canary_output_throughput)}  "
            f"{_num(p.speedup)}  {p.verdict}{gate}"
        )
    lines.append(
        f"  break-even concurrency {bench.break_even_concurrency}; alpha {bench.alpha} "
        f"(benchmark {bench.benchmark_alpha}, Prometheus {bench.prometheus_alpha})"
    )
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.5g}"


def _plan(args: argparse.Namespace) -> int:
    from specgate import planning

    k, alpha, overhead, batch = args.k, args.alpha, args.overhead, args.concurrency
    speedup = planning.expected_speedup(alpha, k, overhead, batch)
    even = planning.break_even_alpha(k, overhead, batch)
    print(f"alpha={alpha} K={k} overhead={overhead} concurrency={batch}")
    print(
        f"expected speedup: {speedup:.2f}x ({planning.expected_tokens_per_step(alpha, k):.2f} tokens per step)"
    )
    print(
        "break-even alpha: " + ("none: speculation loses even at alpha 1" if even is None else f"{even:.3f}")
    )
    c = planning.conditional_for_alpha(alpha, k)
    per_position = args.per_position or [c ** (i + 1) for i in range(k)]
    advice = planning.recommend_k(per_position, 1.0, planning.CostModel.from_overhead(overhead), batch)
    if advice is not None:
        print(f"best K: {advice.message}")
        for row_k, row_speedup in advice.table:
            print(f"  K={row_k}: {row_speedup:.2f}x")
    return 0


def build_parser() -> argparse.ArgumentParser:
    # Installed twice: as `specgate`, and as `kubectl-specgate`, which kubectl runs as `kubectl specgate`.
    invoked_as_plugin = os.path.basename(sys.argv[0]) == "kubectl-specgate"
    parser = argparse.ArgumentParser(
        prog="kubectl specgate" if invoked_as_plugin else "specgate", description=__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator")
    run.add_argument("-n", "--namespace", action="append", help="watch this namespace (repeat); default all")
    run.add_argument(
        "--prometheus-url",
        default=os.environ.get("SPECGATE_PROMETHEUS_URL"),
        help="default Prometheus URL for objects that set none",
    )
    run.add_argument(
        "--prometheus-header", action="append", metavar="'NAME: VALUE'",
        help="a header on every Prometheus query (repeat), e.g. 'X-Scope-OrgID: team-a'",
    )  # fmt: skip
    run.add_argument(
        "--prometheus-bearer-token-file", help="send this file's token to Prometheus (read at each reconcile)"
    )
    run.add_argument("--interval", type=float, default=10.0, help="seconds between reconciles of an object")
    run.add_argument(
        "--peering",
        help="kopf peering object (KopfPeering per watched namespace, or ClusterKopfPeering): "
        "run several replicas, one acting and the others standing by",
    )
    run.add_argument(
        "--priority", type=int, help="peering priority; the highest live one acts (default: random)"
    )
    run.add_argument("--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument(
        "--metrics-port", type=int, default=8080, help="port of the operator's /metrics (0: off)"
    )
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=_run)

    status = sub.add_parser("status", help="the timeline of one SpeculativeDeployment")
    status.add_argument("name")
    status.add_argument("-n", "--namespace", default=None, help="default: the kube context's namespace")
    status.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    status.add_argument(
        "-w", "--watch", action="store_true",
        help="print changes until the verdict; exit 0 Promoted, 1 RolledBack or Failed, 2 on --timeout",
    )  # fmt: skip
    status.add_argument(
        "--timeout", type=float, default=0, help="with --watch: seconds to wait (0: no limit)"
    )
    status.add_argument("--interval", type=float, default=5, help="with --watch: seconds between reads")
    status.set_defaults(func=_status)

    plan = sub.add_parser("plan", help="expected speedup, break-even alpha and best K")
    plan.add_argument("--alpha", type=float, required=True, help="acceptance rate: accepted / draft tokens")
    plan.add_argument("--k", type=int, required=True, help="draft length (numSpeculativeTokens)")
    plan.add_argument("--overhead", type=float, default=0.05, help="cost of one draft pass in target steps")
    plan.add_argument("--concurrency", type=int, default=1, help="running requests per replica")
    plan.add_argument(
        "--per-position", type=float, nargs="+", help="measured P(positions 0..i accepted) instead of alpha"
    )
    plan.set_defaults(func=_plan)

    crd = sub.add_parser("crd", help="print the CustomResourceDefinition")
    crd.set_defaults(func=_crd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
