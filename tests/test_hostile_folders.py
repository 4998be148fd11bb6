"""Hostile folders: a link inside a folder a command writes (replaced, never written through: the
user's file it points at stays as it was), broken weights (refused by tensor name when the folder
is opened), a tokenizer.json that disagrees with its vocab.txt (refused by line)."""
from pathlib import Path

import pytest

from bertkit.cli import main


def _linked(out, name, tmp_path):
    """OUT/name -> a file of the user's outside OUT."""
    mine = tmp_path / f"mine-{name}"
    mine.write_text("the user's own file\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / name).symlink_to(mine)
    return mine


def test_export_overwrite_replaces_a_link_in_out(tmp_path, tiny_bert):
    """Links where the export writes vocab.txt, config.json and its manifest, onnx.json."""
    out = tmp_path / "export"
    names = ["vocab.txt", "config.json", "onnx.json"]
    mine = [_linked(out, name, tmp_path) for name in names]
    assert main(["export", "--model", str(tiny_bert), "--out", str(out), "--overwrite"]) == 0
    assert all(m.read_text() == "the user's own file\n" for m in mine)
    for name in names:
        assert not (out / name).is_symlink()


def test_data_export_overwrite_replaces_a_link_in_out(tmp_path):
    out = tmp_path / "data"
    mine = _linked(out, "README.md", tmp_path)
    assert main(["data", "export", "wordnet-attributes", "--out", str(out), "--overwrite"]) == 0
    assert mine.read_text() == "the user's own file\n"
    assert not (out / "README.md").is_symlink() and (out / "README.md").read_text().startswith("# wordnet-attributes")


# ---- broken weights are refused when a folder is opened ----
@pytest.mark.parametrize("damage", ["nan", "inf", "int8"])
def test_broken_weights_are_refused_by_tensor_name(tmp_path, tiny_bert, damage, capsys):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    folder = tmp_path / "m"
    shutil.copytree(tiny_bert, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("attention.self.query.weight"))
    if damage == "int8":
        tensors = {k: v.to(torch.int8) for k, v in tensors.items()}
    else:
        tensors[name] = tensors[name].clone()
        tensors[name][0, :3] = float(damage)
    save_file(tensors, str(folder / "model.safetensors"))
    (tmp_path / "t.txt").write_text("a text\n")
    assert main(["encode", "--model", str(folder), "--input", str(tmp_path / "t.txt"),
                 "--output", str(tmp_path / "v.npy")]) == 2
    err = capsys.readouterr().err
    expected = "is int8, not a floating-point weight" if damage == "int8" else "holds 3 NaN or infinite values"
    assert expected in err and "model.safetensors: tensor '" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "v.npy").exists()


