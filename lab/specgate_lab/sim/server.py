"""An OpenAI-compatible server that behaves like a vLLM engine, in real time.

One asyncio task is the engine loop: each step takes every running request, drafts and verifies
(when speculation is on), sleeps for the step's modelled cost, and emits 1 + accepted tokens per
request, recording metrics exactly where vLLM records them (one ITL sample per step per request).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import generate_latest

from specgate_lab.sim.metrics import EngineMetrics
from specgate_lab.sim.model import (
    Knobs,
    ScriptStep,
    Speculation,
    conditional_rates,
    knobs_at,
    sample_accepted,
    step_seconds,
)

WORDS = [
    "the",
    "model",
    "drafts",
    "tokens",
    "and",
    "the",
    "target",
    "verifies",
    "them",
    "in",
    "one",
    "step",
    "so",
    "accepted",
    "tokens",
    "come",
    "for",
    "free",
    "while",
    "rejected",
    "ones",
    "cost",
    "a",
    "little",
    "time",
    "on",
    "the",
    "accelerator",
]


@dataclass
class Request:
    prompt_tokens: int
    max_tokens: int
    arrived: float
    queue: asyncio.Queue[list[str] | None] = field(default_factory=asyncio.Queue)
    generated: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    prefilled: bool = False


@dataclass
class SimEngine:
    served_name: str
    knobs: Knobs
    spec: Speculation | None
    script: list[ScriptStep]
    metrics: EngineMetrics
    started: float = field(default_factory=time.monotonic)
    running: list[Request] = field(default_factory=list)
    waiting: list[Request] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.knobs.seed)
        self.labels = {"model_name": self.served_name, "engine": "0"}
        self._create_series()

    def _create_series(self) -> None:
        """Every series exists at 0 from the start, as in vLLM, so increase() sees the first events."""
        m = self.metrics
        for metric in (
            m.running,
            m.waiting,
            m.kv_cache,
            m.prompt_tokens,
            m.generation_tokens,
            m.ttft,
            m.itl,
            m.per_token,
            m.e2e,
            m.iteration_tokens,
        ):
            metric.labels(**self.labels)
        for reason in ("stop", "length", "abort", "error", "repetition"):
            m.request_success.labels(**self.labels, finished_reason=reason)
        if m.spec is not None and self.spec is not None:
            for counter in (m.spec.drafts, m.spec.draft_tokens, m.spec.accepted_tokens):
                counter.labels(**self.labels)
            for position in range(self.spec.k):
                m.spec.accepted_per_pos.labels(**self.labels, position=str(position))

    def abort(self, request: Request) -> None:
        for queue in (self.running, self.waiting):
            if request in queue:
                queue.remove(request)

    def submit(self, request: Request) -> None:
        self.waiting.append(request)
        self.wakeup.set()

    async def loop(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self.wakeup.clear()
                self._set_gauges()
                await self.wakeup.wait()
            await self._step()

    async def _step(self) -> None:
        knobs = knobs_at(self.knobs, self.script, time.monotonic() - self.started, os.path.exists)
        admitted = self.waiting[: max(knobs.max_num_seqs - len(self.running), 0)]
        self.waiting = self.waiting[len(admitted) :]
        self.running += admitted
        self._set_gauges()
        prefill = sum(r.prompt_tokens for r in admitted)
        await asyncio.sleep(step_seconds(knobs, self.spec, len(self.running), prefill))
        now = time.monotonic()
        rates = conditional_rates(knobs, self.spec) if self.spec else []
        stepped = list(self.running)
        emitted = sum(self._advance(request, rates, now) for request in stepped)
        if stepped:  # vLLM observes each step that had outputs: its prompt and generated tokens
            self.metrics.iteration_tokens.labels(**self.labels).observe(prefill + emitted)

    def _advance(self, request: Request, rates: list[float], now: float) -> int:
        """Emit this step's tokens for `request`; how many."""
        m = self.metrics
        if not request.prefilled:  # the prefill step yields the first token
            request.prefilled = True
            emitted = 1
            request.first_token_at = now
            m.ttft.labels(**self.labels).observe(now - request.arrived)
            m.prompt_tokens.labels(**self.labels).inc(request.prompt_tokens)
        else:
            accepted = self._draft(rates)
            emitted = 1 + accepted
            assert request.last_token_at is not None
            m.itl.labels(**self.labels).observe(now - request.last_token_at)
        emitted = min(emitted, request.max_tokens - request.generated)
        request.generated += emitted
        request.last_token_at = now
        m.generation_tokens.labels(**self.labels).inc(emitted)
        request.queue.put_nowait([self.rng.choice(WORDS) for _ in range(emitted)])
        if request.generated >= request.max_tokens:
            self._finish(request, now)
        return emitted

    def _draft(self, rates: list[float]) -> int:
        spec = self.metrics.spec
        if spec is None or not rates:
            return 0
        accepted = sample_accepted(rates, self.rng)
        spec.drafts.labels(**self.labels).inc()
        spec.draft_tokens.labels(**self.labels).inc(len(rates))
        spec.accepted_tokens.labels(**self.labels).inc(accepted)
        for position in range(len(rates)):
            # Touch every position so the series exist from the first draft, as in vLLM.
            spec.accepted_per_pos.labels(**self.labels, position=str(position)).inc(
                1 if position < accepted else 0
            )
        return accepted

    def _finish(self, request: Request, now: float) -> None:
        m = self.metrics
        self.running.remove(request)
        m.e2e.labels(**self.labels).observe(now - request.arrived)
        assert request.first_token_at is not None
        if request.generated > 1:
            decode = now - request.first_token_at
            m.per_token.labels(**self.labels).observe(decode / (request.generated - 1))
        m.request_success.labels(**self.labels, finished_reason="length").inc()
        request.queue.put_nowait(None)

    def _set_gauges(self) -> None:
        m = self.metrics
        m.running.labels(**self.labels).set(len(self.running))
        m.waiting.labels(**self.labels).set(len(self.waiting))
        m.kv_cache.labels(**self.labels).set(min(len(self.running) / self.knobs.max_num_seqs, 1.0))


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
    else:
        prompt = body.get("prompt", "")
        text = " ".join(prompt) if isinstance(prompt, list) else str(prompt)
    return max(len(text.split()), 1)


