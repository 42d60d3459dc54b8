#!/usr/bin/env bash
# Sets up SpecRouter with its test extras and runs the test suite. Extra arguments go to pytest.
#
# Test files run in parallel, one pytest process per core up to four (PYTEST_WORKERS sets the number; 0 or 1
# runs them in this process). A file's tests stay in one process (--dist loadfile), so a module's fixtures (a
# loaded pool, a local cluster) are built once. The processes, and the servers their tests start, compute on
# one thread each unless OMP_NUM_THREADS says otherwise: processes sharing the cores whose OpenMP teams spin
# on every core wait on each other, and on two cores ran the suite slower than one process did.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash scripts/setup.sh
cores=$(nproc 2>/dev/null || echo 1)
workers=${PYTEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
if (( workers > 1 )); then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    exec .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest "$@"
