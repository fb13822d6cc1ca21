# shellcheck shell=bash
# Shared by packaging/install.sh and packaging/test.sh; sourced, never run.
#
# The one place that pins llama-cpp-python, finds a Python, makes virtualenvs and
# installs llama-cpp-python from a wheel built once per machine and flavour:
#
#   ${XDG_CACHE_HOME:-~/.cache}/draftpen/wheels/<flavour>-<flags checksum>/llama_cpp_python-<version>-*.whl
#
# flavour: cuda (nvcc and nvidia-smi both found), metal (macOS on Apple Silicon),
# cpu (anything else), portable (the fallback when the native build crashes, see
# verify_llama_runtime), or custom when DRAFTPEN_LLAMA_CMAKE_ARGS sets the CMake flags.
# DRAFTPEN_LLAMA_FLAVOUR=portable (or cpu, cuda, metal) chooses one by name. A build
# that crashed the runtime check is marked in its wheel directory, and later installs
# on this machine take portable without building and crashing again (install_flavour).
# The cache directory is named by the flavour and a checksum of its CMake flags and,
# for the builds tuned to this CPU (-march=native), of this CPU's instruction sets
# (cpu-1234567890): a wheel built with other flags, an older recipe's included, or on
# another CPU (a home directory shared between machines) never stands in for this one.
#
# No AMX. ggml's AMX matmul (ggml_backend_amx_mul_mat) segfaults on the first batched
# decode on Intel CPUs with AMX (Sapphire Rapids and later, most cloud VMs since 2023):
# llama.cpp issue #20824 (closed as stale, not fixed), Ollama #17006, and
# stanfordnlp/dspy#10079. So the x86-64 builds keep every native instruction set of the
# machine (-march=native) but switch the AMX ones off (-mno-amx-*), which compiles the
# AMX kernels out. Once upstream fixes it, set DRAFTPEN_LLAMA_AMX=1 to build with them.
#
# Written for bash 3.2 too (macOS's /bin/bash): no negative array indexes, no
# associative arrays, no `${var,,}`.

LLAMA_CPP_VERSION=0.3.36
MIN_PYTHON=3.11
PYTHON_CANDIDATES="python3.11 python3.12 python3.13 python3"

say() { printf '%s\n' "$*"; }
step() { printf '\n==> %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

is_apple_silicon() {
    [[ "$(uname -s)" == Darwin && "$(uname -m)" == arm64 ]]
}

# The extras of the draftpen package this machine should get: "mlx" on Apple Silicon.
platform_extras() {
    if is_apple_silicon; then
        printf 'mlx\n'
    fi
}

# The extras the tests need on this machine: mlx on Apple Silicon, Apple's CPU build of
# mlx on Linux (so both runtimes' conformance tests run in CI), nothing elsewhere.
test_platform_extras() {
    if is_apple_silicon; then
        printf 'mlx\n'
    elif [[ "$(uname -s)" == Linux ]]; then
        printf 'mlx-cpu\n'
    fi
}

python_is_recent() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1
}

# Print the path of a Python >= 3.11: $PYTHON if set, else the first that works of
# python3.11, python3.12, python3.13, python3.
find_python() {
    local candidate
    if [[ -n "${PYTHON:-}" ]]; then
        python_is_recent "$PYTHON" ||
            die "\$PYTHON is '$PYTHON', which is not a working Python $MIN_PYTHON or newer." \
                "Point it at one, or unset it to search for python3.11 and newer."
        command -v "$PYTHON"
        return 0
    fi
    for candidate in $PYTHON_CANDIDATES; do
        if command -v "$candidate" >/dev/null 2>&1 && python_is_recent "$candidate"; then
            command -v "$candidate"
            return 0
        fi
    done
    die "draftpen needs Python $MIN_PYTHON or newer and found none (tried $PYTHON_CANDIDATES)." \
        "Install one (Debian/Ubuntu: sudo apt install python3.11 python3.11-venv;" \
        "macOS: brew install python@3.12), or set PYTHON=/path/to/python3.x."
}

# A virtualenv is reused when its python runs, is recent enough, and has pip.
venv_is_healthy() {
    [[ -x "$1/bin/python" ]] && python_is_recent "$1/bin/python" &&
        "$1/bin/python" -m pip --version >/dev/null 2>&1
}

