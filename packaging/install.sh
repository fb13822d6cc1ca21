#!/usr/bin/env bash
# Install draftpen for this user and start chatting:
#   a virtualenv with llama-cpp-python (built once per machine, for CUDA, Metal or the
#   CPU) and draftpen from this clone, ~/.local/bin/draftpen, the starter model pair,
#   then `draftpen`. Run it again to update after `git pull`.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=packaging/lib.sh
. "$REPO_ROOT/packaging/lib.sh"

usage() {
    cat <<EOF
usage: bash packaging/install.sh [--no-run] [--venv PATH]

Installs draftpen from this clone into a virtualenv, links ~/.local/bin/draftpen,
downloads the starter model pair (draftpen models pull starter), then starts the chat.

  --no-run     set everything up (the starter pair included) but do not start the chat
  --venv PATH  the virtualenv to use (default: \$DRAFTPEN_VENV, else
               \${XDG_DATA_HOME:-~/.local/share}/draftpen/venv, on macOS too)
  -h, --help   show this help

Environment: PYTHON (the Python to use, 3.11+), DRAFTPEN_MODELS_DIR (the model store),
DRAFTPEN_LLAMA_CMAKE_ARGS (CMake flags for the llama-cpp-python build),
DRAFTPEN_LLAMA_FLAVOUR (cpu, cuda, metal or portable: the build to make),
DRAFTPEN_LLAMA_AMX=1 (compile ggml's AMX kernels in: they are left out because they
crash on Intel CPUs with AMX, llama.cpp #20824; see packaging/lib.sh).

After installing, a runtime check decodes a few tokens with a tiny model in a child
process; if the runtime crashes, llama-cpp-python is rebuilt once with portable flags.
EOF
}

run_chat=1
venv=${DRAFTPEN_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/draftpen/venv}
while [[ $# -gt 0 ]]; do
    case $1 in
        --no-run) run_chat=0 ;;
        --venv)
            [[ $# -ge 2 && -n $2 ]] || die "--venv needs a path, e.g. --venv ~/draftpen-venv"
            venv=$2
            shift
            ;;
        --venv=*) venv=${1#--venv=} ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            usage >&2
            die "unknown option: $1"
            ;;
    esac
    shift
done
[[ -n $venv ]] || die "the virtualenv path is empty; pass --venv PATH"
# An absolute path, so the link in ~/.local/bin works from anywhere.
mkdir -p "$(dirname "$venv")"
venv="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"

step "Python"
python=$(find_python)
say "Using $python ($("$python" -V 2>&1))"

step "Virtualenv"
ensure_venv "$venv" "$python"

step "llama-cpp-python"
install_llama "$venv"

step "draftpen"
extras=$(platform_extras)
if [[ -n $extras ]]; then
    say "Apple Silicon: installing draftpen with mlx, mlx-lm and mlx-vlm (its draft heads)"
    "$venv/bin/python" -m pip install --quiet "${REPO_ROOT}[$extras]"
else
    "$venv/bin/python" -m pip install --quiet "$REPO_ROOT"
fi
say "Installed $("$venv/bin/python" -m pip show draftpen 2>/dev/null | sed -n 's/^Version: /draftpen /p') into $venv"

step "Runtime check"
# A build that compiles is not a runtime that runs (llama.cpp #20824): decode a few
# tokens in a child process, and fall back to a portable build once if it crashes.
verify_llama_runtime "$venv"

step "Command"
bin_dir="$HOME/.local/bin"
link="$bin_dir/draftpen"
mkdir -p "$bin_dir"
if [[ -e $link && ! -L $link ]]; then
    warn "$link exists and is not a link; left as it is. This install is $venv/bin/draftpen."
else
    ln -sfn "$venv/bin/draftpen" "$link"
    say "Linked $link -> $venv/bin/draftpen"
fi
case ":$PATH:" in
    *":$bin_dir:"*) ;;
    *)
        say "Note: $bin_dir is not on your PATH. Add this line to your shell's startup file"
        say "(~/.bashrc, ~/.zshrc) to run draftpen by name:"
        say "    export PATH=\"\$HOME/.local/bin:\$PATH\""
        ;;
esac

step "Starter models"
"$venv/bin/draftpen" models pull starter

if [[ $run_chat -eq 0 ]]; then
    step "Done"
    say "Start chatting with: draftpen"
    exit 0
fi
if [[ ! -t 0 || ! -t 1 ]]; then
    step "Done"
    say "Not started: the chat needs a terminal. Start it with: draftpen"
    exit 0
fi
step "Chat"
exec "$venv/bin/draftpen"
