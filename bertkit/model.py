"""BERT (Devlin et al. 2019), post-norm, top to bottom in one file.

Shapes: B batch, T tokens, H hidden, nh heads, hs head size (H // nh), P predicted positions,
V vocabulary. Parameter names are bertkit's own; checkpoint.py holds the one table that maps
them to and from the HuggingFace layout (query/key/value are fused here into one qkv matrix,
one matmul instead of three).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import ONE_SEGMENT_TYPE, BertConfig
from .errors import BertkitError


# ---- dropout -------------------------------------------------------------------------------
# torch's dropout on a CPU draws its mask one element at a time (about 10 ns each): with dropout
# 0.1 the masks took a fifth of a tiny-BERT pretraining step. Here the mask comes from numpy's
# SFC64 generator, 16 random bits per element in bulk, parts of 2^20 elements on a thread each
# (numpy releases the GIL; torch's threads are idle meanwhile), seeded from torch's generator so
# that torch.manual_seed and a checkpoint's RNG state still decide every mask, whatever the thread
# count. On other devices torch's own (fused) dropout runs.

MASK_PART = 1 << 20
_mask_threads: ThreadPoolExecutor | None = None


def _fill_keep(out: np.ndarray, seed: int, part: int, threshold: int) -> None:
    n = out.size
    bits = np.random.Generator(np.random.SFC64([seed, part])).bit_generator.random_raw((n + 3) // 4)
    np.greater_equal(bits.view(np.int16)[:n], threshold, out=out)  # numpy's compare: 4x torch's on int16


def keep_mask(shape, p: float) -> torch.Tensor:
    """A bool tensor of `shape`, each element True with probability 1 - p (to within 2^-17:
    16 bits per element, twice as fast as 32 for a 4 M-element mask, 4.1 against 9.6 ms; on two
    threads 1.6 against 3.4 ms for a 2 M-element mask)."""
    global _mask_threads
    with torch.profiler.record_function("bertkit::keep_mask"):  # named in profiles
        n = math.prod(shape)
        seed = int(torch.randint(0, 2**62, ()))  # from torch's default generator
        threshold = round(p * 2**16) - 2**15
        keep = np.empty(n, dtype=np.bool_)
        starts = range(0, n, MASK_PART)
        fill = lambda i: _fill_keep(keep[i:i + MASK_PART], seed, i // MASK_PART, threshold)  # noqa: E731
        if len(starts) > 1 and torch.get_num_threads() > 1:
            if _mask_threads is None:
                _mask_threads = ThreadPoolExecutor(torch.get_num_threads(), thread_name_prefix="bertkit-mask")
            list(_mask_threads.map(fill, starts))
        else:
            for i in starts:
                fill(i)
        return torch.from_numpy(keep).view(shape)


def _forget_mask_threads():  # a forked child has the pool but not its threads
    global _mask_threads
    _mask_threads = None


os.register_at_fork(after_in_child=_forget_mask_threads)


class _MaskedScale(torch.autograd.Function):
    """x * keep / (1 - p), and the same scaling of the gradient. The scaled mask is saved in x's
    dtype rather than as bool: building it again in the backward cost more than its memory (one
    fp32 4 M-element dropout, forward and backward: 11.4 against 15.3 ms)."""

    @staticmethod
    def forward(ctx, x, keep, scale: float):
        m = keep.view(torch.uint8).to(x.dtype).mul_(scale)  # from uint8: a vectorised cast, unlike bool's
        ctx.save_for_backward(m)
        return x * m

    @staticmethod
    def backward(ctx, grad):
        m, = ctx.saved_tensors
        return grad * m, None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout as F.dropout computes it, with bulk-drawn masks on a CPU."""
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or p >= 1:
        return F.dropout(x, p, training)
    return _MaskedScale.apply(x, keep_mask(x.shape, p), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    def forward(self, x):
        return dropout(x, self.p, self.training)


# ---- linear layers -------------------------------------------------------------------------
# torch's fp32 matmuls on a CPU are MKL's. On CPUs with AVX-512 oneDNN's fp32 inner product,
# with each weight reordered once into its blocked layout and GELU fused into the feed-forward's
# first matmul, encodes faster: MiniLM on 1,024 reviews 1.15x on a Zen 4 (where MKL takes slower
# code paths on AMD) and 1.07x on an Intel Xeon with AMX (benchmarks/onednn_linear.py). So fp32
# linear layers there go through oneDNN: inference directly, training through OneDNNLinear (its
# input gradient on oneDNN too, the weight gradient on torch's mm, which was faster for those
# shapes; the tiny fp32 step 1.1x on the Zen 4, the same on the Xeon: 0.483 against 0.490 s).
# Autocast, tracing, export and compiling keep F.linear. Results equal F.linear's to fp32
# rounding (tests/test_model.py).

def _onednn_linear_pays() -> bool:
    """A CPU with AVX-512 (AMD Zen 4 and later, Intel Xeons), where oneDNN was measured faster;
    CPUs without AVX-512 (Zen 1-3, Intel's client cores) keep MKL, not measured there. The
    environment variable BERTKIT_ONEDNN_LINEAR=0 keeps MKL anywhere (to compare the two)."""
    if os.environ.get("BERTKIT_ONEDNN_LINEAR", "").strip() == "0":
        return False
    return (torch.backends.mkldnn.is_available() and bool(getattr(torch.cpu, "_is_avx512_supported", bool)())
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


ONEDNN_LINEAR = _onednn_linear_pays()


def _onednn_path(x, weight) -> bool:
    """Whether this call is fp32 on a CPU where oneDNN's kernel pays (ONEDNN_LINEAR)."""
    return (ONEDNN_LINEAR and x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu") and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling())


class OneDNNLinear(torch.autograd.Function):
    """F.linear for training on oneDNN: y = x W^T + b, and dx = g W through oneDNN's kernel (1.1x
    the tiny pretraining step in fp32 on a Zen 4); dW = g^T x by torch's mm, faster there for
    the weight gradient's long reductions (8192 x 512 @ 512 x 128: 97 against 57 GFLOP/s)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1))                                            # (N, out)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.mkldnn._linear_pointwise(grad, weight.t(), None, "none", [], "")  # (..., in)
        if ctx.needs_input_grad[1]:
            dw = g.t() @ x.reshape(-1, x.size(-1))                                     # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum(0)                                                              # (out,)
        return dx, dw, db


def linear(x, weight, bias=None, gelu: bool = False):
    """F.linear, then the erf GELU when gelu. In fp32 on a CPU where it pays (ONEDNN_LINEAR) it
    runs oneDNN's kernel: in inference with the GELU fused into it as a post-op (one pass over
    the output less), in training as OneDNNLinear."""
    if _onednn_path(x, weight):
        if not torch.is_grad_enabled():
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, *_POST_OP[gelu])
        y = OneDNNLinear.apply(x, weight, bias)
    else:
        y = F.linear(x, weight, bias)
    return F.gelu(y) if gelu else y


_POST_OP = {False: ("none", [], ""), True: ("gelu", [], "none")}  # attr, scalars, algorithm ("none": erf)

# load_model replaces every weight it builds, so drawing them first is wasted (MiniLM: 0.1 s of
# a 1.4 s `bertkit encode`). A context variable, not a patched torch class: it holds in the
# thread (or asyncio task) that builds the model and nowhere else.
_DRAW_INIT = contextvars.ContextVar("bertkit_draw_init", default=True)


@contextlib.contextmanager
def weights_not_drawn():
    """Linear and Embedding modules built in this block allocate their weights without drawing
    them: for a model whose every weight is then loaded (or initialised by init_weights)."""
    token = _DRAW_INIT.set(False)
    try:
        yield
    finally:
        _DRAW_INIT.reset(token)


class Embedding(nn.Embedding):
    """nn.Embedding that leaves its weight undrawn inside weights_not_drawn()."""

    def reset_parameters(self):
        if _DRAW_INIT.get():
            super().reset_parameters()


class Linear(nn.Linear):
    """nn.Linear (the same parameters and names) through linear(). In inference on the oneDNN
    path the weight is used in oneDNN's blocked layout, reordered once and kept until the weight
    changes (its version or storage) or the module is put in training mode: the plain layout is
    reordered on every call otherwise (MiniLM encode: about 5% of its time). The copy costs the
    weight's memory again, and is never saved, pickled or deep-copied."""

    def reset_parameters(self):  # undrawn inside weights_not_drawn()
        if _DRAW_INIT.get():
            super().reset_parameters()

    def forward(self, x, gelu: bool = False):
        if not torch.is_grad_enabled() and _onednn_path(x, self.weight):
            return torch.ops.mkldnn._linear_pointwise(x, self._blocked_weight(x), self.bias, *_POST_OP[gelu])
        return linear(x, self.weight, self.bias, gelu)

    def _blocked_weight(self, x):
        if self.weight.is_inference():  # made under inference_mode: no version to tell a change by
            return self.weight
        key = (self.weight._version, self.weight.data_ptr())
        cached = self.__dict__.get("_blocked")
        if cached is None or cached[0] != key:
            rows = x.numel() // x.size(-1) if x.size(-1) else 1  # the layout oneDNN picks for this many rows
            cached = self.__dict__["_blocked"] = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight, max(rows, 1)))
        return cached[1]

    def train(self, mode: bool = True):
        self.__dict__.pop("_blocked", None)
        return super().train(mode)

    def __getstate__(self):  # an opaque oneDNN tensor has no storage to copy
        state = self.__dict__.copy()
        state.pop("_blocked", None)
        return state


