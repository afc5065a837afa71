#!/usr/bin/env bash
# tools/bench/soak.sh — a soak of the real server at twice its admission limit.
#
#   tools/bench/soak.sh [--minutes N] [--seed S]        (default 30 minutes)
#
# Starts build/blendserve serve (Release build; built here if missing) on a free
# loopback port with the embedded default plus a soak config (limits.max_requests 4,
# limits.max_queue 4, limits.max_request_seconds 60, server.max_body 1MiB, a data dir
# of its own), then runs tools/bench/soak.py against it: 16 clients (2 x (4 + 4)) sending a
# seeded mix of streaming, non-streaming, document, cancelled, disconnecting and
# hostile requests for N minutes. stdout: soak.py's one JSON report (requests by
# outcome, p50/p99 TTFT, RSS and descriptors over time, targets); progress on stderr;
# the server's log in the data dir. Exits 1 when a target is missed (soak.py's
# docstring lists them), 2 on a usage error.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MINUTES=30
SEED=1
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    *) echo "usage: tools/bench/soak.sh [--minutes N] [--seed S]" >&2; exit 2 ;;
  esac
done
if [ ! -x "$ROOT/build/blendserve" ]; then
  cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$ROOT/build" -j"$(nproc)" --target blendserve >&2
fi

DIR="$(mktemp -d "${TMPDIR:-/tmp}/blendserve-soak.XXXXXX")"
DRAIN=10
cat >"$DIR/soak.yaml" <<YAML
data_dir: $DIR/data
limits:
  max_requests: 4
  max_queue: 4
  max_request_seconds: 60
server:
  max_body: 1MiB
YAML
LOG="$DIR/server.log"
"$ROOT/build/blendserve" --config "$DIR/soak.yaml" serve --port 0 --drain-seconds "$DRAIN" 2>"$LOG" &
PID=$!
cleanup() {
  kill -KILL "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
}
trap cleanup EXIT
PORT=""
for _ in $(seq 1 600); do
  PORT="$(sed -n 's|.*serving on http://[^:]*:\([0-9]*\).*|\1|p' "$LOG" | head -n1)"
  [ -n "$PORT" ] && break
  kill -0 "$PID" 2>/dev/null || { cat "$LOG" >&2; echo "soak.sh: the server exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { echo "soak.sh: the server did not start" >&2; exit 1; }
echo "[soak] server pid $PID on port $PORT; log $LOG" >&2
set +e
python3 "$ROOT/tools/bench/soak.py" --port "$PORT" --pid "$PID" --minutes "$MINUTES" --admission 8 \
  --max-body 1048576 --drain-seconds "$DRAIN" --documents "$ROOT/tests/data/rag_qa_small.jsonl" --seed "$SEED"
RC=$?
set -e
wait "$PID" 2>/dev/null
SERVER_RC=$?
echo "[soak] server exited with $SERVER_RC" >&2
if [ "$RC" = 0 ] && [ "$SERVER_RC" != 0 ]; then
  echo "[soak] the server's exit status after SIGTERM was $SERVER_RC (tail of its log:)" >&2
  tail -n 20 "$LOG" >&2
  RC=1
fi
[ "$RC" = 0 ] && rm -rf "$DIR"
exit "$RC"