# ensure_venv VENV PYTHON: reuse VENV if healthy, else (re)create it with PYTHON.
ensure_venv() {
    local venv=$1 python=$2
    if venv_is_healthy "$venv"; then
        say "Reusing $venv ($("$venv/bin/python" -V 2>&1))"
        return 0
    fi
    if [[ -e "$venv" ]]; then
        # --clear empties the directory: only ever do that to a virtualenv or an
        # empty directory, never to a path someone passed by mistake.
        if [[ ! -f "$venv/pyvenv.cfg" && -n "$(ls -A "$venv" 2>/dev/null)" ]]; then
            die "$venv exists and is not a virtualenv; choose another path or remove it."
        fi
        say "$venv is not a working Python $MIN_PYTHON+ virtualenv; recreating it with $python"
    else
        say "Creating $venv with $python ($("$python" -V 2>&1))"
    fi
    "$python" -m venv --clear --upgrade-deps "$venv" ||
        die "could not create a virtualenv at $venv with $python." \
            "On Debian/Ubuntu install the venv module (sudo apt install python3.X-venv)," \
            "and check that PyPI is reachable (pip is upgraded in the new virtualenv)."
}

draftpen_cache_dir() {
    printf '%s/draftpen\n' "${XDG_CACHE_HOME:-$HOME/.cache}"
}

# Whether the CUDA toolkit and a driver are both here (a build for the GPU can run).
has_cuda_toolkit() {
    command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1
}

llama_flavour() {
    if [[ -n "${DRAFTPEN_LLAMA_FLAVOUR:-}" ]]; then
        case $DRAFTPEN_LLAMA_FLAVOUR in
            cpu | cuda | metal | portable) printf '%s\n' "$DRAFTPEN_LLAMA_FLAVOUR" ;;
            *) die "DRAFTPEN_LLAMA_FLAVOUR is '$DRAFTPEN_LLAMA_FLAVOUR'; use cpu, cuda, metal or portable." ;;
        esac
    elif [[ -n "${DRAFTPEN_LLAMA_CMAKE_ARGS:-}" ]]; then
        printf 'custom\n'
    elif has_cuda_toolkit; then
        printf 'cuda\n'
    elif is_apple_silicon; then
        printf 'metal\n'
    else
        printf 'cpu\n'
    fi
}

is_x86_64() {
    case "$(uname -m)" in
        x86_64 | amd64) return 0 ;;
        *) return 1 ;;
    esac
}

# The compiler flags that keep ggml's AMX kernels out of an x86-64 build (see the top
# of this file), or nothing where they do not apply or DRAFTPEN_LLAMA_AMX=1.
_no_amx_cmake_args() {
    if is_x86_64 && [[ "${DRAFTPEN_LLAMA_AMX:-0}" != 1 ]]; then
        printf '%s' "'-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'"
        printf ' %s' "'-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'"
    fi
}

# This CPU's instruction sets, lower case, one line: the flags line of /proc/cpuinfo
# (DRAFTPEN_CPUINFO names another file, for the tests), or on macOS what sysctl lists
# (Intel Macs: AVX1.0 is avx; Apple Silicon lists none, and needs none here).
cpu_flags() {
    local cpuinfo=${DRAFTPEN_CPUINFO:-/proc/cpuinfo} flags=""
    # `|| true`: no flags line (ARM's cpuinfo says "Features") or no such sysctl (Apple
    # Silicon) is an empty answer, not an error that `set -e -o pipefail` would exit on.
    if [[ -r $cpuinfo ]]; then
        flags=$({ grep -m1 '^flags' "$cpuinfo" || true; } | cut -d: -f2)
    elif [[ "$(uname -s)" == Darwin ]]; then
        flags=$({ sysctl -n machdep.cpu.features machdep.cpu.leaf7_features 2>/dev/null || true; } |
            tr '[:upper:]' '[:lower:]' | sed 's/avx1\.0/avx/g')
    fi
    # Split on purpose, globbing off: one space between flags, none around them.
    set -f
    # shellcheck disable=SC2086
    set -- $flags
    set +f
    printf '%s\n' "$*"
}

