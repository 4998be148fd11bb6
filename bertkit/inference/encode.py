"""Contextual vectors: sentence vectors and per-token vectors for texts and text pairs.

Texts are sorted by length (longest first) and batched so that padding is minimal; results
come back in input order. The model runs in fp32 unless bf16 is asked for: bf16 autocast is
faster on a GPU and on a CPU with native bf16 (MiniLM on 2 AMX cores: about 1.9x), but moves vectors
off their fp32 values (there: max abs diff 1e-2, cosine to the fp32 vector at least 0.9999),
which users comparing or storing vectors do not expect. On a CPU without native bf16 it is usually
slower. An exported encoder on ONNX Runtime (OnnxEncoder) runs here too, and that path never
imports torch.
"""
from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ..errors import BertkitError, check_int
from ..precision import PRECISIONS, precision_context  # noqa: F401 - re-exported
from ..tokenizer import Batch, WordPieceTokenizer, load_tokenizer
from .onnx_runtime import OnnxEncoder

if TYPE_CHECKING:
    import torch

    from ..model import BertModel

POOLINGS = ("cls", "mean", "pooler")


BACKENDS = ("torch", "onnx", "onnx-int8")  # onnx-int8: the dynamic int8 weights `export --int8` writes


def _modules(folder: Path) -> list:
    """A sentence-transformers folder's modules.json (its pipeline after the encoder), or []."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []


def folder_normalize(folder: str | Path) -> bool:
    """Whether a sentence-transformers folder ends with a Normalize module (unit-length vectors)."""
    return any(str(m.get("type", "")).endswith("models.Normalize") for m in _modules(Path(folder)))


def folder_max_len(folder: str | Path) -> int | None:
    """The max_seq_length of a sentence-transformers folder (sentence_bert_config.json): the
    tokens it reads per text, fewer than the model's positions (MiniLM: 256 of 512); else the
    model_max_length of tokenizer_config.json, where transformers' tokenizer truncates."""
    path = Path(folder) / "sentence_bert_config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))["max_seq_length"]
    except (OSError, ValueError, KeyError, TypeError):
        return _tokenizer_max_len(Path(folder))
    return _checked_length(value, path, "max_seq_length")  # -3 was ignored: 512 tokens read unsaid


def _checked_length(value, path: Path, key: str) -> int | None:
    """A folder's declared tokens per text: None where it declares none, else at least 3."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 3:
        raise BertkitError(f"{path}: {key} must be an integer of at least 3 ([CLS], a token, [SEP]), "
                           f"got {json.dumps(value)}")
    return value


def _tokenizer_max_len(folder: Path) -> int | None:
    """tokenizer_config.json's model_max_length; None where it is missing or transformers' "no
    limit" (a huge sentinel, 1e30); a value that is no length is named."""
    path = folder / "tokenizer_config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("model_max_length")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1e9:
        return None
    return _checked_length(value, path, "model_max_length")


