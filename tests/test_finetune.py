"""One fine-tuning loop for every task: tiny end-to-end finetune -> evaluate -> predict runs."""
import json
import math

import pytest
import torch
from helpers import sentence_transformers_copy

from bertkit import BertModel
from bertkit.cli import main
from bertkit.model import init_weights
from bertkit.tokenizer import WordPieceTokenizer


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

    from bertkit.tasks.folder import load_task_model
    hf = BertForSequenceClassification.from_pretrained(str(out)).eval()
    task, model, tok = load_task_model(out)
    batch = tok.encode(["a moving film", "tedious and dull"])
    with torch.no_grad():
        ours = task.forward(model, {**batch.model_inputs(), "labels": torch.tensor([-100, -100])})[1]
        theirs = hf(**batch.model_inputs()).logits.softmax(-1)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    assert hf.config.id2label == {0: "fresh", 1: "rotten"}


CONLL = """EU B-org
rejects O
German B-misc
call O
to O
boycott O
British B-misc
lamb O

Peter B-person
Blackburn I-person
visited O
Paris B-geo-loc

"""


@pytest.mark.parametrize("task", ["ner", "tag"])
def test_token_tasks_end_to_end(tmp_path, tiny_bert, capsys, task):
    data = tmp_path / "train.conll"
    data.write_text(CONLL * 4)
    out = tmp_path / task
    _run(capsys, "finetune", task, "--model", str(tiny_bert), "--train", str(data), "--eval", str(data),
         "--out", str(out), "--epochs", "2", "--batch-size", "4", "--lr", "1e-3")
    metrics = json.loads(_run(capsys, "evaluate", task, "--model", str(out), "--data", str(data)))
    assert {"precision", "recall", "f1"} <= set(metrics)
    preds = [json.loads(line) for line in _run(capsys, "predict", task, "--model", str(out),
                                                 "Peter Blackburn visited unbelievably Paris").splitlines()]
    assert len(preds[0]["tags"]) == 5  # one tag per word, although "unbelievably" splits into pieces
    from bertkit.tasks.ner import entities  # and the entity spans those tags mark, as evaluation reads them
    words = "Peter Blackburn visited unbelievably Paris".split()
    assert preds[0]["entities"] == [{"type": k, "start": a, "end": b, "text": " ".join(words[a:b])}
                                    for k, a, b in entities(preds[0]["tags"])]
    if task == "tag":
        tags = preds[0]["tags"]
        for prev, cur in zip(["O"] + tags, tags):  # the CRF never produces an invalid BIO sequence
            assert not cur.startswith("I-") or prev[2:] == cur[2:]


def test_label_alignment_on_words_split_into_pieces(minilm_folder):
    from bertkit.tasks.ner import NerTask
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    task = NerTask()
    examples = [{"words": ["Unbelievably", "Blackburn", "won"], "tags": ["O", "B-person", "O"]}]
    task.fit(examples, {})
    f = task.features(examples, tok, 32)[0]
    pieces = [tok.id_to_token(i) for i in f["input_ids"]]
    labelled = [(p, task.info["labels"][lab]) for p, lab in zip(pieces, f["labels"]) if lab != -100]
    assert labelled == [("unbelievably", "O"), ("blackburn", "B-person"), ("won", "O")] or \
        [p for p, _ in labelled] == [pieces[s] for s in f["word_starts"]]
    # only first pieces carry labels; every other piece is ignored in the loss
    assert sum(lab != -100 for lab in f["labels"]) == 3
    assert all(not pieces[s].startswith("##") for s in f["word_starts"])


def test_classify_features_of_a_text_do_not_depend_on_the_others_in_the_call(minilm_folder):
    """The server joins requests with and without text_pair into one call: a single text stays
    [CLS] A [SEP] (it once became [CLS] A [SEP] [SEP], a pair with an empty second text)."""
    from bertkit.tasks.classify import ClassifyTask
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    task = ClassifyTask()
    task.info["labels"] = ["neg", "pos"]
    single = {"text": "a fine film", "text_pair": None}
    pair = {"text": "a fine film", "text_pair": "it was fine"}
    alone = [task.features([x], tok, 32)[0] for x in (single, pair)]
    mixed = task.features([pair, single, pair], tok, 32)
    assert mixed == [alone[1], alone[0], alone[1]]
    assert [tok.id_to_token(i) for i in alone[0]["input_ids"]] == ["[CLS]", "a", "fine", "film", "[SEP]"]


@pytest.mark.parametrize("task_name", ["ner", "tag"])
@pytest.mark.parametrize("invisible", ["\u200b", "\u00ad", "\ufe0f"])
def test_zero_piece_words_do_not_shift_labels(minilm_folder, tiny_bert_factory, capsys, task_name, invisible):
    # a word the normaliser drops entirely has no first piece: labels and predictions must stay
    # keyed by word id, not by the k-th first piece
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tasks.runner import run_task
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    task = get_task(task_name)()
    examples = [{"words": ["the", invisible, "cat"], "tags": ["O", "O", "B-animal"]},
                {"words": [invisible], "tags": ["O"]}]
    task.fit(examples, {})
    labels = task.info["labels"]
    feats = task.features(examples, tok, 32)
    assert "2 word(s) tokenize to no word piece" in capsys.readouterr().err  # counted, like truncation
    f = feats[0]
    pieces = [tok.id_to_token(i) for i in f["input_ids"]]
    assert [(p, labels[lab]) for p, lab in zip(pieces, f["labels"]) if lab != -100] == [("the", "O"), ("cat", "B-animal")]
    assert [labels[lab] for lab in f["word_labels"]] == ["O", "B-animal"] and f["word_ids"] == [0, 2]
    # decoding places the k-th first-piece prediction on its word; the dropped word is "O"
    b = labels.index("B-animal")
    assert task.decode([[[b, b], []]], feats, examples) == [["B-animal", "O", "B-animal"], ["O"]]
    # and a whole model run gives one prediction per input word, for both heads
    cfg = tiny_bert_factory.config(vocab_size=30522)
    torch.manual_seed(0)
    bert = BertModel(cfg)
    model = TaskModel(bert, task.head(cfg, bert))
    init_weights(model, cfg)
    preds, loss = run_task(task, model, feats, examples, tok)
    assert [len(p) for p in preds] == [3, 1] and preds[0][1] == "O" and preds[1] == ["O"]
    assert loss is not None and loss == loss  # finite: the all-dropped sentence is skipped, not NaN


