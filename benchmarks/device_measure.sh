#!/usr/bin/env bash
# One device call that measures issues 33 and 34 on a lent NVIDIA GPU machine with no
# network: llama-cpp-python built there for CUDA, the synthetic 7B+0.5B float16 pair
# (benchmarks/synthetic_pair.py) written meanwhile, then benchmarks/device_measure.py's
# phases, each its own process, most important first:
#   exact     exact vs default kernels on the GPU (prompt reading, decoding, identity)
#   tax-gpu   plain decoding in-process / through `draftpen serve` / llama-cpp-python, GPU
#   tax-cpu8, tax-cpu2   the same on the CPU alone (GPU hidden), 8 and 2 threads, with
#             the 0.5B model as the target
# Everything it needs travels in $CARRY (default .gpu; carry it):
#   lcp.tar.xz                 llama-cpp-python 0.3.36's sdist, trimmed
#   whl/*.whl                  draftpen's Python dependencies the machine's image lacks
#   qwen25-tokenizer.json.gz   the starter pair's tokenizer (synthetic_pair.py tokenizer)
# Results in $OUT (at most 8 files): summary.md (every phase's table), exact.json,
# tax-gpu.json, tax-cpu8.json, tax-cpu2.json (each run, medians, settings), log.txt
# (all that was printed) and build.txt (build and machine). Each JSON is rewritten after
# every measurement, and the script ends itself within BUDGET seconds (default 520), so
# a call with timeout_s 540 returns what was measured even when the build runs long.
#
#   bash benchmarks/device_measure.sh        # there: build, pair, measure
#       (the device tool: command "bash benchmarks/device_measure.sh", carry [".gpu"],
#       timeout_s 540)
#   LOCAL=1 TARGET=t.gguf DRAFT=d.gguf TOKENS=8 CPU_TOKENS=8 REPEATS=1 PROMPTS="64 256" \
#       bash benchmarks/device_measure.sh    # a dry run here: the installed llama_cpp
set -uo pipefail
START=$(date +%s)
BUDGET=${BUDGET:-520}
DEADLINE=$((START + BUDGET))
CARRY=${CARRY:-.gpu}
REPO=$PWD
WORK=${WORK:-/tmp/draftpen-measure}
OUT=${OUT:-$REPO/measure-results}
SRC=$WORK/llama_cpp_python-0.3.36
TOKENS=${TOKENS:-128}
CPU_TOKENS=${CPU_TOKENS:-64}
REPEATS=${REPEATS:-3}
PROMPTS=${PROMPTS:-1024 8192}
mkdir -p "$WORK" "$OUT"

note() { echo "[$(($(date +%s) - START))s] $*"; }
left() { echo $((DEADLINE - $(date +%s))); }

# llama-cpp-python built as packaging/install.sh builds its CUDA flavour (AMX off for the
# CPU), for the H100 only, without the multimodal library draftpen does not load.
build() {
    local flags="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF"
    flags="$flags -DLLAVA_BUILD=OFF -DGGML_CCACHE=OFF"
    flags="$flags '-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'"
    flags="$flags '-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'"
    local began=$SECONDS
    (cd "$SRC" && CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install \
        -v --no-build-isolation --no-deps --no-cache-dir --target "$WORK/lcp-site" .) \
        >"$WORK/build.log" 2>&1 || { echo "failed after $((SECONDS - began))s" >"$WORK/build.failed"; return 1; }
    echo "built in $((SECONDS - began))s" >"$WORK/lcp-site.ready"
}

pair() {
    local began=$SECONDS
    python3 benchmarks/synthetic_pair.py pair "$CARRY/qwen25-tokenizer.json.gz" "$WORK/pair" \
        --draft-noise "${DRAFT_NOISE:-0.1}" >"$WORK/pair.log" 2>&1 || { touch "$WORK/pair.failed"; return 1; }
    echo "written in $((SECONDS - began))s" >>"$WORK/pair.log"
    touch "$WORK/pair.ready"
}

case ${1:-} in  # the background jobs below run this script again
    build) build; exit ;;
    pair) PYTHONPATH=$WORK/site pair; exit ;;
esac
exec > >(tee -a "$OUT/log.txt") 2>&1

# --- prepare: the build and the pair in the background, detached -------------------------
if [[ -n ${LOCAL:-} ]]; then
    PY=${PY:-$REPO/.venv/bin/python}
    export DRAFTPEN_HOME=$WORK/home
    note "local dry run: no build, the installed llama_cpp, $TARGET + $DRAFT"