def _pooling_config(folder: Path) -> dict | None:
    """A sentence-transformers folder's Pooling config (modules.json -> its path/config.json)."""
    try:
        pooling = next(m for m in _modules(folder) if m.get("type", "").endswith("models.Pooling"))
        cfg = json.loads((folder / pooling["path"] / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
        return None
    return cfg if isinstance(cfg, dict) else None


def folder_pooling(folder: str | Path) -> str | None:
    """The pooling a sentence-transformers folder declares (modules.json -> Pooling config)."""
    cfg = _pooling_config(Path(folder))
    if cfg is None:
        return None
    if cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    return None


# the steps of a sentence-transformers pipeline that encode runs (Dropout does nothing at inference)
ST_STEPS = ("models.Transformer", "models.Pooling", "models.Normalize", "models.Dropout")


def unsupported_pooling(folder: str | Path) -> str | None:
    """The pooling modes a sentence-transformers folder declares ("max_tokens", "cls_token +
    mean_tokens") where they are other than one of cls and mean, which bertkit runs; else None."""
    cfg = _pooling_config(Path(folder)) or {}
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in cfg.items() if k.startswith("pooling_mode_") and v)
    return " + ".join(modes) if modes and modes not in (["cls_token"], ["mean_tokens"]) else None


def folder_unsupported(folder: str | Path, modules: bool = True, pooling: bool = True) -> list[str]:
    """What a sentence-transformers folder asks of its pipeline that encode does not do: a Dense
    or other module after pooling (LaBSE's Dense + tanh), a pooling other than one of cls and
    mean, lower-casing the text. Its vectors would differ from sentence-transformers' ones.
    modules, pooling: False leaves those out (a classifier trains its own head on a pooling it
    may be told)."""
    folder = Path(folder)
    found = [f"its {str(m.get('type')).rsplit('.', 1)[-1]} module ({m.get('path')})"
             for m in _modules(folder) if modules and not str(m.get("type", "")).endswith(ST_STEPS)]
    if pooling and (modes := unsupported_pooling(folder)):
        found.append(f"its pooling ({modes})")
    try:
        lower = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8")).get("do_lower_case")
    except (OSError, ValueError, AttributeError):
        lower = False
    if lower is True:
        found.append("its do_lower_case (sentence_bert_config.json)")
    return found


def warn_unsupported(folder: str | Path, runs: str = "encodes",
                     outcome: str = "its vectors differ from sentence-transformers' ones", **which: bool) -> None:
    """A warning where folder_unsupported finds something (which: its modules and pooling
    flags): the vectors are not silently other than the ones the folder's model card promises.
    runs and outcome: what bertkit does without them, and what follows."""
    found = folder_unsupported(folder, **which)
    if found:
        warnings.warn(f"{folder}: bertkit {runs} without {', '.join(found)}, which its sentence-transformers "
                      f"pipeline declares: {outcome}", stacklevel=3)


def pool(sequence_output, pooled_output, attention_mask, pooling: str):
    """Sentence vectors (B, H) from torch tensors or numpy arrays alike."""
    if pooling == "cls":
        return sequence_output[:, 0]                               # (B, H)
    if pooling == "pooler":
        return pooled_output                                       # (B, H)
    if pooling == "mean":  # masked mean over all tokens, specials included (sentence-transformers)
        m = attention_mask[..., None] != 0                         # (B, T, 1)
        return (sequence_output * m).sum(1) / m.sum(1).clip(min=1)
    raise BertkitError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")


def _check_finite(rows) -> None:
    """NaN or inf vectors come from broken weights or config: fail, never hand them on as results."""
    bad = [i for i, r in enumerate(rows) if not np.isfinite(r).all()]
    if bad:
        raise BertkitError(f"{len(bad)} of {len(rows)} output row(s) are not finite (NaN or inf; first: text {bad[0]}): "
                           "the model's weights or config.json are broken")


@dataclass
class TokenVectors:
    tokens: list[str]                  # word pieces, [CLS] and [SEP] included
    offsets: list[tuple[int, int]]     # character span of each piece in its own text
    sequence_ids: list[int | None]     # 0 = first text, 1 = pair text, None = special token
    vectors: np.ndarray                # (n_tokens, H)
    # the tokenizer's normalizer (WordPieceTokenizer.normalize); None: the word is taken as is
    normalize: Callable[[str], str] | None = field(default=None, repr=False, compare=False)

    def find(self, word: str, text: int = 0) -> np.ndarray:
        """Mean vector of the pieces of the first occurrence of `word` (a whole word, matched
        case-blind). The word is normalized as the tokenizer normalizes text, so "café" finds the
        pieces an accent-stripping vocabulary made of it ("cafe"); words of a phrase ("new york")
        must be whole words in the text too."""
        # the normalizer may space characters apart (CJK): pieces hold no spaces, so a space in
        # the target is a place where a new word must start
        words = (self.normalize(word) if self.normalize else word).casefold().split()
        target = "".join(words)
        if not target:
            raise BertkitError(f"word {word!r} is empty after the tokenizer's normalization")
        starts = {sum(map(len, words[:i])) for i in range(1, len(words))}
        # both sides case-folded: a cased model's pieces keep their capitals ("Paris")
        pieces = [t.removeprefix("##").casefold() for t in self.tokens]
        for start in range(len(pieces)):
            # a word starts at a piece without "##": "bank" is not the end of "river ##bank"
            if self.sequence_ids[start] != text or self.tokens[start].startswith("##"):
                continue
            joined = ""
            for end in range(start, len(pieces)):
                if len(joined) in starts and self.tokens[end].startswith("##"):
                    break
                joined += pieces[end]
                if joined == target and (end + 1 == len(self.tokens)
                                         or not self.tokens[end + 1].startswith("##")):
                    return self.vectors[start:end + 1].mean(0)
                if not target.startswith(joined):
                    break
        raise BertkitError(f"word {word!r} not found among the tokens {self.tokens}")


class Encoder:
    """Sentence and token vectors from a BertModel on PyTorch or an OnnxEncoder on ONNX Runtime."""

    def __init__(self, model: BertModel | OnnxEncoder, tokenizer: WordPieceTokenizer, pooling: str = "cls",
                 device: str | torch.device | None = None, precision: str = "fp32", normalize: bool = False,
                 max_len: int | None = None):
        """pooling, normalize, max_len: the defaults of encode() (from_folder takes them from a
        sentence-transformers folder's modules, as sentence-transformers runs it)."""
        self.onnx = isinstance(model, OnnxEncoder)
        if self.onnx:
            if precision != "fp32":
                raise BertkitError("--backend onnx runs in fp32; leave --precision at fp32")
            self.device, self.model = None, model
        else:
            import torch
            self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            precision_context(self.device, precision)  # fails now on an unknown name, not at the first batch
            from ..model import BertForPreTraining
            if isinstance(model, BertForPreTraining):  # what load_model gives by default: its encoder
                model = model.bert
            self.model = model.to(self.device).eval()
        self.precision = precision
        self.tokenizer = tokenizer
        self.default_pooling = pooling
        self.default_normalize = normalize
        self.default_max_len = max_len

    @classmethod
    def from_folder(cls, folder: str | Path, device=None, precision: str = "fp32",
                    backend: str = "torch") -> "Encoder":
        """backend "onnx": the folder's model.onnx on ONNX Runtime (CPU, fp32), from `bertkit export`;
        "onnx-int8": its model.int8.onnx (`bertkit export --int8`)."""
        if backend not in BACKENDS:
            raise BertkitError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        tokenizer = load_tokenizer(folder)  # before the weights: a vocabulary too big for them fails fast
        warn_unsupported(folder)
        defaults = {"pooling": folder_pooling(folder) or "cls", "normalize": folder_normalize(folder),
                    "max_len": folder_max_len(folder)}
        if backend != "torch":
            return cls(OnnxEncoder.from_folder(folder, int8=backend == "onnx-int8"), tokenizer, precision=precision, **defaults)
        from ..checkpoint import load_model
        model, _ = load_model(folder, heads=False)
        return cls(model, tokenizer, device=device, precision=precision, **defaults)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    def _runs(self, texts, pairs, batch_size: int, max_len: int | None,
              truncation: bool) -> Iterator[tuple[list[int], Batch, tuple]]:
        """Yield (input indices, batch, (sequence_output, pooled_output)) over length-sorted
        batches: numpy arrays from ONNX Runtime, tensors from PyTorch."""
        check_int(batch_size, "batch_size")
        limit = self.model.config.max_position_embeddings
        max_len = min(self.default_max_len or limit, limit) if max_len is None else check_int(max_len, "max_len", 3)
        if max_len > limit:
            raise BertkitError(f"max length {max_len} exceeds the model's {limit} positions")
        encs = self.tokenizer.encode_unpadded(texts, pairs, max_len, truncation)
        # longest first: the first batch sizes the heap that the rest reuse (a third fewer page
        # faults than shortest first), and a batch too long for memory fails at once
        order = sorted(range(len(encs)), key=lambda i: -len(encs[i].ids))
        runs = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
        if self.onnx:
            for idx in runs:
                batch = self.tokenizer.pad([encs[i] for i in idx], tensors="np")
                yield idx, batch, self.model.run(batch.input_ids, batch.token_type_ids, batch.attention_mask)
            return
        import torch
        with torch.inference_mode(), precision_context(self.device, self.precision):
            for idx in runs:
                batch = self.tokenizer.pad([encs[i] for i in idx])
                out = self.model(**batch.model_inputs(self.device))
                yield idx, batch, (out.sequence_output, out.pooled_output)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, pooling: str | None = None,
               batch_size: int = 32, max_len: int | None = None, truncation: bool = True,
               normalize: bool | None = None) -> np.ndarray:
        """Sentence vectors, (len(texts), H) float32, in input order. None: the encoder's defaults."""
        pooling = pooling or self.default_pooling
        normalize = self.default_normalize if normalize is None else normalize
        if pooling not in POOLINGS:
            raise BertkitError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        out = np.empty((len(texts), self.hidden_size), dtype=np.float32)
        for idx, batch, (seq, pooled) in self._runs(texts, pairs, batch_size, max_len, truncation):
            mask = batch.attention_mask if self.onnx else batch.attention_mask.to(self.device)
            v = pool(seq, pooled, mask, pooling)
            out[idx] = v if self.onnx else v.float().cpu().numpy()
        if normalize:  # as torch's F.normalize: v / max(|v|, 1e-12)
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        _check_finite(out)
        return out

    def token_vectors(self, texts: Sequence[str], pairs: Sequence[str] | None = None, batch_size: int = 32,
                      max_len: int | None = None, truncation: bool = True) -> list[TokenVectors]:
        """Last-layer vector of every word piece, per text, in input order."""
        result: list[TokenVectors | None] = [None] * len(texts)
        for idx, batch, (seq, _) in self._runs(texts, pairs, batch_size, max_len, truncation):
            seq = seq if self.onnx else seq.float().cpu().numpy()
            for row, i in enumerate(idx):
                n = len(batch.tokens[row])
                result[i] = TokenVectors(batch.tokens[row], batch.offsets[row], batch.sequence_ids[row],
                                         seq[row, :n], self.tokenizer.normalize)
        _check_finite([r.vectors for r in result])
        return result


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
