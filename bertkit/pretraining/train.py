"""The pretraining loop: MLM + NSP with AdamW, warmup and linear decay, resumable exactly.

A checkpoint holds the model (a normal model folder), the optimizer and scheduler, the RNG
state and the data position; the data order and masks are functions of (seed, epoch, batch),
so a resumed run repeats an uninterrupted one step for step.
"""
from __future__ import annotations

import dataclasses
import json
import math
import queue
import shutil
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from ..checkpoint import load_config, load_model, pretraining_origin, save_model
from ..config import PRESETS, BertConfig
from ..errors import BertkitError
from ..model import BertForPreTraining, init_weights, set_dropout
from ..optim import adamw
from ..outputs import check_output_folder
from ..tokenizer import WordPieceTokenizer
from ..training.checkpoints import has_checkpoint, latest_checkpoint, read_state, restore_rng
from ..precision import TRAINING_PRECISIONS, training_precision
from ..training.distributed import Processes, gradient_sync, init_processes, micro_batches
from ..training.log import MetricsLog, plot_losses, write_json
from ..training.loop import ROLL_BACK, Job, Loop, RunClock, StepResult, changed_options, seed_rank
from ..training.options import RunOptions
from ..training.step import parse_duration
from . import electra
from .batches import Position, PretrainingBatches
from .corpus import check_corpus_name, check_sentence_per_line
from .masking import MaskingConfig, prediction_kinds
from .shards import TokenStore, tokenize_corpus


MAX_BAD_STEPS = 5  # non-finite steps in a row before returning to the last checkpoint

# Recipes: everything about the optimisation that a user need not choose. Flags override any value.
RECIPES: dict[str, dict] = {
    # the default, chosen by benchmarks/pretrain_recipes.py for a 10-minute CPU budget (table and
    # curves in README.md): small steps, 30% masking, NSP weighted 0.25 and no dropout learn the
    # most per minute, and pairs of 32 tokens for the first 35% leave the unigram plateau sooner
    "fast": dict(budget="10m", batch_size=64, max_len=64, lr=2e-3, warmup=0.05, mask_prob=0.3,
                 dropout=0.0, nsp_weight=0.25, short_len=32, short_share=0.35),
    # the textbook's: batch 512, length 64, 15% masking, dropout 0.1 (Devlin et al. 2019; d2l)
    "textbook": dict(budget="10m", batch_size=512, max_len=64, lr=1e-3, warmup=0.1, mask_prob=0.15,
                     dropout=0.1, nsp_weight=1.0, short_len=0, short_share=0.0),
}


OBJECTIVES = ("mlm-nsp", "electra")


def recipe_lr(recipe: str, model: str) -> float:
    """The recipe's peak learning rate for a model (a preset or a folder). The fast recipe's rate
    was chosen on the tiny preset (128 wide); a wider model takes it x 128 / its width. At the
    tiny's 2e-3 the mini preset (256 wide, 4 post-LN layers) never left the unigram plateau in 607
    steps (4.1% top-1 at [MASK] held out, every input's vectors the same); at 1e-3 it left it by
    step 300 (docs/pretraining.md). The textbook recipe keeps the textbook's rate."""
    lr = RECIPES[recipe]["lr"]
    if recipe != "fast":
        return lr
    hidden = PRESETS[model]["hidden_size"] if model in PRESETS else load_config(model).hidden_size
    return lr * min(1.0, 128 / hidden)