def test_a_tokenizer_json_that_disagrees_with_vocab_txt_is_refused(tmp_path, minilm_folder):
    """Another vocabulary of the same size in vocab.txt, or a BPE tokenizer.json: ids from one
    would hit the other's embeddings ("fine" split f/i/n/e)."""
    import shutil

    from tokenizers import Tokenizer, models

    from bertkit import BertkitError
    from bertkit.tokenizer import WordPieceTokenizer
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(Path(minilm_folder) / name, folder / name)
    lines = (folder / "vocab.txt").read_text().split("\n")
    lines[2000], lines[2001] = lines[2001], lines[2000]
    (folder / "vocab.txt").write_text("\n".join(lines))
    with pytest.raises(BertkitError, match=r"vocab.txt, line 2001: .* is id 2000 here but 2001 in tokenizer.json"):
        WordPieceTokenizer.from_folder(folder)
    (folder / "vocab.txt").unlink()
    Tokenizer(models.BPE(unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    with pytest.raises(BertkitError, match="tokenizer.json: a BPE tokenizer, not WordPiece"):
        WordPieceTokenizer.from_folder(folder)


# ---- ner tags without a scheme ----
def test_ner_tags_without_prefixes_are_read_as_io_and_lower_case_prefixes_refused(capsys):
    from bertkit import BertkitError
    from bertkit.tasks.ner import NerTask
    train = [{"words": ["Ann", "Lee", "met", "Bo", "in", "Rome"], "tags": ["PER", "PER", "O", "PER", "O", "LOC"],
              "lines": [1, 2, 3, 4, 5, 6]}]
    task = NerTask()
    task.fit(train, {})
    assert task.info["io"] and "read as IO" in capsys.readouterr().err
    gold = [ex["tags"] for ex in train]
    assert task.metrics(gold, train)["f1"] == 1.0  # entity scores count the runs: 0.0 before
    half = [["PER", "O", "O", "PER", "O", "LOC"]]  # Ann alone: one of three entities wrong
    assert task.metrics(half, train)["f1"] == pytest.approx(2 / 3)
    lower = [{"words": ["Ann", "Lee"], "tags": ["b-per", "i-per"], "lines": [7, 8]}]
    with pytest.raises(BertkitError, match=r"line 7: tag 'b-per': entity prefixes are upper case .* as in 'B-per'"):
        NerTask().fit(lower, {})


def test_an_out_that_is_a_dangling_link_is_refused_in_one_line(tmp_path, tiny_bert, capsys):
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "nowhere")
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence here. Another one.\n\nA second document. It ends.\n")
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "good", "label": 1}\n{"text": "bad", "label": 0}\n')
    for argv in (["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "100", "--out", str(out)],
                 ["data", "export", "wordnet-attributes", "--out", str(out)],
                 ["export", "--model", str(tiny_bert), "--out", str(out)],
                 ["pretrain", "--corpus", str(corpus), "--steps", "1", "--out", str(out), "--no-samples"],
                 ["finetune", "classify", "--model", str(tiny_bert), "--train", str(data), "--eval", str(data),
                  "--epochs", "1", "--out", str(out)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "which does not exist; remove the link or make the folder it names" in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
    assert out.is_symlink() and not (tmp_path / "nowhere").exists()


def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_leaves_no_partial_folder(tmp_path, tiny_bert,
                                                                                         monkeypatch, capsys):
    """safetensors reports a full disk with its own SafetensorError, not an OSError."""
    from safetensors import SafetensorError

    import bertkit.training.checkpoints as checkpoints
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "good", "label": 1}\n{"text": "bad", "label": 0}\n')
    real = checkpoints.torch.save

    def full(obj, path, *a, **k):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                              "message: \"No space left on device\" })")
    monkeypatch.setattr(checkpoints.torch, "save", full)
    out = tmp_path / "run"
    assert main(["finetune", "classify", "--model", str(tiny_bert), "--train", str(data), "--eval", str(data),
                 "--epochs", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bertkit: error: no space left on device while writing")
    assert not list((out / "checkpoints").glob(".step_*.partial"))
    monkeypatch.setattr(checkpoints.torch, "save", real)


def test_a_vocabulary_size_past_any_corpus_is_refused_before_reading(tmp_path, capsys):
    """--vocab-size 1000000000 aborted in tokenizers' allocator (exit 134, a Rust backtrace)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence here. Another one.\n\nA second document. It ends.\n")
    for argv in (["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "1000000000",
                  "--out", str(tmp_path / "t")],
                 ["pretrain", "--corpus", str(corpus), "--vocab-size", "1000000000", "--steps", "1",
                  "--out", str(tmp_path / "p")]):
        assert main(argv) == 2
        assert "--vocab-size 1000000000: at most 2,097,152" in capsys.readouterr().err
    assert not (tmp_path / "t").exists() and not (tmp_path / "p").exists()


def test_tokenless_reads_a_long_text_by_its_head(minilm_folder):
    """Whether a text holds a token is decided by its first characters where they hold one (a
    one-line 50 MB predict input was tokenized whole for this: 61 s and 10.5 GB)."""
    from bertkit.tokenizer import WordPieceTokenizer
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    late = "\u200b" * 5000 + " word"  # no token in its head, one at its end
    assert tok.tokenless(["", " \u200b ", "word " * 1_000_000, late, "\u200b" * 5000, None]) == [0, 1, 4]


def test_finetune_refuses_its_model_folder_as_out_and_data_with_nothing_to_learn(tmp_path, tiny_bert, capsys):
    import shutil
    model = tmp_path / "m"
    shutil.copytree(tiny_bert, model)
    before = (model / "model.safetensors").read_bytes()
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "good", "label": 1}\n{"text": "bad", "label": 0}\n')
    assert main(["finetune", "classify", "--model", str(model), "--train", str(data), "--eval", str(data),
                 "--epochs", "1", "--out", str(model), "--overwrite"]) == 2
    assert "is the --model folder" in capsys.readouterr().err
    assert (model / "model.safetensors").read_bytes() == before
    words = tmp_path / "words.csv"  # every target several tokens: nothing the word task can learn
    words.write_text("text,word\nvery large,bigness\nquite small,smallishness\n")
    assert main(["finetune", "word", "--model", str(tiny_bert), "--train", str(words), "--eval", str(words),
                 "--epochs", "1", "--out", str(tmp_path / "w"), "--option", "head=vocab"]) == 2
    assert "none of its 2 examples gives the model a target it can learn" in capsys.readouterr().err


def test_duplicate_labels_in_bertkit_json_are_refused(tmp_path, tiny_bert):
    import json
    import shutil

    from bertkit import BertkitError
    from bertkit.tasks.folder import load_task_model
    folder = tmp_path / "m"
    shutil.copytree(tiny_bert, folder)
    (folder / "bertkit.json").write_text(json.dumps({"task": "classify", "labels": ["pos", "neg", "pos"]}))
    with pytest.raises(BertkitError, match="bertkit.json: label 'pos' occurs twice in 'labels'"):
        load_task_model(folder)
