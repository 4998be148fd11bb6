"""Pretraining's options: the recipes (every optimisation choice a user need not make) and
PretrainConfig, the options of one run, read from flags or a TOML file and checked."""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import PRESETS
from ..errors import BertkitError
from ..training.options import RunOptions, exact_names, flag, option
from .corpus import check_corpus_name, check_sentence_per_line

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


OBJECTIVES = ("mlm-nsp", "electra", "distill")
SENTENCE_LOSSES = ("cosine", "mse")
RTD_WEIGHT = 50.0  # ELECTRA's lambda (the paper's): a token's detection loss is far smaller than a masked token's MLM loss
SENTENCE_PER_LINE_HELP = ("each line of the .txt files is one sentence, used as it is instead of split into "
                          "sentences (the input of Google's create_pretraining_data.py: one sentence per line, "
                          "blank lines between documents)")


def recipe_lr(recipe: str, model: str) -> float:
    """The recipe's peak learning rate for a model (a preset or a folder). The fast recipe's rate
    was chosen on the tiny preset (128 wide); a wider model takes it x 128 / its width. At the
    tiny's 2e-3 the mini preset (256 wide, 4 post-LN layers) never left the unigram plateau in 607
    steps (4.1% top-1 at [MASK] held out, every input's vectors the same); at 1e-3 it left it by
    step 300 (docs/pretraining.md). The textbook recipe keeps the textbook's rate."""
    lr = RECIPES[recipe]["lr"]
    if recipe != "fast":
        return lr
    from ..config import load_config
    hidden = PRESETS[model]["hidden_size"] if model in PRESETS else load_config(model).hidden_size
    return lr * min(1.0, 128 / hidden)


