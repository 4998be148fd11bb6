"""WordPiece tokenization on the `tokenizers` library (the Rust implementation HF uses).

Loads a folder's tokenizer.json or vocab.txt, trains a new vocabulary from text, and encodes
single texts and pairs into padded tensors with segment ids, attention mask and character
offsets.
"""
from __future__ import annotations

import json
import operator
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np
from tokenizers import Encoding, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .config import BertConfig, load_config
from .errors import BertkitError, check_int
from .files import atomic_write
from .inputs import lone_surrogate

if TYPE_CHECKING:
    import torch

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]
# tokenizer_config.json's keys for BERT's normaliser, as transformers names them
_NORMALIZER_KEYS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars")
# the tokenizer_class values (None: a model folder's config.json says bert) whose transformers
# class builds that normaliser itself
_BERT_TOKENIZER_CLASSES = (None, "BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "DistilBertTokenizerFast")


def renumber_pieces(tok: Tokenizer) -> None:
    """Number a trained vocabulary in an order of its own: the special tokens first (ids 0-4, as
    trained), then single characters, "##" characters, longer pieces and "##" pieces, each in code
    point order. `tokenizers` numbers the alphabet and equally frequent merges in hash order, which
    changes with every training: the same pieces got other ids each time (every vocab.txt
    differed, and so did models of the same text and seed). The pieces learned can still differ
    where equally frequent merges compete (the README says how often)."""
    def key(t: str):
        piece = t.removeprefix("##")
        return len(piece) > 1, piece != t, t
    vocab = tok.get_vocab()
    order = [t for t in SPECIAL_TOKENS if t in vocab] + sorted((t for t in vocab if t not in SPECIAL_TOKENS), key=key)
    tok.model = models.WordPiece({t: i for i, t in enumerate(order)}, unk_token=UNK, max_input_chars_per_word=100,
                                 continuing_subword_prefix="##")


@dataclass
class Batch:
    # torch.Tensor, or int64 numpy arrays from pad(..., tensors="np") (ONNX Runtime needs no torch)
    input_ids: torch.Tensor       # (B, T) padded to the longest in the batch
    token_type_ids: torch.Tensor  # (B, T) 0 for segment A (and padding), 1 for segment B
    attention_mask: torch.Tensor  # (B, T) 1 = token, 0 = padding
    tokens: list[list[str]]       # word pieces per text, without padding
    offsets: list[list[tuple[int, int]]]  # (start, end) characters in its own text; (0, 0) for specials
    sequence_ids: list[list[int | None]]  # 0 / 1: which text a piece came from; None for specials

    def model_inputs(self, device=None) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k).to(device) for k in ("input_ids", "token_type_ids", "attention_mask")}


def bert_pipeline(tok: Tokenizer, lowercase: bool, strip_accents: bool | None = None,
                  chinese_chars: bool = True) -> Tokenizer:
    # BERT's basic tokenization: clean control characters, split CJK, lowercase and strip
    # accents for uncased vocabularies, split on whitespace and punctuation. strip_accents and
    # chinese_chars: tokenizer_config.json's strip_accents (None: as lowercase) and
    # tokenize_chinese_chars, as transformers reads them.
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                                strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _set_post_processor(tok: Tokenizer) -> None:
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)])


def _normalizer_lowercase(tok: Tokenizer) -> bool | None:
    """Whether a tokenizer.json's normaliser lowercases; None when it does not say."""
    def walk(n):
        if not isinstance(n, dict):
            return None
        if n.get("type") == "BertNormalizer":
            return bool(n.get("lowercase", True))
        if n.get("type") == "Lowercase":
            return True
        if n.get("type") == "Sequence":
            found = [walk(m) for m in n.get("normalizers", [])]
            return True if True in found else (False if found else None)
        return None
    return walk(json.loads(tok.to_str()).get("normalizer"))


