"""One process, or several under torchrun: rank, world size, device, and the few collectives
the loops need. A plain run is rank 0 of 1 and every helper is then a no-op."""
from __future__ import annotations

import atexit
import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import BertkitError
from ..precision import precision_context
from .memory import keep_freed_memory

_LONG_WAIT = None  # a gloo group whose barrier may wait hours: rank 0 preparing a large corpus


@dataclass
class Processes:
    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0

    def autocast(self, precision: str = "fp32"):
        """The training steps' precision: bf16 autocast or plain fp32 (see training_precision)."""
        return precision_context(self.device, precision)

    def barrier(self, long: bool = False) -> None:
        if self.world > 1:
            dist.barrier(group=_LONG_WAIT if long else None)

    def broadcast(self, value):
        """Rank 0's value on every rank (any picklable object)."""
        if self.world == 1:
            return value
        shared = [value]
        dist.broadcast_object_list(shared, src=0)
        return shared[0]

    def agree_with_rank_0(self, values: list[float], flag: bool) -> tuple[list[float], bool]:
        """Rank 0's `values` and whether any rank raised `flag`, on every rank (one small all_reduce):
        time-based decisions (a budget's lr and its last step) must not differ between ranks."""
        if self.world == 1:
            return values, flag
        shared = torch.tensor([*(values if self.main else [0.0] * len(values)), float(flag)],
                              dtype=torch.float64, device=self.device)
        dist.all_reduce(shared)
        *values, flags = shared.tolist()
        return values, flags > 0

    def gather(self, value) -> list:
        """Every rank's value, in rank order, on every rank."""
        if self.world == 1:
            return [value]
        out = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def rng_states(self) -> tuple[list, list]:
        """Every rank's CPU (and CUDA) RNG state, for an exact resume."""
        cuda = self.device.type == "cuda"
        return (self.gather(torch.get_rng_state()),
                self.gather(torch.cuda.get_rng_state(self.device)) if cuda else [])

    def lost_peer(self, error: BaseException, out) -> None:
        """Turn the error of a collective whose peer is gone (a rank died, a node went away) into
        one clear line; anything else is left to propagate."""
        text = str(error)
        if self.world > 1 and isinstance(error, RuntimeError) and (
                isinstance(error, dist.DistError) or any(w in text for w in ("gloo", "NCCL", "Connection", "peer"))):
            raise BertkitError(f"rank {self.rank} of {self.world}: lost the other processes ({text.splitlines()[0][:160]}); "
                               f"a rank or node stopped. The last checkpoint in {out}/checkpoints is whole: "
                               "continue with --resume (in as many processes, or another count)") from None

    def wrap(self, model: torch.nn.Module, **ddp_options) -> torch.nn.Module:
        """DistributedDataParallel over the ranks, or the model itself in one process."""
        if self.world == 1:
            return model
        return torch.nn.parallel.DistributedDataParallel(model, **ddp_options)


def gradient_sync(net: torch.nn.Module, world: int, last: bool):
    """The context of one micro-batch's backward: gradients are averaged across ranks once per
    step, on the last micro-batch; the others accumulate under DistributedDataParallel's no_sync."""
    return net.no_sync() if world > 1 and not last else contextlib.nullcontext()


def micro_batches(batch: dict, grad_accum: int):
    """`grad_accum` equal slices of a batch's rows (a dict of tensors), each with whether it is the last."""
    micro = next(iter(batch.values())).size(0) // grad_accum
    for i in range(grad_accum):
        yield {k: v[i * micro:(i + 1) * micro] for k, v in batch.items()}, i == grad_accum - 1


def accumulate(net: torch.nn.Module, batch: dict, grad_accum: int, world: int, autocast, forward, count) -> torch.Tensor:
    """Forward and backward over this rank's rows of a global batch in `grad_accum` micro-batches,
    the gradients averaged across ranks once, on the last. forward(mb) returns the loss to
    back-propagate (its share of the global batch's) and the model's outputs; count(mb, outputs)
    the micro-batch's figures as a tensor, summed here and kept on the device (no read-back)."""
    stats = None
    for mb, last in micro_batches(batch, grad_accum):
        with gradient_sync(net, world, last), autocast:
            loss, outputs = forward(mb)
            loss.backward()
        with torch.no_grad():
            counted = count(mb, outputs)
        stats = counted if stats is None else stats + counted
    return stats


def _close_gloo() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def init_processes() -> Processes:
    """Under torchrun (WORLD_SIZE set) pick this rank's GPU first, then join the process group,
    nccl on GPUs and gloo on CPUs; a plain run is rank 0 of 1."""
    global _LONG_WAIT
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)  # before any collective: nccl binds each rank to its device
    if device.type == "cpu":
        keep_freed_memory()  # a step's freed activations serve the next step (memory.py)
    if world == 1:
        return Processes(0, 1, device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cpu":
            # gloo's threads stopped before the interpreter exits: left to its teardown, a rank
            # sometimes aborted there ("terminate called without an active exception", about 1
            # run in 20 of a 2-rank encode). Local to the rank: safe after an error too
            atexit.register(_close_gloo)
    # tokenizing a real corpus on rank 0 outlasts the default collective timeout (10-30 min)
    _LONG_WAIT = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=12))
    return Processes(dist.get_rank(), world, device)
