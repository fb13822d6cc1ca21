#!/usr/bin/env bash
# Measure draftpen on a lent NVIDIA GPU machine that reaches no network (see the README's
# "On a GPU" section). Everything it needs travels in $CARRY (default .gpu):
#   lcp.tar.xz             llama-cpp-python's sdist, trimmed (no models/ or docs/)
#   whl/*.whl              draftpen's pure-Python dependencies the machine lacks
#   qwen25-tokenizer.json.gz   the starter pair's tokenizer (benchmarks/synthetic_pair.py)
#
#   bash benchmarks/gpu_run.sh build    # llama.cpp with CUDA (shared lib, llama-bench, ...)
#   bash benchmarks/gpu_run.sh measure  # the synthetic pair, llama-bench, draftpen's figures
#
# Results go to $OUT (the device tool's folder) or ./gpu-results.
set -euo pipefail
CARRY=${CARRY:-.gpu}
WORK=/tmp/draftpen-gpu
OUT=${OUT:-$PWD/gpu-results}
SRC=$WORK/llama_cpp_python-0.3.36
BUILD=$SRC/vendor/llama.cpp/build
PY=${PY:-python3}
mkdir -p "$WORK" "$OUT"

build() {
    tar xJf "$CARRY/lcp.tar.xz" -C "$WORK"
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1
    cmake --build "$BUILD" -j "$(nproc)" --target llama llama-bench llama-speculative-simple \
        >"$OUT/build.log" 2>&1
    ls "$BUILD/bin" >"$OUT/built.txt"
}

environment() {
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" \
        "$CARRY"/whl/*.whl
    export PYTHONPATH="$PWD:$SRC:$WORK/site:$SRC/vendor/llama.cpp/gguf-py"
    export LLAMA_CPP_LIB_PATH="$BUILD/bin"
    export DRAFTPEN_HOME="$WORK/home"
}

measure() {
    environment
    local pair=$WORK/pair
    if [[ ! -f $pair/target.gguf ]]; then
        "$PY" benchmarks/synthetic_pair.py pair "$CARRY/qwen25-tokenizer.json.gz" "$pair" \
            --draft-noise "${DRAFT_NOISE:-0.1}" | tee "$OUT/pair.txt"
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt"
    "$BUILD/bin/llama-bench" -m "$pair/target.gguf" -m "$pair/draft.gguf" -ngl 99 -p 512 \
        -n 128 -r 3 -o md | tee "$OUT/llama-bench.md"
    "$PY" benchmarks/gpu_figures.py "$pair/target.gguf" "$pair/draft.gguf" | tee "$OUT/figures.md"
}

"$@"
