"""One fine-tuning loop for every task: tiny end-to-end finetune -> evaluate -> predict runs."""
import json

import pytest
import torch

from bertkit import BertModel, save_model
from bertkit.cli import main
from bertkit.model import init_weights
from bertkit.tokenizer import WordPieceTokenizer
from conftest import hf_tester_config


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_folder):
    """A 2-layer, 32-wide random BERT with the real uncased vocabulary: seconds to fine-tune."""
    folder = tmp_path_factory.mktemp("tiny_bert")
    cfg = hf_tester_config(vocab_size=30522, max_position_embeddings=512)
    torch.manual_seed(0)
    model = BertModel(cfg)
    init_weights(model, cfg)
    save_model(model, folder, tokenizer=WordPieceTokenizer.from_folder(minilm_folder))
    return folder


def _run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_classify_end_to_end(tmp_path, tiny_bert, capsys):
    rows = [("a wonderful, moving film", "fresh"), ("dull and far too long", "rotten"),
            ("the best thing this year", "fresh"), ("a tedious mess", "rotten")] * 4
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f'"{t}",{lab}\n' for t, lab in rows))
    out = tmp_path / "model"
    _run(capsys, "finetune", "classify", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
         "--out", str(out), "--epochs", "2", "--batch-size", "4", "--lr", "1e-3")
    for name in ("model.safetensors", "config.json", "bertkit.json", "vocab.txt", "metrics.jsonl", "summary.json", "loss.png"):
        assert (out / name).is_file(), name
    metrics = json.loads(_run(capsys, "evaluate", "classify", "--model", str(out), "--data", str(train)))
    assert {"accuracy", "macro_f1", "confusion_matrix"} <= set(metrics)
    preds = [json.loads(line) for line in _run(capsys, "predict", "classify", "--model", str(out),
                                                 "a moving film", "tedious").splitlines()]
    assert len(preds) == 2 and all(p["label"] in ("fresh", "rotten") for p in preds)
    assert abs(sum(preds[0]["scores"].values()) - 1) < 1e-5
    # the pooler + linear head is transformers' BertForSequenceClassification: same logits there
    from transformers import BertForSequenceClassification
    from bertkit.finetune import load_task_model
    hf = BertForSequenceClassification.from_pretrained(str(out)).eval()
    task, model, tok = load_task_model(out)
    batch = tok.encode(["a moving film", "tedious and dull"])
    with torch.no_grad():
        ours = task.forward(model, {**batch.model_inputs(), "labels": torch.tensor([-100, -100])})[1]
        theirs = hf(**batch.model_inputs()).logits.softmax(-1)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert hf.config.id2label == {0: "fresh", 1: "rotten"}