@dataclass
class PretrainConfig(RunOptions):
    """A pretraining run's options: the shared ones of RunOptions (budget, lr, warmup, seed,
    checkpoints, precision: bf16 on a CPU with native bf16, the default recipe's step there 52
    against 82 ms in fp32), then these. lr: the recipe's from scratch (and from a run that began
    there), else 5e-5; save_every: 100."""
    corpus: str = "wiki"             # a .txt file, a folder of .txt files, "wiki" (built-in sample), "python-docs",
                                     # "linux-docs", "wordnet", "gcide"; "A+B": B is training-only text,
                                     # held-out documents come from A
    doc_per_file: bool = False       # each file is one document (default: blank lines separate documents)
    sentence_per_line: bool = False  # each line of the text files is one sentence, not split again
    model: str = "tiny"              # a preset name, or a model folder to continue pretraining
    out: str | None = None           # default: runs/pretrain-<time>
    recipe: str = "fast"             # fills every option left at None below (see RECIPES)
    objective: str = "mlm-nsp"       # BERT's masked LM + next sentence prediction, or "electra": replaced-token
                                     # detection by the model, on the samples of a small MLM generator (electra.py)
    rtd_weight: float = electra.RTD_WEIGHT  # electra: loss = generator mlm + rtd_weight x detection (the paper's 50)
    generator_layers: int = 0        # electra: the generator's layers (0: half the model's, at least one)
    mask_token_share: float | None = None  # of the chosen tokens, the share shown as [MASK]; half the rest become a
                                     # random token, half stay (None: BERT's 0.8; electra's 1.0, the paper's)
    steps: int | None = None         # optimizer steps instead of a budget
    batch_size: int | None = None    # sentence pairs per optimizer step
    max_len: int | None = None       # tokens per pair, specials included
    # a first phase on shorter pairs, as BERT trained 90% of its steps at 128 tokens before 512:
    # short pairs learn to use context sooner (the recipe study); 0: one phase at max_len
    short_len: int | None = None     # tokens per pair in the first phase, with as many tokens per batch
    short_share: float | None = None  # share of the run (budget or steps) in the first phase
    dropout: float | None = None     # while pretraining; the saved config keeps 0.1 for fine-tuning
    vocab: str | None = None         # folder with vocab.txt / tokenizer.json to use instead of training one
    # WordPiece vocabulary trained when neither the model nor --vocab brings one. 32,768, not 8,192:
    # a small vocabulary cuts opinion words into pieces a small model must put back together.
    # Logistic regression on the pieces' counts, rotten-tomatoes test: 8,192 0.760, 32,768 (26,986
    # pieces on wiki) 0.791, whole words 0.787. Tiny fine-tuned with the defaults, all 12,752
    # reviews in 5 folds (benchmarks/pretrain_value.py cv): random weights 0.740 and 0.752, an hour
    # of pretraining 0.748 and 0.758.
    vocab_size: int = 32768
    mask_prob: float | None = None   # share of tokens to predict
    max_predictions: int | None = None  # per sequence; default ceil(max_len x mask_prob)
    whole_word: bool = False
    short_seq_prob: float = 0.1
    nsp_weight: float | None = None  # loss = mlm + nsp_weight x nsp (1.0 in the paper)
    holdout_every: int = 20          # every 20th document held out for evaluation (0: none)
    eval_every: int = 100
    eval_pairs: int = 1024           # held-out pairs per evaluation, always masked at 15% (comparable across recipes)
    tensorboard: bool = False
    compile: bool = False            # torch.compile the model (pays on GPUs; measured no gain on a 2-core CPU)
    shard_tokens: int = 10_000_000   # tokens per memory-mapped shard

    # what must not change between a run and its resumption
    EXACT = ("objective", "rtd_weight", "generator_layers", "mask_token_share", "corpus", "doc_per_file", "sentence_per_line", "batch_size", "grad_accum", "max_len",
             "short_len", "short_share", "lr", "warmup", "weight_decay", "clip", "dropout", "mask_prob", "max_predictions",
             "whole_word", "short_seq_prob", "nsp_weight", "seed", "holdout_every", "eval_pairs", "precision")

    @classmethod
    def from_toml(cls, path: str | Path, command: dict | None = None, **overrides) -> "PretrainConfig":
        """The run's options from a TOML file (top level or a [pretrain] table); flags (overrides)
        win. command: the command's own options that the file may hold too (the CLI's no_samples),
        with their defaults; the file's values are written into it."""
        path = Path(path)
        command = {} if command is None else command
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BertkitError(f"{path}: no such file") from None
        except OSError as e:  # a folder, unreadable
            raise BertkitError(f"{path}: cannot read the file ({e.strerror or e})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise BertkitError(f"{path}: not valid TOML ({e})") from None
        raw = raw.get("pretrain", raw)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for key, value in raw.items():
            name = key.replace("-", "_")
            if name in command:
                if type(value) is not type(command[name]):
                    raise BertkitError(f"{path}: option {name} ({_flag(name)}): expected "
                                       f"{type(command[name]).__name__}, got {value!r}")
                command[name] = value
                continue
            if name not in fields:
                raise BertkitError(f"{path}: unknown key {key!r}; known keys: {', '.join([*fields, *command])}")
            values[name] = value
        try:
            return cls(**{**values, **{k: v for k, v in overrides.items() if v is not None}})
        except BertkitError as e:
            raise BertkitError(f"{path}: {e}") from None

    def __post_init__(self):
        self._check_types()
        if self.objective not in OBJECTIVES:
            raise BertkitError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if self.recipe not in RECIPES:
            raise BertkitError(f"unknown recipe {self.recipe!r}; choose one of {', '.join(RECIPES)}")
        if self.model not in PRESETS and not Path(self.model).is_dir():
            raise BertkitError(f"model {self.model!r} is neither a preset ({', '.join(PRESETS)}) nor a model folder")
        check_corpus_name(self.corpus)
        if self.sentence_per_line:
            check_sentence_per_line(self.corpus)
        recipe = RECIPES[self.recipe]
        if self.steps is not None and self.budget is not None:
            raise BertkitError("give --steps or --budget, not both")
        if self.steps is None:
            self.budget = parse_duration(self.budget if self.budget is not None else recipe["budget"])
        for name in ("batch_size", "max_len", "warmup", "mask_prob", "dropout", "nsp_weight"):
            if getattr(self, name) is None:
                setattr(self, name, recipe[name])
        if self.short_len is None:  # the recipe's, unless the pairs are that short already
            self.short_len = recipe["short_len"] if recipe["short_len"] < self.max_len else 0
        if self.short_share is None:
            self.short_share = recipe["short_share"] if self.short_len else 0.0
        if self.lr is None:  # a published checkpoint is continued gently; a run bertkit began from random weights,
            # with minutes of training behind it, at its recipe's rate
            self.lr = recipe_lr(self.recipe, self.model) if self.model in PRESETS or pretraining_origin(self.model) \
                else 5e-5
        if not 0 < self.mask_prob < 1:  # before max_predictions, which it sizes (0: "--max-predictions ... got 0")
            raise BertkitError(f"--mask-prob must be between 0 and 1, got {self.mask_prob}")
        if self.max_predictions is None:
            self.max_predictions = math.ceil(self.max_len * self.mask_prob)
        if self.save_every is None:
            self.save_every = 100
        self.check_run_options()
        for name in ("steps", "batch_size", "max_len", "eval_every", "vocab_size", "max_predictions", "eval_pairs",
                     "shard_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise BertkitError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}")
        if self.generator_layers < 0:
            raise BertkitError(f"--generator-layers must be 0 (half the model's layers) or more, got {self.generator_layers}")
        if self.holdout_every < 0 or self.holdout_every == 1:  # Python's modulo made -4 hold out every 4th document
            raise BertkitError(f"--holdout-every must be 0 (none held out) or at least 2 (1 holds out every document, "
                               f"leaving none to train on), got {self.holdout_every}")
        if self.short_len and not 5 <= self.short_len < self.max_len:
            raise BertkitError(f"--short-len must be 0 (one phase) or from 5 to below max_len {self.max_len}, "
                               f"got {self.short_len}")
        if self.mask_token_share is not None and not 0 <= self.mask_token_share <= 1:
            raise BertkitError(f"--mask-token-share must be in [0, 1], got {self.mask_token_share}")
        for name, low, high in (("dropout", 0, 1), ("short_seq_prob", 0, 1), ("short_share", 0, 1)):
            if not low <= getattr(self, name) < high:
                raise BertkitError(f"{_flag(name)} must be in [{low}, {high}), got {getattr(self, name)}")
        for name in ("nsp_weight", "rtd_weight"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise BertkitError(f"{_flag(name)} must be a number >= 0, got {getattr(self, name)}")
        if self.batch_size % self.grad_accum:
            raise BertkitError(f"--batch-size {self.batch_size} is not divisible by --grad-accum {self.grad_accum}")
        if self.max_len < 5:
            raise BertkitError(f"max length {self.max_len} is too small for [CLS] A [SEP] B [SEP] "
                               "(needs at least 5 tokens: 3 special tokens and one of each text)")
        if self.model in PRESETS and self.max_len > 512:
            raise BertkitError(f"max length {self.max_len} is over BERT's 512 positions")
        if self.out is None:
            self.out = time.strftime("runs/pretrain-%Y%m%d-%H%M%S")

    def _check_types(self) -> None:
        """A TOML or JSON value of the wrong type is an error naming the option, not a crash later."""
        kinds = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            allowed = tuple(t for name, ts in kinds.items() if name in str(f.type) for t in ts)
            # a TOML `steps = true` is no count (Python's bool is an int: it ran 1 step)
            if (isinstance(value, bool) and bool not in allowed) or (allowed and not isinstance(value, allowed)):
                raise BertkitError(f"option {f.name} ({_flag(f.name)}): expected {f.type.replace(' | None', '')}, got {value!r}")


def _flag(name: str) -> str:
    """An option's flag, as errors name it (a TOML config takes the same name, dashes or underscores)."""
    return "--" + name.replace("_", "-")


# ---- set-up ---------------------------------------------------------------------------------
class _Documents:
    """The corpus's documents for the two passes of a new run (the vocabulary, then the shards).
    Splitting text into sentences is most of the preparation time (the built-in sample on a 2-core
    Zen 4: 12.4 s of the 10-minute budget per pass in one process, 8.6 s in 2 workers), so the
    first pass keeps what it read for the second, up to KEEP_CHARS; a larger corpus is read again
    (constant memory)."""

    KEEP_CHARS = 200_000_000

    def __init__(self, cfg: PretrainConfig):
        self.cfg, self.kept, self.whole = cfg, [], False

    def _read(self):
        from .corpus import iter_documents
        return iter_documents(self.cfg.corpus, per_file=self.cfg.doc_per_file, per_line=self.cfg.sentence_per_line)

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


def _prepare_tokenizer(cfg: PretrainConfig, data: Path, documents: _Documents, log) -> WordPieceTokenizer:
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
        from .shards import training_documents
        tok = WordPieceTokenizer.train((s for doc in training_documents(documents, cfg.holdout_every) for s in doc),
                                       cfg.vocab_size)
    data.mkdir(parents=True, exist_ok=True)
    tok.save(data)
    return tok


# the options that shape OUT/data (vocabulary and shards), recorded in it with the corpus files'
# sizes and times: prepared data is reused only for the same options and text
DATA_OPTIONS = ("corpus", "doc_per_file", "sentence_per_line", "holdout_every", "model", "vocab", "vocab_size",
                "shard_tokens")


def _data_record(cfg: PretrainConfig) -> dict:
    from .corpus import _corpus_files
    files = []
    for part in ([cfg.corpus] if Path(cfg.corpus).exists() else str(cfg.corpus).split("+")):
        if Path(part).exists():  # a file or folder (the built-in corpora are named, not listed)
            for f in _corpus_files(Path(part)):
                st = f.stat()
                files.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return {**{k: getattr(cfg, k) for k in DATA_OPTIONS}, "corpus_files": files}


def _forget_other_data(cfg: PretrainConfig, data: Path, log) -> None:
    """A new run in a folder whose run stopped before its first checkpoint reuses the data that
    run prepared only if the same options and text made it; else it is prepared again (it was
    reused whatever the new --corpus, --vocab, --vocab-size or --model, and the folder's
    pretrain_config.json then described data the model never saw)."""
    if not data.exists():
        return
    try:
        same = json.loads((data / "prepared.json").read_text(encoding="utf-8")) == _data_record(cfg)
    except (OSError, ValueError):
        same = False
    if not same:
        log(f"{data} was prepared from other options or text: preparing it again")
        shutil.rmtree(data)


def _prepare_data(cfg: PretrainConfig, tok: WordPieceTokenizer, data: Path, documents: _Documents,
                  log) -> tuple[TokenStore, TokenStore]:
    shards = data / "shards"
    if (shards / "train" / "meta.json").is_file():
        train, held = TokenStore(shards / "train"), TokenStore(shards / "eval")
        if train.matches(tok):
            return train, held
    log(f"tokenizing {cfg.corpus} into {shards}")
    return tokenize_corpus(documents, tok, shards, cfg.holdout_every, cfg.shard_tokens)


def _check_model_folder(cfg: PretrainConfig) -> None:
    """What the run asks of a --model folder's config.json: two segment types for the sentence
    pairs (one only: an IndexError deep in torch at the first batch) and positions for --max-len."""
    model_cfg = load_config(cfg.model)
    if model_cfg.type_vocab_size < 2:
        raise BertkitError(f"{cfg.model}: config.json type_vocab_size is {model_cfg.type_vocab_size}, but "
                           "pretraining's sentence pairs need two segment types (next sentence prediction)")
    if cfg.max_len > model_cfg.max_position_embeddings:
        raise BertkitError(f"--max-len {cfg.max_len} exceeds the model's {model_cfg.max_position_embeddings} positions")


def _build_model(cfg: PretrainConfig, tok: WordPieceTokenizer) -> BertForPreTraining | electra.ElectraForPreTraining:
    if cfg.model in PRESETS:
        bert_cfg = BertConfig.preset(cfg.model, vocab_size=tok.vocab_size,
                                     max_position_embeddings=512)
        if cfg.objective == "electra":
            return electra.build(bert_cfg, rtd_weight=cfg.rtd_weight, generator_layers=cfg.generator_layers)
        model = BertForPreTraining(bert_cfg)
        init_weights(model, bert_cfg)
        return model
    model = (electra.build(None, cfg.model, cfg.rtd_weight, cfg.generator_layers) if cfg.objective == "electra"
             else load_model(cfg.model)[0])
    if model.config.vocab_size < tok.vocab_size:
        raise BertkitError(f"{cfg.model}: the model has {model.config.vocab_size} token embeddings but its "
                           f"tokenizer {tok.vocab_size} tokens")
    if cfg.max_len > model.config.max_position_embeddings:
        raise BertkitError(f"--max-len {cfg.max_len} exceeds the model's {model.config.max_position_embeddings} positions")
    return model


def _optimizer(model, cfg: PretrainConfig):
    return adamw(model, cfg.lr, cfg.weight_decay, eps=1e-6)  # BERT's epsilon


def _phase_batches(cfg: PretrainConfig, phase: int, store: TokenStore, tok: WordPieceTokenizer) -> PretrainingBatches:
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


def _in_short_phase(cfg: PretrainConfig, step: int, done_s: float, total_s: float) -> bool:
    if not cfg.short_len:
        return False
    if cfg.steps:
        return step < round(cfg.short_share * cfg.steps)
    return done_s < cfg.short_share * total_s


# ---- checkpoints ----------------------------------------------------------------------------
def _options(cfg: PretrainConfig) -> dict:
    return {k: getattr(cfg, k) for k in PretrainConfig.EXACT}


def _restore(ckpt: Path, model, opt, procs: Processes) -> dict:
    """Weights, optimizer and this rank's RNG (if the checkpoint has one) from a checkpoint;
    returns its trainer.json."""
    if isinstance(model, electra.ElectraForPreTraining):
        electra.restore(model, ckpt)
    else:
        resumed, _ = load_model(ckpt, quiet=True)
        model.load_state_dict(resumed.state_dict())
    state, tensors = read_state(ckpt)
    opt.load_state_dict(tensors["optimizer"])
    if procs.rank < len(tensors["torch_rng"]):
        restore_rng(tensors, procs.rank, procs.device)
    return state


def _check_resumable(ckpt: Path, cfg: PretrainConfig, model: BertForPreTraining) -> dict:
    state = json.loads((ckpt / "trainer.json").read_text())
    if not isinstance(state.get("options"), dict) or not all(hasattr(cfg, k) for k in state["options"]):
        # a fine-tuning run's --out, say: its checkpoints record other options (a KeyError before)
        raise BertkitError(f"{ckpt} is not a checkpoint of `bertkit pretrain`; choose another --out")
    saved = load_config(ckpt)
    if saved != model.config:
        diff = [f"{f.name} {getattr(saved, f.name)} in the checkpoint vs {getattr(model.config, f.name)} now"
                for f in dataclasses.fields(saved) if getattr(saved, f.name) != getattr(model.config, f.name)]
        raise BertkitError(f"{ckpt} was written by a different model configuration ({'; '.join(diff)}); "
                           "resume with the options of that run or choose another --out")
    changed = changed_options(state["options"], _options(cfg), "in the checkpoint")
    if changed:
        raise BertkitError(f"{ckpt}: cannot resume exactly with changed options ({'; '.join(changed)})")
    return state


# ---- evaluation -----------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, batches: list[dict], device, mask_id: int) -> dict:
    """Held-out MLM and NSP, in fp32 whatever the training steps' precision, as the saved model
    runs anywhere (bf16 read 0.1 points higher). Accuracy and top-5 are counted at [MASK]
    positions only; the random and unchanged positions are reported apart. The MLM loss is the
    training objective's, over every predicted position; eval_mlm_loss_mask is the loss at [MASK]
    positions alone, the one to set beside a baseline that cannot copy (unigram, uniform)."""
    was_training = model.training
    model.eval()
    c = dict(loss=0.0, n=0, mask_loss=0.0, mask_hit=0, mask_top5=0, mask_n=0, rand_hit=0, rand_n=0, same_hit=0,
             same_n=0, nsp_loss=0.0, nsp_hit=0, nsp_n=0, nsp_next=0)
    label_counts: dict[int, int] = {}
    for b in batches:
        b = {k: v.to(device) for k, v in b.items()}
        out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], mlm_positions=b["mlm_positions"])
        labels = b["mlm_labels"]
        valid = labels != -100
        logits = out.mlm_logits.float()
        losses = F.cross_entropy(logits[valid], labels[valid], reduction="none")  # (N,) per predicted position
        c["loss"] += losses.sum().item()
        c["n"] += int(valid.sum())
        top5 = logits.topk(5, dim=-1).indices                       # (B, P, 5)
        hit = top5[..., 0] == labels
        masked, random, unchanged = prediction_kinds(b["input_ids"], b["mlm_positions"], labels, mask_id)
        # the unchanged tenth can be copied (its loss falls fast): a 300-step run near the unigram
        # plateau read 6.75 over all positions, 7.12 at [MASK] alone
        c["mask_loss"] += losses[masked[valid]].sum().item()
        c["mask_hit"] += int((hit & masked).sum())
        c["mask_top5"] += int(((top5 == labels[..., None]).any(-1) & masked).sum())
        c["mask_n"] += int(masked.sum())
        c["rand_hit"] += int((hit & random).sum())
        c["rand_n"] += int(random.sum())
        c["same_hit"] += int((hit & unchanged).sum())
        c["same_n"] += int(unchanged.sum())
        c["nsp_loss"] += F.cross_entropy(out.nsp_logits.float(), b["nsp_labels"], reduction="sum").item()
        c["nsp_hit"] += int((out.nsp_logits.argmax(-1) == b["nsp_labels"]).sum())
        c["nsp_n"] += b["nsp_labels"].numel()
        c["nsp_next"] += int((b["nsp_labels"] == 0).sum())
        for t, k in zip(*torch.unique(labels[masked], return_counts=True)):
            label_counts[int(t)] = label_counts.get(int(t), 0) + int(k)
    model.train(was_training)
    share = lambda a, b: c[a] / max(1, c[b])
    return {"eval_mlm_loss": share("loss", "n"), "eval_mlm_loss_mask": share("mask_loss", "mask_n"),
            "eval_mlm_acc": share("mask_hit", "mask_n"), "eval_mlm_top5": share("mask_top5", "mask_n"),
            "eval_mlm_acc_random": share("rand_hit", "rand_n"),
            "eval_mlm_acc_unchanged": share("same_hit", "same_n"),
            "eval_nsp_loss": share("nsp_loss", "nsp_n"), "eval_nsp_acc": share("nsp_hit", "nsp_n"),
            "eval_predictions": c["n"], "eval_masked": c["mask_n"], "eval_pairs": c["nsp_n"],
            # accuracy of always guessing the most common hidden token at [MASK]: the bar to clear
            "eval_majority_token_acc": max(label_counts.values(), default=0) / max(1, c["mask_n"]),
            # NSP's bar: always the more common label. A chunk of one sentence is always NotNext (as in
            # BERT's create_pretraining_data), and short pairs are often one sentence: not 50/50
            "eval_nsp_majority_acc": max(c["nsp_next"], c["nsp_n"] - c["nsp_next"]) / max(1, c["nsp_n"])}


