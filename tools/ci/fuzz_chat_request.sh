#!/usr/bin/env bash
# tools/ci/fuzz_chat_request.sh — build and run the libFuzzer target for the HTTP
# chat-completion body parser (tests/fuzz/fuzz_chat_request.cpp).
#
#   tools/ci/fuzz_chat_request.sh [SECONDS] [extra libFuzzer flags...]
#
# Builds and runs through tools/ci/fuzz_lib.sh (build-asan: clang, ASan+UBSan,
# coverage hooks); seeds a corpus with valid and near-valid request bodies and a JSON
# dictionary. Exits non-zero when the fuzzer finds a crash, leak or timeout; the
# reproducer is in build-asan/fuzz_chat_request_artifacts/.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_chat_request "$@"

fuzz_seeds json '%s' <<'SEEDS'
{"model":"m","messages":[{"role":"user","content":"hi"}]}
{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":8,"temperature":0.5,"top_p":0.9,"seed":1,"stop":["a","b"],"n":1}
{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"doc"},{"type":"text","text":"q"}]}],"mode":"blend","ratio":0.15,"top_k":3}
{"model":"m","messages":[{"role":"developer","content":"x"},{"role":"user","content":"q"}],"documents":["a","b"],"max_completion_tokens":4}
{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"text"},"logprobs":false,"presence_penalty":0}
{"text":"a document"}
SEEDS

fuzz_dict <<'DICT_END'
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

fuzz_run -dict="$DICT" -max_len=8192 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
