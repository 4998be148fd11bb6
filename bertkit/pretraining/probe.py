"""Is a pretraining run worth anything downstream? A linear probe in seconds, at the end of a run.

The model's mean-pooled vectors of rotten-tomatoes reviews (the built-in binary sentiment set)
feed a logistic regression trained on 2,000 training reviews and scored on the 1,275 dev
reviews; the same architecture and vocabulary with random weights is probed beside it. The gap
is what the minutes of pretraining bought for a task; a fine-tune (`bertkit finetune`) goes
further than a probe of frozen vectors, and benchmarks/pretrain_value.py measures that.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import torch

from ..errors import BertkitError
from ..inference.encode import Encoder
from ..model import BertModel, init_weights
from ..tokenizer import WordPieceTokenizer

PROBE_TRAIN = 2000
PROBE_MIN_RUN_S = 60  # runs shorter than this (smoke tests, a few steps) end without the probe
PROBE_MAX_LEN = 64  # review snippets: 98% of them fit (the probe needs their gist, not every token)


def probe_data() -> dict[str, tuple[list[str], np.ndarray]]:
    """rotten-tomatoes' first PROBE_TRAIN training reviews and its dev split: (texts, 0/1 labels)."""
    from ..data import rotten_tomatoes
    built = rotten_tomatoes.build()  # BertkitError naming the package to install when it is missing
    data = {}
    for split, cap in (("train", PROBE_TRAIN), ("dev", None)):
        rows = [json.loads(line) for line in built.files[f"{split}.jsonl"].split("\n") if line.strip()][:cap]
        data[split] = ([r["text"] for r in rows], np.array([r["label"] == "fresh" for r in rows], dtype=np.int64))
    return data


def logistic_regression_accuracy(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                                 y_test: np.ndarray, l2: float = 1.0) -> float:
    """Binary logistic regression on standardised features, L2-penalised as scikit-learn's default
    (C = 1: the summed loss plus half the squared weights), fitted by L-BFGS; test accuracy."""
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    xt = torch.from_numpy((x_train - mean) / std).double()
    yt = torch.from_numpy(y_train).double()
    w = torch.zeros(xt.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(xt @ w + b, yt, reduction="sum") \
            + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        logits = torch.from_numpy((x_test - mean) / std).double() @ w + b
    return float(((logits > 0).long().numpy() == y_test).mean())


def linear_probe(model: BertModel, tokenizer: WordPieceTokenizer, seed: int = 0) -> dict:
    """Probe accuracy of `model` and of the same architecture with random weights (BERT's
    initialisation, seeded), on the rotten-tomatoes dev reviews."""
    data = probe_data()
    device = next(model.parameters()).device
    random_model = BertModel(model.config)
    torch.manual_seed(seed)
    init_weights(random_model, model.config)
    result = {"task": "rotten-tomatoes, linear probe on mean-pooled vectors",
              "train": len(data["train"][0]), "dev": len(data["dev"][0])}
    for name, m in (("accuracy", model), ("random_weights_accuracy", random_model)):
        encoder = Encoder(m, tokenizer, pooling="mean", device=device)
        with warnings.catch_warnings():  # the few reviews past PROBE_MAX_LEN are cut on purpose
            warnings.filterwarnings("ignore", message=".*were truncated")
            x = {s: encoder.encode(texts, max_len=min(PROBE_MAX_LEN, model.config.max_position_embeddings))
                 for s, (texts, _) in data.items()}
        result[name] = logistic_regression_accuracy(x["train"], data["train"][1], x["dev"], data["dev"][1])
    result["majority_accuracy"] = float(max(data["dev"][1].mean(), 1 - data["dev"][1].mean()))
    return result


def report(model: BertModel, tokenizer: WordPieceTokenizer, print_=print) -> dict | None:
    """The probe, printed in one line; None (and a line saying why) where its data is not installed."""
    try:
        result = linear_probe(model, tokenizer)
    except BertkitError as e:
        print_(f"downstream check skipped: {e}")
        return None
    print_(f"downstream check ({result['task']}, {result['train']:,} training reviews, {result['dev']:,} dev): "
           f"accuracy {result['accuracy']:.3f}; the same model with random weights {result['random_weights_accuracy']:.3f}; "
           f"always the more common label {result['majority_accuracy']:.3f}")
    return result
