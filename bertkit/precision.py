"""Precision, once for every command: fp32, or bf16 autocast where it pays. Inference takes
"fp32" or "bf16"; training also "auto" (bf16 on a GPU or a CPU with native bf16 matmuls). torch is
imported on use: `encode --backend onnx` never imports it."""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from .errors import BertkitError

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16")
TRAINING_PRECISIONS = ("auto", "fp32", "bf16")


def native_bf16() -> bool:
    """A CPU that runs bf16 matmuls natively, where bf16 autocast pays: AMX tiles (Intel Sapphire
    Rapids and later; 840-1050 against 220-230 GFLOP/s in fp32 on 2 cores) or AVX512_BF16 dot
    products (AMD Zen 4 and later; 370 against 85-130 GFLOP/s, and the default recipe's step
    1.8x faster). On other CPUs bf16 is emulated and autocast is usually slower than fp32."""
    import torch
    has = lambda feature: bool(getattr(torch.cpu, f"_is_{feature}_supported", lambda: False)())  # noqa: E731
    return has("amx_tile") or has("avx512_bf16")


def training_precision(device: torch.device, precision: str = "auto") -> str:
    """"fp32" or "bf16" for the training steps. "auto": bf16 autocast on a GPU and on a CPU with
    native bf16 (native_bf16), else fp32. Weights and optimizer state stay fp32 whatever this says."""
    if precision not in TRAINING_PRECISIONS:
        raise BertkitError(f"unknown precision {precision!r}; choose one of {', '.join(TRAINING_PRECISIONS)}")
    if precision != "auto":
        return precision
    if device.type == "cuda" or (device.type == "cpu" and native_bf16()):
        return "bf16"
    return "fp32"


def precision_context(device: torch.device, precision: str = "fp32"):
    """fp32 runs as is; bf16 autocasts on the model's device (CUDA or CPU)."""
    if precision not in PRECISIONS:
        raise BertkitError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return contextlib.nullcontext()
    import torch
    return torch.autocast(device.type, dtype=torch.bfloat16)
