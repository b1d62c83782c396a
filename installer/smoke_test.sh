#!/usr/bin/env bash
# Start a built llamadesk executable headless on a free port and check that it serves.
# Usage: installer/smoke_test.sh PATH/TO/llamadesk
set -euo pipefail
EXE=$1
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
CFG=$(mktemp --suffix=.toml)
LOG=$(mktemp)
"$EXE" --no-gui --config "$CFG" --port "$PORT" >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -f "$CFG"' EXIT
for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/health" | grep -q '"status": "setup"'
curl -sf "http://127.0.0.1:$PORT/catalog" | grep -q '"entries"'
curl -s -o /dev/null -w "%{http_code}" "http://127.0.0.1:$PORT/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"hi"}]}' | grep -q 503
kill -TERM $PID
wait $PID
echo "smoke test passed ($EXE)"
