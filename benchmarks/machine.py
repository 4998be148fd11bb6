"""What the benchmarks record about the machine they ran on: the machine kind has come with
different CPUs (an AMD EPYC with AVX2, an Intel Xeon with AMX), whose figures differ by 2-4x."""
from __future__ import annotations

import platform
from pathlib import Path

from bertkit.training.distributed import amx_bf16


def cpu_name() -> str:
    """This machine's CPU as /proc/cpuinfo names it, and whether it has AMX (bf16 matrix tiles)."""
    name = platform.processor() or platform.machine()
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name} ({'AMX' if amx_bf16() else 'no AMX'})"
