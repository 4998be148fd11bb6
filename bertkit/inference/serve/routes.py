"""The endpoints. Each reaches the app's model folder, batcher, limits and metrics through the
dependencies below, which read what create_app put in app.state."""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
from pathlib import Path
from typing import Annotated

import numpy as np

# module level: FastAPI resolves the endpoints' string annotations in this module's globals
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from .batching import Batcher
from .config import COUNT_ON_THE_LOOP, MAX_FILL_MASK_ANSWERS, Limits
from .errors import RequestError
from .metrics import Metrics
from .schemas import AttentionRequest, EmbeddingsRequest, EncodeRequest, FillMaskRequest, PredictRequest
from .served import Served

PAGE = Path(__file__).parent.parent / "page" / "index.html"


# async: a plain def dependency would run on a thread of FastAPI's pool
async def get_served(request: Request) -> Served:
    return request.app.state.served


async def get_batcher(request: Request) -> Batcher:
    return request.app.state.batcher


async def get_limits(request: Request) -> Limits:
    return request.app.state.limits


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


ServedDep = Annotated[Served, Depends(get_served)]
BatcherDep = Annotated[Batcher, Depends(get_batcher)]
LimitsDep = Annotated[Limits, Depends(get_limits)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]

router = APIRouter()


async def check_texts(served: Served, limits: Limits, texts: list[str], pairs: list[str] | None, field: str,
                      limit: int | None = None, pair_field: str = "text_pairs", limit_name: str | None = None) -> int:
    """The tokens of a request's texts (and pairs), refused with a 413 or 422 that names the field
    and the limit: too many texts, an empty or tokenless text, a text over `limit` tokens
    (default: --max-tokens)."""
    limit = limits.tokens if limit is None else limit
    if len(texts) > limits.cfg.max_texts:
        raise RequestError(413, f"{field}: {len(texts)} texts, over the limit of {limits.cfg.max_texts} per request "
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
    # the event loop: a 1 MB text takes ~2 s, which every other client would wait
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


async def json_answer(payload: dict) -> Response:
    """A large answer serialised off the event loop, without FastAPI's jsonable_encoder: on the
    loop, 256 MiniLM vectors hold it 0.36 s, one 126-token /attention answer 1.9 s."""
    dump = lambda: json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()  # noqa: E731
    return Response(await asyncio.to_thread(dump), media_type="application/json")


@router.post("/encode", summary="sentence vectors of texts or text pairs")
async def encode(body: EncodeRequest, request: Request, served: ServedDep, batcher: BatcherDep, limits: LimitsDep):
    tokens = await check_texts(served, limits, body.texts, body.text_pairs, "texts")
    pooling = body.pooling or served.encoder.default_pooling
    normalize = served.encoder.default_normalize if body.normalize is None else body.normalize
    pairs = body.text_pairs or [None] * len(body.texts)
    key = (pooling, normalize, body.text_pairs is not None)
    vectors = await batcher.submit(served.run_encode, key, list(zip(body.texts, pairs)), tokens,
                                   request.is_disconnected)
    return await json_answer({"vectors": [v.tolist() for v in vectors], "pooling": pooling,
                              "normalized": normalize, "dimensions": served.config.hidden_size, "tokens": tokens})


@router.post("/v1/embeddings", summary="OpenAI-compatible embeddings (unit length, the folder's pooling)")
async def embeddings(body: EmbeddingsRequest, request: Request, served: ServedDep, batcher: BatcherDep,
                     limits: LimitsDep):
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts:
        raise RequestError(422, "input: must not be empty")
    if not all(isinstance(t, str) for t in texts):
        raise RequestError(422, "input: token arrays are not supported (their ids belong to another "
                                "tokenizer); send text")
    if body.dimensions is not None and body.dimensions != served.config.hidden_size:
        raise RequestError(422, f"dimensions: this model gives {served.config.hidden_size} dimensions, "
                                f"not {body.dimensions}")
    tokens = await check_texts(served, limits, texts, None, "input")
    key = (served.encoder.default_pooling, True, False)
    vectors = await batcher.submit(served.run_encode, key, [(t, None) for t in texts], tokens,
                                   request.is_disconnected)
    if body.encoding_format == "base64":
        rows = [base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() for v in vectors]
    else:
        rows = [v.tolist() for v in vectors]
    return await json_answer({"object": "list", "model": body.model or served.name,
                              "data": [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def count_masks(served: Served, texts: list[str], field: str, top_k: int) -> None:
    """Refuses a text without [MASK], and more [MASK]s x top_k answers than one reply may hold."""
    mask_id = served.tokenizer.mask_id
    masks = 0
    for i, t in enumerate(texts):
        n = served.counter.encode(t).ids.count(mask_id)
        if not n:
            raise RequestError(422, f"{field}[{i}]: no [MASK] token in {t[:80]!r}")
        masks += n
    if masks * top_k > MAX_FILL_MASK_ANSWERS:  # each answer is a JSON object in the reply
        raise RequestError(413, f"{field}: {masks} [MASK] tokens x top_k {top_k} = {masks * top_k} answers, over "
                                f"the limit of {MAX_FILL_MASK_ANSWERS} per request; send fewer [MASK] tokens or a "
                                "smaller top_k")


@router.post("/fill-mask", summary="top predictions for each [MASK] in each text")
async def fill_mask(body: FillMaskRequest, request: Request, served: ServedDep, batcher: BatcherDep,
                    limits: LimitsDep):
    if served.mlm_model is None:
        raise RequestError(400, f"{served.name} has no trained MLM head (no cls.predictions.* weights"
                                + (f"; it is fine-tuned for {served.task.name}" if served.task else "")
                                + "): fill-mask would answer at random")
    if (body.text is None) == (body.texts is None):
        raise RequestError(422, "give 'text' (one text) or 'texts' (a list of texts)"
                                + (", not both" if body.text is not None else ""))
    texts, field = ([body.text], "text") if body.text is not None else (body.texts, "texts")
    if body.top_k > limits.cfg.max_top_k:
        raise RequestError(422, f"top_k: {body.top_k} is over the limit of {limits.cfg.max_top_k}")
    tokens = await check_texts(served, limits, texts, None, field)
    count_masks(served, texts, field, body.top_k)
    results = await batcher.submit(served.run_fill_mask, (body.top_k,), list(texts), tokens, request.is_disconnected)
    if body.text is not None:  # the fixed contract's form
        return {"predictions": results[0]}
    return {"results": [{"text": t, "masks": r} for t, r in zip(texts, results)]}


@router.post("/predict", summary="the folder's fine-tuned task: classify, ner, tag, qa, summarize or word")
async def predict(body: PredictRequest, request: Request, served: ServedDep, batcher: BatcherDep, limits: LimitsDep):
    if served.task is None:
        raise RequestError(400, f"{served.name} is not fine-tuned for a task (its bertkit.json names none): "
                                "use /encode, /fill-mask or /attention")
    if len(body.inputs) > limits.cfg.max_texts:
        raise RequestError(413, f"inputs: {len(body.inputs)} inputs, over the limit of {limits.cfg.max_texts} "
                                "per request (--max-texts)")
    if body.top_k is not None and served.task.name != "word":
        raise RequestError(422, f"top_k: words per input, an option of the word task; {served.name} is {served.task.name}")
    if body.top_k is not None and body.top_k > limits.cfg.max_top_k:
        raise RequestError(422, f"top_k: {body.top_k} is over the limit of {limits.cfg.max_top_k}")
    # the task reads its inputs and says what of them counts against which limit
    examples = served.task.request_examples(body.inputs)
    tokens = 0
    for check in served.task.request_token_checks(body.inputs, examples, limits.tokens, served.max_len):
        tokens += await check_texts(served, limits, check.texts, check.pairs, check.field, check.limit,
                                    limit_name=check.limit_name)
    key = () if body.top_k is None else (body.top_k,)  # requests join a batch only with the same top_k
    results = await batcher.submit(served.run_predict, key, examples, tokens, request.is_disconnected)
    return {"task": served.task.name, "predictions": results}


# each /attention request is its own model call (a key no other request has): its weights are
# layers x heads x T x T floats (a 128-token text on MiniLM: 22 MB of JSON), and the answers of
# joined requests are all built before any is sent (16 joined MiniLM requests: +1.1 GB)
_attention_calls = itertools.count()


@router.post("/attention", summary="attention weights of every layer and head")
async def attention(body: AttentionRequest, request: Request, served: ServedDep, batcher: BatcherDep,
                    limits: LimitsDep):
    tokens = await check_texts(served, limits, [body.text], [body.text_pair] if body.text_pair is not None else None,
                               "text", limits.attention_tokens, "text_pair", limit_name=limits.attention_name)
    [result] = await batcher.submit(served.run_attention, (next(_attention_calls),), [(body.text, body.text_pair)],
                                    tokens, request.is_disconnected)
    return await json_answer({"layers": served.config.num_hidden_layers,
                              "heads": served.config.num_attention_heads, **result})


@router.get("/health")
@router.head("/health", include_in_schema=False)  # load balancers' probes
async def health():
    return {"status": "ok"}


@router.get("/info")
async def info(served: ServedDep, limits: LimitsDep):
    return {**served.info(), "limits": limits.info()}


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(metrics: MetricsDep):
    return metrics.response()


@router.get("/", include_in_schema=False)
async def page():
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))
