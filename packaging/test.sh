#!/usr/bin/env bash
# Set up and run the tests: .venv in the clone (reused when healthy), llama-cpp-python
# from the per-machine wheel cache, draftpen installed editable with its test extras
# (and mlx: Apple's CPU build on Linux), the test models in a store outside the clone
# (GGUF files, and their MLX conversions), then ruff, deptry and pytest.
#
# Arguments go to pytest:  bash packaging/test.sh -m "not real_model" -x
# Exit status: pytest's; when pytest passes, ruff's, then deptry's.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=packaging/lib.sh
. "$REPO_ROOT/packaging/lib.sh"
cd "$REPO_ROOT"

venv="$REPO_ROOT/.venv"
venv_python="$venv/bin/python"

step "Python"
python=$(find_python)
say "Using $python ($("$python" -V 2>&1))"

step "Virtualenv"
ensure_venv "$venv" "$python"
export PATH="$venv/bin:$PATH"

step "llama-cpp-python"
install_llama "$venv"

step "draftpen (editable, with test extras)"
extras="test"
if [[ -n $(test_platform_extras) ]]; then
    extras="test,$(test_platform_extras)"
fi
"$venv_python" -m pip install --quiet -e "${REPO_ROOT}[$extras]"
say "Installed draftpen[$extras] in editable mode"

step "Runtime check"
# Decode a few tokens in a child process; a crash rebuilds llama-cpp-python once with
# portable flags (see verify_llama_runtime in lib.sh).
verify_llama_runtime "$venv"

step "Test models"
# One store per machine, outside the clone: ~1.6 GB is fetched once, not on every run.
export DRAFTPEN_MODELS_DIR="${DRAFTPEN_MODELS_DIR:-$HOME/.cache/draftpen-test-models}"
say "Model store: $DRAFTPEN_MODELS_DIR"
"$venv/bin/draftpen" models pull starter
"$venv/bin/draftpen" models pull smollm2
if "$venv_python" -c 'import mlx_lm' >/dev/null 2>&1; then
    # The MLX variants: converted from those GGUF files once per machine (~2 min), into
    # the same store, so the conformance tests run on both runtimes.
    "$venv/bin/draftpen" models pull starter --runtime mlx
    "$venv/bin/draftpen" models pull smollm2 --runtime mlx
else
    say "mlx is not installed here: the MLX tests will be skipped"
fi
# Tests that need a real model fail, rather than skip, when it is missing.
export DRAFTPEN_REQUIRE_MODELS=1

step "Agent CLIs"
# The agents' own CLIs, as published on npm, answer through draftpen in the agent_cli
# tests (-m agent_cli runs them alone). Installed once per machine and version into a
# prefix outside the clone; where npm or Node.js is missing the tests that need a CLI
# fail and say which.
install_agent_clis

step "ruff check app backends tests"
ruff_status=0
"$venv_python" -m ruff check app backends tests || ruff_status=$?

step "deptry ."
# Every third-party import under app/ and backends/ is a dependency of the user's install
# (pyproject.toml's [tool.deptry]: the test extra does not count).
deptry_status=0
"$venv/bin/deptry" . || deptry_status=$?

step "pytest $*"
pytest_status=0
"$venv_python" -m pytest "$@" || pytest_status=$?

step "Summary"
say "ruff:   $([[ $ruff_status -eq 0 ]] && echo ok || echo "failed (exit $ruff_status)")"
say "deptry: $([[ $deptry_status -eq 0 ]] && echo ok || echo "failed (exit $deptry_status)")"
say "pytest: $([[ $pytest_status -eq 0 ]] && echo ok || echo "failed (exit $pytest_status)")"
if [[ $pytest_status -ne 0 ]]; then
    exit "$pytest_status"
fi
if [[ $ruff_status -ne 0 ]]; then
    exit "$ruff_status"
fi
exit "$deptry_status"
