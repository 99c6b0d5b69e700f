# PYTHON_ARGCOMPLETE_OK
"""`specgate run | crd | plan | status | pause | resume | retry | abort`."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import argcomplete
import argcomplete.io
import yaml

from specgate import api
from specgate.api import BenchmarkStatus, SpeculativeDeploymentStatus, parse_status


def _run(args: argparse.Namespace) -> int:
    if args.prometheus_url:
        os.environ["SPECGATE_PROMETHEUS_URL"] = args.prometheus_url
    from specgate import prometheus

    os.environ[prometheus.HEADERS_ENV] = json.dumps(dict(_header(h) for h in args.prometheus_header or []))
    if args.prometheus_bearer_token_file:
        os.environ[prometheus.TOKEN_FILE_ENV] = args.prometheus_bearer_token_file
    if args.prometheus_basic_auth_file:
        os.environ[prometheus.BASIC_AUTH_FILE_ENV] = args.prometheus_basic_auth_file
    os.environ["SPECGATE_INTERVAL_SECONDS"] = str(args.interval)
    os.environ["SPECGATE_METRICS_PORT"] = str(args.metrics_port)
    os.environ["SPECGATE_VERBOSE"] = "1" if args.verbose else "0"
    import kopf

    from specgate import handlers, kube  # importing handlers registers them with kopf

    kube.load_config()
    namespaces = args.namespace or [""]
    if kube.may_list_and_watch("apps", "replicasets", namespaces):
        handlers.watch_replica_sets()
    else:
        sys.stderr.write(
            "specgate: may not list and watch ReplicaSets (apps) in "
            f"{', '.join(n or 'the cluster' for n in namespaces)}: a rolling Deployment's raise is not "
            "judged on its ReplicaSets; grant it (the chart's RBAC does)\n"
        )

    # Each object's lines start with [namespace/name], as `kopf run` prints them.
    kopf.configure(verbose=args.verbose, log_prefix=True)
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
    """The verdict of the object's current generation as an exit code; None while it is undecided:
    a status of an older generation or of an older retry (a `kubectl specgate retry` bumps no
    generation), a Promoted object being aborted, or a rollout still running or paused."""
    status, meta = obj.get("status") or {}, obj.get("metadata", {})
    if status.get("observedGeneration") != meta.get("generation"):
        return None
    try:
        requests = api.parse_requests(meta.get("annotations"))
    except api.SpecError:
        return None  # the operator is about to say Failed, naming the annotation
    retry = obj.get("spec", {}).get("rollout", {}).get("retry", 0) + requests.retries
    phase = status.get("phase", "")
    if status.get("observedRetry", retry) < retry or (phase == "Promoted" and requests.abort is not None):
        return None
    return {"Promoted": EXIT_PROMOTED, "RolledBack": EXIT_ROLLED_BACK, "Failed": EXIT_ROLLED_BACK}.get(phase)


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


def _request(args: argparse.Namespace) -> int:
    """pause, resume, retry or abort: an annotation a GitOps sync leaves in place (see api.Requests)."""
    from specgate import kube

    kube.load_config()
    namespace = args.namespace or kube.current_namespace()
    for attempt in range(3):  # the operator writes status often: a 409 means read again
        obj = kube.get_speculative_deployment(namespace, args.name)
        try:
            changes = _request_changes(args.command, obj)
        except ValueError as error:
            sys.stderr.write(f"{args.name}: {error}; nothing was changed\n")
            return 1
        try:
            kube.annotate(namespace, args.name, changes, obj["metadata"]["resourceVersion"])
            break
        except kube.Conflict:
            if attempt == 2:
                raise
    shown = " ".join(f"{k}={v}" if v is not None else f"{k}-" for k, v in changes.items())
    print(f"{api.PLURAL}.{api.GROUP}/{args.name} annotated: {shown}")
    if args.command == "resume" and obj.get("spec", {}).get("rollout", {}).get("paused"):
        sys.stderr.write(
            "warning: spec.rollout.paused is true, so it stays paused until the spec says false\n"
        )
        return 1
    return 0


def _request_changes(command: str, obj: dict[str, Any]) -> dict[str, str | None]:
    """The annotations to set (None: remove) for a command; ValueError when it cannot apply."""
    from specgate import rollout

    if command == "pause":
        return {api.ANNOTATION_PAUSED: "true"}
    if command == "resume":
        return {api.ANNOTATION_PAUSED: None}
    if command == "abort":
        return {api.ANNOTATION_ABORT: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    requests = api.parse_requests(obj["metadata"].get("annotations"))
    status = parse_status(obj.get("status") or {})
    if status.phase == api.Phase.ROLLING_BACK:  # the operator would ignore the count until RolledBack
        raise ValueError("it is RollingBack; retry once it is RolledBack")
    if requests.abort is None and not rollout.retryable(status):
        raise ValueError(
            f"it is {status.phase.value}; retry re-runs a RolledBack or Failed rollout, or one an action paused"
        )
    return {api.ANNOTATION_RETRY: str(requests.retries + 1), api.ANNOTATION_ABORT: None}


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

    lines += [
        f"  {track:<8} {m.figures()}"
        for track, m in (("baseline", status.baseline), ("canary", status.canary))
        if m
    ]
    lines += _benchmark_lines(status.benchmark)
    closeness = status.canary.closeness() if status.canary and status.phase == api.Phase.ANALYZING else None
    if closeness:
        lines.append(f"  test     {closeness}")
    lines += _latency_lines(status.canary)
    if status.guard:
        g = status.guard
        lines.append(
            f"  guard    CUSUM {g.statistic:.1f} of {g.threshold:.1f} (trips there) over {g.windows} "
            f"blocks of {_num(g.window_seconds)}s, alpha={_num(g.alpha)}, at {g.checked_at}"
            + (f"; spread {_num(g.spread)} per token, {g.spread_source}" if g.spread_source else "")
        )
    lines += _route_lines(status)
    if status.mix_drift:
        d = status.mix_drift
        lines.append(f"  drift    sd {d.standard_deviation:g} over {d.timescale_seconds:g}s: {d.source}")
    if status.verdict:
        lines.append(f"  verdict  {status.verdict}: {status.message}")
    if status.recommendation:
        lines.append(
            f"  advice   K={status.recommendation.num_speculative_tokens}: {status.recommendation.message}"
        )
    if status.k_schedule:
        s = status.k_schedule
        lines.append(f"  schedule {json.dumps(s.ranges)} ({s.source.value}: {s.message})")
    return "\n".join(lines) + "\n"


def _latency_lines(canary: api.Measurement | None) -> list[str]:
    """Each latency gate's ratio, interval, tolerance and how far from a verdict, at the canary's last look."""
    if canary is None:
        return []
    judged = (("per-token P99", canary.per_token_latency_gate), ("step stall P99", canary.step_stall_gate))
    return [f"  latency  {name} {gate.line()}" for name, gate in judged if gate is not None]


def _route_lines(status: SpeculativeDeploymentStatus) -> list[str]:
    """The route's weights (router GatewayAPI): what specgate sets, what the Gateways accepted."""
    traffic = status.traffic
    if traffic is None:
        return []

    def split(w: api.RouteWeights | None) -> str:
        return "-" if w is None else f"{w.baseline}/{w.canary}"

    step = (
        f"; alpha passed at the initial weight at {status.initial_step_passed}"
        if status.initial_step_passed
        else ""
    )
    return [
        f"  route    HTTPRoute {traffic.route} baseline/canary: desired {split(traffic.desired)}, "
        f"accepted {split(traffic.actual)}{step}"
    ]


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
    from dataclasses import replace

    from specgate import planning

    k, alpha, batch = args.k, args.alpha, max(args.concurrency, 1)
    cost = planning.CostModel.for_hardware(
        args.accelerator, args.model_size, args.draft, args.draft_size, args.bytes_per_param, args.context
    )
    if args.overhead is not None:  # the engine's extra per draft pass, in plain steps at batch 1
        cost = replace(cost, draft_pass_ms=args.overhead * cost.step(1, 0))
    max_k = max(args.max_k, k)
    conditional = [min(planning.conditional_for_alpha(alpha, k) * args.decay**i, 1.0) for i in range(max_k)]
    if args.decay != 1.0:  # c_0 such that the decaying rates give alpha at this K
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            rates = [min(mid * args.decay**i, 1.0) for i in range(k)]
            lo, hi = (mid, hi) if planning.expected_accepted(rates) / k < alpha else (lo, mid)
        conditional = [min(hi * args.decay**i, 1.0) for i in range(max_k)]
    prefix = args.per_position or planning.prefix_from_conditional(conditional)
    draft = args.draft + (f" {args.draft_size}B" if args.draft == "draft_model" else "")
    print(
        f"alpha={alpha} K={k} concurrency={batch} on {args.accelerator}: {args.model_size}B target "
        f"({args.bytes_per_param:g} bytes a parameter), {draft} drafts, {args.context} tokens of context"
    )
    speedup = planning.expected_tokens_per_step(alpha, k) * cost.step(batch, 0) / cost.step(batch, k)
    even = planning.break_even_alpha_for(cost, k, batch)
    print(
        f"expected speedup: {speedup:.2f}x ({planning.expected_tokens_per_step(alpha, k):.2f} tokens per step, "
        f"a step {cost.step(batch, k) / cost.step(batch, 0):.2f}x a plain one of {cost.step(batch, 0):.1f} ms)"
    )
    print(
        "break-even alpha: " + ("none: speculation loses even at alpha 1" if even is None else f"{even:.3f}")
    )
    advice = planning.recommend_k(prefix, 1.0, cost, batch)
    if advice is not None:
        print(f"best K: {advice.message}")
        for row_k, row_speedup in advice.table:
            print(f"  K={row_k}: {row_speedup:.2f}x")
    print(f"per concurrency (P(positions 0..i accepted): {', '.join(f'{u:.2f}' for u in prefix)}):")
    print(f"  {'concurrency':>11}  {'step K=' + str(k):>9}  {'speedup':>7}  {'break-even alpha':>16}  best K")
    sizes = sorted({1 << i for i in range(args.max_batch.bit_length()) if 1 << i <= args.max_batch} | {batch})
    for b in sizes:
        ratio = cost.step(b, k) / cost.step(b, 0)
        b_even = planning.break_even_alpha_for(cost, k, b)
        best, best_speedup = planning.best_k(cost, b, prefix)
        print(
            f"  {b:>11}  {ratio:>8.2f}x  {planning.expected_tokens_per_step(alpha, k) / ratio:>6.2f}x  "
            f"{'none' if b_even is None else f'{b_even:.3f}':>16}  K={best} ({best_speedup:.2f}x)"
        )
    schedule = planning.k_schedule(cost, prefix, args.max_batch)
    print(
        "schedule (speculative.numSpeculativeTokensPerBatchSize; vLLM num_speculative_tokens_per_batch_size):"
    )
    print("  " + json.dumps([list(r) for r in schedule]))
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
    credentials = run.add_mutually_exclusive_group()  # argparse names both options when both are given
    credentials.add_argument(
        "--prometheus-bearer-token-file", help="send this file's token to Prometheus (read at each reconcile)"
    )
    credentials.add_argument(
        "--prometheus-basic-auth-file", metavar="FILE",
        help="basic auth for Prometheus from this file's line username:password (read at each reconcile)",
    )  # fmt: skip
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
    status.add_argument("name").completer = _object_names  # type: ignore[attr-defined]
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

    for command, text in (
        ("pause", "hold the rollout where it is (annotation specgate.dev/paused)"),
        ("resume", "undo pause: the rollout goes on from the phase it was paused in"),
        ("retry", "re-run a RolledBack or Failed rollout, or one an action paused; clears abort"),
        ("abort", "roll back now and keep serving the baseline until retry"),
    ):
        request = sub.add_parser(command, help=text, description=f"{text}. A GitOps sync does not revert it.")
        request.add_argument("name").completer = _object_names  # type: ignore[attr-defined]
        request.add_argument("-n", "--namespace", default=None, help="default: the kube context's namespace")
        request.set_defaults(func=_request)

    plan = sub.add_parser(
        "plan",
        help="expected speedup, break-even alpha and best K per concurrency, and the K schedule per batch size",
    )
    plan.add_argument("--alpha", type=float, required=True, help="acceptance rate: accepted / draft tokens")
    plan.add_argument("--k", type=int, required=True, help="draft length (numSpeculativeTokens)")
    plan.add_argument(
        "--overhead", type=float, default=None,
        help="the serving engine's extra per draft pass, in plain steps at batch 1 (default: none beyond "
        "the model's own engine term)",
    )  # fmt: skip
    plan.add_argument("--concurrency", type=int, default=1, help="running requests per replica")
    plan.add_argument(
        "--accelerator", default="H100", choices=["H100", "H200", "A100", "L40S"],
        help="GPU whose datasheet bandwidth and BF16 FLOPs price the step (default H100)",
    )  # fmt: skip
    plan.add_argument(
        "--model-size",
        type=float,
        default=8.03,
        help="target parameters in billions (default 8.03, Llama-3.1-8B)",
    )
    plan.add_argument(
        "--bytes-per-param", type=float, default=2.0, help="2 for bf16 weights (default), 1 for FP8"
    )
    plan.add_argument(
        "--draft", default="eagle3", choices=["eagle3", "eagle", "draft_model", "ngram", "suffix"],
        help="what drafts: an EAGLE-3 or EAGLE head, a draft model, or no forward pass (default eagle3)",
    )  # fmt: skip
    plan.add_argument(
        "--draft-size", type=float, default=1.24, help="draft model parameters in billions (default 1.24)"
    )
    plan.add_argument(
        "--context", type=int, default=1024, help="tokens of KV context a request (default 1024)"
    )
    plan.add_argument(
        "--decay", type=float, default=1.0,
        help="per-position acceptance falls by this factor a position (default 1: constant)",
    )  # fmt: skip
    plan.add_argument("--max-k", type=int, default=8, help="longest draft considered (default 8)")
    plan.add_argument(
        "--max-batch", type=int, default=256, help="largest batch of the schedule (default 256)"
    )
    plan.add_argument(
        "--per-position", type=float, nargs="+", help="measured P(positions 0..i accepted) instead of alpha"
    )
    plan.set_defaults(func=_plan)

    crd = sub.add_parser("crd", help="print the CustomResourceDefinition")
    crd.set_defaults(func=_crd)
    return parser


