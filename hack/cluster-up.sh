#!/usr/bin/env bash
# Bring up the local lab: a real control plane (kwokctl, binary runtime: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok-controller as local processes), fake GPU nodes,
# Prometheus with file_sd targets, and the bridge that runs one engine per pod.
# Prometheus is 3.x, built by build-binaries.sh; SPECGATE_PROMETHEUS=2 runs Debian's 2.x instead.
# Everything listens on 127.0.0.1. Idempotent: with everything up it returns in seconds.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
# shellcheck source=hack/lib.sh
. "$HERE/lib.sh"
CACHE="${SPECGATE_CACHE:-$HOME/.cache/specgate}"
STATE="$CACHE/cluster"
BIN="$CACHE/bin"
KWOK_VERSION="$(sed -n 's/^KWOK_VERSION=//p' "$HERE/build-binaries.sh")"
CLUSTER=specgate
KUBECONFIG_PATH="$CACHE/kubeconfig"
PROM_PORT="${SPECGATE_PROMETHEUS_PORT:-19090}"
PROM_FLAVOUR="${SPECGATE_PROMETHEUS:-3}"
PROM_RETENTION=6h
BRIDGE_PORT="${SPECGATE_BRIDGE_PORT:-18080}"
PY="${PY:-$ROOT/.venv/bin/python}"
# Four: `make test` runs test modules side by side (hack/test.sh), each rollout asking for 2-3 GPUs.
GPU_NODES="${SPECGATE_GPU_NODES:-4}"

