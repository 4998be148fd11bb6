"""Property-based tests over every input reader.

Each reader gets arbitrary Unicode, control characters, empty and very long lines, random
bytes, UTF-16 text and truncated copies of valid files. The outcome is always either a correct
parse or a BertkitError whose message names the file: never another exception, never a silent
partial read.

What "not a silent partial read" means for a valid file cut at a random byte, per format:
- JSON (SQuAD), JSONL (classify, summarize, word, encode/predict input) and CSV/TSV written with
  every field quoted: an error, or exactly the records that are complete in the cut text. A cut
  JSON object is never valid JSON, and a cut quoted field leaves its quote open, which the
  strict CSV reader refuses.
- line formats without closing syntax (CoNLL, raw text corpus, vocab.txt, .txt inputs, CSV
  without quotes): a cut inside the last line leaves a line that is a valid line of its own (a
  file needs no final newline), so the cut cannot be told from a shorter value. The outcome
  is an error, or the complete records plus at most one more, which is the record the cut fell
  in, cut at the same point (every value equal but the last, which is a prefix of the original).
"""
from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bertkit.data.readers import read_classify, read_conll, read_summarize, read_word
from bertkit.errors import BertkitError
from bertkit.inputs import read_text_inputs
from bertkit.pretraining.corpus import iter_documents
from bertkit.tasks.squad import QAExample, read_squad
from bertkit.tokenizer import SPECIAL_TOKENS, WordPieceTokenizer

SETTINGS = settings(max_examples=50, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------------------- the readers
def _vocab(path):
    tok = WordPieceTokenizer.from_vocab(path, lowercase=True)
    return [tok.id_to_token(i) for i in range(tok.vocab_size)]


def _vocab_folder(path):
    # from_folder reads the folder's vocab.txt: the file is written under that name
    tok = WordPieceTokenizer.from_folder(Path(path).parent)
    return [tok.id_to_token(i) for i in range(tok.vocab_size)]


def _inputs(path):
    got = read_text_inputs(path)
    return [{"text": t, **({"text_pair": p} if got.pairs else {})}
            for t, p in zip(got.texts, got.pairs or [None] * len(got.texts))]


def _classify(path):  # the records without their line numbers
    return [{k: v for k, v in r.items() if k != "line"} for r in read_classify(path)]


READERS: dict[str, tuple[Callable, str]] = {   # name -> (reader, file name)
    "classify_csv": (_classify, "data.csv"),
    "classify_tsv": (_classify, "data.tsv"),
    "classify_jsonl": (_classify, "data.jsonl"),
    "conll": (read_conll, "data.conll"),
    "squad": (read_squad, "data.json"),
    "summarize": (read_summarize, "data.jsonl"),
    "word_csv": (read_word, "data.csv"),
    "word_jsonl": (read_word, "data.jsonl"),
    "corpus": (lambda p: list(iter_documents(p)), "corpus.txt"),
    "vocab": (_vocab, "vocab.txt"),
    "vocab_folder": (_vocab_folder, "vocab.txt"),
    "inputs_txt": (_inputs, "inputs.txt"),
    "inputs_jsonl": (_inputs, "inputs.jsonl"),
}


def _write(factory, name: str, data: bytes) -> Path:
    path = factory.mktemp("prop") / name
    path.write_bytes(data)
    return path


def _outcome(reader, path: Path):
    """(result, None) or (None, error); any exception but BertkitError fails the test, and so
    does an error that does not name the file."""
    try:
        return reader(path), None
    except BertkitError as e:
        assert str(path) in str(e), f"the error does not name {path}: {e}"
        assert "\n" not in str(e).replace(str(path), ""), f"more than one line: {e!r}"
        return None, e


# ---------------------------------------------------------------------------- text strategies
# valid values: any character but surrogates, NUL (a file of NULs reads as UTF-16), the
# byte-order mark (a leading one is dropped, as spreadsheet programs write it) and line breaks
SAFE = st.characters(exclude_categories=("Cs",), exclude_characters="\x00\ufeff\r\n")
# one word: no whitespace of any kind (str.split() splits at all of it)
WORDCHAR = st.characters(exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), exclude_characters="\ufeff")


