#!/usr/bin/env bash
# The README's first command: set up what serving needs (idempotent; tools/setup.sh
# --serve: no test tools), build, start the OpenAI-compatible server on the embedded
# default (CPU backend, RAM + SSD tiers, SmolLM2-135M-Instruct), answer one chat
# request through the HTTP API and print the answer's text, then keep serving in the
# foreground until Ctrl-C (which drains and stops it).
#   tools/serve.sh [blendserve serve options: --port P, --host H, ...]
#   BLENDSERVE_CONFIG=my.yaml tools/serve.sh      # a config on top of the defaults
#   BLENDSERVE_SHOW_JSON=1 tools/serve.sh         # print the response's JSON body too
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/setup.sh" --serve
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

QUESTION="What is the capital of France?"
echo "serve.sh: POST $URL/v1/chat/completions: $QUESTION" >&2
BODY="$(curl -sS "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  ${BLENDSERVE_API_KEY:+-H "Authorization: Bearer $BLENDSERVE_API_KEY"} -d '{
  "model": "SmolLM2-135M-Instruct",
  "messages": [{"role": "user", "content": "'"$QUESTION"'"}],
  "max_tokens": 32, "temperature": 0
}')"
[ "${BLENDSERVE_SHOW_JSON:-0}" = 1 ] && echo "$BODY"
# The answer as text (an error's message where the server refused).
python3 -c 'import json, sys
b = json.loads(sys.argv[1])
print(b["choices"][0]["message"]["content"] if "choices" in b else "error: " + b.get("error", {}).get("message", sys.argv[1]))' "$BODY"
echo "serve.sh: serving on $URL (Ctrl-C to stop)" >&2
wait "$PID"