def _word_data(tmp_path):
    """Twelve phrase -> word rows, as a JSONL file."""
    rows = [{"text": "large", "word": "size"}, {"text": "heavy", "word": "weight"},
            {"text": "very tall", "word": "height"}, {"text": "wide", "word": "width"}] * 3
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def test_word_task_end_to_end_with_the_vocabulary_head(tmp_path, tiny_bert, capsys):
    data = _word_data(tmp_path)
    out = tmp_path / "word"
    _run(capsys, "finetune", "word", "--model", str(tiny_bert), "--train", str(data), "--eval", str(data),
         "--out", str(out), "--epochs", "3", "--batch-size", "4", "--lr", "3e-3", "--option", "head=vocab")
    assert json.loads((out / "bertkit.json").read_text())["head"] == "vocab"
    metrics = json.loads(_run(capsys, "evaluate", "word", "--model", str(out), "--data", str(data)))
    assert {"acc@1", "acc@5"} <= set(metrics) and metrics["acc@5"] >= metrics["acc@1"]
    pred = json.loads(_run(capsys, "predict", "word", "--model", str(out), "large").splitlines()[0])
    assert len(pred["top"]) == 10 and not pred["word"].startswith("##")


def test_word_head_options_take_away_what_favours_the_seen_targets(tiny_bert):
    """bias=false: no trainable output bias (zeros kept in the weights); frozen_decoder: the head
    reads the word embeddings but sends them no gradient; hub_correction: training keeps a
    running mean of each word's score, which prediction takes off. The default head does none."""
    import torch.nn.functional as F

    from bertkit.config import load_config
    from bertkit.folders import load_model
    from bertkit.tasks import get_task
    from bertkit.tasks.word import HUB_MOMENTUM
    cfg = load_config(tiny_bert)
    for options, trains_bias, moves_embeddings, corrects in (({}, True, True, False),
                                                             ({"bias": False, "frozen_decoder": True,
                                                               "hub_correction": True}, False, False, True)):
        bert, _ = load_model(tiny_bert, heads=False)
        task = get_task("word")(options)
        head = task.head(cfg, bert)
        task.init_head(head, cfg)
        assert ("bias" in dict(head.named_parameters())) == trains_bias and "bias" in head.state_dict()
        torch.manual_seed(0)
        cls = torch.randn(4, cfg.hidden_size, requires_grad=True)
        head.train()
        logits = head(cls)
        F.cross_entropy(logits, torch.tensor([1, 2, 3, 4])).backward()
        assert cls.grad is not None and cls.grad.abs().sum() > 0
        assert (bert.embeddings.word.weight.grad is not None) == moves_embeddings
        raw = F.linear(head.norm(F.gelu(head.dense(cls))), bert.embeddings.word.weight, head.bias).detach()
        assert ("hub" in head.state_dict()) == corrects  # a default head's folder holds what it always held
        if corrects:
            torch.testing.assert_close(head.hub, torch.zeros_like(raw[0]).lerp(raw.mean(0), HUB_MOMENTUM))
        head.eval()
        with torch.no_grad():
            torch.testing.assert_close(head(cls), raw - head.hub if corrects else raw)


def test_word_negatives_targets_ranks_the_target_among_the_training_targets_only(tiny_bert):
    """negatives=targets: the training loss is the softmax over the training file's target words
    (a word never seen as a target is not pushed down); evaluation's loss and the predictions
    still range over every whole word."""
    import torch.nn.functional as F

    from bertkit.config import load_config
    from bertkit.folders import load_model
    from bertkit.model import set_dropout
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tokenizer import load_tokenizer
    cfg, tok = load_config(tiny_bert), load_tokenizer(tiny_bert)
    train = [{"text": "large", "word": "size"}, {"text": "heavy", "word": "weight"}, {"text": "wide", "word": "Width"}]
    task = get_task("word")()
    task.fit(train, {"negatives": "targets"})
    assert task.info["train_targets"] == ["Width", "size", "weight"]
    bert, _ = load_model(tiny_bert, heads=False)
    model = TaskModel(bert, task.head(cfg, bert))
    task.init_head(model.head, cfg)
    set_dropout(model, 0.0)
    ids = sorted(tok.token_to_id(w) for w in ("size", "weight", "width"))  # "Width" as the uncased vocabulary has it

    def logits_of(batch):
        cls = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).sequence_output[:, 0]
        return model.head(cls).float()
    batch = task.collate(task.features(train, tok, 16), tok)
    assert batch["negatives"].nonzero().flatten().tolist() == ids
    model.train()
    loss, _ = task.forward(model, batch)
    among = logits_of(batch)[:, ids]  # (3, 3): each row's score for the three targets
    torch.testing.assert_close(loss, F.cross_entropy(among, torch.tensor([ids.index(i) for i in batch["labels"].tolist()])))
    # evaluation: a target never trained on ("temperature") is scored against every word
    batch = task.collate(task.features(train + [{"text": "hot", "word": "temperature"}], tok, 16), tok)
    model.eval()
    with torch.no_grad():
        loss, (top, _) = task.forward(model, batch)
        torch.testing.assert_close(loss, F.cross_entropy(logits_of(batch), batch["labels"]))
    assert torch.isfinite(loss) and top.shape == (4, 10)


