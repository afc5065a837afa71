#!/usr/bin/env bash
# tools/ci/fuzz_chat_template.sh — build and run the libFuzzer target for chat templates'
# Jinja (tests/fuzz/fuzz_chat_template.cpp: model/jinja_template.h over llama.cpp's
# engine): any bytes as a template parse or are refused, a parsed one renders a fixed
# conversation or refuses it, never a crash or a hang. Seeded with the 70 real
# templates of models/llama.cpp/templates (tools/setup.sh).
#
#   tools/ci/fuzz_chat_template.sh [SECONDS] [extra libFuzzer flags...]
#
# Exits non-zero when the fuzzer finds a crash, leak or timeout (-timeout=10 s per input).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_chat_template "$@"

TEMPLATES="$ROOT/models/llama.cpp/templates"
[ -d "$TEMPLATES" ] && cp -n "$TEMPLATES"/*.jinja "$CORPUS"/ 2>/dev/null || true
printf '%s' '{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}' \
  >"$CORPUS/seed_minimal.jinja"

fuzz_run -max_len=16384 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
