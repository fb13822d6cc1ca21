"""``draftpen doctor``: the real command, its runtime check, and the CPU features.

The command runs as a user runs it (the console script, in a subprocess); the runtime
check's child is made to crash with its test hook (``DRAFTPEN_RUNTIME_CHECK_CRASH``).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.runtime_check.cpu_features import feature_uses, parse_system_info
from app.runtime_check.install_record import RECORD_ENV, InstallCheck
from app.runtime_check.probe import CRASH_HOOK_ENV

DRAFTPEN = Path(sys.executable).parent / "draftpen"
AMX_CPUINFO = (
    "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512_vnni "
    "amx_bf16 amx_tile amx_int8\n"
)


def doctor(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in (CRASH_HOOK_ENV, "DRAFTPEN_CPUINFO")
    }
    return subprocess.run(
        [str(DRAFTPEN), "doctor", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, **extra_env},
    )


def doctor_json(**extra_env: str) -> tuple[int, dict[str, Any]]:
    result = doctor("--json", **extra_env)
    return result.returncode, json.loads(result.stdout)


def test_doctor_json_shows_the_runtime_check_that_ran() -> None:
    status, report = doctor_json()
    check = report["runtime_check"]
    assert status == 0, check
    assert check["outcome"] == "ok"
    assert check["tokens_one_at_a_time"] == 4
    assert check["batch_tokens"] == 32
    assert "tiny random-weight llama" in check["model"]
    assert check["signal"] is None
    assert check["llama_cpp_version"] == importlib.metadata.version("llama-cpp-python")
    assert report["llama_cpp"]["version"] == check["llama_cpp_version"]
    assert report["runtime"]["name"] in ("llamacpp", "mlx")


def test_doctor_json_shows_the_cpu_features_and_the_build_has_no_amx() -> None:
    _, report = doctor_json()
    features = {feature["name"]: feature for feature in report["cpu_features"]}
    assert list(features) == ["AVX2", "AVX-512", "AMX"]
    # The build's side comes from llama.cpp's system info: known, and never AMX.
    assert all(isinstance(feature["build"], bool) for feature in features.values())
    assert features["AMX"]["build"] is False
    assert "AMX_INT8 = 1" not in report["runtime_check"]["system_info"]


def test_doctor_says_amx_is_left_out_on_purpose_on_an_amx_cpu(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AMX_CPUINFO)
    _, report = doctor_json(DRAFTPEN_CPUINFO=str(cpuinfo))
    amx = next(feature for feature in report["cpu_features"] if feature["name"] == "AMX")
    if report["os"].startswith("Linux") and "x86_64" in report["os"]:
        assert amx["cpu"] is True
        assert amx["build"] is False
        assert "#20824" in amx["note"]
        assert "DRAFTPEN_LLAMA_AMX=1" in amx["note"]
    text = doctor(DRAFTPEN_CPUINFO=str(cpuinfo)).stdout
    assert "CPU features (this CPU / this llama.cpp build):" in text
    assert "  AMX:" in text


def test_doctor_reports_a_crashing_runtime_by_signal_with_the_fix() -> None:
    status, report = doctor_json(**{CRASH_HOOK_ENV: "SIGSEGV"})
    check = report["runtime_check"]
    assert status == 1  # scripts can tell the runtime is broken
    assert check["outcome"] == "crashed"
    assert check["signal"] == "SIGSEGV"
    assert check["returncode"] == -11
    assert "CPU kernel" in check["cause"]
    assert "portable" in check["fix"]
    assert check["tokens_one_at_a_time"] == 4 and check["batch_tokens"] == 0
    # doctor itself survived, and still knows the build (reported before the crash).
    assert report["cpu_features"][0]["build"] is not None


def test_doctor_text_names_the_signal_the_cause_and_the_fix() -> None:
    result = doctor(**{CRASH_HOOK_ENV: "SIGILL"})
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert "runtime check: crashed: SIGILL (signal 4) while decoding a batch" in lines
    assert any(line.startswith("  cause: an instruction this CPU does not have") for line in lines)
    assert any(line.startswith("  fix:   delete the cached wheel") for line in lines)


def test_doctor_text_shows_what_the_check_loaded_and_decoded() -> None:
    result = doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    check_line = next(line for line in result.stdout.splitlines() if "runtime check:" in line)
    assert "ok: loaded a tiny random-weight llama" in check_line
    assert "decoded 4 tokens one at a time and a batch of 32" in check_line


def test_doctor_shows_the_installers_runtime_check_of_this_environment(tmp_path: Path) -> None:
    record = tmp_path / "install-check.json"
    env = {RECORD_ENV: str(record)}
    missing = doctor(**env).stdout.splitlines()
    assert any(
        line.startswith("installer:  no runtime check recorded in this environment")
        for line in missing
    )
    assert doctor_json(**env)[1]["install_check"] is None

    # What the installer runs (packaging/lib.sh, verify_llama_runtime), here on "cpu".
    checked = subprocess.run(
        [sys.executable, "-m", "app.runtime_check", "--record", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    line = next(line for line in doctor(**env).stdout.splitlines() if line.startswith("installer:"))
    version = importlib.metadata.version("llama-cpp-python")
    assert line.startswith(
        f"installer:  the runtime check of the cpu build of llama-cpp-python {version} passed on "
    )
    installed = doctor_json(**env)[1]["install_check"]
    assert (installed["outcome"], installed["build"]) == ("ok", "cpu")
    assert installed["llama_cpp_version"] == version
    assert "decoded 4 tokens one at a time and a batch of 32" in installed["summary"]


def test_an_installers_check_that_did_not_pass_says_what_happened() -> None:
    record = InstallCheck(
        outcome="crashed",
        summary="crashed: SIGSEGV (signal 11) while decoding a batch",
        build="cpu",
        checked_at=0.0,
        llama_cpp_version=None,
    )
    text = record.describe()
    assert text.startswith("the runtime check of the cpu build ended crashed on ")
    assert text.endswith(": crashed: SIGSEGV (signal 11) while decoding a batch")


# -- the features, from made-up machines -------------------------------------------------

SYSTEM_INFO = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | OPENMP = 1 | REPACK = 1 |"


def test_llama_cpp_system_info_is_read_as_keys_and_values() -> None:
    info = parse_system_info(SYSTEM_INFO)
    assert info["AVX2"] == "1" and info["REPACK"] == "1"
    assert "AMX_INT8" not in info


def test_a_build_using_what_the_cpu_lacks_is_flagged_as_a_sigill() -> None:
    flags = frozenset({"avx", "avx2", "fma"})  # no AVX-512 on this (made-up) CPU
    uses = {use.name: use for use in feature_uses(flags, SYSTEM_INFO, x86=True)}
    assert (uses["AVX2"].cpu, uses["AVX2"].build, uses["AVX2"].note) == (True, True, "")
    assert (uses["AVX-512"].cpu, uses["AVX-512"].build) == (False, True)
    assert "SIGILL" in uses["AVX-512"].note


def test_unknowns_stay_unknown() -> None:
    uses = feature_uses(None, None, x86=True)
    assert all(use.cpu is None and use.build is None for use in uses)
    arm = feature_uses(frozenset({"neon"}), SYSTEM_INFO, x86=False)
    assert all(use.cpu is None and "not an x86-64 CPU" in use.note for use in arm)