def nonblank(max_size=30):
    return st.text(SAFE, min_size=1, max_size=max_size).filter(lambda s: s.strip())


def word(max_size=12):
    return st.text(WORDCHAR, min_size=1, max_size=max_size).filter(
        lambda s: not any(c.isspace() for c in s) and s != "-DOCSTART-")


# text for a corpus line: no character that str.splitlines breaks at, nor controls
LINECHAR = st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp"), exclude_characters="\ufeff")
CONTROLS = st.characters(max_codepoint=0x1F) | st.sampled_from("\x7f\x85\u2028\u2029\ufeff\u200b\ufffe")


@dataclass
class Valid:
    """A valid file: its text, the records a reader must return, and where each record ends
    (character offset just after its last character: a cut at or after it keeps it whole)."""
    text: str
    records: list
    ends: list[int]
    finish: Callable = lambda records: records     # records as the reader returns them (label types)
    exact: bool = True                              # see the module docstring
    partial: Callable | None = None                 # (cut record, original record) -> ok


def _byte_ends(v: Valid) -> list[int]:
    return [len(v.text[:end].encode("utf-8")) for end in v.ends]


def _csv_text(rows: list[list[str]], delimiter: str, quoting) -> tuple[str, list[int]]:
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter, quoting=quoting, lineterminator="\n")
    ends = []
    for row in rows:
        writer.writerow(row)
        ends.append(len(buf.getvalue()) - 1)  # before the newline
    return buf.getvalue(), ends


def _table_labels(records):
    out = [dict(r, label=r["label"].strip()) for r in records]
    if out and all(re.fullmatch(r"-?(0|[1-9]\d*)", r["label"]) for r in out):  # the documented int conversion
        out = [dict(r, label=int(r["label"])) for r in out]
    return out


def _jsonl_labels(records):
    return [dict(r, label=r["label"].strip() if isinstance(r["label"], str) else r["label"]) for r in records]


@st.composite
def classify_files(draw, kind):
    pair = draw(st.booleans())
    int_labels = draw(st.booleans())
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        r = {"text": draw(nonblank())}
        if pair:
            r["text_pair"] = draw(nonblank())
        label = draw(st.integers(-3, 30))
        r["label"] = label if int_labels else draw(nonblank(10))
        rows.append(r)
    if kind == "jsonl":
        ascii_only = draw(st.booleans())
        lines = [json.dumps(r, ensure_ascii=ascii_only) for r in rows]
        text = "".join(line + "\n" for line in lines)
        ends = [sum(len(line) + 1 for line in lines[:i + 1]) - 1 for i in range(len(lines))]
        return Valid(text, rows, ends, _jsonl_labels)
    cols = ["text"] + (["text_pair"] if pair else []) + ["label"]
    table = [cols] + [[str(r[c]) for c in cols] for r in rows]
    text, ends = _csv_text(table, "\t" if kind == "tsv" else ",", csv.QUOTE_ALL)
    records = [{**r, "label": str(r["label"])} for r in rows]
    return Valid(text, records, ends[1:], _table_labels)


@st.composite
def word_files(draw, kind, quoting=csv.QUOTE_ALL):
    rows = [{"text": draw(nonblank()), "word": draw(word())} for _ in range(draw(st.integers(1, 5)))]
    if kind == "jsonl":
        lines = [json.dumps(r, ensure_ascii=draw(st.booleans())) for r in rows]
        text = "".join(line + "\n" for line in lines)
        ends = [sum(len(line) + 1 for line in lines[:i + 1]) - 1 for i in range(len(lines))]
        return Valid(text, rows, ends)
    header = draw(st.booleans())
    table = ([["text", "word"]] if header else []) + [[r["text"], r["word"]] for r in rows]
    text, ends = _csv_text(table, ",", quoting)
    exact = quoting == csv.QUOTE_ALL

    def partial(got, want):  # cut in the last field: the word is a prefix of the original
        return got["text"] == want["text"] and want["word"].startswith(got["word"])
    return Valid(text, rows, ends[1:] if header else ends, exact=exact, partial=partial)


