# Benchmarks: ratios measured side by side in one run (not timing assertions).
.PHONY: bench
bench: venv ## decision-rule, guard and draft-length benchmarks (about 20 minutes)
	$(PY) bench/decisions.py
	$(PY) bench/guard.py
	$(PY) bench/draft_length.py
