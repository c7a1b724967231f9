"""Configs that fit the GPU (trainer.hardware, node_checks, accel.wrap_ddp): bf16 on a GPU older than Ampere,
COMPILE on a node without a compiler or Python.h, DECODER_DEVICE cuda with a CPU-only torchcodec are each refused in
one line naming the GPU or the fix; DDP is not built with static_graph for a compiled model. The rules take their
facts (a capability, a compiler lookup, a version) as arguments, so every GPU case is checked on this CPU machine;
the refusals also go through the node check the launch runs (python -m trainer.config --check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from trainer.accel import autocast_dtype, ddp_module, grad_scaler, uses_grad_scaler, wrap_ddp
from trainer.config import ConfigError, validate_config
from trainer.distributed import DistContext
from trainer.hardware import Gpu, amp_problem, compile_problem, decoder_device_problem
from trainer.node_checks import check_runtime

REPO = Path(__file__).resolve().parents[2]
V100 = Gpu(0, "Tesla V100-SXM2-16GB", (7, 0))
T4 = Gpu(1, "Tesla T4", (7, 5))
A100 = Gpu(0, "NVIDIA A100-SXM4-80GB", (8, 0))


def test_bf16_is_refused_on_gpus_older_than_ampere_naming_them() -> None:
    assert amp_problem("bf16", [V100, T4]) == (
        "CONFIG.TRAIN.AMP: bf16 needs a GPU of compute capability 8.0 or newer (Ampere or later), and GPU 0 Tesla "
        "V100-SXM2-16GB (sm_70), GPU 1 Tesla T4 (sm_75) has none; set AMP to fp16 (float16 with the gradient scaler) "
        "or auto (fp16 with the scaler on this GPU)")
    assert amp_problem("bf16", [A100, Gpu(1, "NVIDIA H200", (9, 0))]) is None
    assert "GPU 1 Tesla T4 (sm_75)" in str(amp_problem("bf16", [A100, T4]))  # the one that lacks it, alone
    assert amp_problem("bf16", []) is None  # a CPU trains in float32 whatever AMP says
    assert all(amp_problem(amp, [V100]) is None for amp in ("fp16", "auto", "off"))


def test_amp_auto_is_bf16_from_ampere_on_and_fp16_with_the_scaler_before() -> None:
    chosen = {gpu.name: autocast_dtype("auto", gpu.capability) for gpu in (V100, T4, A100)}
    assert chosen == {V100.name: torch.float16, T4.name: torch.float16, A100.name: torch.bfloat16}
    assert autocast_dtype("auto", (9, 0)) is torch.bfloat16 and autocast_dtype("auto", (12, 0)) is torch.bfloat16
    assert autocast_dtype("auto", (6, 0)) is torch.float16  # a P100 has fp16 too, and no bf16
    assert autocast_dtype("auto", None) is None  # a CPU trains in float32
    assert autocast_dtype("off", (9, 0)) is None and autocast_dtype("fp16", (9, 0)) is torch.float16
    assert autocast_dtype("bf16", (9, 0)) is torch.bfloat16  # (refused before 8.0 by amp_problem above)
    # The gradient scaler goes with fp16 alone: auto on a V100 or T4 gets it, bf16 and float32 do not.
    assert [uses_grad_scaler(autocast_dtype("auto", cap)) for cap in ((7, 0), (7, 5), (8, 0), None)] == [
        True, True, False, False]
    assert not grad_scaler(torch.device("cpu"), "fp16").is_enabled()  # AMP means nothing on a CPU


def which_in(*found: str) -> object:
    return lambda name: f"/usr/bin/{name}" if name in found else None


def test_compile_needs_a_compiler_and_python_h(tmp_path: Path) -> None:
    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "Python.h").touch()
    # Triton's search on a GPU: $CC, else gcc, else clang.
    assert compile_problem("cuda", which_in("clang"), {}, headers) is None
    assert compile_problem("cuda", which_in("cc9"), {"CC": "cc9"}, headers) is None
    missing = compile_problem("cuda", which_in("g++"), {}, headers)
    assert missing == ("CONFIG.TRAIN.COMPILE: torch.compile needs a C compiler for Triton's kernel launchers (gcc, "
                       "clang, or $CC), and this node has none; install one (Debian/Ubuntu: build-essential) or set "
                       "COMPILE false")
    assert compile_problem("cuda", which_in("gcc"), {"CC": "/opt/gone/cc"}, headers) == missing  # $CC is what runs
    # Inductor's on a CPU: $CXX, else g++.
    assert compile_problem("cpu", which_in("g++"), {}, headers) is None
    assert "a C++ compiler for Inductor's CPU kernels" in str(compile_problem("cpu", which_in("gcc", "clang"), {},
                                                                               headers))
    no_header = compile_problem("cuda", which_in("gcc"), {}, tmp_path)
    assert no_header is not None and f"{tmp_path}/Python.h is missing" in no_header and "-dev" in no_header


def test_this_machine_has_what_compile_needs() -> None:
    assert compile_problem("cpu") is None and compile_problem("cuda") is None  # g++, gcc and Python 3.11's headers


def test_gpu_decoding_with_a_cpu_only_torchcodec_names_the_build_to_install() -> None:
    assert decoder_device_problem("cuda", "0.17.0+cpu", "12.6") == (
        "CONFIG.DATA.DECODER_DEVICE: cuda needs torchcodec's CUDA build, and torchcodec 0.17.0+cpu is a CPU-only "
        "build; install the one for this torch: pip install torchcodec==0.17.0+cu126 --index-url "
        "https://download.pytorch.org/whl/cu126 (or set DECODER_DEVICE cpu)")
    assert decoder_device_problem("cuda", "0.17.0+cu130", "13.0") is None
    assert decoder_device_problem("cpu", "0.17.0", "13.0") is None


def node_config(tmp_path: Path, **train: object) -> Path:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"DDP_CONFIG": {"DISTRIBUTED": False}, "CONFIG": {"TRAIN": train}}))
    return path


def test_compile_on_a_node_without_a_compiler_is_refused_by_the_node_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = validate_config({"DDP_CONFIG": {"DISTRIBUTED": False}, "CONFIG": {"TRAIN": {"COMPILE": True}}})
    check_runtime(cfg)  # this machine has g++ and Python.h
    bare = tmp_path / "bin"  # a PATH with no compiler on it
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ConfigError, match=r"^CONFIG\.TRAIN\.COMPILE: torch\.compile needs a C\+\+ compiler"):
        check_runtime(cfg)
    # The node check the launch runs on every node before it starts anything: one line, status 2, no traceback.
    config = node_config(tmp_path, COMPILE=True)
    env = {**os.environ, "PATH": str(bare), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "trainer.config", "--config-file", str(config), "--check"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {config}: CONFIG.TRAIN.COMPILE: torch.compile needs a C++ compiler")
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_compiled_model_is_not_given_a_static_graph(one_rank_group: DistContext) -> None:
    def wrapped(**train: object) -> nn.Module:
        cfg = validate_config({"CONFIG": {"TRAIN": train}})
        return ddp_module(wrap_ddp(nn.Linear(4, 2), one_rank_group, cfg))

    assert wrapped().static_graph
    assert not wrapped(COMPILE=True).static_graph
    assert not wrapped(ACCUM_STEPS=2).static_graph
