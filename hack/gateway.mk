# The lab's gateway (issue 41): Traefik v3 and the Gateway API CRDs. Not part of `make binaries` or
# `make test` yet; its cluster test runs with `make test-gateway`.

.PHONY: gateway
gateway: ## build the lab's gateway (Traefik) and fetch the Gateway API CRDs into $(SPECGATE_CACHE)
	hack/build-binaries.sh gateway

.PHONY: test-gateway
test-gateway: venv gateway cluster-up ## the gateway's cluster test (tests marked gateway; not in `make test` yet)
	$(VENV)/bin/pytest -q -ra --gateway -m gateway tests/cluster
