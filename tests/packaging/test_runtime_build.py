"""The llama.cpp build: no AMX kernels in the installed libraries, and the flags that
packaging/lib.sh builds with (run in bash, the way install.sh and test.sh use them).

ggml's AMX matmul (``ggml_backend_amx_mul_mat``) segfaults on the first batched decode
on Intel CPUs with AMX (llama.cpp #20824), so the standard build compiles it out. This
is checked on the installed library itself, so it holds on every CI machine, AMX or not.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from tests.packaging.shell import (
    lib_sh,
    shell_output,
)

AMX_MATMUL = "ggml_backend_amx_mul_mat"
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


# -- the installed libraries -------------------------------------------------------------


def llama_cpp_libraries() -> list[Path]:
    """The installed llama_cpp package's ggml CPU backend and libllama (each real file
    once: the .so, .so.0 and .so.0.x names are copies or links of one library)."""
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.submodule_search_locations, "llama-cpp-python is missing"
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    found = {
        path.resolve()
        for pattern in ("libggml-cpu*.so*", "libllama.so*", "libggml-cpu*.dylib", "libllama*.dylib")
        for path in lib_dir.glob(pattern)
        if path.is_file()
    }
    return sorted(found)


def elf_symbols(path: Path) -> set[str]:
    """Every symbol name in the ELF file's dynamic symbol table (what it exports and
    imports) and, when it was not stripped, its full symbol table."""
    names: set[str] = set()
    with path.open("rb") as handle:
        elf = ELFFile(handle)
        for section in elf.iter_sections():
            if isinstance(section, SymbolTableSection):
                names.update(symbol.name for symbol in section.iter_symbols() if symbol.name)
    return names


def symbols_naming(path: Path, name: str) -> list[str]:
    """The symbols of ``path`` that are ``name``, as C or as a mangled C++ name (which
    holds the identifier verbatim: ``_Z24ggml_backend_amx_mul_matPK...``)."""
    return sorted(symbol for symbol in elf_symbols(path) if name in symbol)


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            ELFFile(handle)
    except ELFError:
        return False
    return True


def test_installed_llama_cpp_libraries_have_no_amx_matmul() -> None:
    libraries = llama_cpp_libraries()
    assert any("ggml-cpu" in path.name for path in libraries), libraries
    for path in libraries:
        if is_elf(path):
            assert symbols_naming(path, AMX_MATMUL) == [], f"{path} has the AMX matmul"
        # Second check, format-free: the name in the bytes at all (a symbol table of
        # any kind, a string, a macOS dylib) means the kernel was compiled in.
        assert AMX_MATMUL.encode() not in path.read_bytes(), f"{path} mentions {AMX_MATMUL}"


def test_the_symbol_check_finds_symbols_that_are_there() -> None:
    # The negative control: were the reader broken (no symbols at all, a wrong table),
    # the test above would pass on a build full of AMX kernels.
    libraries = {path.name.split(".so")[0]: path for path in llama_cpp_libraries()}
    cpu = libraries["libggml-cpu"]
    if not is_elf(cpu):
        pytest.skip("the ELF symbol reader applies to Linux builds")
    assert symbols_naming(cpu, "ggml_backend_cpu_init") == ["ggml_backend_cpu_init"]
    assert b"ggml_backend_cpu_init" in cpu.read_bytes()
    assert "llama_decode" in elf_symbols(libraries["libllama"])
    # C++ functions are found by the identifier inside their mangled name, as the AMX
    # matmul (a C++ function in ggml-cpu/amx/mmq.cpp) would be: _Z<length><identifier>.
    mangled = [re.match(r"_Z(\d+)", name) for name in elf_symbols(cpu)]
    lengths = [(match.string, int(match.group(1))) for match in mangled if match]
    assert lengths, "libggml-cpu exports no C++ function to try the mangled match on"
    symbol, length = lengths[0]
    identifier = symbol[len(f"_Z{length}") :][:length]
    assert symbol in symbols_naming(cpu, identifier)
    assert identifier not in elf_symbols(cpu)  # found only through the mangled name


def test_the_no_amx_flags_win_over_march_native_on_an_amx_cpu() -> None:
    # The build puts CMAKE_C_FLAGS before ggml's -march=native. On an AMX CPU that
    # enables AMX, and ggml compiles its AMX kernels when __AMX_INT8__ is defined: the
    # explicit -mno-amx-* must still win. -march=sapphirerapids stands in for an AMX CPU.
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler here (the build needs one; this check does too)")
    args = shlex.split(shell_output("llama_cmake_args cpu", machine="x86_64"))
    flags = next(arg for arg in args if arg.startswith("-DCMAKE_C_FLAGS="))
    no_amx = flags.removeprefix("-DCMAKE_C_FLAGS=").split()

    def macros(*options: str) -> str:
        result = subprocess.run(
            [compiler, *options, "-march=sapphirerapids", "-dM", "-E", "-x", "c", "-"],
            input="",
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            pytest.skip(f"{compiler} does not know -march=sapphirerapids: {result.stderr}")
        return result.stdout

    assert "__AMX_INT8__" in macros()  # the control: the CPU alone would turn it on
    assert "__AVX512VNNI__" in macros(*no_amx)  # the rest of the CPU is kept
    assert "__AMX_INT8__" not in macros(*no_amx)
    assert "__AMX_TILE__" not in macros(*no_amx)


@pytest.fixture
def cpuinfo(tmp_path: Path) -> Path:
    """A fake /proc/cpuinfo of an AMX machine (Sapphire Rapids' flags, abridged)."""
    path = tmp_path / "cpuinfo"
    path.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\n"
        "flags\t\t: fpu sse sse2 sse4_2 avx avx2 fma f16c bmi2 avx512f avx512_vnni "
        "amx_bf16 amx_tile amx_int8\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    return path


def test_the_cpu_build_compiles_amx_out_on_x86_64(cpuinfo: Path) -> None:
    env = {"DRAFTPEN_CPUINFO": str(cpuinfo)}
    args = shell_output("llama_cmake_args cpu", env=env, machine="x86_64")
    assert f"'-DCMAKE_C_FLAGS={NO_AMX_FLAGS}'" in args
    assert f"'-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}'" in args
    # And the CUDA build, whose CPU part is the same ggml-cpu.
    assert NO_AMX_FLAGS in shell_output("llama_cmake_args cuda", env=env, machine="x86_64")


def test_the_no_amx_flags_are_one_argument_each_for_cmake() -> None:
    # scikit-build-core splits CMAKE_ARGS with shlex: each quoted flag stays whole.
    args = shell_output("llama_cmake_args cpu", machine="x86_64")
    assert shlex.split(args) == [
        "-DGGML_RPC=ON",
        f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}",
        f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}",
    ]


