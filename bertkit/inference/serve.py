"""`bertkit serve`: a model folder behind HTTP, on FastAPI and uvicorn.

Endpoints: POST /encode, /v1/embeddings (OpenAI-compatible), /fill-mask, /predict (the folder's
fine-tuned task), /attention; GET /health, /info, /metrics (Prometheus), /openapi.json, the API
docs at /docs and /redoc (their scripts served from here: they work offline) and the page at /.

Dynamic batching: requests queue while the model is busy; when it is free, the compatible
requests waiting (up to `batch_tokens` tokens, after an optional `batch_window_ms` wait) are
joined into one model call, run on one worker thread, off the event loop. Every limit is checked
before a request is queued, so a bad request fails alone, with a JSON error naming the limit or
the field.
"""
from __future__ import annotations

import asyncio
import base64
import errno
import itertools
import json
import math
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Awaitable, Callable, Literal, Union

import numpy as np
import torch
from fastapi import Request  # module level: FastAPI resolves the endpoints' string annotations here
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator
from pydantic_core import PydanticCustomError

from ..errors import BertkitError
from ..inputs import lone_surrogate

PAGE = Path(__file__).parent / "page" / "index.html"


# validation errors a 422 lists (the first one is its "error")
MAX_ERRORS_SHOWN = 10

# characters a request's texts may have for their tokens to be counted on the event loop itself
COUNT_ON_THE_LOOP = 50_000

# [MASK] tokens x top_k per /fill-mask request: each answer is a {"token", "score"} object in the
# reply (256 texts of 510 [MASK]s at top_k 100 would have been 13 M of them, about 650 MB)
MAX_FILL_MASK_ANSWERS = 100_000


@dataclass
class ServeConfig:
    model: str
    host: str = "127.0.0.1"            # loopback unless the user opens it up
    port: int = 8000
    backend: str = "torch"             # or "onnx": the encoder on ONNX Runtime (needs `bertkit export`)
    batching: bool = True
    batch_window_ms: float = 0.0       # extra wait for company; 0: join what arrived while the model was busy
    batch_tokens: int = 16384          # a batch closes early once this many tokens wait
    max_body_bytes: int = 1 << 20      # 1 MiB
    max_texts: int = 256               # texts per request
    # tokens per text, specials included (default: a sentence-transformers folder's max_seq_length,
    # else the model's positions)
    max_tokens: int | None = None
    max_attention_tokens: int = 128    # /attention returns L x heads x T x T weights: kept small
    max_top_k: int = 100
    max_queue: int = 64                # requests in the server at once; past it, 503 with Retry-After

    def check(self) -> None:
        for name in ("port", "batch_tokens", "max_body_bytes", "max_texts", "max_attention_tokens", "max_top_k",
                     "max_queue"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "port" else 1):
                raise BertkitError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise BertkitError(f"--max-tokens must be a positive integer, got {self.max_tokens!r}")
        if self.port > 65535:  # bind() would end in an OverflowError traceback
            raise BertkitError(f"--port must be between 0 and 65535, got {self.port}")
        if not 0 <= self.batch_window_ms <= 1000:
            raise BertkitError(f"--batch-window-ms must be between 0 and 1000, got {self.batch_window_ms}")
        if self.backend not in ("torch", "onnx", "onnx-int8"):
            raise BertkitError(f"--backend must be torch, onnx or onnx-int8, got {self.backend!r}")


