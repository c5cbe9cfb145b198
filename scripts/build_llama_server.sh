#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-perplexity, llama-quantize and llama-imatrix from the
# llama-cpp-python source distribution (same llama.cpp version as the Python binding), once, into a
# cache outside the checkout:
#   ${LLMKIT_CACHE:-~/.cache/llmkit}/llama-server-<version>/{llama-server,llama-perplexity,llama-quantize,llama-imatrix}
# (llama-server for the --server modes; the others as references in tests and benchmarks). A cache
# that lacks some of them (made by an older version of this script) is completed: only the missing
# tools are built. Tools the binding's own build installed (llama_cpp/bin) are linked, not rebuilt.
# Prints the llama-server path.
# The web UI download and curl are turned off; AVX2 (where the CPU has it) instead of -march=native for
# the same AMX reason as scripts/install.sh, plus LLMKIT_CMAKE_ARGS. Compiling needs the package index
# (the source distribution) and CMake (the system's, else the cmake package from the index).
set -euo pipefail
py=${PYTHON:-python3}
ver=$($py -c 'import llama_cpp; print(llama_cpp.__version__)')
cache=${LLMKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmkit}/llama-server-$ver
tools=""
for t in llama-server llama-perplexity llama-quantize llama-imatrix; do
  [ -x "$cache/$t" ] || tools="$tools $t"
done
if [ -z "$tools" ]; then echo "$cache/llama-server"; exit 0; fi
# The README's install builds these tools in the same llama.cpp build as the binding (CMAKE_ARGS with
# -DLLAMA_BUILD_TOOLS=ON ... -DCMAKE_INSTALL_BINDIR=llama_cpp/bin): link them instead of compiling
# llama.cpp a second time. (A wheel pip had cached from an install without those flags has none.)
bundled=$($py -c 'import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), "bin"))')
rest=""
for t in $tools; do
  if [ -x "$bundled/$t" ]; then
    mkdir -p "$cache"
    ln -sfn "$bundled/$t" "$cache/$t.tmp" && mv -f "$cache/$t.tmp" "$cache/$t"
  else
    rest="$rest $t"
  fi
done
tools=$rest
if [ -z "$tools" ]; then echo "$cache/llama-server"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# only the sdist (its metadata step needs scikit-build-core; without isolation no build deps are built)
$py -m pip install -q "scikit-build-core[pyproject]>=0.9.2" >&2
$py -m pip download -q --no-deps --no-binary llama-cpp-python --no-build-isolation "llama-cpp-python==$ver" -d "$work" >&2
cmake_bin=$(command -v cmake || true)
if [ -z "$cmake_bin" ]; then
  $py -m pip install -q cmake >&2
  cmake_bin=$($py -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
fi
cpu="-DGGML_NATIVE=OFF"
if [ -r /proc/cpuinfo ] && grep -qw avx2 /proc/cpuinfo; then
  cpu="$cpu -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)
# shellcheck disable=SC2086  # $cpu and LLMKIT_CMAKE_ARGS are lists of arguments
"$cmake_bin" -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $cpu -DBUILD_SHARED_LIBS=OFF \
  ${LLMKIT_CMAKE_ARGS:-} >&2
"$cmake_bin" --build "$work/build" --target $tools -j"$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)" >&2
mkdir -p "$cache"
for t in $tools; do
  cp "$work/build/bin/$t" "$cache/$t.tmp" && mv "$cache/$t.tmp" "$cache/$t"
done
echo "$cache/llama-server"