def test_word_head_options_round_trip_and_the_mlm_transform(tmp_path, tiny_bert, minilm_folder, capsys):
    """The options go into the folder: evaluate and predict apply the saved running mean. The
    transform starts from the base folder's MLM head where it has one; without one the option is
    refused by name."""
    from bertkit import save_model
    from bertkit.config import load_config
    from bertkit.model import BertForPreTraining
    from bertkit.tasks import get_task
    from bertkit.tasks.folder import load_task_model
    data = _word_data(tmp_path)
    out = tmp_path / "word"
    _run(capsys, "finetune", "word", "--model", str(tiny_bert), "--train", str(data), "--eval", str(data),
         "--out", str(out), "--epochs", "2", "--batch-size", "4", "--lr", "3e-3", "--option", "head=vocab",
         "--option", "bias=false", "--option", "frozen_decoder=true", "--option", "hub_correction=true")
    task, model, _ = load_task_model(out)
    assert task.info["hub_correction"] and model.head.hub.abs().sum() > 0 and not model.head.bias.any()
    metrics = json.loads(_run(capsys, "evaluate", "word", "--model", str(out), "--data", str(data)))
    assert 0 <= metrics["acc@1"] <= metrics["acc@5"] <= 1
    # transform=mlm: from a folder with a trained MLM head ...
    cfg = load_config(tiny_bert)
    torch.manual_seed(1)
    pretrained = BertForPreTraining(cfg)
    init_weights(pretrained, cfg)
    with torch.no_grad():
        pretrained.mlm.dense.weight.normal_()
        pretrained.mlm.norm.bias.fill_(0.5)
    save_model(pretrained, tmp_path / "pretrained", tokenizer=WordPieceTokenizer.from_folder(minilm_folder))
    task = get_task("word")({"transform": "mlm", "base_model": str(tmp_path / "pretrained")})
    head = task.head(cfg, pretrained.bert)
    task.init_head(head, cfg)
    assert torch.equal(head.dense.weight, pretrained.mlm.dense.weight)
    assert torch.equal(head.norm.bias, pretrained.mlm.norm.bias)
    # ... and refused for one without
    task = get_task("word")({"transform": "mlm", "base_model": str(tiny_bert)})
    with pytest.raises(Exception, match="has no trained MLM head"):
        task.init_head(task.head(cfg, pretrained.bert), cfg)
    assert main(["finetune", "word", "--model", str(tiny_bert), "--train", str(data), "--eval", str(data),
                 "--out", str(tmp_path / "bad"), "--option", "transform=mlp"]) == 2
    assert "transform='mlp': expected one of random, mlm" in capsys.readouterr().err
    # an option of the other head is refused by name, before anything is written
    for given, want in ((["bias=false"], "--option bias: an option of head=vocab, and this run's head is encoder"),
                        (["head=vocab", "words=w.txt"], "--option words: an option of head=encoder, and this run's "
                                                        "head is vocab")):
        assert main(["finetune", "word", "--model", str(tiny_bert), "--train", str(data), "--eval", str(data),
                     "--out", str(tmp_path / "bad"), *[a for g in given for a in ("--option", g)]]) == 2
        assert want in capsys.readouterr().err
        assert not (tmp_path / "bad" / "bertkit.json").exists()


def test_summarize_end_to_end(tmp_path, tiny_bert, capsys):
    docs = [{"sentences": ["BERT is a language model.", "It was trained on books.", "The weather was nice.",
                           "It reads text in both directions."], "labels": [1, 0, 0, 1]}] * 6
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    out = tmp_path / "summ"
    _run(capsys, "finetune", "summarize", "--model", str(tiny_bert), "--train", str(data), "--eval", str(data),
         "--out", str(out), "--epochs", "2", "--batch-size", "2", "--lr", "1e-3", "--option", "k=2")
    metrics = json.loads(_run(capsys, "evaluate", "summarize", "--model", str(out), "--data", str(data)))
    assert {"rouge1", "rouge2", "rougeL"} <= set(metrics)
    pred = json.loads(_run(capsys, "predict", "summarize", "--model", str(out),
                           "BERT is a model. It reads text. Cats sleep a lot.").splitlines()[0])
    assert len(pred["summary"]) == 2 and pred["selected"] == sorted(pred["selected"])
    assert pred["sentences"] == pred["sentences_scored"] == 3
    # a document past max_len is scored on its first sentences only, and says so
    long_doc = " ".join(f"Sentence number {i} is here." for i in range(40))
    pred = json.loads(_run(capsys, "predict", "summarize", "--model", str(out), "--max-len", "64",
                           long_doc).splitlines()[0])
    assert pred["sentences"] == 40 and 2 <= pred["sentences_scored"] < 40


