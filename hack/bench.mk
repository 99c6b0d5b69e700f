# Benchmarks: ratios measured side by side in one run (not timing assertions).
.PHONY: bench
bench: venv engines ## decision-rule, guard, latency-gate and draft-length benchmarks (about 90 minutes on two cores: the decisions' 12 h incumbent histories take about 35, the guard's 36 h months 24, the draft lengths on real vLLM engines 20)
	$(PY) bench/decisions.py
	$(PY) bench/speedup.py
	$(PY) bench/draft_length_gpu.py
	$(PY) bench/break_even.py
	$(PY) bench/guard.py
	$(PY) bench/latency.py
	$(PY) bench/end_to_end.py
	PYTHONPATH=lab $(VLLM_VENV)/bin/python -m specgate_lab.tiny_models $(SPECGATE_CACHE)/models \
		tiny-llama-noise-0.01 tiny-llama-noise-0.05
	$(PY) bench/draft_length.py

.PHONY: bench-latency
bench-latency: venv ## the per-token latency gate on simulated vLLM histograms: wrong passes, good canaries rolled back, minutes to a Pass (TRIALS per cell)
	$(PY) bench/latency.py $(if $(TRIALS),--trials $(TRIALS))

.PHONY: bench-end-to-end
bench-end-to-end: venv ## alpha and the per-token latency gate deciding together (end_to_end_bad_outcome_worst, TRIALS per cell), and the guard's latency false trips per month after promotion (MONTHS per cell)
	$(PY) bench/end_to_end.py $(if $(TRIALS),--trials $(TRIALS)) $(if $(MONTHS),--months $(MONTHS))

.PHONY: bench-draft-length
bench-draft-length: venv engines ## draft length alone: k_choice_speedup_ratio and k_schedule_speedup_vs_best_static on real engines (QUICK=1: one draft, K 1..2, about 5 minutes)
	PYTHONPATH=lab $(VLLM_VENV)/bin/python -m specgate_lab.tiny_models $(SPECGATE_CACHE)/models \
		tiny-llama-noise-0.01 tiny-llama-noise-0.05
	$(PY) bench/draft_length.py $(if $(QUICK),--quick) $(if $(SAVE),--save $(SAVE))

.PHONY: bench-scale
bench-scale: venv ## the operator at 500 objects on a control plane of its own (about 10 minutes)
	hack/build-binaries.sh
	$(PY) bench/scale.py --objects $(or $(OBJECTS),500)

.PHONY: bench-draft-length-gpu
bench-draft-length-gpu: venv ## draft length judged on the GPU step tables (bench/gpu): k_choice_gpu_replay_ratio_worst and k_schedule_gpu_replay_vs_best_static, pure CPU (seconds)
	$(PY) bench/draft_length_gpu.py

.PHONY: bench-break-even
bench-break-even: venv ## the acceptance gate's threshold on the GPU step tables (bench/gpu): Fixed 0.55 against BreakEven, wrong promotions and missed gains, pure CPU (seconds)
	$(PY) bench/break_even.py

.PHONY: bench-speedup
bench-speedup: venv ## the speedup gate alone on the per-token latency model: speedup_wrong_promote_095_worst, speedup_bad_outcome_105_worst, minutes to a verdict (a few minutes)
	$(PY) bench/speedup.py
