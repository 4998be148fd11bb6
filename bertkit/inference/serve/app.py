"""The FastAPI app: endpoints, error handlers, metrics and middleware; and `serve`, which runs it
on uvicorn."""
from __future__ import annotations

import asyncio
import base64
import errno
import itertools
import json
import socket
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
from fastapi import Request  # module level: FastAPI resolves the endpoints' string annotations here

from ...errors import BertkitError
from .batching import Batcher
from .config import COUNT_ON_THE_LOOP, MAX_ERRORS_SHOWN, MAX_FILL_MASK_ANSWERS, ServeConfig
from .errors import ClientGone, RequestError
from .schemas import AttentionRequest, EmbeddingsRequest, EncodeRequest, FillMaskRequest, PredictRequest
from .served import Served

PAGE = Path(__file__).parent.parent / "page" / "index.html"


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
        # the task reads its inputs and says what of them counts against which limit
        examples = served.task.request_examples(body.inputs)
        tokens = 0
        for check in served.task.request_token_checks(body.inputs, examples, max_tokens, served.max_len):
            tokens += await check_texts(check.texts, check.pairs, check.field, check.limit,
                                        limit_name=check.limit_name)
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
    app.state.served, app.state.batcher = served, batcher
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