def test_draftpen_llama_amx_turns_the_amx_kernels_back_on() -> None:
    args = shell_output("llama_cmake_args cpu", env={"DRAFTPEN_LLAMA_AMX": "1"}, machine="x86_64")
    assert "amx" not in args


def test_no_amx_flags_where_the_cpu_is_not_x86() -> None:
    assert shell_output("llama_cmake_args cpu", machine="aarch64") == "-DGGML_RPC=ON"


def test_every_standard_build_has_the_rpc_backend_for_workers(cpuinfo: Path) -> None:
    env = {"DRAFTPEN_CPUINFO": str(cpuinfo)}
    for flavour in ("cpu", "cuda", "metal", "portable"):
        args = shlex.split(shell_output(f"llama_cmake_args {flavour}", env=env, machine="x86_64"))
        assert "-DGGML_RPC=ON" in args, flavour
    # A custom build is the user's flags exactly (doctor says whether it has RPC).
    custom = {**env, "DRAFTPEN_LLAMA_CMAKE_ARGS": "-DGGML_NATIVE=ON"}
    assert shell_output("llama_cmake_args custom", env=custom) == "-DGGML_NATIVE=ON"


def test_the_wheel_cache_directory_changes_with_the_flags_and_the_cpu(
    cpuinfo: Path, tmp_path: Path
) -> None:
    env = {"DRAFTPEN_CPUINFO": str(cpuinfo), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    no_amx = shell_output("llama_wheel_dir cpu", env=env, machine="x86_64")
    with_amx = shell_output(
        "llama_wheel_dir cpu", env={**env, "DRAFTPEN_LLAMA_AMX": "1"}, machine="x86_64"
    )
    portable = shell_output("llama_wheel_dir portable", env=env, machine="x86_64")
    assert no_amx.startswith(str(tmp_path / "cache" / "draftpen" / "wheels" / "cpu-"))
    assert portable.startswith(str(tmp_path / "cache" / "draftpen" / "wheels" / "portable-"))
    assert len({no_amx, with_amx}) == 2
    # The same flags on another CPU: a native wheel from a shared home directory is
    # not reused there (it would die by SIGILL).
    other_cpu = tmp_path / "other-cpuinfo"
    other_cpu.write_text("flags\t\t: fpu sse sse2 avx avx2 fma f16c bmi2\n")
    elsewhere = shell_output(
        "llama_wheel_dir cpu", env={**env, "DRAFTPEN_CPUINFO": str(other_cpu)}, machine="x86_64"
    )
    assert elsewhere != no_amx
    # Asked twice, the same answer: the cache is found again.
    assert shell_output("llama_wheel_dir cpu", env=env, machine="x86_64") == no_amx


def test_portable_flags_follow_this_cpus_flags(cpuinfo: Path, tmp_path: Path) -> None:
    args = shell_output(
        "llama_cmake_args portable", env={"DRAFTPEN_CPUINFO": str(cpuinfo)}, machine="x86_64"
    ).split()
    assert "-DGGML_NATIVE=OFF" in args
    for feature in ("SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2"):
        assert f"-DGGML_{feature}=ON" in args
    # AVX-512 and AMX stay off even on a CPU that has them: the fallback must run.
    for feature in ("AVX512", "AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{feature}=OFF" in args

    older = tmp_path / "older-cpuinfo"
    older.write_text("flags\t\t: fpu sse sse2 avx\n")
    args = shell_output(
        "llama_cmake_args portable", env={"DRAFTPEN_CPUINFO": str(older)}, machine="x86_64"
    ).split()
    assert "-DGGML_AVX=ON" in args
    for feature in ("SSE42", "AVX2", "FMA", "F16C", "BMI2"):
        assert f"-DGGML_{feature}=OFF" in args


def test_draftpen_llama_flavour_chooses_the_build() -> None:
    assert shell_output("llama_flavour", env={"DRAFTPEN_LLAMA_FLAVOUR": "portable"}) == "portable"
    refused = lib_sh("llama_flavour", env={"DRAFTPEN_LLAMA_FLAVOUR": "fast"})
    assert refused.returncode != 0
    assert "cpu, cuda, metal or portable" in refused.stderr


def test_a_cpu_without_a_flags_line_is_no_error(tmp_path: Path) -> None:
    # ARM's /proc/cpuinfo says "Features", not "flags"; install.sh runs with
    # `set -euo pipefail`, where a grep that finds nothing must not end the install.
    arm = tmp_path / "arm-cpuinfo"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 cpuid\n")
    env = {"DRAFTPEN_CPUINFO": str(arm), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert shell_output("cpu_flags; echo done", env=env, machine="aarch64") == "done"
    assert "/wheels/cpu-" in shell_output("llama_wheel_dir cpu", env=env, machine="aarch64")