def _chunk(kind: str, rid: str, model: str, text: str | None, finish: str | None) -> dict[str, Any]:
    if kind == "chat":
        delta = {"content": text} if text is not None else {}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
        }
    choice = {"index": 0, "text": text or "", "finish_reason": finish}
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


ENGINE_LOOP = web.AppKey("engine_loop", asyncio.Task[None])


def loading_forever_app() -> web.Application:
    """An engine stuck loading: vLLM opens its socket before the engine is up and every request,
    /health included, hangs meanwhile, so the pod never becomes Ready."""

    async def hang(_: web.Request) -> web.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable: the event is never set")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    return app


def make_app(engine: SimEngine) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": engine.served_name, "object": "model", "owned_by": "specgate-sim"}],
            }
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(engine.metrics.registry), content_type="text/plain", charset="utf-8"
        )

    async def generate(request: web.Request, kind: str) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        if body.get("model") not in (None, engine.served_name):
            return web.json_response(
                {"error": {"message": f"model {body.get('model')!r} does not exist"}}, status=404
            )
        req = Request(
            _prompt_tokens(body),
            int(body.get("max_tokens") or body.get("max_completion_tokens") or 16),
            time.monotonic(),
        )
        engine.submit(req)
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        if not body.get("stream"):
            words: list[str] = []
            while (part := await req.queue.get()) is not None:
                words += part
            done = _chunk(kind, rid, engine.served_name, " ".join(words), "length")
            if kind == "chat":
                done["object"] = "chat.completion"
                done["choices"][0] = {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(words)},
                    "finish_reason": "length",
                }
            done["usage"] = {
                "prompt_tokens": req.prompt_tokens,
                "completion_tokens": req.generated,
                "total_tokens": req.prompt_tokens + req.generated,
            }
            return web.json_response(done)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while (part := await req.queue.get()) is not None:
                chunk = _chunk(kind, rid, engine.served_name, " " + " ".join(part), None)
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            final = _chunk(kind, rid, engine.served_name, None, "length")
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            engine.abort(req)  # the client went away: stop generating for it, as vLLM does
        return response

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, "text")

    async def chat(request: web.Request) -> web.StreamResponse:
        return await generate(request, "chat")

    async def on_startup(app: web.Application) -> None:
        app[ENGINE_LOOP] = asyncio.create_task(engine.loop())

    async def on_cleanup(app: web.Application) -> None:
        app[ENGINE_LOOP].cancel()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
