# Benchmarks: ratios measured side by side in one run (not timing assertions).
.PHONY: bench
bench: venv ## decision-rule, guard and draft-length benchmarks (about 20 minutes)
	$(PY) bench/decisions.py
	$(PY) bench/guard.py
	$(PY) bench/draft_length.py

.PHONY: bench-scale
bench-scale: venv ## the operator at 500 objects on a control plane of its own (about 10 minutes)
	hack/build-binaries.sh
	$(PY) bench/scale.py --objects $(or $(OBJECTS),500)