def test_qa_end_to_end(tmp_path, tiny_bert, capsys):
    from bertkit.data.squad_subset import squad_subset_file
    squad = json.loads(squad_subset_file().read_text(encoding="utf-8"))
    article = squad["data"][0]
    article["paragraphs"] = article["paragraphs"][:2]
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"version": "1.1", "data": [article]}))
    n = sum(len(p["qas"]) for p in article["paragraphs"])
    out = tmp_path / "qa"
    _run(capsys, "finetune", "qa", "--model", str(tiny_bert), "--train", str(small), "--eval", str(small),
         "--out", str(out), "--epochs", "1", "--batch-size", "8", "--max-len", "128")
    metrics = json.loads(_run(capsys, "evaluate", "qa", "--model", str(out), "--data", str(small)))
    assert metrics["total"] == n and 0 <= metrics["exact"] <= metrics["f1"] <= 100
    rows = tmp_path / "q.jsonl"
    context = article["paragraphs"][0]["context"]
    rows.write_text(json.dumps({"question": "What is it?", "context": context}) + "\n")
    pred = json.loads(_run(capsys, "predict", "qa", "--model", str(out), "--input", str(rows)).splitlines()[0])
    assert pred["answer"] in context  # exact characters of the context
    from transformers import BertForQuestionAnswering
    assert BertForQuestionAnswering.from_pretrained(str(out)).qa_outputs.weight.shape == (2, 32)


def test_bad_input_names_file_and_line(tmp_path, tiny_bert, capsys):
    train = tmp_path / "train.csv"
    train.write_text("text,label\ngood film,fresh\nbad film,rotten\n" * 3)
    out = tmp_path / "m"
    _run(capsys, "finetune", "classify", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
         "--out", str(out), "--epochs", "1")
    unknown = tmp_path / "eval.csv"
    unknown.write_text("text,label\nfine,fresh\nodd,meh\n")
    assert main(["evaluate", "classify", "--model", str(out), "--data", str(unknown)]) == 2
    err = capsys.readouterr().err
    assert "eval.csv" in err and "label 'meh' is not one the model knows" in err
    nolabel = tmp_path / "nolabel.csv"
    nolabel.write_text("text,sentiment\nfine,fresh\n")
    assert main(["evaluate", "classify", "--model", str(out), "--data", str(nolabel)]) == 2
    assert "nolabel.csv" in capsys.readouterr().err
    # a finished model is never overwritten
    before = (out / "model.safetensors").read_bytes()
    assert main(["finetune", "classify", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
                 "--out", str(out)]) == 2
    assert "already holds" in capsys.readouterr().err and (out / "model.safetensors").read_bytes() == before
    # a model fine-tuned for one task is not evaluated as another
    assert main(["evaluate", "ner", "--model", str(out), "--data", str(train)]) == 2
    assert "fine-tuned for 'classify'" in capsys.readouterr().err
    bad_conll = tmp_path / "bad.conll"
    bad_conll.write_text("Peter B-person\nlonely\n")
    assert main(["finetune", "ner", "--model", str(tiny_bert), "--train", str(bad_conll), "--eval", str(bad_conll),
                 "--out", str(tmp_path / "n")]) == 2
    assert "bad.conll" in capsys.readouterr().err


def test_data_export_cli(tmp_path, capsys):
    out = tmp_path / "squad"
    _run(capsys, "data", "export", "squad-subset", "--out", str(out))
    assert (out / "train.json").is_file() and (out / "eval.json").is_file()
    assert main(["data", "export", "squad-subset", "--out", str(out)]) == 2
    assert "train.json" in capsys.readouterr().err


def test_length_grouped_batches_cover_every_example_once_with_less_padding():
    from bertkit.finetune import epoch_groups
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 120, (3000,), generator=g).tolist()
    feats = [{"input_ids": [0] * n} for n in lengths]
    padded = {}
    for by_length in (False, True):
        groups = epoch_groups(feats, 32, by_length, torch.Generator().manual_seed(1))
        flat = [i for grp in groups for i in grp]
        assert sorted(flat) == list(range(3000)) and all(len(grp) <= 32 for grp in groups)
        padded[by_length] = sum(len(grp) * max(lengths[i] for i in grp) for grp in groups)
    assert padded[True] < 0.7 * padded[False]


def test_classification_metrics_on_a_hand_checked_case():
    import numpy as np

    from bertkit.tasks.classify import classification_metrics
    # gold a a b b c ; predicted a b b b a
    m = classification_metrics(np.array([0, 0, 1, 1, 2]), np.array([0, 1, 1, 1, 0]), ["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(3 / 5)
    # a: P 1/2 R 1/2 F 1/2; b: P 2/3 R 1 F 4/5; c: F 0 -> macro (0.5 + 0.8 + 0) / 3
    assert m["macro_f1"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert m["confusion_matrix"]["rows_gold_cols_predicted"] == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]


def test_help_lists_every_tasks_option_keys():
    """`finetune --help` lists each task's --option keys without importing the tasks: the list
    must be the tasks' own."""
    from bertkit.tasks import OPTION_KEYS, TASKS, get_task
    assert set(OPTION_KEYS) == set(TASKS)
    for name, keys in OPTION_KEYS.items():
        assert keys.split(", ") == list(get_task(name).options), name


def test_each_task_has_its_own_defaults_and_flags_override_them(tmp_path):
    from bertkit.finetune import FinetuneConfig
    from bertkit.tasks import DEFAULTS, TASKS
    assert set(DEFAULTS) == set(TASKS)
    for task, d in DEFAULTS.items():
        cfg = FinetuneConfig(task=task, model="m", train="t", eval="e", out=str(tmp_path / task))
        assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.max_len) == (d["epochs"], d["batch_size"], d["lr"], d["max_len"])
    cfg = FinetuneConfig(task="qa", model="m", train="t", eval="e", out="o", epochs=1, lr=3e-5, max_len=64, batch_size=2)
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.max_len) == (1, 2, 3e-5, 64)
    # the word task's default head is encoder (1 epoch); head=vocab keeps its own 3
    assert DEFAULTS["word"]["options"] == {"head": "encoder"} and DEFAULTS["word"]["epochs"] == 1
    word = dict(task="word", model="m", train="t", eval="e", out="o")
    assert FinetuneConfig(**word, options={"head": "vocab"}).epochs == 3
    assert FinetuneConfig(**word, options={"head": "encoder"}).epochs == 1
    assert FinetuneConfig(**word, options={"head": "vocab"}, epochs=2).epochs == 2


