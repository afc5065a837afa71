#!/usr/bin/env bash
# tools/bench/bench_vs_llamacpp.sh — side-by-side CPU benchmark of llama.cpp and
# blendserve on the same GGUF with the same thread count, in one run.
#
#   tools/bench/bench_vs_llamacpp.sh [--model PATH] [--threads N] [--repeats N]
#
#   --model PATH   GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf;
#                  tools/setup.sh is run first if that default is missing)
#   --threads N    threads for both engines (default: nproc)
#   --repeats N    repetitions per test (default: 3)
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  pin the llama-cpp-python sdist (e.g. 0.3.36);
#                             only used when llama.cpp is not built yet
#   LLAMACPP_TOOL             llama-bench (default) or batched-bench
#
# What it does:
#   1. Once (skipped when the binary exists): downloads the llama-cpp-python
#      source distribution from PyPI with
#        python3 -m pip download --no-deps --no-binary :all: llama-cpp-python
#      unpacks it under build-llamacpp/ and builds only the llama-bench target
#      of its vendored llama.cpp (vendor/llama.cpp): Release, GGML_NATIVE=ON,
#      static libs, no GPU, no curl/openssl, `nice -n 19` and -j1.  Nothing is
#      cloned; PyPI is the only network source.  The llama-cpp-python version
#      and the build time are kept in build-llamacpp/llama-cpp-python.version
#      and build-llamacpp/build-seconds.<target>.
#   2. llama.cpp: llama-bench -p 512,3072 -n 128 -b 3072 -ub 512 -t N -r R -o json
#      (prefill 512/3072, decode 128 from an empty context), plus
#      llama-bench -p 0 -n 128 -d 512 (decode 128 after a 512-token context,
#      the same setting as blendserve's decode measurement).
#   3. blendserve: OMP_NUM_THREADS=N build/blendctl --model M bench prefill
#      --lengths 512 3072 --repeats R --decode-tokens 128 (build/blendctl is
#      built first if missing), and a second run for decode from a 1-token
#      prompt (--decode-context 1); only prefill/decode rows are kept.
#   4. Ratio rows blendserve/llama.cpp (prefill 512, prefill 3072, decode after a
#      512-token context and from an empty one) and
#      one row describing the CPU, thread count and llama-cpp-python version.
#
# Output: JSON lines on stdout only, e.g.
#   {"engine":"llama.cpp","test":"prefill","tokens":512,"tokens_per_s":...}
#   {"engine":"blendserve","test":"decode","tokens":128,"tokens_per_s":...}
#   {"ratio":"blendserve/llama.cpp","test":"prefill","tokens":512,"value":...}
#   {"cpu":"...","flags":"avx2 ...","threads":2,"llama_cpp_python":"0.3.36"}
# Progress and build logs go to stderr.  If blendserve cannot be built or run,
# an {"engine":"blendserve","error":...} row is printed instead of its rows.
# Exit status is non-zero only when the llama.cpp side fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEFAULT_MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
LCPP_DIR="$ROOT/build-llamacpp"
LCPP_BUILD="$LCPP_DIR/build"
LCPP_VERSION_FILE="$LCPP_DIR/llama-cpp-python.version"
LCPP_TOOL="${LLAMACPP_TOOL:-llama-bench}"
case "$LCPP_TOOL" in
  llama-bench|batched-bench) ;;
  *) echo "LLAMACPP_TOOL must be llama-bench or batched-bench" >&2; exit 2 ;;
esac

MODEL=""
THREADS="$(nproc)"
REPEATS=3

log() { printf '[bench-vs-llamacpp] %s\n' "$*" >&2; }
die() { printf '[bench-vs-llamacpp] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="${2:?--model needs a path}"; shift 2 ;;
    --model=*) MODEL="${1#*=}"; shift ;;
    --threads) THREADS="${2:?--threads needs a number}"; shift 2 ;;
    --threads=*) THREADS="${1#*=}"; shift ;;
    --repeats) REPEATS="${2:?--repeats needs a number}"; shift 2 ;;
    --repeats=*) REPEATS="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage; die "unknown argument: $1" ;;
  esac