class RequestError(Exception):
    """A client error: its HTTP status and a message that names the field or the limit."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers


# ---------------------------------------------------------------- the model behind the server

class Served:
    """What the folder can do: encode always; fill-mask with a trained MLM head; predict with a
    fine-tuned task (bertkit.json); attention with the torch backend's weights."""

    def __init__(self, folder: str | Path, backend: str = "torch"):
        from ..checkpoint import has_trained_mlm_head, load_model, load_tokenizer
        from .encode import Encoder, folder_max_len, folder_normalize, folder_pooling, warn_unsupported

        self.folder = Path(folder)
        self.name = self.folder.resolve().name
        warn_unsupported(self.folder)
        self.task = self.task_model = self.mlm_model = None
        from ..tasks.folder import fine_tuned_task, load_task_model
        if fine_tuned_task(self.folder):
            self.task, self.task_model, self.tokenizer = load_task_model(self.folder, device="cpu")
            from ..tasks.folder import task_max_len
            self.max_len = task_max_len(self.task, self.task_model, None)  # what /predict reads of a text
            body = self.task_model.bert
        else:
            self.tokenizer = load_tokenizer(self.folder)
            model, _ = load_model(self.folder, heads=True, quiet=True)
            self.mlm_model = model.eval() if has_trained_mlm_head(self.folder) else None
            body = model.bert
        self.body = body.eval()
        self.config = body.config
        self.backend = backend
        if backend != "torch":  # the encoder and a task head on ONNX Runtime; /attention reads the torch weights
            from .export import onnx_task_model
            from .onnx_runtime import OnnxEncoder
            int8 = backend == "onnx-int8"
            if self.task_model is not None:
                onnx_task_model(self.folder, self.task_model, int8)
                encoder_body = self.task_model.bert.runtime
            else:
                encoder_body = OnnxEncoder.from_folder(self.folder, int8)
        else:
            encoder_body = body
        self.encoder = Encoder(encoder_body, self.tokenizer, folder_pooling(self.folder) or "cls", device="cpu",
                               normalize=folder_normalize(self.folder), max_len=folder_max_len(self.folder))
        # a second tokenizer for counting tokens on the event loop: the first one is reconfigured
        # (truncation) by the calls on the model thread
        from tokenizers import Tokenizer
        self.counter = Tokenizer.from_str(self.tokenizer.tok.to_str())
        self.counter.no_truncation()
        self.counter.no_padding()
        post = self.counter.post_processor  # [CLS] A [SEP] and [CLS] A [SEP] B [SEP] for BERT
        self.specials = {q: post.num_special_tokens_to_add(q) if post is not None else 0 for q in (False, True)}

    def count(self, texts: list[str], pairs: list[str] | None = None) -> tuple[list[int], list[int], list[int]]:
        """Tokens per text (or pair), specials included, never truncated; and which texts and
        which pairs hold no token at all (a zero-width space, control characters: what
        str.strip() keeps and the tokenizer drops)."""
        a = [len(e.ids) for e in self.counter.encode_batch(texts, add_special_tokens=False)]
        b = ([len(e.ids) for e in self.counter.encode_batch([p or "" for p in pairs], add_special_tokens=False)]
             if pairs is not None else [0] * len(texts))
        paired = [pairs is not None and p is not None for p in (pairs or [None] * len(texts))]
        counts = [n + m + self.specials[q] for n, m, q in zip(a, b, paired)]
        return (counts, [i for i, n in enumerate(a) if not n],
                [i for i, (m, q) in enumerate(zip(b, paired)) if q and not m])

    def info(self) -> dict:
        cfg = self.config
        return {"model": self.name, "backend": self.backend, "task": self.task.name if self.task else None,
                "labels": self.task.info.get("labels") if self.task else None,
                "hidden_size": cfg.hidden_size, "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
                "vocab_size": cfg.vocab_size, "max_positions": cfg.max_position_embeddings,
                "pooling": self.encoder.default_pooling, "fill_mask": self.mlm_model is not None,
                "attention": True}

    # each runs on the model thread, over the texts of one or more requests
    def run_encode(self, key: tuple, items: list) -> list:
        _, pooling, normalize, paired = key
        texts = [t for t, _ in items]
        pairs = [p for _, p in items] if paired else None
        return list(self.encoder.encode(texts, pairs, pooling=pooling, normalize=normalize, truncation=False))

    def run_fill_mask(self, key: tuple, items: list) -> list:
        from .fill_mask import fill_mask
        return fill_mask(self.mlm_model, self.tokenizer, items, top_k=key[1])

    def run_predict(self, key: tuple, items: list) -> list:
        from ..tasks.runner import run_task
        feats = self.task.features(items, self.tokenizer, self.max_len)
        preds, _ = run_task(self.task, self.task_model, feats, items, self.tokenizer)
        return [self.task.describe(p, ex) for p, ex in zip(preds, items)]

    def run_attention(self, key: tuple, items: list) -> list:
        from .attention import attention_maps
        results = []
        for text, pair in items:
            batch = self.tokenizer.encode([text], [pair] if pair is not None else None,
                                          max_len=self.config.max_position_embeddings, truncation=False)
            maps, _ = attention_maps(self.body, **batch.model_inputs("cpu"))       # (L, 1, nh, T, T)
            results.append({"tokens": batch.tokens[0], "sequence_ids": batch.sequence_ids[0],
                            "attention": maps[:, 0].numpy().round(4).tolist()})
        return results

    def examples(self, inputs: list) -> list:
        """/predict inputs -> the task's examples: strings (or {"text", "text_pair"}) for most
        tasks, {"question", "context"} objects for qa."""
        if self.task.name == "qa":
            from ..tasks.squad import QAExample
            out = []
            for i, x in enumerate(inputs):
                if not (isinstance(x, dict) and isinstance(x.get("question"), str)
                        and isinstance(x.get("context"), str)):
                    raise RequestError(422, f"inputs[{i}]: the qa task takes objects with string fields "
                                            "'question' and 'context'")
                unknown = sorted(set(x) - {"question", "context", "id"})
                if unknown:  # as classify's objects: a misspelt field is named, not dropped
                    raise RequestError(422, f"inputs[{i}].{unknown[0]}: not a field; objects have 'question', "
                                            "'context' and optionally 'id'")
                qid = x.get("id", str(i))
                if isinstance(qid, bool) or not isinstance(qid, (str, int)):
                    raise RequestError(422, f"inputs[{i}].id: must be a string or an integer")
                # the caller's id comes back with the answer, as `bertkit predict qa` keeps the JSONL's
                out.append(QAExample(str(qid), x["question"], x["context"], [], False, ""))
            return out
        texts, pairs = [], []
        for i, x in enumerate(inputs):
            if isinstance(x, dict) and isinstance(x.get("text"), str) and self.task.name == "classify":
                unknown = sorted(set(x) - {"text", "text_pair"})
                if unknown:  # a misspelt text_pair would otherwise be dropped without a word
                    raise RequestError(422, f"inputs[{i}].{unknown[0]}: not a field; objects have 'text' "
                                            "and optionally 'text_pair'")
                if x.get("text_pair") is not None and not isinstance(x["text_pair"], str):
                    raise RequestError(422, f"inputs[{i}].text_pair: must be a string")
                texts.append(x["text"])
                pairs.append(x.get("text_pair"))
                if pairs[-1] is not None and not pairs[-1].strip():  # as an empty text is, in check_texts
                    raise RequestError(422, f"inputs[{i}].text_pair: empty text")
            elif isinstance(x, str):
                texts.append(x)
                pairs.append(None)
            else:
                raise RequestError(422, f"inputs[{i}]: the {self.task.name} task takes strings"
                                        + (" or {\"text\", \"text_pair\"} objects" if self.task.name == "classify" else ""))
        # a classifier fine-tuned on single texts given pairs, or the reverse, reads inputs it never
        # saw: refused, as `bertkit predict` and `evaluate` refuse them
        kind = self.task.info.get("inputs") if self.task.name == "classify" else None
        if kind in ("texts", "pairs"):
            other = [i for i, p in enumerate(pairs) if (p is not None) != (kind == "pairs")]
            if other:
                raise RequestError(422, f"inputs[{other[0]}]: " + ("a single text" if kind == "pairs" else
                                                                   "a text pair (text_pair)")
                                   + ", but the model was fine-tuned on " + ("text pairs" if kind == "pairs" else
                                                                             "single texts")
                                   + f"; {len(other)} such input(s)")
        examples = self.task.read_inputs(texts=texts)
        for ex, pair in zip(examples, pairs):
            if pair is not None:
                ex["text_pair"] = pair
        return examples