@st.composite
def conll_files(draw):
    sentences = [[(draw(word()), draw(word(8))) for _ in range(draw(st.integers(1, 4)))]
                 for _ in range(draw(st.integers(1, 4)))]
    sep = draw(st.sampled_from([" ", "\t", "  "]))
    text, ends = "", []
    for i, sent in enumerate(sentences):
        if i:
            text += "\n"
        for tok, tag in sent:
            text += f"{tok}{sep}{tag}"
            end = len(text)
            text += "\n"
        ends.append(end)
    records = [([t for t, _ in s], [g for _, g in s]) for s in sentences]

    def partial(got, want):  # the sentence cut in its last line's tag
        (toks, tags), (wtoks, wtags) = got, want
        n = len(toks)
        return (1 <= n <= len(wtoks) and len(tags) == n and toks == wtoks[:n] and tags[:-1] == wtags[:n - 1]
                and wtags[n - 1].startswith(tags[-1]))
    return Valid(text, records, ends, exact=False, partial=partial)


@st.composite
def squad_files(draw):
    data, records, n = [], [], 0
    v2 = draw(st.booleans())
    for _ in range(draw(st.integers(1, 2))):
        title = draw(st.text(max_size=10))
        paragraphs = []
        for _ in range(draw(st.integers(1, 2))):
            context = draw(st.text(min_size=1, max_size=60).filter(lambda s: s.strip()))
            visible = [i for i, c in enumerate(context) if not c.isspace()]
            qas = []
            for _ in range(draw(st.integers(1, 3))):
                n += 1
                qid, question = f"q{n}", draw(nonblank(20))  # an empty question is refused
                impossible = v2 and draw(st.booleans())
                answers = []
                if not impossible:
                    for _ in range(draw(st.integers(1, 2))):
                        i = draw(st.sampled_from(visible))
                        start = draw(st.integers(0, i))
                        end = draw(st.integers(i + 1, len(context)))
                        answers.append({"text": context[start:end], "answer_start": start})
                qa = {"id": qid, "question": question, "answers": answers}
                if v2:
                    qa["is_impossible"] = impossible
                qas.append(qa)
                records.append(QAExample(qid, question, context, answers, impossible, title))
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": title, "paragraphs": paragraphs})
    text = json.dumps({"version": "v2.0" if v2 else "1.1", "data": data},
                      ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1]))) + "\n"
    # one JSON document: every question is complete only with the closing brace
    return Valid(text, records, [len(text) - 1] * len(records))


@st.composite
def summarize_files(draw):
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        k = draw(st.integers(1, 4))
        rows.append({"sentences": [draw(nonblank()) for _ in range(k)],
                     "labels": [draw(st.integers(0, 1)) for _ in range(k)]})
    lines = [json.dumps(r, ensure_ascii=draw(st.booleans())) for r in rows]
    text = "".join(line + "\n" for line in lines)
    ends = [sum(len(line) + 1 for line in lines[:i + 1]) - 1 for i in range(len(lines))]
    return Valid(text, rows, ends)


def _squeeze(s: str) -> str:
    return "".join(s.split())


@st.composite
def corpus_files(draw):
    docs = [[draw(st.text(LINECHAR, min_size=1, max_size=80).filter(lambda s: s.strip()))
             for _ in range(draw(st.integers(1, 3)))] for _ in range(draw(st.integers(1, 4)))]
    text, ends = "", []
    for i, doc in enumerate(docs):
        if i:
            text += "\n"
        for line in doc:
            text += line
            end = len(text)
            text += "\n"
        ends.append(end)
    # sentence splitting is pysbd's: a document is compared by its text without whitespace
    records = [_squeeze("".join(doc)) for doc in docs]

    def partial(got, want):
        return want.startswith(got)
    return Valid(text, records, ends, exact=False, partial=partial)


def _corpus_records(docs):
    return [_squeeze("".join(sentences)) for sentences in docs]


@st.composite
def vocab_files(draw):
    token = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00\ufeff\n\r"), max_size=10)
    tokens = draw(st.lists(token.filter(lambda t: t not in SPECIAL_TOKENS), unique=True, max_size=12))
    specials = draw(st.permutations(SPECIAL_TOKENS))
    at = draw(st.integers(0, len(tokens)))
    lines = tokens[:at] + list(specials) + tokens[at:]
    text = "".join(t + "\n" for t in lines)
    # a token ends with its last character; an empty one only with its newline (an empty last
    # line is no line)
    ends = [sum(len(t) + 1 for t in lines[:i + 1]) - (0 if lines[i] == "" else 1) for i in range(len(lines))]

    def partial(got, want):
        return want.startswith(got)
    return Valid(text, lines, ends, exact=False, partial=partial)


