"""vLLM's Prometheus metric family names, verified against vLLM 0.32 (counters' samples end in _total)."""

NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
# The same per-step histogram under its name before vLLM 0.10.2 (removed by 0.13).
TIME_PER_OUTPUT_TOKEN = "vllm:time_per_output_token_seconds"
REQUEST_TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"
# A histogram of the tokens each engine step processed, despite the _total in its name: one
# observation per engine step (with an output), so its _count is the step count. The ITL histogram
# has one sample per running request per step, all c of a step alike: the stall gate counts steps.
ITERATION_TOKENS = "vllm:iteration_tokens_total"
SPEC_DECODE_NUM_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DECODE_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def total(counter: str) -> str:
    """The sample name of a counter family: what Prometheus stores and /metrics shows."""
    return f"{counter}_total"
