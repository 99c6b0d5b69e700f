"""A vLLM-compatible simulator: OpenAI API, /health and vLLM's /metrics, with modelled behaviour.

Start it like `vllm serve`: `python -m specgate_lab.sim MODEL --port 8000 [--served-model-name N]
[--speculative-config JSON] [--max-num-seqs N]`; other vLLM flags are accepted and ignored.

Behaviour comes from the speculative config (method, num_speculative_tokens) and these variables
(the bridge passes a pod's env, so a SpeculativeDeployment's spec.env steers its simulated engines):

| variable | meaning | default |
|---|---|---|
| SPECGATE_SIM_PROFILE | workload: chat, code, translation, repetitive | chat |
| SPECGATE_SIM_ALPHA | override the acceptance rate (accepted / draft tokens) | from profile |
| SPECGATE_SIM_STEP_MS | fixed cost of one engine step, ms | 12 |
| SPECGATE_SIM_TOKEN_MS | cost per request per verified token, ms | 0.5 |
| SPECGATE_SIM_DRAFT_PASS_MS | cost of one draft position, ms | by method |
| SPECGATE_SIM_SCRIPT | knob changes over time, e.g. "0s:alpha=0.8;120s:alpha=0.3"; a step "if:PATH:alpha=0.3" applies while the file PATH exists (a test drifts the engine when it chooses) | none |
| SPECGATE_SIM_SEED | random seed | 0 |
| SPECGATE_SIM_EXIT | "startup": exit at once with an error (a crashing engine); "speculative": the same, only with a --speculative-config (a canary whose draft fails to load) | unset |
| SPECGATE_SIM_STUCK | "startup" or "speculative" as above: the socket opens but every request, /health included, hangs (an engine that never finishes loading) | unset |
"""