def test_classify_defaults_to_the_checkpoints_own_sentence_vector(tmp_path, tiny_bert, capsys):
    """The default classifier input (chosen by the fine-tuning study): a sentence-transformers
    folder's declared pooling (mean), a plain BERT folder's pooler; written into bertkit.json."""
    folder = sentence_transformers_copy(tiny_bert, tmp_path / "st")
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f'"{t}",{lab}\n' for t, lab in [("good film", "pos"), ("bad", "neg")] * 4))
    for model, extra, pooling in ((folder, (), "mean"), (tiny_bert, (), "pooler"),
                                  (folder, ("--option", "pooling=cls", "--shuffled-batches"), "cls")):
        out = tmp_path / f"model-{pooling}"
        _run(capsys, "finetune", "classify", "--model", str(model), "--train", str(train), "--eval", str(train),
             "--out", str(out), "--epochs", "1", "--batch-size", "4", *extra)
        info = json.loads((out / "bertkit.json").read_text())
        assert info["pooling"] == pooling
        config = json.loads((out / "finetune_config.json").read_text())
        from bertkit.tasks import DEFAULTS
        assert config["epochs"] == 1 and config["lr"] == DEFAULTS["classify"]["lr"]  # given, and the task's default
        # (tiny_bert has no bertkit.json: a published checkpoint's lr, not a scratch run's)
        assert config["group_by_length"] == ("--shuffled-batches" not in extra)


@pytest.mark.parametrize("task_name", ["classify", "ner", "tag"])
def test_evaluation_in_length_sorted_batches_gives_the_predictions_of_input_order(tmp_path, tiny_bert, task_name):
    """run_task batches the features by length (less padding) and hands the predictions back in
    input order: the same as decoding batches taken in input order."""
    from bertkit.folders import load_model
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tasks.runner import length_order, run_task, task_outputs
    from bertkit.tokenizer import load_tokenizer
    task = get_task(task_name)()
    if task_name == "classify":
        words = "a wonderful moving film that is dull and far too long but the best thing this year".split()
        path = tmp_path / "data.csv"
        path.write_text("text,label\n" + "".join(f'"{" ".join(words[:3 + (7 * i) % 14])}",{"ab"[i % 2]}\n'
                                                 for i in range(23)))
    else:
        path = tmp_path / "data.conll"
        path.write_text(CONLL * 3 + "Paris B-geo-loc\n\n")
    examples = task.read(path)
    task.fit(examples, {"max_len": 64})
    torch.manual_seed(0)
    bert, _ = load_model(tiny_bert, heads=False)
    model = TaskModel(bert, task.head(bert.config, bert)).eval()
    init_weights(model.head, bert.config)
    tok = load_tokenizer(tiny_bert)
    feats = task.features(examples, tok, 64)
    assert length_order(task, feats, examples) != list(range(len(feats)))  # the order does change
    sorted_preds, _ = run_task(task, model, feats, examples, tok, batch_size=4)
    outputs, _ = task_outputs(task, model, feats, tok, batch_size=4)
    plain = task.decode(outputs, feats, examples)
    assert len(sorted_preds) == len(plain) == len(examples)
    for ours, theirs in zip(sorted_preds, plain):
        if task_name == "classify":
            assert ours["label"] == theirs["label"]
            for label, score in theirs["scores"].items():
                assert abs(ours["scores"][label] - score) < 1e-5
        else:
            assert ours == theirs


@pytest.mark.parametrize("task_name,pooling", [("classify", "pooler"), ("classify", "cls"), ("classify", "mean"),
                                               ("word", None)])
def test_heads_that_read_cls_run_the_last_layer_there_only_with_the_full_layers_result(
        tmp_path, tiny_bert, task_name, pooling):
    """classify with the pooler or [CLS] and word read the last layer at position 0 alone, so they
    run it there only: loss, outputs and every gradient equal those of the full last layer (mean
    pooling reads every position and runs it in full)."""
    from bertkit.folders import load_model
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tasks.runner import feature_batches
    from bertkit.tokenizer import load_tokenizer
    task = get_task(task_name)()
    if task_name == "classify":
        path = tmp_path / "data.csv"
        path.write_text("text,label\n" + "".join(f'"{t}",{lab}\n' for t, lab in [
            ("a wonderful moving film", "pos"), ("dull and far too long", "neg"), ("the best this year", "pos")]))
    else:
        path = tmp_path / "data.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in [{"text": "large", "word": "size"},
                                                               {"text": "very tall", "word": "height"}]))
    examples = task.read(path)
    task.fit(examples, {"max_len": 32} | ({"pooling": pooling} if pooling else {}))
    torch.manual_seed(0)
    bert, _ = load_model(tiny_bert, heads=False)
    model = TaskModel(bert, task.head(bert.config, bert)).eval()  # no dropout: the two runs compare
    init_weights(model.head, bert.config)
    tok = load_tokenizer(tiny_bert)
    batch = next(iter(feature_batches(task.features(examples, tok, 32), task, tok, 8, "cpu")))
    assert batch["attention_mask"].eq(0).any()  # padding in the batch
    rows = []
    bert.layers[-1].ffn_in.register_forward_hook(lambda m, inp, out: rows.append(inp[0].shape[1]))
    fast = bert.forward

    def run(full: bool):
        model.zero_grad(set_to_none=True)
        if full:  # every position of every layer, the rows picked afterwards
            def every_position(*args, last_layer_rows=None, **kwargs):
                out = fast(*args, **kwargs)
                if last_layer_rows is not None:
                    out.sequence_output = out.sequence_output[:, :1]
                return out
            bert.forward = every_position
        try:
            loss, out = task.forward(model, batch)
        finally:
            bert.forward = fast
        loss.backward()
        return loss.detach(), out, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    loss_s, out_s, grads_s = run(False)
    assert rows[-1] == (batch["input_ids"].size(1) if pooling == "mean" else 1)  # the last layer's rows per sequence
    loss_p, out_p, grads_p = run(True)
    torch.testing.assert_close(loss_s, loss_p, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_s, out_p, rtol=1e-5, atol=1e-6)
    assert grads_s.keys() == grads_p.keys()
    for name in grads_p:
        torch.testing.assert_close(grads_s[name], grads_p[name], rtol=1e-4, atol=1e-6, msg=name)


