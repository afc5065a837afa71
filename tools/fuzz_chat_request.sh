#!/usr/bin/env bash
# tools/fuzz_chat_request.sh — build and run the libFuzzer target for the HTTP
# chat-completion body parser (tests/fuzz/fuzz_chat_request.cpp).
#
#   tools/fuzz_chat_request.sh [SECONDS] [extra libFuzzer flags...]
#
# Same build directory and flags as tools/fuzz_gguf.sh (build-asan: clang, ASan+UBSan,
# coverage hooks); seeds a corpus with valid and near-valid request bodies and a JSON
# dictionary. Exits non-zero when the fuzzer finds a crash, leak or timeout; the
# reproducer is in build-asan/fuzz_chat_request_artifacts/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_TO_RUN="${1:-60}"
shift || true
BUILD="${BUILD_DIR:-$ROOT/build-asan}"
JOBS="${JOBS:-2}"

log() { printf '[fuzz_chat_request] %s\n' "$*"; }
case "$SECONDS_TO_RUN" in
  ''|*[!0-9]*) echo "usage: $0 [SECONDS] [libFuzzer flags...]" >&2; exit 2 ;;
esac

mkdir -p "$BUILD"
# shellcheck disable=SC2086
CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLENDSERVE_FUZZ=ON -DBLENDSERVE_SANITIZE=ON \
  ${BLENDSERVE_CMAKE_ARGS:-} >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log" >&2; log "cmake configure failed"; exit 1; }
log "building fuzz_chat_request in $BUILD"
cmake --build "$BUILD" --target fuzz_chat_request -j "$JOBS"

CORPUS="$BUILD/fuzz_chat_request_corpus"
ARTIFACTS="$BUILD/fuzz_chat_request_artifacts"
mkdir -p "$CORPUS" "$ARTIFACTS"
i=0
while IFS= read -r seed; do
  printf '%s' "$seed" >"$CORPUS/seed_$i.json"
  i=$((i + 1))
done <<'SEEDS'
{"model":"m","messages":[{"role":"user","content":"hi"}]}
{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":8,"temperature":0.5,"top_p":0.9,"seed":1,"stop":["a","b"],"n":1}
{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"doc"},{"type":"text","text":"q"}]}],"mode":"blend","ratio":0.15,"top_k":3}
{"model":"m","messages":[{"role":"developer","content":"x"},{"role":"user","content":"q"}],"documents":["a","b"],"max_completion_tokens":4}
{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"text"},"logprobs":false,"presence_penalty":0}
{"text":"a document"}
SEEDS

DICT="$BUILD/fuzz_chat_request.dict"
cat >"$DICT" <<'DICT_END'
"\"model\""
"\"messages\""
"\"role\""
"\"content\""
"\"user\""
"\"system\""
"\"assistant\""
"\"type\""
"\"text\""
"\"documents\""
"\"stream\""
"\"stream_options\""
"\"include_usage\""
"\"max_tokens\""
"\"temperature\""
"\"stop\""
"\"mode\""
"\"ratio\""
"null"
"true"
"1e309"
"-0"
"\"\\u0000\""
"\"\\ud800\""
DICT_END

log "fuzzing for ${SECONDS_TO_RUN}s (corpus $CORPUS)"
set +e
"$BUILD/fuzz_chat_request" -max_total_time="$SECONDS_TO_RUN" -artifact_prefix="$ARTIFACTS/" -dict="$DICT" \
  -max_len=8192 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "$@" "$CORPUS"
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
  log "FAILED (exit $rc); reproducers in $ARTIFACTS:"
  ls -l "$ARTIFACTS" >&2 || true
  exit "$rc"
fi
log "no crashes in ${SECONDS_TO_RUN}s"