done
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer"
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "--repeats must be a positive integer"

# ------------------------------------------------------------------- model
if [ -z "$MODEL" ]; then
  MODEL="$DEFAULT_MODEL"
  if [ ! -f "$MODEL" ]; then
    log "model missing, running tools/setup.sh"
    "$ROOT/tools/setup.sh" >&2 || die "tools/setup.sh failed"
  fi
fi
[ -f "$MODEL" ] || die "model not found: $MODEL"
MODEL="$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")"
log "model $MODEL, threads $THREADS, repeats $REPEATS"
LOAD_START="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)"
if awk -v l="$LOAD_START" 'BEGIN { exit !(l > 0.5) }'; then
  log "WARNING: 1-min load average is $LOAD_START before starting; other processes on the"
  log "WARNING: CPU make the numbers unreliable (llama.cpp's spinning threadpool suffers most)"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-vs-llamacpp.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# ------------------------------------------------- llama.cpp (built once)
if [ "$LCPP_TOOL" = llama-bench ]; then
  LCPP_TARGET=llama-bench
else
  LCPP_TARGET=llama-batched-bench
fi
LCPP_BIN="$LCPP_BUILD/bin/$LCPP_TARGET"

build_llamacpp() {
  mkdir -p "$LCPP_DIR/dl"
  local spec="llama-cpp-python"
  [ -n "${LLAMA_CPP_PYTHON_VERSION:-}" ] && spec="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  shopt -s nullglob
  local sdists=("$LCPP_DIR"/dl/llama_cpp_python-*.tar.gz)
  shopt -u nullglob
  if [ -n "${LLAMA_CPP_PYTHON_VERSION:-}" ]; then
    sdists=()
    [ -f "$LCPP_DIR/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" ] &&
      sdists=("$LCPP_DIR/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz")
  fi
  if [ "${#sdists[@]}" -eq 0 ]; then
    log "downloading the $spec source distribution from PyPI"
    python3 -m pip download --no-deps --no-binary :all: --disable-pip-version-check \
      --no-input "$spec" -d "$LCPP_DIR/dl" >&2 || die "pip download $spec failed"
    shopt -s nullglob
    sdists=("$LCPP_DIR"/dl/llama_cpp_python-*.tar.gz)
    shopt -u nullglob
  fi
  [ "${#sdists[@]}" -ge 1 ] || die "no llama_cpp_python-*.tar.gz in $LCPP_DIR/dl"
  # newest version if several were downloaded over time
  local sdist
  sdist="$(printf '%s\n' "${sdists[@]}" | sort -V | tail -n1)"
  local version
  version="$(basename "$sdist" .tar.gz)"; version="${version#llama_cpp_python-}"
  local src="$LCPP_DIR/src/llama_cpp_python-$version"
  if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    log "unpacking $(basename "$sdist")"
    rm -rf "$src"; mkdir -p "$LCPP_DIR/src"
    tar xzf "$sdist" -C "$LCPP_DIR/src" || die "cannot unpack $sdist"
  fi
  local lsrc="$src/vendor/llama.cpp"
  [ -f "$lsrc/CMakeLists.txt" ] || die "$sdist has no vendor/llama.cpp"
  if [ "$LCPP_TARGET" = llama-bench ] && [ ! -d "$lsrc/tools/llama-bench" ] &&
     [ ! -d "$lsrc/examples/llama-bench" ]; then
    die "vendored llama.cpp $version has no llama-bench; rerun with LLAMACPP_TOOL=batched-bench"
  fi

  log "building llama.cpp $LCPP_TARGET from llama-cpp-python $version (one time, ~15-30 min on 2 cores at nice 19, -j1)"
  local t0=$SECONDS
  local common=(-S "$lsrc" -B "$LCPP_BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF
    -DGGML_OPENCL=OFF -DGGML_BLAS=OFF -DGGML_RPC=OFF)
  if ! nice -n 19 cmake "${common[@]}" -DBUILD_SHARED_LIBS=OFF >&2; then
    log "configure with BUILD_SHARED_LIBS=OFF failed, retrying with shared libs"
    rm -rf "$LCPP_BUILD"
    nice -n 19 cmake "${common[@]}" -DBUILD_SHARED_LIBS=ON >&2 || die "llama.cpp cmake configure failed"
  fi
  nice -n 19 cmake --build "$LCPP_BUILD" --target "$LCPP_TARGET" -j1 >&2 ||
    die "llama.cpp build of $LCPP_TARGET failed"
  [ -x "$LCPP_BIN" ] || die "build finished but $LCPP_BIN is missing"
  echo "$version" > "$LCPP_VERSION_FILE"
  echo $((SECONDS - t0)) > "$LCPP_DIR/build-seconds.$LCPP_TARGET"
  log "llama.cpp built in $((SECONDS - t0)) s"
}