def _normalizer_settings(tok: Tokenizer) -> dict:
    """A BertNormalizer's strip_accents and CJK splitting as tokenizer_config.json keys, so that
    transformers' tokenizers (the slow one reads vocab.txt) normalise as this one does."""
    n = json.loads(tok.to_str()).get("normalizer")
    if not isinstance(n, dict) or n.get("type") != "BertNormalizer":
        return {}
    return {"strip_accents": n.get("strip_accents"), "tokenize_chinese_chars": bool(n.get("handle_chinese_chars", True))}


def _vocab_casing(vocab: dict[str, int] | Iterable[str], source: Path) -> bool:
    """Lowercase unless the vocabulary is cased: more than 1% of its word tokens (not ##pieces,
    not [specials]) start with a capital. Only a guess, so it is said on stderr."""
    words = [t for t in vocab if t and not t.startswith("##") and not (t.startswith("[") and t.endswith("]"))]
    capitals = sum(1 for t in words if t[0].isupper())
    cased = capitals > 0.01 * len(words)
    what = ("has capitals, so treating it as cased" if cased
            else "has no capitalised words, so treating it as uncased (lowercasing)")
    print(f"bertkit: {source.parent}: no tokenizer_config.json do_lower_case; {source.name} {what}",
          file=sys.stderr)
    return not cased


MAX_VOCAB_SIZE = 1 << 21  # 2,097,152 pieces: far past any corpus's; 10^9 aborted in tokenizers' allocator


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size > MAX_VOCAB_SIZE:
        raise BertkitError(f"--vocab-size {vocab_size}: at most {MAX_VOCAB_SIZE:,} (the largest published BERT "
                           "vocabularies hold about 250,000 pieces)")


def _check_agrees(tok: Tokenizer, folder: Path) -> None:
    """tokenizer.json must be a WordPiece model, and where vocab.txt lies beside it the two must
    hold the same tokens at the same ids: ids from one would hit the other's embeddings."""
    kind = type(tok.model).__name__
    if kind != "WordPiece":
        raise BertkitError(f"{folder / 'tokenizer.json'}: a {kind} tokenizer, not WordPiece: BERT's vocabulary is "
                           "WordPiece (remove tokenizer.json to use vocab.txt)")
    path = folder / "vocab.txt"
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    lines = lines[:-1] if lines and lines[-1] == "" else lines
    vocab = tok.get_vocab()
    for i, token in enumerate(lines):
        if vocab.get(token.rstrip("\r")) != i:
            raise BertkitError(f"{path}, line {i + 1}: {token!r} is id {i} here but "
                               f"{vocab.get(token.rstrip(chr(13)), 'absent')} in tokenizer.json: the two "
                               "vocabularies differ; keep the one the model was trained with")


