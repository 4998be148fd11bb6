"""Distillation: a student BERT learns from a teacher (any BERT folder bertkit loads) on raw text,
the way a CPU user gets a small model worth fine-tuning from a published one.

Signals (each weighted; 0 leaves it out):
- sentence: the teacher's sentence vector as its folder pools it (a sentence-transformers folder
  declares mean pooling and normalising), matched by the student's mean-pooled vector through a
  learned projection, by cosine distance or mean squared error (sentence-transformers' recipe);
- hidden: the teacher's last-layer token states through a projection, mean squared error
  (TinyBERT); needs the teacher's vocabulary;
- relations: the last layer's self-attention relations, query-query, key-key and value-value,
  split into relation heads whatever either model's head count (MiniLMv2), by KL divergence;
- logits: where the teacher is a fine-tuned classifier (`bertkit finetune classify`), its class
  probabilities, matched by its own head on the student's projected sentence vector, by KL
  divergence at a temperature (Hinton et al.; the task distillation of TinyBERT and DistilBERT);
- mlm: masked language modelling on the same texts, beside them.
Each loss is a sum over its texts or tokens divided by the global batch's count, so micro-batches
and processes give the gradient of one batch.

The student starts from a preset with the teacher's vocabulary, its word, position and segment
embeddings the teacher's projected on their first principal components; or from a model folder.
The teacher's sentence vectors can be kept in OUT/data (TeacherCache), so that epochs after the
first do not run the teacher again.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..config import BertConfig
from ..errors import BertkitError
from ..files import atomic_write, copy_into, write_file
from ..folders import load_model
from ..model import BertForPreTraining, BertModel, Linear, init_weights
from ..pooling import folder_modules, folder_normalize, folder_pooling, pool
from ..tasks import get_task
from ..tasks.base import TaskModel
from ..tasks.folder import fine_tuned_task, load_task_model, save_task_model

SENTENCE_LOSSES = ("cosine", "mse")
RELATION_HEADS = 12  # MiniLMv2's relation heads for models of 384 to 768 wide
HEAD_FILE = "distill_head.safetensors"  # the projections, in a checkpoint beside the student


# ---- the losses, per text or per token (summed and divided by the global counts by the job) ----
def sentence_losses(student: torch.Tensor, teacher: torch.Tensor, kind: str) -> torch.Tensor:
    """(B,) the loss of each text: 1 - cosine, or the squared error averaged over dimensions."""
    if kind == "cosine":
        return 1 - F.cosine_similarity(student.float(), teacher.float(), dim=-1)
    return ((student.float() - teacher.float()) ** 2).mean(-1)


def hidden_losses(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """(B, T) squared error of each token's state, averaged over dimensions (padding: mask it out)."""
    return ((student.float() - teacher.float()) ** 2).mean(-1)


def logit_losses(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B,) T^2 KL(softmax(teacher / T) || softmax(student / T)) of each text's logits (B, C): the
    T^2 keeps the gradient's size whatever the temperature (Hinton et al. 2015)."""
    lt = (teacher.float() / temperature).log_softmax(-1)
    ls = (student.float() / temperature).log_softmax(-1)
    return temperature ** 2 * (lt.exp() * (lt - ls)).sum(-1)


