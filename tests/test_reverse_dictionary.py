"""The word task as a reverse dictionary (--option head=encoder): the contrastive loss against a
plain reference, the candidate cache against fresh encodings, a word never trained on ranked
first, and predict from a saved folder equal to the model in memory."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertkit.cli import main
from bertkit.tasks.candidates import contrastive_loss, ranks

WORDS = ["cat", "dog", "horse", "mouse", "bird", "fish", "tree", "stone", "river", "cloud"]


def _reference_loss(phrases, targets, cache, keys, labels, temperature):
    """One row at a time: the target's cosine against the batch's other words and every cached
    candidate but the target's own row."""
    losses = []
    for i in range(len(keys)):
        scores = [float(phrases[i] @ targets[i])]
        scores += [float(phrases[i] @ targets[j]) for j in range(len(keys)) if j != i and keys[j] != keys[i]]
        scores += [float(phrases[i] @ cache[n]) for n in range(len(cache)) if n != labels[i]]
        logits = torch.tensor(scores, dtype=torch.float64) / temperature
        losses.append(-F.log_softmax(logits, 0)[0])
    return torch.stack(losses).mean()


def test_contrastive_loss_equals_a_plain_reference():
    g = torch.Generator().manual_seed(0)
    unit = lambda *shape: F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)  # noqa: E731
    phrases, targets, cache = unit(6, 8), unit(6, 8), unit(20, 8)
    keys = torch.tensor([3, 5, 3, 21, 7, 22])     # rows 0 and 2 share a word; 21, 22: words outside the cache
    labels = torch.tensor([3, 5, 3, -100, 7, -100])
    got = contrastive_loss(phrases, targets, cache, keys, labels, 0.05)
    assert float(got) == pytest.approx(float(_reference_loss(phrases, targets, cache, keys, labels, 0.05)), rel=1e-9)


def test_ranks_count_ties_against_the_target():
    scores = torch.tensor([[0.1, 0.9, 0.5], [0.7, 0.7, 0.1], [0.3, 0.2, 0.1]])
    assert ranks(scores, torch.tensor([1, 0, -100])).tolist() == [1, 2, 0]


@pytest.fixture(scope="module")
def dictionary(tmp_path_factory, tiny_bert):
    """A tiny BERT fine-tuned as a reverse dictionary on phrases naming half of WORDS; the other
    half are candidates that are never a target."""
    root = tmp_path_factory.mktemp("dictionary")
    train = root / "train.jsonl"
    rows = [{"text": f"the word {w}", "word": w} for w in WORDS[:5]] * 4
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    words = root / "words.txt"
    words.write_text("\n".join(WORDS) + "\n")
    out = root / "model"
    assert main(["finetune", "word", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
                 "--out", str(out), "--epochs", "2", "--batch-size", "4", "--lr", "1e-3",  # head=encoder: the default
                 "--option", f"words={words}", "--seed", "1"]) == 0
    return out, train


