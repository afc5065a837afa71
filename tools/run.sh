#!/usr/bin/env bash
# The README's first command: set up (idempotent), build, and answer one chat
# question with the embedded default (CPU backend, SmolLM2-135M-Instruct).
#   tools/run.sh ["question"] [more blendserve generate options]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/setup.sh"
cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$ROOT/build" -j"$(nproc)" --target blendserve blendctl
exec "$ROOT/build/blendserve" generate --chat --prompt "${1:-What is the capital of France?}" "${@:2}"
