#!/usr/bin/env bash
# The README's first command: set up (idempotent), build, start the OpenAI-compatible
# server on the embedded default (CPU backend, RAM + SSD tiers, SmolLM2-135M-Instruct),
# answer one chat request through the HTTP API to show it works, then keep serving in
# the foreground until Ctrl-C (which drains and stops it).
#   tools/serve.sh [blendserve serve options: --port P, --host H, ...]
#   BLENDSERVE_CONFIG=my.yaml tools/serve.sh      # a config on top of the defaults
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/setup.sh"
cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$ROOT/build" -j"$(nproc)" --target blendserve blendctl

LOG="$(mktemp "${TMPDIR:-/tmp}/blendserve-serve.XXXXXX")"
CONFIG_ARGS=()
[ -n "${BLENDSERVE_CONFIG:-}" ] && CONFIG_ARGS=(--config "$BLENDSERVE_CONFIG")
"$ROOT/build/blendserve" "${CONFIG_ARGS[@]}" serve "$@" 2> >(tee "$LOG" >&2) &
PID=$!
trap 'kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -f "$LOG"' EXIT
trap 'exit 130' INT TERM

URL=""
for _ in $(seq 1 600); do
  URL="$(sed -n 's|.*serving on \(http://[^ ]*\).*|\1|p' "$LOG" | head -n1)"
  [ -n "$URL" ] && break
  kill -0 "$PID" 2>/dev/null || { echo "serve.sh: the server exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$URL" ] || { echo "serve.sh: the server did not start" >&2; exit 1; }

echo "serve.sh: POST $URL/v1/chat/completions" >&2
curl -sS "$URL/v1/chat/completions" -H 'Content-Type: application/json' ${BLENDSERVE_API_KEY:+-H "Authorization: Bearer $BLENDSERVE_API_KEY"} -d '{
  "model": "SmolLM2-135M-Instruct",
  "messages": [{"role": "user", "content": "What is the capital of France?"}],
  "max_tokens": 32, "temperature": 0
}'
echo
echo "serve.sh: serving on $URL (Ctrl-C to stop)" >&2
wait "$PID"
