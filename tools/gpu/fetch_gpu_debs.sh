#!/usr/bin/env bash
# tools/gpu/fetch_gpu_debs.sh — fetch, here, the Debian packages the build needs on a bare
# GPU machine (device tool: nvcc, CMake and PyTorch there, none of our packages, no
# registry), into the git-ignored gpu-debs/ that tools/gpu/gpu_check.sh unpacks there with
# `dpkg -x` into a prefix (never into /).
#
#   tools/gpu/fetch_gpu_debs.sh        # idempotent: packages already there are kept
#
# The device tool carries at most 64 MiB per call with the working tree (~6 MiB of
# tracked files); these packages are ~41 MiB. The model (~94 MiB) does not travel: on
# the GPU machine the CPU backend is the reference of the CUDA ops. Progress on
# stderr; one JSON line on stdout: {"debs": N, "bytes": B}.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$ROOT/gpu-debs"
# The -dev packages tools/setup.sh installs, and the runtime libraries they need that a
# machine without our packages lacks (Debian bookworm names).
PACKAGES=(
  libcaf-dev libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17
  libyaml-cpp-dev libyaml-cpp0.7
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1 libssl-dev zlib1g-dev
  libboost-dev libboost1.74-dev
  nlohmann-json3-dev libgtest-dev libcli11-dev
  libdnnl-dev libdnnl2
  libxxhash-dev libxxhash0
  libicu-dev libicu72
  pkgconf-bin libpkgconf3   # CMake's FindPkgConfig needs a pkg-config binary
  libncurses-dev libncurses6 libncursesw6 libtinfo6   # blendctl (top), built for the GPU benchmarks
)

mkdir -p "$DEST"
cd "$DEST"
missing=()
for p in "${PACKAGES[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[fetch-gpu-debs] apt-get download ${missing[*]}" >&2
  apt-get download "${missing[@]}" >&2
else
  echo "[fetch-gpu-debs] all ${#PACKAGES[@]} packages present in $DEST" >&2
fi
count=$(ls -1 ./*.deb | wc -l)
bytes=$(cat ./*.deb | wc -c)
if [ "$bytes" -gt $((56 * 1024 * 1024)) ]; then
  echo "[fetch-gpu-debs] WARNING: $bytes bytes: with the working tree this nears the device tool's 64 MiB per call" >&2
fi
printf '{"debs": %d, "bytes": %d}\n' "$count" "$bytes"
