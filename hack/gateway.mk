# The lab's gateway (issue 41): Traefik v3 and the Gateway API CRDs, for the tests marked gateway (in
# `make test`; they need root: they route a pod range to lo).
# Cold (empty module and build caches), measured 2026-11-27 on the 2-core machine, near idle, with
# SPECGATE_GO_PARALLEL=1: 5 min 46 s (356 s user + 75 s sys CPU), 1.1 GB of modules and 1.7 GB of
# build cache; the binary is 144 MB and bit-identical across two builds.
TEST_PREREQS += gateway

.PHONY: gateway
gateway: ## build the lab's gateway (Traefik) and fetch the Gateway API CRDs into $(SPECGATE_CACHE)
	hack/build-binaries.sh gateway

.PHONY: test-gateway
test-gateway: venv gateway cluster-up ## only the tests marked gateway (the lab's Traefik)
	$(VENV)/bin/pytest -q -ra -m gateway tests/cluster