def test_the_saved_cache_equals_fresh_encodings_and_predict_equals_the_model_in_memory(dictionary, capsys):
    from bertkit.inference.encode import Encoder
    from bertkit.tasks.folder import load_task_model
    from bertkit.tasks.runner import run_task
    out, _ = dictionary
    task, model, tok = load_task_model(out, "word")
    info = json.loads((out / "bertkit.json").read_text())
    assert info["head"] == "encoder" and info["candidate_words"] == sorted(WORDS)
    assert bool(model.head.fresh)  # the last evaluation refreshed it, and so it was saved
    fresh = Encoder(model.bert, tok, pooling=info["pooling"], normalize=True).encode(info["candidate_words"])
    np.testing.assert_allclose(model.head.vectors.numpy(), fresh, atol=1e-5)
    # predict from the folder, and the same texts through the model in memory
    capsys.readouterr()
    texts = ["the word cat", "the word tree"]
    assert main(["predict", "word", "--model", str(out), *texts]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    examples = task.read_inputs(texts=texts)
    preds, _ = run_task(task, model, task.features(examples, tok, 32), examples, tok)
    for got, want in zip(printed, preds):
        assert [t["word"] for t in got["top"]] == [t["word"] for t in want["top"]]
        assert [t["score"] for t in got["top"]] == pytest.approx([t["score"] for t in want["top"]], abs=1e-6)
        assert len(got["top"]) == 10 and set(t["word"] for t in got["top"]) == set(WORDS)


def test_a_word_never_trained_on_ranks_first_when_the_phrase_means_it(dictionary, capsys):
    """Built for it: the phrase is the untrained word itself, and the phrase and the candidates
    go through one encoder, so the word's own vector is the nearest. A head of trained rows
    (head=vocab) cannot name a word no example taught."""
    out, _ = dictionary
    for word in WORDS[5:]:
        assert main(["predict", "word", "--model", str(out), word]) == 0
        assert json.loads(capsys.readouterr().out)["word"] == word


def test_evaluate_reports_ranks_over_the_candidates(dictionary, capsys, tmp_path):
    out, train = dictionary
    unseen = tmp_path / "unseen.jsonl"
    unseen.write_text("".join(json.dumps({"text": w, "word": w}) + "\n" for w in WORDS[5:]) +
                      json.dumps({"text": "a word outside", "word": "zebra"}) + "\n")
    assert main(["evaluate", "word", "--model", str(out), "--data", str(unseen)]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert metrics["candidates"] == 10 and metrics["not_candidates"] == 1 and metrics["examples"] == 6
    assert metrics["acc@1"] == pytest.approx(5 / 6) and metrics["median_rank"] == 1
    assert "1 of 6 target word(s) are not among the 10 candidate words ('zebra')" in captured.err


def test_predict_and_the_server_give_the_top_k_words(dictionary, capsys):
    """`predict word --top-k K` and the server's top_k: K words best first, the same from both;
    more than there are candidates gives every candidate; another task refuses the option."""
    from fastapi.testclient import TestClient

    from bertkit.inference.serve import ServeConfig, create_app
    out, _ = dictionary
    capsys.readouterr()
    assert main(["predict", "word", "--model", str(out), "--top-k", "3", "the word cat"]) == 0
    top = json.loads(capsys.readouterr().out)["top"]
    assert len(top) == 3 and [t["score"] for t in top] == sorted((t["score"] for t in top), reverse=True)
    assert main(["predict", "word", "--model", str(out), "--top-k", "50", "the word cat"]) == 0
    assert sorted(t["word"] for t in json.loads(capsys.readouterr().out)["top"]) == sorted(WORDS)
    assert main(["predict", "word", "--model", str(out), "--top-k", "0", "the word cat"]) == 2
    assert "--top-k 0: must be at least 1" in capsys.readouterr().err
    assert main(["predict", "classify", "--model", str(out), "--top-k", "3", "x"]) == 2
    assert "--top-k 3: words per text, an option of the word task" in capsys.readouterr().err
    with TestClient(create_app(ServeConfig(model=str(out))), raise_server_exceptions=False) as c:
        r = c.post("/predict", json={"inputs": ["the word cat", "the word tree"], "top_k": 3})
        assert r.status_code == 200, r.text
        served = r.json()["predictions"]
        assert [t["word"] for t in served[0]["top"]] == [t["word"] for t in top]
        assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(served[0]["top"], top))
        assert len(served[1]["top"]) == 3
        assert len(c.post("/predict", json={"inputs": ["the word cat"]}).json()["predictions"][0]["top"]) == 10
        r = c.post("/predict", json={"inputs": ["the word cat"], "top_k": 101})
        assert r.status_code == 422 and "top_k: 101 is over the limit of 100" in r.json()["error"]


def test_a_words_file_with_two_words_on_a_line_is_refused_by_line(tmp_path, tiny_bert, capsys):
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"text": "a cat", "word": "cat"}) + "\n")
    words = tmp_path / "words.txt"
    words.write_text("cat\nbig dog\n")
    assert main(["finetune", "word", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
                 "--out", str(tmp_path / "o"), "--option", "head=encoder", "--option", f"words={words}"]) == 2
    assert f"{words}, line 2: one word per line, found 'big dog'" in capsys.readouterr().err
