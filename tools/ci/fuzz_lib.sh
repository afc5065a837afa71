# tools/ci/fuzz_lib.sh — what every tools/ci/fuzz_<target>.sh shares (sourced, not run):
#
#   source "$(dirname "${BASH_SOURCE[0]}")/fuzz_lib.sh"
#   fuzz_build TARGET "$@"      # parses [SECONDS], configures and builds; sets the variables below
#   ... seed "$CORPUS" ...      # or: fuzz_seeds EXT FORMAT <<'SEEDS' (one seed a line)
#   fuzz_dict <<'DICT_END'      # optional: a libFuzzer dictionary, its path in DICT
#   fuzz_run [libFuzzer flags...]
#
# fuzz_build configures the sanitizer build directory (build-asan, or $BUILD_DIR) with
# clang, -DBLENDSERVE_SANITIZE=ON and -DBLENDSERVE_FUZZ=ON — the flags of tools/test.sh's
# sanitizer build, so the objects the unit tests were built from are reused, and the
# coverage hooks (-fsanitize=fuzzer-no-link) let the fuzzer see inside the code under
# test — and builds TARGET. It sets ROOT, BUILD, JOBS, SECONDS_TO_RUN, CORPUS
# ($BUILD/TARGET_corpus) and ARTIFACTS ($BUILD/TARGET_artifacts), and leaves the
# caller's remaining arguments in FUZZ_ARGS. fuzz_run fuzzes for SECONDS_TO_RUN with
# -max_total_time and -artifact_prefix plus the flags given and FUZZ_ARGS; it exits
# non-zero, listing the reproducers, when the fuzzer finds a crash, leak or timeout.
# fuzz_seeds writes each line of its standard input to $CORPUS/seed_<n>.EXT through
# printf FORMAT ('%s' as it is, '%b' with its backslash escapes). fuzz_dict writes its
# standard input to $BUILD/TARGET.dict and sets DICT to that path (-dict="$DICT").
#
# Environment: BUILD_DIR, JOBS (default 2), BLENDSERVE_CMAKE_ARGS (extra cmake
# arguments, word-split), FUZZ_PREBUILT=1 (skip the configure and build: the target is
# built already), FUZZ_FORKS (fuzz_run runs N parallel jobs with -fork=N; default: one
# process).

fuzz_build() {
  FUZZ_TARGET="$1"
  shift
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  SECONDS_TO_RUN="${1:-60}"
  shift || true
  FUZZ_ARGS=("$@")
  BUILD="${BUILD_DIR:-$ROOT/build-asan}"
  JOBS="${JOBS:-2}"
  case "$SECONDS_TO_RUN" in
    ''|*[!0-9]*) echo "usage: tools/ci/$FUZZ_TARGET.sh [SECONDS] [libFuzzer flags...]" >&2; exit 2 ;;
  esac
  mkdir -p "$BUILD"
  if [ "${FUZZ_PREBUILT:-0}" = "1" ]; then
    # The caller built the target already (tools/test.sh, which then runs two fuzzers
    # side by side: two configures of one build directory at once would race).
    [ -x "$BUILD/$FUZZ_TARGET" ] || { log "FUZZ_PREBUILT=1 but $BUILD/$FUZZ_TARGET is not built"; exit 1; }
  else
    # shellcheck disable=SC2086
    CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBLENDSERVE_FUZZ=ON -DBLENDSERVE_SANITIZE=ON \
      ${BLENDSERVE_CMAKE_ARGS:-} >"$BUILD/configure.log" 2>&1 ||
      { cat "$BUILD/configure.log" >&2; log "cmake configure failed"; exit 1; }
    log "building $FUZZ_TARGET in $BUILD"
    cmake --build "$BUILD" --target "$FUZZ_TARGET" -j "$JOBS"
  fi
  CORPUS="$BUILD/${FUZZ_TARGET}_corpus"
  ARTIFACTS="$BUILD/${FUZZ_TARGET}_artifacts"
  mkdir -p "$CORPUS" "$ARTIFACTS"
}

fuzz_seeds() {
  local ext="$1" format="$2" seed i=0
  while IFS= read -r seed; do
    # shellcheck disable=SC2059
    printf "$format" "$seed" >"$CORPUS/seed_$i.$ext"
    i=$((i + 1))
  done
}

fuzz_dict() {
  DICT="$BUILD/$FUZZ_TARGET.dict"
  cat >"$DICT"
}

fuzz_run() {
  log "fuzzing for ${SECONDS_TO_RUN}s (corpus $CORPUS)"
  local rc forks=()
  [ -n "${FUZZ_FORKS:-}" ] && forks=(-fork="$FUZZ_FORKS")
  set +e
  "$BUILD/$FUZZ_TARGET" -max_total_time="$SECONDS_TO_RUN" -artifact_prefix="$ARTIFACTS/" "$@" \
    ${forks[@]+"${forks[@]}"} ${FUZZ_ARGS[@]+"${FUZZ_ARGS[@]}"} "$CORPUS"
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    log "FAILED (exit $rc); reproducers in $ARTIFACTS:"
    ls -l "$ARTIFACTS" >&2 || true
    exit "$rc"
  fi
  log "no crashes in ${SECONDS_TO_RUN}s"
}

log() { printf '[%s] %s\n' "${FUZZ_TARGET:-fuzz}" "$*"; }
