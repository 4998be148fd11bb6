"""Pretraining's held-out figures: MLM and NSP (or ELECTRA's generator and detection) on fixed
held-out batches, in fp32."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import electra
from .masking import prediction_kinds


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


def evaluate_objective(model, batches: list[dict], device, mask_id: int, seed: int) -> dict:
    """The objective's held-out figures: BERT's MLM and NSP, or ELECTRA's generator MLM (its
    NSP head is never trained) and the discriminator's detection."""
    if not isinstance(model, electra.ElectraForPreTraining):
        return evaluate(model, batches, device, mask_id)
    figures = {k: v for k, v in evaluate(model.generator, batches, device, mask_id).items() if "nsp" not in k}
    return {**figures, **electra.evaluate_rtd(model, batches, device, seed)}

