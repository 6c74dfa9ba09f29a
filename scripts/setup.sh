#!/usr/bin/env bash
# Sets up populora-env in ./.venv on a fresh Linux machine: system libraries the verifier uses, a CPU
# build of torch (unless the venv already has a torch, e.g. a CUDA build you installed), the package
# with all extras. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_CPU_PIN=${TORCH_CPU_PIN:-torch==2.13.0}
EXTRAS=${EXTRAS:-all}

# libseccomp backs the verifier's system-call filter; without it the verifier runs with a warning.
if ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq libseccomp2 >/dev/null
  else
    echo "setup: libseccomp.so.2 not found; install libseccomp2 for the verifier's seccomp layer" >&2
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"

# A bare `torch` requirement would pull a multi-GB CUDA build (PyPI's torch on Linux x86_64): install the
# CPU wheel first, unless a torch is already importable (a GPU user's own build in a
# --system-site-packages venv, say). The CPU wheel comes from a local wheel folder of pip's config
# (find-links) when one holds it, else from PyTorch's CPU index; PyPI's is the last resort.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if $PIP install --no-index --no-deps "$TORCH_CPU_PIN" 2>/dev/null; then
    $PIP install "$TORCH_CPU_PIN"  # its dependencies, from the configured indexes
  elif ! $PIP install --timeout 30 --retries 1 --index-url https://download.pytorch.org/whl/cpu \
      --extra-index-url https://pypi.org/simple "$TORCH_CPU_PIN"; then
    echo "setup: PyTorch's CPU index is unreachable; $TORCH_CPU_PIN from PyPI (on Linux x86_64 its CUDA build: a large download)" >&2
    $PIP install "$TORCH_CPU_PIN"
  fi
fi
$PIP install -e ".[$EXTRAS]"
echo "setup: ready ($("$VENV/bin/python" -c 'import torch, sys; print(f"python {sys.version.split()[0]}, torch {torch.__version__}")'))" >&2
