#!/usr/bin/env bash
# Builds llama.cpp's tools from the vendored source of the llama-cpp-python 0.3.36 sdist (the
# version the golden files and the reference benchmarks use), -O3 native, into .bench/.
# Prints the build directory. Not used by CI.
#
# Release flags: -O3 with GCC's dead-store elimination off. GCC 12 does not see that
# `_tile_loadconfig` reads its operand, and drops the stores of the tile shapes before it in
# llama.cpp's AMX kernels (`ggml_tile_config_init`), which then die with SIGILL at their first
# tile instruction (so llama-bench died on the Xeons with AMX here from 2026-11-25; the cause
# found 2026-11-28 with Debian's GCC 12.2); the flags must come after -O3. The dead-store
# passes change no arithmetic.
#
# LLAMA_CPP_CMAKE_ARGS adds CMake options after the defaults. llama.cpp's build without AMX (the
# peer of the tables before 2026-11-28), in a root of its own:
#   LLAMA_CPP_ROOT=$PWD/.bench/llama.cpp-avx512 LLAMA_CPP_CMAKE_ARGS="-DGGML_NATIVE=OFF \
#     -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
#     -DGGML_AVX_VNNI=ON" scripts/build_llama_cpp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=${LLAMA_CPP_ROOT:-$PWD/.bench/llama.cpp}
src="$root/llama_cpp_python-0.3.36/vendor/llama.cpp"
if [ ! -x "$src/build/bin/llama-bench" ] || [ ! -x "$src/build/bin/llama-server" ] || [ ! -x "$src/build/bin/llama-simple" ]; then
  mkdir -p "$root"
  if [ ! -d "$src" ]; then
    python3 -m pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$root" >&2
    tar xzf "$root/llama_cpp_python-0.3.36.tar.gz" -C "$root"
  fi
  command -v cmake >/dev/null || python3 -m pip install -q cmake ninja >&2
  release="-O3 -DNDEBUG -fno-tree-dse -fno-dse"
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF "-DCMAKE_C_FLAGS_RELEASE=$release" "-DCMAKE_CXX_FLAGS_RELEASE=$release" \
    ${LLAMA_CPP_CMAKE_ARGS:-} >&2
  cmake --build "$src/build" -j"$(nproc)" --target llama-bench llama-server llama-batched-bench llama-simple >&2
fi
echo "$src"
