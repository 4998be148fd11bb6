"""ELECTRA's replaced-token detection (Clark et al. 2020), `bertkit pretrain --objective electra`.

A small generator, trained with MLM, fills the masked positions with tokens sampled from its own
predictions; the discriminator, a BERT encoder, learns for every token whether it is the
original or a replacement. Every position teaches the discriminator, not only the predicted
share that MLM learns from: the paper matched BERT's GLUE score with a quarter of its compute.

The two share their embeddings (tokens, positions, segments), as in the paper. The
discriminator is the model kept: it saves as a plain BertModel folder, and the generator beside
it in generator/, a BertForPreTraining folder that fill-mask reads.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from .. import kernels
from ..config import BertConfig
from ..files import atomic_write
from ..folders import load_model, save_model
from ..kernels.cross_entropy import MLM_ROWS_MULTIPLE, LinearCrossEntropy, sample_rows
from ..model import BertForPreTraining, BertModel, Linear, init_weights
from ..training.distributed import accumulate
from .masking import prediction_kinds
from .recipes import RTD_WEIGHT

GENERATOR = "generator"  # the generator's folder inside a run's folder and its checkpoints
CHUNK = 512  # rows of the generator's logits at a time (the fused loss's chunk)
RTD_HEAD = "rtd_head.safetensors"  # the detection head, in checkpoints only (the saved model is the encoder)


def generator_config(cfg: BertConfig, layers: int = 0) -> BertConfig:
    """`layers` (default, 0: half the discriminator's, at least one) at the discriminator's width:
    the shared embeddings fix the width, and the paper's best generators are a quarter to a half
    of the discriminator (a stronger one replaces tokens too well to leave anything to detect)."""
    return dataclasses.replace(cfg, num_hidden_layers=layers or max(1, cfg.num_hidden_layers // 2))


class RTDHead(nn.Module):
    """dense -> GELU -> one logit per token: replaced (> 0) or original, as HF's
    ElectraDiscriminatorPredictions."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size)
        self.prediction = Linear(cfg.hidden_size, 1)

    def forward(self, h):
        return self.prediction(F.gelu(self.dense(h))).squeeze(-1)  # (B, T)


@dataclass
class ElectraOutput:
    loss: torch.Tensor            # mlm_loss + rtd_weight * rtd_loss
    mlm_loss: torch.Tensor        # the generator's, at the predicted positions
    rtd_loss: torch.Tensor        # the discriminator's binary cross-entropy, summed over tokens / rtd_denominator
    mlm_correct: torch.Tensor     # (B, P) bool: the generator's most likely token is the label
    replaced: torch.Tensor        # (B, T) bool: the discriminator read another token than the original there
    rtd_correct: torch.Tensor     # (B, T) bool: its call (replaced or not) is right; False at padding
    rtd_logits: torch.Tensor      # (B, T)


class ElectraForPreTraining(nn.Module):
    def __init__(self, cfg: BertConfig, generator: BertForPreTraining | None = None, rtd_weight: float = RTD_WEIGHT,
                 generator_layers: int = 0):
        super().__init__()
        self.config = cfg
        # Adam scales each parameter's steps by its own gradients: mostly the shared embeddings feel this weight
        self.rtd_weight = rtd_weight
        self.bert = BertModel(cfg)  # the discriminator
        self.rtd = RTDHead(cfg)
        self.generator = generator if generator is not None else BertForPreTraining(
            generator_config(cfg, generator_layers))
        self.generator.bert.embeddings = self.bert.embeddings  # shared: the same Parameters
        self.generator.mlm.decoder_weight = self.bert.embeddings.word.weight

    def forward(self, input_ids, token_type_ids, attention_mask, *, mlm_positions, mlm_labels,
                mlm_denominator: float | None = None, rtd_denominator: float | None = None,
                sampler: torch.Generator | None = None) -> ElectraOutput:
        # input_ids (B, T) with the chosen tokens as [MASK]; mlm_positions, mlm_labels (B, P), -100 at unused
        # slots. The denominators divide the summed losses (default: this batch's predictions, tokens), so
        # that micro-batches and ranks weigh every token alike. sampler: the generator's sampling RNG
        # (default torch's, which a checkpoint restores).
        B, P = mlm_positions.shape
        valid = mlm_labels != -100                                                   # (B, P)
        labels = mlm_labels[valid]                                                   # (N,)
        rows = torch.cat([mlm_positions.new_zeros(B, 1), mlm_positions], 1)          # (B, 1 + P)
        g = self.generator.bert(input_ids, token_type_ids, attention_mask, last_layer_rows=rows)
        h = self.generator.mlm.transform(g.sequence_output[:, 1:][valid])           # (N, H)
        weight, bias = self.generator.mlm.decoder_weight, self.generator.mlm.bias
        n = valid.sum() if mlm_denominator is None else mlm_denominator
        if kernels.current().fused_mlm_loss:  # it never stores the (N, V) logits, and samples as it goes
            sampled = torch.empty_like(labels)                                       # (N,)
            padded = F.pad(h, (0, 0, 0, -h.size(0) % MLM_ROWS_MULTIPLE))             # (M, H)
            mlm_loss, hit = LinearCrossEntropy.apply(padded, weight, bias, labels, n, CHUNK, sampled, sampler)
        else:  # the plain path, drawing the same samples from the same RNG state: softmax rows, CHUNK at a time
            logits = torch.mm(h, weight.t().to(h.dtype)).add_(bias.to(h.dtype))    # (N, V)
            sampled = torch.cat([sample_rows(c.softmax(-1), sampler) for c in logits.split(CHUNK)]
                                ) if len(labels) else labels.clone()
            mlm_loss = F.cross_entropy(logits.float(), labels, reduction="sum") / n
            hit = logits.argmax(-1) == labels
        mlm_correct = torch.zeros_like(valid).masked_scatter_(valid, hit)

        chosen = valid.nonzero(as_tuple=True)[0], mlm_positions[valid]               # (N,) rows, (N,) columns
        corrupted = input_ids.index_put(chosen, sampled)                             # (B, T) the samples in place
        # a sample equal to the original is no replacement
        replaced = torch.zeros_like(input_ids, dtype=torch.bool).index_put_(chosen, sampled != labels)
        d = self.bert(corrupted, token_type_ids, attention_mask).sequence_output     # (B, T, H)
        rtd_logits = self.rtd(d).float()                                             # (B, T)
        tokens = torch.ones_like(replaced) if attention_mask is None else attention_mask.bool()
        m = tokens.sum() if rtd_denominator is None else rtd_denominator
        rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits[tokens], replaced[tokens].float(),
                                                      reduction="sum") / m
        rtd_correct = ((rtd_logits > 0) == replaced) & tokens
        return ElectraOutput(mlm_loss + self.rtd_weight * rtd_loss, mlm_loss, rtd_loss, mlm_correct, replaced,
                             rtd_correct, rtd_logits)


