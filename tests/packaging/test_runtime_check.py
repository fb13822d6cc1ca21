"""The runtime check: a child process decodes a tiny model; its exit is diagnosed; the
installer's verify_llama_runtime falls back to a portable build once.

The failures are real: the child kills itself with the signal asked for through its
test hook (``DRAFTPEN_RUNTIME_CHECK_CRASH``), the way a crashing kernel would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.runtime_check.check import run_runtime_check
from app.runtime_check.install_record import RECORD_ENV, read_install_check
from app.runtime_check.probe import CRASH_HOOK_ENV
from app.runtime_check.tiny_model import write_tiny_model
from tests.packaging.shell import shell_output

REPO = Path(__file__).resolve().parents[2]
LIB_SH = REPO / "packaging" / "lib.sh"


def child_env(**extra: str) -> dict[str, str]:
    """This environment without any crash hook, plus ``extra``."""
    env = {key: value for key, value in os.environ.items() if key != CRASH_HOOK_ENV}
    return {**env, **extra}


def test_the_tiny_model_is_a_llama_gguf_with_quantized_matrices(tmp_path: Path) -> None:
    import gguf

    tiny = write_tiny_model(tmp_path)
    reader = gguf.GGUFReader(tiny.path)
    types = {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}
    assert reader.fields["general.architecture"].contents() == "llama"
    assert types["blk.0.attn_q.weight"] == "Q4_0"
    assert types["blk.0.ffn_up.weight"] == "Q4_K"
    assert types["output.weight"] == "Q8_0"
    assert types["token_embd.weight"] == "F16"
    # Rows in multiples of 32: what CPU repacking and AMX's tiles take.
    for tensor in reader.tensors:
        if tensor.tensor_type.name in ("Q4_0", "Q4_K", "Q8_0"):
            assert int(tensor.shape[1]) % 32 == 0, tensor.name
    for tensor in reader.tensors:
        if tensor.tensor_type.name == "Q4_K":
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            assert abs(values).max() < 10  # finite, small: the hand-made blocks are sane


def test_the_runtime_decodes_one_at_a_time_and_in_a_batch() -> None:
    check = run_runtime_check(env=child_env())
    assert check.ok, (check.summary, check.stderr_tail)
    assert check.outcome == "ok"
    assert check.tokens_one_at_a_time == 4
    assert check.batch_tokens == 32
    assert check.model is not None and "llama" in check.model
    assert check.llama_cpp_version
    assert check.system_info and "CPU" in check.system_info
    assert check.signal is None and check.fix is None
    assert "decoded 4 tokens one at a time and a batch of 32" in check.summary


@pytest.mark.parametrize(
    ("signal_name", "cause_words", "fix_words"),
    [
        ("SIGSEGV", "CPU kernel", "portable"),
        ("SIGBUS", "CPU kernel", "portable"),
        ("SIGILL", "built on another CPU", "delete the cached wheel"),
        ("SIGABRT", "ggml assertion", "draftpen doctor"),
    ],
)
def test_a_crash_is_reported_by_its_signal_with_cause_and_fix(
    signal_name: str, cause_words: str, fix_words: str
) -> None:
    check = run_runtime_check(env=child_env(**{CRASH_HOOK_ENV: signal_name}))
    assert check.outcome == "crashed"
    assert check.rebuild_may_help
    assert check.signal == signal_name
    assert check.returncode is not None and check.returncode < 0
    assert check.cause is not None and cause_words in check.cause
    assert check.fix is not None and fix_words in check.fix
    # The hook fires after loading and decoding one token at a time: the report still
    # says what was loaded and where it died.
    assert check.model is not None
    assert check.tokens_one_at_a_time == 4
    assert check.batch_tokens == 0
    assert check.summary.endswith("while decoding a batch")


def test_the_amx_crash_names_the_upstream_issue() -> None:
    check = run_runtime_check(env=child_env(**{CRASH_HOOK_ENV: "SIGSEGV"}))
    assert check.cause is not None and "#20824" in check.cause
    assert "Segmentation fault" in check.stderr_tail  # faulthandler's report is kept


def test_a_hang_is_stopped_by_the_time_limit() -> None:
    check = run_runtime_check(timeout_s=5, env=child_env(**{CRASH_HOOK_ENV: "hang"}))
    assert check.outcome == "hung"
    assert check.rebuild_may_help
    assert check.returncode is None
    # Where it was stopped depends on how busy the machine is; the hook hangs after the
    # single decodes, so it never reached the batch.
    assert check.batch_tokens == 0
    assert check.summary.startswith("hung while")
    assert check.fix is not None and "portable" in check.fix


def test_a_python_error_in_the_child_is_a_failure_not_a_crash() -> None:
    check = run_runtime_check(env=child_env(**{CRASH_HOOK_ENV: "SIGNOTHING"}))
    assert check.outcome == "failed"
    assert not check.rebuild_may_help
    assert check.error is not None and "names no signal" in check.error


def run_module(**extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.runtime_check"],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(**extra),
        cwd=REPO,
    )


def test_the_installer_step_exits_by_what_a_rebuild_could_fix() -> None:
    ok = run_module()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("Runtime check: ok: loaded a tiny random-weight llama")

    crashed = run_module(**{CRASH_HOOK_ENV: "SIGSEGV"})
    assert crashed.returncode == 3
    assert "crashed: SIGSEGV (signal 11) while decoding a batch" in crashed.stdout
    assert "cause: the runtime crashed in a CPU kernel" in crashed.stdout
    assert "fix:   rebuild llama-cpp-python with the portable flags" in crashed.stdout

    failed = run_module(**{CRASH_HOOK_ENV: "SIGNOTHING"})
    assert failed.returncode == 1


# -- verify_llama_runtime, the installer's step, in bash ---------------------------------


def verify(
    tmp_path: Path, *, install_stub: str, **extra: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run verify_llama_runtime on this virtualenv with install_llama replaced by a stub
    that records its arguments (no 10-minute build in a test)."""
    calls = tmp_path / "install_llama.calls"
    script = f"""
set -euo pipefail
. {LIB_SH}
install_llama() {{
    printf '%s\\n' "$*" >> {calls}
    {install_stub}
}}
verify_llama_runtime {sys.prefix}
echo "verify returned"
"""
    env = {
        key: value
        for key, value in child_env(**extra).items()
        if key not in ("DRAFTPEN_LLAMA_FLAVOUR", "DRAFTPEN_LLAMA_CMAKE_ARGS")
    }
    env.update(extra)
    # The crashed-build mark and the check's record go to this test's files, never the
    # real cache or this virtualenv.
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env[RECORD_ENV] = str(tmp_path / "install-check.json")
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )
    recorded = calls.read_text().splitlines() if calls.exists() else []
    return result, recorded