@st.composite
def input_files(draw, kind):
    if kind == "jsonl":
        pair = draw(st.booleans())
        rows = [{"text": draw(st.text(max_size=20)), **({"text_pair": draw(st.text(max_size=20))} if pair else {})}
                for _ in range(draw(st.integers(1, 5)))]
        lines = [json.dumps(r, ensure_ascii=draw(st.booleans())) for r in rows]
        text = "".join(line + "\n" for line in lines)
        ends = [sum(len(line) + 1 for line in lines[:i + 1]) - 1 for i in range(len(lines))]
        return Valid(text, rows, ends)
    lines = draw(st.lists(st.one_of(nonblank(), st.just(""), st.just("  ")), min_size=1, max_size=8))
    assume(any(line.strip() for line in lines))
    text = "".join(line + "\n" for line in lines)
    ends, records, offset = [], [], 0
    for line in lines:
        if line.strip():
            records.append({"text": line})
            ends.append(offset + len(line))
        offset += len(line) + 1

    def partial(got, want):
        return want["text"].startswith(got["text"])
    return Valid(text, records, ends, exact=False, partial=partial)


VALID: dict[str, tuple[st.SearchStrategy, Callable | None]] = {   # reader name -> (files, result -> records)
    "classify_csv": (classify_files("csv"), None),
    "classify_tsv": (classify_files("tsv"), None),
    "classify_jsonl": (classify_files("jsonl"), None),
    "conll": (conll_files(), None),
    "squad": (squad_files(), None),
    "summarize": (summarize_files(), None),
    "word_csv": (word_files("csv"), None),
    "word_jsonl": (word_files("jsonl"), None),
    "corpus": (corpus_files(), _corpus_records),
    "vocab": (vocab_files(), None),
    "vocab_folder": (vocab_files(), None),
    "inputs_txt": (input_files("txt"), None),
    "inputs_jsonl": (input_files("jsonl"), None),
}


# ---------------------------------------------------------------------------- the properties
@pytest.mark.parametrize("name", list(READERS))
@SETTINGS
@given(data=st.data())
def test_valid_file_parses_to_what_was_written(tmp_path_factory, name, data):
    reader, filename = READERS[name]
    strategy, convert = VALID[name]
    valid = data.draw(strategy)
    path = _write(tmp_path_factory, filename, valid.text.encode("utf-8"))
    got, err = _outcome(reader, path)
    assert err is None, f"a valid file was refused: {err}"
    assert (convert or (lambda r: r))(got) == valid.finish(valid.records)


@pytest.mark.parametrize("name", list(READERS))
@SETTINGS
@given(data=st.data())
def test_truncated_file_is_an_error_or_exactly_its_complete_records(tmp_path_factory, name, data):
    reader, filename = READERS[name]
    strategy, convert = VALID[name]
    valid = data.draw(strategy)
    full = valid.text.encode("utf-8")
    cut = data.draw(st.integers(0, len(full) - 1), label="cut")
    path = _write(tmp_path_factory, filename, full[:cut])
    got, err = _outcome(reader, path)
    if err is not None:
        return
    got = (convert or (lambda r: r))(got)
    complete = [r for r, end in zip(valid.records, _byte_ends(valid)) if end <= cut]
    if valid.exact:
        assert got == valid.finish(complete), f"cut at byte {cut}: a partial read"
        return
    # one more record is allowed: the one the cut fell in, cut at the same point
    expected = valid.finish(complete)
    assert got[:len(expected)] == expected, f"cut at byte {cut}: complete records lost or changed"
    extra = got[len(expected):]
    assert len(extra) <= 1, f"cut at byte {cut}: {len(extra)} records beyond the complete ones"
    if extra:
        want = valid.finish(valid.records)[len(expected)]
        assert valid.partial(extra[0], want), f"cut at byte {cut}: {extra[0]!r} is not a cut of {want!r}"


