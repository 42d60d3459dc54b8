#!/usr/bin/env bash
# Creates .venv (Python 3.11+) and installs SpecRouter into it; a no-op when nothing changed.
#   TORCH_SPEC   torch requirement to install first (default: torch==2.13.0). On a GPU machine, install
#                your CUDA build of torch into .venv first, or set TORCH_SPEC to it.
#   EXTRAS       package extras, e.g. "test" (default: none)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY' || { echo "SpecRouter needs Python 3.11 or newer (set PYTHON=...)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
extras="${EXTRAS:-}"
stamp=".venv/.specrouter-installed-$( (cat pyproject.toml; echo "$extras") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "installing ${TORCH_SPEC:-torch==2.13.0} ..." >&2
    .venv/bin/python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
  fi
  echo "installing specrouter${extras:+[$extras]} ..." >&2
  .venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
  rm -f .venv/.specrouter-installed-*
  touch "$stamp"
fi