def _evaluate(model, batches: list[dict], device, mask_id: int, seed: int) -> dict:
    """The objective's held-out figures: BERT's MLM and NSP, or ELECTRA's generator MLM (its
    NSP head is never trained) and the discriminator's detection."""
    if not isinstance(model, electra.ElectraForPreTraining):
        return evaluate(model, batches, device, mask_id)
    figures = {k: v for k, v in evaluate(model.generator, batches, device, mask_id).items() if "nsp" not in k}
    return {**figures, **electra.evaluate_rtd(model, batches, device, seed)}


# ---- one optimizer step's gradients ---------------------------------------------------------
def accumulate_gradients(net, batch: dict, *, n_predictions: int, grad_accum: int, world: int,
                         nsp_weight: float, mask_id: int, autocast) -> torch.Tensor:
    """Forward and backward over this rank's rows of a global batch, in `grad_accum` micro-batches.

    The MLM loss is the sum over predicted tokens divided by `n_predictions`, the count in the
    whole global batch, so every token weighs the same whatever the split into micro-batches
    and ranks (DistributedDataParallel averages over ranks, hence the factor `world`). NSP is a
    mean over pairs, and every micro-batch holds as many pairs.
    Returns, summed over micro-batches and kept on the device: MLM loss and NSP loss (shares of
    the global figures), hits and counts at [MASK], random and unchanged positions, NSP hits."""
    stats = torch.zeros(9, dtype=torch.float64, device=batch["input_ids"].device)
    for mb, last in micro_batches(batch, grad_accum):
        with gradient_sync(net, world, last), autocast:
            o = net(mb["input_ids"], mb["token_type_ids"], mb["attention_mask"],
                    mlm_positions=mb["mlm_positions"], mlm_labels=mb["mlm_labels"],
                    nsp_labels=mb["nsp_labels"], mlm_denominator=n_predictions / world)
            (o.mlm_loss + nsp_weight * o.nsp_loss / grad_accum).backward()
        with torch.no_grad():
            hit = o.mlm_correct
            kinds = prediction_kinds(mb["input_ids"], mb["mlm_positions"], mb["mlm_labels"], mask_id)
            stats += torch.stack([
                o.mlm_loss.double() / world, o.nsp_loss.double() / grad_accum,
                *[x for k in kinds for x in ((hit & k).sum().double(), k.sum().double())],
                (o.nsp_logits.argmax(-1) == mb["nsp_labels"]).sum().double()])
    return stats