# ---------------------------------------------------------------- dynamic batching

class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent."""


class Batcher:
    """Joins concurrent requests into model calls. A request is (key, items, tokens); requests
    with the same key can share a call, whose results are split back in order.

    Work nobody waits for is dropped: a request whose client has gone is taken out of the queue
    before its model call (60 abandoned 256-text requests made a one-word request behind them wait
    221 s). And the queue is bounded: past max_queue requests in the server, a new one is
    answered 503 with Retry-After (the seconds the work ahead of it takes at the measured speed)."""

    def __init__(self, run: Callable[[tuple, list], list], window_s: float, max_tokens: int,
                 enabled: bool, on_batch: Callable[[int, int], None], max_queue: int = 64,
                 on_abandoned: Callable[[], None] = lambda: None):
        self.run, self.window_s, self.max_tokens, self.enabled = run, window_s, max_tokens, enabled
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

    async def submit(self, key: tuple, items: list, tokens: int,
                     gone: Callable[[], Awaitable[bool]] | None = None) -> list:
        """The results of items; gone() says whether the client has left (ClientGone then)."""
        if self.in_server >= self.max_queue:
            wait = max(1, math.ceil(self.tokens_in_server * (self.seconds_per_token or 0.0)))
            raise RequestError(503, f"the server is busy: {self.in_server} requests are in it (--max-queue "
                                    f"{self.max_queue}); retry in {wait} s", headers={"Retry-After": str(wait)})
        loop = asyncio.get_running_loop()
        self.in_server += 1
        self.tokens_in_server += tokens
        try:
            if not self.enabled:
                future = loop.run_in_executor(self.executor, self._timed, key, items, tokens)
            else:
                future = loop.create_future()
                self.queue.put_nowait((key, items, tokens, future))
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

    def _timed(self, key: tuple, items: list, tokens: int) -> list:
        """The model call (on the model thread), its speed kept for Retry-After."""
        self.on_batch(len(items), tokens)
        start = time.perf_counter()
        results = self.run(key, items)
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
                for key, requests in groups.items():
                    await self._run_group(loop, key, requests)
            except Exception as e:  # noqa: BLE001 - the worker must outlive any one batch
                for *_, future in waiting:
                    if not future.done():
                        future.set_exception(e)

    async def _run_group(self, loop, key, requests) -> None:
        requests = [r for r in requests if not r[3].done()]  # their clients have gone: nobody waits
        if not requests:
            return
        items = [item for r in requests for item in r[1]]
        try:
            results = await loop.run_in_executor(self.executor, self._timed, key, items, sum(r[2] for r in requests))
        except Exception as e:  # noqa: BLE001 - handed to the waiting requests
            if len(requests) > 1:  # one bad request must not fail the others: run each alone
                for r in requests:
                    await self._run_group(loop, key, [r])
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


# ---------------------------------------------------------------- request bodies
# a list's validation stops at its first bad item: a 1 MB body of 500,000 wrong items held the
# event loop 10 s for pydantic's 500,000 errors and a 50 MB answer
FAIL_FAST = Field(fail_fast=True)

def _not_utf8(value, at: str = "", depth: int = 0) -> str | None:
    """Where in a field's value (a string, or a list of strings or of objects) a string UTF-8
    cannot encode is ("" for the value itself), or None. JSON's "\\ud800" escape decodes to such a
    lone surrogate: the tokenizer and the JSON answer both refuse it."""
    if isinstance(value, str):
        return at if lone_surrogate(value) else None
    if isinstance(value, (list, dict)) and depth < 2:  # nothing deeper than a list of objects is read as text
        for k, v in (value.items() if isinstance(value, dict) else enumerate(value)):
            found = _not_utf8(v, f"{at}[{k}]" if isinstance(k, int) else f"{at}.{k}", depth + 1)
            if found is not None:
                return found
    return None


class Body(BaseModel):
    """Every request body: its strings must be UTF-8 text, a 422 naming the field otherwise."""

    @field_validator("*")
    @classmethod
    def utf8(cls, value):
        at = _not_utf8(value)
        if at is not None:
            raise PydanticCustomError("string_not_utf8", "{at}not valid UTF-8 (it holds an unpaired surrogate, "
                                      "a \\ud800-\\udfff escape)", {"at": f"{at} is " if at else ""})
        return value

class Strict(Body):
    model_config = ConfigDict(extra="forbid")

# booleans and integers strict: pydantic would take "yes" for true and true for 1
class EncodeRequest(Strict):
    texts: list[str] = Field(min_length=1, fail_fast=True, description="texts to encode")
    text_pairs: list[str] | None = Field(None, fail_fast=True, description="second texts: each vector is of the pair")
    pooling: Literal["cls", "mean", "pooler"] | None = Field(None, description="default: the folder's")
    normalize: StrictBool | None = Field(None, description="unit length; default: the folder's (true where a "
                                                          "sentence-transformers folder ends with Normalize)")

class EmbeddingsRequest(Body):  # OpenAI's fields; unknown ones are ignored, as clients add their own
    input: Union[str, Annotated[list[str], FAIL_FAST], Annotated[list[int], FAIL_FAST],
                 Annotated[list[list[int]], FAIL_FAST]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: str | None = None

class FillMaskRequest(Strict):
    text: str | None = Field(None, description="a text with one or more [MASK]: answered as "
                                               '{"predictions": [[{"token", "score"}, ...] per [MASK]]}')
    texts: list[str] | None = Field(None, min_length=1, fail_fast=True, description="several texts: answered as "
                                                                    '{"results": [{"text", "masks"}, ...]}')
    top_k: StrictInt = Field(5, ge=1)

class PredictRequest(Strict):
    inputs: list[Union[str, dict[str, Any]]] = Field(
        min_length=1, fail_fast=True, description="strings, or {text, text_pair} (classify), or {question, context} (qa)")

class AttentionRequest(Strict):
    text: str
    text_pair: str | None = None


# ---------------------------------------------------------------- the app

def create_app(cfg: ServeConfig, served: Served | None = None):
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
    from starlette.exceptions import HTTPException

    class ErrorResponse(JSONResponse):
        """An error that may echo what the client sent: NaN and Infinity (which Python's JSON
        parser accepts) become strings and lone surrogates "?", where JSONResponse would fail (a 500)."""

        def render(self, content) -> bytes:
            try:
                content = json.loads(json.dumps(content, default=str), parse_constant=str)
            except RecursionError:  # an echo nested nearly as deep as the parser allows: the message alone
                content = {"error": str(content.get("error"))}
            return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")

    cfg.check()
    served = served or Served(cfg.model, cfg.backend)
    # default: the tokens a sentence-transformers folder reads per text (MiniLM: 256), else the positions
    max_tokens = cfg.max_tokens or min(served.encoder.default_max_len or served.config.max_position_embeddings,
                                       served.config.max_position_embeddings)
    if max_tokens > served.config.max_position_embeddings:
        raise BertkitError(f"--max-tokens {max_tokens} exceeds the model's {served.config.max_position_embeddings} positions")
    served.encoder.default_max_len = max_tokens  # what /encode reads whole (texts over it are refused)
    # /attention runs the whole text at once: past the model's positions it cannot, whatever the
    # option says (the default 128 is over a small model's positions too), so the limit is the lower
    positions = served.config.max_position_embeddings
    max_attention_tokens = min(cfg.max_attention_tokens, positions)
    attention_limit_name = ("--max-attention-tokens" if max_attention_tokens == cfg.max_attention_tokens else
                            f"the model's {positions} positions; --max-attention-tokens {cfg.max_attention_tokens} "
                            "is over them")

    registry = CollectorRegistry()
    requests_total = Counter("bertkit_requests", "HTTP requests", ["endpoint", "status"], registry=registry)
    latency = Histogram("bertkit_request_seconds", "request latency", ["endpoint"], registry=registry,
                        buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
    batch_texts = Histogram("bertkit_batch_texts", "texts per model call", registry=registry,
                            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
    tokens_total = Counter("bertkit_tokens", "tokens of the texts the model ran on", registry=registry)

    def on_batch(n_texts: int, n_tokens: int) -> None:
        batch_texts.observe(n_texts)
        tokens_total.inc(n_tokens)

    runs = {"encode": "run_encode", "fill-mask": "run_fill_mask", "predict": "run_predict", "attention": "run_attention"}
    abandoned = Counter("bertkit_abandoned_requests", "requests whose client left before their answer; their queued "
                        "work is dropped", registry=registry)
    batcher = Batcher(lambda key, items: getattr(served, runs[key[0]])(key, items), cfg.batch_window_ms / 1000,
                      cfg.batch_tokens, cfg.batching, on_batch, cfg.max_queue, abandoned.inc)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        batcher.start()
        yield
        await batcher.stop()

    # FastAPIOffline: /docs (Swagger UI) and /redoc load their scripts from this server, not a CDN,
    # so they work on a machine without internet
    from fastapi_offline import FastAPIOffline
    app = FastAPIOffline(title="bertkit", version=_version(), lifespan=lifespan,
                         description=f"BERT model {served.name} ({served.backend} backend)")

    # ---- errors: every one a JSON object with "error" (what is wrong) ----
    @app.exception_handler(RequestError)
    async def request_error(request: Request, e: RequestError):
        return ErrorResponse({"error": str(e)}, status_code=e.status, headers=e.headers)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, e: ClientGone):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it, the metrics count it

    @app.exception_handler(BertkitError)
    async def bertkit_error(request: Request, e: BertkitError):
        return ErrorResponse({"error": str(e)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        errors = e.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":  # loc holds the character where parsing stopped
            where, msg = "body", f"invalid JSON at character {first['loc'][-1]} ({first.get('ctx', {}).get('error')})"
        elif first.get("type") == "model_attributes_type" and "json" not in request.headers.get("content-type", ""):
            msg += " (send the body as JSON, with Content-Type: application/json)"
        # the first errors, without the input each echoes: a body can hold thousands of bad items
        detail = [{k: err[k] for k in ("type", "loc", "msg") if k in err} for err in errors[:MAX_ERRORS_SHOWN]]
        return ErrorResponse({"error": f"{where}: {msg}", "detail": detail,
                              **({"more_errors": len(errors) - MAX_ERRORS_SHOWN} if len(errors) > MAX_ERRORS_SHOWN
                                 else {})}, status_code=422)

    @app.exception_handler(HTTPException)  # starlette's and FastAPI's own: 404, 405, a body that does not parse
    async def http_error(request: Request, e: HTTPException):
        cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ is not None else ""
        if e.status_code == 400 and e.__cause__ is not None:  # a body FastAPI could not parse: as bad JSON is
            why = ("not UTF-8 text" if isinstance(e.__cause__, UnicodeDecodeError) else
                   "nested too deeply" if isinstance(e.__cause__, RecursionError) else str(e.__cause__)[:200])
            return ErrorResponse({"error": f"body: not valid JSON ({why})"}, status_code=422)
        return ErrorResponse({"error": f"{request.method} {request.url.path}: {e.detail}{cause}", "detail": e.detail},
                             status_code=e.status_code, headers=e.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        return ErrorResponse({"error": f"internal error: {type(e).__name__}: {e}"}, status_code=500)

    # ---- body size and metrics, around every request ----
    app.add_middleware(_BodyLimit, max_bytes=cfg.max_body_bytes)

    def record(path: str, status: int, seconds: float) -> None:
        endpoint = path if path in KNOWN_PATHS else "other"
        requests_total.labels(endpoint, str(status)).inc()
        latency.labels(endpoint).observe(seconds)
    app.add_middleware(_Measure, record=record)

    async def check_texts(texts: list[str], pairs: list[str] | None, field: str, limit: int = max_tokens,
                          pair_field: str = "text_pairs", limit_name: str | None = None) -> int:
        if len(texts) > cfg.max_texts:
            raise RequestError(413, f"{field}: {len(texts)} texts, over the limit of {cfg.max_texts} per request "
                                    "(--max-texts)")
        if pairs is not None and len(pairs) != len(texts):
            raise RequestError(422, f"text_pairs: {len(pairs)} pairs for {len(texts)} texts")
        for i, t in enumerate(texts):
            if not t.strip():
                raise RequestError(422, f"{field}[{i}]: empty text")
        for i, t in enumerate(pairs or ()):
            if t is not None and not t.strip():
                raise RequestError(422, f"{pair_field}[{i}]: empty text")
        # texts are counted whole (a limit must see all of a text); a long request is counted off
        # the event loop: a 1 MB text takes ~2 s, during which every other client waited
        chars = sum(map(len, texts)) + sum(map(len, (p for p in pairs or () if p is not None)))
        counts, tokenless, tokenless_pairs = (await asyncio.to_thread(served.count, texts, pairs)
                                              if chars > COUNT_ON_THE_LOOP else served.count(texts, pairs))
        for i in tokenless:
            raise RequestError(422, f"{field}[{i}]: no tokens in {texts[i][:40]!r} (nothing but characters the "
                                    "tokenizer drops)")
        for i in tokenless_pairs:
            raise RequestError(422, f"{pair_field}[{i}]: no tokens in {pairs[i][:40]!r} (nothing but characters "
                                    "the tokenizer drops)")
        for i, n in enumerate(counts):
            if n > limit:
                raise RequestError(413, f"{field}[{i}]: {n} tokens, over the limit of {limit} tokens per text "
                                        f"({limit_name or '--max-tokens'})")
        return sum(counts)

    # each /attention request is its own model call: its weights are layers x heads x T x T floats
    # (a 128-token text on MiniLM: 22 MB of JSON), and joined requests were all built before any
    # was answered (16 joined MiniLM requests: +1.1 GB)
    attention_calls = itertools.count()

    async def json_answer(payload: dict) -> Response:
        """A large answer serialised off the event loop, without FastAPI's jsonable_encoder: 256
        MiniLM vectors held the loop 0.36 s, one 126-token /attention answer 1.9 s."""
        dump = lambda: json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()  # noqa: E731
        return Response(await asyncio.to_thread(dump), media_type="application/json")

    # ---- endpoints ----
    @app.post("/encode", summary="sentence vectors of texts or text pairs")
    async def encode(body: EncodeRequest, request: Request):
        tokens = await check_texts(body.texts, body.text_pairs, "texts")
        pooling = body.pooling or served.encoder.default_pooling
        normalize = served.encoder.default_normalize if body.normalize is None else body.normalize
        pairs = body.text_pairs or [None] * len(body.texts)
        key = ("encode", pooling, normalize, body.text_pairs is not None)
        vectors = await batcher.submit(key, list(zip(body.texts, pairs)), tokens, request.is_disconnected)
        return await json_answer({"vectors": [v.tolist() for v in vectors], "pooling": pooling,
                                  "normalized": normalize, "dimensions": served.config.hidden_size, "tokens": tokens})

    @app.post("/v1/embeddings", summary="OpenAI-compatible embeddings (unit length, the folder's pooling)")
    async def embeddings(body: EmbeddingsRequest, request: Request):
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise RequestError(422, "input: must not be empty")
        if not all(isinstance(t, str) for t in texts):
            raise RequestError(422, "input: token arrays are not supported (their ids belong to another "
                                    "tokenizer); send text")
        if body.dimensions is not None and body.dimensions != served.config.hidden_size:
            raise RequestError(422, f"dimensions: this model gives {served.config.hidden_size} dimensions, "
                                    f"not {body.dimensions}")
        tokens = await check_texts(texts, None, "input")
        pooling = served.encoder.default_pooling
        vectors = await batcher.submit(("encode", pooling, True, False), [(t, None) for t in texts], tokens,
                                       request.is_disconnected)
        if body.encoding_format == "base64":
            rows = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() for v in vectors]
        else:
            rows = [v.tolist() for v in vectors]
        return await json_answer({"object": "list", "model": body.model or served.name,
                                  "data": [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)],
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    @app.post("/fill-mask", summary="top predictions for each [MASK] in each text")
    async def fill_mask(body: FillMaskRequest, request: Request):
        if served.mlm_model is None:
            raise RequestError(400, f"{served.name} has no trained MLM head (no cls.predictions.* weights"
                                    + (f"; it is fine-tuned for {served.task.name}" if served.task else "")
                                    + "): fill-mask would answer at random")
        if (body.text is None) == (body.texts is None):
            raise RequestError(422, "give 'text' (one text) or 'texts' (a list of texts)"
                                    + (", not both" if body.text is not None else ""))
        texts, field = ([body.text], "text") if body.text is not None else (body.texts, "texts")
        if body.top_k > cfg.max_top_k:
            raise RequestError(422, f"top_k: {body.top_k} is over the limit of {cfg.max_top_k}")
        tokens = await check_texts(texts, None, field)
        mask_id = served.tokenizer.mask_id
        masks = 0
        for i, t in enumerate(texts):
            n = served.counter.encode(t).ids.count(mask_id)
            if not n:
                raise RequestError(422, f"{field}[{i}]: no [MASK] token in {t[:80]!r}")
            masks += n
        if masks * body.top_k > MAX_FILL_MASK_ANSWERS:  # each answer is a JSON object in the reply
            raise RequestError(413, f"{field}: {masks} [MASK] tokens x top_k {body.top_k} = {masks * body.top_k} "
                                    f"answers, over the limit of {MAX_FILL_MASK_ANSWERS} per request; send fewer "
                                    "[MASK] tokens or a smaller top_k")
        results = await batcher.submit(("fill-mask", body.top_k), list(texts), tokens, request.is_disconnected)
        if body.text is not None:  # the fixed contract's form
            return {"predictions": results[0]}
        return {"results": [{"text": t, "masks": r} for t, r in zip(texts, results)]}

    @app.post("/predict", summary="the folder's fine-tuned task: classify, ner, tag, qa, summarize or word")
    async def predict(body: PredictRequest, request: Request):
        if served.task is None:
            raise RequestError(400, f"{served.name} is not fine-tuned for a task (its bertkit.json names none): "
                                    "use /encode, /fill-mask or /attention")
        if len(body.inputs) > cfg.max_texts:
            raise RequestError(413, f"inputs: {len(body.inputs)} inputs, over the limit of {cfg.max_texts} "
                                    "per request (--max-texts)")
        examples = served.examples(body.inputs)
        name = served.task.name
        # what the model reads of a text: more would be cut off, and answered as if read whole
        limit = min(max_tokens, served.max_len)
        limit_name = f"the max_len the {name} model was fine-tuned with" if limit < max_tokens else None
        if name == "qa":  # a question past max_query_len is cut; long contexts are read in windows: 8x
            query = served.task.max_query_len(served.max_len) + 2  # with [CLS] and [SEP], as counted
            tokens = await check_texts([e.question for e in examples], None, "inputs.question", min(max_tokens, query),
                                       limit_name=f"the max_query_len of the qa model, {query - 2}, and [CLS] [SEP]"
                                       if query < max_tokens else None)
            tokens += await check_texts([e.context for e in examples], None, "inputs.context", 8 * max_tokens)
        elif name in ("ner", "tag"):  # words past max_len would come back 'O' as if read
            tokens = await check_texts(list(body.inputs), None, "inputs", limit, limit_name=limit_name)
        elif name == "summarize":  # a long document's later sentences are not scored (the task's rule)
            tokens = await check_texts(list(body.inputs), None, "inputs")
        else:  # classify and word; a classify input's text_pair counts with its text, as they are read together
            texts = [x if isinstance(x, str) else x["text"] for x in body.inputs]
            pairs = [None if isinstance(x, str) else x.get("text_pair") for x in body.inputs]
            tokens = await check_texts(texts, pairs if any(p is not None for p in pairs) else None, "inputs",
                                       limit, limit_name=limit_name)
        results = await batcher.submit(("predict",), examples, tokens, request.is_disconnected)
        return {"task": served.task.name, "predictions": results}

    @app.post("/attention", summary="attention weights of every layer and head")
    async def attention(body: AttentionRequest, request: Request):
        tokens = await check_texts([body.text], [body.text_pair] if body.text_pair is not None else None, "text",
                                   max_attention_tokens, "text_pair", limit_name=attention_limit_name)
        [result] = await batcher.submit(("attention", next(attention_calls)), [(body.text, body.text_pair)], tokens,
                                        request.is_disconnected)
        return await json_answer({"layers": served.config.num_hidden_layers,
                                  "heads": served.config.num_attention_heads, **result})

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/info")
    async def info():
        limits = {k: v for k, v in asdict(cfg).items() if k.startswith(("max_", "batch"))}
        return {**served.info(), "limits": {**limits, "max_tokens": max_tokens,
                                            "max_attention_tokens": max_attention_tokens}}

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def page():
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    KNOWN_PATHS = {"/encode", "/v1/embeddings", "/fill-mask", "/predict", "/attention", "/health", "/info",
                   "/metrics", "/"}
    app.state.served = served
    return app


class _Measure:
    """Every answer counted by endpoint and status, with its latency. A plain ASGI middleware:
    through Starlette's BaseHTTPMiddleware an endpoint never saw its client leave."""

    def __init__(self, app, record: Callable[[str, int, float], None]):
        self.app, self.record = app, record

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:  # an exception is answered 500 by the handler outside this middleware: counted here
            self.record(scope["path"], status[0], time.perf_counter() - start)


