#!/usr/bin/env bash
# tools/gpu/gpu_ab.sh — the GPU check with binaries built HERE (no compiler time on the lent
# machine) and the build before a change beside the build after it, on the same GPU in
# the same call (issue 39: "A/B on one GPU"). The lease is ~15 minutes, its start
# included: the GPU's minutes go to tests and benchmarks, not to nvcc.
#
# Here:   tools/gpu/gpu_ab.sh pack [BASE_BLENDCTL]
#           builds build-sm90/ (sm_90 only: the lent machines are Hopper) with the CUDA
#           tests and blendctl and packs them stripped as after/ beside BASE_BLENDCTL (a
#           blendctl of the commit before the change, built the same way, e.g. in a
#           `git worktree` of it) as before/ into gpu-carry/bins.tar.xz (xz: ~40 MiB of
#           binaries in ~5 MiB), and the runtime .deb files they need (gpu-debs/,
#           tools/gpu/fetch_gpu_debs.sh) into gpu-carry/debs/. gpu-carry/ is git-ignored;
#           ~31 MiB with the tree, under the tool's 64 MiB.
# There:  device tool run(command="GPU_AB_BUDGET_S=560 bash tools/gpu/gpu_ab.sh run",
#                         carry=["gpu-carry"], timeout_s=600)
#
# `run` unpacks the .debs with `dpkg -x` into /tmp/blendserve-deps (never into /), checks
# that the carried binaries start (a machine whose system libraries differ would show it
# here: then fall back to tools/gpu/gpu_check.sh, which builds there), then in the order of
# what matters, each step under `timeout` with what is left of GPU_AB_BUDGET_S:
#   1. the CUDA tests of the after build (ops, attention, backend, model; backend and
#      model again with the other decode-product choice);
#   2. compute-sanitizer racecheck and memcheck of the flash attention tests, racecheck
#      of the GEMV, kv_deviation and decode-attention tests (the kernels with shared
#      memory and barriers); memcheck of the op and backend tests after the benchmarks;
#   3. each benchmark of issue 39's targets with the after build, the before build and
#      the PyTorch peers (eager; decode also captured as CUDA graphs), one after another
#      on the same GPU: decode 1B (1 and 32 streams), prefill 8B (3072 and 8192
#      tokens), blend TTFT 8B (6 and 20 x 512 tokens from RAM; the default selection,
#      query-first, and the former one, deviation at 0.10, tagged after_deviation).
#   4. diagnostics: the Transformer's decode step alone at 1..64 rows (bench prefill
#      --decode-batches), and decode with the short products on the GEMV
#      (BLENDSERVE_CUDA_DECODE_GEMM=gemv) beside the default (cuBLAS padded to 64 rows).
#   5. last, with what is left of the budget: Nsight Systems' per-kernel sums (nsys, where
#      the machine has it) of a 32-row decode step and an 8192-token 8B prefill, as
#      $OUT/profile_*_cuda_gpu_kern_sum.csv: where the device time goes.
# GPU_AB_STEPS picks steps (default all): tests sanitize decode prefill ttft batches
# gemv profile; a later call on what changed since runs only those it names.
# Every benchmark line goes to $OUT/bench.jsonl tagged {"run": NAME, "engine":
# "after"|"before"|"torch"|"torch_graphs"}; tools/gpu/gpu_results.py turns that file into
# tools/gpu/results/<date>_<gpu>.jsonl (one line per target) and the GPU tables of
# tools/bench/RESULTS.md.
# $OUT also gets gpu_ab.json (each step's result and seconds), machine.txt and
# gpu_ab_logs.tgz (every step's log). Progress on stderr. Exit 0 when every step passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CARRY="$ROOT/gpu-carry"
MODE="${1:-}"

