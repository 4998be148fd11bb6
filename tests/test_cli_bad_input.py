"""Bad input on the command line: one `bertkit: error:` line naming the file, line, field or
option and what is wrong; exit code 2; no traceback; nothing the user already has is changed.

Each case runs `bertkit.cli.main([...])` in-process on a tmp folder filled with the user's
files, and compares every file there (bytes and mtime) before and after.
"""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from bertkit import BertForPreTraining, BertModel
from bertkit.cli import main

LIMIT = 64  # the tiny model's position limit


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_bert_factory):
    """tiny: 2-layer BERT with the real vocabulary and 64 positions (tiny_mlm: with MLM and NSP
    heads, for fill-mask); small_vocab: the same
    vocabulary over a 99-row embedding matrix; classifier: tiny fine-tuned for classify;
    classifier_big_vocab: that folder with a vocab.txt longer than its embeddings."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)  # once: the three models are drawn one after another
    for name, vocab in (("tiny", 30522), ("small_vocab", 99), ("tiny_mlm", 30522)):
        tiny_bert_factory.folder(root / name, BertForPreTraining if name == "tiny_mlm" else BertModel, seed=None,
                                 vocab_size=vocab, max_position_embeddings=LIMIT)
    data = root / "train.csv"
    data.write_text("text,label\n" + "a good film,pos\na bad film,neg\n" * 3)
    assert main(["finetune", "classify", "--model", str(root / "tiny"), "--train", str(data), "--eval", str(data),
                 "--out", str(root / "classifier"), "--epochs", "1", "--max-len", "32"]) == 0
    big = root / "classifier_big_vocab"
    shutil.copytree(root / "classifier", big)
    (big / "tokenizer.json").unlink()
    with (big / "vocab.txt").open("a") as f:
        f.write("".join(f"extratoken{i}\n" for i in range(5)))
    # a damaged bertkit.json: no labels, labels as a string, a label more than the head has
    for name, labels in (("classifier_no_labels", None), ("classifier_labels_str", "pos"),
                         ("classifier_3_labels", ["neg", "pos", "meh"])):
        shutil.copytree(root / "classifier", root / name)
        info = json.loads((root / name / "bertkit.json").read_text())
        info.pop("labels") if labels is None else info.update(labels=labels)
        (root / name / "bertkit.json").write_text(json.dumps(info))
    shutil.copytree(root / "tiny", root / "tiny_st_bad_length")  # a sentence-transformers length below 3
    (root / "tiny_st_bad_length" / "sentence_bert_config.json").write_text('{"max_seq_length": -3}')
    return {name: root / name for name in ("tiny", "small_vocab", "tiny_mlm", "classifier", "classifier_big_vocab",
                                           "classifier_no_labels", "classifier_labels_str", "classifier_3_labels",
                                           "tiny_st_bad_length")}


def _user_files(tmp: Path) -> None:
    """What a user has lying around: inputs good and bad, and folders of their own."""
    (tmp / "texts.txt").write_text("first text\nsecond text\n")
    (tmp / "gap.txt").write_text("first text\n\nthird text\n")
    (tmp / "train.csv").write_text("text,label\na good film,pos\na bad film,neg\n" * 3)
    (tmp / "utf16.csv").write_bytes("text,label\na good film,pos\n".encode("utf-16"))
    (tmp / "utf16be.txt").write_bytes(b"\xfe\xff" + "some text\n".encode("utf-16-be"))
    (tmp / "utf16.conll").write_bytes("Peter B-PER\n".encode("utf-16"))
    (tmp / "a_folder.txt").mkdir()
    (tmp / "a_folder.txt" / "inside.txt").write_text("kept\n")
    (tmp / "a_folder.csv").mkdir()
    mine = tmp / "my_model"  # a user's own folder: its config.json must survive
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}\n')
    vocab = tmp / "my_vocab"  # a `tokenizer train` output
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    (vocab / "tokenizer_config.json").write_text('{"do_lower_case": true}\n')
    (tmp / "a_file").write_text("not a folder\n")
    (tmp / "existing.npy").write_bytes(b"my vectors")
    (tmp / "dup.csv").write_text("text,label,text\na,pos,b\n")
    (tmp / "gap_label.csv").write_text("text,label\na,pos\n\nb,meh\n")
    (tmp / "steps_true.toml").write_text("steps = true\n")
    (tmp / "pairs.jsonl").write_text('{"text": "a good film", "text_pair": "yes"}\n')
    (tmp / "zero_width.txt").write_text("a fine text\n\u200b\n")
    (tmp / "surrogate.jsonl").write_text('{"text": "fine", "label": "pos"}\n{"text": "\\ud800", "label": "neg"}\n')


def _snapshot(tmp: Path) -> dict:
    """Every path under tmp; for files their bytes and modification time."""
    return {str(p.relative_to(tmp)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else "folder"
            for p in sorted(tmp.rglob("*"))}


LONG_MASK = " ".join(["word"] * 100) + " [MASK] ."

# (id, argv with {tmp} and model names in braces, text the error line must hold)
CASES = [
    # 1. a non-empty --out is refused without --overwrite
    ("finetune-out-user-folder", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/my_model", "my_model: the folder is not empty (it already holds config.json)"),
    ("finetune-out-vocab-folder", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/my_vocab", "already holds tokenizer_config.json, vocab.txt"),
    ("data-export-non-empty", "data export squad-subset --out {tmp}/my_model", "pass --overwrite"),
    ("tokenizer-train-non-empty", "tokenizer train --corpus {tmp}/texts.txt --vocab-size 50 --out {tmp}/my_model",
     "my_model: the folder is not empty"),
    ("encode-output-exists", "encode --model {tiny} --input {tmp}/texts.txt --output {tmp}/existing.npy",
     "existing.npy: already exists"),
    # 2. --max-len beyond the position limit
    ("predict-max-len", "predict classify --model {classifier} --max-len 100000 some text",
     f"--max-len 100000 exceeds the model's limit of {LIMIT} positions"),
    ("evaluate-max-len", "evaluate classify --model {classifier} --data {tmp}/train.csv --max-len 513",
     f"--max-len 513 exceeds the model's limit of {LIMIT} positions"),
    ("encode-max-len", "encode --model {tiny} --input {tmp}/texts.txt --output {tmp}/new.npy --max-len 513",
     f"--max-len 513 exceeds the model's limit of {LIMIT} positions"),
    ("predict-max-len-zero", "predict classify --model {classifier} --max-len 0 some text",
     "--max-len must be an integer of at least 3 ([CLS], a token and [SEP]), got 0"),
    ("finetune-max-len", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --max-len 100", f"--max-len 100 exceeds the model's limit of {LIMIT} positions"),
    # 3. learning rate, epochs, batch size
    ("finetune-lr-negative", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --lr -1", "--lr must be a finite number above 0, got -1.0"),
    ("finetune-lr-nan", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --lr nan", "--lr must be a finite number above 0, got nan"),
    ("finetune-lr-inf", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --lr inf", "--lr must be a finite number above 0, got inf"),
    ("finetune-epochs-zero", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --epochs 0", "--epochs must be an integer of at least 1, got 0"),
    ("finetune-batch-size-zero", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --batch-size 0", "--batch-size must be an integer of at least 1, got 0"),
    ("finetune-patience-zero", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --patience 0", "--patience must be an integer of at least 1, got 0"),
    ("encode-batch-size-zero", "encode --model {tiny} --input {tmp}/texts.txt --output {tmp}/new.npy --batch-size 0",
     "--batch-size must be at least 1"),
    ("encode-chunk-texts-zero", "encode --model {tiny} --input {tmp}/texts.txt --output {tmp}/new.npy --chunk-texts 0",
     "--chunk-texts must be at least 1, got 0"),
    ("fill-mask-top-k-zero", "fill-mask --model {tiny} --top-k 0 a\x00[MASK]\x00here", "--top-k must be at least 1"),
    # 4. task options: unknown keys listed, bad values named, before any training
    ("finetune-option-typo", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --option dropuot=0.2",
     "--option dropuot: not an option of the classify task; valid keys: dropout, head, pooling"),
    ("finetune-option-bad-dropout", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --option dropout=2", "--option dropout=2: must be at least 0 and below 1, got 2.0"),
    ("finetune-option-bad-pooling", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --option pooling=max", "--option pooling='max': expected one of pooler, cls, mean"),
    ("finetune-summarize-k", "finetune summarize --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --option k=0", "--option k=0: must be at least 1, got 0"),
    ("finetune-qa-stride-text", "finetune qa --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --option doc_stride=wide", "--option doc_stride='wide': expected an integer"),
    ("finetune-ner-pooling", "finetune ner --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --option pooling=cls", "not an option of the ner task; valid keys: decode, dropout"),
    ("finetune-ner-decode", "finetune ner --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --option decode=viterbi", "--option decode='viterbi': expected one of bio, argmax"),
    ("finetune-head-for-ner", "finetune ner --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --head mlp", "--head is an option of the classify task, not of ner"),
    # 5. an output that cannot be written fails before the work
    ("encode-output-under-proc", "encode --model {tiny} --input {tmp}/texts.txt --output /proc/bertkit-test/v.npy",
     "--output /proc/bertkit-test/v.npy: cannot write in /proc"),
    ("encode-output-parent-file", "encode --model {tiny} --input {tmp}/texts.txt --output {tmp}/a_file/v.npy",
     "a_file is a file, not a folder"),
    ("encode-output-folder", "encode --model {tiny} --input {tmp}/texts.txt --output {tmp}/my_model",
     "expected a .npy file name"),
    ("finetune-out-under-proc", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out /proc/bertkit-test", "--out /proc/bertkit-test: cannot write in /proc"),
    ("finetune-out-parent-file", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/a_file/run", "a_file is a file, not a folder"),
    ("finetune-out-is-file", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/a_file", "a_file: exists and is not a folder"),
    ("data-export-under-proc", "data export squad-subset --out /proc/bertkit-test", "cannot write in /proc"),
    ("data-export-parent-file", "data export squad-subset --out {tmp}/a_file/squad", "a_file is a file, not a folder"),
    ("tokenizer-train-under-proc", "tokenizer train --corpus {tmp}/texts.txt --vocab-size 50 --out /proc/bertkit-test",
     "cannot write in /proc"),
    ("tokenizer-train-parent-file", "tokenizer train --corpus {tmp}/texts.txt --vocab-size 50 "
     "--out {tmp}/a_file/vocab", "a_file is a file, not a folder"),
    # 6. unreadable and UTF-16 inputs
    ("encode-input-folder", "encode --model {tiny} --input {tmp}/a_folder.txt --output {tmp}/new.npy",
     "a_folder.txt: is a folder, expected a file"),
    ("finetune-train-folder", "finetune classify --model {tiny} --train {tmp}/a_folder.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --max-len 32", "a_folder.csv: is a folder, expected a file"),
    ("finetune-train-utf16", "finetune classify --model {tiny} --train {tmp}/utf16.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --max-len 32", "utf16.csv: the file is UTF-16 (little-endian) text"),
    ("finetune-conll-utf16", "finetune ner --model {tiny} --train {tmp}/utf16.conll --eval {tmp}/utf16.conll "
     "--out {tmp}/new --max-len 32", "utf16.conll: the file is UTF-16 (little-endian) text"),
    ("encode-input-utf16-be", "encode --model {tiny} --input {tmp}/utf16be.txt --output {tmp}/new.npy",
     "utf16be.txt: the file is UTF-16 (big-endian) text (it starts with the byte-order mark 0xfeff); save it as UTF-8"),
    ("tokenizer-train-utf16", "tokenizer train --corpus {tmp}/utf16be.txt --vocab-size 50 --out {tmp}/new",
     "utf16be.txt: the file is UTF-16"),
    ("predict-input-utf16", "predict classify --model {classifier} --input {tmp}/utf16be.txt",
     "utf16be.txt: the file is UTF-16"),
    ("tokenizer-train-missing-corpus", "tokenizer train --corpus {tmp}/nothing.txt --vocab-size 50 "
     "--out {tmp}/new", "nothing.txt: no such file"),
    # 7. encode keeps row i = line i: blank lines are refused
    ("encode-blank-line", "encode --model {tiny} --input {tmp}/gap.txt --output {tmp}/new.npy",
     "gap.txt, line 2: blank line (1 in the file); row i of the output is line i of the input, so remove blank lines"),
    ("predict-blank-line", "predict classify --model {classifier} --input {tmp}/gap.txt",
     "gap.txt, line 2: blank line (1 in the file); row i of the output is line i of the input"),
    # 8. a vocabulary longer than the embedding matrix
    ("encode-vocab-too-big", "encode --model {small_vocab} --input {tmp}/texts.txt --output {tmp}/new.npy",
     "the tokenizer has 30522 token ids but config.json vocab_size is 99"),
    ("fill-mask-vocab-too-big", "fill-mask --model {small_vocab} a\x00[MASK]\x00here",
     "the tokenizer has 30522 token ids but config.json vocab_size is 99"),
    ("finetune-vocab-too-big", "finetune classify --model {small_vocab} --train {tmp}/train.csv "
     "--eval {tmp}/train.csv --out {tmp}/new --max-len 32", "config.json vocab_size is 99"),
    ("predict-vocab-too-big", "predict classify --model {classifier_big_vocab} some text",
     "vocab.txt: the tokenizer has 30527 token ids but config.json vocab_size is 30522"),
    # 9. inputs read as something they are not
    ("predict-input-csv", "predict classify --model {classifier} --input {tmp}/train.csv",
     "train.csv: a CSV file is not an input here; give a .txt file"),
    ("encode-input-csv", "encode --model {tiny} --input {tmp}/train.csv --output {tmp}/new.npy",
     "train.csv: a CSV file is not an input here"),
    ("predict-input-and-texts", "predict classify --model {classifier} --input {tmp}/texts.txt one\x00more",
     "give --input FILE or texts to predict, not both"),
    ("encode-lone-surrogate", "encode --model {tiny} --input {tmp}/surrogate.jsonl --output {tmp}/new.npy",
     "surrogate.jsonl, line 2: a string holds the lone surrogate \\ud800"),
    ("evaluate-lone-surrogate", "evaluate classify --model {classifier} --data {tmp}/surrogate.jsonl",
     "surrogate.jsonl, line 2: a string holds the lone surrogate \\ud800"),
    # 10. pretrain and tokenizer options and outputs
    ("pretrain-out-is-file", "pretrain --corpus {tmp}/texts.txt --model tiny --steps 1 --out {tmp}/a_file",
     "a_file: exists and is not a folder"),
    ("pretrain-save-every-negative", "pretrain --corpus {tmp}/texts.txt --model tiny --steps 1 --save-every -1 "
     "--out {tmp}/new", "--save-every must be at least 0 (0: only at the end), got -1"),
    ("pretrain-eval-every-zero", "pretrain --corpus {tmp}/texts.txt --model tiny --steps 1 --eval-every 0 "
     "--out {tmp}/new", "--eval-every must be at least 1, got 0"),
    ("pretrain-vocab-size-with-vocab", "pretrain --corpus {tmp}/texts.txt --vocab {tmp}/my_vocab --vocab-size 50 "
     "--steps 1 --out {tmp}/new", "--vocab-size is the size of a vocabulary trained on the corpus"),
    ("pretrain-vocab-size-with-folder", "pretrain --corpus {tmp}/texts.txt --model {tiny} --vocab-size 50 "
     "--steps 1 --out {tmp}/new", "a model folder brings its own"),
    ("tokenizer-vocab-size-5", "tokenizer train --corpus {tmp}/texts.txt --vocab-size 5 --out {tmp}/new",
     "--vocab-size 5 is too small: at least 6"),
    ("export-missing-model", "export --model {tmp}/nope --out {tmp}/new", "nope: no such folder"),
    ("encode-model-is-file", "encode --model {tmp}/a_file --input {tmp}/texts.txt --output {tmp}/new.npy",
     "a_file: not a folder"),
    ("tokenizer-min-frequency-negative", "tokenizer train --corpus {tmp}/texts.txt --vocab-size 50 "
     "--min-frequency -1 --out {tmp}/new", "--min-frequency must be at least 0, got -1"),
    # 11. fill-mask: a [MASK] cut off by the length limit is said to be cut off
    ("fill-mask-no-mlm-head", "fill-mask --model {tiny} a\x00[MASK]\x00here",
     "has no trained MLM head (no cls.predictions.* weights in model.safetensors): fill-mask would answer at random"),
    ("fill-mask-fine-tuned", "fill-mask --model {classifier} a\x00[MASK]\x00here", "has no trained MLM head"),
    # 12. what a file or folder holds, named where it is
    ("classify-column-twice", "evaluate classify --model {classifier} --data {tmp}/dup.csv",
     "dup.csv, line 1: the header names column 'text' twice"),
    ("classify-unknown-label-line", "evaluate classify --model {classifier} --data {tmp}/gap_label.csv",
     "gap_label.csv, line 4: label 'meh' is not one the model knows"),
    ("predict-max-len-1", "predict classify --model {classifier} --max-len 1 x",
     "--max-len must be an integer of at least 3 ([CLS], a token and [SEP]), got 1"),
    ("predict-no-labels", "predict classify --model {classifier_no_labels} x",
     "bertkit.json: no 'labels' field, which the classify head is built from"),
    ("predict-labels-string", "predict classify --model {classifier_labels_str} x",
     "bertkit.json: 'labels' must be a list of strings or integers (two or more to classify), found \"pos\""),
    ("predict-3-labels", "predict classify --model {classifier_3_labels} x",
     "but bertkit.json describes one of (3, 32) (3 labels)"),
    ("fill-mask-truncated", "fill-mask --model {tiny_mlm} " + LONG_MASK.replace(" ", "\x00"),
     f"text 0: 1 of its 1 [MASK] token(s) lie past the model's limit: the text was truncated at {LIMIT} tokens"),
    # 10. the hostile round two: tracebacks, silent wrong results and unclear messages it found
    ("pretrain-seed-huge", "pretrain --corpus {tmp}/texts.txt --seed 18446744073709551616 --out {tmp}/new",
     "--seed must be an integer from 0 to 4294967295 (2^32 - 1), got 18446744073709551616"),
    ("pretrain-seed-negative", "pretrain --corpus {tmp}/texts.txt --seed -1 --out {tmp}/new",
     "--seed must be an integer from 0 to 4294967295"),
    ("finetune-seed-huge", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --seed 1000000000000000000000", "--seed must be an integer from 0 to 4294967295"),
    ("pretrain-config-folder", "pretrain --config {tmp}/a_folder.txt --out {tmp}/new",
     "a_folder.txt: cannot read the file (Is a directory)"),
    ("finetune-ner-jsonl-train", "finetune ner --model {tiny} --train {tmp}/surrogate.jsonl --eval {tmp}/train.csv "
     "--out {tmp}/new --max-len 32", "surrogate.jsonl: a JSONL file is not CoNLL; ner and tag read CoNLL files"),
    ("predict-pair-to-singles-model", "predict classify --model {classifier} --input {tmp}/pairs.jsonl",
     "pairs.jsonl, line 1: a text pair (text_pair), but the model was fine-tuned on single texts"),
    ("pretrain-toml-steps-true", "pretrain --config {tmp}/steps_true.toml --out {tmp}/new",
     "steps_true.toml: option steps (--steps): expected int, got True"),
    ("pretrain-corpus-empty", "pretrain --corpus \x01 --out {tmp}/new".replace("\x01", ""), "--corpus is empty"),
    ("pretrain-corpus-plus", "pretrain --corpus + --out {tmp}/new", "--corpus '+': a source joined by '+' is empty"),
    ("pretrain-corpus-half-plus", "pretrain --corpus wiki+ --out {tmp}/new", "--corpus 'wiki+': a source joined by"),
    ("tokenizer-corpus-plus", "tokenizer train --corpus + --vocab-size 50 --out {tmp}/new", "a source joined by '+'"),
    ("finetune-budget-and-epochs", "finetune classify --model {tiny} --train {tmp}/train.csv --eval {tmp}/train.csv "
     "--out {tmp}/new --budget 20s --epochs 1", "give --epochs or --budget, not both"),
    ("pretrain-mask-prob-zero", "pretrain --corpus {tmp}/texts.txt --mask-prob 0 --out {tmp}/new",
     "--mask-prob must be between 0 and 1, got 0.0"),
    ("pretrain-holdout-every-1", "pretrain --corpus {tmp}/texts.txt --holdout-every 1 --out {tmp}/new",
     "--holdout-every must be 0 (none held out) or at least 2 (1 holds out every document"),
    ("predict-empty-text", "predict classify --model {classifier} \x01".replace("\x01", ""), "text 1: empty text"),
    ("predict-zero-width-text", "predict classify --model {classifier} fine \u200b", "text 2: no tokens in '\\u200b'"),
    ("predict-zero-width-line", "predict classify --model {classifier} --input {tmp}/zero_width.txt",
     "zero_width.txt, line 2 (text): no tokens in '\\u200b'"),
    ("encode-zero-width-line", "encode --model {tiny} --input {tmp}/zero_width.txt --output {tmp}/new.npy",
     "zero_width.txt, line 2: no tokens in '\\u200b' (nothing but characters the tokenizer drops); 1 such text(s)"),
    ("encode-bad-max-seq-length", "encode --model {tiny_st_bad_length} --input {tmp}/texts.txt --output {tmp}/new.npy",
     "sentence_bert_config.json: max_seq_length must be an integer of at least 3 ([CLS], a token, [SEP]), got -3"),
]


@pytest.mark.parametrize("argv, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(argv, expected, tmp_path, models, capsys, monkeypatch):
    _user_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    names = {"tmp": str(tmp_path), **{k: str(v) for k, v in models.items()}}
    args = [a.format(**names).replace("\x00", " ") for a in argv.split(" ")]
    before = _snapshot(tmp_path)
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("bertkit: error:")]
    assert len(errors) == 1 and err.rstrip("\n").splitlines()[-1] == errors[0], err
    assert expected in errors[0]
    assert _snapshot(tmp_path) == before  # nothing changed, added or removed


def test_unreadable_file_is_one_line(tmp_path, models, capsys):
    """chmod 000 blocks reading except for root; as root the folder-as-file case above stands in."""
    if os.geteuid() == 0:
        pytest.skip("root reads any file: chmod 000 cannot make one unreadable")
    secret = tmp_path / "secret.txt"
    secret.write_text("a text\n")
    secret.chmod(0)
    try:
        code = main(["encode", "--model", str(models["tiny"]), "--input", str(secret),
                     "--output", str(tmp_path / "v.npy")])
    finally:
        secret.chmod(0o644)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "secret.txt: permission denied: cannot read the file" in err


def test_overwrite_writes_into_a_non_empty_folder_and_keeps_other_files(tmp_path, models, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    train = tmp_path / "train.csv"
    train.write_text("text,label\na good film,pos\na bad film,neg\n" * 3)
    assert main(["finetune", "classify", "--model", str(models["tiny"]), "--train", str(train), "--eval", str(train),
                 "--out", str(out), "--epochs", "1", "--max-len", "32", "--overwrite"]) == 0
    assert (out / "model.safetensors").is_file() and (out / "notes.txt").read_text() == "mine\n"
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "notes.txt").write_text("mine\n")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog.\n" * 20)
    assert main(["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "60", "--out", str(vocab),
                 "--overwrite"]) == 0
    assert (vocab / "vocab.txt").is_file() and (vocab / "notes.txt").read_text() == "mine\n"
    capsys.readouterr()


def test_options_are_checked_before_the_data_is_read(tmp_path, models, capsys):
    # the training file does not even exist: the option error comes first
    assert main(["finetune", "classify", "--model", str(models["tiny"]), "--train", str(tmp_path / "none.csv"),
                 "--eval", str(tmp_path / "none.csv"), "--out", str(tmp_path / "o"), "--option", "k=3"]) == 2
    assert "--option k: not an option of the classify task" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_predict_default_max_len_fits_a_short_model(models, capsys):
    """A folder whose bertkit.json has no max_len falls back to 128, cut to the model's limit."""
    folder = models["classifier"]
    info = json.loads((folder / "bertkit.json").read_text())
    assert info["max_len"] == 32
    from bertkit.tasks.folder import load_task_model, task_max_len
    task, model, _ = load_task_model(folder, "classify")
    task.info.pop("max_len")
    assert task_max_len(task, model, None) == LIMIT
    assert main(["predict", "classify", "--model", str(folder), " ".join(["word"] * 200)]) == 0
    capsys.readouterr()