@pytest.mark.parametrize("quoting", [csv.QUOTE_MINIMAL, csv.QUOTE_NONNUMERIC])
@SETTINGS
@given(data=st.data())
def test_truncated_unquoted_word_csv(tmp_path_factory, quoting, data):
    # without quotes a cut last field is a shorter field; a cut header is never a row of data
    valid = data.draw(word_files("csv", quoting))
    full = valid.text.encode("utf-8")
    cut = data.draw(st.integers(0, len(full) - 1), label="cut")
    path = _write(tmp_path_factory, "data.csv", full[:cut])
    got, err = _outcome(read_word, path)
    if err is None:
        complete = [r for r, end in zip(valid.records, _byte_ends(valid)) if end <= cut]
        assert got[:len(complete)] == complete and len(got) <= len(complete) + 1
        if len(got) > len(complete):
            assert valid.partial(got[-1], valid.records[len(complete)])


@pytest.mark.parametrize("name", list(READERS))
@SETTINGS
@given(text=st.text())
def test_arbitrary_unicode(tmp_path_factory, name, text):
    reader, filename = READERS[name]
    _outcome(reader, _write(tmp_path_factory, filename, text.encode("utf-8")))


@pytest.mark.parametrize("name", list(READERS))
@SETTINGS
@given(blob=st.binary(max_size=2000))
def test_random_bytes(tmp_path_factory, name, blob):
    reader, filename = READERS[name]
    _outcome(reader, _write(tmp_path_factory, filename, blob))


LINE = st.one_of(st.just(""), st.text(CONTROLS, max_size=10), st.text(max_size=40),
                 st.integers(1_000, 30_000).map(lambda n: ("word " * n)[:n]),   # very long lines
                 st.integers(1_000, 30_000).map(lambda n: "x" * n))


@pytest.mark.parametrize("name", list(READERS))
@SETTINGS
@given(lines=st.lists(LINE, max_size=6), newline=st.sampled_from(["\n", "\r\n", "\r"]))
def test_control_characters_empty_and_very_long_lines(tmp_path_factory, name, lines, newline):
    reader, filename = READERS[name]
    _outcome(reader, _write(tmp_path_factory, filename, newline.join(lines).encode("utf-8")))


@pytest.mark.parametrize("name", list(READERS))
@SETTINGS
@given(data=st.data())
def test_valid_file_with_control_characters_or_long_lines_inside(tmp_path_factory, name, data):
    # a valid file with a control-character or very long line spliced in at a line break
    reader, filename = READERS[name]
    valid = data.draw(VALID[name][0])
    lines = valid.text.split("\n")
    at = data.draw(st.integers(0, len(lines)))
    lines.insert(at, data.draw(LINE))
    got, err = _outcome(reader, _write(tmp_path_factory, filename, "\n".join(lines).encode("utf-8")))
    if err is None:  # read whole: the records that end two lines or more before the splice are the valid file's
        cutoff = len("\n".join(lines[:max(0, at - 1)]))
        expected = valid.finish([r for r, end in zip(valid.records, valid.ends) if end < cutoff])
        got = (VALID[name][1] or (lambda r: r))(got)[:len(expected)]
        # a spliced row whose label is not an integer keeps the whole table's labels strings
        assert _labels_as_text(got) == _labels_as_text(expected)


def _labels_as_text(records: list) -> list:
    return [{**r, "label": str(r["label"])} if isinstance(r, dict) and "label" in r else r
            for r in records]


@pytest.mark.parametrize("name", list(READERS))
@SETTINGS
@given(data=st.data())
def test_utf16_file_is_named_as_utf16(tmp_path_factory, name, data):
    reader, filename = READERS[name]
    valid = data.draw(VALID[name][0])
    encoding = data.draw(st.sampled_from(["utf-16", "utf-16-le", "utf-16-be"]))
    blob = valid.text.encode(encoding)
    if encoding == "utf-16":
        blob = blob if blob.startswith((b"\xff\xfe", b"\xfe\xff")) else b"\xff\xfe" + blob
    path = _write(tmp_path_factory, filename, blob)
    got, err = _outcome(reader, path)
    if encoding == "utf-16" or valid.text.isascii():
        # with a byte-order mark, or ASCII text (every other byte NUL): always recognised
        assert err is not None and "UTF-16" in str(err), f"UTF-16 file read as {got!r}"