if [ "$MODE" = pack ]; then
  set -e
  BASE="${2:-}"
  cmake -S "$ROOT" -B "$ROOT/build-sm90" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  cmake --build "$ROOT/build-sm90" -j"$(nproc)" --target blendctl cuda_tests >&2
  rm -rf "$CARRY"
  local_bins=$(mktemp -d)
  mkdir -p "$local_bins/after" "$local_bins/before" "$CARRY/debs"
  for b in blendctl cuda_test_ops cuda_test_attention cuda_test_backend cuda_test_model; do
    [ -x "$ROOT/build-sm90/$b" ] && strip -o "$local_bins/after/$b" "$ROOT/build-sm90/$b"
  done
  if [ -n "$BASE" ]; then strip -o "$local_bins/before/blendctl" "$BASE"; fi
  # ~40 MiB of stripped binaries are ~6 MiB as xz: the carry limit is 64 MiB in all.
  tar -cJf "$CARRY/bins.tar.xz" -C "$local_bins" after before
  rm -rf "$local_bins"
  # The runtime libraries of our binaries that a bare machine lacks (Debian bookworm).
  for p in libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17 libyaml-cpp0.7 libcpp-httplib0.11 libbrotli1 \
           libdnnl2 libxxhash0 libicu72 libncurses6 libncursesw6 libtinfo6; do
    cp "$ROOT"/gpu-debs/"${p}"_*.deb "$CARRY/debs/"
  done
  # Where each build's source was: its binaries look for tests/data under that path.
  echo "$ROOT" >"$CARRY/after_root.txt"
  [ -n "$BASE" ] && (cd "$(dirname "$BASE")" && git rev-parse --show-toplevel) >"$CARRY/before_root.txt"
  git -C "$ROOT" rev-parse HEAD >"$CARRY/commit.txt"
  git -C "$ROOT" status --porcelain | grep -q . && echo "dirty" >>"$CARRY/commit.txt"
  du -sh "$CARRY" >&2
  exit 0
fi
[ "$MODE" = run ] || { echo "usage: tools/gpu/gpu_ab.sh pack [BASE_BLENDCTL] | run" >&2; exit 2; }

