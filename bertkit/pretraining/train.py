"""The pretraining job: MLM + NSP (or ELECTRA) with AdamW, warm-up and linear decay, resumable
exactly, run by the run driver (training/run.py) around the one Loop.

A checkpoint holds the model (a normal model folder), the optimizer, the RNG state and the data
position; the data order and masks are functions of (seed, epoch, batch), so a resumed run
repeats an uninterrupted one step for step. Its options: recipes.py; its data: data.py; its
held-out figures: evaluation.py.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import PRESETS, BertConfig, load_config
from ..errors import BertkitError
from ..folders import keep_sentence_transformers, load_model, pretraining_origin, save_model
from ..model import BertForPreTraining, init_weights, set_dropout
from ..optim import adamw
from ..outputs import check_output_folder
from ..precision import training_precision
from ..tokenizer import WordPieceTokenizer
from ..training.checkpoints import has_checkpoint, latest_checkpoint
from ..training.distributed import Processes, accumulate
from ..training.log import write_json
from ..training.loop import ROLL_BACK, Job, Loop, StepResult
from ..training.prefetch import Prefetch
from ..training.run import Run, refuse_changed, restore_state
from . import distill, distill_job, electra
from .batches import Position
from .data import (
    Documents,
    data_record,
    forget_other_data,
    held_out_batches,
    in_short_phase,
    phase_batches,
    phase_of,
    prepare_data,
    prepare_tokenizer,
)
from .evaluation import evaluate_objective
from .masking import prediction_kinds
from .recipes import PretrainConfig
from .shards import TokenStore


# ---- the model ------------------------------------------------------------------------------
def _check_model_folder(cfg: PretrainConfig) -> None:
    """What the run asks of a --model folder's config.json: two segment types for the sentence
    pairs (one only: an IndexError deep in torch at the first batch) and positions for --max-len."""
    model_cfg = load_config(cfg.model)
    if model_cfg.type_vocab_size < 2:
        raise BertkitError(f"{cfg.model}: config.json type_vocab_size is {model_cfg.type_vocab_size}, but "
                           "pretraining's sentence pairs need two segment types (next sentence prediction)")
    if cfg.max_len > model_cfg.max_position_embeddings:
        raise BertkitError(f"--max-len {cfg.max_len} exceeds the model's {model_cfg.max_position_embeddings} positions")


def build_model(cfg: PretrainConfig, tok: WordPieceTokenizer):
    """The model a run trains: BERT with its MLM and NSP heads, ELECTRA's pair, or a distillation
    student with its projections to the teacher's width."""
    if cfg.objective == "distill":
        return _build_student(cfg, tok)
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


def _build_student(cfg: PretrainConfig, tok: WordPieceTokenizer) -> distill.Student:
    teacher = distill.Teacher(cfg.teacher, "cpu")
    if cfg.student_layers:
        model = distill.teacher_layers(load_model(cfg.teacher)[0], cfg.student_layers)
    elif cfg.model in PRESETS:
        bert_cfg = BertConfig.preset(cfg.model, vocab_size=tok.vocab_size, max_position_embeddings=512)
        model = distill.build_student(bert_cfg, teacher)
    else:
        model = load_model(cfg.model)[0]
    if tok.tok.get_vocab() != WordPieceTokenizer.from_folder(cfg.teacher).tok.get_vocab():
        raise BertkitError(f"{cfg.model}: the student's vocabulary is not the teacher's ({cfg.teacher}); "
                           "distil into a preset, which takes the teacher's")
    if cfg.distill_relations:
        distill.check_relation_heads(cfg.relation_heads, model.config.hidden_size, teacher.config.hidden_size)
    return distill.Student(model, teacher.config.hidden_size)


def build_optimizer(model, cfg: PretrainConfig):
    return adamw(model, cfg.lr, cfg.weight_decay, eps=1e-6)  # BERT's epsilon


# ---- checkpoints ----------------------------------------------------------------------------
def _load_weights(model, ckpt: Path) -> None:
    if isinstance(model, distill.Student):
        distill_job.load_weights(model, ckpt)
    elif isinstance(model, electra.ElectraForPreTraining):
        electra.restore(model, ckpt)
    else:
        resumed, _ = load_model(ckpt, quiet=True)
        model.load_state_dict(resumed.state_dict())