LCPP_OK=1
if [ -x "$LCPP_BIN" ]; then
  log "llama.cpp $LCPP_TARGET already built ($LCPP_BIN), skipping build"
else
  # run in a subshell so that a failed build is reported, not fatal to blendserve
  ( build_llamacpp ) || LCPP_OK=0
fi
LCPP_PY_VERSION="$(cat "$LCPP_VERSION_FILE" 2>/dev/null || echo unknown)"

# ------------------------------------------------------------ run llama.cpp
: > "$WORK/llamacpp.jsonl"
run_llamabench() {
  log "running llama-bench: pp512, pp3072, tg128 (threads $THREADS, repeats $REPEATS)"
  "$LCPP_BIN" -m "$MODEL" -p 512,3072 -n 128 -b 3072 -ub 512 -t "$THREADS" \
    -r "$REPEATS" -o json > "$WORK/lb_main.json" 2> "$WORK/lb_main.err" || {
    cat "$WORK/lb_main.err" >&2; return 1; }
  log "running llama-bench: tg128 after a 512-token context"
  "$LCPP_BIN" -m "$MODEL" -p 0 -n 128 -d 512 -t "$THREADS" \
    -r "$REPEATS" -o json > "$WORK/lb_depth.json" 2> "$WORK/lb_depth.err" || {
    cat "$WORK/lb_depth.err" >&2; return 1; }
  python3 - "$WORK/lb_main.json" "$WORK/lb_depth.json" > "$WORK/llamacpp.jsonl" <<'PY'
import json, sys
rows = []
for path in sys.argv[1:]:
    with open(path) as f:
        rows += json.load(f)
for r in rows:
    n_p, n_g, depth = int(r.get("n_prompt", 0)), int(r.get("n_gen", 0)), int(r.get("n_depth", 0))
    if n_p > 0 and n_g == 0:
        test, tokens = "prefill", n_p
    elif n_g > 0 and n_p == 0:
        test, tokens = "decode", n_g
    else:
        continue
    out = {"engine": "llama.cpp", "test": test, "tokens": tokens,
           "tokens_per_s": r["avg_ts"], "stddev_tokens_per_s": r.get("stddev_ts"),
           "context": depth, "threads": r.get("n_threads"),
           "repeats": len(r.get("samples_ts") or []),
           "n_batch": r.get("n_batch"), "n_ubatch": r.get("n_ubatch"),
           "type": r.get("model_type"), "build_commit": r.get("build_commit"),
           "build_number": r.get("build_number"), "tool": "llama-bench"}
    print(json.dumps(out))
PY
}

