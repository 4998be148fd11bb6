"""Pretraining's data: the corpus's documents, the vocabulary and the token shards prepared in
OUT/data (reused only when the same options and text made them), and the batches of each
phase."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from ..config import PRESETS
from ..errors import BertkitError
from ..tokenizer import WordPieceTokenizer
from .batches import PretrainingBatches
from .contamination import Removed, evaluation_texts, without_evaluation_texts
from .corpus import corpus_files, iter_documents
from .masking import MaskingConfig
from .recipes import PretrainConfig
from .shards import TokenStore, tokenize_corpus, training_documents


class Documents:
    """The corpus's documents for the two passes of a new run (the vocabulary, then the shards).
    Splitting text into sentences is most of the preparation time (the built-in sample on a 2-core
    Zen 4: 12.4 s of the 10-minute budget per pass in one process, 8.6 s in 2 workers), so the
    first pass keeps what it read for the second, up to KEEP_CHARS; a larger corpus is read again
    (constant memory)."""

    KEEP_CHARS = 200_000_000

    def __init__(self, cfg: PretrainConfig):
        self.cfg, self.kept, self.whole = cfg, [], False
        self.removed: Removed | None = None  # with --exclude-from: the evaluation texts taken out

    def _read(self):
        docs = iter_documents(self.cfg.corpus, per_file=self.cfg.doc_per_file, per_line=self.cfg.sentence_per_line)
        if self.cfg.exclude_from:  # evaluation texts taken out as the documents are read
            held = evaluation_texts(f.strip() for f in self.cfg.exclude_from.split(",") if f.strip())
            self.removed = Removed()
            docs = without_evaluation_texts(docs, held, self.removed)
        return docs

    def __iter__(self):
        if self.whole:
            yield from self.kept
            return
        chars, keep = 0, True
        self.kept = []
        for doc in self._read():
            if keep:
                chars += sum(map(len, doc))
                keep = chars <= self.KEEP_CHARS
                if keep:
                    self.kept.append(doc)
                else:
                    self.kept.clear()
            yield doc
        self.whole = keep  # read to the end and all kept: the next pass reads the list


def prepare_tokenizer(cfg: PretrainConfig, data: Path, documents: Documents, log) -> WordPieceTokenizer:
    if (data / "tokenizer.json").is_file():   # a resumed run keeps its vocabulary
        return WordPieceTokenizer.from_folder(data)
    if cfg.model not in PRESETS and cfg.vocab is not None:
        raise BertkitError("--vocab applies to a new model from a preset; a model folder brings its own vocabulary")
    if cfg.model not in PRESETS:
        tok = WordPieceTokenizer.from_folder(cfg.model)
    elif cfg.vocab is not None:
        tok = WordPieceTokenizer.from_folder(cfg.vocab)
    else:
        # the pieces can differ between trainings where merges tie (tokenizer.py, _renumber);
        # --vocab makes a run repeat exactly
        log(f"training a WordPiece vocabulary of {cfg.vocab_size} on {cfg.corpus}")
        tok = WordPieceTokenizer.train((s for doc in training_documents(documents, cfg.holdout_every) for s in doc),
                                       cfg.vocab_size)
    data.mkdir(parents=True, exist_ok=True)
    tok.save(data)
    return tok


# the options that shape OUT/data (vocabulary and shards), recorded in it with the corpus files'
# sizes and times: prepared data is reused only for the same options and text
DATA_OPTIONS = ("corpus", "exclude_from", "doc_per_file", "sentence_per_line", "holdout_every", "model", "vocab", "vocab_size",
                "shard_tokens")


def data_record(cfg: PretrainConfig) -> dict:
    files = []
    for part in ([cfg.corpus] if Path(cfg.corpus).exists() else str(cfg.corpus).split("+")):
        if Path(part).exists():  # a file or folder (the built-in corpora are named, not listed)
            for f in corpus_files(Path(part)):
                st = f.stat()
                files.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return {**{k: getattr(cfg, k) for k in DATA_OPTIONS}, "corpus_files": files}


def forget_other_data(cfg: PretrainConfig, data: Path, log) -> None:
    """A new run in a folder whose run stopped before its first checkpoint reuses the data that
    run prepared only if the same options and text made it; else it is prepared again, so that
    the folder's pretrain_config.json always describes the data the model saw."""
    if not data.exists():
        return
    try:
        same = json.loads((data / "prepared.json").read_text(encoding="utf-8")) == data_record(cfg)
    except (OSError, ValueError):
        same = False
    if not same:
        log(f"{data} was prepared from other options or text: preparing it again")
        shutil.rmtree(data)


def prepare_data(cfg: PretrainConfig, tok: WordPieceTokenizer, data: Path, documents: Documents,
                  log) -> tuple[TokenStore, TokenStore]:
    shards = data / "shards"
    if (shards / "train" / "meta.json").is_file():
        train, held = TokenStore(shards / "train"), TokenStore(shards / "eval")
        if train.matches(tok):
            return train, held
    log(f"tokenizing {cfg.corpus} into {shards}")
    return tokenize_corpus(documents, tok, shards, cfg.holdout_every, cfg.shard_tokens)


def phase_batches(cfg: PretrainConfig, phase: int, store: TokenStore, tok: WordPieceTokenizer) -> PretrainingBatches:
    """Phase 0 (if the run has one): pairs of short_len tokens, batches as many times larger as
    keeps the tokens per batch; phase 1: max_len. Each phase has its own order from epoch 0."""
    max_len, batch_size = cfg.max_len, cfg.batch_size
    if phase == 0:
        max_len, batch_size = cfg.short_len, cfg.batch_size * max(1, round(cfg.max_len / cfg.short_len))
    masking = MaskingConfig(cfg.mask_prob, math.ceil(cfg.max_predictions * max_len / cfg.max_len), cfg.whole_word)
    if cfg.mask_token_share is not None or cfg.objective == "electra":
        # ELECTRA's generator reads [MASK] at every chosen position (the paper's), unless told otherwise
        share = 1.0 if cfg.mask_token_share is None else cfg.mask_token_share
        masking.mask_token_share, masking.random_token_share = share, (1 - share) / 2
    return PretrainingBatches(store, tok, max_len, batch_size, masking, cfg.seed if phase else cfg.seed + 2,
                              cfg.short_seq_prob)


def in_short_phase(cfg: PretrainConfig, step: int, done_s: float, total_s: float) -> bool:
    if not cfg.short_len:
        return False
    if cfg.steps:
        return step < round(cfg.short_share * cfg.steps)
    return done_s < cfg.short_share * total_s



def phase_of(state: dict) -> int:
    return state.get("phase", 1)  # checkpoints from before phases: one phase


def held_out_batches(cfg: PretrainConfig, store: TokenStore, tok: WordPieceTokenizer, log) -> list[dict]:
    """The evaluation's fixed batches: the same held-out pairs and the textbook's 15% masking
    whatever the recipe, in batches of 256 at most, --eval-pairs in all."""
    if store.meta["documents"] < 2 or cfg.eval_pairs <= 0:
        log("fewer than two held-out documents: no evaluation (lower --holdout-every or add documents)")
        return []
    masking = MaskingConfig(0.15, math.ceil(cfg.max_len * 0.15), cfg.whole_word)
    n_batches = math.ceil(cfg.eval_pairs / 256)
    return PretrainingBatches(store, tok, cfg.max_len, math.ceil(cfg.eval_pairs / n_batches), masking, cfg.seed + 1,
                              cfg.short_seq_prob, drop_last=False).fixed_batches(n_batches)
