"""Freed memory kept for reuse: glibc's malloc settings for training and inference processes
on a CPU (the training runtime and the CLI's model-running commands set them).

A training step allocates and frees the same large activations and gradients every step.
glibc's malloc serves requests above its mmap threshold (32 MB at most) with fresh pages from
the kernel and hands freed memory at the top of the heap back; the kernel then maps and zeroes
the same memory again on the next step. On the tiny preset at batch 512, length 64 that was 80 k
page faults per step (`benchmarks/pretrain_throughput.py` measures the step both ways). Serving
every allocation from the heap and never trimming it keeps the memory a step frees for the next
one; the process keeps its peak heap for its lifetime, as a long training run would anyway.
Inference batches do the same on a smaller scale: `bertkit encode` on 4,096 reviews with MiniLM
faulted 0.7-1.0 M pages with glibc's defaults and 0.15 M with these settings.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
_DEFAULT_MMAP_MAX = 65536
# glibc's dynamic thresholds once a process has freed large blocks: mmap above 32 MB, trim the
# heap above 2 x that (what a long-running process settles to by itself)
_STEADY_MMAP_THRESHOLD = 32 << 20


@functools.cache  # find_library runs `ldconfig -p` in a subprocess: once per process is enough
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def keep_freed_memory(on: bool = True) -> bool:
    """on: every allocation from the heap (no mmap), freed memory never returned to the kernel;
    off: glibc's settled defaults, and the free memory at hand returned now. False where this is
    not glibc's malloc (macOS, musl): nothing changes there."""
    libc = _libc()
    if libc is None:
        return False
    if on:
        return bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    ok = libc.mallopt(M_MMAP_MAX, _DEFAULT_MMAP_MAX) and libc.mallopt(M_MMAP_THRESHOLD, _STEADY_MMAP_THRESHOLD) \
        and libc.mallopt(M_TRIM_THRESHOLD, 2 * _STEADY_MMAP_THRESHOLD)
    libc.malloc_trim(0)
    return bool(ok)