# The x86-64 instruction sets ggml can use that this CPU reports, as CMake flags for a
# build without -march=native: the portable fallback when a native build crashes. It
# keeps the GPU: a crash in a CPU kernel is no reason to lose CUDA.
_portable_cmake_args() {
    local flags feature option args="-DGGML_NATIVE=OFF"
    if has_cuda_toolkit; then
        args="-DGGML_CUDA=on $args"
    fi
    flags=" $(cpu_flags) "
    for feature in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2; do
        option=${feature#*:}
        if [[ $flags == *" ${feature%%:*} "* ]]; then
            args="$args -DGGML_$option=ON"
        else
            args="$args -DGGML_$option=OFF"
        fi
    done
    # AVX-512 and AMX stay off: the fallback trades a little speed for a build that runs.
    printf '%s -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF\n' "$args"
}

# The CMake flags for FLAVOUR, quoted for CMAKE_ARGS (scikit-build-core splits it with
# shlex, so a quoted flag with spaces stays one argument).
# Every standard flavour has ggml's RPC backend (-DGGML_RPC=ON): it lets this machine use
# `draftpen worker`s on others (serve --workers) and be one; a custom build has it only
# if its flags say so (`draftpen doctor` tells).
llama_cmake_args() {
    case $1 in
        custom) printf '%s\n' "$DRAFTPEN_LLAMA_CMAKE_ARGS" ;;
        cuda) printf '%s\n' "-DGGML_CUDA=on -DGGML_RPC=ON $(_no_amx_cmake_args)" ;;
        metal) printf '%s\n' "-DGGML_METAL=on -DGGML_RPC=ON" ;;
        portable) printf '%s -DGGML_RPC=ON\n' "$(_portable_cmake_args)" ;;
        *) printf '%s\n' "-DGGML_RPC=ON $(_no_amx_cmake_args)" ;;
    esac
}

# The wheel cache directory for FLAVOUR: named by the flavour and a checksum of its
# flags, and of this CPU's instruction sets where the build is tuned to the CPU (all
# but portable, whose flags already name the instruction sets it uses).
llama_wheel_dir() {
    local flavour=$1 key
    key=$(llama_cmake_args "$flavour")
    if [[ $flavour != portable ]]; then
        key="$key
cpu: $(cpu_flags)"
    fi
    printf '%s/wheels/%s-%s\n' "$(draftpen_cache_dir)" "$flavour" \
        "$(printf '%s\n' "$key" | cksum | cut -d' ' -f1)"
}

# A build that crashed this machine's runtime check (and whose portable fallback ran)
# leaves this file in its wheel directory, so later installs go straight to portable.
CRASHED_BUILD_MARK=crashed-runtime-check

# The flavour to install: llama_flavour's, or portable when that build crashed the
# runtime check on this machine before (verify_llama_runtime marked it). A flavour the
# user names in DRAFTPEN_LLAMA_FLAVOUR is taken as it is, so setting it tries again.
install_flavour() {
    local flavour
    flavour=$(llama_flavour)
    if [[ -z "${DRAFTPEN_LLAMA_FLAVOUR:-}" && $flavour != custom ]] &&
        [[ -f "$(llama_wheel_dir "$flavour")/$CRASHED_BUILD_MARK" ]]; then
        flavour=portable
    fi
    printf '%s\n' "$flavour"
}

# Print the cached wheel in DIR, if there is one.
cached_llama_wheel() {
    local dir=$1 candidate found=""
    for candidate in "$dir"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl; do
        if [[ -f "$candidate" ]]; then
            found=$candidate
        fi
    done
    if [[ -n "$found" ]]; then
        printf '%s\n' "$found"
    fi
}

# Print a line a minute until killed, so a long build does not look hung. It also
# stops on its own once the script that started it is gone.
_build_heartbeat() {
    local log=$1 parent=$2 minutes=0
    while sleep 60 >/dev/null 2>&1 && kill -0 "$parent" 2>/dev/null; do
        minutes=$((minutes + 1))
        say "    ... still building (${minutes} min so far; log: $log)"
    done
}