def test_ner_decodes_the_best_valid_bio_sequence(minilm_folder):
    # the softmax says O, I-person, I-person, O word by word: an entity with no beginning. BIO
    # decoding gives the best valid sequence under the same probabilities; argmax keeps the words'
    # own tags; a label set that is not BIO cannot be decoded that way and is refused up front
    import itertools

    from bertkit.errors import BertkitError
    from bertkit.tasks.ner import NerTask
    examples = [{"words": ["Peter", "Blackburn", "visited", "Paris"],
                 "tags": ["B-person", "I-person", "O", "B-geo-loc"]}]
    task = NerTask()
    task.fit(examples, {})
    assert task.info["decode"] == "bio"
    labels = task.info["labels"]
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    batch = task.collate(task.features(examples, tok, 32), tok)
    probs = torch.full((1, batch["input_ids"].size(1), len(labels)), 0.02)
    for word, (tag, p) in enumerate([("O", 0.5), ("I-person", 0.6), ("I-person", 0.5), ("O", 0.9)]):
        pos = batch["word_starts"][0, word]
        probs[0, pos, labels.index(tag)] = p
        probs[0, pos, labels.index("B-person")] = 0.3 if word == 0 else 0.02
    logits = probs.log()

    class Fixed(torch.nn.Module):  # a model whose head emits these logits
        def __init__(self):
            super().__init__()
            self.bert = lambda **_: type("Out", (), {"sequence_output": None})
            self.head = lambda h: logits
    _, [bio] = task.forward(Fixed(), batch)
    # brute force: the valid sequence with the highest product of word probabilities
    word_probs = [probs[0, batch["word_starts"][0, w]] for w in range(4)]
    valid = lambda seq: all(not labels[c].startswith("I-") or labels[p][2:] == labels[c][2:]
                            for p, c in zip([labels.index("O")] + list(seq), seq))
    best = max((s for s in itertools.product(range(len(labels)), repeat=4) if valid(s)),
               key=lambda s: math.prod(float(word_probs[w][t]) for w, t in enumerate(s)))
    assert bio == list(best) and [labels[t] for t in bio] == ["B-person", "I-person", "I-person", "O"]
    argmax = NerTask({**task.info, "decode": "argmax"})
    _, [plain] = argmax.forward(Fixed(), batch)
    assert [labels[t] for t in plain] == ["O", "I-person", "I-person", "O"]
    with pytest.raises(BertkitError, match="decode=bio needs BIO tags.*'PER'"):
        NerTask().fit([{"words": ["Peter"], "tags": ["PER"]}], {"decode": "bio"})
    other = NerTask()
    other.fit([{"words": ["Peter"], "tags": ["PER"]}], {})
    assert other.info["decode"] == "argmax"  # not BIO: each word's own most likely tag