# ---------------------------------------------------------------------------- the tokenizer
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = _write(tmp_path_factory, "vocab.txt", "".join(t + "\n" for t in SPECIAL_TOKENS + [
        "the", "a", "cat", "##s", "sat", ".", ",", "é", "中", "##at", "c", "s"]).encode("utf-8"))
    return WordPieceTokenizer.from_vocab(path, lowercase=True)


@pytest.mark.filterwarnings("ignore:.*were truncated:UserWarning")
@SETTINGS
@given(texts=st.lists(st.one_of(st.text(), st.text(CONTROLS), st.integers(0, 3000).map(lambda n: "cat " * n)),
                      min_size=1, max_size=4),
       pairs=st.booleans(), max_len=st.integers(4, 64), truncation=st.booleans())
def test_tokenizer_encodes_any_text(tokenizer, texts, pairs, max_len, truncation):
    pair_texts = list(reversed(texts)) if pairs else None
    try:
        batch = tokenizer.encode(texts, pair_texts, max_len=max_len, truncation=truncation)
    except BertkitError as e:
        assert not truncation and "over the limit" in str(e)
        return
    n, T = batch.input_ids.shape
    assert n == len(texts) and T <= max_len
    assert batch.input_ids.min() >= 0 and batch.input_ids.max() < tokenizer.vocab_size
    for row, mask, tokens in zip(batch.input_ids.tolist(), batch.attention_mask.tolist(), batch.tokens):
        length = sum(mask)
        assert row[0] == tokenizer.cls_id and row[length - 1] == tokenizer.sep_id
        assert row[length:] == [tokenizer.pad_id] * (T - length) and len(tokens) == length
        assert row.count(tokenizer.sep_id) >= (2 if pairs else 1)
    for text in texts:
        assert all(0 <= i < tokenizer.vocab_size for i in tokenizer.tokenize_ids(text))


# ---------------------------------------------------------------------------- found cases
# inputs json.loads refuses with something other than JSONDecodeError
@pytest.mark.parametrize("name", ["classify_jsonl", "summarize", "word_jsonl", "inputs_jsonl", "squad"])
@pytest.mark.parametrize("content", ['{"text": "a", "label": ' + "9" * 5000 + "}\n",   # ValueError
                                     "[" * 100_000 + "\n"],                            # RecursionError
                         ids=["huge_int", "deep_nesting"])
def test_json_that_python_refuses_is_an_error_naming_the_file(tmp_path, name, content):
    reader, filename = READERS[name]
    path = tmp_path / filename
    path.write_text(content)
    with pytest.raises(BertkitError, match=re.escape(str(path)) + ".*not valid JSON"):
        reader(path)


