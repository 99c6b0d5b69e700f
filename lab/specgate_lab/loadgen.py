"""A small load generator for OpenAI-compatible servers (vLLM or the simulator), loopback only.

Fixed concurrency (N clients in a loop) or a fixed request rate (Poisson arrivals), streaming
completions with prompts from a workload profile, bounded by a duration and a request count. It
measures what a streaming user sees: time to first token and the gaps between streamed chunks.

    python -m specgate_lab.loadgen --url http://127.0.0.1:18080/svc/NS/NAME --model tiny \
        --concurrency 4 --duration 60 --profile chat
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

import aiohttp

PROMPTS: dict[str, tuple[str, ...]] = {
    "chat": (
        "the user asks how to serve a model fast",
        "explain the tail latency of a request queue",
        "what does a draft model do for the target",
    ),
    "code": (
        "def build(cluster): return deploy(node, gpu)",
        "function run test data list map key value return error",
        "for key value in map return list build run test",
    ),
    "translation": (
        "translate: the cache is fast and the queue is slow",
        "translate: good day more time less memory",
    ),
    "repetitive": (
        "repeat after me: the model the model the model the model",
        "the target verify accept the target verify accept the target verify accept",
    ),
}
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
ERROR_BACKOFF_SECONDS = 0.5


@dataclass(frozen=True)
class Completion:
    """One request served whole, in time.monotonic() seconds."""

    start: float
    first_chunk: float
    end: float
    chunks: int  # streamed chunks: a proxy or a speculative step may send several tokens in one
    tokens: int  # tokens asked for, all of them served (ignore_eos)


@dataclass
class LoadResult:
    """Filled in as the load runs, so a caller holding it can follow progress."""

    requests: int = 0
    errors: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # errors by what failed, for a test's message
    output_chunks: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    completed: list[Completion] = field(default_factory=list)
    elapsed: float = 0.0

    def fail(self, why: str) -> None:
        self.errors += 1
        self.failures[why] += 1

    def percentile(self, values: list[float], q: float) -> float | None:
        if not values:
            return None
        ordered = sorted(values)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)]

    def summary(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.1f}"

        mean_itl = statistics.fmean(self.itl) if self.itl else None
        return (
            f"requests={self.requests} errors={self.errors} elapsed_s={self.elapsed:.1f} "
            f"req_per_s={self.requests / max(self.elapsed, 1e-9):.2f} "
            f"ttft_ms p50={ms(self.percentile(self.ttft, 0.5))} p99={ms(self.percentile(self.ttft, 0.99))} "
            f"itl_ms mean={ms(mean_itl)} p50={ms(self.percentile(self.itl, 0.5))} "
            f"p99={ms(self.percentile(self.itl, 0.99))}"
        )


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if host not in LOOPBACK:
        raise ValueError(f"{url}: the load generator only sends traffic to loopback addresses")


def chunk_text(payload: str) -> str | None:
    """The text of one streamed completion chunk; None for an error chunk or malformed JSON."""
    try:
        choices = json.loads(payload).get("choices")
        return str(choices[0].get("text") or "") if choices else None
    except (ValueError, AttributeError, TypeError, IndexError, KeyError):
        return None


async def one_request(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int, result: LoadResult
) -> None:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    start = time.monotonic()
    first: float | None = None
    last: float | None = None
    chunks = 0
    try:
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                result.fail(f"HTTP {resp.status}")
                await resp.read()
                return
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                text = chunk_text(line[6:])
                if text is None:  # an error chunk mid-stream (e.g. the engine went away)
                    result.fail("an error chunk")
                    return
                if not text:
                    continue
                now = time.monotonic()
                if last is None:
                    result.ttft.append(now - start)
                    first = now
                else:
                    result.itl.append(now - last)
                last = now
                chunks += 1
                result.output_chunks += 1
        result.requests += 1
        if first is not None and last is not None:
            result.completed.append(Completion(start, first, last, chunks, max_tokens))
    except (aiohttp.ClientError, TimeoutError) as error:
        result.fail(type(error).__name__ if chunks == 0 else f"{type(error).__name__} after {chunks} chunks")


async def run_load(
    url: str,
    model: str,
    *,
    concurrency: int = 4,
    rate: float | None = None,
    duration: float = 30.0,
    max_requests: int = 100_000,
    profile: str = "chat",
    max_tokens: int | Callable[[], int] = 64,
    seed: int = 0,
    result: LoadResult | None = None,
) -> LoadResult:
    """Drive load until duration or max_requests; returns client-side measurements (into `result`
    where given, as they come). A callable max_tokens is read as each request starts."""
    check_loopback(url)
    prompts = PROMPTS[profile]
    rng = random.Random(seed)
    result = LoadResult() if result is None else result
    tokens = max_tokens if callable(max_tokens) else lambda: max_tokens
    deadline = time.monotonic() + duration
    started = time.monotonic()
    budget = iter(range(max_requests))
    timeout = aiohttp.ClientTimeout(total=max(duration, 1) + 120)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def client() -> None:
            while time.monotonic() < deadline and next(budget, None) is not None:
                errors = result.errors
                await one_request(session, url, model, rng.choice(prompts), tokens(), result)
                if result.errors > errors:  # e.g. no Ready endpoint yet: do not spin
                    await asyncio.sleep(ERROR_BACKOFF_SECONDS)

        if rate is None:
            await asyncio.gather(*(client() for _ in range(concurrency)))
        else:
            tasks = []
            while time.monotonic() < deadline and next(budget, None) is not None:
                tasks.append(
                    asyncio.create_task(
                        one_request(session, url, model, rng.choice(prompts), tokens(), result)
                    )
                )
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)
    result.elapsed = time.monotonic() - started
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="specgate_lab.loadgen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="base URL (without /v1)")
    parser.add_argument("--model", required=True)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, default=4)
    mode.add_argument("--rate", type=float, help="requests per second (Poisson)")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--profile", choices=sorted(PROMPTS), default="chat")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    result = asyncio.run(
        run_load(
            args.url,
            args.model,
            concurrency=args.concurrency,
            rate=args.rate,
            duration=args.duration,
            max_requests=args.max_requests,
            profile=args.profile,
            max_tokens=args.max_tokens,
        )
    )
    print(result.summary())
    sys.exit(1 if result.requests == 0 else 0)


if __name__ == "__main__":
    main()
