"""Helpers the tests import (conftest.py holds the fixtures, the tiny BERT's among them): real
sentences, a sentence-transformers copy of a folder, ports, torchrun, a thread count to match a
process's and a callback that stops a run."""
import contextlib

# Real sentences of different lengths: a padded batch exercises the attention mask.
SENTENCES = [
    "A crane is flying over the lake.",
    "The crane driver came late to the construction site, and nobody noticed until noon.",
    "Hi.",
    "BERT reads the whole sentence at once, so every word sees its left and right context.",
    "Paris is the capital of France.",
]


def sentence_transformers_copy(folder, out):
    """A copy of a model folder that declares mean pooling as a sentence-transformers folder
    does (modules.json and 1_Pooling/config.json)."""
    import json
    import shutil
    shutil.copytree(folder, out)
    (out / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                   "type": "sentence_transformers.models.Pooling"}]))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a server or a rendezvous to start there)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, nodes: int | None = None, rdzv_id: str = "bertkit-test") -> list[str]:
    """The torchrun launcher: one node (--standalone), or one of `nodes` launches meeting through
    the c10d rendezvous on a fresh port of 127.0.0.1. The program and its arguments follow."""
    import sys
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    if nodes is None:
        return cmd + ["--standalone"]
    return cmd + ["--nnodes", str(nodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
                  "--rdzv_id", rdzv_id]


@contextlib.contextmanager
def one_thread():
    """torch on one thread inside: a run here then sums as one in a process started with
    OMP_NUM_THREADS=1 does, bit for bit (a process costs seconds of imports; a run here does not)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Stop(Exception):
    """Raised by stop_at's callback: a run stopped as by a crash, after a step."""


def stop_at(n):
    """An on_step callback that stops a run right after step n (and its checkpoint, if any)."""
    def stop(step, model):
        if step == n:
            raise Stop
    return stop
