#!/usr/bin/env bash
# Measure draftpen on a lent NVIDIA GPU machine that reaches no network (see the README's
# "On a GPU" section). Everything it needs travels in $CARRY (default .gpu):
#   lcp.tar.xz             llama-cpp-python's sdist, trimmed (no models/ or docs/)
#   whl/*.whl              draftpen's pure-Python dependencies the machine lacks
#   qwen25-tokenizer.json.gz   the starter pair's tokenizer (benchmarks/synthetic_pair.py)
#
#   bash benchmarks/gpu_run.sh prepare  # in the background: llama.cpp with CUDA, the pair
#   bash benchmarks/gpu_run.sh wait     # until both are ready (or the call's time is up)
#   bash benchmarks/gpu_run.sh measure  # llama-bench, llama.cpp's speculation, draftpen
#
# $CARRY/old, when present, holds an earlier backends/ to measure beside this one.
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
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release >"$WORK/cmake.log" 2>&1
    cmake --build "$BUILD" -j "$(nproc)" --target llama llama-bench llama-speculative-simple \
        >"$WORK/build.log" 2>&1
    ls "$BUILD/bin" >"$WORK/built.txt"
}

python_package() {
    # llama-cpp-python itself, built for CUDA as install.sh builds it (loading the
    # cmake build's libllama.so through LLAMA_CPP_LIB_PATH crashed in model loading).
    (cd "$SRC" && CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip install -q --no-build-isolation \
        --no-deps --target "$WORK/lcp-site" .) >"$WORK/pip-build.log" 2>&1
    touch "$WORK/lcp-site/ready"
}

environment() {
    "$PY" -m pip install -q --upgrade --no-index --no-deps --no-compile --target "$WORK/site" \
        "$CARRY"/whl/*.whl 2>/dev/null
    export PYTHONPATH="$WORK/lcp-site:$WORK/site:$SRC/vendor/llama.cpp/gguf-py"
    export DRAFTPEN_HOME="$WORK/home"
}

# On the lent machine's image, importing numpy (or torch) before llama_cpp made model
# loading segfault with the CUDA build; importing llama_cpp first did not.
figures() {
    "$PY" -c "import llama_cpp, runpy, sys; sys.argv = sys.argv[1:]; \
runpy.run_path(sys.argv[0], run_name='__main__')" "$@"
}

pair() {
    environment
    "$PY" benchmarks/synthetic_pair.py pair "$CARRY/qwen25-tokenizer.json.gz" "$WORK/pair" \
        --draft-noise "${DRAFT_NOISE:-0.1}" >"$WORK/pair.txt" 2>&1
    touch "$WORK/pair/ready"
}

prepare() {
    tar xJf "$CARRY/lcp.tar.xz" -C "$WORK"
    # Detached, so the work goes on between the device tool's calls.
    setsid bash "$0" build >"$WORK/build.out" 2>&1 < /dev/null &
    setsid bash "$0" python_package >"$WORK/package.out" 2>&1 < /dev/null &
    setsid bash "$0" pair >"$WORK/pair.out" 2>&1 < /dev/null &
}

wait_ready() {
    local deadline=$((SECONDS + ${WAIT_SECONDS:-540}))
    while ((SECONDS < deadline)); do
        if [[ -s $WORK/built.txt && -f $WORK/pair/ready && -f $WORK/lcp-site/ready ]]; then
            echo ready; return 0
        fi
        sleep 10
    done
    echo "not ready yet"; tail -3 "$WORK/build.out" "$WORK/build.log" "$WORK/pair.out" || true
}

measure() {
    environment
    local pair=$WORK/pair
    cp "$WORK/pair.txt" "$OUT/"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt"
    "$BUILD/bin/llama-bench" -m "$pair/target.gguf" -m "$pair/draft.gguf" -ngl 99 -p 512 \
        -n 128 -r 3 -o md 2>&1 | tee "$OUT/llama-bench.md"
    for temp in 0 0.7; do
        "$BUILD/bin/llama-speculative-simple" -m "$pair/target.gguf" -md "$pair/draft.gguf" \
            -ngl 99 -ngld 99 -c 2048 -n 128 --spec-draft-n-max 4 --temp "$temp" \
            -p "Write a Python function that parses a CSV file of orders." 2>&1 |
            grep -E "decoded|accept|n_draft|speed" | tee -a "$OUT/llama-speculative.txt"
    done
    local repo=$PWD
    figures "$repo/benchmarks/gpu_figures.py" "$pair/target.gguf" "$pair/draft.gguf" \
        2>/dev/null | tee "$OUT/figures.md"
    if [[ -d $CARRY/old/backends ]]; then
        # From inside the old tree, so its backends/ is the one imported.
        (cd "$CARRY/old" && figures "$repo/benchmarks/gpu_figures.py" "$pair/target.gguf" \
            "$pair/draft.gguf" 2>/dev/null | tee "$OUT/figures-old.md")
    fi
}

case ${1:-} in
    wait) wait_ready ;;
    *) "$@" ;;
esac