run_batchedbench() {
  # fallback tool: one measurement per invocation, so run it REPEATS times, keep the median
  log "running llama-batched-bench (fallback tool) $REPEATS times: pp512/pp3072 with tg128 after each"
  local i
  for ((i = 0; i < REPEATS; i++)); do
    "$LCPP_BIN" -m "$MODEL" -c 8192 -b 3072 -ub 512 -t "$THREADS" -tb "$THREADS" \
      -npp 512,3072 -ntg 128 -npl 1 --output-format jsonl \
      > "$WORK/bb_$i.out" 2> "$WORK/bb_$i.err" || { cat "$WORK/bb_$i.err" >&2; return 1; }
  done
  python3 - "$WORK"/bb_*.out "$WORK"/bb_*.err > "$WORK/llamacpp.jsonl" <<'PY'
import json, statistics, sys
pp, tg = {}, {}
for path in sys.argv[1:]:
    for line in open(path, errors="replace"):
        line = line.strip()
        if not line.startswith("{") or '"speed_pp"' not in line:
            continue
        r = json.loads(line)
        pp.setdefault(r["pp"], []).append(r["speed_pp"])
        tg.setdefault((r["tg"], r["pp"]), []).append(r["speed_tg"])
for n, v in sorted(pp.items()):
    print(json.dumps({"engine": "llama.cpp", "test": "prefill", "tokens": n,
                      "tokens_per_s": statistics.median(v), "repeats": len(v),
                      "tool": "llama-batched-bench"}))
for (n, ctx), v in sorted(tg.items()):
    print(json.dumps({"engine": "llama.cpp", "test": "decode", "tokens": n, "context": ctx,
                      "tokens_per_s": statistics.median(v), "repeats": len(v),
                      "tool": "llama-batched-bench"}))
PY
}

if [ "$LCPP_OK" -eq 1 ]; then
  if [ "$LCPP_TOOL" = llama-bench ]; then
    run_llamabench || LCPP_OK=0
  else
    run_batchedbench || LCPP_OK=0
  fi
  [ -s "$WORK/llamacpp.jsonl" ] || LCPP_OK=0
fi
if [ "$LCPP_OK" -eq 1 ]; then
  cat "$WORK/llamacpp.jsonl"
else
  log "llama.cpp side FAILED"
  python3 -c 'import json,sys; print(json.dumps({"engine":"llama.cpp","error":sys.argv[1]}))' \
    "llama.cpp build or benchmark failed (see stderr)" | tee "$WORK/llamacpp.jsonl"
fi

# ----------------------------------------------------------- run blendserve
: > "$WORK/blendserve.jsonl"
BS_ERR=""
BLENDCTL="$ROOT/build/blendctl"
if [ ! -x "$BLENDCTL" ]; then
  log "build/blendctl missing, building it (nice -n 19, -j1)"
  if ! { nice -n 19 cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release >&2 &&
         nice -n 19 cmake --build "$ROOT/build" --target blendctl -j1 >&2; }; then
    BS_ERR="build of build/blendctl failed (see stderr)"
  elif [ ! -x "$BLENDCTL" ]; then
    BS_ERR="build finished but build/blendctl is missing"
  fi
fi
if [ -z "$BS_ERR" ]; then
  log "running blendctl bench prefill (OMP_NUM_THREADS=$THREADS)"
  # second run: decode from a 1-token prompt, matched with llama.cpp's tg128 (empty context)
  if OMP_NUM_THREADS="$THREADS" "$BLENDCTL" --model "$MODEL" bench prefill \
       --lengths 512 3072 --repeats "$REPEATS" --decode-tokens 128 \
       > "$WORK/bs.out" 2> "$WORK/bs.err" &&
     OMP_NUM_THREADS="$THREADS" "$BLENDCTL" --model "$MODEL" bench prefill \
       --lengths 16 --repeats 1 --decode-context 1 --decode-tokens 128 2>> "$WORK/bs.err" |
       grep '"bench":"decode"' >> "$WORK/bs.out"; then
    python3 - "$WORK/bs.out" > "$WORK/blendserve.jsonl" <<'PY' || BS_ERR="could not parse blendctl output"