# build_llama_wheel PYTHON FLAVOUR DIR: compile llama-cpp-python into DIR.
build_llama_wheel() {
    local python=$1 flavour=$2 dir=$3 cmake_args log staging heartbeat status=0 hint
    cmake_args=$(llama_cmake_args "$flavour")
    log="$(draftpen_cache_dir)/build-logs/llama-$flavour.log"
    mkdir -p "$dir" "$(dirname "$log")"
    # Build into a private directory and move the wheel in when it is complete, so an
    # interrupted build never leaves a half-written wheel where the next run looks.
    staging=$(mktemp -d "$dir/.build.XXXXXX")
    say "No cached wheel for flavour '$flavour': compiling llama-cpp-python $LLAMA_CPP_VERSION" \
        "(CMAKE_ARGS='$cmake_args')."
    say "This takes 10-15 minutes on 2 CPU cores, once per machine; later runs reuse $dir."
    say "Build log: $log"
    _build_heartbeat "$log" "$$" &
    heartbeat=$!
    # --no-cache-dir: pip's wheel cache is keyed by the sdist, not by CMAKE_ARGS, so it
    # could hand back a CPU build when CUDA was asked for.
    CMAKE_ARGS="$cmake_args" "$python" -m pip wheel --verbose --no-deps --no-cache-dir \
        "llama-cpp-python==$LLAMA_CPP_VERSION" -w "$staging" >"$log" 2>&1 || status=$?
    kill "$heartbeat" 2>/dev/null || true
    wait "$heartbeat" 2>/dev/null || true
    if [[ $status -ne 0 ]]; then
        rm -rf "$staging"
        printf '\n--- last 40 lines of %s ---\n' "$log" >&2
        tail -n 40 "$log" >&2
        printf -- '---\n' >&2
        hint="It needs a C++ compiler and cmake (Debian/Ubuntu: sudo apt install build-essential"
        hint="$hint cmake; macOS: xcode-select --install)."
        if [[ $flavour == cuda ]]; then
            hint="$hint The cuda flavour also needs the CUDA toolkit (nvcc) that matches your"
            hint="$hint driver; to build for the CPU instead, set DRAFTPEN_LLAMA_CMAKE_ARGS=-DGGML_CUDA=off."
        fi
        die "building llama-cpp-python failed (exit $status); the full log is $log. $hint"
    fi
    mv "$staging"/llama_cpp_python-*.whl "$dir"/
    rm -rf "$staging"
}

# Exit 0 when the venv's llama-cpp-python was installed from exactly WHEEL (pip records
# the wheel's sha256 in direct_url.json) and imports.
_LLAMA_MATCHES_WHEEL='
import hashlib, json, sys
from importlib import metadata
try:
    dist = metadata.distribution("llama-cpp-python")
except metadata.PackageNotFoundError:
    sys.exit(1)
archive = json.loads(dist.read_text("direct_url.json") or "{}").get("archive_info", {})
recorded = archive.get("hashes", {}).get("sha256") or archive.get("hash", "").partition("=")[2]
with open(sys.argv[1], "rb") as wheel:
    if recorded != hashlib.file_digest(wheel, "sha256").hexdigest():
        sys.exit(1)
import llama_cpp
'

# install_llama VENV [FLAVOUR]: install the cached (or freshly built) wheel for this
# machine (or for FLAVOUR, e.g. portable).
install_llama() {
    local venv=$1 python="$1/bin/python" flavour dir wheel native
    flavour=${2:-$(install_flavour)}
    dir=$(llama_wheel_dir "$flavour")
    native=$(llama_flavour)
    if [[ -z "${2:-}" && $flavour != "$native" ]]; then
        say "The $native build of llama-cpp-python crashed the runtime check on this machine" \
            "before ($(llama_wheel_dir "$native")/$CRASHED_BUILD_MARK): installing the portable" \
            "build. To try the $native build again, set DRAFTPEN_LLAMA_FLAVOUR=$native."
    fi
    if [[ $flavour == cpu ]] && command -v nvidia-smi >/dev/null 2>&1; then
        warn "nvidia-smi found but nvcc is not on PATH: building for the CPU." \
            "Install the CUDA toolkit for GPU inference."
    fi
    wheel=$(cached_llama_wheel "$dir")
    if [[ -z "$wheel" ]]; then
        build_llama_wheel "$python" "$flavour" "$dir"
        wheel=$(cached_llama_wheel "$dir")
        [[ -n "$wheel" ]] || die "the llama-cpp-python build finished but left no wheel in $dir."
    fi
    if "$python" -c "$_LLAMA_MATCHES_WHEEL" "$wheel" >/dev/null 2>&1; then
        say "llama-cpp-python $LLAMA_CPP_VERSION ($flavour) is installed from $wheel"
        return 0
    fi
    say "Installing llama-cpp-python $LLAMA_CPP_VERSION ($flavour) from $wheel"
    # pip keeps an installed version equal to a local wheel's, so force the wheel in,
    # then let a plain install bring its dependencies.
    "$python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
    "$python" -m pip install --quiet "$wheel"
    "$python" -c "$_LLAMA_MATCHES_WHEEL" "$wheel" ||
        die "llama-cpp-python was installed from $wheel but does not import (see above)." \
            "Delete that wheel to have it rebuilt on the next run."
}