def test_csv_cut_inside_a_quoted_field_is_an_error(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('text,label\n"a fine film",pos\n"a dull fi')
    with pytest.raises(BertkitError, match=r"data\.csv, line 3: malformed CSV .*ends inside a quoted field"):
        read_classify(path)
    path.write_text('"text","label"\n"a fine film","pos"\n"a dull film","ne')
    with pytest.raises(BertkitError, match="ends inside a quoted field"):
        read_classify(path)


def test_word_csv_cut_header_is_not_a_row(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text,wo")
    with pytest.raises(BertkitError, match=r"data\.csv, line 1: the header needs columns text, word"):
        read_word(path)
    path.write_text("very chonky,size\nrather tiny,size\n")  # a file without a header still reads
    assert read_word(path) == [{"text": "very chonky", "word": "size"}, {"text": "rather tiny", "word": "size"}]


# pysbd stands these in for punctuation while it works and turns them back at the end: a text
# that holds them itself came back changed ("∯" as "."), a silent change of the corpus
PYSBD_PLACEHOLDERS = "∯ȸȹ☉☈☇☄&ᓴᓷᓰᓱᓳᓸ✂⎋♨☝"


@SETTINGS
@given(text=st.text(st.sampled_from(PYSBD_PLACEHOLDERS + ".!?()'\"“”:;, aZ1\u3002"), max_size=60))
def test_sentence_splitting_keeps_every_character(text):
    from bertkit.text import split_sentences
    sentences = split_sentences(text)
    assert "".join("".join(sentences).split()) == "".join(text.split())
    assert all(s and s == s.strip() for s in sentences)


def test_pysbd_placeholder_characters_survive_a_corpus(tmp_path):
    path = tmp_path / "maths.txt"
    path.write_text("The integral ∯ over S. It is zero.\n\nAnother & ᓴ & document here!\n")
    docs = list(iter_documents(path))
    assert ["".join("".join(d).split()) for d in docs] == ["Theintegral∯overS.Itiszero.", "Another&ᓴ&documenthere!"]


def test_corpus_in_utf16_without_a_byte_order_mark_is_named_utf16(tmp_path):
    # it was called binary ("looks binary: NUL byte at byte offset 1")
    path = tmp_path / "corpus.txt"
    path.write_bytes("One document.\n\nAnother one.\n".encode("utf-16-le"))
    with pytest.raises(BertkitError, match=r"corpus\.txt: the file looks like UTF-16 text without a byte-order mark"):
        list(iter_documents(path))
    path.write_bytes(b"\0" * 64)  # NULs alone are binary, not UTF-16
    with pytest.raises(BertkitError, match=r"corpus\.txt: looks binary: NUL byte at byte offset 0"):
        list(iter_documents(path))


def test_a_header_with_a_line_break_is_named_on_one_line(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text('"te\nxt",label\nhi,pos\n')
    with pytest.raises(BertkitError) as err:
        read_classify(path)
    assert "\n" not in str(err.value) and "'te\\nxt'" in str(err.value)


def test_csv_labels_become_ints_only_as_an_int_prints_them(tmp_path):
    """"01" and "02" are labels as written: as ints they printed as "1" and "2" in bertkit.json and
    predictions, and an evaluation file that spells them "01" was refused."""
    from bertkit.data.readers import read_classify
    (tmp_path / "a.csv").write_text("text,label\ngood,01\nbad,02\n")
    (tmp_path / "b.csv").write_text("text,label\ngood,1\nbad,-2\nmeh,0\n")
    assert [r["label"] for r in read_classify(tmp_path / "a.csv")] == ["01", "02"]
    assert [r["label"] for r in read_classify(tmp_path / "b.csv")] == [1, -2, 0]


def _streamed(path: Path):
    """encode's reading of a file: one scan, then chunk by chunk (3 rows each, to cross chunks)."""
    from bertkit.inputs import TextInputs, read_chunk, scan_text_inputs
    scan = scan_text_inputs(path, 3)
    parts = [read_chunk(scan, c) for c in range(scan.chunks)]
    return TextInputs([t for p in parts for t in p.texts],
                      [t for p in parts for t in p.pairs] if scan.pairs else None)


@pytest.mark.parametrize("suffix", ["txt", "jsonl"])
@SETTINGS
@given(data=st.data())
def test_the_streamed_scan_reads_what_the_whole_file_reader_reads(tmp_path_factory, suffix, data):
    """scan_text_inputs + read_chunk (encode's reader: constant memory) against read_text_inputs
    (the whole file at once, rows as encode must write them): both refuse a file, or both read the
    same texts and pairs; valid files, valid files cut short, any text, any bytes."""
    from bertkit.inputs import read_text_inputs
    valid = data.draw(input_files(suffix)).text.encode("utf-8")
    blob = data.draw(st.one_of(st.just(valid), st.integers(0, len(valid)).map(lambda n: valid[:n]),
                               st.text().map(lambda t: t.encode("utf-8")), st.binary(max_size=300),
                               st.lists(LINE, max_size=6).map(lambda ls: "\n".join(ls).encode("utf-8"))))
    path = _write(tmp_path_factory, f"inputs.{suffix}", blob)
    whole, whole_err = _outcome(lambda p: read_text_inputs(p, blank_lines="refuse"), path)
    streamed, streamed_err = _outcome(_streamed, path)
    assert (whole_err is None) == (streamed_err is None), (whole_err, streamed_err)
    if whole is not None:
        assert streamed == whole
        assert len(whole.texts) > 0  # a successful parse holds texts, row for row
