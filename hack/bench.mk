# Benchmarks: ratios measured side by side in one run (not timing assertions).
.PHONY: bench
bench: venv engines ## decision-rule, guard and draft-length benchmarks (about 35 minutes; the last runs real vLLM engines)
	$(PY) bench/decisions.py
	$(PY) bench/guard.py
	PYTHONPATH=lab $(VLLM_VENV)/bin/python -m specgate_lab.tiny_models $(SPECGATE_CACHE)/models \
		tiny-llama-noise-0.01 tiny-llama-noise-0.05
	$(PY) bench/draft_length.py

.PHONY: bench-scale
bench-scale: venv ## the operator at 500 objects on a control plane of its own (about 10 minutes)
	hack/build-binaries.sh
	$(PY) bench/scale.py --objects $(or $(OBJECTS),500)
