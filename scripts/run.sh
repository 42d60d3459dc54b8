#!/usr/bin/env bash
# Sets up SpecRouter, starts the embedded default (a profiler, one worker per demo-pool model and a
# router, as separate processes on localhost), answers one prompt through the router, and stops.
#   bash scripts/run.sh ["PROMPT"] [specrouter generate options...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
prompt="${1:-def fibonacci(n):}"
shift || true

out=$(mktemp)
.venv/bin/specrouter up --port 0 >"$out" &
cluster=$!
trap 'kill -INT $cluster 2>/dev/null; wait $cluster 2>/dev/null; rm -f "$out"' EXIT
echo "starting the local cluster (logs in .cache/logs) ..." >&2
for _ in $(seq 600); do
  grep -q "router listening on" "$out" && break
  kill -0 "$cluster" 2>/dev/null || { echo "the local cluster failed to start" >&2; exit 1; }
  sleep 0.5
done
address=$(sed -n 's/^router listening on //p' "$out")
[ -n "$address" ] || { echo "the local cluster did not come up in time" >&2; exit 1; }
.venv/bin/specrouter generate --router "$address" "$prompt" "$@"