# `python -m app.runtime_check` exits with this when the runtime crashed or hung, so
# another build may run (app/runtime_check/__main__.py says the same).
RUNTIME_CHECK_CRASHED=3

# verify_llama_runtime VENV: prove the installed runtime runs on this CPU. A child
# process (python -m app.runtime_check, so draftpen must be installed in VENV) loads a
# tiny model it writes itself and decodes a few tokens, one at a time and as a batch.
# A crash is reported by its signal, likely cause and fix; then llama-cpp-python is
# rebuilt once with the portable flags and checked again, and if that fails too the
# install stops with what to report. Each check's result is kept in VENV
# (draftpen-install-check.json), where `draftpen doctor` shows it.
verify_llama_runtime() {
    local venv=$1 flavour status=0 mark
    flavour=$(install_flavour)
    "$venv/bin/python" -m app.runtime_check --record "$flavour" || status=$?
    if [[ $status -eq 0 ]]; then
        return 0
    fi
    if [[ $status -ne $RUNTIME_CHECK_CRASHED ]]; then
        die "the runtime check could not decode with llama-cpp-python (exit $status; see above)." \
            "If llama-cpp-python itself failed to load, delete its cached wheel" \
            "($(llama_wheel_dir "$flavour")) and run this again; otherwise report it with the output above."
    fi
    case $flavour in
        portable)
            die "llama-cpp-python's portable build crashed in the runtime check (see above)." \
                "Report it with the output of: $venv/bin/draftpen doctor --json"
            ;;
        custom)
            die "llama-cpp-python built with DRAFTPEN_LLAMA_CMAKE_ARGS crashed in the runtime" \
                "check (see above). Unset it to get the standard build, or set" \
                "DRAFTPEN_LLAMA_FLAVOUR=portable for the portable one."
            ;;
    esac
    warn "llama-cpp-python ($flavour build) crashed in the runtime check; rebuilding it once" \
        "with the portable flags: $(llama_cmake_args portable)"
    install_llama "$venv" portable
    status=0
    "$venv/bin/python" -m app.runtime_check --record "portable (after the $flavour build crashed)" ||
        status=$?
    if [[ $status -ne 0 ]]; then
        die "llama-cpp-python still fails the runtime check with the portable build (see" \
            "above); giving up. Report it with the output of: $venv/bin/draftpen doctor --json"
    fi
    # Remembered, so the next install does not build, install and crash the same way.
    mark="$(llama_wheel_dir "$flavour")/$CRASHED_BUILD_MARK"
    if mkdir -p "$(dirname "$mark")" &&
        printf 'The %s build crashed the runtime check on %s; portable ran.\n' \
            "$flavour" "$(date)" >"$mark"; then
        say "The portable build runs: draftpen uses it, and later installs go straight to it" \
            "($mark records the crash; set DRAFTPEN_LLAMA_FLAVOUR=$flavour to try that build again)."
    else
        say "The portable build runs: draftpen uses it. (To skip the crashing build on the next" \
            "install, set DRAFTPEN_LLAMA_FLAVOUR=portable.)"
    fi
}

# The agent CLIs the agent_cli tests run, pinned to the versions they were tested with.
AGENT_CLI_PACKAGES="@anthropic-ai/claude-code@2.1.197 @openai/codex@0.169.0 opencode-ai@1.18.33"

# install_agent_clis: npm-install the agent CLIs into a per-machine prefix (reused when
# its packages are these versions) and put its bin directory first on PATH.
install_agent_clis() {
    local prefix stamp
    prefix="$(draftpen_cache_dir)/agent-clis"
    stamp="$prefix/.packages"
    if ! command -v npm >/dev/null 2>&1; then
        warn "npm is not installed: the agent_cli tests will fail (install Node.js 20+)."
        return 0
    fi
    if [[ -f $stamp && "$(cat "$stamp")" == "$AGENT_CLI_PACKAGES" ]]; then
        say "Reusing $prefix ($AGENT_CLI_PACKAGES)"
    else
        say "Installing $AGENT_CLI_PACKAGES into $prefix"
        mkdir -p "$prefix"
        # shellcheck disable=SC2086 # the package list is words on purpose
        if npm install --silent --no-audit --no-fund --prefix "$prefix" $AGENT_CLI_PACKAGES; then
            printf '%s' "$AGENT_CLI_PACKAGES" >"$stamp"
        else
            warn "npm could not install the agent CLIs: the agent_cli tests will fail."
        fi
    fi
    export PATH="$prefix/node_modules/.bin:$PATH"
}
