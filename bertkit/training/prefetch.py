"""Batches built ahead of the training step, in a background thread."""
from __future__ import annotations

import queue
import threading


class Prefetch:
    """Builds the next batches in a background thread, so a step never waits for masking and
    padding. The order is the iterator's own: resuming is unaffected."""

    def __init__(self, iterator, depth: int = 2):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._fill, args=(iterator,), daemon=True)
        self.thread.start()

    def _fill(self, iterator):
        try:
            for item in iterator:
                if not self._put((item, None)):
                    return
        except BaseException as e:  # re-raised in the training thread
            self._put((None, e))

    def _put(self, entry) -> bool:
        """Queue an entry unless closed first; a full queue is rechecked every 0.1 s."""
        while not self.done.is_set():
            try:
                self.queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def __next__(self):
        item, error = self.queue.get()
        if error is not None:
            raise error
        return item

    def close(self):
        # and wait for the thread: one still building a batch in torch while the interpreter
        # exits can abort the process ("terminate called without an active exception")
        self.done.set()
        self.thread.join(timeout=60)
