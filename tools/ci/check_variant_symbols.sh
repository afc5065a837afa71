#!/usr/bin/env bash
# Fails when a CPU kernel variant object defines a weak (or unique) symbol outside its
# own namespace bs::kernels::cpu::isa_<variant>::.
#
#   tools/ci/check_variant_symbols.sh OBJ...      (run by the build: kernels/CMakeLists.txt)
#
# Why: inline functions and template instantiations are emitted as weak symbols in
# every object that uses them, and the linker keeps one copy. If that copy comes from
# a file compiled with -mavx512f, a baseline caller on an AVX2 CPU executes AVX-512
# instructions and dies with SIGILL. Symbols that mention the variant namespace are
# safe: no other object can define them; so are RTTI objects ("typeinfo for ...",
# emitted by clang's -fsanitize=function), which are data, not code, and clang's
# __clang_call_terminate (two calls, __cxa_begin_catch and std::terminate: no vector
# code whatever the flags); the DW.ref.__g*_personality_v0 pointers are data too (the
# C one appears under ThreadSanitizer).
set -euo pipefail
NM="${NM:-nm}"
status=0
for obj in "$@"; do
  # the object's directory name carries the variant: .../bs_kernels_<variant>.dir/...
  variant="$(printf '%s' "$obj" | sed -n 's#.*bs_kernels_\([a-z0-9]*\)\.dir/.*#\1#p')"
  [ -n "$variant" ] || { echo "check_variant_symbols: cannot tell the variant of $obj" >&2; exit 2; }
  ns="bs::kernels::cpu::isa_${variant}::"
  # defined weak (W, V) or unique (u) symbols, demangled
  bad="$("$NM" -C --defined-only "$obj" | awk '$2 ~ /^[WVu]$/ { $1 = ""; $2 = ""; sub(/^  /, ""); print }' |
         grep -v -F "$ns" | grep -v -E '^(DW\.ref\.__g(xx|cc)_personality_v0|__clang_call_terminate)$|^typeinfo (name )?for ' || true)"
  if [ -n "$bad" ]; then
    echo "check_variant_symbols: $obj (variant $variant) defines weak symbols outside $ns:" >&2
    printf '%s\n' "$bad" | sed 's/^/  /' >&2
    status=1
  fi
done
exit $status
