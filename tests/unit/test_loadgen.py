"""The load generator against an in-process simulator: bounded, measured, loopback only."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specgate_lab.loadgen import check_loopback, chunk_text, run_load
from specgate_lab.sim.metrics import EngineMetrics
from specgate_lab.sim.model import Knobs, Speculation
from specgate_lab.sim.server import SimEngine, make_app


async def _load_against_sim(max_requests: int) -> tuple[int, int, int]:
    engine = SimEngine(
        served_name="tiny",
        knobs=Knobs(step_ms=2, token_ms=0.1),
        spec=Speculation("draft_model", 4),
        script=[],
        metrics=EngineMetrics.create(speculative=True),
    )
    server = TestServer(make_app(engine), host="127.0.0.1")
    await server.start_server()
    try:
        url = f"http://127.0.0.1:{server.port}"
        result = await run_load(
            url, "tiny", concurrency=3, duration=20, max_requests=max_requests, max_tokens=16
        )
    finally:
        await server.close()
    return result.requests, result.errors, len(result.ttft)


def test_runs_the_request_budget_and_measures_every_request() -> None:
    requests, errors, ttfts = asyncio.run(_load_against_sim(max_requests=9))
    assert (requests, errors, ttfts) == (9, 0, 9)


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com"])
def test_refuses_non_loopback_targets(url: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        check_loopback(url)


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        ('{"choices": [{"text": "hi"}]}', "hi"),
        ('{"choices": [{"text": null}]}', ""),
        ('{"error": {"message": "engine dead"}}', None),
        ('{"choices": []}', None),
        ("not json", None),
        ("[1, 2]", None),
    ],
)
def test_chunk_text_tells_text_from_error_chunks(payload: str, text: str | None) -> None:
    assert chunk_text(payload) == text


async def _load_against_failing_stream() -> tuple[int, int]:
    async def completions(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": "a"}]}\n\n')
        await resp.write(b'data: {"error": {"message": "EngineDeadError"}}\n\n')
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        result = await run_load(f"http://127.0.0.1:{server.port}", "tiny", concurrency=1, max_requests=2)
    finally:
        await server.close()
    return result.requests, result.errors


def test_an_error_chunk_mid_stream_counts_as_a_failed_request() -> None:
    assert asyncio.run(_load_against_failing_stream()) == (0, 2)