def test_iob1_tags_are_learned_as_bio_and_given_back_as_iob1(minilm_folder, tmp_path):
    """CoNLL-2003 as distributed is IOB1 (I-X begins an entity). Read as BIO, BIO decoding
    forbade every entity start (no entity predicted at all) and the CRF's loss on the gold path
    was about 1e4; now the data is told apart, learned as BIO and answered in IOB1."""
    import random

    from bertkit.data.readers import read_conll
    from bertkit.data.registry import export
    from bertkit.tasks.ner import NerTask, TagTask, tag_scheme, to_bio, to_iob1
    folder = tmp_path
    export("wnut16", folder / "wnut")
    bio = [t for _, t in read_conll(folder / "wnut" / "train.conll")][:300]
    iob1 = [to_iob1(t) for t in bio]
    assert iob1 != bio and tag_scheme(bio) == "bio" and tag_scheme(iob1) == "iob1"
    assert [to_bio(t) for t in iob1] == bio and [to_iob1(to_bio(t)) for t in iob1] == iob1
    # two entities of a type side by side keep their B- in IOB1; a stray I- in BIO data becomes B-
    assert to_iob1(["B-PER", "B-PER", "I-PER", "O", "B-LOC"]) == ["I-PER", "B-PER", "I-PER", "O", "I-LOC"]
    assert to_bio(["O", "I-PER", "I-LOC", "B-LOC"]) == ["O", "B-PER", "B-LOC", "B-LOC"]
    rng = random.Random(0)
    for _ in range(300):  # random valid BIO sequences survive the round trip
        seq, prev = [], "O"
        for _ in range(rng.randint(1, 8)):
            t = rng.choice(["O", "B-A", "B-B"] + (["I-" + prev[2:]] * 2 if prev != "O" else []))
            seq.append(t)
            prev = t
        assert to_bio(to_iob1(seq)) == seq

    tok = WordPieceTokenizer.from_folder(minilm_folder)
    words = [w for w, _ in read_conll(folder / "wnut" / "train.conll")][:300]
    as_bio = [{"words": w, "tags": t} for w, t in zip(words, bio)]
    as_iob1 = [{"words": w, "tags": t} for w, t in zip(words, iob1)]
    for cls in (NerTask, TagTask):
        a, b = cls(), cls()
        a.fit(as_bio, {})
        b.fit(as_iob1, {})
        assert b.info["scheme"] == "iob1" and a.info["scheme"] == "bio" and a.info["labels"] == b.info["labels"]
        fa, fb = a.features(as_bio, tok, 64), b.features(as_iob1, tok, 64)
        assert [f["word_labels"] for f in fa] == [f["word_labels"] for f in fb]
        # gold paths decode to each scheme's own tags, and score as exact
        rows = [f["word_labels"] for f in fb]
        preds = b.decode([rows], fb, as_iob1)
        assert preds == iob1 and b.metrics(preds, as_iob1)["f1"] == 1.0
        assert a.decode([rows], fa, as_bio) == bio
    crf_task = TagTask()
    crf_task.fit(as_iob1, {})
    head = crf_task.head(type("C", (), {"hidden_size": 8})(), None)
    batch = crf_task.collate(crf_task.features(as_iob1[:16], tok, 64), tok)
    emissions = torch.zeros(*batch["word_labels"].shape, len(crf_task.info["labels"]))
    loss = head.crf(emissions, batch["word_labels"], batch["word_mask"].bool())
    assert float(loss.detach()) < 100  # a uniform model's loss: a few nats per word, not 1e4


@pytest.mark.parametrize("task_name", ["classify", "ner"])
def test_evaluation_loss_does_not_depend_on_the_batch_size(tmp_path, tiny_bert, task_name):
    """eval_loss is the mean over what the task's loss averages over (examples, labelled words):
    the mean of batch means counted a short last batch as a full one (1.0583 against 1.0615 at
    batch 64 and 1.0627 at 100, on a trained classifier)."""
    from bertkit.data.registry import export
    from bertkit.folders import load_model
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tasks.runner import run_task
    from bertkit.tokenizer import load_tokenizer
    name, file = ("rotten-tomatoes", "train.jsonl") if task_name == "classify" else ("wnut16", "train.conll")
    export(name, tmp_path / name)
    task = get_task(task_name)()
    examples = task.read(tmp_path / name / file)[:50]
    task.fit(examples, {})
    tok = load_tokenizer(tiny_bert)
    torch.manual_seed(0)
    bert, _ = load_model(tiny_bert, heads=False)
    model = TaskModel(bert, task.head(bert.config, bert))
    init_weights(model.head, bert.config)
    feats = task.features(examples, tok, 64)
    losses = [run_task(task, model, feats, examples, tok, batch_size=b)[1] for b in (1, 7, 16, 1000)]
    assert max(losses) - min(losses) < 1e-5, losses


def test_word_targets_are_read_as_the_tokenizer_reads_text(minilm_folder):
    """An uncased vocabulary strips accents: "Café" is its token "cafe" (it was counted as no
    token, so never learned and always wrong); a cased vocabulary keeps the word as written."""
    from bertkit.tasks import get_task
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    task = get_task("word")()
    examples = [{"text": "coffee shop", "word": "Café"}, {"text": "simple", "word": "naïve"},
                {"text": "big", "word": "size"}, {"text": "x", "word": "zzqxv"}]
    task.fit(examples, {})
    labels = [f["labels"] for f in task.features(examples, tok, 16)]
    assert labels[:3] == [tok.token_to_id("cafe"), tok.token_to_id("naive"), tok.token_to_id("size")]
    assert labels[3] == -100


def test_a_document_with_no_sentences_is_refused_by_name():
    """predict summarize "" (or "   ") ended in an IndexError deep in the model."""
    from bertkit.errors import BertkitError
    from bertkit.tasks.summarize import SummarizeTask
    task = SummarizeTask({})
    assert len(task.read_inputs(texts=["One. Two."])[0]["sentences"]) == 2
    for texts in ([""], ["A cat sat.", "   "]):
        with pytest.raises(BertkitError, match=f"text {len(texts)}: no sentences"):
            task.read_inputs(texts=texts)


