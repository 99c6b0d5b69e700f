# specgate — the two commands users need are `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

export SPECGATE_CACHE ?= $(HOME)/.cache/specgate
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Extra prerequisites of `make test` (the local cluster, the engines) are added by hack/*.mk.
TEST_PREREQS :=

-include hack/*.mk

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml lab/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]' -e ./lab
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## create .venv with specgate and the dev tools

.PHONY: lint
lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check operator lab tests bench
	$(VENV)/bin/ruff format --check operator lab tests bench
	$(VENV)/bin/mypy

.PHONY: fmt
fmt: venv ## format the code
	$(VENV)/bin/ruff check --fix operator lab tests bench
	$(VENV)/bin/ruff format operator lab tests bench

.PHONY: api-docs
api-docs: venv ## regenerate docs/reference/api.md (the CRD) and helm-values.md (the chart); a unit test fails on drift
	$(VENV)/bin/python hack/api_reference.py > docs/reference/api.md
	$(VENV)/bin/python -m hack.values_reference > docs/reference/helm-values.md

.PHONY: crd
crd: venv ## regenerate the checked-in CRD (and the chart's copies) from the pydantic models
	$(VENV)/bin/specgate crd > crds/specgate.dev_speculativedeployments.yaml
	cp crds/specgate.dev_speculativedeployments.yaml charts/specgate/files/
	cp crds/kopf.dev_peerings.yaml charts/specgate/crds/
	$(VENV)/bin/python hack/api_reference.py > docs/reference/api.md

.PHONY: lock
lock: ## re-pin the operator image's runtime dependencies (requirements.lock)
	rm -rf /tmp/specgate-lock && $(PYTHON) -m venv /tmp/specgate-lock
	/tmp/specgate-lock/bin/pip install -q .
	{ echo "# Runtime dependencies of the operator image, pinned (regenerate: make lock)."; \
	  /tmp/specgate-lock/bin/pip freeze --exclude specgate; } > requirements.lock

.PHONY: unit
unit: venv ## pure unit tests (no cluster, no engine)
	$(VENV)/bin/pytest -q tests/unit

FUZZ_HISTORIES ?= 5000

.PHONY: fuzz
fuzz: venv ## the day-2 and route property tests on more random histories (FUZZ_HISTORIES, default 5000 each; no per-test timeout)
	SPECGATE_FUZZ_HISTORIES=$(FUZZ_HISTORIES) SPECGATE_ROUTE_HISTORIES=$(FUZZ_HISTORIES) \
		$(VENV)/bin/pytest -q --timeout=0 -n 2 tests/unit/test_day2_property.py tests/unit/test_gateway_property.py

SCENARIO ?= default
KEEP ?= 0

.PHONY: demo
# SCENARIO=gateway rolls out through the lab's gateway: it needs `make gateway` (hack/gateway.mk).
demo: venv engines cluster-up $(if $(filter gateway,$(SCENARIO)),gateway) ## roll out the heavy sample on the local cluster (SCENARIO=low-alpha, tiny, gateway or adopt; KEEP=1)
	@rc=0; $(PY) -m specgate_lab.demo --scenario $(SCENARIO) --kubeconfig $(SPECGATE_CACHE)/kubeconfig \
		$(if $(filter 1,$(KEEP)),--keep) || rc=$$?; \
	if [ "$(KEEP)" != 1 ]; then hack/cluster-down.sh; else echo "cluster kept: export KUBECONFIG=$(SPECGATE_CACHE)/kubeconfig"; fi; \
	exit $$rc

.PHONY: test
test: venv lint $(TEST_PREREQS) ## all tests: unit, integration (real Prometheus, engines) and cluster, in timed tiers (hack/test.sh)
	hack/test.sh

.PHONY: test-fast
test-fast: venv lint cluster-up gateway ## the development tier: unit, integration and cluster tests that start no real vLLM engine
	$(VENV)/bin/pytest -q -ra --durations=10 -m "not engine" tests

MUTANTS ?=

.PHONY: mutate
mutate: venv ## mutation testing of the core against tests/unit (hours; not in CI): kill rate per module and survivors (MUTANTS=pattern to run some)
	$(PY) hack/mutate.py $(if $(MUTANTS),-- $(MUTANTS))
