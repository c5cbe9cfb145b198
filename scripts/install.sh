#!/usr/bin/env bash
# Install llmkit from this checkout into a virtual environment, with every feature and what the tests need:
#
#   scripts/install.sh                 # .venv beside this script's checkout
#
# llama-cpp-python is compiled from source once (pip caches the wheel); its build also compiles the four
# llama.cpp tools llmkit runs (scripts/llama_cpp_tools.cmake) and nothing else of llama.cpp.
# Settings (environment): LLMKIT_VENV (default <checkout>/.venv), LLMKIT_EXTRAS (default all,dev),
# PYTHON (default python3), LLMKIT_CMAKE_ARGS (appended to llama.cpp's CMake arguments).
# The README, .ci/run and benchmarks/install_time.sh all run this script.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${LLMKIT_VENV:-$root/.venv}
py=${PYTHON:-python3}
extras=${LLMKIT_EXTRAS:-all,dev}
die() { echo "install: $*" >&2; exit 1; }

# What the compile needs is checked first, so a missing piece stops the install in seconds, not minutes.
command -v "$py" >/dev/null || die "no '$py' found. Install Python 3.10 or newer, or set PYTHON=/path/to/python3."
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "llmkit needs Python 3.10 or newer ($("$py" -V 2>&1)). Set PYTHON=/path/to/python3.10+."
"$py" -c 'import venv, ensurepip' 2>/dev/null \
  || die "Python's venv module is missing. Install it (Debian/Ubuntu: apt install python3-venv)."
cxx=""
for c in "${CXX:-}" c++ g++ clang++; do
  if [ -n "$c" ] && command -v "$c" >/dev/null; then cxx=$c; break; fi
done
[ -n "$cxx" ] || die "no C++ compiler found; llama.cpp is compiled from source. Install one (Debian/Ubuntu: apt install build-essential; macOS: xcode-select --install)."
# CMake and Ninja need not be installed: the binding's build backend fetches them from the package index.

# One build for every x86-64 CPU with AVX2 rather than -march=native: CPUs that report AMX tiles under a
# kernel that does not enable them die with "Illegal instruction" in a native build.
cpu="-DGGML_NATIVE=OFF"
if [ -r /proc/cpuinfo ] && grep -qw avx2 /proc/cpuinfo; then
  cpu="$cpu -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi

[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
case ",$extras," in
  *,all,*|*,adapt,*|*,dev,*)
    # PyTorch's CPU index first: the package index's Linux torch pulls several GB of CUDA libraries.
    # Where that index is unreachable, pip falls back to the configured index at once (--retries 0).
    "${pip[@]}" -q --retries 0 --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" ;;
esac
CMAKE_ARGS="-DCMAKE_PROJECT_llama_cpp_INCLUDE=$root/scripts/llama_cpp_tools.cmake $cpu ${LLMKIT_CMAKE_ARGS:-}" \
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)} \
  "${pip[@]}" -e "$root[$extras]"

# A wheel pip cached from another build of llama-cpp-python lacks the tools: build them beside it, once.
case ",$extras," in
  *,all,*|*,llama,*|*,dev,*)
    "$venv/bin/python" -c 'from llmkit.llama import tools; raise SystemExit(0 if tools.missing() == [] else 1)' \
      || PYTHON="$venv/bin/python" bash "$root/scripts/build_llama_server.sh" >/dev/null ;;
esac
"$venv/bin/llmkit" doctor
echo "Installed. Put $venv/bin on your PATH (or: source $venv/bin/activate), then try: llmkit generate \"Hello\""
