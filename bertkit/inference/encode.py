"""Contextual vectors: sentence vectors and per-token vectors for texts and text pairs.

Texts are sorted by length (longest first) within chunks of CHUNK_TEXTS texts and batched
so that padding is small; results come back in input order. `bertkit encode` runs the same
chunks over a file of any size (encode_file.py), so that its vectors equal these. The model
runs in fp32 unless bf16 is asked for: bf16 autocast is faster on a GPU and on a CPU with native bf16 (MiniLM on 2 AMX cores: about 1.9x), but moves vectors
off their fp32 values (there: max abs diff 1e-2, cosine to the fp32 vector at least 0.9999),
which users comparing or storing vectors do not expect. On a CPU without native bf16 it is usually
slower. An exported encoder on ONNX Runtime (OnnxEncoder) runs here too, and that path never
imports torch.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ..errors import BertkitError, check_int
from ..pooling import POOLINGS, folder_max_len, folder_normalize, folder_pooling, pool, warn_unsupported
from ..precision import precision_context
from ..tokenizer import Batch, WordPieceTokenizer, load_tokenizer
from .onnx_runtime import OnnxEncoder

if TYPE_CHECKING:
    import torch

    from ..model import BertModel

# texts are length-sorted and batched within chunks of this many texts (encode, encode_file). Bigger
# chunks pad less: 20,000 reviews and tweets in MiniLM's batches of 32 are 5.4% padding in chunks of
# 1,024, 1.9% in chunks of 4,096, 1.0% sorted all at once. A chunk is also what a killed
# `bertkit encode` loses at most and what torchrun's ranks share out: seconds of work at this size.
CHUNK_TEXTS = 4096


BACKENDS = ("torch", "onnx", "onnx-int8")  # onnx-int8: the dynamic int8 weights `export --int8` writes


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
        from ..folders import load_model
        model, _ = load_model(folder, heads=False)
        return cls(model, tokenizer, device=device, precision=precision, **defaults)

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    def tokens_per_text(self, max_len: int | None) -> int:
        """The tokens a text is read to: max_len, else the folder's default, within the positions."""
        limit = self.model.config.max_position_embeddings
        max_len = min(self.default_max_len or limit, limit) if max_len is None else check_int(max_len, "max_len", 3)
        if max_len > limit:
            raise BertkitError(f"max length {max_len} exceeds the model's {limit} positions")
        return max_len

    def _runs(self, texts, pairs, batch_size: int, max_len: int | None, truncation: bool,
              where: Callable[[int], str] | None = None, cut: list[int] | None = None,
              refuse_tokenless: bool = False) -> Iterator[tuple[list[int], Batch, tuple]]:
        """Yield (input indices, batch, (sequence_output, pooled_output)) over length-sorted
        batches: numpy arrays from ONNX Runtime, tensors from PyTorch. where(i) names text i in
        errors; cut, where given, gets the indices of the texts truncated (and no warning is given);
        refuse_tokenless: a text the tokenizer keeps nothing of is an error naming where(i)."""
        check_int(batch_size, "batch_size")
        encs = self.tokenizer.encode_unpadded(texts, pairs, self.tokens_per_text(max_len), truncation,
                                              where=where if cut is not None else None)
        if refuse_tokenless:  # from these encodings: the chunk is tokenized once
            self.tokenizer.refuse_tokenless_encodings(encs, texts, pairs, where)
        if cut is not None:
            cut.extend(i for i, e in enumerate(encs) if e.overflowing)
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

    def encode_chunk(self, texts: Sequence[str], pairs: Sequence[str] | None, pooling: str, batch_size: int,
                     max_len: int | None, truncation: bool, normalize: bool,
                     where: Callable[[int], str], cut: list[int], refuse_tokenless: bool = False) -> np.ndarray:
        """Sentence vectors of one chunk of texts, (len(texts), H) float32: its texts are sorted by
        length and batched among themselves. encode() and a streamed file (encode_file.py) both
        run chunks of the same size, so that they give the same vectors."""
        out = np.empty((len(texts), self.hidden_size), dtype=np.float32)
        for idx, batch, (seq, pooled) in self._runs(texts, pairs, batch_size, max_len, truncation, where, cut,
                                                    refuse_tokenless):
            mask = batch.attention_mask if self.onnx else batch.attention_mask.to(self.device)
            v = pool(seq, pooled, mask, pooling)
            out[idx] = v if self.onnx else v.float().cpu().numpy()
        if normalize:  # as torch's F.normalize: v / max(|v|, 1e-12)
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, pooling: str | None = None,
               batch_size: int = 32, max_len: int | None = None, truncation: bool = True,
               normalize: bool | None = None, chunk: int = CHUNK_TEXTS) -> np.ndarray:
        """Sentence vectors, (len(texts), H) float32, in input order. None: the encoder's defaults.
        chunk: texts sorted by length together (`bertkit encode --chunk-texts` gives the same
        vectors for the same size)."""
        pooling = pooling or self.default_pooling
        normalize = self.default_normalize if normalize is None else normalize
        if pooling not in POOLINGS:
            raise BertkitError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
        check_int(batch_size, "batch_size")
        check_int(chunk, "chunk")
        if isinstance(texts, str) or isinstance(pairs, str) or not len(texts):
            self.tokenizer.encode_unpadded(texts, pairs)  # its error: one string, or an empty list
        if pairs is not None and len(pairs) != len(texts):
            raise BertkitError(f"{len(texts)} texts but {len(pairs)} text pairs")
        step, cut, parts = chunk, [], []
        for s in range(0, len(texts), step):
            chunk_cut: list[int] = []
            parts.append(self.encode_chunk(texts[s:s + step], None if pairs is None else pairs[s:s + step], pooling,
                                           batch_size, max_len, truncation, normalize,
                                           where=lambda i, s=s: f"text {s + i}", cut=chunk_cut))
            cut += [s + i for i in chunk_cut]
        if cut:
            warnings.warn(f"{len(cut)} of {len(texts)} text(s) longer than {self.tokens_per_text(max_len)} tokens were "
                          f"truncated (first: text {cut[0]})", stacklevel=2)
        out = np.concatenate(parts)
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