def test_inputs_are_read_once_so_pipes_and_stdin_work(tmp_path, models):
    """A named pipe hung (read once to check blank lines, then waited on for a second read) and
    /dev/stdin came back as "no texts"."""
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "bertkit", "encode", "--model", str(models["tiny"]), "--output"]
    r = subprocess.run([*cmd, str(tmp_path / "a.npy"), "--input", "/dev/stdin"], input="first text\nsecond\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert np_rows(tmp_path / "a.npy") == 2
    fifo = tmp_path / "texts.jsonl"
    os.mkfifo(fifo)
    p = subprocess.Popen([*cmd, str(tmp_path / "b.npy"), "--input", str(fifo)], stderr=subprocess.PIPE, text=True)
    with open(fifo, "w") as f:
        f.write('{"text": "first"}\n{"text": "second"}\n{"text": "third"}\n')
    assert p.wait(timeout=120) == 0, p.stderr.read()
    assert np_rows(tmp_path / "b.npy") == 3


def np_rows(path) -> int:
    import numpy as np
    return len(np.load(path))


def test_texts_after_a_double_dash_may_start_with_a_dash(models, capsys):
    assert main(["predict", "classify", "--model", str(models["classifier"]), "--", "-5 stars", "--fine"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["-5 stars", "--fine"]
    # without it, the error says where such a text goes
    with pytest.raises(SystemExit):
        main(["predict", "classify", "--model", str(models["classifier"]), "-5 stars"])
    assert "a text that starts with '-' goes after '--'" in capsys.readouterr().err


def test_classify_labels_that_only_look_like_numbers_are_strings(tmp_path, models, capsys):
    """'--1' and '²' passed the digits test and then failed int() with a traceback."""
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "a good film,--1\na bad film,\u00b2\n" * 3, encoding="utf-8")
    assert main(["finetune", "classify", "--model", str(models["tiny"]), "--train", str(data), "--eval", str(data),
                 "--out", str(tmp_path / "m"), "--epochs", "1", "--max-len", "16"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "m" / "bertkit.json").read_text())["labels"] == ["--1", "\u00b2"]


def test_the_console_command_exits_with_mains_code_after_its_fast_exit(tmp_path, models):
    """`python -m bertkit` (and the `bertkit` script) freeze the garbage collector before the
    interpreter's teardown: the exit code and the written file must be those of main()."""
    import subprocess
    import sys
    (tmp_path / "t.txt").write_text("first text\nsecond\n")
    cmd = [sys.executable, "-m", "bertkit", "encode", "--model", str(models["tiny"]), "--input",
           str(tmp_path / "t.txt"), "--output", str(tmp_path / "a.npy")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "wrote 2 vectors" in r.stdout, r.stderr
    assert np_rows(tmp_path / "a.npy") == 2
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # exists, no --overwrite
    assert r.returncode == 2 and "already exists" in r.stderr, r.stderr


def test_an_interrupt_outside_a_training_loop_does_not_say_nothing_was_saved(monkeypatch, capsys, tmp_path):
    """Ctrl-C after a fine-tuning loop (during its closing evaluation or plot) printed "nothing was
    saved" beside the checkpoints it had written."""
    import bertkit.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_tokenizer_train", interrupted)
    assert cli.main(["tokenizer", "train", "--corpus", "wiki", "--out", str(tmp_path / "v")]) == 130
    err = capsys.readouterr().err
    assert "nothing was saved" not in err and f"interrupted; what was already written to {tmp_path / 'v'} is kept" in err


def test_qa_predictions_read_jsonl_alone_and_refuse_an_empty_question(tmp_path):
    """`predict qa --input` read any file as JSON lines (a SQuAD .json said 'line 1: not valid JSON'),
    and an empty question was answered."""
    from bertkit.errors import BertkitError
    from bertkit.tasks.qa import QATask
    squad = tmp_path / "dev.json"
    squad.write_text('{"data": []}')
    with pytest.raises(BertkitError, match=r"dev.json: qa predictions read a .jsonl file .* use `bertkit evaluate qa`"):
        QATask().read_inputs(path=squad)
    rows = tmp_path / "q.jsonl"
    rows.write_text('{"question": "who?", "context": "Ann did."}\n{"question": " ", "context": "Bob."}\n')
    with pytest.raises(BertkitError, match=r"q.jsonl, line 2: the question is empty"):
        QATask().read_inputs(path=rows)


def test_encode_on_a_full_disk_keeps_the_file_it_would_replace(tmp_path, models, capsys, monkeypatch):
    """--overwrite on a full disk replaced the old .npy by a truncated one, with a traceback (numpy's
    'OSError: 6912 requested and 2016 written'); a first write left a 0-byte file that a rerun
    called 'already exists'. The output's space is reserved before any work (a write through a
    memory map would die of SIGBUS on a full disk): ENOSPC is injected there, and then at the
    first chunk's write, whose partial file is kept for --resume."""
    import errno

    import bertkit.inference.encode_file as ef
    texts = tmp_path / "texts.txt"
    texts.write_text("first text\nsecond text\n")
    old = tmp_path / "old.npy"
    old.write_bytes(b"my earlier vectors")

    def full_disk(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(ef.os, "posix_fallocate", full_disk)
    for output, extra in ((old, ["--overwrite"]), (tmp_path / "new.npy", [])):
        code = main(["encode", "--model", str(models["tiny"]), "--input", str(texts), "--output", str(output), *extra])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err
        assert f"no space left on device while writing {output}; nothing was written there" in err
    assert old.read_bytes() == b"my earlier vectors"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.npy", "texts.txt"]  # no partial or temporary file
    monkeypatch.undo()  # the space is there now; the first chunk's write fails
    monkeypatch.setattr(ef.os, "pwrite", full_disk)
    code = main(["encode", "--model", str(models["tiny"]), "--input", str(texts), "--output", str(old), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2 and "no space left on device while writing" in err and "--resume continues" in err
    assert old.read_bytes() == b"my earlier vectors"


def test_a_full_disk_while_training_is_one_line_naming_the_file(tmp_path, models, capsys, monkeypatch):
    import errno

    import bertkit.finetune as ft
    train = tmp_path / "train.csv"
    train.write_text("text,label\na good film,pos\na bad film,neg\n" * 3)
    out = tmp_path / "run"

    def full_disk(model, task, tok, folder):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "model.safetensors"))
    monkeypatch.setattr(ft, "save_task_model", full_disk)
    code = main(["finetune", "classify", "--model", str(models["tiny"]), "--train", str(train), "--eval", str(train),
                 "--out", str(out), "--epochs", "1", "--max-len", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"no space left on device while writing {out / 'model.safetensors'}; the checkpoints" in err


def test_a_second_writer_of_the_same_output_is_refused_by_name(tmp_path, models, capsys, wiki_excerpt):
    """Two fine-tunes into one --out both ended 'saved', the folder holding the second's model
    and their metrics interleaved; a second pretraining crashed on the first's shards, and a
    --resume of a run still training on its checkpoint. The first holds the output; the second is
    refused before it writes anything, and the first ends as if alone."""
    from bertkit.files import output_lock
    train = tmp_path / "train.csv"
    train.write_text("text,label\na good film,pos\na bad film,neg\n" * 3)
    texts = tmp_path / "texts.txt"
    texts.write_text("first text\nsecond text\n")
    out, vectors = tmp_path / "run", tmp_path / "v.npy"
    runs = {"finetune": (out, ["finetune", "classify", "--model", str(models["tiny"]), "--train", str(train), "--eval",
                               str(train), "--out", str(out), "--epochs", "1", "--max-len", "32"]),
            "pretrain": (tmp_path / "pre", ["pretrain", "--corpus", str(wiki_excerpt), "--sentence-per-line", "--steps", "2",
                                            "--batch-size", "8", "--max-len", "32", "--vocab-size", "300",
                                            "--out", str(tmp_path / "pre"), "--no-samples"]),
            "encode": (vectors, ["encode", "--model", str(models["tiny"]), "--input", str(texts), "--output", str(vectors)])}
    for command, (path, argv) in runs.items():
        flag = "--output" if command == "encode" else "--out"
        with output_lock(path, "bertkit " + command, flag):  # the first run, still writing
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert f"{path} is being written by another bertkit process (bertkit {command}, process" in err
            assert f"wait for it to end, or choose another {flag}" in err
            assert not path.exists()  # the second wrote nothing
        assert main(argv) == 0, capsys.readouterr().err  # once the first has ended
        assert not list(tmp_path.glob(".*.lock"))  # the lock files are gone
    import numpy as np
    assert np.load(vectors).shape == (2, 32)  # written whole, through a temporary file that is gone
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".v.npy") or p.name.endswith(".tmp.npy")] == []
