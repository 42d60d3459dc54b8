#!/usr/bin/env bash
# Sets up SpecRouter with its test extras and runs the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
