"""Which kernels run: a Backend, set for a block of code with use() (a context variable: it
holds in the thread or asyncio task that set it), AUTO elsewhere."""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass

import torch


def onednn_linear_pays() -> bool:
    """Where oneDNN's fp32 linear was measured faster than MKL's: CPUs with AVX-512 (AMD Zen 4
    and later, Intel Xeons; MiniLM encode 1.15x on a Zen 4, 1.07x on a Xeon). AVX2 CPUs keep MKL:
    on a quiet AMD Zen 2 oneDNN was 0.91-0.95x MKL in one process and 0.96-0.98x in whole
    encode processes (the Zen 2 runs in benchmarks/results/onednn_linear.json and encode_speed.json;
    on a CPU shared with other work the ratio is not to be trusted). BERTKIT_ONEDNN_LINEAR=0 keeps MKL
    anywhere (to compare the two)."""
    if os.environ.get("BERTKIT_ONEDNN_LINEAR", "").strip() == "0":
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    return bool(getattr(torch.cpu, "_is_avx512_supported", bool)())


@dataclass(frozen=True)
class Backend:
    bulk_dropout: bool = True    # dropout masks drawn in bulk (dropout.py), and attention's dropout spelled out
                                 # around them (attention.py); False: F.dropout and SDPA's own dropout
    onednn_linear: bool = False  # fp32 linear layers on a CPU through oneDNN (linear.py); False: F.linear
    fused_mlm_loss: bool = True  # pretraining's vocabulary projection fused with its loss (cross_entropy.py);
                                 # False: the (N, V) logits, then F.cross_entropy
    last_layer_rows: bool = True  # pretraining runs the last layer at [CLS] and the predicted slots only;
                                  # False: every position, then those rows picked


AUTO = Backend(onednn_linear=onednn_linear_pays())
REFERENCE = Backend(bulk_dropout=False, onednn_linear=False, fused_mlm_loss=False, last_layer_rows=False)
_CURRENT = contextvars.ContextVar("bertkit_backend", default=AUTO)


def current() -> Backend:
    return _CURRENT.get()


@contextlib.contextmanager
def use(backend: Backend):
    """Run the block with `backend`'s kernels (benchmarks compare them; tests check them equal)."""
    token = _CURRENT.set(backend)
    try:
        yield backend
    finally:
        _CURRENT.reset(token)
