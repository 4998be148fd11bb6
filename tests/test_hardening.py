"""Library-level checks behind the command line's bad-input handling (see test_cli_bad_input.py):
output paths, shared file readers, blank lines, task options, vocabulary size, fill-mask
truncation and bounded sentence splitting."""
import math

import pytest

from bertkit.errors import BertkitError


# ---- output paths ----------------------------------------------------------------------------
def test_output_folder_checks(tmp_path):
    from bertkit.outputs import check_output_folder
    assert check_output_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    (tmp_path / "empty").mkdir()
    check_output_folder(tmp_path / "empty")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    with pytest.raises(BertkitError, match=r"full: the folder is not empty \(it already holds config\.json\)"):
        check_output_folder(tmp_path / "full")
    check_output_folder(tmp_path / "full", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["config.json"]  # the probe left nothing
    (tmp_path / "file").write_text("x")
    with pytest.raises(BertkitError, match="exists and is not a folder"):
        check_output_folder(tmp_path / "file")
    with pytest.raises(BertkitError, match="file is a file, not a folder"):
        check_output_folder(tmp_path / "file" / "sub" / "run")
    with pytest.raises(BertkitError, match=r"--out /proc/no/such: cannot write in /proc"):
        check_output_folder("/proc/no/such")


def test_output_file_checks(tmp_path):
    from bertkit.outputs import check_output_file
    check_output_file(tmp_path / "a" / "v.npy")
    (tmp_path / "v.npy").write_bytes(b"x")
    with pytest.raises(BertkitError, match="already exists; choose another --output or pass --overwrite"):
        check_output_file(tmp_path / "v.npy")
    check_output_file(tmp_path / "v.npy", overwrite=True)
    with pytest.raises(BertkitError, match="is a folder"):
        check_output_file(tmp_path)
    with pytest.raises(BertkitError, match="v.npy is a file, not a folder"):
        check_output_file(tmp_path / "v.npy" / "w.npy")
    with pytest.raises(BertkitError, match="cannot write in /proc"):
        check_output_file("/proc/v.npy")


# ---- shared readers --------------------------------------------------------------------------
@pytest.mark.parametrize("encoding, name", [("utf-16", "little-endian"), ("utf-16-le", None), ("utf-16-be", None)])
def test_utf16_is_named_as_utf16(tmp_path, encoding, name):
    from bertkit.inputs import read_text
    path = tmp_path / "t.txt"
    path.write_bytes("text,label\nfine film,pos\n".encode(encoding))
    expected = f"UTF-16 \\({name}\\) text" if name else "looks like UTF-16 text without a byte-order mark"
    with pytest.raises(BertkitError, match=expected + ".*save it as UTF-8"):
        read_text(path)


def test_readers_give_one_line_for_folders_and_missing_files(tmp_path):
    from bertkit.data.readers import read_conll
    from bertkit.inputs import read_text
    from bertkit.pretraining.corpus import iter_documents
    from bertkit.tokenizer import WordPieceTokenizer
    (tmp_path / "dir.conll").mkdir()
    with pytest.raises(BertkitError, match="dir.conll: is a folder, expected a file"):
        read_conll(tmp_path / "dir.conll")
    with pytest.raises(BertkitError, match="nope.txt: no such file"):
        read_text(tmp_path / "nope.txt")
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_bytes("[PAD]\n[UNK]\n".encode("utf-16"))
    with pytest.raises(BertkitError, match=r"vocab\.txt: the file is UTF-16"):
        WordPieceTokenizer.from_folder(tmp_path / "vocab")
    (tmp_path / "corpus.txt").write_bytes("One sentence.\n\nAnother one.\n".encode("utf-16"))
    with pytest.raises(BertkitError, match=r"corpus\.txt: the file is UTF-16"):
        list(iter_documents(tmp_path / "corpus.txt"))


def test_unreadable_file_names_the_file(tmp_path):
    import os

    from bertkit.inputs import read_text
    path = tmp_path / "secret.txt"
    path.write_text("x")
    if os.geteuid() == 0:  # root reads anything: simulate the failure below the reader
        from unittest import mock
        with mock.patch("pathlib.Path.open", side_effect=PermissionError(13, "Permission denied")):
            with pytest.raises(BertkitError, match="secret.txt: permission denied"):
                read_text(path)
        return
    path.chmod(0)
    try:
        with pytest.raises(BertkitError, match="secret.txt: permission denied"):
            read_text(path)
    finally:
        path.chmod(0o644)


def test_encode_inputs_refuse_blank_lines_between_texts(tmp_path):
    from bertkit.inputs import read_text_inputs
    path = tmp_path / "in.txt"
    path.write_text("a\nb\n\n\n")  # trailing blank lines shift nothing
    assert read_text_inputs(path, blank_lines="refuse").texts == ["a", "b"]
    path.write_text("a\n \nb\n")
    with pytest.raises(BertkitError, match=r"in\.txt, line 2: blank line .*row i of the output is line i"):
        read_text_inputs(path, blank_lines="refuse")
    assert read_text_inputs(path).texts == ["a", "b"]  # predict still skips them (it echoes each text)
    rows = tmp_path / "in.jsonl"
    rows.write_text('{"text": "a"}\n\n{"text": "b"}\n')
    with pytest.raises(BertkitError, match=r"in\.jsonl, line 2: blank line"):
        read_text_inputs(rows, blank_lines="refuse")


def test_a_lone_surrogate_escape_in_json_is_an_error_naming_the_file_and_line(tmp_path, minilm_folder):
    """JSON's \\ud800 decodes to half a UTF-16 pair, which no text holds: the tokenizer took it
    for a wrong type (a TypeError traceback)."""
    from bertkit.data.readers import read_classify
    from bertkit.inputs import parse_json, read_text_inputs
    from bertkit.tasks.squad import read_squad
    from bertkit.tokenizer import WordPieceTokenizer
    rows = tmp_path / "in.jsonl"
    rows.write_text('{"text": "fine \\ud83d\\ude00", "label": "x"}\n{"text": "bad \\ud800 here", "label": "x"}\n')
    with pytest.raises(BertkitError, match=r"in\.jsonl, line 2: a string holds the lone surrogate \\ud800"):
        read_text_inputs(rows)
    with pytest.raises(BertkitError, match=r"in\.jsonl, line 2: .*lone surrogate"):
        read_classify(rows)
    assert parse_json('"\\ud83d\\ude00"', "x") == "\U0001f600"  # a whole pair is one character
    squad = tmp_path / "squad.json"
    squad.write_text('{"version": "1.1", "data": [\n{"title": "t", "paragraphs": [{"context": "c \\udc00",\n'
                     '"qas": []}]}]}\n')
    with pytest.raises(BertkitError, match=r"squad\.json, line 2: .*lone surrogate \\udc00"):
        read_squad(squad)
    tok = WordPieceTokenizer.from_folder(minilm_folder)  # what the server and the API hand it
    with pytest.raises(BertkitError, match=r"text_pair 1 holds the lone surrogate \\udfff"):
        tok.encode(["a", "b"], ["c", "d\udfff"])


@pytest.mark.parametrize("task", ["ner", "tag", "summarize", "word"])
def test_tasks_of_single_texts_refuse_pairs_rather_than_drop_them(tmp_path, task):
    from bertkit.tasks import get_task
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "Peter runs", "text_pair": "he does"}\n')
    with pytest.raises(BertkitError, match=rf"in\.jsonl: the rows have 'text_pair', but the {task} task reads single"):
        get_task(task)().read_inputs(path=path)
    path.write_text('{"text": "Peter runs."}\n')
    assert len(get_task(task)().read_inputs(path=path)) == 1