else
    PY=python3
    note "unpacking llama-cpp-python; building it for CUDA in the background"
    rm -rf "$WORK"/*.ready "$WORK"/*.failed
    tar xJf "$CARRY/lcp.tar.xz" -C "$WORK"
    setsid bash "$0" build >"$WORK/build.out" 2>&1 </dev/null &
    wheels() { python3 -m pip install -q --upgrade --no-index --no-deps --no-compile \
        --no-cache-dir --target "$WORK/site" "$@"; }
    if ! wheels "$CARRY"/whl/*.whl; then  # one wheel this machine refuses stops them all
        for wheel in "$CARRY"/whl/*.whl; do wheels "$wheel" || note "wheel refused: $wheel"; done
    fi
    setsid bash "$0" pair >"$WORK/pair.out" 2>&1 </dev/null &
    export PYTHONPATH=$WORK/lcp-site:$WORK/site:$REPO
    export DRAFTPEN_HOME=$WORK/home
    TARGET=$WORK/pair/target.gguf
    DRAFT=$WORK/pair/draft.gguf
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        echo "cpus $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
        free -g | head -2
    } >"$WORK/machine.txt" 2>&1
    cat "$WORK/machine.txt"
    while [[ ! -f $WORK/lcp-site.ready || ! -f $WORK/pair.ready ]]; do
        if [[ -f $WORK/build.failed || -f $WORK/pair.failed ]]; then break; fi
        if (($(left) < 60)); then note "out of time waiting for the build"; break; fi
        sleep 15
        step=$(grep -ao '\[[0-9]*/[0-9]*\]' "$WORK/build.log" 2>/dev/null | tail -1)
        note "building ${step:-(configuring)}; pair $(tail -c 120 "$WORK/pair.log" 2>/dev/null | tr '\n' ' ')"
    done
    {
        cat "$WORK/machine.txt"
        cat "$WORK"/lcp-site.ready "$WORK"/build.failed 2>/dev/null
        cat "$WORK/pair.log" 2>/dev/null
        echo "--- build log, tail"
        tail -40 "$WORK/build.log" 2>/dev/null
    } >"$OUT/build.txt"
    if [[ ! -f $WORK/lcp-site.ready || ! -f $WORK/pair.ready ]]; then
        note "not ready: see build.txt"; tail -15 "$WORK/build.log"; exit 1
    fi
    note "$(cat "$WORK/lcp-site.ready"); pair $(tail -1 "$WORK/pair.log")"
fi

# --- measure ------------------------------------------------------------------------------
# Each phase may start new repeats until its share of the time left is spent, and is
# stopped 40 s after that (or at the budget's end).
phase() {  # NAME WEIGHT WEIGHTS_LEFT ARGS...
    local name=$1 weight=$2 weights=$3
    shift 3
    local time_left share hard
    time_left=$(left)
    share=$((time_left * weight / weights))
    share=$((share < time_left - 45 ? share : time_left - 45))
    share=$((share > 0 ? share : 0))
    hard=$((share + 40 < time_left - 5 ? share + 40 : time_left - 5))
    if ((hard < 30)); then note "$name: skipped, out of time"; return; fi
    note "$name: up to ${share}s for new repeats, stopped at ${hard}s"
    # PIN (e.g. taskset -c 0,1) holds the phase, and the engine it starts, to some cores.
    # shellcheck disable=SC2086
    DP_MEASURE_DEADLINE=$(($(date +%s) + share)) timeout -k 10 "$hard" ${PIN:-} "$PY" \
        -m benchmarks.device_measure "$@" --json "$OUT/$name.json" --markdown "$OUT/summary.md"
    note "$name: exit $?"
}
read -r -a SIZES <<<"$PROMPTS"
phase exact 40 100 exact "$TARGET" "$DRAFT" --prompts "${SIZES[@]}" --tokens "$TOKENS" \
    --repeats "$REPEATS"
phase tax-gpu 25 60 tax "$TARGET" --context 4096 --tokens "$TOKENS" --repeats "$REPEATS"
CUDA_VISIBLE_DEVICES= DP_MEASURE_GPU_LAYERS=0 DP_MEASURE_THREADS=8 \
    phase tax-cpu8 15 35 tax "$DRAFT" --context 2048 --tokens "$CPU_TOKENS" --repeats "$REPEATS"
# Two threads held to two cores, as on the 2-core VMs where the tax was seen: the engine's
# event loop and llama.cpp's threads then share those cores.
PIN="taskset -c 0,1" CUDA_VISIBLE_DEVICES= DP_MEASURE_GPU_LAYERS=0 DP_MEASURE_THREADS=2 \
    phase tax-cpu2 20 20 tax "$DRAFT" --context 2048 --tokens "$CPU_TOKENS" --repeats "$REPEATS"
note "done"