def check_resumable(ckpt: Path, cfg: PretrainConfig, model: BertForPreTraining) -> dict:
    """A checkpoint's trainer.json, if this run can continue it exactly: written by pretraining,
    by the same model configuration and options."""
    state = json.loads((ckpt / "trainer.json").read_text())
    options = state.get("options")
    if not isinstance(options, dict) or "corpus" not in options:
        # a fine-tuning run's --out, say: its checkpoints record other options
        raise BertkitError(f"{ckpt} is not a checkpoint of `bertkit pretrain`; choose another --out")
    unknown = [k for k in options if not hasattr(cfg, k)]
    if unknown:  # written by a newer bertkit
        raise BertkitError(f"{ckpt} records option(s) this bertkit ({_version()}) does not know: "
                           f"{', '.join(unknown)}; resume it with the version that wrote it")
    saved = load_config(ckpt)
    if saved != model.config:
        diff = [f"{f.name} {getattr(saved, f.name)} in the checkpoint vs {getattr(model.config, f.name)} now"
                for f in dataclasses.fields(saved) if getattr(saved, f.name) != getattr(model.config, f.name)]
        raise BertkitError(f"{ckpt} was written by a different model configuration ({'; '.join(diff)}); "
                           "resume with the options of that run or choose another --out")
    refuse_changed(state["options"], cfg, "in the checkpoint", ckpt)
    check_length(state, cfg, ckpt)
    return state


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("bertkit")
    except PackageNotFoundError:  # run from a source tree
        return "from source"


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
    def forward(mb):
        o = net(mb["input_ids"], mb["token_type_ids"], mb["attention_mask"],
                mlm_positions=mb["mlm_positions"], mlm_labels=mb["mlm_labels"],
                nsp_labels=mb["nsp_labels"], mlm_denominator=n_predictions / world)
        return o.mlm_loss + nsp_weight * o.nsp_loss / grad_accum, o

    def count(mb, o):
        kinds = prediction_kinds(mb["input_ids"], mb["mlm_positions"], mb["mlm_labels"], mask_id)
        return torch.stack([
            o.mlm_loss.double() / world, o.nsp_loss.double() / grad_accum,
            *[x for k in kinds for x in ((o.mlm_correct & k).sum().double(), k.sum().double())],
            (o.nsp_logits.argmax(-1) == mb["nsp_labels"]).sum().double()])
    return accumulate(net, batch, grad_accum, world, autocast, forward, count)