import json, sys
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("bench") not in ("prefill", "decode") or "tokens_per_s" not in r:
        continue
    out = {"engine": "blendserve", "test": r["bench"], "tokens": r.get("tokens"),
           "tokens_per_s": r["tokens_per_s"]}
    for k in ("isa", "precision", "context", "threads"):
        if k in r:
            out[k] = r[k]
    print(json.dumps(out))
PY
    [ -n "$BS_ERR" ] || [ -s "$WORK/blendserve.jsonl" ] || BS_ERR="blendctl printed no prefill/decode rows"
  else
    rc=$?
    tail -n 20 "$WORK/bs.err" >&2 || true
    BS_ERR="build/blendctl bench prefill exited with status $rc: $(tail -n 1 "$WORK/bs.err" 2>/dev/null | cut -c1-300)"
  fi
fi
if [ -n "$BS_ERR" ]; then
  log "blendserve side failed: $BS_ERR"
  : > "$WORK/blendserve.jsonl"
  python3 -c 'import json,sys; print(json.dumps({"engine":"blendserve","error":sys.argv[1]}))' "$BS_ERR"
else
  cat "$WORK/blendserve.jsonl"
fi

# ------------------------------------------------------ ratios and machine
LOAD_END="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)"
python3 - "$WORK/llamacpp.jsonl" "$WORK/blendserve.jsonl" "$THREADS" "$LCPP_PY_VERSION" \
  "$LOAD_START" "$LOAD_END" <<'PY'
import json, sys

def load(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line:
            r = json.loads(line)
            if "tokens_per_s" in r:
                rows.append(r)
    return rows

lcpp, bs = load(sys.argv[1]), load(sys.argv[2])

def pick(rows, test, tokens, context=None):
    c = [r for r in rows if r["test"] == test and r.get("tokens") == tokens]
    if context is not None:
        same = [r for r in c if r.get("context") == context]
        c = same or c
    return c[0] if c else None

for test, tokens in (("prefill", 512), ("prefill", 3072)):
    b, l = pick(bs, test, tokens), pick(lcpp, test, tokens)
    print(json.dumps({"ratio": "blendserve/llama.cpp", "test": test, "tokens": tokens,
                      "value": (b["tokens_per_s"] / l["tokens_per_s"]) if (b and l and l["tokens_per_s"]) else None}))
# decode after a 512-token context, and from an (almost) empty one: blendserve's
# shortest prompt is 1 token, llama-bench's tg128 starts from none
for ctx in (512, 1):
    b = pick(bs, "decode", 128, ctx)
    l = pick(lcpp, "decode", 128, 0 if ctx == 1 else ctx)
    if b and b.get("context") != ctx:
        b = None
    print(json.dumps({"ratio": "blendserve/llama.cpp", "test": "decode", "tokens": 128, "context": ctx,
                      "value": (b["tokens_per_s"] / l["tokens_per_s"]) if (b and l and l["tokens_per_s"]) else None}))

cpu, flags = "unknown", set()
try:
    for line in open("/proc/cpuinfo"):
        k, _, v = line.partition(":")
        k = k.strip()
        if k == "model name" and cpu == "unknown":
            cpu = v.strip()
        elif k == "flags" and not flags:
            flags = set(v.split())
except OSError:
    pass
want = ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]  # /proc/cpuinfo spelling
print(json.dumps({"cpu": cpu, "flags": " ".join(f for f in want if f in flags),
                  "threads": int(sys.argv[3]), "llama_cpp_python": sys.argv[4],
                  "load_avg_1m_start": float(sys.argv[5]), "load_avg_1m_end": float(sys.argv[6])}))
PY

[ "$LCPP_OK" -eq 1 ] || exit 1
exit 0
