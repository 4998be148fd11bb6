"""fp32 linear layers on oneDNN's kernel.

torch's fp32 matmuls on a CPU are MKL's. On CPUs with AVX-512 oneDNN's fp32 inner product, with
each weight reordered once into its blocked layout and GELU fused into the feed-forward's first
matmul, encodes faster: MiniLM on 1,024 reviews 1.15x on a Zen 4 (where MKL takes slower code
paths on AMD) and 1.07x on an Intel Xeon with AMX (benchmarks/onednn_linear.py); on a quiet
AMD Zen 2 with AVX2 it was 0.91-0.95x MKL, so AVX2 CPUs keep MKL. Where it pays, fp32 linear
layers go through oneDNN (Backend.onednn_linear, backend.py): inference directly, training
through OneDNNLinear (its input gradient on oneDNN too, the weight gradient on torch's mm, which
was faster for those shapes; the tiny fp32 step 1.1x on the Zen 4, the same on the Xeon: 0.483
against 0.490 s). Autocast, tracing, export and compiling keep F.linear. Results equal
F.linear's to fp32 rounding (tests/test_model.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import current


def onednn_path(x, weight) -> bool:
    """Whether this call is fp32 on a CPU and the backend runs oneDNN's kernel there."""
    return (current().onednn_linear and x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu") and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling())


class OneDNNLinear(torch.autograd.Function):
    """F.linear for training on oneDNN: y = x W^T + b, and dx = g W through oneDNN's kernel (1.1x
    the tiny pretraining step in fp32 on a Zen 4); dW = g^T x by torch's mm, faster there for
    the weight gradient's long reductions (8192 x 512 @ 512 x 128: 97 against 57 GFLOP/s)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1))                                            # (N, out)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.mkldnn._linear_pointwise(grad, weight.t(), None, "none", [], "")  # (..., in)
        if ctx.needs_input_grad[1]:
            dw = g.t() @ x.reshape(-1, x.size(-1))                                     # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum(0)                                                              # (out,)
        return dx, dw, db


def linear(x, weight, bias=None, gelu: bool = False):
    """F.linear, then the erf GELU when gelu. In fp32 on a CPU where it pays (Backend.onednn_linear) it
    runs oneDNN's kernel: in inference with the GELU fused into it as a post-op (one pass over
    the output less), in training as OneDNNLinear."""
    if onednn_path(x, weight):
        if not torch.is_grad_enabled():
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, *POST_OP[gelu])
        y = OneDNNLinear.apply(x, weight, bias)
    else:
        y = F.linear(x, weight, bias)
    return F.gelu(y) if gelu else y


POST_OP = {False: ("none", [], ""), True: ("gelu", [], "none")}  # attr, scalars, algorithm ("none": erf)
