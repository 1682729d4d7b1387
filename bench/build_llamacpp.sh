#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-batched-bench from the sources that
# llama-cpp-python 0.3.36 vendors (its sdist, from PyPI: no GitHub needed), for the
# benchmarks that compare warmfleet with llama.cpp (bench.agents, bench.moe).
#
#     [ISA=avx2] bench/build_llamacpp.sh [DEST] [JOBS]
#
# DEST defaults to ~/.cache/warmfleet/llamacpp (outside the repository; with ISA=avx2,
# ~/.cache/warmfleet/llamacpp-avx2); JOBS to 2. The binaries land in DEST/build/bin. Flags as
# DESIGN.md gives them: GGML_NATIVE for this CPU, with AMX off (its AMX path crashes on some
# of the development machines), no curl, no downloaded web UI, Release. ISA=avx2 builds for
# AVX2 CPUs without AVX-512 instead (GGML_NATIVE=OFF, AVX, AVX2, FMA and F16C on, AVX-512
# off): what llama.cpp runs on a Zen 3 or a desktop Intel, measured on this machine against
# warmfleet's kernels built with WARMFLEET_MARCH=haswell (bench/RESULTS.md). It takes 4-12
# minutes on 2 cores and runs under nice; run it again after moving to another CPU
# (GGML_NATIVE builds for the CPU it runs on).
set -euo pipefail

VERSION=0.3.36
ISA=${ISA:-native}
case "$ISA" in
    native) TARGET=(-DGGML_NATIVE=ON); SUFFIX= ;;
    avx2) TARGET=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                  -DGGML_AVX512=OFF); SUFFIX=-avx2 ;;
    *) echo "ISA is native or avx2, not $ISA" >&2; exit 2 ;;
esac
DEST=${1:-$HOME/.cache/warmfleet/llamacpp$SUFFIX}
JOBS=${2:-2}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$HERE/.venv/bin/python}
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

mkdir -p "$DEST/src"
SDIST="$DEST/src/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    "$PYTHON" -m pip download --no-binary :all: --no-deps --dest "$DEST/src" \
        "llama-cpp-python==$VERSION"
fi
SRC="$DEST/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    tar -xzf "$SDIST" -C "$DEST/src"
fi

GENERATOR=()
if command -v ninja >/dev/null; then GENERATOR=(-G Ninja); fi
cmake -S "$SRC" -B "$DEST/build" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    "${TARGET[@]}" \
    -DLLAMA_CURL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DCMAKE_C_FLAGS="$NO_AMX" \
    -DCMAKE_CXX_FLAGS="$NO_AMX"
start=$(date +%s)
nice cmake --build "$DEST/build" --config Release -j "$JOBS" \
    --target llama-server llama-batched-bench
echo "built in $(($(date +%s) - start)) s:"
for tool in llama-server llama-batched-bench; do
    echo "  $DEST/build/bin/$tool"
done