log() { printf '[cluster-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
kubectl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

mkdir -p "$STATE"
"$HERE/build-binaries.sh"

export KWOK_WORKDIR="$STATE/kwok"
export KWOK_KUBE_VERSION="$("$BIN/kubectl" version --client -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | head -1)"
export KWOK_KUBECTL_BINARY="$BIN/kubectl"

# A component whose process died (e.g. a controller that lost its lease on a starved machine)
# leaves the API server answering but nothing reconciling: restart the cluster then.
components_alive() {
  local pids="$KWOK_WORKDIR/clusters/$CLUSTER/pids"
  [ -d "$pids" ] || return 1
  for pidfile in "$pids"/*.pid; do
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { log "$(basename "$pidfile" .pid) is not running"; return 1; }
  done
}

# kwok's own stages, except that pods of benchmark Jobs are not completed at once: the bridge runs
# them and reports how they ended. (Giving kwok any Stage replaces all its defaults.)
write_kwokctl_config() {
  local kwok_dir stages
  kwok_dir="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/mod" \
    go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  stages="$kwok_dir/kustomize/stage"
  {
    # enableCRDs Logs: the bridge names each engine pod's log files in a Logs object (kubectl logs).
    printf 'apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokctlConfiguration\noptions:\n  bindAddress: 127.0.0.1\n  enableCRDs: [Logs]\n'
    # A throwaway lab's etcd need not wait on the disk: where the disk is slow or shared, an fsync
    # per write holds every API write, towards the API server's 60 s limit (504).
    printf 'componentsPatches:\n  - name: etcd\n    extraArgs:\n      - {key: unsafe-no-fsync, value: "true"}\n'
    for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-delete; do
      printf -- '---\n'; cat "$stages/$f.yaml"
    done
    # Engine pods start not Ready: the bridge makes them Ready when their engine's /health answers,
    # as a readinessProbe would (kwok's Ready at once would let a rollout count a pod that serves nothing).
    printf -- '---\n'
    perl -0pe 's/status: "True"\n(\s+)type: (Ready|ContainersReady)\n/status: {{ with .metadata.labels }}{{ if index . "specgate.dev\/engine" }}"False"{{ else }}"True"{{ end }}{{ else }}"True"{{ end }}\n$1type: $2\n/g' \
      "$stages/pod/fast/pod-ready.yaml"
    printf -- '---\n'
    sed "s|^    - key: '.metadata.deletionTimestamp'|    - key: '.metadata.labels[\"specgate.dev/benchmark\"]'\n      operator: 'DoesNotExist'\n&|" \
      "$stages/pod/fast/pod-complete.yaml"
  } >"$STATE/kwokctl.yaml.new"
  grep -q 'specgate.dev/benchmark' "$STATE/kwokctl.yaml.new" || { log "kwok stages: no pod-complete to amend"; exit 1; }
  [ "$(grep -c 'specgate.dev/engine' "$STATE/kwokctl.yaml.new")" = 2 ] || { log "kwok stages: no pod-ready to amend"; exit 1; }
  if [ -f "$STATE/kwokctl.yaml" ] && ! cmp -s "$STATE/kwokctl.yaml.new" "$STATE/kwokctl.yaml"; then
    log "kwok configuration changed: the cluster is created anew (and the bridge, bound to the old one)"
    "$(dirname "$0")/cluster-down.sh"
  fi
  mv "$STATE/kwokctl.yaml.new" "$STATE/kwokctl.yaml"
}

start_control_plane() {
  if kubectl get --raw /readyz >/dev/null 2>&1 && components_alive; then
    log "control plane already up"
    return
  fi
  if "$BIN/kwokctl" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "starting the existing cluster"
    "$BIN/kwokctl" stop cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    "$BIN/kwokctl" start cluster --name "$CLUSTER" --timeout 3m || "$BIN/kwokctl" delete cluster --name "$CLUSTER"
  fi
  if ! kubectl get --raw /readyz >/dev/null 2>&1; then
    log "creating the control plane (kwokctl, binary runtime, Kubernetes $KWOK_KUBE_VERSION)"
    "$BIN/kwokctl" --config "$STATE/kwokctl.yaml" create cluster --name "$CLUSTER" --runtime binary \
      --kube-apiserver-binary "$BIN/kube-apiserver" \
      --kube-controller-manager-binary "$BIN/kube-controller-manager" \
      --kube-scheduler-binary "$BIN/kube-scheduler" \
      --kwok-controller-binary "$BIN/kwok" \
      --etcd-binary "$BIN/etcd" \
      --extra-args kube-controller-manager=leader-elect=false \
      --extra-args kube-scheduler=leader-elect=false \
      --kubeconfig "$KUBECONFIG_PATH" \
      --wait 3m --timeout 5m
  fi
  "$BIN/kwokctl" get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_PATH.tmp"
  mv "$KUBECONFIG_PATH.tmp" "$KUBECONFIG_PATH"
}

# On a cluster the control plane has cores of its own; here it shares two with every engine, and
# each engine runs in a session of its own (the bridge). Autogroup scheduling (where enabled) weighs
# every session alike, so with dozens of engines busy the API server got about a quarter of a core
# and held every write past its 60 s (handler timeouts, 504s, etcd idle). Its components, and
# Prometheus, get a larger share: nice -10 and -5 for their sessions and every thread in them.
CONTROL_PLANE_NICE=-10
PROMETHEUS_NICE=-5

prioritize() { # nice pid: the session's autogroup and the process group's threads (root only)
  # Only a session leader's own autogroup: one not yet in its session would give the caller's.
  [ "$(ps -o sid= -p "$2" | tr -d ' ')" = "$2" ] || return 0
  echo "$1" 2>/dev/null >"/proc/$2/autogroup" || true
  renice "$1" -g "$2" >/dev/null 2>&1 || true
}

prioritize_control_plane() {
  for pidfile in "$KWOK_WORKDIR/clusters/$CLUSTER/pids"/*.pid; do
    prioritize "$CONTROL_PLANE_NICE" "$(cat "$pidfile")"
  done
}

register_gpu_nodes() {
  for i in $(seq 0 $((GPU_NODES - 1))); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: gpu-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
spec:
  taints:
    - {key: kwok.x-k8s.io/node, value: fake, effect: NoSchedule}
status:
  allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
  capacity: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
EOF
  done | kubectl apply --server-side --force-conflicts -f - >/dev/null
  # The default namespace's ServiceAccount appears once the controller manager runs.
  for _ in $(seq 60); do kubectl get serviceaccount default >/dev/null 2>&1 && break; sleep 1; done
  log "$GPU_NODES fake GPU nodes (8 x nvidia.com/gpu each)"
}

# One scrape job per interval a SpeculativeDeployment may ask for (the bridge's SCRAPE_INTERVALS, the
# single source), each reading the targets the bridge writes into targets/<interval>/.
write_prometheus_config() { # binary
  local intervals
  intervals="$("$PY" -c 'from specgate_lab.bridge import SCRAPE_INTERVALS; print(*SCRAPE_INTERVALS)')"
  {
    echo "# Prometheus $PROM_FLAVOUR: $(readlink -f "$1")"
    printf 'global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n'
    # 3.x deprecates the retention flags for this (2.42 has no such field).
    [ "$PROM_FLAVOUR" = 2 ] || printf 'storage:\n  tsdb:\n    retention:\n      time: %s\n' "$PROM_RETENTION"
    echo 'scrape_configs:'
    for interval in $intervals; do
      mkdir -p "$STATE/targets/$interval"
      cat <<EOF
  - job_name: vllm-$interval
    scrape_interval: $interval
    file_sd_configs:
      - files: ["$STATE/targets/$interval/*.json"]
        refresh_interval: 2s
EOF
    done
  } >"$STATE/prometheus.yml.new"
}

start_prometheus() {
  # Debian's 2.x is installed either way: tests compare the two.
  if [ ! -x /usr/bin/prometheus ]; then
    log "installing Prometheus 2 (Debian package)"
    if ! apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1; then
      apt-get update -q >/dev/null
      apt-get install -y -q --no-install-recommends prometheus >/dev/null
    fi
    # The package starts a system service on :9090 where systemd runs; the lab runs its own.
    service prometheus stop >/dev/null 2>&1 || true
  fi
  local prom
  case "$PROM_FLAVOUR" in
    3) prom="$BIN/prometheus3" ;;
    2) prom=/usr/bin/prometheus ;;
    *) log "SPECGATE_PROMETHEUS=$PROM_FLAVOUR: expected 3 (the default) or 2"; exit 1 ;;
  esac
  [ -x "$prom" ] || { log "$prom is missing (make binaries)"; exit 1; }
  mkdir -p "$STATE/targets"
  write_prometheus_config "$prom"
  # Another flavour, version or set of jobs: start afresh (2.x cannot read what 3.x wrote), and the
  # bridge too (one from before may write its targets where this configuration does not read).
  if ! cmp -s "$STATE/prometheus.yml.new" "$STATE/prometheus.yml"; then
    if alive "$STATE/prometheus.pid" || alive "$STATE/bridge.pid"; then
      log "Prometheus configuration changed: restarting it and the bridge (Prometheus $PROM_FLAVOUR, $(readlink -f "$prom"))"
      stop_pidfile "$STATE/bridge.pid"
      stop_pidfile "$STATE/prometheus.pid"
    fi
    rm -rf "$STATE/prometheus-data"
    find "$STATE/targets" -name '*.json' -delete
  fi
  mv "$STATE/prometheus.yml.new" "$STATE/prometheus.yml"
  if alive "$STATE/prometheus.pid"; then
    log "Prometheus already up on 127.0.0.1:$PROM_PORT"
    return
  fi
  mkdir -p "$STATE/prometheus-data"
  local flags=(--config.file="$STATE/prometheus.yml" --storage.tsdb.path="$STATE/prometheus-data"
    --web.listen-address="127.0.0.1:$PROM_PORT")
  [ "$PROM_FLAVOUR" != 2 ] || flags+=(--storage.tsdb.retention.time="$PROM_RETENTION")
  # A session of its own: a scheduling group of its own (autogroup), given PROMETHEUS_NICE below.
  setsid "$prom" "${flags[@]}" >"$STATE/prometheus.log" 2>&1 </dev/null &
  echo $! >"$STATE/prometheus.pid"
  for _ in $(seq 60); do
    curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null && break
    sleep 0.5
  done
  curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null || { tail "$STATE/prometheus.log"; exit 1; }
  prioritize "$PROMETHEUS_NICE" "$(cat "$STATE/prometheus.pid")"  # ready: in its own session by now
  log "Prometheus $("$prom" --version 2>&1 | sed -n 's/^prometheus, version \([^ ]*\).*/\1/p') on http://127.0.0.1:$PROM_PORT"
}

start_bridge() {
  if alive "$STATE/bridge.pid"; then
    log "bridge already up on 127.0.0.1:$BRIDGE_PORT"
    return
  fi
  mkdir -p "$STATE/engines"
  setsid "$PY" -m specgate_lab.bridge --kubeconfig "$KUBECONFIG_PATH" --state-dir "$STATE" \
    --port "$BRIDGE_PORT" >"$STATE/bridge.log" 2>&1 < /dev/null &
  echo $! >"$STATE/bridge.pid"
  for _ in $(seq 40); do
    curl -sf "http://127.0.0.1:$BRIDGE_PORT/healthz" >/dev/null && break
    sleep 0.5
  done
  curl -sf "http://127.0.0.1:$BRIDGE_PORT/healthz" >/dev/null || { tail -30 "$STATE/bridge.log"; exit 1; }
  log "bridge on http://127.0.0.1:$BRIDGE_PORT (engine logs in $STATE/engines)"
}

write_kwokctl_config
start_control_plane
prioritize_control_plane
register_gpu_nodes
start_prometheus
start_bridge
cat >&2 <<EOF

Local cluster is up.
  export KUBECONFIG=$KUBECONFIG_PATH
  $BIN/kubectl get nodes
  Prometheus: http://127.0.0.1:$PROM_PORT   Services: http://127.0.0.1:$BRIDGE_PORT/svc/<namespace>/<service>/v1/...
EOF