# Attention with dropout runs a head at a time when each head's score matrices are this large
# (B * T * T elements) and for smaller ones as one batched matmul over head-major copies of q, k,
# v: per head, bmm reads them where they lie in qkv (no copies), but 12 small heads cost more in
# per-call overhead than one copy (fine-tuning MiniLM at batch 16, length 48: 430 against 347 ms
# per step; the tiny preset at batch 512, length 64: 660 against 708 ms).
PER_HEAD_MIN = 1 << 19


def attention(q, k, v, n_head: int, mask, dropout_p: float = 0.0):
    """softmax(q k^T / sqrt(hs) + mask) v per head, the attention probabilities dropped out at
    dropout_p. q: (B, Tq, H) the queries; k, v: (B, T, H) (views of one fused projection, split
    rather than sliced: a slice's backward zero-fills the whole projection's gradient; Tq < T
    for queries at some positions only); mask: (B, 1, 1, T) bool or None; returns (B, Tq, H).
    Off a CPU, and on one without dropout, this is SDPA's fused kernel; with dropout, SDPA's
    math path spelled out (softmax, dropout, matmuls) with bertkit's dropout. Training in bf16
    on a CPU takes the spelled-out path too: SDPA's CPU backward in bf16 is 3x slower (tiny
    preset, batch 512, length 64, forward and backward: 161 against 52 ms; inference is not)."""
    B, Tq, H = q.shape
    T, hs = k.size(1), H // n_head
    bf16_training = q.dtype == torch.bfloat16 and q.requires_grad
    if q.device.type != "cpu" or (dropout_p == 0 and not bf16_training):
        q, k, v = (t.unflatten(2, (n_head, hs)).transpose(1, 2) for t in (q, k, v))  # (B, nh, Tq|T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)  # (B, nh, Tq, hs)
        return y.transpose(1, 2).reshape(B, Tq, H)
    bias = q.new_zeros(1, 1, 1)
    if mask is not None:  # 0 at real keys, -inf at padding: (B, 1, T)
        bias = q.new_zeros(B, 1, T).masked_fill_(~mask.view(B, 1, T), float("-inf"))
    scale = 1.0 / math.sqrt(hs)
    if B * Tq * T >= PER_HEAD_MIN:
        out = []
        for qh, kh, vh in zip(q.split(hs, 2), k.split(hs, 2), v.split(hs, 2)):  # each head where it lies
            scores = torch.baddbmm(bias, qh, kh.transpose(1, 2), alpha=scale)     # (B, Tq, T)
            out.append(torch.bmm(dropout(scores.softmax(-1), dropout_p), vh))     # (B, Tq, hs)
        return torch.cat(out, dim=2)                                               # (B, Tq, H)
    q, k, v = (t.unflatten(2, (n_head, hs)).transpose(1, 2).reshape(B * n_head, -1, hs) for t in (q, k, v))
    bias = bias.view(B, 1, 1, T).expand(B, n_head, 1, T).reshape(B * n_head, 1, T) if mask is not None else bias
    scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)                # (B*nh, Tq, T)
    y = torch.bmm(dropout(scores.softmax(-1), dropout_p), v)                       # (B*nh, Tq, hs)
    return y.view(B, n_head, Tq, hs).transpose(1, 2).reshape(B, Tq, H)


