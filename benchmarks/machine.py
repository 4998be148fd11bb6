"""What the benchmarks record about the machine they ran on: the machine kind has come with
different CPUs (an AMD EPYC with AVX2, an Intel Xeon with AMX, an AMD EPYC with AVX-512 and
AVX512_BF16), whose figures differ by 2-4x."""
from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_name() -> str:
    """This machine's CPU as /proc/cpuinfo names it (with its family and model), and how it runs bf16 matmuls: AMX (matrix
    tiles), AVX512_BF16 (dot products) or neither (no native bf16: bertkit trains in fp32)."""
    name = platform.processor() or platform.machine()
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines())
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        # the model name alone does not tell the EPYCs apart (Zen 1 is family 23, Zen 4 family 25)
        name = f"{fields['model name']}, family {fields['cpu family']} model {fields['model']}"
    except (OSError, KeyError, ValueError):
        pass
    has = lambda feature: bool(getattr(torch.cpu, f"_is_{feature}_supported", lambda: False)())
    bf16 = "AMX" if has("amx_tile") else "AVX512_BF16" if has("avx512_bf16") else "no native bf16"
    return f"{name} ({bf16})"