class WordPieceTokenizer:
    def __init__(self, tok: Tokenizer, lowercase: bool = True, source: str = "tokenizer"):
        missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
        if missing:
            raise BertkitError(f"{source}: vocabulary lacks special token(s) {', '.join(missing)}")
        # A tokenizer.json may carry fixed padding/truncation (MiniLM's pads everything to 128);
        # bertkit pads per batch and truncates per call instead.
        tok.no_padding()
        tok.no_truncation()
        self.tok = tok
        self.lowercase = lowercase
        self._saved = None  # (what the tokenizer was, save()'s files of it): _files
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            tok.token_to_id(t) for t in SPECIAL_TOKENS)

    # ---- construction ----
    @classmethod
    def from_vocab(cls, path: str | Path, lowercase: bool | None = None, strip_accents: bool | None = None,
                   chinese_chars: bool = True) -> "WordPieceTokenizer":
        """A tokenizer from a vocab.txt; lowercase=None decides casing from the vocabulary (said on
        stderr); strip_accents and chinese_chars as bert_pipeline takes them."""
        path = Path(path)
        vocab: dict[str, int] = {}
        from .inputs import read_text
        # missing, unreadable, UTF-16 or not UTF-8: one line naming the file (and byte)
        lines = read_text(path).removeprefix("\ufeff").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for lineno, token in enumerate(lines, 1):
            token = token.rstrip("\r")
            if token in vocab:
                raise BertkitError(f"{path}, line {lineno}: token {token!r} already on line {vocab[token] + 1}")
            vocab[token] = lineno - 1
        if not vocab:
            raise BertkitError(f"{path}: empty vocabulary")
        if lowercase is None:
            lowercase = _vocab_casing(vocab, path)
        tok = bert_pipeline(Tokenizer(models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=100)),
                            lowercase, strip_accents, chinese_chars)
        # registered as special (added) tokens, "[MASK]" in a text stays one token instead of being
        # split by punctuation into "[", "mask", "]" (three [UNK]s); their ids stay the vocabulary's
        tok.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])
        if tok.token_to_id(CLS) is not None and tok.token_to_id(SEP) is not None:
            _set_post_processor(tok)
        return cls(tok, lowercase, source=str(path))

    @classmethod
    def from_folder(cls, folder: str | Path) -> "WordPieceTokenizer":
        """The folder's tokenizer.json, else its vocab.txt. Casing comes from the folder's own files, in
        order: tokenizer_config.json do_lower_case; the normaliser in tokenizer.json; the vocabulary.
        A tokenizer_config.json that sets any of do_lower_case, strip_accents, tokenize_chinese_chars
        gives tokenizer.json the normaliser transformers' BertTokenizer builds from them."""
        folder = Path(folder)
        if not folder.is_dir():
            raise BertkitError(f"{folder}: " + ("no such folder" if not folder.exists() else "not a folder") +
                               " (a model or tokenizer folder is expected)")
        lowercase, settings = None, {}
        config = folder / "tokenizer_config.json"
        if config.is_file():
            from .inputs import parse_json, read_text
            settings = parse_json(read_text(config), str(config))
            settings = settings if isinstance(settings, dict) else {}
            if settings.get("do_lower_case") is not None:
                lowercase = bool(settings["do_lower_case"])
        if (folder / "tokenizer.json").is_file():
            try:
                tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as e:  # the Rust side raises a bare Exception
                raise BertkitError(f"{folder / 'tokenizer.json'}: cannot read tokenizer ({e})") from None
            _check_agrees(tok, folder)
            # transformers' BertTokenizer keeps tokenizer.json's vocabulary and builds BERT's pipeline
            # around it: one without a post-processor (as `tokenizers` trains it) encoded no [CLS] and
            # [SEP], one without a pre-tokenizer read a text as one word ([UNK]), one without its
            # special tokens registered split "[MASK]" into three [UNK]s
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tok.decoder = decoders.WordPiece(prefix="##")
            tok.add_special_tokens([t for t in SPECIAL_TOKENS if tok.token_to_id(t) is not None])
            if tok.token_to_id(CLS) is not None and tok.token_to_id(SEP) is not None:
                _set_post_processor(tok)
            if settings.get("tokenizer_class") not in _BERT_TOKENIZER_CLASSES:
                lowercase = None  # transformers runs such a class on tokenizer.json as it is
            elif any(settings.get(k) is not None for k in _NORMALIZER_KEYS):
                # transformers' BertTokenizer builds its normaliser from these keys (its defaults for
                # those not given), whatever tokenizer.json holds: do_lower_case false beside a
                # lowercasing tokenizer.json was lowercased here and not there, and saved so
                strip = settings.get("strip_accents")
                lowercase = True if lowercase is None else lowercase
                bert_pipeline(tok, lowercase, None if strip is None else bool(strip),
                              bool(settings.get("tokenize_chinese_chars", True)))
            if lowercase is None:
                lowercase = _normalizer_lowercase(tok)
            if lowercase is None:
                lowercase = _vocab_casing(tok.get_vocab(), folder / "tokenizer.json")
            return cls(tok, lowercase, source=str(folder / "tokenizer.json"))
        if (folder / "vocab.txt").is_file():  # tokenizer_config.json's other normaliser keys, as transformers reads them
            strip = settings.get("strip_accents")
            return cls.from_vocab(folder / "vocab.txt", lowercase, None if strip is None else bool(strip),
                                  bool(settings.get("tokenize_chinese_chars", True)))
        raise BertkitError(f"{folder}: no tokenizer.json or vocab.txt in this folder")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, lowercase: bool = True,
              min_frequency: int = 2) -> "WordPieceTokenizer":
        """A new WordPiece vocabulary learned from `texts` (an iterator of strings)."""
        if isinstance(texts, str):  # a vocabulary of its characters
            raise BertkitError("texts must be an iterable of strings, not one string")
        if vocab_size < len(SPECIAL_TOKENS) + 1:
            raise BertkitError(f"--vocab-size {vocab_size} is too small: at least {len(SPECIAL_TOKENS) + 1} "
                               f"(the {len(SPECIAL_TOKENS)} special tokens and one more)")
        check_vocab_size(vocab_size)
        if min_frequency < 0:  # tokenizers' OverflowError otherwise
            raise BertkitError(f"--min-frequency must be at least 0, got {min_frequency}")
        tok = bert_pipeline(Tokenizer(models.WordPiece(unk_token=UNK, max_input_chars_per_word=100)),
                            lowercase)
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=SPECIAL_TOKENS, continuing_subword_prefix="##",
                                            show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        if tok.get_vocab_size() <= len(SPECIAL_TOKENS):
            raise BertkitError("the training text is empty: no vocabulary could be learned")
        renumber_pieces(tok)
        _set_post_processor(tok)
        return cls(tok, lowercase)

    def save(self, folder: str | Path, model_max_length: int | None = None) -> None:
        """Write tokenizer.json, vocab.txt (ids in line order) and HF's tokenizer_config.json
        into `folder` (made if missing); model_max_length: the model's positions, for HF's
        tokenizer to truncate at."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in self._files(model_max_length).items():
            atomic_write(folder / name, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))

    def _files(self, model_max_length: int | None) -> dict[str, str]:
        """save()'s files as text, kept while the tokenizer stays as it is: a run's checkpoints each
        save it (80 ms for a 30k vocabulary, a Zen 4 core)."""
        key = (self.tok.to_str(), self.lowercase, model_max_length)
        if self._saved is not None and self._saved[0] == key:
            return self._saved[1]
        vocab = sorted(self.tok.get_vocab().items(), key=lambda kv: kv[1])
        # without the truncation and padding encode() last set: a reader of tokenizer.json alone
        # (`tokenizers`, Rust, JS) would cut every text at that length
        clean = Tokenizer.from_str(key[0])
        clean.no_truncation()
        clean.no_padding()
        files = {
            "tokenizer.json": clean.to_str(),
            "vocab.txt": "".join(t + "\n" for t, _ in vocab),
            "tokenizer_config.json": json.dumps({
                "tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
                **_normalizer_settings(self.tok),
                "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS,
                "mask_token": MASK,
                **({"model_max_length": model_max_length} if model_max_length else {})}, indent=2) + "\n",
        }
        self._saved = (key, files)
        return files

    # ---- vocabulary ----
    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.tok.id_to_token(i)

    def normalize(self, text: str) -> str:
        """`text` as the tokenizer's normalizer leaves it before splitting it into pieces (an uncased
        BERT's: lower-cased, accents stripped, CJK characters spaced apart)."""
        n = self.tok.normalizer
        return text if n is None else n.normalize_str(text)

    def special_ids(self) -> list[int]:
        return [self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of token ids (a list, array or 1-D tensor). As transformers' decode: special
        tokens ([CLS], [SEP], [MASK], [UNK], [PAD]) are written out unless skip_special_tokens,
        so an unknown word shows as [UNK] instead of vanishing. An id outside the vocabulary is
        an error (the tokenizers library drops it without a word)."""
        if isinstance(ids, (str, bytes)):
            raise BertkitError(f"decode takes token ids, not a {type(ids).__name__}")
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        for i, t in enumerate(ids):
            try:
                ids[i] = operator.index(t)  # ints, numpy's integers; not floats
            except TypeError:
                ids[i] = -1
            if isinstance(t, bool) or not 0 <= ids[i] < self.vocab_size:
                raise BertkitError(f"decode: position {i} holds {t!r}, not a token id "
                                   f"(an integer from 0 to {self.vocab_size - 1})")
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    # ---- encoding ----
    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, max_len: int = 512,
               truncation: bool = True) -> Batch:
        """Encode texts (or text pairs as [CLS] A [SEP] B [SEP]) into one padded batch.

        Longer inputs are cut to max_len (the longer text of a pair first) with a warning, or
        rejected when truncation is off.
        """
        return self.pad(self.encode_unpadded(texts, pairs, max_len, truncation))

    def encode_unpadded(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                        max_len: int = 512, truncation: bool = True,
                        where: Callable[[int], str] | None = None) -> list[Encoding]:
        """One `tokenizers.Encoding` per text (or pair), unpadded; see `encode`. where(i) names
        text i in the too-long error (a file's line); given, truncation is left to the caller to
        report (`Encoding.overflowing`), as a streamed file sums it over its chunks."""
        for name, given in (("texts", texts), ("pairs", pairs)):
            if isinstance(given, str):  # list("a text") would be one text per character
                raise BertkitError(f"{name} must be a list of strings, not one string: [{given[:20]!r}...]")
        texts = list(texts)
        if not texts:
            raise BertkitError("no texts to encode (the list is empty)")
        if pairs is not None:
            pairs = list(pairs)
            if len(pairs) != len(texts):
                raise BertkitError(f"{len(texts)} texts but {len(pairs)} text pairs")
        for name, strings in (("text", texts), ("text_pair", pairs or [])):
            for i, t in enumerate(strings):
                if not isinstance(t, str):
                    raise BertkitError(f"{name} {i} is {type(t).__name__}, not a string")
                if bad := lone_surrogate(t):  # tokenizers takes it for a wrong type (TypeError)
                    raise BertkitError(f"{name} {i} holds the lone surrogate {bad} "
                                       "(half of a UTF-16 pair), which is not a character")
        specials = 3 if pairs is not None else 2
        check_int(max_len, "max_len")
        if max_len <= specials:
            raise BertkitError(f"max length {max_len} leaves no room for text beside the special tokens")
        cut_texts, cut_pairs = self._cut_long(texts, pairs, max_len - specials)
        self.tok.enable_truncation(max_len, strategy="longest_first")
        encs = self.tok.encode_batch(list(zip(cut_texts, cut_pairs)) if pairs is not None else cut_texts)
        cut = [i for i, e in enumerate(encs) if e.overflowing]
        if cut:
            if not truncation:
                self.tok.no_truncation()
                i = cut[0]
                n = len(self.tok.encode(*((texts[i], pairs[i]) if pairs is not None else (texts[i],))).ids)
                raise BertkitError(
                    f"{where(i) if where else f'text {i}'} is {n} tokens long, over the limit of {max_len} "
                    f"({len(cut)} text(s) too long); shorten it or allow truncation")
            if where is None:
                warnings.warn(f"{len(cut)} of {len(texts)} text(s) longer than {max_len} tokens were "
                              f"truncated (first: text {cut[0]})", stacklevel=3)
        return encs

    def _cut_long(self, texts: list[str], pairs: list[str] | None, budget: int):
        """Texts cut after the tokens that truncation to `budget` can keep, plus one or two.

        `tokenizers` truncation keeps every cut-off window as an overflowing encoding, and for a
        pair every combination of the two texts' windows: a pair of two 100 k-character texts
        at max_len 128 took 35 s and a pair of 200 k-character ones ran out of 24 GiB. Cut first
        (at a token's end: WordPiece's greedy longest match gives a prefix of the text the same
        first tokens), the truncating encode gives the same result, overflow included: a text
        keeps budget + 1 tokens, so truncation still happens, and of a pair the longer one keeps
        one more, so longest-first still sees which is longer. Only texts with more characters
        than that can have that many tokens (a Hangul syllable is up to 3 pieces after NFD, so
        shorter texts are left whole: correct, if not cut)."""
        limit = budget + 2
        long = [i for i, t in enumerate(texts) if len(t) > limit or (pairs is not None and len(pairs[i]) > limit)]
        if not long or not isinstance(self.tok.model, models.WordPiece):
            return texts, pairs
        self.tok.no_truncation()
        texts, pairs = list(texts), (list(pairs) if pairs is not None else None)
        for i in long:
            if pairs is None:
                a, _ = self._head(texts[i], budget + 1)
                texts[i] = _cut_after(texts[i], a, budget + 1)
                continue
            (a, whole_a), (b, whole_b) = self._head(texts[i], limit), self._head(pairs[i], limit)
            n1, n2 = len(a.ids), len(b.ids)
            if n1 >= limit and n2 >= limit:  # both long: which is longer decides longest-first's split
                n1 = n1 if whole_a else self._count(texts[i])
                n2 = n2 if whole_b else self._count(pairs[i])
            t1, t2 = _cut_after(texts[i], a, budget + 1 + (n1 > n2)), _cut_after(pairs[i], b, budget + 1 + (n2 > n1))
            m1, m2 = (len(e.ids) for e in self.tok.encode_batch([t1, t2], add_special_tokens=False))
            if (m1 > m2, m1 < m2) == (n1 > n2, n1 < n2) and m1 + m2 > budget or n1 + n2 <= budget:
                texts[i], pairs[i] = t1, t2  # one char can be several pieces: only if the order holds
        return texts, pairs

    def _splits_at_spaces(self) -> bool:
        """A space ends a word, whatever is around it (BERT's pre-tokenizer; not so where a
        normalizer drops characters: "a\\x1cb" is the one word "ab")."""
        return isinstance(self.tok.pre_tokenizer, pre_tokenizers.BertPreTokenizer)

    def _head(self, text: str, keep: int) -> tuple[Encoding, bool]:
        """Tokens (no specials) of a head of `text` ending at a space that holds at least `keep`
        of them, and whether that head is the whole text: tokenizing all of a 13 MB line to keep
        its first 512 tokens took 2.6 GB."""
        self.tok.no_truncation()
        size = 16 * keep + 1024
        while size < len(text) and self._splits_at_spaces():
            end = text.rfind(" ", 0, size)
            if end > 0:
                enc = self.tok.encode(text[:end], add_special_tokens=False)
                if len(enc.ids) >= keep:
                    return enc, False
            size *= 4
        return self.tok.encode(text, add_special_tokens=False), True

    def _count(self, text: str, part: int = 1 << 20) -> int:
        """Tokens in `text` (no specials), counted a part at a time cut at spaces: the count of the
        whole, in bounded memory."""
        self.tok.no_truncation()
        if not self._splits_at_spaces():
            return len(self.tok.encode(text, add_special_tokens=False).ids)
        n, start = 0, 0
        while start < len(text):
            end = len(text) if start + part >= len(text) else text.rfind(" ", start + 1, start + part)
            if end <= start:  # no space in the part: on to the next one
                end = text.find(" ", start + part)
                end = len(text) if end < 0 else end
            n += len(self.tok.encode(text[start:end], add_special_tokens=False).ids)
            start = end
        return n

    def pad(self, encs: Sequence[Encoding], tensors: str = "pt") -> Batch:
        """Pad encodings to the longest of them; tensors "pt" (torch) or "np" (numpy int64)."""
        T = max(len(e.ids) for e in encs)
        ids = np.full((len(encs), T), self.pad_id, dtype=np.int64)
        types, mask = np.zeros_like(ids), np.zeros_like(ids)
        for row, e in enumerate(encs):
            n = len(e.ids)
            ids[row, :n], types[row, :n], mask[row, :n] = e.ids, e.type_ids, 1
        if tensors == "pt":
            import torch
            ids, types, mask = torch.from_numpy(ids), torch.from_numpy(types), torch.from_numpy(mask)
        elif tensors != "np":
            raise ValueError(f"tensors must be 'pt' or 'np', got {tensors!r}")
        return Batch(ids, types, mask, [e.tokens for e in encs], [e.offsets for e in encs],
                     [e.sequence_ids for e in encs])

    def tokenless(self, texts: list[str | None]) -> list[int]:
        """Indices of the texts that are empty or hold no token at all (a zero-width space, control
        characters: what str.strip() keeps and the tokenizer drops); None entries are skipped."""
        given = [(i, t) for i, t in enumerate(texts) if t is not None]
        self.tok.no_truncation()
        # a text has a token if its first characters do: a 50 MB line is not tokenized whole for this
        heads = self.tok.encode_batch([t[:1000] for _, t in given], add_special_tokens=False) if given else []
        bad = [(i, t) for (i, t), e in zip(given, heads) if not t.strip() or not e.ids]
        longer = [(i, t) for i, t in bad if t.strip() and len(t) > 1000]  # the rest decides
        whole = self.tok.encode_batch([t for _, t in longer], add_special_tokens=False) if longer else []
        kept = {i for (i, _), e in zip(longer, whole) if e.ids}
        return [i for i, _ in bad if i not in kept]

    def refuse_tokenless(self, texts: list[str | None], where: Callable[[int], str]) -> None:
        """An empty text, or one the tokenizer keeps nothing of, refused by name (as the server
        answers 422): its vector or prediction would be of [CLS] and [SEP] alone. where(i) names text i."""
        bad = self.tokenless(texts)
        if bad:
            t = texts[bad[0]]
            why = "empty text" if not t.strip() else f"no tokens in {t[:40]!r} (nothing but characters the tokenizer drops)"
            raise BertkitError(f"{where(bad[0])}: {why}; {len(bad)} such text(s)")

    def refuse_tokenless_encodings(self, encs: list, texts: Sequence[str], pairs: Sequence[str] | None,
                                   where: Callable[[int], str]) -> None:
        """refuse_tokenless over texts (and pairs) already encoded (encode_unpadded's encodings):
        a text none of whose tokens made it into its encoding, by line and field, without a second
        pass of the tokenizer (the streamed encode's chunks)."""
        for seq, strings, field in ((0, texts, "text"), (1, pairs, "text_pair")):
            if strings is None:
                continue
            bad = [i for i, e in enumerate(encs) if seq not in e.sequence_ids]
            if bad:
                t = strings[bad[0]]
                why = ("empty text" if not t.strip() else
                       f"no tokens in {t[:40]!r} (nothing but characters the tokenizer drops)")
                named = where(bad[0]) + (f" ({field})" if pairs is not None else "")
                raise BertkitError(f"{named}: {why}; {len(bad)} such text(s)")

    def tokenize_ids(self, text: str) -> list[int]:
        """Token ids of one text, without special tokens, whole (never truncated)."""
        self.tok.no_truncation()  # encode_unpadded leaves its max_len set
        return self.tok.encode(text, add_special_tokens=False).ids

    def tokenize(self, text: str) -> list[str]:
        """Word pieces of one text, without special tokens, whole (never truncated)."""
        self.tok.no_truncation()
        return self.tok.encode(text, add_special_tokens=False).tokens


def _cut_after(text: str, enc: Encoding, keep: int) -> str:
    """text up to the end of its token number `keep` (enc: its tokens, no specials)."""
    return text if len(enc.ids) <= keep else text[:enc.offsets[keep - 1][1]]


def check_vocab_fits(tokenizer: WordPieceTokenizer, cfg: BertConfig, folder: str | Path) -> None:
    """A tokenizer whose ids reach past the embedding matrix would crash at the first such id:
    refuse it when the folder is loaded, naming both sizes."""
    folder = Path(folder)
    vocab = tokenizer.tok.get_vocab(with_added_tokens=True)
    n = max(vocab.values(), default=-1) + 1
    if n > cfg.vocab_size:
        source = folder / ("tokenizer.json" if (folder / "tokenizer.json").is_file() else "vocab.txt")
        raise BertkitError(f"{source}: the tokenizer has {n} token ids but config.json vocab_size is "
                           f"{cfg.vocab_size} (the model has no embedding for ids {cfg.vocab_size} and up); "
                           "use the vocabulary the model was trained with")


def load_tokenizer(folder: str | Path, cfg: BertConfig | None = None) -> WordPieceTokenizer:
    """The folder's tokenizer, checked to fit the folder's model (config.json vocab_size)."""
    tokenizer = WordPieceTokenizer.from_folder(folder)
    check_vocab_fits(tokenizer, cfg or load_config(folder), folder)
    return tokenizer
