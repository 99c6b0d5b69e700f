# Benchmarks: ratios measured side by side in one run (not timing assertions).
.PHONY: bench
bench: venv ## decision-rule and draft-length benchmarks (a few minutes)
	$(PY) bench/decisions.py
	$(PY) bench/draft_length.py