# ---- the loop -------------------------------------------------------------------------------
class _Prefetch:
    """Builds the next batches in a background thread, so a step never waits for masking and
    padding. The order is the iterator's own: resuming is unaffected."""

    def __init__(self, iterator, depth: int = 2):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._fill, args=(iterator,), daemon=True)
        self.thread.start()

    def _fill(self, iterator):
        try:
            for item in iterator:
                if not self._put((item, None)):
                    return
        except BaseException as e:  # re-raised in the training thread
            self._put((None, e))

    def _put(self, entry) -> bool:
        """Queue an entry unless closed first; a full queue is rechecked every 0.1 s."""
        while not self.done.is_set():
            try:
                self.queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def __next__(self):
        item, error = self.queue.get()
        if error is not None:
            raise error
        return item

    def close(self):
        # and wait for the thread: one still building a batch in torch while the interpreter
        # exits can abort the process ("terminate called without an active exception")
        self.done.set()
        self.thread.join(timeout=60)


def _phase_of(state: dict) -> int:
    return state.get("phase", 1)  # checkpoints from before phases: one phase


class _PretrainJob(Job):
    """MLM + NSP (or ELECTRA) on the prepared shards for the Loop: the batches (a first phase of
    short pairs, if the recipe has one), one step's gradients and counts, the held-out
    evaluation every --eval-every steps and at the end, and the checkpoint's files and position."""

    def __init__(self, cfg: PretrainConfig, model, opt, procs: Processes, tok: WordPieceTokenizer,
                 store: TokenStore, eval_batches: list[dict], metrics, log, state: dict | None, *, phase: int,
                 autocast):
        self.cfg, self.model, self.opt, self.procs, self.tok, self.store = cfg, model, opt, procs, tok, store
        self.eval_batches, self.metrics, self.log, self.phase = eval_batches, metrics, log, phase
        self.position = Position(state["epoch"], state["batch"]) if state else Position()
        self.pairs_seen = state.get("pairs_seen", state["step"] * cfg.batch_size) if state else 0
        self.is_electra = cfg.objective == "electra"
        # ELECTRA trains neither encoder's pooler nor the generator's NSP head: DDP must not wait for their gradients
        self.eager = procs.wrap(model, **({"find_unused_parameters": True} if self.is_electra else {}))
        self.net = torch.compile(self.eager) if cfg.compile else self.eager
        self.options = dict(grad_accum=cfg.grad_accum, world=procs.world, mask_id=tok.mask_id, autocast=autocast)
        # the second loss, its weight, and the counts after [MASK]'s, random's and unchanged's
        if self.is_electra:
            self.second, self.second_weight = "rtd", cfg.rtd_weight
            self.counts = ("rtd_hit", "rtd_n", "rtd_found", "rtd_replaced")
        else:
            self.second, self.second_weight = "nsp", cfg.nsp_weight
            self.counts = ("nsp_hit",)
            self.options["nsp_weight"] = cfg.nsp_weight
        self.counts = ("mask_hit", "mask_n", "rand_hit", "rand_n", "same_hit", "same_n", *self.counts)
        self.sums = ("loss", "mlm", self.second, *self.counts)
        self.last_eval = None
        self.data_iter = None
        self._open()

    def _open(self) -> None:
        """The batches of the phase, from the position (a phase switch, a roll-back)."""
        if self.data_iter is not None:
            self.data_iter.close()
        self.batches = _phase_batches(self.cfg, self.phase, self.store, self.tok)
        self.data_iter = _Prefetch(self.batches.iterate(self.position))

    def close(self) -> None:
        self.data_iter.close()

    def next_batch(self, loop: Loop) -> dict:
        cfg = self.cfg
        if self.phase == 0 and not _in_short_phase(cfg, loop.step, loop.now - loop.start_s,
                                                   loop.end - loop.start_s if cfg.budget else 0.0):
            loop.write_window()  # the short pairs' last steps: logged as theirs
            self.phase, self.position = 1, Position()  # on to full-length pairs (every rank at the same step)
            self._open()
            self.log(f"step {loop.step}: pairs of {cfg.max_len} tokens from now on")
        self.position, batch = next(self.data_iter)
        return batch

    def gradients(self, batch: dict) -> StepResult:
        rank, world = self.procs.rank, self.procs.world
        local = self.batches.batch_size // world  # this rank's rows of the batch
        options = dict(self.options, n_predictions=int((batch["mlm_labels"] != -100).sum()))  # the global batch's
        if self.is_electra:
            options["n_tokens"] = int(batch["attention_mask"].sum())
        batch = {k: v[rank * local:(rank + 1) * local].to(self.procs.device, non_blocking=True) for k, v in batch.items()}
        accumulate = electra.accumulate_gradients if self.is_electra else accumulate_gradients
        try:
            stats = accumulate(self.net, batch, **options)
        except Exception as e:  # compilation happens at the first call; its errors come from anywhere
            if self.net is self.eager:
                raise
            self.log(f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                     "continuing without it")
            self.net = self.eager
            self.opt.zero_grad(set_to_none=True)
            stats = accumulate(self.net, batch, **options)
        if world > 1:
            dist.all_reduce(stats)
            stats[1] /= world
        mlm, other, *counts = stats.tolist()  # the one read-back per step (other: NSP's or RTD's loss)
        self.pairs_seen += self.batches.batch_size
        return StepResult(mlm + other, {"loss": mlm + self.second_weight * other, "mlm": mlm, self.second: other,
                                        **dict(zip(self.counts, counts))}, self.batches.batch_size)

    def record(self, w: dict) -> dict:
        s, share = w["steps"], lambda hit, n: w[hit] / max(1, w[n])
        record = {"mlm_loss": w["mlm"] / s, f"{self.second}_loss": w[self.second] / s,
                  # accuracy at [MASK] positions (ELECTRA's generator's); random and unchanged positions apart
                  "mlm_acc": share("mask_hit", "mask_n"), "mlm_acc_random": share("rand_hit", "rand_n"),
                  "mlm_acc_unchanged": share("same_hit", "same_n")}
        if self.is_electra:  # the detection's right calls over all tokens, and the share of replaced ones found
            record.update(rtd_acc=share("rtd_hit", "rtd_n"), rtd_replaced_recall=share("rtd_found", "rtd_replaced"))
        else:
            record["nsp_acc"] = w["nsp_hit"] / w["examples"]
        return {**record, "phase": self.phase, "max_len": self.batches.max_len, "epoch": self.position.epoch}

    def postfix(self, record: dict) -> dict:
        return {"mlm": f"{record['mlm_loss']:.3f}", "acc": f"{record['mlm_acc']:.3f}",
                self.second: f"{record[f'{self.second}_loss']:.3f}", "pairs_s": f"{record['pairs_per_s']:.0f}"}

    def after_step(self, loop: Loop) -> None:
        if self.procs.main and self.eval_batches and (loop.step % self.cfg.eval_every == 0 or loop.last):
            with loop.timed("eval_s"):
                self.last_eval = {"step": loop.step, **_evaluate(self.model, self.eval_batches, self.procs.device,
                                                                 self.tok.mask_id, self.cfg.seed),
                                  "elapsed_s": loop.clock()}
                self.metrics.write(self.last_eval)

    def save(self, folder: Path) -> None:
        if self.is_electra:
            electra.save(self.model, folder, head=True)
        else:
            save_model(self.model, folder)

    def state(self) -> dict:
        return {"phase": self.phase, "epoch": self.position.epoch, "batch": self.position.batch,
                "pairs_seen": self.pairs_seen}

    def restore(self, ckpt: Path) -> dict:
        state = _restore(ckpt, self.model, self.opt, self.procs)
        self.phase, self.position = _phase_of(state), Position(state["epoch"], state["batch"])
        self.pairs_seen = state.get("pairs_seen", state["step"] * self.cfg.batch_size)
        self._open()
        return state