def test_classic_mac_line_endings_are_named(tmp_path):
    """Split at newlines only, a file whose lines end in CR alone was one text (or one CoNLL token)."""
    from bertkit.data.readers import read_conll
    from bertkit.inputs import read_text_inputs
    for name, reader in (("in.txt", read_text_inputs), ("in.conll", read_conll)):
        path = tmp_path / name
        path.write_bytes(b"Peter B-PER\rruns O\r\rHe O\r")
        with pytest.raises(BertkitError, match=rf"{name}: lines end in a carriage return alone"):
            reader(path)
    path.write_bytes(b"Peter B-PER\r\nruns O\r\n")  # CRLF is fine
    assert len(read_conll(path)) == 1


def test_a_csv_field_over_128_kib_is_read(tmp_path):
    from bertkit.data.readers import read_classify
    path = tmp_path / "long.csv"
    path.write_text('text,label\n"' + "great " * 40_000 + '",fresh\nbad,rotten\n')
    rows = read_classify(path)
    assert [r["text"] for r in rows] == ["great " * 40_000, "bad"]


def test_saved_model_files_are_as_readable_as_any_file_the_user_writes(tmp_path, tiny_bert_factory):
    """mkstemp made them 0600: the rename carried that to model folders other users read."""
    import stat
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    mode = stat.S_IMODE(plain.stat().st_mode)
    tiny_bert_factory.folder(tmp_path / "m")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "m").iterdir()}
    assert "model.safetensors" in modes and "vocab.txt" in modes
    assert set(modes.values()) == {mode}, (oct(mode), modes)


# ---- finetune configuration and task options -------------------------------------------------
@pytest.mark.parametrize("field, value, message", [
    ("lr", -1.0, "--lr must be a finite number above 0"), ("lr", math.nan, "--lr must be"),
    ("lr", 0.0, "--lr must be"), ("epochs", 0, "--epochs must be an integer of at least 1"),
    ("batch_size", -2, "--batch-size must be"), ("warmup", 1.5, "--warmup must be a number from 0 to 1"),
    ("patience", 0, "--patience must be")])