@dataclass
class PretrainConfig(RunOptions):
    """A pretraining run's options: the shared ones of RunOptions (budget, lr, warmup, seed,
    checkpoints, precision: bf16 on a CPU with native bf16, the default recipe's step there 52
    against 82 ms in fp32), then these. lr: the recipe's from scratch (and from a run that began
    there), else 5e-5; save_every: 100."""
    corpus: str = option("wiki", "a .txt file, a folder of .txt files, wiki (default), python-docs or linux-docs "
                         "(Debian's documentation packages), wordnet (WordNet's glosses), gcide (a dictionary of "
                         "English), or a task's .jsonl/.csv/.tsv file (the texts of its rows: task-adaptive "
                         "pretraining); A+B adds B as training-only text", exact=True)
    exclude_from: str | None = option(None, "evaluation files, comma-separated (a task's dev and test files): a "
                                            "corpus that holds one of their texts is refused", exact=True)
    doc_per_file: bool = option(False, "each .txt file is one document (default: blank lines separate documents)",
                                exact=True)
    sentence_per_line: bool = option(False, SENTENCE_PER_LINE_HELP, exact=True)
    model: str = option("tiny", "preset (tiny, mini, small, base, large; default tiny) or a model folder")
    out: str | None = option(None, "output folder (default runs/pretrain-<time>)")
    recipe: str = option("fast", "fast (default: batch 64, 30%% masking, NSP weight 0.25, no dropout, the first 35%% "
                                 "of the run on pairs of 32 tokens; chosen by measurement) or textbook (batch 512, "
                                 "15%% masking, dropout 0.1); every option below overrides the recipe",
                         choices=tuple(RECIPES))
    objective: str = option("mlm-nsp", "mlm-nsp (default: BERT's masked LM + next sentence prediction), electra "
                                       "(replaced-token detection on the samples of a small generator; saves the "
                                       "encoder, and the generator in OUT/generator), or distill (learn from "
                                       "--teacher)", choices=OBJECTIVES, exact=True)
    # distillation (distill.py): the student learns the teacher's outputs on the corpus's texts
    teacher: str | None = option(None, "a model folder to distil into --model (a preset, with the teacher's "
                                       "vocabulary and its embeddings reduced by PCA, or a folder): the objective "
                                       "is then distill", exact=True)
    distill_sentence: float = option(1.0, "distill: weight of the teacher's sentence vector (default 1)", exact=True)
    distill_hidden: float = option(0.0, "distill: weight of the teacher's last-layer token states (default 0)",
                                   exact=True)
    distill_relations: float = option(0.0, "distill: weight of the last layer's self-attention relations, "
                                           "MiniLMv2's (default 0)", exact=True)
    distill_mlm: float = option(0.0, "distill: weight of masked language modelling beside it (default 0)",
                                exact=True)
    distill_logits: float = option(0.0, "distill: weight of the class probabilities of a teacher fine-tuned with "
                                        "`bertkit finetune classify`, through its classifier (default 0)", exact=True)
    distill_temperature: float = option(1.0, "distill: the temperature of --distill-logits (default 1)", exact=True)
    sentence_loss: str = option("cosine", "distill: cosine (default) or mse between the student's projected "
                                          "sentence vector and the teacher's", choices=SENTENCE_LOSSES, exact=True)
    relation_heads: int = option(12, "distill: relation heads of the attention relations (default 12)", exact=True)
    student_layers: int = option(0, "distill: a student of the teacher's shape with N of its layers, evenly "
                                    "spaced, as DistilBERT starts (in place of --model; default 0: --model)",
                                 exact=True)
    teacher_cache: bool = option(True, "distill: run the teacher on every text each epoch instead of keeping its "
                                       "sentence vectors in OUT/data/teacher", flag="--no-teacher-cache", const=False)
    rtd_weight: float = option(RTD_WEIGHT, "electra: loss = generator MLM + w x detection (default 50, the "
                                                   "paper's)", exact=True)
    mask_token_share: float | None = option(None, "of the chosen tokens, the share shown as [MASK] (default 0.8; "
                                                  "electra 1.0); half the rest become a random token, half stay as "
                                                  "they were", exact=True)
    generator_layers: int = option(0, "electra: the generator's layers (default: half the model's)", exact=True)
    steps: int | None = option(None, "optimizer steps instead of a budget")
    extend: bool = option(False, "with --resume: continue the run under a new --steps or --budget (its learning "
                                 "rate then follows the new schedule from where it is)")
    batch_size: int | None = option(None, "sentence pairs per step (recipe: 64, textbook 512)", exact=True)
    max_len: int | None = option(None, "tokens per pair (default 64)", exact=True)
    # a first phase on shorter pairs, as BERT trained 90% of its steps at 128 tokens before 512:
    # short pairs learn to use context sooner (the recipe study)
    short_len: int | None = option(None, "tokens per pair in a first phase, with as many tokens per batch (recipe: 32; "
                                         "0: one phase at --max-len)", exact=True)
    short_share: float | None = option(None, "share of the run in that first phase (recipe: 0.35)", exact=True)
    dropout: float | None = option(None, "dropout while pretraining (recipe: 0, textbook 0.1); the saved config "
                                         "keeps 0.1 for fine-tuning", exact=True)
    vocab: str | None = option(None, "folder with vocab.txt or tokenizer.json to use instead of training one")
    # 32,768, not 8,192: a small vocabulary cuts opinion words into pieces a small model must put
    # back together (docs/pretraining.md, "The vocabulary")
    vocab_size: int = option(32768, "WordPiece vocabulary to train (default 32768)")
    mask_prob: float | None = option(None, "share of tokens to predict (recipe: 0.3, textbook 0.15)", exact=True)
    max_predictions: int | None = option(None, "per sequence (default ceil(max_len x mask_prob))", exact=True)
    whole_word: bool = option(False, "mask all pieces of a word together", exact=True)
    short_seq_prob: float = option(0.1, exact=True)
    nsp_weight: float | None = option(None, "loss = mlm + w x nsp (recipe: 0.25, textbook 1.0)", exact=True)
    holdout_every: int = option(20, "hold out every N-th document (default 20)", exact=True)
    eval_every: int = option(100, "steps between evaluations (default 100)")
    # always masked at 15%: comparable across recipes
    eval_pairs: int = option(1024, "held-out sentence pairs per evaluation (default 1024)", exact=True)
    tensorboard: bool = option(False, "also write TensorBoard events to OUT/tensorboard")
    compile: bool = option(False, "torch.compile the model (pays on a GPU; falls back to eager if it cannot compile)")
    shard_tokens: int = 10_000_000   # tokens per memory-mapped shard

    RESUME_MAY_CHANGE = ("budget",)  # a resumed run may be given more (or less) time
    TOML_TABLE = "pretrain"

    @classmethod
    def from_command(cls, given: dict, config: str | None = None, command: dict | None = None) -> PretrainConfig:
        """A run's options from `bertkit pretrain`: the flags given, over a --config file, over the
        options a resumed run was started with (it keeps them; flags given now override them)."""
        if given.get("vocab_size") is not None and (given.get("vocab") or given.get("teacher")
                                                    or given.get("model", "tiny") not in PRESETS):
            raise BertkitError("--vocab-size is the size of a vocabulary trained on the corpus; --vocab, --teacher or a model "
                               "folder brings its own, which is used whole")
        saved = Path(given.get("out") or "") / "pretrain_config.json"
        if given.get("resume") and given.get("out") and saved.is_file():
            base = json.loads(saved.read_text())
            if given.get("vocab_size") is not None and given["vocab_size"] != base.get("vocab_size"):
                raise BertkitError(f"--vocab-size {given['vocab_size']}: the run in {given['out']} trained its "
                                   f"vocabulary with {base.get('vocab_size')}, which a resumed run keeps")
            # the run's length as given now: a saved --steps gives way to a --budget given, and the reverse
            dropped = {"progress", "extend",
                       *(("steps", "budget") if given.get("steps") or given.get("budget") else ())}
            given = {**{k: v for k, v in base.items() if k not in dropped}, **given}
        if config:
            return cls.from_toml(config, command, **given)
        return cls(**given)

    def __post_init__(self):
        from ..folders import pretraining_origin  # (torch: the CLI builds its parser from this module without it)
        from ..training.options import parse_duration
        self.check_types()
        if self.objective not in OBJECTIVES:
            raise BertkitError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        if self.recipe not in RECIPES:
            raise BertkitError(f"unknown recipe {self.recipe!r}; choose one of {', '.join(RECIPES)}")
        if self.model not in PRESETS and not Path(self.model).is_dir():
            raise BertkitError(f"model {self.model!r} is neither a preset ({', '.join(PRESETS)}) nor a model folder")
        check_corpus_name(self.corpus)
        for f in (self.exclude_from or "").split(","):
            if f.strip() and not Path(f.strip()).is_file():
                raise BertkitError(f"--exclude-from {f.strip()}: no such file")
        if self.sentence_per_line:
            check_sentence_per_line(self.corpus)
        recipe = RECIPES[self.recipe]
        if self.steps is not None and self.budget is not None:
            raise BertkitError("give --steps or --budget, not both")
        if self.extend and not self.resume:
            raise BertkitError("--extend continues a resumed run under a new length; give it with --resume")
        if self.steps is None:
            self.budget = parse_duration(self.budget if self.budget is not None else recipe["budget"])
        for name in ("batch_size", "max_len", "warmup", "mask_prob", "dropout", "nsp_weight"):
            if getattr(self, name) is None:
                setattr(self, name, recipe[name])
        self._check_distill()
        if self.short_len is None and self.objective == "distill":
            self.short_len = 0  # texts of every length from the start
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
                raise BertkitError(f"{flag(name)} must be at least 1, got {getattr(self, name)}")
        from ..tokenizer import check_vocab_size
        check_vocab_size(self.vocab_size)
        if self.generator_layers < 0:
            raise BertkitError(f"--generator-layers must be 0 (half the model's layers) or more, got {self.generator_layers}")
        if self.holdout_every < 0 or self.holdout_every == 1:  # Python's modulo would hold out every 4th for -4
            raise BertkitError(f"--holdout-every must be 0 (none held out) or at least 2 (1 holds out every document, "
                               f"leaving none to train on), got {self.holdout_every}")
        if self.short_len and not 5 <= self.short_len < self.max_len:
            raise BertkitError(f"--short-len must be 0 (one phase) or from 5 to below max_len {self.max_len}, "
                               f"got {self.short_len}")
        if self.mask_token_share is not None and not 0 <= self.mask_token_share <= 1:
            raise BertkitError(f"--mask-token-share must be in [0, 1], got {self.mask_token_share}")
        for name, low, high in (("dropout", 0, 1), ("short_seq_prob", 0, 1), ("short_share", 0, 1)):
            if not low <= getattr(self, name) < high:
                raise BertkitError(f"{flag(name)} must be in [{low}, {high}), got {getattr(self, name)}")
        for name in ("nsp_weight", "rtd_weight"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise BertkitError(f"{flag(name)} must be a number >= 0, got {getattr(self, name)}")
        if self.batch_size % self.grad_accum:
            raise BertkitError(f"--batch-size {self.batch_size} is not divisible by --grad-accum {self.grad_accum}")
        if self.max_len < 5:
            raise BertkitError(f"max length {self.max_len} is too small for [CLS] A [SEP] B [SEP] "
                               "(needs at least 5 tokens: 3 special tokens and one of each text)")
        if self.model in PRESETS and self.max_len > 512:
            raise BertkitError(f"max length {self.max_len} is over BERT's 512 positions")
        if self.out is None:
            self.out = time.strftime("runs/pretrain-%Y%m%d-%H%M%S")


    def _check_distill(self) -> None:
        if self.teacher is not None and self.objective == "mlm-nsp":
            self.objective = "distill"  # --teacher alone asks for it
        if self.objective == "distill":
            if self.teacher is None:
                raise BertkitError("--objective distill needs --teacher FOLDER, the model to learn from")
            if not Path(self.teacher).is_dir():
                raise BertkitError(f"--teacher {self.teacher}: not a model folder")
            if self.model in PRESETS and self.vocab is None:
                self.vocab = self.teacher  # the teacher's vocabulary: its embeddings start the student's
        elif self.teacher is not None:
            raise BertkitError(f"--teacher is for --objective distill, not {self.objective}")
        for name in ("distill_sentence", "distill_hidden", "distill_relations", "distill_mlm", "distill_logits"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise BertkitError(f"{flag(name)} must be a number >= 0, got {value!r}")
        if self.objective == "distill" and not (self.distill_sentence or self.distill_hidden or self.distill_relations
                                                or self.distill_mlm or self.distill_logits):
            raise BertkitError("every distillation weight is 0: give --distill-sentence, --distill-hidden, "
                               "--distill-relations, --distill-mlm or --distill-logits a weight above 0")
        t = self.distill_temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise BertkitError(f"--distill-temperature must be a number > 0, got {t!r}")
        if self.distill_logits and self.objective == "distill":
            from ..tasks.folder import fine_tuned_task
            task = fine_tuned_task(self.teacher)
            if task != "classify":
                raise BertkitError(f"--distill-logits: --teacher {self.teacher} is "
                                   + (f"fine-tuned for {task}" if task else "not fine-tuned")
                                   + "; the logits are a classifier's (`bertkit finetune classify`)")
        if self.student_layers < 0 or (self.student_layers and self.objective != "distill"):
            raise BertkitError(f"--student-layers is a number of the teacher's layers for --teacher, got "
                               f"{self.student_layers}")
        if self.relation_heads < 1:
            raise BertkitError(f"--relation-heads must be at least 1, got {self.relation_heads}")


PretrainConfig.EXACT = exact_names(PretrainConfig)  # what a resume must keep