# ---- the job --------------------------------------------------------------------------------
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
        self.batches = phase_batches(self.cfg, self.phase, self.store, self.tok)
        self.data_iter = Prefetch(self.batches.iterate(self.position))

    def close(self) -> None:
        self.data_iter.close()

    def next_batch(self, loop: Loop) -> dict:
        cfg = self.cfg
        if self.phase == 0 and not in_short_phase(cfg, loop.step, loop.now - loop.start_s,
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
                self.last_eval = {"step": loop.step, **evaluate_objective(self.model, self.eval_batches, self.procs.device,
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
        _load_weights(self.model, ckpt)
        state = restore_state(ckpt, self.opt, self.procs)
        self.phase, self.position = phase_of(state), Position(state["epoch"], state["batch"])
        self.pairs_seen = state.get("pairs_seen", state["step"] * self.cfg.batch_size)
        self._open()
        return state

    # ---- the run's end ----
    @property
    def title(self) -> str:
        return f"{'ELECTRA' if self.is_electra else 'BERT'} pretraining"

    def curves(self) -> list[tuple[str, str]]:
        if self.is_electra:
            return [("mlm_loss", "generator MLM (train)"), ("rtd_loss", "detection (train)"),
                    ("eval_mlm_loss", "generator MLM (held out)"), ("eval_rtd_loss", "detection (held out)")]
        return [("mlm_loss", "MLM (train)"), ("nsp_loss", "NSP (train)"),
                ("eval_mlm_loss", "MLM (held out)"), ("eval_nsp_loss", "NSP (held out)")]

    def save_final(self, out: Path, tok: WordPieceTokenizer, info: dict) -> None:
        if self.is_electra:
            electra.save(self.model, out, tokenizer=tok, bertkit_info=info)
        else:
            save_model(self.model, out, tokenizer=tok, bertkit_info=info)
            if self.cfg.model not in PRESETS:  # continued from a sentence-transformers folder: pooled as it was
                keep_sentence_transformers(self.cfg.model, out)


# ---- the run --------------------------------------------------------------------------------
def _open_out(cfg: PretrainConfig, run: Run) -> Path | None:
    """The checkpoint a --resume continues (None: a new run, or one that stopped before its first
    checkpoint); refuses an --out that holds anything but this run's own files."""
    out, log = run.out, run.log
    if out.exists() and not out.is_dir():
        raise BertkitError(f"--out {out}: exists and is not a folder")
    from .corpus import documents_up_to_two
    found = None if cfg.resume else documents_up_to_two(cfg.corpus, cfg.doc_per_file)  # before any tokenizing
    if found == 0:
        raise BertkitError(f"{cfg.corpus}: the corpus is empty (no text)")
    if found == 1 and cfg.objective != "distill":  # distillation reads single texts: one document will do
        hint = "give two or more files with text" if cfg.doc_per_file else "separate documents with a blank line"
        why = ("the sentence pairs need at least two documents, even with --nsp-weight 0 (half of them pair "
               "text from two)" if cfg.nsp_weight == 0 else "next sentence prediction needs at least two documents")
        raise BertkitError(f"{cfg.corpus}: {why}, found 1 ({hint})")
    if cfg.model not in PRESETS and not cfg.resume:  # a folder that cannot train fails before any tokenizing
        _check_model_folder(cfg)
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
    if run.procs.main:
        check_output_folder(out, overwrite=True)  # writable? (what it holds was checked above)
    run.procs.barrier()  # every rank has checked --out before rank 0 writes into it
    return ckpt


def _prepare(cfg: PretrainConfig, run: Run, ckpt: Path | None) -> tuple[WordPieceTokenizer, TokenStore, TokenStore]:
    """The vocabulary and the token shards in OUT/data: rank 0 prepares them (or finds them
    prepared by the same options and text), the other ranks open them."""
    out, log, procs = run.out, run.log, run.procs
    data = out / "data"
    if procs.main:
        out.mkdir(parents=True, exist_ok=True)
        if ckpt is None:  # first: the folder is a run's from now on (a resume rewrites it once checked)
            write_json(out / "pretrain_config.json", dataclasses.asdict(cfg))
            forget_other_data(cfg, data, log)  # a resumed run keeps the data its checkpoints were trained on
        documents = Documents(cfg)
        tok = prepare_tokenizer(cfg, data, documents, log)
        train_store, eval_store = prepare_data(cfg, tok, data, documents, log)
        if documents.removed is not None:
            log(f"--exclude-from: took {documents.removed.count} evaluation text(s) out of the corpus"
                + (f", e.g. {'; '.join(documents.removed.examples)}" if documents.removed.count else ""))
        if ckpt is None:
            write_json(data / "prepared.json", data_record(cfg))
        elif _prepared_from_other_text(cfg, data):
            log(f"{cfg.corpus} changed since {data} was prepared: the run continues on the data prepared then "
                "(a new --out prepares it anew)")
    procs.barrier(long=True)  # the other ranks open what rank 0 prepared
    if not procs.main:
        tok = WordPieceTokenizer.from_folder(data)
        train_store, eval_store = prepare_data(cfg, tok, data, Documents(cfg), log)
    if train_store.meta["documents"] < (1 if cfg.objective == "distill" else 2):
        raise BertkitError(f"{cfg.corpus}: next sentence prediction needs at least two documents for training, "
                           f"found {train_store.meta['documents']} (separate documents with a blank line)")
    return tok, train_store, eval_store


def _prepared_from_other_text(cfg: PretrainConfig, data: Path) -> bool:
    """Whether the corpus files' sizes or times differ from those recorded when the data was prepared."""
    try:
        before = json.loads((data / "prepared.json").read_text(encoding="utf-8")).get("corpus_files")
    except (OSError, ValueError, AttributeError):
        return False
    return before is not None and before != data_record(cfg)["corpus_files"]


def _resume(cfg: PretrainConfig, run: Run, ckpt: Path, model, opt) -> dict:
    state = check_resumable(ckpt, cfg, model)
    _load_weights(model, ckpt)
    run.resume(ckpt, opt)
    run.log(f"resuming {run.out} at step {state['step']} (phase {state.get('phase', 1)}, epoch {state['epoch']}, "
            f"batch {state['batch']}" + (f", {state['elapsed_s']:.0f} s of the {cfg.budget:.0f} s budget spent)"
                                         if cfg.budget else ")"))
    if "schedule_end" in state and _length(state) != _length(cfg):
        run.log(f"the schedule changes on resumption: {_length(state)} before, {_length(cfg)} now; the learning "
                "rate follows the new one from here")
    return state


def _length(run) -> str:
    """A run's length as its flag: '--steps 40' or '--budget 600s' (a trainer.json or a config)."""
    get = run.get if isinstance(run, dict) else lambda k: getattr(run, k)
    return f"--budget {get('budget'):g}s" if get("budget") else f"--steps {get('steps')}"


def check_length(state: dict, cfg: PretrainConfig, ckpt: Path) -> None:
    """A resumed run keeps its length (the learning rate schedule and the phase switch follow it)
    unless --extend says that a new one is meant."""
    if "schedule_end" in state and _length(state) != _length(cfg) and not cfg.extend:
        raise BertkitError(f"{_length(cfg)}: the run in {ckpt.parent.parent} was begun with {_length(state)}, and a "
                           "resumed run keeps its schedule; give --extend as well to continue it under the new "
                           "length, or leave the length out")


def pretrain(cfg: PretrainConfig, on_step=None, timer=time.perf_counter) -> dict | None:
    """Run (or resume) a pretraining run; returns the summary also written to OUT/summary.json
    (None on the other ranks of a torchrun job: rank 0 writes every file).
    on_step(step, model) is called after every optimizer step and its checkpoint; timer is the
    run's clock in seconds (tests drive a budget with their own).

    With a budget, the run's clock starts here (data preparation counts) and continues across
    resumes; warm-up and decay follow the elapsed share of the budget. Under torchrun each of
    the W processes takes 1/W of every batch (the same global batch a single process would see)
    and DistributedDataParallel averages the gradients."""
    run = Run(cfg, timer)
    procs, log = run.procs, run.log
    cfg.out = procs.broadcast(cfg.out)  # the default --out holds a time stamp: rank 0's for all
    if cfg.batch_size % (procs.world * cfg.grad_accum):
        raise BertkitError(f"batch size {cfg.batch_size} is not divisible by {procs.world} processes x "
                           f"{cfg.grad_accum} accumulation steps")
    ckpt = _open_out(cfg, run)
    tok, train_store, eval_store = _prepare(cfg, run, ckpt)
    phase = 0 if in_short_phase(cfg, 0, 0.0, 1.0) else 1  # a short phase of no steps is none
    eval_batches = (distill_job.held_out_texts if cfg.objective == "distill" else held_out_batches)(
        cfg, eval_store, tok, log)

    torch.manual_seed(cfg.seed)  # initial weights, new heads and dropout
    model = build_model(cfg, tok)
    set_dropout(model, cfg.dropout)
    model.to(procs.device)
    precision = training_precision(procs.device, cfg.precision)
    if cfg.precision == "auto":
        log(f"training steps in {'bf16 autocast' if precision == 'bf16' else 'fp32'} on {procs.device.type}; "
            "--precision to choose")
    opt = build_optimizer(model, cfg)
    state = _resume(cfg, run, ckpt, model, opt) if ckpt is not None else None
    metrics = run.start(cfg.tensorboard)
    if procs.main and ckpt is not None:
        write_json(run.out / "pretrain_config.json", dataclasses.asdict(cfg))
    job_class = distill_job.DistillJob if cfg.objective == "distill" else _PretrainJob
    job = job_class(cfg, model, opt, procs, tok, train_store, eval_batches, metrics, log, state,
                       phase=phase_of(state) if state else phase, autocast=procs.autocast(precision))
    loop = run.loop(job, steps=cfg.steps, warmup=cfg.warmup, how_to_continue=f"continue with --resume --out {run.out}",
                    non_finite=ROLL_BACK, on_step=on_step)
    model.train()
    try:
        loop.run()
    finally:
        job.close()
    if not procs.main:
        return None
    return _finish(cfg, run, job, loop, tok, (train_store, eval_store), precision)


def _finish(cfg: PretrainConfig, run: Run, job, loop: Loop, tok: WordPieceTokenizer,
            stores: tuple[TokenStore, TokenStore], precision: str) -> dict:
    """The run's model folder in OUT, its curves and summary.json."""
    model = job.model
    # pretrained_from: the preset whose random weights the run (or the run it continued) started
    # from, else the folder it started from; finetune's default lr reads it
    origin = cfg.model if cfg.model in PRESETS else pretraining_origin(cfg.model) or str(cfg.model)
    info = {"task": "pretraining", "objective": cfg.objective, "corpus": cfg.corpus, "steps": loop.step,
            "max_len": cfg.max_len, "pretrained_from": origin}
    job.save_final(run.out, tok, info)
    records = run.metrics.records()
    last_eval = job.last_eval
    if last_eval is None:  # resumed from the final checkpoint: its evaluation, not none
        last_eval = next((r for r in reversed(records) if any(k.startswith("eval_") for k in r)), None)
    train_records = [r for r in records if "loss" in r]
    timed = train_records[1:] or train_records  # the first window includes warm-up of kernels
    summary = {
        "steps": loop.step, "pairs_seen": job.pairs_seen,
        "epoch": job.position.epoch, "train_pairs_per_epoch": job.batches.count_pairs(0),
        "vocab_size": tok.vocab_size, "ln_vocab_size": math.log(tok.vocab_size),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {"train": stores[0].meta, "eval": stores[1].meta},
        "final_train": train_records[-1] if train_records else None,
        "final_eval": last_eval,
        "pairs_per_s": sum(r["pairs_per_s"] for r in timed) / max(1, len(timed)),
        "skipped_steps": loop.guard.skipped,
        "budget_s": cfg.budget,
        "elapsed_s": run.clock(),
        "device": str(run.procs.device), "precision": precision,  # what "auto" resolved to
        "config": dataclasses.asdict(cfg),
    }
    title = (f"{job.title}: {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
             f"batch {cfg.batch_size}, length {cfg.max_len}")
    return run.finish(summary, job.curves(), title)
