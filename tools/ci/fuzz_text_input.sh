#!/usr/bin/env bash
# tools/ci/fuzz_text_input.sh — build and run the libFuzzer target for the tokenizer and
# the chat template (tests/fuzz/fuzz_text_input.cpp) with SmolLM2's real vocabulary:
# any bytes (invalid UTF-8, control tokens in the text, NULs, up to 16 KiB; two
# 256 KiB texts once at start) tokenize into the vocabulary, decode back (valid UTF-8
# exactly), stream valid UTF-8, and render a conversation with every message in it;
# and the same bytes through Gemma 3's SentencePiece vocabulary (valid UTF-8 comes back
# exactly).
#
#   tools/ci/fuzz_text_input.sh [SECONDS] [extra libFuzzer flags...]
#
# Needs the model files (tools/setup.sh: SmolLM2 and Gemma 3). Builds and runs through tools/ci/fuzz_lib.sh;
# exits non-zero when the fuzzer finds a crash, leak or timeout (-timeout=10 s per
# input: a tokenizer that turns superlinear on a long input fails here).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_text_input "$@"

fuzz_seeds txt '%b' <<'SEEDS'
Which river flows through Basel? Answer briefly.
You are a helpful assistant.\000What is 2+2?\000Four.\000And 3+3?
<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n
caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac \xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87
\xff\xfe\xc3\x28\xed\xa0\x80\xf4\x90\x80\x80\xc0\xaf
   \t\t\n\n\r\n    spaces   and\ttabs
SEEDS
# A long input: 16 KiB of one repeated word (the merge loop's worst case is long runs).
head -c 16384 < <(yes 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' | tr -d '\n') >"$CORPUS/seed_long.txt"

fuzz_run -max_len=16384 -rss_limit_mb=2048 -timeout=10