def pretrain(cfg: PretrainConfig, on_step=None, timer=time.perf_counter) -> dict | None:
    """Run (or resume) a pretraining run; returns the summary also written to OUT/summary.json
    (None on the other ranks of a torchrun job: rank 0 writes every file).
    on_step(step, model) is called after every optimizer step and its checkpoint; timer is the
    run's clock in seconds (tests drive a budget with their own).

    With a budget, the run's clock starts here (data preparation counts) and continues across
    resumes; warm-up and decay follow the elapsed share of the budget. Under torchrun each of
    the W processes takes 1/W of every batch (the same global batch a single process would see)
    and DistributedDataParallel averages the gradients."""
    clock = RunClock(timer)
    procs = init_processes()
    world, device, main = procs.world, procs.device, procs.main
    cfg.out = procs.broadcast(cfg.out)  # the default --out holds a time stamp: rank 0's for all
    if cfg.batch_size % (world * cfg.grad_accum):
        raise BertkitError(f"batch size {cfg.batch_size} is not divisible by {world} processes x "
                           f"{cfg.grad_accum} accumulation steps")
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise BertkitError(f"--out {out}: exists and is not a folder")
    from .corpus import documents_up_to_two
    found = None if cfg.resume else documents_up_to_two(cfg.corpus, cfg.doc_per_file)  # before any tokenizing
    if found == 0:
        raise BertkitError(f"{cfg.corpus}: the corpus is empty (no text)")
    if found == 1:
        hint = "give two or more files with text" if cfg.doc_per_file else "separate documents with a blank line"
        raise BertkitError(f"{cfg.corpus}: next sentence prediction needs at least two documents, found 1 ({hint})")
    if cfg.model not in PRESETS and not cfg.resume:  # a folder that cannot train fails before any tokenizing
        _check_model_folder(cfg)
    log = (lambda msg: tqdm.write(f"bertkit: {msg}", file=sys.stderr)) if cfg.progress and main else (lambda msg: None)
    ckpt = None
    # a pretraining run's folder, finished or not, or prepared data (vocabulary and shards) to reuse
    ours = (out / "pretrain_config.json").is_file() or (out / "data" / "shards").is_dir()
    if cfg.resume:
        ckpt = latest_checkpoint(out, log)
        if ckpt is None and (not ours or (out / "model.safetensors").exists()):
            raise BertkitError(f"{out}: no checkpoint to resume from (expected {out / 'checkpoints'}/step_*)")
        if ckpt is None:  # Ctrl-C during data preparation or the first steps: --resume goes on from the start
            log(f"{out}: the run stopped before its first checkpoint: starting it again from the beginning, "
                "reusing the vocabulary and shards it prepared where the same options made them")
    elif out.exists() and any(out.iterdir()):
        if not ours:
            raise BertkitError(f"{out} is not empty and holds no pretraining run; choose another --out "
                               "(nothing in it was changed)")
        if has_checkpoint(out) or (out / "model.safetensors").exists():
            raise BertkitError(f"{out} already holds a training run; pass --resume to continue it "
                               "or choose another --out")
        log(f"{out} holds a run that stopped before its first checkpoint or only prepared data: "
            "starting training from the beginning")
    if main:
        check_output_folder(out, overwrite=True)  # writable? (what it holds was checked above)
    procs.barrier()  # every rank has checked --out before rank 0 writes into it
    data = out / "data"
    if main:
        out.mkdir(parents=True, exist_ok=True)
        if ckpt is None:  # first: the folder is a run's from now on (a resume rewrites it once checked)
            write_json(out / "pretrain_config.json", dataclasses.asdict(cfg))
        if ckpt is None:  # a resumed run keeps the data its checkpoints were trained on
            _forget_other_data(cfg, data, log)
        documents = _Documents(cfg)
        tok = _prepare_tokenizer(cfg, data, documents, log)
        train_store, eval_store = _prepare_data(cfg, tok, data, documents, log)
        if ckpt is None:
            write_json(data / "prepared.json", _data_record(cfg))
    procs.barrier(long=True)  # the other ranks open what rank 0 prepared
    if not main:
        tok = WordPieceTokenizer.from_folder(data)
        train_store, eval_store = _prepare_data(cfg, tok, data, _Documents(cfg), log)
    if train_store.meta["documents"] < 2:
        raise BertkitError(f"{cfg.corpus}: next sentence prediction needs at least two documents for training, "
                           f"found {train_store.meta['documents']} (separate documents with a blank line)")
    phase = 0 if _in_short_phase(cfg, 0, 0.0, 1.0) else 1  # a short phase of no steps is none
    eval_batches = []
    if eval_store.meta["documents"] >= 2 and cfg.eval_pairs > 0:
        # the same held-out pairs and the textbook's 15% masking whatever the recipe, in batches of 256
        eval_masking = MaskingConfig(0.15, math.ceil(cfg.max_len * 0.15), cfg.whole_word)
        n_batches = math.ceil(cfg.eval_pairs / 256)  # batches of 256 at most, --eval-pairs in all (300 was 512)
        eval_batches = PretrainingBatches(eval_store, tok, cfg.max_len, math.ceil(cfg.eval_pairs / n_batches),
                                          eval_masking, cfg.seed + 1, cfg.short_seq_prob, drop_last=False
                                          ).fixed_batches(n_batches)
    else:
        log("fewer than two held-out documents: no evaluation (lower --holdout-every or add documents)")

    torch.manual_seed(cfg.seed)  # initial weights, new heads and dropout
    model = _build_model(cfg, tok)
    set_dropout(model, cfg.dropout)
    model.to(device)
    precision = training_precision(device, cfg.precision)
    if cfg.precision == "auto":
        log(f"training steps in {'bf16 autocast' if precision == 'bf16' else 'fp32'} on {device.type}; "
            "--precision to choose")
    opt = _optimizer(model, cfg)
    state = None
    if ckpt is not None:
        state = _check_resumable(ckpt, cfg, model)
        _restore(ckpt, model, opt, procs)
        log(f"resuming {out} at step {state['step']} (phase {state.get('phase', 1)}, epoch {state['epoch']}, "
            f"batch {state['batch']}" + (f", {state['elapsed_s']:.0f} s of the {cfg.budget:.0f} s budget spent)"
                                         if cfg.budget else ")"))
        # a longer (or shorter) run is allowed, but its learning rate schedule is no longer the one it ran on
        before = ("budget", state["budget"]) if state.get("budget") else ("steps", state.get("steps"))
        now_is = ("budget", cfg.budget) if cfg.budget else ("steps", cfg.steps)
        if "schedule_end" in state and before != now_is:
            log(f"the schedule changes on resumption: {before[0]} {before[1]:g} before, {now_is[0]} {now_is[1]:g} "
                "now; the learning rate follows the new one from here")
        clock.spent = state["elapsed_s"]
    seed_rank(procs, cfg.seed, state, log)
    metrics = MetricsLog(out, cfg.tensorboard, resume_step=state["step"] if state else None) if main else None
    if main and ckpt is not None:
        write_json(out / "pretrain_config.json", dataclasses.asdict(cfg))
    job = _PretrainJob(cfg, model, opt, procs, tok, train_store, eval_batches, metrics, log, state,
                       phase=_phase_of(state) if state else phase, autocast=procs.autocast(precision))
    loop = Loop(job, procs, out, lr=cfg.lr, warmup=cfg.warmup, clip=cfg.clip, steps=cfg.steps, budget=cfg.budget,
                clock=clock, save_every=cfg.save_every, keep_checkpoints=cfg.keep_checkpoints, log_every=cfg.log_every,
                options=_options(cfg), metrics=metrics, log=log, progress=cfg.progress,
                how_to_continue=f"continue with --resume --out {out}", non_finite=ROLL_BACK,
                max_bad_steps=MAX_BAD_STEPS, resumed=state, on_step=on_step)
    model.train()
    try:
        loop.run()
    finally:
        job.close()
    if not main:
        return None

    # pretrained_from: the preset whose random weights the run (or the run it continued) started
    # from, else the folder it started from; finetune's default lr reads it
    origin = cfg.model if cfg.model in PRESETS else pretraining_origin(cfg.model) or str(cfg.model)
    info = {"task": "pretraining", "objective": cfg.objective, "corpus": cfg.corpus, "steps": loop.step,
            "max_len": cfg.max_len, "pretrained_from": origin}
    if job.is_electra:
        electra.save(model, out, tokenizer=tok, bertkit_info=info)
    else:
        save_model(model, out, tokenizer=tok, bertkit_info=info)
    records = metrics.records()
    last_eval = job.last_eval
    if last_eval is None:  # resumed from the final checkpoint: its evaluation, not none
        last_eval = next((r for r in reversed(records) if "eval_mlm_loss" in r), None)
    train_records = [r for r in records if "loss" in r]
    curves = ([("mlm_loss", "generator MLM (train)"), ("rtd_loss", "detection (train)"),
               ("eval_mlm_loss", "generator MLM (held out)"), ("eval_rtd_loss", "detection (held out)")] if job.is_electra
              else [("mlm_loss", "MLM (train)"), ("nsp_loss", "NSP (train)"),
                    ("eval_mlm_loss", "MLM (held out)"), ("eval_nsp_loss", "NSP (held out)")])
    plot_losses(records, out / "loss.png", curves,
                f"{'ELECTRA' if job.is_electra else 'BERT'} pretraining: {model.config.num_hidden_layers} layers, hidden "
                f"{model.config.hidden_size}, batch {cfg.batch_size}, length {cfg.max_len}")
    timed = train_records[1:] or train_records  # the first window includes warm-up of kernels
    summary = {
        "steps": loop.step, "pairs_seen": job.pairs_seen,
        "epoch": job.position.epoch, "train_pairs_per_epoch": job.batches.count_pairs(0),
        "vocab_size": tok.vocab_size, "ln_vocab_size": math.log(tok.vocab_size),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {"train": train_store.meta, "eval": eval_store.meta},
        "final_train": train_records[-1] if train_records else None,
        "final_eval": last_eval,
        "pairs_per_s": sum(r["pairs_per_s"] for r in timed) / max(1, len(timed)),
        "skipped_steps": loop.guard.skipped,
        "budget_s": cfg.budget,
        "elapsed_s": clock(),
        "device": str(device), "precision": precision,  # what "auto" resolved to
        "config": dataclasses.asdict(cfg),
    }
    write_json(out / "summary.json", summary)
    metrics.close()
    return summary
