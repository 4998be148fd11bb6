"""The training runtime's malloc settings (bertkit/training/memory.py): a step's freed memory
serves the next step instead of coming back from the kernel as fresh, zeroed pages."""
import resource
import sys

import pytest
import torch

from bertkit.training.memory import keep_freed_memory


def _faults_of_allocations(n: int = 5, warm: int = 10, mb: int = 64) -> int:
    """Page faults while allocating, filling and freeing n tensors above glibc's mmap threshold,
    after `warm` such steps (the heap's free lists settle: torch's aligned allocations do not
    always fit the block freed just before)."""
    for i in range(warm + n):
        if i == warm:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x = torch.empty(mb << 18).fill_(1.0)
        del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    try:
        assert keep_freed_memory(False)
        default = _faults_of_allocations()
        assert keep_freed_memory(True)
        kept = _faults_of_allocations()
    finally:
        keep_freed_memory(True)  # what every training process in this test session sets anyway
    # glibc's defaults map each 64 MB tensor afresh (16 k pages, or 32 huge ones); kept, the
    # heap already holds it
    assert kept * 4 < default, (kept, default)


def test_training_processes_on_a_cpu_keep_freed_memory(monkeypatch):
    from bertkit.training import distributed
    calls = []
    monkeypatch.setattr(distributed, "keep_freed_memory", lambda on=True: calls.append(on) or True)
    procs = distributed.init_processes()
    assert calls == ([True] if procs.device.type == "cpu" else [])
