"""`python -m specgate_lab.sim MODEL [vllm serve flags]`: see the package docstring."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from itertools import pairwise

from aiohttp import web

from specgate_lab.sim.metrics import ITL_BUCKETS, EngineMetrics
from specgate_lab.sim.model import PROFILES, Knobs, Speculation, parse_script
from specgate_lab.sim.server import SimEngine, loading_forever_app, make_app


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specgate_lab.sim", description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--speculative-config")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--custom-histogram-buckets", type=custom_buckets, default=None)
    args, _ignored = parser.parse_known_args(argv)  # other vLLM flags do not change the model
    return args


def custom_buckets(value: str) -> dict[str, list[float]]:
    """vLLM 0.32's --custom-histogram-buckets: a JSON object of bucket family to ascending bounds.
    The simulator exports only the inter_token_latency family's (its ITL and per-token
    histograms); other families are accepted and keep their buckets."""
    try:
        families = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--custom-histogram-buckets: not JSON ({exc})") from exc
    if not isinstance(families, dict):
        raise argparse.ArgumentTypeError(
            '--custom-histogram-buckets: a JSON object, e.g. {"inter_token_latency": [...]}'
        )
    for family, bounds in families.items():
        numbers = isinstance(bounds, list) and bounds and all(isinstance(b, int | float) for b in bounds)
        if not numbers or any(b <= a for a, b in pairwise(bounds)):
            raise argparse.ArgumentTypeError(
                f"--custom-histogram-buckets: {family!r} needs a non-empty list of strictly ascending numbers"
            )
    return {family: [float(b) for b in bounds] for family, bounds in families.items()}


def knobs_from_env(env: Mapping[str, str], max_num_seqs: int) -> Knobs:
    def number(name: str, default: float | None) -> float | None:
        value = env.get(f"SPECGATE_SIM_{name}")
        return float(value) if value else default

    profile = env.get("SPECGATE_SIM_PROFILE", "chat")
    if profile not in PROFILES:
        raise SystemExit(f"SPECGATE_SIM_PROFILE={profile!r}: choose one of {', '.join(PROFILES)}")
    base = Knobs()
    return Knobs(
        profile=profile,
        alpha=number("ALPHA", None),
        step_ms=number("STEP_MS", base.step_ms) or base.step_ms,
        token_ms=number("TOKEN_MS", base.token_ms) or base.token_ms,
        draft_pass_ms=number("DRAFT_PASS_MS", None),
        max_num_seqs=max_num_seqs,
        seed=int(env.get("SPECGATE_SIM_SEED", "0")),
    )


def speculation(config_json: str | None) -> Speculation | None:
    if not config_json:
        return None
    config = json.loads(config_json)
    return Speculation(method=str(config["method"]), k=int(config.get("num_speculative_tokens", 1)))


def itl_buckets(args: argparse.Namespace) -> tuple[float, ...]:
    """The inter_token_latency family's buckets: the flag's, else vLLM's defaults."""
    custom = (args.custom_histogram_buckets or {}).get("inter_token_latency")
    return tuple(custom) if custom else ITL_BUCKETS


def _fault(name: str, args: argparse.Namespace) -> str | None:
    """SPECGATE_SIM_<name> when it applies to this engine: "startup" always, "speculative" only
    with a --speculative-config (the canary's engine), "speculative-if:<path>" like speculative but
    only while the file exists (a canary that starts crash-looping after its promotion)."""
    when = os.environ.get(f"SPECGATE_SIM_{name}", "")
    kind, _, path = when.partition("-if:")
    applies = kind == "startup" or (kind == "speculative" and bool(args.speculative_config))
    return when if applies and (not path or os.path.exists(path)) else None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if exit_when := _fault("EXIT", args):
        raise SystemExit(f"simulated engine failure at startup (SPECGATE_SIM_EXIT={exit_when})")
    if _fault("STUCK", args):
        web.run_app(loading_forever_app(), host=args.host, port=args.port, print=None)
        return
    spec = speculation(args.speculative_config)
    engine = SimEngine(
        served_name=(args.served_model_name or [args.model])[0],
        knobs=knobs_from_env(os.environ, args.max_num_seqs),
        spec=spec,
        script=parse_script(os.environ.get("SPECGATE_SIM_SCRIPT", "")),
        metrics=EngineMetrics.create(speculative=spec is not None, itl_buckets=itl_buckets(args)),
    )
    web.run_app(make_app(engine), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
