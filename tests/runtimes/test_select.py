"""Which runtime a machine gets, decided from facts (no hardware needed)."""

from __future__ import annotations

import pytest

from app.cli.doctor import DoctorReport, render_report
from backends.errors import RuntimeUnavailableError
from backends.select import RuntimeFacts, choose_runtime, decide_runtime

APPLE_WITH_MLX = RuntimeFacts("Darwin", "arm64", "0.32.4", "0.3.36")
APPLE_WITHOUT_MLX = RuntimeFacts("Darwin", "arm64", None, "0.3.36")
INTEL_MAC = RuntimeFacts("Darwin", "x86_64", "0.32.4", "0.3.36")
LINUX_WITH_BOTH = RuntimeFacts("Linux", "x86_64", "0.32.4", "0.3.36")
LINUX_MLX_ONLY = RuntimeFacts("Linux", "x86_64", "0.32.4", None)


def test_apple_silicon_with_mlx_runs_mlx():
    decision = decide_runtime(APPLE_WITH_MLX)
    assert decision.runtime == "mlx"
    assert "Apple Silicon" in decision.reason


@pytest.mark.parametrize("facts", [APPLE_WITHOUT_MLX, INTEL_MAC, LINUX_WITH_BOTH])
def test_everything_else_with_llama_cpp_runs_llama_cpp(facts: RuntimeFacts):
    assert decide_runtime(facts).runtime == "llamacpp"


def test_mlx_cpu_build_on_linux_is_not_chosen_over_llama_cpp():
    # The tests install mlx[cpu] on Linux; it must not change what users get there.
    assert choose_runtime(None, LINUX_WITH_BOTH) == "llamacpp"
    assert choose_runtime("auto", LINUX_WITH_BOTH) == "llamacpp"


def test_mlx_is_used_where_it_is_the_only_runtime():
    assert decide_runtime(LINUX_MLX_ONLY).runtime == "mlx"


def test_requested_runtime_overrides_the_machine():
    assert choose_runtime("mlx", LINUX_WITH_BOTH) == "mlx"
    assert choose_runtime("llamacpp", APPLE_WITH_MLX) == "llamacpp"


def test_unknown_runtime_is_refused_naming_the_choices():
    with pytest.raises(RuntimeUnavailableError, match="llamacpp, mlx"):
        choose_runtime("vllm", LINUX_WITH_BOTH)


def test_doctor_names_the_runtime_and_why():
    report = DoctorReport(
        os_name="macOS-15.1-arm64",
        chip="Apple M3 Pro",
        memory_gib=36.0,
        gpus=(),
        facts=APPLE_WITH_MLX,
        llama_cpp_gpu_offload=True,
        mlx_device="gpu",
    )
    lines = render_report(report)
    assert "chip:       Apple M3 Pro (Apple Silicon)" in lines
    assert "llama.cpp:  0.3.36 (GPU offload)" in lines
    assert "mlx:        0.32.4 (device: gpu)" in lines
    [runtime] = [line for line in lines if line.startswith("runtime:")]
    assert runtime.startswith("runtime:    mlx (Apple Silicon with mlx 0.32.4 installed)")
    # Then auto's stored costs: none on a machine that has loaded no pair.
    assert lines[-1] == "auto's costs: none measured yet (a pair's first load measures them)"


def test_doctor_shows_nvidia_gpus_and_missing_runtimes():
    report = DoctorReport(
        os_name="Linux-6.8-x86_64",
        chip="AMD Ryzen 9 7950X",
        memory_gib=64.0,
        gpus=("NVIDIA GeForce RTX 4090, 24564 MiB",),
        facts=RuntimeFacts("Linux", "x86_64", None, "0.3.36"),
        llama_cpp_gpu_offload=True,
        mlx_device=None,
    )
    lines = render_report(report)
    assert "GPU:        NVIDIA GeForce RTX 4090, 24564 MiB" in lines
    assert "mlx:        not installed" in lines
    [runtime] = [line for line in lines if line.startswith("runtime:")]
    assert runtime.startswith("runtime:    llamacpp (Linux x86_64 is not Apple Silicon)")
