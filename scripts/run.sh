#!/usr/bin/env bash
# Sets up SpecRouter and generates a continuation of a prompt with the shipped demo pool.
#   bash scripts/run.sh ["PROMPT"] [specrouter generate options...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
prompt="${1:-def fibonacci(n):}"
shift || true
exec .venv/bin/specrouter generate "$prompt" "$@"
