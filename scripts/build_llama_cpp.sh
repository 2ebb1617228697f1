#!/usr/bin/env bash
# Builds llama.cpp's tools from the vendored source of the llama-cpp-python 0.3.36 sdist (the
# version the golden files and the reference benchmarks use), -O3 native, into .bench/.
# Prints the build directory. Not used by CI.
#
# LLAMA_CPP_CMAKE_ARGS adds CMake options after the defaults. A KVM guest that lists AMX in its
# CPU flags but faults on it (llama-bench dies with SIGILL in tinygemm_kernel_amx; seen on a
# 2-vCPU Xeon here, 2026-11-25) needs a build without AMX, in a root of its own:
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
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF ${LLAMA_CPP_CMAKE_ARGS:-} >&2
  cmake --build "$src/build" -j"$(nproc)" --target llama-bench llama-server llama-batched-bench llama-simple >&2
fi
echo "$src"
