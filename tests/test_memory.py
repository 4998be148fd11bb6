"""The malloc settings of the training runtime and the CLI (bertkit/training/memory.py): freed
memory serves the next step or batch instead of coming back from the kernel as fresh pages."""
import subprocess
import sys

import pytest

FAULTS = """
import resource, sys, torch
from bertkit.training.memory import keep_freed_memory
assert keep_freed_memory(sys.argv[1] == "kept")
# page faults while allocating, filling and freeing 5 tensors above glibc's mmap threshold, after
# 20 such steps: kept, the heap grows for the first 8 to 13 of them (the small blocks freed beside
# each tensor sit in malloc's per-thread cache, so a freed tensor cannot merge with its
# neighbours), then serves every one from what is free
for i in range(25):
    if i == 20:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(64 << 18).fill_(1.0)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    # each setting in a fresh process: this one's heap holds what earlier tests freed, which
    # would serve the allocations under either setting
    default, kept = (int(subprocess.run([sys.executable, "-c", FAULTS, setting], capture_output=True, text=True,
                                        check=True).stdout) for setting in ("default", "kept"))
    # glibc's defaults map each 64 MB tensor afresh (16 k pages, or 32 huge ones); kept, the
    # heap already holds it
    assert kept * 4 < default, (kept, default)


def test_training_processes_on_a_cpu_keep_freed_memory(monkeypatch):
    from bertkit.training import distributed
    calls = []
    monkeypatch.setattr(distributed, "keep_freed_memory", lambda on=True: calls.append(on) or True)
    procs = distributed.init_processes()
    assert calls == ([True] if procs.device.type == "cpu" else [])


def test_model_running_commands_keep_freed_memory(monkeypatch, tmp_path):
    from bertkit import cli
    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda on=True: calls.append(on) or True)
    # set before the command runs: an option error after it still shows the call
    for command in (["encode", "--model", str(tmp_path), "--input", "x.txt", "--output", "x.txt"],
                    ["predict", "classify", "--model", str(tmp_path), "a text"],
                    ["fill-mask", "--model", str(tmp_path), "a [MASK]"]):
        calls.clear()
        cli.main(command)
        assert calls == [True], command
    calls.clear()
    assert cli.main(["data", "list"]) == 0
    assert calls == []  # no model runs: glibc's defaults stay
