# The lab's gateway (issue 41): Traefik v3 and the Gateway API CRDs. Not part of `make binaries` or
# `make test` yet; its cluster test runs with `make test-gateway` (root: it routes a pod range to lo).
# Cold (empty module and build caches), measured 2026-11-27 on the 2-core machine, near idle, with
# SPECGATE_GO_PARALLEL=1: 5 min 46 s (356 s user + 75 s sys CPU), 1.1 GB of modules and 1.7 GB of
# build cache; the binary is 144 MB and bit-identical across two builds.

.PHONY: gateway
gateway: ## build the lab's gateway (Traefik) and fetch the Gateway API CRDs into $(SPECGATE_CACHE)
	hack/build-binaries.sh gateway

.PHONY: test-gateway
test-gateway: venv gateway cluster-up ## the gateway's cluster test (tests marked gateway; not in `make test` yet)
	$(VENV)/bin/pytest -q -ra --gateway -m gateway tests/cluster