def _object_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """NAME completion: the SpeculativeDeployments of the namespace (-n, or the kube context's)."""
    from specgate import kube

    try:
        kube.load_config()
        names = kube.speculative_deployment_names(parsed_args.namespace or kube.current_namespace())
    except Exception as error:  # no cluster, no kubeconfig: no names, and the reason for --debug
        argcomplete.io.warn(f"specgate: cannot list SpeculativeDeployments: {error}")
        return []
    return [name for name in names if name.startswith(prefix)]


def complete_plugin() -> None:
    """`kubectl_complete-specgate ARGS... WORD`, which kubectl 1.26+ runs to complete
    `kubectl specgate`: one candidate a line, then cobra's directive (4: no file names)."""
    line = " ".join(["specgate", *sys.argv[1:]])
    os.environ.update(_ARGCOMPLETE="1", COMP_LINE=line, COMP_POINT=str(len(line)), _ARGCOMPLETE_IFS="\n")
    out = io.StringIO()
    argcomplete.autocomplete(build_parser(), exit_method=lambda _code: None, output_stream=out)
    candidates = [word.strip() for word in out.getvalue().splitlines() if word.strip()]
    print("\n".join([*candidates, ":4"]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argcomplete.autocomplete(parser)  # `eval "$(register-python-argcomplete specgate)"` in a shell
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
