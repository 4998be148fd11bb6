"""BERT (Devlin et al. 2019), post-norm, top to bottom in one file.

Shapes: B batch, T tokens, H hidden, nh heads, hs head size (H // nh), P predicted positions,
V vocabulary. Parameter names are bertkit's own; folders.py holds the one table that maps
them to and from the HuggingFace layout (query/key/value are fused here into one qkv matrix,
one matmul instead of three). The CPU kernels it calls (dropout, linear, attention, the fused
MLM loss) live in kernels/, each tested equal to plain torch, chosen by kernels.Backend.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .config import ONE_SEGMENT_TYPE, BertConfig
from .errors import BertkitError
from .kernels.attention import attention
from .kernels.cross_entropy import MLM_ROWS_MULTIPLE, LinearCrossEntropy
from .kernels.dropout import Dropout
from .kernels.linear import POST_OP, linear, onednn_path

# load_model replaces every weight it builds, so drawing them first is wasted work (a tenth of
# a short `bertkit encode`). A context variable, not a patched torch class: it holds in the
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
        if not torch.is_grad_enabled() and onednn_path(x, self.weight):
            return torch.ops.mkldnn._linear_pointwise(x, self._blocked_weight(x), self.bias, *POST_OP[gelu])
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
    mlm_logits: torch.Tensor | None  # (B, P, V) at the given positions only; None from the fused loss
    mlm_predictions: torch.Tensor | None  # (B, P) the most likely token at each given position; None from the fused loss
    mlm_correct: torch.Tensor | None  # (B, P) bool: that token is the label (with labels; False at unused slots)
    nsp_logits: torch.Tensor         # (B, 2)
    sequence_output: torch.Tensor | None  # (B, T, H); None when the last layer ran at the slots only
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
                mlm_denominator: float | None = None, logits: bool = False):
        # mlm_positions: (B, P) indices into T; mlm_labels: (B, P) token ids, -100 for padding.
        # mlm_denominator: divide the summed MLM loss by this instead of this batch's prediction
        # count, so that micro-batches and ranks weight every predicted token alike.
        # With labels the loss and hits are what training needs: the backend may then run the last
        # layer at [CLS] and the slots only (sequence_output None) and fuse the vocabulary projection
        # with the loss (mlm_logits None). logits=True, or no labels: the (B, P, V) logits and
        # predictions too (evaluation, fill-mask), with the plain loss.
        B, P = mlm_positions.shape
        backend = kernels.current()
        for_loss = mlm_labels is not None and not logits
        if for_loss and backend.last_layer_rows:  # the same loss, fewer FLOPs (a sixth to a third of the tokens)
            rows = torch.cat([mlm_positions.new_zeros(B, 1), mlm_positions], 1)         # (B, 1 + P)
            out = self.bert(input_ids, token_type_ids, attention_mask, last_layer_rows=rows)
            picked, sequence_output = out.sequence_output[:, 1:], None                  # (B, P, H)
        else:
            out = self.bert(input_ids, token_type_ids, attention_mask)
            sequence_output = out.sequence_output                                       # (B, T, H)
            picked = gather_rows(sequence_output, mlm_positions)                        # (B, P, H)
        H = picked.size(-1)
        nsp_logits = self.nsp(out.pooled_output)                                        # (B, 2)
        mlm_loss = nsp_loss = loss = mlm_logits = mlm_predictions = mlm_correct = None
        if for_loss and backend.fused_mlm_loss:
            # the fused loss, at the used slots only (unused ones hold -100)
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
            loss = mlm_loss
        else:
            mlm_logits = self.mlm(picked.reshape(B * P, H)).view(B, P, self.config.vocab_size)  # (B, P, V)
            mlm_predictions = mlm_logits.argmax(-1)
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
