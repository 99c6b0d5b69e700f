# The local lab: a real Kubernetes control plane with fake GPU nodes, Prometheus and the bridge.
KUBECONFIG_LAB := $(SPECGATE_CACHE)/kubeconfig

.PHONY: binaries
binaries: ## build the pinned cluster binaries into $(SPECGATE_CACHE)/bin (cached)
	hack/build-binaries.sh

.PHONY: cluster-up
cluster-up: venv ## start the local cluster, Prometheus and the bridge (idempotent)
	PY=$(abspath $(PY)) hack/cluster-up.sh

.PHONY: cluster-down
cluster-down: ## stop the local cluster and everything it started
	hack/cluster-down.sh

TEST_PREREQS += cluster-up