def test_ner_metrics_with_no_entity_predicted_are_zero_without_a_warning():
    """seqeval's "Precision is ill-defined" warning reached the user of evaluate and finetune."""
    import warnings

    from bertkit.tasks.ner import NerTask
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = NerTask({}).metrics([["O", "O"]], [{"tags": ["B-PER", "O"]}])
    assert (scores["precision"], scores["recall"], scores["f1"], scores["token_accuracy"]) == (0, 0, 0, 0.5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_head_transformers_would_run_otherwise_is_not_loaded_by_it_silently(tmp_path, tiny_bert, pooling):
    """A classifier on the mean (MiniLM's default) or on [CLS] was saved as classifier.weight:
    transformers' BertForSequenceClassification loaded it without a word and ran it on the
    pooler (other predictions). Under bertkit's own names it reports the head as missing; bertkit
    reads both layouts."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSequenceClassification

    from bertkit.folders import load_model
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tasks.folder import load_task_model, save_task_model
    bert, _ = load_model(tiny_bert, heads=False)
    task = get_task("classify")({"labels": ["a", "b"], "pooling": pooling})
    torch.manual_seed(0)
    model = TaskModel(bert, task.head(bert.config, bert)).eval()
    out = tmp_path / "clf"
    save_task_model(model, task, WordPieceTokenizer.from_folder(tiny_bert), out)
    _, info = AutoModelForSequenceClassification.from_pretrained(str(out), output_loading_info=True)
    assert {"classifier.weight", "classifier.bias"} <= set(info["missing_keys"])
    tensors = load_file(str(out / "model.safetensors"))
    _, loaded, tok = load_task_model(out, device="cpu")
    torch.testing.assert_close(loaded.head.classifier.weight, model.head.classifier.weight, atol=0, rtol=0)
    # a folder saved before the prefix
    save_file({k.removeprefix("bertkit_head."): v for k, v in tensors.items()}, str(out / "model.safetensors"))
    _, old, _ = load_task_model(out, device="cpu")
    torch.testing.assert_close(old.head.classifier.weight, model.head.classifier.weight, atol=0, rtol=0)


def test_the_default_lr_follows_what_the_model_is(tmp_path, tiny_bert):
    """A published checkpoint (or a run continued from one) takes the task's lr; a model bertkit
    pretrained from random weights takes 1e-3 x 128 / hidden size, through the runs that continued
    it; --lr always wins, and a resume resolves the same default."""
    import shutil

    from bertkit.finetune import FinetuneConfig
    from bertkit.folders import pretraining_origin
    from bertkit.tasks import DEFAULTS, default_lr

    def folder(name, info=None):
        f = tmp_path / name
        shutil.copytree(tiny_bert, f)
        if info is not None:
            (f / "bertkit.json").write_text(json.dumps(info))
        return f

    published = folder("published")
    scratch = folder("scratch", {"task": "pretraining", "pretrained_from": "mini", "steps": 10})
    older = folder("older", {"task": "pretraining", "steps": 10})  # from before pretrained_from was recorded
    continued = folder("continued", {"task": "pretraining", "pretrained_from": str(published)})
    finetuned = folder("finetuned", {"task": "classify", "labels": ["a", "b"]})
    assert [pretraining_origin(f) for f in (published, scratch, older, continued, finetuned)] == [
        None, "mini", "tiny", None, None]
    hidden = 32  # tiny_bert's
    for f, task, lr in ((published, "ner", DEFAULTS["ner"]["lr"]), (continued, "classify", DEFAULTS["classify"]["lr"]),
                        (finetuned, "classify", DEFAULTS["classify"]["lr"]),
                        (scratch, "classify", 1e-3 * 128 / hidden), (older, "ner", 1e-3 * 128 / hidden)):
        assert default_lr(task, f) == pytest.approx(lr)
        cfg = FinetuneConfig(task=task, model=str(f), train="t", eval="e", out="o")
        assert cfg.lr == pytest.approx(lr)
    assert FinetuneConfig(task="classify", model=str(scratch), train="t", eval="e", out="o", lr=2e-5).lr == 2e-5
    (scratch / "config.json").write_text("{")  # unreadable: the task's lr; loading the model names the error
    assert default_lr("classify", scratch) == DEFAULTS["classify"]["lr"]


def test_a_scratch_models_default_epochs_reach_enough_steps(tmp_path, tiny_bert, monkeypatch):
    """With no --epochs, a model bertkit pretrained from random weights is fine-tuned for at least
    SCRATCH_MIN_STEPS steps (more epochs on a small training set), a published checkpoint for its
    task's epochs; --epochs and --budget win, and the run records the epochs it resolved."""
    import shutil

    import bertkit.tasks as tasks
    from bertkit.finetune import FinetuneConfig, finetune
    from bertkit.tasks import DEFAULTS, default_epochs
    scratch = tmp_path / "scratch"
    shutil.copytree(tiny_bert, scratch)
    (scratch / "bertkit.json").write_text(json.dumps({"task": "pretraining", "pretrained_from": "tiny", "steps": 1}))
    assert default_epochs("ner", tiny_bert, 1915, 16) == DEFAULTS["ner"]["epochs"]  # published: the task's
    assert default_epochs("ner", scratch, 1915, 16) == 8        # 120 steps an epoch: 950 steps in 8 epochs
    assert default_epochs("classify", scratch, 10202, 32) == 3  # 319 steps an epoch: the task's 3 are enough
    assert FinetuneConfig(task="classify", model=str(tiny_bert), train="t", eval="e", out="o").epochs == 3
    assert FinetuneConfig(task="classify", model=str(scratch), train="t", eval="e", out="o").epochs is None
    assert FinetuneConfig(task="classify", model=str(scratch), train="t", eval="e", out="o", epochs=2).epochs == 2
    budget = FinetuneConfig(task="classify", model=str(scratch), train="t", eval="e", out="o", budget="1m")
    assert budget.epochs == DEFAULTS["classify"]["epochs"]  # unused: the budget ends the run

    monkeypatch.setattr(tasks, "SCRATCH_MIN_STEPS", 10)
    rows = [{"text": f"review number {i} was {'good' if i % 2 else 'bad'}", "label": i % 2} for i in range(8)]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = finetune(FinetuneConfig(task="classify", model=str(scratch), train=str(tmp_path / "train.jsonl"),
                                      eval=str(tmp_path / "dev.jsonl"), out=str(tmp_path / "out"), batch_size=4,
                                      progress=False))
    assert summary["config"]["epochs"] == summary["epochs_run"] == 5  # 2 steps an epoch: 10 steps in 5 epochs
