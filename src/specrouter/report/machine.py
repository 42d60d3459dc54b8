"""The machine a measurement ran on, in one line: every benchmark prints it with its figures."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# the instruction sets that decide how fast a CPU runs these models' matrix products
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_model() -> tuple[str, list[str]]:
    """The CPU's model name and which of FLAGS it has (empty where /proc/cpuinfo is not there)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), []
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                platform.machine())
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return name, [f for f in FLAGS if f in flags]


def machine_line() -> str:
    """'CPU <model> (<cores> cores; <flags>), torch <version>, <threads> threads[, <GPU>]'."""
    import torch

    name, flags = cpu_model()
    line = (f"CPU {name} ({os.cpu_count()} cores; {' '.join(flags) or 'no AVX2'}), torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")
    if torch.cuda.is_available():
        line += f", GPU {torch.cuda.get_device_name(0)}"
    return line