def build(cfg: BertConfig | None, folder: str | Path | None = None, rtd_weight: float = RTD_WEIGHT,
          generator_layers: int = 0) -> ElectraForPreTraining:
    """A new ELECTRA pair (BERT's initialisation), or one that continues `folder`: its encoder as
    the discriminator, and its generator/ if it has one (an ELECTRA run's), else a new generator."""
    if folder is None:
        model = ElectraForPreTraining(cfg, rtd_weight=rtd_weight, generator_layers=generator_layers)
        init_weights(model, cfg)
        nn.init.zeros_(model.generator.mlm.bias)
        return model
    encoder, _ = load_model(folder, heads=False, quiet=True)
    generator = None
    if (Path(folder) / GENERATOR / "config.json").is_file():
        generator, _ = load_model(Path(folder) / GENERATOR, quiet=True)
    model = ElectraForPreTraining(encoder.config, generator, rtd_weight, generator_layers)
    if generator is None:
        init_weights(model.generator, encoder.config)
        init_weights(model.rtd, encoder.config)
        nn.init.zeros_(model.generator.mlm.bias)
    model.bert.load_state_dict(encoder.state_dict())  # after: the generator's embeddings are the encoder's now
    return model


def save(model: ElectraForPreTraining, folder: Path, tokenizer=None, bertkit_info: dict | None = None,
         head: bool = False) -> None:
    """The discriminator as a BertModel folder, the generator in folder/generator; the detection
    head too with head=True (a checkpoint, to resume from)."""
    save_model(model.bert, folder, tokenizer=tokenizer, bertkit_info=bertkit_info)
    generator_info = None if bertkit_info is None else {**bertkit_info, "electra": "generator"}
    save_model(model.generator, folder / GENERATOR, tokenizer=tokenizer, bertkit_info=generator_info)
    if head:
        tensors = {k: v.detach().cpu().contiguous() for k, v in model.rtd.state_dict().items()}
        atomic_write(folder / RTD_HEAD, lambda p: save_file(tensors, p))


