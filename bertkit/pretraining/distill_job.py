"""The distillation job for the Loop (`bertkit pretrain --teacher FOLDER`): single texts from the
shards, the teacher's outputs for them (kept in OUT/data/teacher where only its sentence vectors
are needed and one process trains), one step's gradients of the student and its projections,
and the held-out figures every --eval-every steps."""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch
import torch.distributed as dist

from ..folders import load_model, save_model
from ..pooling import pool
from ..training.distributed import Processes, accumulate
from ..training.loop import Job, Loop, StepResult
from ..training.prefetch import Prefetch
from ..training.run import restore_state
from .batches import Position
from .distill import (
    Student,
    Teacher,
    TeacherCache,
    TeacherOutput,
    Weights,
    load_projections,
    save_classifier,
    save_projections,
    sentence_losses,
    write_sentence_transformers,
)
from .masking import MaskingConfig
from .recipes import PretrainConfig
from .shards import TokenStore
from .texts import TextBatches


def weights(cfg: PretrainConfig) -> Weights:
    return Weights(cfg.distill_sentence, cfg.distill_hidden, cfg.distill_relations, cfg.distill_mlm,
                   cfg.sentence_loss, cfg.relation_heads, cfg.distill_logits, cfg.distill_temperature)


def text_batches(cfg: PretrainConfig, store: TokenStore, tok, seed: int, batch_size: int,
                 drop_last: bool = True) -> TextBatches:
    masking = MaskingConfig(cfg.mask_prob, cfg.max_predictions, cfg.whole_word)
    return TextBatches(store, tok, cfg.max_len, batch_size, masking, seed, cfg.short_seq_prob, drop_last=drop_last)


def held_out_texts(cfg: PretrainConfig, store: TokenStore, tok, log) -> list[dict]:
    """The evaluation's fixed batches of held-out texts (--eval-pairs of them, 256 a batch at most)."""
    if store.meta["documents"] < 1 or cfg.eval_pairs <= 0:
        log("no held-out documents: no evaluation (lower --holdout-every or add documents)")
        return []
    n_batches = math.ceil(cfg.eval_pairs / 256)
    return text_batches(cfg, store, tok, cfg.seed + 1, math.ceil(cfg.eval_pairs / n_batches),
                        drop_last=False).fixed_batches(n_batches)