def test_verify_passes_a_runtime_that_runs_without_rebuilding(tmp_path: Path) -> None:
    result, calls = verify(tmp_path, install_stub=":")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Runtime check: ok" in result.stdout
    assert "verify returned" in result.stdout
    assert calls == []


def test_verify_rebuilds_once_with_portable_flags_then_gives_up(tmp_path: Path) -> None:
    result, calls = verify(tmp_path, install_stub=":", **{CRASH_HOOK_ENV: "SIGSEGV"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert calls == [f"{sys.prefix} portable"]  # one rebuild, the portable one
    assert result.stdout.count("crashed: SIGSEGV") == 2  # checked before and after it
    assert "rebuilding it once with the portable flags: -DGGML_NATIVE=OFF" in result.stderr
    assert "still fails the runtime check with the portable build" in result.stderr
    assert "giving up" in result.stderr
    assert "verify returned" not in result.stdout


def test_verify_keeps_the_portable_build_when_it_runs(tmp_path: Path) -> None:
    # The stub "installs" a build that runs: the crash hook is gone after it.
    result, calls = verify(
        tmp_path, install_stub=f"unset {CRASH_HOOK_ENV}", **{CRASH_HOOK_ENV: "SIGILL"}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls == [f"{sys.prefix} portable"]
    assert "crashed: SIGILL" in result.stdout
    assert "The portable build runs" in result.stdout
    assert "verify returned" in result.stdout


def test_a_build_that_crashed_once_is_skipped_by_the_next_install(tmp_path: Path) -> None:
    def lib(function: str, **extra: str) -> str:
        return shell_output(function, env={"XDG_CACHE_HOME": str(tmp_path / "cache"), **extra})

    native = lib("llama_flavour")  # cpu here; cuda or metal elsewhere
    result, _ = verify(
        tmp_path, install_stub=f"unset {CRASH_HOOK_ENV}", **{CRASH_HOOK_ENV: "SIGSEGV"}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    marks = list((tmp_path / "cache").rglob("crashed-runtime-check"))
    assert [mark.parent for mark in marks] == [Path(lib(f"llama_wheel_dir {native}"))]
    assert "later installs go straight to it" in result.stdout

    assert lib("install_flavour") == "portable"  # the next install: no second crash
    assert lib("install_flavour", DRAFTPEN_LLAMA_FLAVOUR=native) == native  # tries it again
    marks[0].unlink()
    assert lib("install_flavour") == native


def test_verify_keeps_the_result_of_the_check_that_counted_for_doctor(tmp_path: Path) -> None:
    venv_record = Path(sys.prefix) / "draftpen-install-check.json"
    before = venv_record.read_bytes() if venv_record.exists() else None
    result, _ = verify(tmp_path, install_stub=":")
    assert result.returncode == 0, result.stdout + result.stderr
    first = read_install_check(tmp_path / "install-check.json")
    assert first is not None and first.outcome == "ok"
    assert first.build in ("cpu", "cuda", "metal")  # this machine's own build

    # A crash, then the portable build runs: the record is the portable build's check.
    result, _ = verify(
        tmp_path, install_stub=f"unset {CRASH_HOOK_ENV}", **{CRASH_HOOK_ENV: "SIGSEGV"}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    second = read_install_check(tmp_path / "install-check.json")
    assert second is not None and second.outcome == "ok"
    assert second.build == f"portable (after the {first.build} build crashed)"

    # The test's records went to its own file: this virtualenv's record is untouched.
    assert (venv_record.read_bytes() if venv_record.exists() else None) == before


def test_verify_does_not_rebuild_a_portable_build_again(tmp_path: Path) -> None:
    result, calls = verify(
        tmp_path,
        install_stub=":",
        **{CRASH_HOOK_ENV: "SIGSEGV", "DRAFTPEN_LLAMA_FLAVOUR": "portable"},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert calls == []
    assert "portable build crashed in the runtime check" in result.stderr


def test_verify_does_not_rebuild_for_an_error_a_build_cannot_fix(tmp_path: Path) -> None:
    result, calls = verify(tmp_path, install_stub=":", **{CRASH_HOOK_ENV: "SIGNOTHING"})
    assert result.returncode == 1
    assert calls == []
    assert "could not decode with llama-cpp-python" in result.stderr


def test_verify_does_not_replace_flags_the_user_chose(tmp_path: Path) -> None:
    result, calls = verify(
        tmp_path,
        install_stub=":",
        **{CRASH_HOOK_ENV: "SIGSEGV", "DRAFTPEN_LLAMA_CMAKE_ARGS": "-DGGML_NATIVE=ON"},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert calls == []
    assert "built with DRAFTPEN_LLAMA_CMAKE_ARGS crashed" in result.stderr


def test_without_the_gguf_package_the_check_says_how_to_get_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['gguf'] = None  # as if it were not installed\n"
        "from app.runtime_check.check import run_runtime_check\n"
        "check = run_runtime_check()\n"
        "print(check.outcome, check.fix, sep='|')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    outcome, fix = result.stdout.strip().split("|")
    assert outcome == "failed"
    assert "reinstall draftpen" in fix
