#!/usr/bin/env bash
# Build the local cluster's binaries from the Go module proxy, pinned, into $SPECGATE_CACHE/bin.
# Each binary is named <tool>-<version>; one that exists is not built again, so a warm run is instant.
# Nothing comes from release downloads: only Go modules, compiled here.
# `build-binaries.sh gateway` builds only the lab's gateway (Traefik) and fetches the Gateway API CRDs
# (issue 41; `make gateway`, a prerequisite of `make test`).
set -euo pipefail

CACHE="${SPECGATE_CACHE:-$HOME/.cache/specgate}"
BIN="$CACHE/bin"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
export CGO_ENABLED=0
PARALLEL="${SPECGATE_GO_PARALLEL:-2}"

KUBE_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.7.0
# Only its CRDs (ServiceMonitor, PodMonitor, PrometheusRule), for kubeconform: no binary.
PROMETHEUS_OPERATOR_VERSION=v0.85.0
# Prometheus 3.x is published as module versions v0.3xx.y (v0.316.0 is Prometheus 3.16.0).
PROMETHEUS_VERSION=v0.316.0
PROMETHEUS_RELEASE="${PROMETHEUS_VERSION#v0.}" # 316.0
PROMETHEUS_RELEASE="${PROMETHEUS_RELEASE:0:1}.${PROMETHEUS_RELEASE:1}" # 3.16.0
# The lab's gateway (issue 41): Traefik v3 with its kubernetesGateway provider, and the Gateway API
# standard-channel CRDs it serves (Traefik v3.7.13 is built against gateway-api v1.6.1).
TRAEFIK_VERSION=v3.7.13
# The lab's build of it: Traefik with its entrypoints' HTTP/1 server in full duplex (see traefik_module).
TRAEFIK_BUILD="$TRAEFIK_VERSION-fullduplex"
GO_HTTP_AUTH_FALLBACK=v0.4.1-0.20200324110947-a37a7636d23e
GATEWAY_API_VERSION=v1.6.3
TARGET="${1:-all}"
case "$TARGET" in all | gateway) ;; *) echo "usage: $0 [gateway]" >&2; exit 2 ;; esac

