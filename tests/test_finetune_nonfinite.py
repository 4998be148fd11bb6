"""Fine-tuning with non-finite values: a NaN/inf loss or gradient is caught before opt.step
(the step is skipped and counted; a run of them stops the run), and a NaN evaluation metric
never keeps the run from saving a model."""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bertkit.finetune
from bertkit.errors import BertkitError
from bertkit.finetune import FinetuneConfig, finetune
from bertkit.tasks.classify import ClassifyTask
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.training.loop import MAX_BAD_STEPS

WORDS = ["a", "good", "great", "fine", "film", "bad", "dull", "awful", "plot"]
ROWS = [("a good film", "pos"), ("a bad plot", "neg"), ("great fine film", "pos"), ("dull awful plot", "neg")] * 4


@pytest.fixture(scope="module")
def small_model(tmp_path_factory, tiny_bert_factory):
    """A 2-layer, 32-wide random BERT over a 14-token vocabulary: a fine-tuning step is milliseconds."""
    root = tmp_path_factory.mktemp("nonfinite")
    vocab = root / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]))
    tok = WordPieceTokenizer.from_vocab(vocab, lowercase=True)
    folder = tiny_bert_factory.folder(root / "model", tokenizer=tok, vocab_size=tok.vocab_size,
                                      max_position_embeddings=64)
    data = root / "train.csv"
    data.write_text("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in ROWS))
    return folder, data


def _run(small_model, out, **kw):
    folder, data = small_model
    cfg = FinetuneConfig(task="classify", model=str(folder), train=str(data), eval=str(data), out=str(out),
                         epochs=kw.pop("epochs", 2), batch_size=4, lr=1e-3, max_len=16, log_every=1, progress=False,
                         **kw)
    return finetune(cfg)


def _strict_json_lines(path):
    def refuse(name):
        raise AssertionError(f"{path}: {name} is not JSON")
    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def _saved_weights_finite(out):
    tensors = load_file(str(out / "model.safetensors"))
    return tensors and all(torch.isfinite(t).all() for t in tensors.values())


def _poison_training_calls(monkeypatch, which, how):
    """Make ClassifyTask.forward's training calls number `which(n)` non-finite: `how` is
    "loss" (a NaN loss) or "grad" (a finite loss whose gradient is NaN)."""
    original = ClassifyTask.forward
    calls = {"n": 0}

    def forward(self, model, batch):
        loss, out = original(self, model, batch)
        if model.training:
            calls["n"] += 1
            if which(calls["n"]):
                if how == "loss":
                    loss = loss * float("nan")
                else:  # sqrt at 0: a value of 0, an infinite derivative; times 0 a NaN gradient
                    loss = loss + torch.sqrt(model.bert.embeddings.word.weight.sum() * 0.0)
        return loss, out

    monkeypatch.setattr(ClassifyTask, "forward", forward)
    return calls


@pytest.mark.parametrize("how", ["loss", "grad"])
def test_one_nonfinite_step_is_skipped_and_counted(tmp_path, small_model, monkeypatch, how):
    calls = _poison_training_calls(monkeypatch, lambda n: n == 2, how)
    out = tmp_path / "out"
    summary = _run(small_model, out)
    assert calls["n"] == 8  # 16 examples / 4 per batch * 2 epochs: the run went on
    assert summary["skipped_steps"] == 1 and summary["steps"] == 8
    saved = json.loads((out / "summary.json").read_text())
    assert saved["skipped_steps"] == 1
    records = _strict_json_lines(out / "metrics.jsonl")
    train = [r for r in records if "loss" in r]
    assert [r["skipped_steps"] for r in train] == [0] + [1] * (len(train) - 1)
    assert 2 not in [r["step"] for r in train]  # the skipped step's window is logged with the next one
    assert all(math.isfinite(r["loss"]) for r in train)
    assert _saved_weights_finite(out)


def test_nonfinite_step_never_reaches_the_weights(tmp_path, small_model, monkeypatch):
    # every step poisoned but stopped before the limit: the weights are the initial ones
    _poison_training_calls(monkeypatch, lambda n: True, "grad")
    seen = []
    original_step = torch.optim.AdamW.step

    def step(self, *a, **k):
        seen.append(1)
        return original_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    with pytest.raises(BertkitError):
        _run(small_model, tmp_path / "out")
    assert seen == []


@pytest.mark.parametrize("how", ["loss", "grad"])
def test_nonfinite_steps_in_a_row_stop_with_lower_lr_advice(tmp_path, small_model, monkeypatch, how):
    calls = _poison_training_calls(monkeypatch, lambda n: n >= 3, how)
    with pytest.raises(BertkitError) as err:
        _run(small_model, tmp_path / "out", epochs=3)
    msg = str(err.value)
    assert calls["n"] == 2 + MAX_BAD_STEPS
    assert f"{MAX_BAD_STEPS} steps in a row" in msg and "lower --lr" in msg and "1e-4" in msg.replace("0.0001", "1e-4")


def test_skips_that_are_not_in_a_row_do_not_stop(tmp_path, small_model, monkeypatch):
    # every other step non-finite: 6 of 12 skipped, never 5 in a row
    _poison_training_calls(monkeypatch, lambda n: n % 2 == 0, "loss")
    summary = _run(small_model, tmp_path / "out", epochs=3)
    assert summary["skipped_steps"] == 6
    assert _saved_weights_finite(tmp_path / "out")


def _metrics_sequence(monkeypatch, nan_epochs):
    """ClassifyTask.metrics with the primary metric (accuracy) NaN at the given epochs; and a
    record of which epochs saved a model."""
    original = ClassifyTask.metrics
    epoch = {"n": 0}

    def metrics(self, predictions, examples):
        epoch["n"] += 1
        scores = original(self, predictions, examples)
        if epoch["n"] in nan_epochs:
            scores["accuracy"] = float("nan")
        return scores

    monkeypatch.setattr(ClassifyTask, "metrics", metrics)
    saves = []
    original_save = bertkit.finetune.save_task_model

    def save(model, task, tokenizer, folder):
        if Path(folder).parent.name != "checkpoints":  # the run's model in OUT, not a checkpoint
            saves.append(epoch["n"])
        return original_save(model, task, tokenizer, folder)

    monkeypatch.setattr(bertkit.finetune, "save_task_model", save)
    return saves


def test_nan_metric_then_a_number_saves_the_second_epoch(tmp_path, small_model, monkeypatch):
    saves = _metrics_sequence(monkeypatch, {1})
    out = tmp_path / "out"
    summary = _run(small_model, out)
    assert saves == [2]
    assert summary["best_epoch"] == 2 and isinstance(summary["best_accuracy"], float)
    assert (out / "model.safetensors").is_file() and (out / "bertkit.json").is_file()
    evals = [r for r in _strict_json_lines(out / "metrics.jsonl") if "eval_loss" in r]
    assert evals[0]["eval_accuracy"] is None and evals[1]["eval_accuracy"] is not None
    json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))


def test_a_nan_metric_never_replaces_a_real_one(tmp_path, small_model, monkeypatch):
    saves = _metrics_sequence(monkeypatch, {2})
    summary = _run(small_model, tmp_path / "out")
    assert saves == [1] and summary["best_epoch"] == 1


@pytest.mark.parametrize("patience", [None, 1])
def test_nan_metric_at_every_epoch_still_saves_the_last_model(tmp_path, small_model, monkeypatch, patience):
    saves = _metrics_sequence(monkeypatch, {1, 2, 3})
    out = tmp_path / "out"
    summary = _run(small_model, out, epochs=3, patience=patience)
    last = summary["epochs_run"]
    assert last == (3 if patience is None else 1)
    assert saves == [last] and summary["best_epoch"] == last
    assert summary["best_accuracy"] is None
    assert "NaN" in summary["note"] and "saved the last epoch's model" in summary["note"]
    for name in ("model.safetensors", "config.json", "bertkit.json", "vocab.txt", "summary.json", "loss.png"):
        assert (out / name).is_file(), name
    assert _saved_weights_finite(out)