def gather_rows(x, rows):
    """x: (B, T, H), rows: (B, Q) positions -> (B, Q, H) the hidden states there."""
    return x.gather(1, rows[..., None].expand(*rows.shape, x.size(-1)))


class Embeddings(nn.Module):
    """token + learned position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position = Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.segment = Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids):
        # a model of one segment type (config.json type_vocab_size 1) given a text pair: an IndexError
        # deep in torch otherwise (checked only for such models, never while tracing for export)
        if (self.segment.num_embeddings == 1 and not torch.compiler.is_compiling()
                and not torch.jit.is_tracing() and bool(token_type_ids.any())):
            raise BertkitError(ONE_SEGMENT_TYPE)
        T = input_ids.size(1)
        positions = torch.arange(T, device=input_ids.device)  # (T,), broadcast over the batch
        x = self.word(input_ids) + self.position(positions) + self.segment(token_type_ids)  # (B, T, H)
        return self.drop(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention: SDPA's fused kernels, or its steps spelled out for dropout on a CPU."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_head = cfg.num_attention_heads
        self.qkv = Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.out = Linear(cfg.hidden_size, cfg.hidden_size)
        self.attn_dropout = cfg.attention_probs_dropout_prob

    def forward(self, x, mask, queries=None):
        # x: (B, T, H); mask: (B, 1, 1, T) bool, True where the key is a real token, or None;
        # queries: (B, Q, H) the hidden states to attend from, some of x's rows (all of x when None)
        p, H = (self.attn_dropout if self.training else 0.0), x.size(-1)
        if queries is None:
            q, k, v = self.qkv(x).split(H, dim=2)                                      # 3 x (B, T, H)
            return self.out(attention(q, k, v, self.n_head, mask, p))                  # (B, T, H)
        (wq, wkv), (bq, bkv) = self.qkv.weight.split([H, 2 * H]), self.qkv.bias.split([H, 2 * H])
        q = linear(queries, wq, bq)                                                    # (B, Q, H)
        k, v = linear(x, wkv, bkv).split(H, dim=2)                                     # 2 x (B, T, H)
        return self.out(attention(q, k, v, self.n_head, mask, p))                      # (B, Q, H)


class EncoderLayer(nn.Module):
    """Post-norm block as published: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.ffn_in = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.ffn_out = Linear(cfg.intermediate_size, cfg.hidden_size)
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.hidden_dropout_prob)

    def forward(self, x, mask, rows=None):
        # rows: (B, Q) positions: the output only there, (B, Q, H); keys and values still read all T
        if rows is None:
            x = self.attn_norm(x + self.drop(self.attn(x, mask)))                 # (B, T, H)
        else:
            xq = gather_rows(x, rows)                                             # (B, Q, H)
            x = self.attn_norm(xq + self.drop(self.attn(x, mask, xq)))            # (B, Q, H)
        x = self.ffn_norm(x + self.drop(self.ffn_out(self.ffn_in(x, gelu=True))))  # (B, T|Q, H)
        return x


