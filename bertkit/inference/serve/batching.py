"""Dynamic batching: concurrent requests joined into model calls on one worker thread."""
from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Awaitable, Callable

from .errors import ClientGone, RequestError


class Batcher:
    """Joins concurrent requests into model calls. A request is (run, key, items, tokens):
    requests with the same run and key can share a call, run(key, items) on the joined items,
    whose results are split back in order.

    Work nobody waits for is dropped: a request whose client has gone is taken out of the queue
    before its model call (60 abandoned 256-text requests made a one-word request behind them wait
    221 s). And the queue is bounded: past max_queue requests in the server, a new one is
    answered 503 with Retry-After (the seconds the work ahead of it takes at the measured speed)."""

    def __init__(self, window_s: float, max_tokens: int, enabled: bool, on_batch: Callable[[int, int], None],
                 max_queue: int = 64, on_abandoned: Callable[[], None] = lambda: None):
        self.window_s, self.max_tokens, self.enabled = window_s, max_tokens, enabled
        self.on_batch, self.on_abandoned, self.max_queue = on_batch, on_abandoned, max_queue
        self.executor: ThreadPoolExecutor | None = None
        self.queue: asyncio.Queue | None = None
        self.worker: asyncio.Task | None = None
        self.in_server, self.tokens_in_server = 0, 0
        self.seconds_per_token = None  # measured over the model calls

    def start(self) -> None:
        # one model thread: calls never overlap, and the tokenizer is only ever used from it
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertkit-model")
        self.queue = asyncio.Queue()
        self.worker = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, run: Callable[[tuple, list], list], key: tuple, items: list, tokens: int,
                     gone: Callable[[], Awaitable[bool]] | None = None) -> list:
        """The results of run(key, items), maybe joined with other requests' items; gone() says
        whether the client has left (ClientGone then)."""
        if self.in_server >= self.max_queue:
            wait = max(1, math.ceil(self.tokens_in_server * (self.seconds_per_token or 0.0)))
            raise RequestError(503, f"the server is busy: {self.in_server} requests are in it (--max-queue "
                                    f"{self.max_queue}); retry in {wait} s", headers={"Retry-After": str(wait)})
        loop = asyncio.get_running_loop()
        self.in_server += 1
        self.tokens_in_server += tokens
        try:
            if not self.enabled:
                future = loop.run_in_executor(self.executor, self._timed, (run, key), items, tokens)
            else:
                future = loop.create_future()
                self.queue.put_nowait(((run, key), items, tokens, future))
            return await self._wait(future, gone)
        finally:
            self.in_server -= 1
            self.tokens_in_server -= tokens

    async def _wait(self, future: asyncio.Future, gone) -> list:
        if gone is None:
            return await future
        watch = asyncio.ensure_future(self._watch(gone))
        try:
            await asyncio.wait({future, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
        if future.done():
            return future.result()
        future.cancel()  # a queued request is skipped by the worker; an executor job not started is cancelled
        self.on_abandoned()
        raise ClientGone

    @staticmethod
    async def _watch(gone) -> None:
        while not await gone():
            await asyncio.sleep(0.05)

    def _timed(self, call: tuple, items: list, tokens: int) -> list:
        """The model call (on the model thread), its speed kept for Retry-After."""
        run, key = call
        self.on_batch(len(items), tokens)
        start = time.perf_counter()
        results = run(key, items)
        self.seconds_per_token = (time.perf_counter() - start) / max(tokens, 1)
        return results

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            waiting = [await self.queue.get()]
            try:
                tokens = waiting[0][2]
                deadline = loop.time() + self.window_s
                while tokens < self.max_tokens:
                    try:
                        left = deadline - loop.time()
                        nxt = self.queue.get_nowait() if left <= 0 else await asyncio.wait_for(self.queue.get(), left)
                    except (asyncio.QueueEmpty, asyncio.TimeoutError):
                        break
                    waiting.append(nxt)
                    tokens += nxt[2]
                groups: dict[tuple, list] = {}
                for request in waiting:
                    groups.setdefault(request[0], []).append(request)
                for call, requests in groups.items():
                    await self._run_group(loop, call, requests)
            except Exception as e:  # noqa: BLE001 - the worker must outlive any one batch
                for *_, future in waiting:
                    if not future.done():
                        future.set_exception(e)

    async def _run_group(self, loop, call, requests) -> None:
        requests = [r for r in requests if not r[3].done()]  # their clients have gone: nobody waits
        if not requests:
            return
        items = [item for r in requests for item in r[1]]
        try:
            results = await loop.run_in_executor(self.executor, self._timed, call, items, sum(r[2] for r in requests))
        except Exception as e:  # noqa: BLE001 - handed to the waiting requests
            if len(requests) > 1:  # one bad request must not fail the others: run each alone
                for r in requests:
                    await self._run_group(loop, call, [r])
                return
            results, error = None, e
        start = 0
        for _, its, _, future in requests:
            if future.done():  # the client went away during the call
                start += len(its)
                continue
            if results is None:
                future.set_exception(error)
            else:
                future.set_result(results[start:start + len(its)])
            start += len(its)
