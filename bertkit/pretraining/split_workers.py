"""Sentence splitting in worker processes, in order.

pysbd is pure Python, and splitting is most of a corpus's preparation: one process splits about
275 k characters a second (a Zen 4 core), so a 1 GB corpus would take an hour per pass. A corpus
past PARALLEL_CHARS is split by one worker per core. The workers are plain
`python -m bertkit.pretraining.split_workers MODULE:FUNCTION` processes fed batches of texts through their
pipes, not multiprocessing's: forking a process that holds torch's and tokenizers' threads is
unsafe, and multiprocessing's spawn runs the caller's main script again in every worker.
"""
from __future__ import annotations

import importlib
import os
import pickle
import signal
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from ..errors import BertkitError

PARALLEL_CHARS = 200_000    # the first this many characters are split in this process (about 1 s)
BATCH_CHARS = 100_000      # text per batch sent to a worker
MAX_WORKERS = 16


def worker_count() -> int:
    """The cores this process may run on, at most MAX_WORKERS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def _send(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)))
    f.write(data)
    f.flush()


def _recv(f):
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (size,) = struct.unpack("<Q", head)
    data = f.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _function(path: str) -> Callable:
    """The function "module:name" names (a worker imports its module by name)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def map_texts(fn: Callable[[str], object], texts: Iterable[str], workers: int | None = None) -> Iterator:
    """fn(text) for each text, lazily and in order: the first PARALLEL_CHARS characters in this
    process, the rest in `workers` processes (default: one per core), each with one batch of about
    BATCH_CHARS characters at a time. fn is a module-level function: the workers import it by name."""
    name = f"{fn.__module__}:{fn.__qualname__}"
    workers = worker_count() if workers is None else workers
    texts, chars = iter(texts), 0
    for text in texts:  # the first PARALLEL_CHARS here, as they come (a small corpus streams as read)
        yield fn(text)
        chars += len(text)
        if workers > 1 and chars >= PARALLEL_CHARS:
            break
    else:
        return
    yield from _in_workers(name, texts, workers, BATCH_CHARS)


def _batches(texts: Iterator[str], batch_chars: int) -> Iterator[list[str]]:
    batch, chars = [], 0
    for text in texts:
        batch.append(text)
        chars += len(text)
        if chars >= batch_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _in_workers(name: str, texts: Iterator[str], workers: int, batch_chars: int) -> Iterator:
    # the workers import bertkit as this process does, wherever it was found
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = [subprocess.Popen([sys.executable, "-m", __name__, name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env) for _ in range(workers)]
    pending: deque[subprocess.Popen] = deque()  # the workers holding a batch, oldest batch first

    def stopped(proc) -> BertkitError:
        return BertkitError(f"a sentence-splitting worker stopped (exit code {proc.wait()}); "
                            "its error is printed above")

    def collect(proc):
        try:
            return _recv(proc.stdout)
        except (EOFError, pickle.UnpicklingError):
            raise stopped(proc) from None

    try:
        for i, batch in enumerate(_batches(texts, batch_chars)):
            proc = procs[i % workers]
            if len(pending) == workers:  # the oldest batch is this worker's last one: take it first
                yield from collect(pending.popleft())
            try:
                _send(proc.stdin, batch)
            except BrokenPipeError:
                raise stopped(proc) from None
            pending.append(proc)
        while pending:
            yield from collect(pending.popleft())
    finally:  # also when the reader stops early (the generator is closed)
        for proc in procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
            if proc.poll() is None and pending:
                proc.kill()
            proc.wait()
            proc.stdout.close()


def _serve(name: str) -> None:
    # Ctrl-C reaches the whole process group: the reader stops the workers, without a traceback each
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # the pipe carries results only: anything printed goes to stderr
    fn = _function(name)
    while True:
        try:
            batch = _recv(stdin)
        except EOFError:
            return
        _send(stdout, [fn(text) for text in batch])


if __name__ == "__main__":
    _serve(sys.argv[1])