OUT="${OUT:-$ROOT/gpu-ab-out}"
LOGS="$OUT/logs"
PREFIX=/tmp/blendserve-deps
BUDGET="${GPU_AB_BUDGET_S:-0}"
START=$(date +%s)
mkdir -p "$OUT" "$LOGS"
log() { printf '[gpu-ab %4ds] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }
declare -A RESULT SECS
ORDER=()
finish() {
  local json="{\"gpu_ab\":\"done\",\"budget_s\":$BUDGET,\"seconds\":$(( $(date +%s) - START ))"
  local k
  for k in "${ORDER[@]}"; do
    json+=",\"$k\":\"${RESULT[$k]}\""
    [ -n "${SECS[$k]:-}" ] && json+=",\"${k}_s\":${SECS[$k]}"
  done
  json+=",\"gpu\":\"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\""
  json+=",\"driver\":\"$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)\""
  json+=",\"commit\":\"$(head -1 "$CARRY/commit.txt" 2>/dev/null)\"}"
  echo "$json" | tee "$OUT/gpu_ab.json"
  tar -czf "$OUT/gpu_ab_logs.tgz" -C "$LOGS" . 2>/dev/null && rm -rf "$LOGS"
}
trap finish EXIT

{ nvidia-smi; nvcc --version; lscpu | grep -E 'Model name|^CPU\(s\)'; cat /etc/os-release;
  python3 -c 'import torch; print("torch", torch.__version__)'; } >"$OUT/machine.txt" 2>&1
log "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

source "$ROOT/tools/gpu/gpu_step.sh"  # step NAME CAP_S MIN_S COMMAND...

# 1. the runtime libraries, into the prefix; do the binaries start?
mkdir -p "$PREFIX"
for f in "$CARRY"/debs/*.deb; do dpkg -x "$f" "$PREFIX" 2>/dev/null || { log "dpkg -x $f failed"; exit 2; }; done
CUDA_LIB=
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64; do
  [ -e "$d/libcublas.so.13" ] && { CUDA_LIB=$d; break; }
done
[ -n "$CUDA_LIB" ] || CUDA_LIB=$(dirname "$(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/lib/x86_64-linux-gnu:${CUDA_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "libcublas from $CUDA_LIB"
mkdir -p /tmp/blendserve-bins
tar -xJf "$CARRY/bins.tar.xz" -C /tmp/blendserve-bins || { log "unpacking the binaries failed"; exit 2; }
AFTER=/tmp/blendserve-bins/after BEFORE=/tmp/blendserve-bins/before
# The binaries find tests/data under the source path they were built from: that path
# here too (a link to this checkout's tests/), where it is not this checkout.
for f in after_root before_root; do
  src=$(cat "$CARRY/$f.txt" 2>/dev/null) || continue
  if [ -n "$src" ] && [ "$src" != "$ROOT" ] && [ ! -e "$src/tests" ]; then
    mkdir -p "$src" && ln -s "$ROOT/tests" "$src/tests"
  fi
done
if ! "$AFTER/blendctl" --help >"$LOGS/start.log" 2>&1; then
  log "the carried blendctl does not start here:"; tail -5 "$LOGS/start.log" >&2
  ldd "$AFTER/blendctl" | grep 'not found' >&2
  exit 3
fi

STEPS="${GPU_AB_STEPS:-tests sanitize decode prefill ttft batches gemv profile}"
want() { [[ " $STEPS " == *" $1 "* ]]; }

# 2. tests, then the sanitizers on the kernels that changed
if want tests; then
  for t in cuda_test_ops cuda_test_attention cuda_test_backend cuda_test_model; do
    [ -x "$AFTER/$t" ] && step "$t" 240 20 "$AFTER/$t"
  done
  # The short products on the GEMV (the other choice): the backend's and the model's tests.
  for t in cuda_test_backend cuda_test_model; do
    [ -x "$AFTER/$t" ] && BLENDSERVE_CUDA_DECODE_GEMM=gemv step "${t}_gemv" 120 20 "$AFTER/$t"
  done
fi
SAN=()
command -v compute-sanitizer >/dev/null 2>&1 && SAN=(compute-sanitizer --report-api-errors no --error-exitcode 1)
[ ${#SAN[@]} -gt 0 ] || log "compute-sanitizer not found"
SMALL=--gtest_filter=-*AtLargeSizes*  # the timed large cases would crawl under the tools
if [ ${#SAN[@]} -gt 0 ] && want sanitize; then  # the kernels with shared memory and barriers first
  step racecheck_attention 60 20 "${SAN[@]}" --tool racecheck "$AFTER/cuda_test_attention" "$SMALL"
  step memcheck_attention 60 20 "${SAN[@]}" --tool memcheck "$AFTER/cuda_test_attention" "$SMALL"
  step racecheck_ops 60 20 "${SAN[@]}" --tool racecheck "$AFTER/cuda_test_ops" \
    --gtest_filter='*Gemv*:*KvDeviation*:*AttentionRows*'
fi

# 3. the benchmarks: each run's JSON lines tagged with the run and the engine
TORCH=false
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && TORCH=true
bench() {  # name engine cap command...
  local name=$1 engine=$2 cap=$3; shift 3
  step "${name}_${engine}" "$cap" 30 "$@" || return 0
  python3 - "$LOGS/${name}_${engine}.log" "$name" "$engine" >>"$OUT/bench.jsonl" <<'EOF'
import json, sys
path, run, engine = sys.argv[1:4]
for line in open(path, errors="replace"):
    line = line.strip()
    if line.startswith("{"):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "engine" in j:  # the peer's own field ("torch"): kept under another name
            j["engine_own"] = j.pop("engine")
        print(json.dumps({"run": run, "engine": engine, **j}))
EOF
}
DEC=(--model random:llama-3.2-1b bench decode --streams 1 32 --tokens 64 --prompt-tokens 256 --repeats 2)
PRE=(--model random:llama-3.1-8b bench prefill --lengths 3072 8192 --repeats 2 --decode-context 512 --decode-tokens 8
     --decode-batches 1)
TT6=(--model random:llama-3.1-8b bench ttft --tier ram --chunks 6 --chunk-tokens 512 --requests 2)
TT20=(--model random:llama-3.1-8b bench ttft --tier ram --chunks 20 --chunk-tokens 512 --requests 2)
PEER="$ROOT/tools/gpu/peer_torch.py"
BAT=(--model random:llama-3.2-1b bench prefill --lengths 16 --repeats 1 --decode-context 256 --decode-tokens 16
     --decode-batches 1 8 16 32 64)
if want batches; then  # the Transformer's decode step alone (no runtime), by rows
  bench batches_1b after 60 "$AFTER/blendctl" --device cuda "${BAT[@]}"
  want gemv && BLENDSERVE_CUDA_DECODE_GEMM=gemv bench batches_1b after_gemv 60 "$AFTER/blendctl" --device cuda \
    "${BAT[@]}"
fi
if want gemv; then
  BLENDSERVE_CUDA_DECODE_GEMM=gemv bench decode_1b after_gemv 120 "$AFTER/blendctl" --device cuda "${DEC[@]}"
fi
if want decode; then
bench decode_1b after 120 "$AFTER/blendctl" --device cuda "${DEC[@]}"
# What the decode-step CUDA graphs alone are worth: the after build with them off.
BLENDSERVE_CUDA_GRAPHS=0 bench decode_1b after_nographs 120 "$AFTER/blendctl" --device cuda "${DEC[@]}"
[ -x "$BEFORE/blendctl" ] && bench decode_1b before 120 "$BEFORE/blendctl" --device cuda "${DEC[@]}"
fi
if $TORCH && want decode; then
  bench decode_1b torch 120 python3 "$PEER" decode --model random:llama-3.2-1b --streams 1 32 --tokens 64 \
    --prompt-tokens 256 --repeats 2
  bench decode_1b torch_graphs 150 python3 "$PEER" decode --cuda-graphs --model random:llama-3.2-1b --streams 1 32 \
    --tokens 64 --prompt-tokens 256 --repeats 2
fi
if want ttft; then  # before the prefill when a later call runs both: what changed for TTFT is newer
  bench ttft_8b_6 after 120 "$AFTER/blendctl" --device cuda "${TT6[@]}"
  bench ttft_8b_20 after 120 "$AFTER/blendctl" --device cuda "${TT20[@]}"
  # The former default rule (deviation at 0.10) beside the default (query-first at 0.16):
  # on a GPU the question's pass over every layer and its scoring per layer are new work,
  # and its recompute waits for the whole load. gpu_results.py collect --ours after_deviation.
  bench ttft_8b_6 after_deviation 120 "$AFTER/blendctl" --device cuda "${TT6[@]}" --selection deviation --ratio 0.10
  bench ttft_8b_20 after_deviation 120 "$AFTER/blendctl" --device cuda "${TT20[@]}" --selection deviation --ratio 0.10
fi
if want prefill; then
  bench prefill_8b after 150 "$AFTER/blendctl" --device cuda "${PRE[@]}"
  [ -x "$BEFORE/blendctl" ] && bench prefill_8b before 150 "$BEFORE/blendctl" --device cuda "${PRE[@]}"
  $TORCH && bench prefill_8b torch 150 python3 "$PEER" prefill --model random:llama-3.1-8b --tokens 3072 8192 \
    --repeats 2
fi
if [ ${#SAN[@]} -gt 0 ] && want sanitize; then
  step memcheck_ops 60 20 "${SAN[@]}" --tool memcheck "$AFTER/cuda_test_ops"
  step memcheck_backend 60 20 "${SAN[@]}" --tool memcheck "$AFTER/cuda_test_backend"
fi
[ -x "$BEFORE/blendctl" ] && want ttft && bench ttft_8b_6 before 120 "$BEFORE/blendctl" --device cuda "${TT6[@]}"
[ -x "$BEFORE/blendctl" ] && want ttft && bench ttft_8b_20 before 120 "$BEFORE/blendctl" --device cuda "${TT20[@]}"

# 5. where the device time goes, last (only with budget left): Nsight Systems' per-kernel
# sums of the 1B decode step at 32 rows (the target furthest from PyTorch) and of the 8B
# prefill at 8192 tokens, as CSV in $OUT (the .nsys-rep files stay on the machine).
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if want profile; then
  if [ -n "$NSYS" ]; then
    profile() {  # name command...: the kernels' summary as $OUT/profile_NAME_cuda_gpu_kern_sum.csv
      local name=$1; shift
      "$NSYS" profile --trace=cuda --sample=none --cpuctxsw=none --force-overwrite true -o "/tmp/profile_$name" "$@" &&
        "$NSYS" stats --report cuda_gpu_kern_sum --format csv --force-export true -o "$OUT/profile_$name" \
          "/tmp/profile_$name.nsys-rep"
    }
    step profile_decode_1b_32 90 45 profile decode_1b_32 "$AFTER/blendctl" --device cuda --model random:llama-3.2-1b \
      bench prefill --lengths 16 --repeats 1 --decode-context 256 --decode-tokens 16 --decode-batches 32
    step profile_prefill_8b_8192 120 60 profile prefill_8b_8192 "$AFTER/blendctl" --device cuda \
      --model random:llama-3.1-8b bench prefill --lengths 8192 --repeats 1 --decode-context 512 --decode-tokens 2 \
      --decode-batches 1
  else
    log "nsys not found: no per-kernel profile"
  fi
fi

status=0
for k in "${ORDER[@]}"; do [ "${RESULT[$k]}" = pass ] || status=1; done
exit $status
