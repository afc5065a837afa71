#!/usr/bin/env bash
# tools/ci/fuzz_pasted_prompt.sh — build and run the libFuzzer target for the pasted-passage
# search (tests/fuzz/fuzz_pasted_prompt.cpp): message text with stored passages spliced
# in at every 0x01 byte must become a prompt that is the conversation byte for byte.
#
#   tools/ci/fuzz_pasted_prompt.sh [SECONDS] [extra libFuzzer flags...]
#
# Needs the model file (tools/setup.sh) for the real tokenizer. Builds and runs through
# tools/ci/fuzz_lib.sh; exits non-zero when the fuzzer finds a crash, leak or timeout.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_pasted_prompt "$@"

fuzz_seeds txt '%b' <<'SEEDS'
\x01\x01Where was he educated?
Context: \x01\x01\x01Question: who?
Passages:\n\x01\n\x01x
\x01\x01
plain text, nothing pasted\n\nsecond paragraph
\xff\xfe\x01\xc3\x28\x01
SEEDS

fuzz_run -max_len=1024