def relations(x: torch.Tensor, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """x: (B, T, H) queries, keys or values; mask: (B, T) 1 = token. -> (B, R, T, T) log-probabilities
    of softmax(x_r x_r^T / sqrt(d_r)) over the real keys, for R relation heads of H / R each."""
    B, T, H = x.shape
    xr = x.float().view(B, T, heads, H // heads).transpose(1, 2)                  # (B, R, T, d)
    scores = xr @ xr.transpose(-1, -2) / math.sqrt(H // heads)                     # (B, R, T, T)
    scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    return scores.log_softmax(-1)


def relation_losses(student: tuple, teacher: tuple, mask: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T) KL(teacher || student) of each query token's relations, averaged over the relation
    heads and over q-q, k-k, v-v. student, teacher: (q, k, v), each (B, T, H) of its own width."""
    total = 0.0
    for s, t in zip(student, teacher):
        ls, lt = relations(s, mask, heads), relations(t, mask, heads)             # (B, R, T, T)
        kl = (lt.exp() * (lt - ls)).masked_fill(mask[:, None, None, :] == 0, 0.0).sum(-1)  # (B, R, T)
        total = total + kl.mean(1)
    return total / len(student)


# ---- the models ---------------------------------------------------------------------------
class LastLayerInput:
    """Keeps what a BertModel's last attention reads, to compute its queries, keys and values."""

    def __init__(self, bert: BertModel):
        self.attn, self.x = bert.layers[-1].attn, None
        self.handle = self.attn.register_forward_pre_hook(self._keep)

    def _keep(self, module, args):
        self.x = args[0]

    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.attn.qkv(self.x).split(self.x.size(-1), dim=2)                 # 3 x (B, T, H)


@dataclass
class TeacherOutput:
    sentence: torch.Tensor        # (B, Ht) as the teacher's folder pools (and normalises) it
    hidden: torch.Tensor | None   # (B, T, Ht) last layer
    qkv: tuple | None             # last layer's queries, keys, values
    logits: torch.Tensor | None = None  # (B, C) a fine-tuned classifier's


class Teacher:
    """A model folder in evaluation mode, its weights frozen; its sentence vector pooled as the
    folder declares (cls where it declares nothing). A folder fine-tuned for classify: the vector
    its classifier reads, and the classifier (head) that makes its logits."""

    def __init__(self, folder: str | Path, device):
        self.folder = Path(folder)
        self.head = None
        if fine_tuned_task(folder) == "classify":
            task, model, _ = load_task_model(folder, device="cpu")
            self.bert, self.head = model.bert, model.head.eval().requires_grad_(False).to(device)
            self.task_info, self.pooling, self.normalize = dict(task.info), task.info["pooling"], False
            self.labels = list(task.info["labels"])
        else:
            self.bert, _ = load_model(folder, heads=False, quiet=True)
            self.pooling, self.normalize = folder_pooling(folder) or "cls", folder_normalize(folder)
        self.bert.to(device).eval().requires_grad_(False)
        self.config = self.bert.config
        self.last = LastLayerInput(self.bert)

    @torch.no_grad()
    def __call__(self, batch: dict, tokens: bool, qkv: bool) -> TeacherOutput:
        out = self.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        vec = pool(out.sequence_output, out.pooled_output, batch["attention_mask"], self.pooling).float()
        if self.normalize:
            vec = F.normalize(vec, dim=-1)
        return TeacherOutput(vec, out.sequence_output.float() if tokens else None,
                             tuple(x.float() for x in self.last.qkv()) if qkv else None, self.logits(vec))

    @torch.no_grad()
    def logits(self, vec: torch.Tensor) -> torch.Tensor | None:
        """(B, C) the classifier's logits of sentence vectors (B, Ht), or None: not a classifier.
        Always in fp32, under autocast too, so that logits of kept vectors equal fresh ones."""
        if self.head is None:
            return None
        with torch.autocast(vec.device.type, enabled=False):
            return self.head(vec.float()).float()


class Projections(nn.Module):
    """The student's width to the teacher's, for the sentence vector and the token states: trained
    with the student, kept in checkpoints, not in the model folder."""

    def __init__(self, student: int, teacher: int):
        super().__init__()
        self.sentence = Linear(student, teacher)
        self.hidden = Linear(student, teacher)


class Student(nn.Module):
    """The student (BertForPreTraining: its MLM head serves MLM beside distillation) with the
    projections, as one module for DistributedDataParallel."""

    def __init__(self, model: BertForPreTraining, teacher_width: int):
        super().__init__()
        self.model = model
        self.proj = Projections(model.config.hidden_size, teacher_width)
        self.last = LastLayerInput(model.bert)

    @property
    def config(self) -> BertConfig:
        return self.model.config

    def forward(self, batch: dict, teacher: TeacherOutput, w: "Weights", counts: dict, mlm: bool, head=None):
        """The weighted losses of this micro-batch, each a share of the global batch's (counts:
        its texts, tokens and predictions); head: the teacher's frozen classifier, for the logits.
        Returns (loss, per-signal sums as a (6,) tensor: sentence, hidden, relations, mlm,
        logits, summed cosine to the teacher)."""
        mask = batch["attention_mask"]
        out = self.model.bert(batch["input_ids"], batch["token_type_ids"], mask)
        zero = out.pooled_output.new_zeros(()).float()
        sent = hid = rel = mlm_loss = logit_loss = zero
        vec = self.proj.sentence(pool(out.sequence_output, None, mask, "mean"))      # (B, Ht)
        cos = F.cosine_similarity(vec.float(), teacher.sentence, dim=-1).sum().detach()
        if w.sentence:
            sent = sentence_losses(vec, teacher.sentence, w.sentence_loss).sum() / counts["texts"]
        if w.logits:
            logit_loss = logit_losses(head(vec), teacher.logits, w.temperature).sum() / counts["texts"]
        if w.hidden:
            per_token = hidden_losses(self.proj.hidden(out.sequence_output), teacher.hidden)  # (B, T)
            hid = (per_token * mask).sum() / counts["tokens"]
        if w.relations:
            per_token = relation_losses(self.last.qkv(), teacher.qkv, mask, w.relation_heads)  # (B, T)
            rel = (per_token * mask).sum() / counts["tokens"]
        if mlm:
            mlm_loss = self.model(batch["mlm_input_ids"], batch["token_type_ids"], mask,
                                  mlm_positions=batch["mlm_positions"], mlm_labels=batch["mlm_labels"],
                                  mlm_denominator=counts["predictions"]).mlm_loss
        loss = w.sentence * sent + w.hidden * hid + w.relations * rel + w.mlm * mlm_loss + w.logits * logit_loss
        return loss, torch.stack([sent.detach(), hid.detach(), rel.detach(), mlm_loss.detach().float(),
                                  logit_loss.detach(), cos])


@dataclass
class Weights:
    sentence: float = 1.0
    hidden: float = 0.0
    relations: float = 0.0
    mlm: float = 0.0
    sentence_loss: str = "cosine"
    relation_heads: int = RELATION_HEADS
    logits: float = 0.0
    temperature: float = 1.0


# ---- the student's start ------------------------------------------------------------------
def pca_embeddings(teacher: BertModel, student: BertForPreTraining) -> None:
    """The student's word, position and segment embeddings: the teacher's, projected on the
    first principal components of its word embeddings (the student's width of them)."""
    E = teacher.embeddings.word.weight.detach().float()                           # (V, Ht)
    mean = E.mean(0)
    _, _, V = torch.linalg.svd(E - mean, full_matrices=False)                     # V: (Ht, Ht) rows = components
    basis = V[:student.config.hidden_size].T                                      # (Ht, Hs)
    se, te = student.bert.embeddings, teacher.embeddings
    with torch.no_grad():
        se.word.weight.copy_((E - mean) @ basis)
        n = min(se.position.num_embeddings, te.position.num_embeddings)
        se.position.weight[:n].copy_(te.position.weight[:n].float() @ basis)
        k = min(se.segment.num_embeddings, te.segment.num_embeddings)
        se.segment.weight[:k].copy_(te.segment.weight[:k].float() @ basis)


def build_student(preset_cfg: BertConfig, teacher: Teacher) -> BertForPreTraining:
    """A preset with the teacher's vocabulary, BERT's initialisation, the embeddings from the
    teacher's (pca_embeddings)."""
    model = BertForPreTraining(preset_cfg)
    init_weights(model, preset_cfg)
    if preset_cfg.hidden_size <= teacher.config.hidden_size:
        pca_embeddings(teacher.bert, model)
    return model


def teacher_layers(teacher: BertForPreTraining, n: int) -> BertForPreTraining:
    """The teacher with n of its L layers, evenly spaced from the first (every other one for half:
    DistilBERT's start), its embeddings, pooler and heads kept."""
    total = teacher.config.num_hidden_layers
    if not 1 <= n <= total:
        raise BertkitError(f"--student-layers {n}: the teacher has {total} layers")
    picks = [round(i * total / n) for i in range(n)]
    teacher.bert.layers = nn.ModuleList(teacher.bert.layers[i] for i in picks)
    teacher.config = teacher.bert.config = dataclasses.replace(teacher.config, num_hidden_layers=n)
    return teacher


def check_relation_heads(heads: int, *widths: int) -> None:
    for width in widths:
        if width % heads:
            raise BertkitError(f"--relation-heads {heads} does not divide a hidden size of {width}")


# ---- checkpoints and the model folder -----------------------------------------------------
def save_projections(proj: Projections, folder: Path) -> None:
    tensors = {k: v.detach().cpu().contiguous() for k, v in proj.state_dict().items()}
    atomic_write(folder / HEAD_FILE, lambda p: save_file(tensors, p))


def load_projections(proj: Projections, folder: Path) -> None:
    proj.load_state_dict(load_file(str(folder / HEAD_FILE)))


def write_sentence_transformers(teacher: Path, out: Path, width: int, max_len: int) -> None:
    """Make the student's folder a sentence-transformers one pooled as it learned: the mean of its
    last layer, whatever the teacher pools (the student's mean is what went through the projection
    to the teacher's vector), normalised where the teacher's pipeline normalises. Without it
    encode and fine-tuning would read [CLS] or the tanh pooler, which distillation never trained."""
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1] for m in folder_modules(teacher)}
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
    if "Normalize" in kinds:
        modules.append(("2_Normalize", "Normalize"))
    write_file(out / "modules.json", json.dumps([{"idx": i, "name": str(i), "path": path,
                                                  "type": f"sentence_transformers.models.{kind}"}
                                                 for i, (path, kind) in enumerate(modules)], indent=2) + "\n")
    (out / "1_Pooling").mkdir(parents=True, exist_ok=True)
    pooling = {"word_embedding_dimension": width, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
               "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    write_file(out / "1_Pooling" / "config.json", json.dumps(pooling, indent=2) + "\n")
    if "Normalize" in kinds:
        (out / "2_Normalize").mkdir(exist_ok=True)
    write_file(out / "sentence_bert_config.json", json.dumps({"max_seq_length": max_len, "do_lower_case": False},
                                                             indent=2) + "\n")
    if (teacher / "config_sentence_transformers.json").is_file():
        copy_into(teacher / "config_sentence_transformers.json", out / "config_sentence_transformers.json")


def save_classifier(bert: BertModel, proj: Projections, teacher: Teacher, tok, out: Path, max_len: int) -> bool:
    """OUT/classifier: the student as the teacher's classifier, as it learned the logits (its mean
    vector, the projection, the teacher's linear classifier: one linear layer of the student's
    width), a folder fine-tuned for classify that predict, evaluate, serve and export take. An MLP
    head (`--head mlp`) does not compose into bertkit's: returns False and writes nothing."""
    if teacher.head is None or teacher.head.hidden is not None:
        return False
    task = get_task("classify")({**teacher.task_info, "pooling": "mean", "head": "linear", "max_len": max_len,
                                 "base_model": str(teacher.folder)})
    model = TaskModel(bert, task.head(bert.config, bert))
    wc, bc = teacher.head.classifier.weight.detach().float(), teacher.head.classifier.bias.detach().float()
    wp, bp = proj.sentence.weight.detach().float(), proj.sentence.bias.detach().float()
    with torch.no_grad():
        model.head.classifier.weight.copy_(wc @ wp)                               # (C, Hs)
        model.head.classifier.bias.copy_(wc @ bp + bc)
    save_task_model(model, task, tok, out / "classifier")
    return True


# ---- the teacher's sentence vectors, kept --------------------------------------------------
class TeacherCache:
    """The teacher's sentence vector of every text (TextBatches' text numbers), kept in
    OUT/data/teacher/: a memory-mapped (texts, width) float32 array and a byte per text that says
    it is filled. A row's bytes reach the disk before its flag, so a killed run leaves no flag on
    a row it had not written."""

    def __init__(self, folder: Path, n_texts: int, width: int, teacher_id: str):
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"texts": n_texts, "width": width, "teacher": teacher_id}
        path = folder / "meta.json"
        if not path.is_file() or json.loads(path.read_text()) != meta:  # another teacher or corpus: start again
            for f in folder.glob("*.npy"):
                f.unlink()
            path.write_text(json.dumps(meta) + "\n")
        self.vectors = self._open(folder / "vectors.npy", np.float32, (n_texts, width))
        self.filled = self._open(folder / "filled.npy", np.uint8, (n_texts,))

    @staticmethod
    def _open(path: Path, dtype, shape):
        if path.is_file():
            return np.load(path, mmap_mode="r+")
        return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)

    def get(self, ids: np.ndarray) -> torch.Tensor | None:
        """The rows of these texts, if every one is filled."""
        if not self.filled[ids].all():
            return None
        return torch.from_numpy(np.array(self.vectors[ids]))

    def put(self, ids: np.ndarray, vectors: torch.Tensor) -> None:
        self.vectors[ids] = vectors.detach().float().cpu().numpy()
        self.vectors.flush()
        self.filled[ids] = 1
        self.filled.flush()
