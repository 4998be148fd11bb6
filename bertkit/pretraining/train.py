"""The pretraining loop: MLM + NSP with AdamW, warmup and linear decay, resumable exactly.

A checkpoint holds the model (a normal model folder), the optimizer and scheduler, the RNG
state and the data position; the data order and masks are functions of (seed, epoch, batch),
so a resumed run repeats an uninterrupted one step for step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from ..checkpoint import load_config, load_model, save_model
from ..config import PRESETS, BertConfig
from ..errors import BertkitError
from ..model import BertForPreTraining, init_weights
from ..optim import adamw, warmup_linear
from ..tokenizer import WordPieceTokenizer
from ..training_log import MetricsLog, plot_losses, write_json
from .batches import Position, PretrainingBatches
from .masking import MaskingConfig
from .shards import TokenStore, tokenize_corpus


@dataclass
class PretrainConfig:
    corpus: str = "wiki"             # a .txt file, a folder of .txt files, or "wiki" (built-in sample)
    doc_per_file: bool = False       # each file is one document (default: blank lines separate documents)
    model: str = "tiny"              # a preset name, or a model folder to continue pretraining
    out: str | None = None           # default: runs/pretrain-<time>
    steps: int = 450                 # optimizer steps; ~10 min for tiny at 512 x 64 on 2 CPU cores
    batch_size: int = 512            # sentence pairs per optimizer step (the textbook's 512)
    grad_accum: int = 1              # micro-batches per step: batch_size / grad_accum each
    max_len: int = 64                # tokens per pair, specials included (the textbook's 64)
    lr: float | None = None          # default 1e-3 from scratch, 5e-5 from a pretrained folder
    warmup: float = 0.1              # share of steps spent warming up, then linear decay to 0
    weight_decay: float = 0.01       # not on biases and LayerNorm, as in BERT
    clip: float = 1.0                # gradient norm clipping
    vocab: str | None = None         # folder with vocab.txt / tokenizer.json to use instead of training one
    vocab_size: int = 8192           # WordPiece vocabulary trained when neither the model nor --vocab brings one
    mask_prob: float = 0.15
    max_predictions: int | None = None  # per sequence; default ceil(max_len x mask_prob)
    whole_word: bool = False
    short_seq_prob: float = 0.1
    nsp_weight: float = 1.0          # loss = mlm + nsp_weight x nsp (1.0 in the paper)
    holdout_every: int = 20          # every 20th document held out for evaluation (0: none)
    eval_every: int = 100
    eval_batches: int = 4
    save_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0
    resume: bool = False
    tensorboard: bool = False
    shard_tokens: int = 10_000_000   # tokens per memory-mapped shard
    progress: bool = True

    # what must not change between a run and its resumption
    EXACT = ("corpus", "doc_per_file", "batch_size", "grad_accum", "max_len", "lr", "warmup", "weight_decay", "clip", "mask_prob",
             "max_predictions", "whole_word", "short_seq_prob", "nsp_weight", "seed", "holdout_every")

    @classmethod
    def from_toml(cls, path: str | Path, **overrides) -> "PretrainConfig":
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BertkitError(f"{path}: no such file") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise BertkitError(f"{path}: not valid TOML ({e})") from None
        raw = raw.get("pretrain", raw)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for key, value in raw.items():
            name = key.replace("-", "_")
            if name not in fields:
                raise BertkitError(f"{path}: unknown key {key!r}; known keys: {', '.join(fields)}")
            values[name] = value
        return cls(**{**values, **{k: v for k, v in overrides.items() if v is not None}})

    def __post_init__(self):
        if self.model not in PRESETS and not Path(self.model).is_dir():
            raise BertkitError(f"model {self.model!r} is neither a preset ({', '.join(PRESETS)}) nor a model folder")
        if self.lr is None:
            self.lr = 1e-3 if self.model in PRESETS else 5e-5
        if self.max_predictions is None:
            self.max_predictions = math.ceil(self.max_len * self.mask_prob)
        for name in ("steps", "batch_size", "grad_accum", "max_len", "log_every", "vocab_size", "max_predictions"):
            if getattr(self, name) < 1:
                raise BertkitError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.batch_size % self.grad_accum:
            raise BertkitError(f"batch size {self.batch_size} is not divisible by grad_accum {self.grad_accum}")
        if not 0 < self.mask_prob < 1:
            raise BertkitError(f"mask_prob must be between 0 and 1, got {self.mask_prob}")
        if self.max_len < 5:
            raise BertkitError(f"max length {self.max_len} is too small for [CLS] A [SEP] B [SEP] "
                               "(needs at least 5 tokens: 3 special tokens and one of each text)")
        if self.out is None:
            self.out = time.strftime("runs/pretrain-%Y%m%d-%H%M%S")


# ---- set-up ---------------------------------------------------------------------------------
def _documents(cfg: PretrainConfig):
    from .corpus import iter_documents
    return iter_documents(cfg.corpus, per_file=cfg.doc_per_file)


def _prepare_tokenizer(cfg: PretrainConfig, data: Path, log) -> WordPieceTokenizer:
    if (data / "tokenizer.json").is_file():   # a resumed run keeps its vocabulary
        return WordPieceTokenizer.from_folder(data)
    if cfg.model not in PRESETS and cfg.vocab is not None:
        raise BertkitError("--vocab applies to a new model from a preset; a model folder brings its own vocabulary")
    if cfg.model not in PRESETS:
        tok = WordPieceTokenizer.from_folder(cfg.model)
    elif cfg.vocab is not None:
        tok = WordPieceTokenizer.from_folder(cfg.vocab)
    else:
        # note: `tokenizers` breaks ties between equally frequent merges in hash order, so two
        # trainings on the same text can differ slightly; pass --vocab for reproducible runs
        log(f"training a WordPiece vocabulary of {cfg.vocab_size} on {cfg.corpus}")
        tok = WordPieceTokenizer.train((s for doc in _documents(cfg) for s in doc), cfg.vocab_size)
    data.mkdir(parents=True, exist_ok=True)
    tok.save(data)
    return tok


def _prepare_data(cfg: PretrainConfig, tok: WordPieceTokenizer, data: Path, log) -> tuple[TokenStore, TokenStore]:
    shards = data / "shards"
    if (shards / "train" / "meta.json").is_file():
        train, held = TokenStore(shards / "train"), TokenStore(shards / "eval")
        if train.matches(tok):
            return train, held
    log(f"tokenizing {cfg.corpus} into {shards}")
    return tokenize_corpus(_documents(cfg), tok, shards, cfg.holdout_every, cfg.shard_tokens)


def _build_model(cfg: PretrainConfig, tok: WordPieceTokenizer) -> BertForPreTraining:
    if cfg.model in PRESETS:
        bert_cfg = BertConfig.preset(cfg.model, vocab_size=tok.vocab_size,
                                     max_position_embeddings=max(512, cfg.max_len))
        model = BertForPreTraining(bert_cfg)
        init_weights(model, bert_cfg)
        return model
    model, _ = load_model(cfg.model)
    if model.config.vocab_size < tok.vocab_size:
        raise BertkitError(f"{cfg.model}: the model has {model.config.vocab_size} token embeddings but its "
                           f"tokenizer {tok.vocab_size} tokens")
    if cfg.max_len > model.config.max_position_embeddings:
        raise BertkitError(f"--max-len {cfg.max_len} exceeds the model's {model.config.max_position_embeddings} positions")
    return model


def _optimizer(model, cfg: PretrainConfig):
    opt = adamw(model, cfg.lr, cfg.weight_decay, eps=1e-6)  # BERT's epsilon
    return opt, warmup_linear(opt, int(cfg.warmup * cfg.steps), cfg.steps)


# ---- checkpoints ----------------------------------------------------------------------------
def _save_checkpoint(out: Path, step: int, model, opt, sched, position: Position, cfg: PretrainConfig,
                     elapsed: float, rng: list, cuda_rng: list, world: int) -> Path:
    root = out / "checkpoints"
    final = root / f"step_{step:07d}"
    tmp = root / f".step_{step:07d}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, tmp)
    # RNG states per rank: dropout continues exactly where it stopped
    torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "torch_rng": rng,
                "cuda_rng": cuda_rng}, tmp / "trainer.pt")
    write_json(tmp / "trainer.json", {"step": step, "epoch": position.epoch, "batch": position.batch,
                                      "elapsed_s": elapsed, "world_size": world, "options": _options(cfg)})
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    kept = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in kept[:-cfg.keep_checkpoints]:
        shutil.rmtree(old)
    return final


def _options(cfg: PretrainConfig) -> dict:
    return {k: getattr(cfg, k) for k in PretrainConfig.EXACT}


def latest_checkpoint(out: Path) -> Path | None:
    done = sorted(p for p in (out / "checkpoints").glob("step_*") if (p / "trainer.json").is_file())
    return done[-1] if done else None


def _check_resumable(ckpt: Path, cfg: PretrainConfig, model: BertForPreTraining) -> dict:
    state = json.loads((ckpt / "trainer.json").read_text())
    saved = load_config(ckpt)
    if saved != model.config:
        diff = [f"{f.name} {getattr(saved, f.name)} in the checkpoint vs {getattr(model.config, f.name)} now"
                for f in dataclasses.fields(saved) if getattr(saved, f.name) != getattr(model.config, f.name)]
        raise BertkitError(f"{ckpt} was written by a different model configuration ({'; '.join(diff)}); "
                           "resume with the options of that run or choose another --out")
    changed = [f"{k}: {v} in the checkpoint vs {getattr(cfg, k)} now"
               for k, v in state["options"].items() if v != getattr(cfg, k)]
    if changed:
        raise BertkitError(f"{ckpt}: cannot resume exactly with changed options ({'; '.join(changed)})")
    return state


# ---- evaluation -----------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, batches: list[dict], device, autocast) -> dict:
    was_training = model.training
    model.eval()
    mlm_sum = mlm_n = mlm_hit = nsp_sum = nsp_hit = nsp_n = 0.0
    label_counts: dict[int, int] = {}
    for b in batches:
        b = {k: v.to(device) for k, v in b.items()}
        with autocast:
            out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], mlm_positions=b["mlm_positions"])
        valid = b["mlm_labels"] != -100
        logits = out.mlm_logits[valid].float()
        labels = b["mlm_labels"][valid]
        mlm_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        mlm_hit += (logits.argmax(-1) == labels).sum().item()
        mlm_n += labels.numel()
        nsp_sum += torch.nn.functional.cross_entropy(out.nsp_logits.float(), b["nsp_labels"], reduction="sum").item()
        nsp_hit += (out.nsp_logits.argmax(-1) == b["nsp_labels"]).sum().item()
        nsp_n += b["nsp_labels"].numel()
        for t, c in zip(*torch.unique(labels, return_counts=True)):
            label_counts[int(t)] = label_counts.get(int(t), 0) + int(c)
    model.train(was_training)
    return {"eval_mlm_loss": mlm_sum / mlm_n, "eval_mlm_acc": mlm_hit / mlm_n,
            "eval_nsp_loss": nsp_sum / nsp_n, "eval_nsp_acc": nsp_hit / nsp_n,
            "eval_predictions": int(mlm_n), "eval_pairs": int(nsp_n),
            # accuracy of always guessing the most common masked token: the bar to clear
            "eval_majority_token_acc": max(label_counts.values()) / mlm_n}


# ---- several processes: torchrun + DistributedDataParallel ----------------------------------
def _init_distributed() -> tuple[int, int]:
    """(rank, world size): under torchrun (WORLD_SIZE set) join the process group, nccl on GPUs
    and gloo on CPUs; a plain run is rank 0 of 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), world


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