class Pooler(nn.Module):
    """tanh(dense(hidden state at [CLS])): the sentence vector NSP was trained on."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))  # (B, H)


@dataclass
class BertOutput:
    sequence_output: torch.Tensor  # (B, T, H) last layer
    pooled_output: torch.Tensor    # (B, H) tanh pooler over [CLS]


class BertModel(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.pooler = Pooler(cfg)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, last_layer_rows=None) -> BertOutput:
        # input_ids, token_type_ids, attention_mask: (B, T); attention_mask 1 = token, 0 = padding.
        # last_layer_rows: (B, Q) positions, the first of each row [CLS] (0) for the pooler: the
        # last layer computes its output only there, and sequence_output is (B, Q, H). Pretraining
        # reads the last layer at [CLS] and the predicted slots alone (a sixth to a third of the
        # tokens at length 64), so the rest of its queries, FFN and norms would be spent for nothing.
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None  # no padding: SDPA may pick its fastest (mask-free) kernel
        if attention_mask is not None:
            mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T) broadcast over heads, queries
        x = self.embeddings(input_ids, token_type_ids)      # (B, T, H)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, last_layer_rows if i == last else None)  # (B, T, H); the last (B, Q, H) with rows
        return BertOutput(x, self.pooler(x))


class MLMHead(nn.Module):
    """dense -> GELU -> LayerNorm -> decoder tied to the word embeddings, plus a bias.

    Takes only the hidden states to predict (N, H): projecting every position onto a 30k
    vocabulary would waste most of a pretraining step.
    """

    def __init__(self, cfg: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.decoder_weight = word_embeddings.weight  # tied: the same Parameter, (V, H)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def transform(self, h):
        return self.norm(F.gelu(self.dense(h)))             # (N, H)

    def forward(self, h):
        return linear(self.transform(h), self.decoder_weight, self.bias)  # (N, V)


MLM_ROWS_MULTIPLE = 64


def sample_rows(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """A column per row of probs (n, V), drawn by inverse CDF: one uniform number per row
    (torch.multinomial draws V exponentials per row, 128 ms for 512 x 8192 on a 2-core CPU)."""
    cdf = probs.float().cumsum(-1)                                                      # (n, V)
    u = torch.rand(cdf.size(0), 1, generator=generator, device=probs.device) * cdf[:, -1:]  # (n, 1)
    return torch.searchsorted(cdf, u).clamp_(max=cdf.size(1) - 1)[:, 0]                 # (n,)


class LinearCrossEntropy(torch.autograd.Function):
    """sum over rows of cross_entropy(h @ W.T + b, labels) / denominator, with the gradients
    computed in the forward pass, a chunk of rows at a time, so the (N, V) logits are never
    stored: torch's softmax kernel (one pass for max, sum and output) turns each chunk of logits
    into its own gradient. It saves the passes over the logits that log_softmax, nll_loss and
    their backward make (a third of a tiny-BERT step on a CPU is the vocabulary projection).
    Returns the loss and, per row, whether the label is the most likely token as argmax reads the
    logits (the row's maximum, the first of tied ones): training needs only that hit, and a max
    without indices is several times faster than an argmax on a CPU."""

    @staticmethod
    def forward(ctx, h, weight, bias, labels, denominator: float, chunk: int = 512, samples=None, sampler=None):
        # h: (M, H), weight: (V, H), bias: (V,), labels: (N,) token ids of h's first N <= M rows;
        # the rows after them are padding (no loss, zero gradient). samples: (N,) long, filled with
        # a token drawn from each row's softmax (ELECTRA's generator; sampler: its torch.Generator),
        # which the gradient is computed from anyway: no second pass over the vocabulary.
        # Everything runs in h's dtype (bf16 under autocast) except the sums, which are fp32:
        # torch's CPU softmax computes in fp32 and rounds only its output. In bf16 each row's
        # loss, -log p(label), has the 3 significant digits of a bf16 probability (unbiased
        # rounding: the mean over 4,548 rows moved by 6e-6 of itself against fp32 sums of exp).
        w, b = weight.to(h.dtype), bias.to(h.dtype)
        dh, dw, db = torch.empty_like(h), torch.zeros_like(weight), torch.zeros_like(bias)
        loss = h.new_zeros((), dtype=torch.float32)
        hit = torch.empty_like(labels, dtype=torch.bool)
        with torch.autocast(h.device.type, enabled=False):
            for i in range(0, h.size(0), chunk):
                hc, yc = h[i:i + chunk], labels[i:i + chunk]
                rows = torch.arange(yc.size(0), device=h.device)               # the chunk's real rows
                if _onednn_path(hc, w):  # 512 x 128 @ 128 x 8192 on a Zen 4: 148 against mm's 86 GFLOP/s
                    logits = linear(hc, w, b)                                # (n, V)
                else:
                    logits = torch.mm(hc, w.t()).add_(b)                     # (n, V); addmm's bias copy costs more
                target = logits[rows, yc]                                    # the label's logit
                top = logits.amax(-1)[:yc.size(0)]
                hits = target >= top
                # a tie at the top is argmax's, the first tied token: bf16 logits tie (2% of the rows
                # near the unigram plateau), and >= counted the label a hit in every tie (training
                # mlm_acc 1,530 hits in 13,575 where argmax of the same logits has 1,515). Hit rows only.
                tied = hits.nonzero().flatten()
                if tied.numel():
                    earlier = (logits[tied] == top[tied, None]) & (
                        torch.arange(logits.size(1), device=h.device) < yc[tied, None])
                    hits[tied[earlier.any(-1)]] = False
                hit[i:i + chunk] = hits
                grad = logits.softmax(-1)                                    # (n, V)
                if samples is not None:
                    samples[i:i + chunk] = sample_rows(grad[:yc.size(0)], sampler)
                grad[yc.size(0):] = 0                                        # padding rows
                p = grad[rows, yc].float()                                   # p(label)
                lost = p == 0
                if lost.any():  # underflow (a label logit ~90 below the top): those rows' loss exactly
                    loss += (torch.logsumexp(logits[:yc.size(0)][lost].float(), -1) - target[lost].float()).sum()
                    p = p[~lost]
                loss -= p.log().sum()
                grad[rows, yc] -= 1                                          # d loss / d logits
                db += grad.sum(0, dtype=torch.float32).to(db.dtype)
                dh[i:i + chunk] = grad @ w                                   # (n, H)
                dw += (grad.t() @ hc).to(dw.dtype)                           # (V, H)
        ctx.save_for_backward(dh, dw, db)
        ctx.denominator = denominator
        return loss / denominator, hit

    @staticmethod
    def backward(ctx, grad_loss, _grad_hit):
        dh, dw, db = ctx.saved_tensors
        scale = grad_loss / ctx.denominator
        return dh * scale, dw * scale, db * scale, None, None, None, None, None


class NSPHead(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.classifier = Linear(cfg.hidden_size, 2)  # 0 = B follows A, 1 = B is random (HF order)

    def forward(self, pooled):
        return self.classifier(pooled)  # (B, 2)


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None        # mlm_loss + nsp_weight * nsp_loss
    mlm_loss: torch.Tensor | None
    nsp_loss: torch.Tensor | None
    mlm_logits: torch.Tensor | None  # (B, P, V) at the given positions only; None when training with labels
    mlm_predictions: torch.Tensor | None  # (B, P) the most likely token at each given position; None when training
    mlm_correct: torch.Tensor | None  # (B, P) bool: that token is the label (with labels; False at unused slots)
    nsp_logits: torch.Tensor         # (B, 2)
    sequence_output: torch.Tensor | None  # (B, T, H); None when training with labels (last layer at the slots only)
    pooled_output: torch.Tensor      # (B, H)


class BertForPreTraining(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg)
        self.mlm = MLMHead(cfg, self.bert.embeddings.word)
        self.nsp = NSPHead(cfg)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, *,
                mlm_positions, mlm_labels=None, nsp_labels=None, nsp_weight: float = 1.0,
                mlm_denominator: float | None = None):
        # mlm_positions: (B, P) indices into T; mlm_labels: (B, P) token ids, -100 for padding.
        # mlm_denominator: divide the summed MLM loss by this instead of this batch's prediction
        # count, so that micro-batches and ranks weight every predicted token alike
        B, P = mlm_positions.shape
        training = mlm_labels is not None and torch.is_grad_enabled()
        if training:  # the last layer at [CLS] (for NSP) and the P slots only: the same loss, fewer FLOPs
            rows = torch.cat([mlm_positions.new_zeros(B, 1), mlm_positions], 1)         # (B, 1 + P)
            out = self.bert(input_ids, token_type_ids, attention_mask, last_layer_rows=rows)
            picked, sequence_output = out.sequence_output[:, 1:], None                  # (B, P, H)
        else:
            out = self.bert(input_ids, token_type_ids, attention_mask)
            sequence_output = out.sequence_output                                       # (B, T, H)
            picked = gather_rows(sequence_output, mlm_positions)                        # (B, P, H)
        H = picked.size(-1)
        nsp_logits = self.nsp(out.pooled_output)                                        # (B, 2)
        mlm_loss = nsp_loss = loss = mlm_logits = None
        if training:
            # training: the fused loss, at the used slots only (unused ones hold -100)
            valid = mlm_labels != -100                                                   # (B, P)
            n = valid.sum() if mlm_denominator is None else mlm_denominator
            rows = picked[valid]                                                         # (N, H)
            # N changes every step; padded to a multiple of 64 rows, the MLM matmuls see a few
            # shapes only: oneDNN builds its bf16 CPU kernels per shape (2-11 ms for a new one)
            rows = F.pad(rows, (0, 0, 0, -rows.size(0) % MLM_ROWS_MULTIPLE))            # (M, H)
            mlm_loss, hit = LinearCrossEntropy.apply(
                self.mlm.transform(rows), self.mlm.decoder_weight, self.mlm.bias,
                mlm_labels[valid], n)                                                    # (), (N,)
            mlm_correct = torch.zeros_like(valid).masked_scatter_(valid, hit)
            mlm_predictions = None
            loss = mlm_loss
        else:
            mlm_logits = self.mlm(picked.reshape(B * P, H)).view(B, P, self.config.vocab_size)  # (B, P, V)
            mlm_predictions = mlm_logits.argmax(-1)
            mlm_correct = None
            if mlm_labels is not None:
                mlm_correct = (mlm_predictions == mlm_labels) & (mlm_labels != -100)
                mlm_loss = F.cross_entropy(mlm_logits.flatten(0, 1).float(), mlm_labels.flatten(),
                                           ignore_index=-100, reduction="sum")
                mlm_loss = mlm_loss / ((mlm_labels != -100).sum() if mlm_denominator is None else mlm_denominator)
                loss = mlm_loss
        if nsp_labels is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), nsp_labels)
            loss = nsp_weight * nsp_loss if loss is None else loss + nsp_weight * nsp_loss
        return PreTrainingOutput(loss, mlm_loss, nsp_loss, mlm_logits, mlm_predictions, mlm_correct, nsp_logits,
                                 sequence_output, out.pooled_output)


def set_dropout(module: nn.Module, p: float) -> None:
    """Change every dropout rate in place (pretraining recipes train without it); the saved
    config keeps its own rates for fine-tuning."""
    for m in module.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
        elif isinstance(m, SelfAttention):
            m.attn_dropout = p


def init_weights(module: nn.Module, cfg: BertConfig) -> None:
    """BERT's initialisation: normal(0, 0.02) weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=cfg.initializer_range)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=cfg.initializer_range)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if isinstance(module, BertForPreTraining):
        nn.init.zeros_(module.mlm.bias)