def restore(model: ElectraForPreTraining, folder: Path) -> None:
    """The weights of a checkpoint that save(..., head=True) wrote."""
    generator, _ = load_model(folder / GENERATOR, quiet=True)
    model.generator.load_state_dict(generator.state_dict())
    encoder, _ = load_model(folder, heads=False, quiet=True)
    model.bert.load_state_dict(encoder.state_dict())
    model.rtd.load_state_dict(load_file(str(folder / RTD_HEAD)))


def accumulate_gradients(net, batch: dict, *, n_predictions: int, n_tokens: int, grad_accum: int, world: int,
                         mask_id: int, autocast) -> torch.Tensor:
    """As pretraining's accumulate_gradients, for ELECTRA: each micro-batch's loss a share of the
    global batch's (MLM over its predictions, detection over its tokens). Returns, summed and kept
    on the device: the MLM and detection losses, hits and counts at [MASK], random and unchanged
    positions (the generator's), the detection's right calls and tokens, and the replaced tokens
    and the right calls there."""
    def forward(mb):
        o = net(mb["input_ids"], mb["token_type_ids"], mb["attention_mask"],
                mlm_positions=mb["mlm_positions"], mlm_labels=mb["mlm_labels"],
                mlm_denominator=n_predictions / world, rtd_denominator=n_tokens / world)
        return o.loss, o

    def count(mb, o):
        kinds = prediction_kinds(mb["input_ids"], mb["mlm_positions"], mb["mlm_labels"], mask_id)
        tokens = mb["attention_mask"].bool()
        return torch.stack([
            o.mlm_loss.double() / world, o.rtd_loss.double() / world,
            *[x for k in kinds for x in ((o.mlm_correct & k).sum().double(), k.sum().double())],
            o.rtd_correct.sum().double(), tokens.sum().double(),
            (o.rtd_correct & o.replaced).sum().double(), o.replaced.sum().double()])
    return accumulate(net, batch, grad_accum, world, autocast, forward, count)


@torch.no_grad()
def evaluate_rtd(model: ElectraForPreTraining, batches: list[dict], device, seed: int = 0) -> dict:
    """The discriminator's held-out detection: accuracy over the tokens beside always answering
    "original" (the bar to clear), the share of replaced tokens it finds, and its precision.
    (The generator's MLM figures are pretraining's evaluate of model.generator.) The samples
    come from their own RNG: the same every evaluation, and torch's left as it was."""
    was_training = model.training
    model.eval()
    sampler = torch.Generator(device=device).manual_seed(seed)
    c = dict(loss=0.0, hit=0, n=0, replaced=0, found=0, flagged=0)
    for b in batches:
        b = {k: v.to(device) for k, v in b.items()}
        o = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], mlm_positions=b["mlm_positions"],
                  mlm_labels=b["mlm_labels"], rtd_denominator=1.0, sampler=sampler)
        tokens = b["attention_mask"].bool()
        c["loss"] += o.rtd_loss.item()
        c["hit"] += int(o.rtd_correct.sum())
        c["n"] += int(tokens.sum())
        c["replaced"] += int(o.replaced.sum())
        c["found"] += int((o.rtd_correct & o.replaced).sum())
        c["flagged"] += int(((o.rtd_logits > 0) & tokens).sum())
    model.train(was_training)
    n = max(1, c["n"])
    return {"eval_rtd_loss": c["loss"] / n, "eval_rtd_acc": c["hit"] / n,
            "eval_rtd_original_acc": 1 - c["replaced"] / n,  # always "original": the bar to clear
            "eval_rtd_replaced_recall": c["found"] / max(1, c["replaced"]),
            "eval_rtd_precision": c["found"] / max(1, c["flagged"]), "eval_rtd_tokens": c["n"]}