def teacher_id(folder: str | Path) -> str:
    """What the cache's vectors came from: the teacher's weights, by size and time."""
    st = (Path(folder) / "model.safetensors").stat() if (Path(folder) / "model.safetensors").is_file() else None
    key = f"{Path(folder).resolve()}:{st.st_size if st else 0}:{st.st_mtime_ns if st else 0}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class DistillJob(Job):
    """The student (with its projections) learning from the teacher on single texts."""
    sums = ("loss", "sentence", "hidden", "relations", "mlm", "logits", "cos", "texts")

    def __init__(self, cfg: PretrainConfig, model: Student, opt, procs: Processes, tok, store: TokenStore,
                 eval_batches: list[dict], metrics, log, state: dict | None, *, phase: int, autocast):
        self.cfg, self.model, self.opt, self.procs, self.tok, self.store = cfg, model, opt, procs, tok, store
        self.eval_batches, self.metrics, self.log, self.autocast = eval_batches, metrics, log, autocast
        self.phase = phase  # one phase: distillation reads texts of every length from the start
        self.position = Position(state["epoch"], state["batch"]) if state else Position()
        self.pairs_seen = state.get("pairs_seen", 0) if state else 0
        self.w = weights(cfg)
        self.teacher = Teacher(cfg.teacher, procs.device)
        # the pooler, NSP head and (without those signals) the MLM head and a projection get no gradient
        self.net = procs.wrap(model, find_unused_parameters=True)
        self.batches = text_batches(cfg, store, tok, cfg.seed, cfg.batch_size)
        self.cache = None
        if cfg.teacher_cache and procs.world == 1 and not (self.w.hidden or self.w.relations):
            self.cache = TeacherCache(Path(cfg.out) / "data" / "teacher", int(self.batches.text_offsets()[-1]),
                                      self.teacher.config.hidden_size, teacher_id(cfg.teacher))
        self.last_eval = self.eval_teacher = None
        self.data_iter = None
        self._open()

    def _open(self) -> None:
        if self.data_iter is not None:
            self.data_iter.close()
        self.data_iter = Prefetch(self.batches.iterate(self.position))

    def close(self) -> None:
        self.data_iter.close()

    def next_batch(self, loop: Loop) -> dict:
        self.position, batch = next(self.data_iter)
        return batch

    # ---- the teacher ----
    def teacher_outputs(self, batch: dict) -> dict:
        """The teacher's outputs for a batch (on the device), as batch entries: from the cache
        where every text is in it, else computed (and kept)."""
        ids = batch["text_ids"].numpy()
        cached = self.cache.get(ids) if self.cache is not None else None
        if cached is not None:
            vec = cached.to(self.procs.device)
            return {"t_sentence": vec, **({"t_logits": self.teacher.logits(vec)} if self.w.logits else {})}
        with self.autocast:
            t = self.teacher(batch, tokens=bool(self.w.hidden), qkv=bool(self.w.relations))
        if self.cache is not None:
            self.cache.put(ids, t.sentence)
        out = {"t_sentence": t.sentence}
        if self.w.logits:
            out["t_logits"] = t.logits
        if t.hidden is not None:
            out["t_hidden"] = t.hidden
        if t.qkv is not None:
            out.update(zip(("t_q", "t_k", "t_v"), t.qkv))
        return out

    @staticmethod
    def _teacher_of(mb: dict) -> TeacherOutput:
        qkv = tuple(mb[k] for k in ("t_q", "t_k", "t_v")) if "t_q" in mb else None
        return TeacherOutput(mb["t_sentence"], mb.get("t_hidden"), qkv, mb.get("t_logits"))

    # ---- a step ----
    def gradients(self, batch: dict) -> StepResult:
        rank, world, device = self.procs.rank, self.procs.world, self.procs.device
        local = self.batches.batch_size // world
        # the global batch's counts, divided by the processes: DistributedDataParallel averages
        counts = {"texts": self.batches.batch_size / world, "tokens": float(batch["attention_mask"].sum()) / world,
                  "predictions": float((batch["mlm_labels"] != -100).sum()) / world}
        batch = {k: v[rank * local:(rank + 1) * local] for k, v in batch.items()}
        batch = {**{k: v.to(device, non_blocking=True) for k, v in batch.items() if k != "text_ids"},
                 "text_ids": batch["text_ids"]}
        batch.update(self.teacher_outputs(batch))
        del batch["text_ids"]
        mlm = bool(self.w.mlm)

        def forward(mb):
            return self.net(mb, self._teacher_of(mb), self.w, counts, mlm, self.teacher.head)

        stats = accumulate(self.net, batch, self.cfg.grad_accum, world, self.autocast, forward,
                           lambda mb, out: out)
        if world > 1:
            dist.all_reduce(stats)
            stats[:5] /= world
        sent, hid, rel, mlm_loss, logit_loss, cos = stats.tolist()  # the one read-back per step
        w = self.w
        loss = w.sentence * sent + w.hidden * hid + w.relations * rel + w.mlm * mlm_loss + w.logits * logit_loss
        self.pairs_seen += self.batches.batch_size
        return StepResult(loss, {"loss": loss, "sentence": sent, "hidden": hid, "relations": rel, "mlm": mlm_loss,
                                 "logits": logit_loss, "cos": cos, "texts": self.batches.batch_size},
                          self.batches.batch_size)

    def record(self, w: dict) -> dict:
        s = w["steps"]
        return {"sentence_loss": w["sentence"] / s, "hidden_loss": w["hidden"] / s,
                "relation_loss": w["relations"] / s, "mlm_loss": w["mlm"] / s, "logit_loss": w["logits"] / s,
                "cosine": w["cos"] / max(1, w["texts"]), "epoch": self.position.epoch}

    def postfix(self, record: dict) -> dict:
        return {"loss": f"{record['loss']:.4f}", "cos": f"{record['cosine']:.3f}",
                "texts_s": f"{record['pairs_per_s']:.0f}"}

    # ---- evaluation ----
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out texts: the student's mean cosine to the teacher's sentence vectors (through its
        projection) and its sentence loss, in fp32; with a classifier teacher, the share of texts
        whose label the student (through the teacher's head) gives as the teacher does."""
        was = self.model.training
        self.model.eval()
        device, n, cos, loss, same = self.procs.device, 0, 0.0, 0.0, 0
        if self.eval_teacher is None:  # the same held-out texts every time: the teacher runs once
            self.eval_teacher = [self.teacher({k: v.to(device) for k, v in b.items()}, tokens=False, qkv=False).sentence
                                 for b in self.eval_batches]
        for b, target in zip(self.eval_batches, self.eval_teacher):
            b = {k: v.to(device) for k, v in b.items() if k != "text_ids"}
            out = self.model.model.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"])
            vec = self.model.proj.sentence(pool(out.sequence_output, None, b["attention_mask"], "mean"))
            cos += float(torch.nn.functional.cosine_similarity(vec.float(), target, dim=-1).sum())
            loss += float(sentence_losses(vec, target, self.w.sentence_loss).sum())
            if self.teacher.head is not None:
                same += int((self.teacher.logits(vec).argmax(-1) == self.teacher.logits(target).argmax(-1)).sum())
            n += len(vec)
        self.model.train(was)
        agreement = {"eval_agreement": same / max(1, n)} if self.teacher.head is not None else {}
        return {"eval_cosine": cos / max(1, n), "eval_sentence_loss": loss / max(1, n), "eval_texts": n, **agreement}

    def after_step(self, loop: Loop) -> None:
        if self.procs.main and self.eval_batches and (loop.step % self.cfg.eval_every == 0 or loop.last):
            with loop.timed("eval_s"):
                self.last_eval = {"step": loop.step, **self.evaluate(), "elapsed_s": loop.clock()}
                self.metrics.write(self.last_eval)

    # ---- checkpoints ----
    def save(self, folder: Path) -> None:
        save_model(self.model.model, folder)
        save_projections(self.model.proj, folder)

    def state(self) -> dict:
        return {"phase": self.phase, "epoch": self.position.epoch, "batch": self.position.batch,
                "pairs_seen": self.pairs_seen}

    def restore(self, ckpt: Path) -> dict:
        load_weights(self.model, ckpt)
        state = restore_state(ckpt, self.opt, self.procs)
        self.position = Position(state["epoch"], state["batch"])
        self.pairs_seen = state.get("pairs_seen", 0)
        self._open()
        return state

    # ---- the run's end ----
    @property
    def title(self) -> str:
        return f"Distillation from {Path(self.cfg.teacher).name}"

    def curves(self) -> list[tuple[str, str]]:
        return [("sentence_loss", "sentence (train)"), ("eval_sentence_loss", "sentence (held out)"),
                ("hidden_loss", "token states (train)"), ("relation_loss", "attention relations (train)"),
                ("logit_loss", "the classifier's logits (train)"), ("mlm_loss", "MLM (train)")]

    def save_final(self, out: Path, tok, info: dict) -> None:
        """The student alone (its MLM head too where it learned MLM), a sentence-transformers folder
        pooled as it learned (the mean, normalised where the teacher's folder normalises); where it
        learned a classifier's logits, also as that classifier in OUT/classifier."""
        info = {**info, "teacher": str(self.cfg.teacher)}
        model = self.model.model if self.w.mlm else self.model.model.bert
        save_model(model, out, tokenizer=tok, bertkit_info=info)
        write_sentence_transformers(Path(self.cfg.teacher), out, model.config.hidden_size, self.cfg.max_len)
        if self.w.logits and save_classifier(self.model.model.bert, self.model.proj, self.teacher, tok, out,
                                             self.cfg.max_len):
            self.log(f"the student as the teacher's classifier, without fine-tuning: {out / 'classifier'}")


def load_weights(student: Student, ckpt: Path) -> None:
    """A checkpoint's student and projections."""
    resumed, _ = load_model(ckpt, quiet=True)
    student.model.load_state_dict(resumed.state_dict())
    load_projections(student.proj, ckpt)