class _BodyLimit:
    """Refuses a request body over max_bytes with 413, by its Content-Length or, for a chunked
    body, as soon as the bytes read pass the limit."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._refuse(send, declared.decode("latin-1"))
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"identity", b""):  # a gzip body would be read as bytes that are not JSON
            return await self._answer(send, 415, f"Content-Encoding {encoding.decode('latin-1')!r} is not accepted: "
                                                 "send the body uncompressed")
        seen, exceeded, started = 0, False, False

        async def limited_receive():
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    raise _TooLarge()
            return message

        async def guarded_send(message):
            # FastAPI turns an error while reading the body into its own 400: once the limit is
            # passed, whatever the app answers is replaced by the 413
            nonlocal started
            if exceeded:
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await self._refuse(send, f"more than {self.max_bytes}")
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not started:
                await self._refuse(send, f"more than {self.max_bytes}")

    async def _refuse(self, send, size: str):
        await self._answer(send, 413, f"request body of {size} bytes is over the limit of {self.max_bytes} bytes "
                                      "(--max-body-bytes)")

    @staticmethod
    async def _answer(send, status: int, error: str):
        body = json.dumps({"error": error}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("bertkit")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        return "0"


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use or a host that is not this
    machine's is one line naming the flag (uvicorn logged its own line and exited 3)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise BertkitError(f"--host {host!r}: not a host name or address this machine knows "
                           f"({getattr(e, 'strerror', None) or e})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a restart reuses the port
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        why = {errno.EADDRINUSE: f"--port {port}: already in use on {host} (another server listens there); "
                                 "choose another --port",
               errno.EADDRNOTAVAIL: f"--host {host!r}: not an address of this machine",
               errno.EACCES: f"--port {port}: permission denied (ports below 1024 need root); choose another --port"}
        raise BertkitError(why.get(e.errno, f"--host {host} --port {port}: cannot listen there ({e.strerror})")) from None
    sock.set_inheritable(True)
    return sock


def serve(cfg: ServeConfig) -> None:
    import uvicorn

    cfg.check()
    sock = _listen(cfg.host, cfg.port)
    try:
        app = create_app(cfg)
        print(f"bertkit: serving {cfg.model} ({cfg.backend}) on http://{cfg.host}:{cfg.port}/ "
              f"(API docs: /docs, /openapi.json)", flush=True)
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        sock.close()
