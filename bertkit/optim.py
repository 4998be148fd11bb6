"""AdamW and the warmup + linear decay schedule, shared by pretraining and fine-tuning."""
from __future__ import annotations

import torch


def adamw(model: torch.nn.Module, lr: float, weight_decay: float, eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW with no weight decay on biases and LayerNorm weights (the 1-D tensors), as in BERT."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    # the fused kernel updates every tensor in one pass: on a GPU one launch, on a CPU 4-5x faster
    # than the per-tensor loop that is PyTorch's CPU default (test_optim checks it against that loop)
    devices = {p.device.type for p in model.parameters()}
    fused = len(devices) == 1 and devices <= {"cpu", "cuda"}
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.999), eps=eps,
                             fused=fused or None)


def warmup_linear(opt: torch.optim.Optimizer, warmup_steps: int, total_steps: int):
    """Linear warm-up to the peak over warmup_steps, then linear decay to 0 at total_steps."""
    warmup = max(1, warmup_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (total_steps - s) / max(1, total_steps - warmup))))