mkdir -p "$BIN"
# One build at a time (make -j, or a test session beside a `make cluster-up`): a second waits, then
# finds the binaries built.
# The gateway has a lock of its own: it shares no binary with the rest, so it can build beside them.
if [ "$TARGET" = gateway ]; then exec 9>"$BIN/.build-gateway.lock"; else exec 9>"$BIN/.build.lock"; fi
flock 9
log() { printf '[build-binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

have() { [ -x "$BIN/$1-$2" ]; }

# A module whose go.mod requires k8s.io/kubernetes and points every staging module at its published
# v0.x twin; `go install pkg@version` refuses modules with replace directives, a wrapper does not.
kube_module() {
  local dir="$CACHE/src/kubernetes-$KUBE_VERSION" minor="${KUBE_VERSION#v1.}"
  if [ ! -f "$dir/go.sum" ]; then
    mkdir -p "$dir"
    local upstream="$dir/upstream.mod"
    (cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null)
    cp "$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod" "$upstream"
    {
      echo "module specgate.local/kubernetes"
      echo
      echo "go 1.26.0"
      echo
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo
      grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging/' "$upstream" |
        awk -v v="v0.$minor" '{print "replace " $1 " => " $1 " " v}'
    } >"$dir/go.mod"
    cat >"$dir/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
    log "resolving k8s.io/kubernetes $KUBE_VERSION dependencies (first run only)"
    (cd "$dir" && go mod tidy -e >/dev/null 2>&1 || go mod tidy)
  fi
  echo "$dir"
}

build_kube() {
  local missing=()
  for tool in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    have "$tool" "$KUBE_VERSION" || missing+=("$tool")
  done
  [ ${#missing[@]} -eq 0 ] && return
  local dir minor="${KUBE_VERSION#v1.}"
  dir="$(kube_module)"
  minor="${minor%%.*}"
  local pkg=k8s.io/component-base/version
  local ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
  for tool in "${missing[@]}"; do
    log "building $tool $KUBE_VERSION (slow on a cold cache)"
    (cd "$dir" && go build -p "$PARALLEL" -trimpath -tags tools -ldflags "$ldflags" \
      -o "$BIN/$tool-$KUBE_VERSION.tmp" "k8s.io/kubernetes/cmd/$tool")
    mv "$BIN/$tool-$KUBE_VERSION.tmp" "$BIN/$tool-$KUBE_VERSION"
  done
}

build_etcd() {
  have etcd "$ETCD_VERSION" && return
  local dir="$CACHE/src/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  cat >"$dir/go.mod" <<EOF
module specgate.local/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$dir/tools.go"
  log "building etcd $ETCD_VERSION"
  (cd "$dir" && go mod tidy >/dev/null 2>&1 || go mod tidy)
  (cd "$dir" && go build -p "$PARALLEL" -trimpath -ldflags "-s -w" -o "$BIN/etcd-$ETCD_VERSION.tmp" go.etcd.io/etcd/server/v3)
  mv "$BIN/etcd-$ETCD_VERSION.tmp" "$BIN/etcd-$ETCD_VERSION"
}

# Modules without replace directives install straight from the proxy.
go_install() { # name version package
  local name="$1" version="$2" pkg="$3"
  have "$name" "$version" && return
  log "building $name $version"
  local tmp="$CACHE/go/gobin-$name"
  mkdir -p "$tmp"
  GOBIN="$tmp" GOFLAGS= go install -p "$PARALLEL" -trimpath -ldflags "-s -w" "$pkg@$version"
  mv "$tmp/$(basename "${pkg%%@*}")" "$BIN/$name-$version"
}

# helm with the -X flags of helm's own Makefile, which `go install` lacks: its version, and the
# Kubernetes version `helm template` and `helm lint` assume without a cluster, from the client-go
# it is built with (v0.37 gives 1.37). Unset, that is 1.20, and the chart's kubeVersion (>=1.30)
# refuses to render. The name carries it, so a cache holding a plain build (helm-v3.22.0) rebuilds.
build_helm() {
  local gomod client_go minor
  gomod="$(cd "$CACHE" && go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod")" # v0.37.0
  minor="${client_go#v0.}"
  minor="${minor%%.*}"
  HELM_BUILD="$HELM_VERSION-kube1.$minor"
  have helm "$HELM_BUILD" && return
  log "building helm $HELM_VERSION (Kubernetes 1.$minor by default)"
  local pkg=helm.sh/helm/v3 tmp="$CACHE/go/gobin-helm"
  local ldflags="-s -w -X $pkg/internal/version.version=$HELM_VERSION -X $pkg/internal/version.gitTreeState=clean"
  for p in pkg/chartutil pkg/lint/rules; do
    ldflags+=" -X $pkg/$p.k8sVersionMajor=1 -X $pkg/$p.k8sVersionMinor=$minor"
  done
  mkdir -p "$tmp"
  GOBIN="$tmp" GOFLAGS= go install -p "$PARALLEL" -trimpath -ldflags "$ldflags" "$pkg/cmd/helm@$HELM_VERSION"
  mv "$tmp/helm" "$BIN/helm-$HELM_BUILD"
}

# The Prometheus Operator's CRDs from its module (example/prometheus-operator-crd/), pinned, into
# $CACHE/crds/prometheus-operator: kubeconform checks the chart's ServiceMonitor and PrometheusRule
# and the operator's PodMonitor against them (tests/cluster/test_monitoring_schemas.py).
fetch_prometheus_operator_crds() {
  local dir="$CACHE/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION" src
  if [ ! -d "$dir" ]; then
    log "fetching the Prometheus Operator $PROMETHEUS_OPERATOR_VERSION CRDs"
    src="$(cd "$CACHE" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
      sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    mkdir -p "$dir.tmp"
    for kind in podmonitors servicemonitors prometheusrules; do
      install -m 644 "$src/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$dir.tmp/"
    done
    mv "$dir.tmp" "$dir"
  fi
  ln -sfn "$(basename "$dir")" "$CACHE/crds/prometheus-operator"
}

# Prometheus 3 as `prometheus3` (Debian's 2.x stays /usr/bin/prometheus). Only the file and HTTP
# service discoveries (remove_all_sd: ~1040 packages to compile instead of ~1520) and no embedded
# web UI (the lab uses the API only). Its version is set as promu sets it, or it reports 0.0.0.
build_prometheus() {
  have prometheus "v$PROMETHEUS_RELEASE" && return
  log "building prometheus $PROMETHEUS_RELEASE (module $PROMETHEUS_VERSION; slow on a cold cache)"
  local pkg=github.com/prometheus/common/version tmp="$CACHE/go/gobin-prometheus"
  local ldflags="-s -w -X $pkg.Version=$PROMETHEUS_RELEASE -X $pkg.Revision=$PROMETHEUS_VERSION -X $pkg.Branch=HEAD"
  ldflags+=" -X $pkg.BuildUser=specgate -X $pkg.BuildDate=19700101-00:00:00"
  mkdir -p "$tmp"
  GOBIN="$tmp" GOFLAGS= go install -p "$PARALLEL" -trimpath -tags remove_all_sd -ldflags "$ldflags" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"
  mv "$tmp/prometheus" "$BIN/prometheus-v$PROMETHEUS_RELEASE"
}

# Traefik from a wrapper module, as Kubernetes is: its go.mod has replace directives (forks of two
# modules), which `go install pkg@version` refuses. One of them is relative, to a nested module
# (github.com/traefik/traefik/dynamic/ext, ./pkg/config/dynamic/ext) that the module zip leaves out
# and the proxy does not serve: an extension point of empty structs for Traefik's own enterprise
# builds. The wrapper points it at a local stub declaring each ext.<Type> the sources name as an
# empty struct, which is what the open-source build compiles against.
# The module proxy reachable here refuses (403, "not available") some module versions Traefik pins:
# - the go-http-auth fork's v0.4.1-0.20260804094822-b975dcaa8c48 (basic and digest auth middlewares):
#   the fork's earlier revision GO_HTTP_AUTH_FALLBACK, which has the same API, stands in;
# - the SDKs of 13 of lego's DNS providers (ACME DNS-01 challenges): lego is taken from the proxy
#   and its providers/dns registry replaced by one that knows no provider, so no DNS provider SDK is
#   compiled at all (the lab asks for no certificate; naming a DNS provider fails with lego's own
#   "unrecognized DNS provider"). Left out: lego's 219 DNS provider packages and their SDKs; the
#   build compiles 1698 packages.
# One change to Traefik's own code (traefik/traefik#11767, open upstream): Go's HTTP/1 server drains and
# closes a request's body when the response header is written, unless the handler enabled full duplex
# (golang/go#15527). Traefik proxies a request by writing its body upstream while the backend may
# already answer; when the backend's header comes first (an engine starts a stream at once), the
# transport's last read of the body fails, it closes the upstream connection, and the stream is cut
# after its header: measured in the lab, 1 to 6 of ~800 streamed completions a rollout. The lab's
# build enables full duplex on every request at the entrypoint, so a cut stream in a test is specgate's.
traefik_module() {
  local dir="$CACHE/src/traefik-$TRAEFIK_BUILD" src upstream types lego_version lego_src
  if [ ! -f "$dir/go.sum" ]; then
    mkdir -p "$dir/ext"
    src="$(cd "$dir" && go mod download -json "github.com/traefik/traefik/v3@$TRAEFIK_VERSION" |
      sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    upstream="$dir/upstream.mod"
    cp "$GOMODCACHE/cache/download/github.com/traefik/traefik/v3/@v/$TRAEFIK_VERSION.mod" "$upstream"
    # Every replace, one line each (the file has both `replace a => b` and `replace ( ... )` blocks).
    awk '/^replace \($/ {block = 1; next} block && /^\)$/ {block = 0; next}
      block && /=>/ {print "replace " $0; next} /^replace .*=>/ {print}' "$upstream" |
      sed 's/^replace[[:space:]]*/replace /' >"$dir/replaces"
    grep -q '^replace github.com/traefik/traefik/dynamic/ext => \./pkg/config/dynamic/ext$' "$dir/replaces" || {
      log "traefik $TRAEFIK_VERSION: the dynamic/ext replace changed; read its go.mod"
      exit 1
    }
    types="$(grep -rlF '"github.com/traefik/traefik/dynamic/ext"' --include='*.go' "$src" |
      xargs -r grep -hoE '\bext\.[A-Z][A-Za-z0-9]*' | sort -u | sed 's/^ext\.//')"
    [ -n "$types" ] || { log "traefik $TRAEFIK_VERSION: no ext.<Type> found in its sources"; exit 1; }
    printf 'module github.com/traefik/traefik/dynamic/ext\n\ngo 1.24.0\n' >"$dir/ext/go.mod"
    {
      printf '// Package ext stands in for the dynamic configuration extension module of Traefik.\npackage ext\n'
      for t in $types; do printf '\n// %s is an empty extension.\ntype %s struct{}\n' "$t" "$t"; done
    } >"$dir/ext/ext.go"
    grep -q '^replace github.com/abbot/go-http-auth => github.com/containous/go-http-auth ' "$dir/replaces" || {
      log "traefik $TRAEFIK_VERSION: the go-http-auth replace changed; read its go.mod"
      exit 1
    }
    lego_version="$(awk '$1 == "github.com/go-acme/lego/v5" {print $2}' "$upstream")"
    lego_src="$(cd "$dir" && go mod download -json "github.com/go-acme/lego/v5@$lego_version" |
      sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    rm -rf "$dir/lego"
    cp -r "$lego_src" "$dir/lego"
    chmod -R u+w "$dir/lego"
    rm -f "$dir"/lego/providers/dns/*.go
    cat >"$dir/lego/providers/dns/zz_gen_dns_providers.go" <<'EOF'
// Package dns is lego's DNS provider registry without its providers (specgate's lab build of Traefik).
package dns

import (
	"fmt"

	"github.com/go-acme/lego/v5/challenge"
)

// NewDNSChallengeProviderByName knows no DNS provider in this build.
func NewDNSChallengeProviderByName(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("unrecognized DNS provider: %s (built without DNS providers)", name)
}
EOF
    {
      echo "module specgate.local/traefik"
      echo
      echo "go 1.26.0"
      echo
      echo "require github.com/traefik/traefik/v3 $TRAEFIK_VERSION"
      echo
      sed -e 's|=> \./pkg/config/dynamic/ext$|=> ./ext|' \
        -e "s|=> github.com/containous/go-http-auth .*|=> github.com/containous/go-http-auth $GO_HTTP_AUTH_FALLBACK|" \
        "$dir/replaces"
      echo "replace github.com/go-acme/lego/v5 => ./lego"
      echo "replace github.com/traefik/traefik/v3 => ./traefik"
    } >"$dir/go.mod"
    full_duplex_traefik "$src" "$dir/traefik"
    printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/traefik/traefik/v3/cmd/traefik"\n' >"$dir/tools.go"
    log "resolving traefik $TRAEFIK_VERSION dependencies (first run only)"
    (cd "$dir" && go mod tidy -e >/dev/null 2>&1 || go mod tidy)
  fi
  echo "$dir"
}

# Traefik's sources with full duplex enabled at the entrypoint (see traefik_module).
full_duplex_traefik() {
  local src="$1" dir="$2" file=pkg/server/server_entrypoint_tcp.go
  rm -rf "$dir"
  cp -r "$src" "$dir"
  chmod -R u+w "$dir"
  grep -q '^	handler = denyOpaque(handler)$' "$dir/$file" || {
    log "traefik $TRAEFIK_VERSION: newHTTPServer changed; read $file"
    exit 1
  }
  sed -i 's/^	handler = denyOpaque(handler)$/&\n	handler = fullDuplex(handler)/' "$dir/$file"
  cat >>"$dir/$file" <<'EOF'

// fullDuplex lets the proxy finish writing a request's body upstream once the response has begun
// (specgate's lab build, see its build-binaries.sh).
func fullDuplex(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		_ = http.NewResponseController(rw).EnableFullDuplex()
		next.ServeHTTP(rw, req)
	})
}
EOF
}

build_traefik() {
  have traefik "$TRAEFIK_BUILD" && return
  local dir pkg=github.com/traefik/traefik/v3/pkg/version
  dir="$(traefik_module)"
  log "building traefik $TRAEFIK_BUILD (slow on a cold cache)"
  (cd "$dir" && go build -p "$PARALLEL" -trimpath \
    -ldflags "-s -w -X $pkg.Version=$TRAEFIK_VERSION -X $pkg.BuildDate=1970-01-01T00:00:00Z" \
    -o "$BIN/traefik-$TRAEFIK_BUILD.tmp" github.com/traefik/traefik/v3/cmd/traefik)
  mv "$BIN/traefik-$TRAEFIK_BUILD.tmp" "$BIN/traefik-$TRAEFIK_BUILD"
}

# Gateway API's standard-channel CRDs (config/crd/standard/, its ValidatingAdmissionPolicy included)
# from its module, pinned, into $CACHE/crds/gateway-api.
fetch_gateway_api_crds() {
  local dir="$CACHE/crds/gateway-api-$GATEWAY_API_VERSION" src
  if [ ! -d "$dir" ]; then
    log "fetching the Gateway API $GATEWAY_API_VERSION CRDs (standard channel)"
    src="$(cd "$CACHE" && go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" |
      sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    mkdir -p "$dir.tmp"
    install -m 644 "$src"/config/crd/standard/*.yaml "$dir.tmp/"
    mv "$dir.tmp" "$dir"
  fi
  ln -sfn "$(basename "$dir")" "$CACHE/crds/gateway-api"
}

if [ "$TARGET" = gateway ]; then
  build_traefik
  fetch_gateway_api_crds
  ln -sfn "traefik-$TRAEFIK_BUILD" "$BIN/traefik"
  log "gateway ready: $BIN/traefik, CRDs in $CACHE/crds/gateway-api"
  exit 0
fi

go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
go_install kwokctl "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwokctl
build_etcd
build_kube
build_helm
go_install kubeconform "$KUBECONFORM_VERSION" github.com/yannh/kubeconform/cmd/kubeconform
build_prometheus
fetch_prometheus_operator_crds

# Stable names for scripts and tests.
for pair in "kube-apiserver $KUBE_VERSION" "kube-controller-manager $KUBE_VERSION" "kube-scheduler $KUBE_VERSION" \
  "kubectl $KUBE_VERSION" "etcd $ETCD_VERSION" "kwok $KWOK_VERSION" "kwokctl $KWOK_VERSION" \
  "helm $HELM_BUILD" "kubeconform $KUBECONFORM_VERSION"; do
  set -- $pair
  ln -sfn "$1-$2" "$BIN/$1"
done
ln -sfn "prometheus-v$PROMETHEUS_RELEASE" "$BIN/prometheus3"
log "binaries ready in $BIN"