def test_finetune_config_refuses_bad_numbers(field, value, message):
    from bertkit.finetune import FinetuneConfig
    with pytest.raises(BertkitError, match=message):
        FinetuneConfig("classify", "m", "t", "e", "o", **{field: value})


def test_task_options_are_checked_and_listed():
    from bertkit.tasks import TASKS, get_task
    for name in TASKS:
        task = get_task(name)()
        with pytest.raises(BertkitError, match=f"not an option of the {name} task; valid keys: "):
            task.check_options({"no_such_key": 1})
    qa = get_task("qa")()
    assert qa.check_options({"doc_stride": 64, "version_2": True}) == {"doc_stride": 64, "version_2": True}
    for bad in ({"doc_stride": -1}, {"n_best": 2.5}, {"version_2": "yes"}, {"null_score_diff": math.inf}):
        with pytest.raises(BertkitError, match=f"--option {next(iter(bad))}="):
            qa.check_options(bad)
    assert get_task("classify")().check_options({"dropout": 0}) == {"dropout": 0.0}
    with pytest.raises(BertkitError, match="expected an integer"):
        get_task("summarize")().check_options({"k": True})


# ---- a vocabulary larger than the model; fill-mask past the limit ----------------------------
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory, tiny_bert_factory):
    return tiny_bert_factory.folder(tmp_path_factory.mktemp("tiny"), max_position_embeddings=16)


def test_vocabulary_larger_than_the_embeddings_is_refused(tiny_folder, tmp_path):
    import json
    import shutil

    from bertkit.inference.encode import Encoder
    from bertkit.tokenizer import load_tokenizer
    assert load_tokenizer(tiny_folder).vocab_size == 30522
    folder = tmp_path / "m"
    shutil.copytree(tiny_folder, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "vocab_size": 30000}))
    with pytest.raises(BertkitError, match=r"tokenizer\.json: the tokenizer has 30522 token ids but config\.json "
                                           r"vocab_size is 30000"):
        Encoder.from_folder(folder)


def test_fill_mask_says_a_mask_was_truncated(tiny_folder):
    from bertkit.folders import load_model
    from bertkit.inference.fill_mask import fill_mask
    from bertkit.tokenizer import WordPieceTokenizer
    model, _ = load_model(tiny_folder, quiet=True)
    tok = WordPieceTokenizer.from_folder(tiny_folder)
    assert len(fill_mask(model, tok, ["a [MASK] here"], 2)[0]) == 1
    with pytest.warns(UserWarning, match="truncated"):
        with pytest.raises(BertkitError, match=r"text 1: 1 of its 2 \[MASK\] token\(s\) lie past the model's limit: "
                                               r"the text was truncated at 16 tokens"):
            fill_mask(model, tok, ["a [MASK] here", "[MASK] " + "word " * 30 + "[MASK]"], 2)
    with pytest.raises(BertkitError, match="text 0 has no \\[MASK\\] token"):
        fill_mask(model, tok, ["no mask here"], 2)


# ---- sentence splitting is bounded per line ---------------------------------------------------
def test_chunks_cut_long_paragraphs_at_sentence_ends():
    from bertkit.text import bounded_chunks
    text = "This is one sentence. " * 2000
    chunks = list(bounded_chunks(text, 1000))
    assert "".join(chunks) == text and all(len(c) <= 1000 for c in chunks)
    assert all(c.endswith(". ") for c in chunks[:-1])
    word = "x" * 2500  # no whitespace at all: cut anyway
    assert [len(c) for c in bounded_chunks(word, 1000)] == [1000, 1000, 500]


def test_a_250_kb_single_line_document_goes_to_pysbd_in_bounded_chunks(tmp_path, wiki_excerpt, monkeypatch):
    """pysbd's time grows about quadratically with its input: a 250 KB line given whole took 107 s.
    It gets at most MAX_CHUNK_CHARS at a time (counted, not timed: a clock was flaky under load)."""
    from bertkit import text
    from bertkit.pretraining.corpus import iter_documents
    prose = " ".join(wiki_excerpt.read_text().split())  # real sentences, all on one line
    line = (prose + " ") * (250_000 // len(prose) + 1)
    seg, given = text.sentence_segmenter(), []
    original = seg.processor
    monkeypatch.setattr(seg, "processor", lambda chunk: (given.append(len(chunk)), original(chunk))[1])
    sentences = text.split_sentences(line[:250_000])
    assert len(given) >= 50 and max(given) <= text.MAX_CHUNK_CHARS
    assert len(sentences) > 1000
    path = tmp_path / "one_line.txt"  # and read as a corpus file, in worker processes past 200 k characters
    path.write_text(line[:250_000] + "\n")
    docs = list(iter_documents(path))
    assert len(docs) == 1 and docs[0] == sentences