# ---- the loop -------------------------------------------------------------------------------
def pretrain(cfg: PretrainConfig, on_step=None) -> dict | None:
    """Run (or resume) a pretraining run; returns the summary also written to OUT/summary.json
    (None on the other ranks of a torchrun job: rank 0 writes every file).
    on_step(step, model) is called after every optimizer step and its checkpoint.

    Under torchrun each of the W processes takes 1/W of every batch (the same global batch a
    single process would see) and DistributedDataParallel averages the gradients."""
    rank, world = _init_distributed()
    main = rank == 0
    if cfg.batch_size % (world * cfg.grad_accum):
        raise BertkitError(f"batch size {cfg.batch_size} is not divisible by {world} processes x "
                           f"{cfg.grad_accum} accumulation steps")
    out = Path(cfg.out)
    log = (lambda msg: tqdm.write(f"bertkit: {msg}", file=sys.stderr)) if cfg.progress and main else (lambda msg: None)
    ckpt = None
    if cfg.resume:
        ckpt = latest_checkpoint(out)
        if ckpt is None:
            raise BertkitError(f"{out}: no checkpoint to resume from (expected {out / 'checkpoints'}/step_*)")
    elif out.exists() and any((out / n).exists() for n in ("checkpoints", "metrics.jsonl", "model.safetensors")):
        raise BertkitError(f"{out} already holds a training run; pass --resume to continue it "
                           "or choose another --out")
    _barrier(world)  # every rank has checked --out before rank 0 writes into it
    data = out / "data"
    if main:
        out.mkdir(parents=True, exist_ok=True)
        tok = _prepare_tokenizer(cfg, data, log)
        train_store, eval_store = _prepare_data(cfg, tok, data, log)
    _barrier(world)  # the other ranks open what rank 0 prepared
    if not main:
        tok = WordPieceTokenizer.from_folder(data)
        train_store, eval_store = _prepare_data(cfg, tok, data, log)
    if train_store.meta["documents"] < 2:
        raise BertkitError(f"{cfg.corpus}: next sentence prediction needs at least two documents for training, "
                           f"found {train_store.meta['documents']} (separate documents with a blank line)")
    masking = MaskingConfig(cfg.mask_prob, cfg.max_predictions, cfg.whole_word)
    batches = PretrainingBatches(train_store, tok, cfg.max_len, cfg.batch_size, masking, cfg.seed, cfg.short_seq_prob)
    eval_batches = []
    if eval_store.meta["documents"] >= 2 and cfg.eval_batches > 0:
        eval_batches = PretrainingBatches(eval_store, tok, cfg.max_len, cfg.batch_size, masking, cfg.seed + 1,
                                          cfg.short_seq_prob, drop_last=False).fixed_batches(cfg.eval_batches)
    else:
        log("fewer than two held-out documents: no evaluation (lower --holdout-every or add documents)")

    torch.manual_seed(cfg.seed)  # initial weights, new heads and dropout
    model = _build_model(cfg, tok)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    model.to(device)
    if rank:
        torch.manual_seed(cfg.seed + rank)  # other dropout masks on each rank
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    opt, sched = _optimizer(model, cfg)
    step, position, elapsed0 = 0, Position(), 0.0
    if ckpt is not None:
        state = _check_resumable(ckpt, cfg, model)
        resumed, _ = load_model(ckpt, quiet=True)
        model.load_state_dict(resumed.state_dict())
        trainer = torch.load(ckpt / "trainer.pt", weights_only=True)
        opt.load_state_dict(trainer["optimizer"])
        sched.load_state_dict(trainer["scheduler"])
        if state.get("world_size", 1) != world:
            raise BertkitError(f"{ckpt} was written by {state.get('world_size', 1)} process(es); resume it with as many")
        torch.set_rng_state(trainer["torch_rng"][rank])
        if trainer["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state(trainer["cuda_rng"][rank], device)
        step, position, elapsed0 = state["step"], Position(state["epoch"], state["batch"]), state["elapsed_s"]
        log(f"resuming {out} at step {step} (epoch {position.epoch}, batch {position.batch})")
    metrics = MetricsLog(out, cfg.tensorboard, resume_step=step if ckpt is not None else None) if main else None
    if main:
        write_json(out / "pretrain_config.json", dataclasses.asdict(cfg))
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model

    model.train()
    local = cfg.batch_size // world          # this rank's rows of every batch
    micro = local // cfg.grad_accum
    data_iter = batches.iterate(position)
    window = dict(loss=0.0, mlm=0.0, nsp=0.0, hit=0, n=0, nsp_hit=0, pairs=0, compute=0.0, steps=0)
    t_start = time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=step, disable=not (cfg.progress and main), unit="step", dynamic_ncols=True)
    last_eval = None
    while step < cfg.steps:
        position, batch = next(data_iter)
        t0 = time.perf_counter()
        batch = {k: v[rank * local:(rank + 1) * local].to(device, non_blocking=True) for k, v in batch.items()}
        # loss, mlm, nsp, mlm hits, predictions, nsp hits: kept on the device (nccl reduces there),
        # read back once per step
        stats = torch.zeros(6, dtype=torch.float64, device=device)
        for i in range(cfg.grad_accum):
            mb = {k: v[i * micro:(i + 1) * micro] for k, v in batch.items()}
            # gradients are averaged across ranks once per step, on the last micro-batch
            sync = net.no_sync() if world > 1 and i < cfg.grad_accum - 1 else contextlib.nullcontext()
            with sync, autocast:
                o = net(mb["input_ids"], mb["token_type_ids"], mb["attention_mask"],
                        mlm_positions=mb["mlm_positions"], mlm_labels=mb["mlm_labels"],
                        nsp_labels=mb["nsp_labels"], nsp_weight=cfg.nsp_weight)
                (o.loss / cfg.grad_accum).backward()
            with torch.no_grad():
                valid = mb["mlm_labels"] != -100
                stats += torch.stack([
                    o.loss.double() / cfg.grad_accum, o.mlm_loss.double() / cfg.grad_accum,
                    o.nsp_loss.double() / cfg.grad_accum,
                    ((o.mlm_logits.argmax(-1) == mb["mlm_labels"]) & valid).sum().double(),
                    valid.sum().double(), (o.nsp_logits.argmax(-1) == mb["nsp_labels"]).sum().double()])
        if world > 1:
            dist.all_reduce(stats)
            stats[:3] /= world
        stats = stats.tolist()
        for key, value in zip(("loss", "mlm", "nsp", "hit", "n", "nsp_hit"), stats):
            window[key] += value
        if not math.isfinite(stats[0]):
            raise BertkitError(f"step {step + 1}: the loss is not finite; the last checkpoint under "
                               f"{out / 'checkpoints'} is intact: lower --lr and pass --resume")
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        window["compute"] += time.perf_counter() - t0
        window["pairs"] += cfg.batch_size
        window["steps"] += 1
        bar.update(1)
        if main and (step % cfg.log_every == 0 or step == cfg.steps):
            s = window["steps"]
            record = {"step": step, "loss": window["loss"] / s, "mlm_loss": window["mlm"] / s,
                      "nsp_loss": window["nsp"] / s, "mlm_acc": window["hit"] / max(1, window["n"]),
                      "nsp_acc": window["nsp_hit"] / window["pairs"], "lr": sched.get_last_lr()[0],
                      "epoch": position.epoch,
                      "elapsed_s": elapsed0 + time.perf_counter() - t_start,
                      "pairs_per_s": window["pairs"] / window["compute"]}
            metrics.write(record)
            bar.set_postfix(mlm=f"{record['mlm_loss']:.3f}", nsp=f"{record['nsp_loss']:.3f}",
                            pairs_s=f"{record['pairs_per_s']:.0f}")
            window = {k: 0 for k in window}
        if main and eval_batches and (step % cfg.eval_every == 0 or step == cfg.steps):
            last_eval = {"step": step, **evaluate(model, eval_batches, device, autocast)}
            metrics.write(last_eval)
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            rng = [torch.get_rng_state()] * world
            cuda_rng = [torch.cuda.get_rng_state(device)] * world if device.type == "cuda" else []
            if world > 1:  # every rank's RNG, for an exact resume
                dist.all_gather_object(rng, torch.get_rng_state())
                if cuda_rng:
                    dist.all_gather_object(cuda_rng, torch.cuda.get_rng_state(device))
            if main:
                _save_checkpoint(out, step, model, opt, sched, position, cfg,
                                 elapsed0 + time.perf_counter() - t_start, rng, cuda_rng, world)
            _barrier(world)
        if on_step is not None:
            on_step(step, model)
    bar.close()
    if not main:
        return None

    info = {"task": "pretraining", "corpus": cfg.corpus, "steps": step, "max_len": cfg.max_len}
    save_model(model, out, tokenizer=tok, bertkit_info=info)
    records = metrics.records()
    train_records = [r for r in records if "loss" in r]
    plot_losses(records, out / "loss.png",
                [("mlm_loss", "MLM (train)"), ("nsp_loss", "NSP (train)"),
                 ("eval_mlm_loss", "MLM (held out)"), ("eval_nsp_loss", "NSP (held out)")],
                f"BERT pretraining: {model.config.num_hidden_layers} layers, hidden "
                f"{model.config.hidden_size}, batch {cfg.batch_size}, length {cfg.max_len}")
    timed = train_records[1:] or train_records  # the first window includes warm-up of kernels
    summary = {
        "steps": step, "pairs_seen": step * cfg.batch_size,
        "epoch": position.epoch, "train_pairs_per_epoch": batches.count_pairs(0),
        "vocab_size": tok.vocab_size, "ln_vocab_size": math.log(tok.vocab_size),
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {"train": train_store.meta, "eval": eval_store.meta},
        "final_train": train_records[-1] if train_records else None,
        "final_eval": last_eval,
        "pairs_per_s": sum(r["pairs_per_s"] for r in timed) / max(1, len(timed)),
        "elapsed_s": elapsed0 + time.perf_counter() - t_start,
        "device": str(device), "config": dataclasses.asdict(cfg),
    }
    write_json(out / "summary.json", summary)
    metrics.close()
    return summary
