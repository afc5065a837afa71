#!/usr/bin/env bash
# tools/ci/fuzz_config.sh — build and run the libFuzzer target for the YAML loaders
# (tests/fuzz/fuzz_config.cpp): the runtime config (first byte even) and the cluster
# file (odd) must parse into values in their documented ranges or throw ConfigError.
#
#   tools/ci/fuzz_config.sh [SECONDS] [extra libFuzzer flags...]
#
# Seeds: configs/default.yaml, configs/cluster.example.yaml and a few small edge cases.
# Builds and runs through tools/ci/fuzz_lib.sh; exits non-zero when the fuzzer finds a
# crash, leak, timeout or an exception other than ConfigError.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
fuzz_build fuzz_config "$@"

{ printf '\000'; cat "$ROOT/configs/default.yaml"; } >"$CORPUS/seed_default"
{ printf '\001'; cat "$ROOT/configs/cluster.example.yaml"; } >"$CORPUS/seed_cluster"
printf '\000limits: {max_requests: 2, restart_window: 5s}\n' >"$CORPUS/seed_limits"
printf '\000tiers: {ssd: {budget: 1.5GiB, throttle: 100MB}}\nblend: {check_layers: [1, 3], schedule: [0.5]}\n' \
  >"$CORPUS/seed_tiers"
printf '\000{}' >"$CORPUS/seed_empty"
printf '\001cluster: {name: c, secret: 0123456789abcdef}\nnodes: [{name: f, role: frontend, host: 127.0.0.1, port: 1, http_port: 2}, {name: w, role: worker, host: 127.0.0.1, port: 3, http_port: 4}]\n' \
  >"$CORPUS/seed_small_cluster"

fuzz_dict <<'DICT_EOF'
"nodes"
"cluster"
"defaults"
"role"
"frontend"
"worker"
"storage"
"tiers"
"ssd"
"ram"
"remote"
"blend"
"limits"
"server"
"device"
"model"
"GiB"
"ms"
"env:"
"&a"
"*a"
"<<"
"!!binary"
"~"
DICT_EOF

fuzz_run -dict="$DICT" -max_len=16384 -rss_limit_mb=2048 -timeout=10
