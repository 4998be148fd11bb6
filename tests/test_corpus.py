"""Raw text to documents: blank-line boundaries, sentence splitting, bad input, the wiki sample."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.errors import BertkitError
from bertkit.pretraining.corpus import corpus_stats, iter_documents, load_documents, wiki_documents
from bertkit.text import split_sentences


def write(path, content: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_split_sentences_handles_abbreviations_and_paragraphs():
    assert split_sentences("Dr. Smith arrived at 5 p.m. He left early.") == [
        "Dr. Smith arrived at 5 p.m.", "He left early."]
    # A line break ends a paragraph even without a full stop; blank lines leave nothing behind.
    assert split_sentences("  Heading without a stop\n\n \t\nIt is 3.5 km long.  Yes.  ") == [
        "Heading without a stop", "It is 3.5 km long.", "Yes."]
    assert split_sentences(" \n\t\n") == []


def test_documents_are_separated_by_blank_lines(tmp_path):
    text = ("\n\n   \nFirst one. First two.\nFirst three.\n\n\n \t \n\nSecond one.\r\n\r\n"
            "Third one.\n  \n\n")
    f = write(tmp_path / "c.txt", text)
    assert load_documents(f) == [["First one.", "First two.", "First three."], ["Second one."],
                                 ["Third one."]]
    assert load_documents(str(f)) == load_documents(f)


def test_folder_is_read_recursively_in_path_order_and_streamed(tmp_path):
    write(tmp_path / "10.txt", "Ten.")
    write(tmp_path / "02" / "x.txt", "Two x.\n\nTwo x again.")
    write(tmp_path / "01.txt", "One.")
    write(tmp_path / "notes.md", "Not a text file.")
    assert load_documents(tmp_path) == [["One."], ["Two x."], ["Two x again."], ["Ten."]]

    # Streaming: the first file's documents come out before a later, bad file is opened.
    write(tmp_path / "99.txt", b"Bad \xff byte.")
    docs = iter_documents(tmp_path)
    assert next(docs) == ["One."]
    with pytest.raises(BertkitError, match="99.txt: not UTF-8"):
        list(docs)


def test_binary_file_names_the_nul_byte_offset(tmp_path):
    f = write(tmp_path / "b.txt", "é\x00 rest")  # é is two bytes: the NUL is at byte 2
    with pytest.raises(BertkitError, match=r"b\.txt: looks binary: NUL byte at byte offset 2$"):
        load_documents(f)
    # NUL bytes before an invalid byte: binary, not a text file with a bad byte.
    g = write(tmp_path / "g.txt", b"PK\x03\x04\x00\x00\xff\xfe")
    with pytest.raises(BertkitError, match=r"g\.txt: looks binary: NUL byte at byte offset 4$"):
        load_documents(g)


def test_non_utf8_file_names_byte_and_line(tmp_path):
    f = write(tmp_path / "latin.txt", "First line.\ncaf\xe9 au lait.".encode("latin-1"))
    expected = r"latin\.txt: not UTF-8 text: byte 0xe9 at byte offset 15 \(line 2\) is invalid"
    with pytest.raises(BertkitError, match=expected):
        load_documents(f)


def test_missing_and_empty_sources(tmp_path):
    with pytest.raises(BertkitError, match="nope.txt: no such file or folder"):
        iter_documents(tmp_path / "nope.txt")  # fails at the call, not at the first document
    write(tmp_path / "only.md", "text")
    with pytest.raises(BertkitError, match="folder holds no .txt files"):
        load_documents(tmp_path)
    blank = write(tmp_path / "blank.txt", "\n  \n\t\n")
    with pytest.raises(BertkitError, match=r"blank\.txt: the corpus is empty \(no sentences\)"):
        load_documents(blank)


def test_single_document_is_not_enough_for_nsp(tmp_path):
    f = write(tmp_path / "one.txt", "One document. With two sentences.\nAnd a third line.\n")
    expected = r"one\.txt: next sentence prediction needs at least two documents, found 1 \(separate"
    with pytest.raises(BertkitError, match=expected):
        load_documents(f)
    assert list(iter_documents(f)) == [["One document.", "With two sentences.", "And a third line."]]


def test_corpus_stats():
    stats = corpus_stats([["Hello world.", "Hi."], ["A b c."]])
    assert stats == {"documents": 2, "sentences": 3, "words": 6, "characters": 21}


@pytest.fixture(scope="module")
def wiki():
    return list(wiki_documents())


def test_wiki_sample_is_clean_prose(wiki):
    stats = corpus_stats(wiki)
    assert stats["documents"] > 100
    assert stats["words"] > 300_000
    assert stats["sentences"] > 15_000
    sentences = [s for doc in wiki for s in doc]
    for marker in ("'''", "[[", "]]", "{{", "}}", "==", "|", "thumb|", "&amp;", "&nbsp;"):
        bad = [s for s in sentences if marker in s]
        assert not bad, f"{marker!r} left in {len(bad)} sentences, e.g. {bad[0]!r}"
    assert not [s for s in sentences if "#redirect" in s.lower()]
    assert all(s == s.strip() and s for s in sentences)
    # Mostly real sentences: they end in punctuation and are not list fragments.
    ended = sum(s.endswith((".", "!", "?", ":", '"', ")", "'", ";")) for s in sentences)
    assert ended / len(sentences) > 0.97
    assert sum(len(s.split()) < 3 for s in sentences) / len(sentences) < 0.02
    assert "Anarchism is a political philosophy" in wiki[0][0]


def test_one_document_per_file(tmp_path):
    (tmp_path / "a.txt").write_text("First paragraph. Two sentences.\n\nSecond paragraph of a.\n")
    (tmp_path / "b.txt").write_text("Only b.\n")
    assert list(iter_documents(tmp_path, per_file=True)) == [
        ["First paragraph.", "Two sentences.", "Second paragraph of a."], ["Only b."]]
    assert len(list(iter_documents(tmp_path))) == 3


def test_sentence_per_line_takes_each_line_as_one_sentence(tmp_path, wiki_excerpt):
    """Google's create_pretraining_data.py input: one sentence per line, blank lines between
    documents. Lines are used as they are (pysbd would split the first and join nothing)."""
    from bertkit.pretraining.train import PretrainConfig
    corpus = write(tmp_path / "c.txt", "Dr. Smith met Mr. Jones. They talked.\n  Second line  \n\n"
                                      "Another document\n")
    assert list(iter_documents(corpus)) == [["Dr. Smith met Mr. Jones.", "They talked.", "Second line"],
                                            ["Another document"]]
    assert list(iter_documents(corpus, per_line=True)) == [["Dr. Smith met Mr. Jones. They talked.", "Second line"],
                                                           ["Another document"]]
    assert list(iter_documents(corpus, per_file=True, per_line=True)) == [
        ["Dr. Smith met Mr. Jones. They talked.", "Second line", "Another document"]]
    # a corpus written one sentence per line reads back as the documents written
    written = [doc.split("\n") for doc in wiki_excerpt.read_text().strip().split("\n\n")]
    assert list(iter_documents(wiki_excerpt, per_line=True)) == written
    # joined, each text file's part is read per line
    joined = list(iter_documents(f"{wiki_excerpt}+{corpus}", per_line=True))
    assert joined == written + [["Dr. Smith met Mr. Jones. They talked.", "Second line"], ["Another document"]]
    PretrainConfig(corpus=f"wiki+{corpus}", out=str(tmp_path / "o"), sentence_per_line=True)
    for built_in in ("wiki", "wiki+python-docs"):  # nothing to read per line: refused, not ignored
        with pytest.raises(BertkitError, match="--sentence-per-line is for text files"):
            PretrainConfig(corpus=built_in, out=str(tmp_path / "o"), sentence_per_line=True)
    from bertkit.cli import main
    assert main(["tokenizer", "train", "--corpus", "wiki", "--sentence-per-line", "--out", str(tmp_path / "v")]) == 2
    assert not (tmp_path / "v").exists()


def test_worker_processes_split_as_this_process_does(tmp_path, wiki_excerpt, monkeypatch):
    """Past PARALLEL_CHARS a corpus is split in worker processes: the same documents in the same
    order as splitting here, for text files (paragraphs of several sentences), reST and wiki
    articles; batches far smaller than the text, so results cross many batches and workers."""
    import bz2
    from itertools import islice

    from gensim.corpora.wikicorpus import extract_pages

    from bertkit.pretraining import corpus, split_workers
    paragraphs = [" ".join(doc[:12]) + "\n" + " ".join(doc[12:30]) for doc in
                  (d.split("\n") for d in wiki_excerpt.read_text().strip().split("\n\n"))]
    text_file = write(tmp_path / "c.txt", "\n\n".join(paragraphs) + "\n")
    rest = [write(tmp_path / f"r{i}.rst", f"Title {i}\n=======\n\n{p}\n\n* a list item here.\n")
            for i, p in enumerate(paragraphs)]
    with bz2.open(corpus.wiki_dump_path()) as f:
        raws = [raw for _t, raw, _p in islice(extract_pages(f, filter_namespaces=("0",)), 8) if raw.strip()]

    def documents():
        return (list(iter_documents(text_file)), list(iter_documents(text_file, per_file=True)),
                list(corpus.rest_documents(rest)), list(split_workers.map_texts(corpus.wiki_article_sentences, raws)))
    monkeypatch.setattr(split_workers, "worker_count", lambda: 1)
    here = documents()
    started = []
    real_popen = split_workers.subprocess.Popen
    monkeypatch.setattr(split_workers.subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or started[-1])
    monkeypatch.setattr(split_workers, "worker_count", lambda: 3)
    monkeypatch.setattr(split_workers, "PARALLEL_CHARS", 1000)
    monkeypatch.setattr(split_workers, "BATCH_CHARS", 3000)
    assert documents() == here
    assert len(started) == 4 * 3 and all(p.returncode == 0 for p in started)
    assert len(here[0]) == len(paragraphs) and len(here[3]) >= 5 and all(here)

    # a reader that stops early leaves no worker behind; a worker that fails is named
    started.clear()
    docs = iter_documents(text_file)
    next(docs), next(docs)  # the first in this process (past PARALLEL_CHARS), the second from a worker
    docs.close()
    assert len(started) == 3 and all(p.poll() is not None for p in started)
    with pytest.raises(BertkitError, match="a sentence-splitting worker stopped"):
        list(split_workers.map_texts(corpus.split_sentences, ["x" * 2000, b"not text: the worker fails on it"]))


@settings(max_examples=300, deadline=None)
@given(blob=st.one_of(
    st.binary(max_size=3000),
    st.lists(st.sampled_from(["Sentence one.", "", "\r", "\n", "\r\n", "é", "\u2028", "\x85", "\0", "caf\xe9 ok",
                              "A line.\n", "\n\n"]), max_size=60).map(lambda xs: "".join(xs).encode("utf-8")),
    st.lists(st.sampled_from([b"text\n", b"\n", b"\xff", b"\xe9t\xe9\n", b"\0", "é\n".encode()]), max_size=40)
    .map(b"".join)))
def test_streamed_lines_equal_the_whole_file_read(tmp_path_factory, blob):
    """A corpus file is read a line at a time: the same lines and the same errors as reading it whole."""
    from bertkit.pretraining.corpus import file_lines, read_text_file
    path = tmp_path_factory.mktemp("s") / "c.txt"
    path.write_bytes(blob)
    try:
        whole = read_text_file(path).splitlines()
    except BertkitError as e:
        with pytest.raises(BertkitError) as streamed:
            list(file_lines(path))
        assert str(streamed.value) == str(e)
    else:
        assert list(file_lines(path)) == whole


REST = """\
.. _tut-intro:

*****************
An Informal Intro
*****************

The :keyword:`while` statement and :func:`~os.path.join` are explained in
:ref:`the tutorial <tut-loops>`; see ``print()`` and `the site <https://example.org>`_ [#]_.

.. index::
   single: index entries are not prose

Heading
=======

For example, a literal block::

   >>> x = 1
   this literal block is code

.. code-block:: python

   print("a code block is not prose")

>>> 1 + 1
2

+-------+-------+
| a     | table |
+-------+-------+

.. note::

   A note is prose, with **bold** and *emphasis* kept as text.

.. function:: join(path, *paths)
   :noindex:

   Join one or more path segments intelligently.

* The first item of a list.
* The second item of the list.

.. A comment that spans
   two lines is dropped.
"""


def test_rest_prose_keeps_the_sentences_and_drops_the_markup():
    from bertkit.pretraining.restructured_text import rest_paragraphs
    assert rest_paragraphs(REST) == [
        "The while statement and join are explained in the tutorial; see print() and the site.",
        "For example, a literal block:",
        "A note is prose, with bold and emphasis kept as text.",
        "Join one or more path segments intelligently.",
        "The first item of a list.",
        "The second item of the list.",
    ]


def test_added_sources_are_trained_on_and_never_held_out(tmp_path, minilm_folder):
    from bertkit import WordPieceTokenizer
    from bertkit.pretraining.corpus import TrainOnly
    from bertkit.pretraining.shards import tokenize_corpus
    a = write(tmp_path / "a.txt", "\n\n".join(f"Article {i} is here. It has two sentences." for i in range(8)))
    b = write(tmp_path / "b.txt", "\n\n".join(f"Manual page {i} says this. And that." for i in range(5)))
    docs = list(iter_documents(f"{a}+{b}"))
    assert [type(d) for d in docs] == [list] * 8 + [TrainOnly] * 5
    assert docs == load_documents(a) + load_documents(b)
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    train_a, held_a = tokenize_corpus(iter_documents(a), tok, tmp_path / "only_a", holdout_every=4)
    train_ab, held_ab = tokenize_corpus(iter_documents(f"{a}+{b}"), tok, tmp_path / "a_b", holdout_every=4)
    assert held_ab.meta["documents"] == held_a.meta["documents"] == 2
    assert held_ab.shard(0).tokens.tolist() == held_a.shard(0).tokens.tolist()  # the same held-out text
    assert train_ab.meta["documents"] == train_a.meta["documents"] + 5
    # a file whose name holds "+" is that file, not two sources
    plus = write(tmp_path / "c+d.txt", "One. Two.\n\nThree. Four.")
    assert load_documents(plus) == [["One.", "Two."], ["Three.", "Four."]]


def test_documentation_sources_are_read_from_their_package_or_named(tmp_path, monkeypatch):
    import gzip

    from bertkit.pretraining import corpus
    docs = tmp_path / "docs"
    write(docs / "tutorial" / "a.rst.txt", REST)
    (docs / "b.rst.gz").write_bytes(gzip.compress(b"Title\n=====\n\nFirst sentence here. Second one here.\n"))
    monkeypatch.setitem(corpus.DOC_SOURCES, "python-docs", (str(docs), "**/*.rst*", "python3.11-doc"))
    found = list(iter_documents("python-docs"))
    assert found[0] == ["First sentence here.", "Second one here."]  # b.rst.gz sorts first
    assert found[1][0].startswith("The while statement and join")
    (docs / "c.rst.gz").write_bytes(b"not gzip")
    with pytest.raises(BertkitError, match=r"c\.rst\.gz: not gzip-compressed UTF-8 text"):
        list(iter_documents("python-docs"))
    monkeypatch.setitem(corpus.DOC_SOURCES, "linux-docs", (str(tmp_path / "none"), "**/*.rst.gz", "linux-doc-6.1"))
    with pytest.raises(BertkitError, match=r"linux-docs: no documentation sources in .*none; install them with "
                                           r"`apt-get install linux-doc-6.1`"):
        iter_documents("wiki+linux-docs")


def test_pretraining_on_documentation_not_installed_is_refused_before_its_out_is_made(tmp_path, monkeypatch,
                                                                                        capsys):
    """`bertkit pretrain --corpus python-docs` without python3.11-doc named the package only once
    it had written --out (pretrain_config.json) and begun training a vocabulary."""
    from bertkit.cli import main
    from bertkit.pretraining import corpus
    monkeypatch.setitem(corpus.DOC_SOURCES, "python-docs", (str(tmp_path / "none"), "**/*.rst.txt", "python3.11-doc"))
    for source in ("python-docs", "wiki+python-docs"):
        out = tmp_path / source
        assert main(["pretrain", "--corpus", source, "--steps", "1", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "install them with `apt-get install python3.11-doc`" in err and "training a WordPiece" not in err
        assert not out.exists()


def test_the_vocabulary_is_trained_on_the_training_documents_alone(tmp_path, minilm_folder):
    """training_documents yields exactly the documents tokenize_corpus trains on (documents of
    text the normaliser removes whole are not counted in either; added sources are never held
    out), so a word only held-out text holds gets no piece of its own."""
    from bertkit import WordPieceTokenizer
    from bertkit.pretraining.corpus import TrainOnly
    from bertkit.pretraining.shards import tokenize_corpus, training_documents
    docs = [[f"Article {i} is here.", f"It has {i} words."] for i in range(11)]
    docs[2] = ["\u200b\u200b", "\u0301\u0301"]                     # nothing left after normalising
    docs[3] = ["The quuxberry grows in the valley.", "Quuxberry quuxberry."]  # held out (the 2nd counted)
    docs.append(TrainOnly([["Manual page text."]][0]))
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    train, held = tokenize_corpus(iter(docs), tok, tmp_path / "shards", holdout_every=4)
    kept = list(training_documents(iter(docs), 4))
    assert len(kept) == train.meta["documents"] == 12 - 1 - held.meta["documents"]
    assert docs[3] not in kept and docs[2] not in kept and docs[-1] in kept
    held_text = [s for d in docs[:-1] if d not in kept and d is not docs[2] for s in d]
    pieces = tok.tok.encode_batch(held_text, add_special_tokens=False)
    assert len(held.shard(0).tokens) == sum(len(e.ids) for e in pieces)  # the held-out documents, whole
    only_held = lambda vocab: sorted(t for t in vocab.tok.get_vocab() if "uxb" in t or "uux" in t)  # noqa: E731
    assert only_held(WordPieceTokenizer.train((s for d in docs for s in d), 300))  # all text: held-out pieces
    assert not only_held(WordPieceTokenizer.train((s for d in training_documents(iter(docs), 4) for s in d), 300))


def test_a_task_file_is_read_as_its_rows_texts_without_labels(tmp_path):
    from bertkit.pretraining.corpus import documents_up_to_two
    rows = write(tmp_path / "train.jsonl", '{"text": "Great film. I loved it.", "label": "fresh"}\n\n'
                 '{"text": "Dull.", "text_pair": "Too long, too slow.", "label": 0}\n'
                 '{"sentences": ["First line.", "Second line."], "labels": [1, 0]}\n'
                 '{"document": "A paper. It ends.", "summary": "x"}\n')
    assert load_documents(rows) == [["Great film.", "I loved it."], ["Dull.", "Too long, too slow."],
                                    ["First line.", "Second line."], ["A paper.", "It ends."]]
    table = write(tmp_path / "train.tsv", "label\ttext\nfresh\tA fine cast. Well shot.\nrotten\tNo.\n")
    assert load_documents(table) == [["A fine cast.", "Well shot."], ["No."]]
    assert documents_up_to_two(table) == 2
    assert documents_up_to_two(write(tmp_path / "one.csv", "text,label\nOnly one.,x\n")) == 1
    # joined with wiki-like text: the task's texts are trained on, never held out
    article = write(tmp_path / "a.txt", "An article. Two sentences.\n\nAnother. Here.")
    assert [type(d).__name__ for d in iter_documents(f"{article}+{table}")] == ["list", "list", "TrainOnly", "TrainOnly"]
    with pytest.raises(BertkitError, match=r"line 2: no text to pretrain on.*'question'"):
        load_documents(write(tmp_path / "q.jsonl", '{"text": "ok."}\n{"question": "why?"}\n'))
    with pytest.raises(BertkitError, match=r"line 1: a text must be a string, found 3"):
        load_documents(write(tmp_path / "n.jsonl", '{"text": 3}\n{"text": "ok."}\n'))


def test_a_named_pipe_is_read_once_as_it_comes_and_the_wait_is_said(tmp_path, capfd):
    """A FIFO as --corpus: the head's UTF-16 check sought back (io.UnsupportedOperation), and with no
    writer yet the run waited without a word."""
    import os
    import threading
    import time

    from bertkit.pretraining.corpus import documents_up_to_two
    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)
    assert documents_up_to_two(fifo) is None  # not opened to count: the run reads it once

    def writer():
        time.sleep(0.3)  # the reader opens first and waits
        with open(fifo, "w") as f:
            f.write("First one. First two.\n\nSecond one.\n")
    thread = threading.Thread(target=writer)
    thread.start()
    assert list(iter_documents(fifo)) == [["First one.", "First two."], ["Second one."]]
    thread.join()
    assert "corpus.txt is a named pipe (FIFO): reading it once a writer opens it" in capfd.readouterr().err


def test_wordnet_is_one_document_per_synset_its_words_and_definition_then_its_examples(tmp_path):
    """`--corpus wordnet`: WordNet 3.0's glosses (Debian's wordnet-base, which `make test` installs)."""
    import itertools

    from bertkit.pretraining.corpus import TrainOnly
    docs = iter_documents("wordnet")
    first = list(itertools.islice(docs, 3))
    assert first[0] == ["able: (usually followed by `to') having the necessary means or skill or know-how or "
                        "authority to do something.", "able to swim", "she was able to program her computer",
                        "we were at last able to buy a car", "able to get a grant for the project"]
    assert first[2] == ["abaxial, dorsal: facing away from the axis of an organ or organism.",
                        "the abaxial surface of a leaf is the underside or side facing away from the stem"]
    rest = list(docs)
    assert len(first) + len(rest) == 117_659  # every synset of the four parts of speech
    # a multi-word lemma reads as words; an adjective's position marker ("(a)") is dropped
    assert any(d[0].startswith("ice cream, icecream: ") for d in rest)
    assert any(d[0].startswith("outback, remote: inaccessible") for d in rest)
    assert not any("_" in d[0].split(":")[0] or "(a)" in d[0].split(":")[0] for d in rest)
    assert all(s.strip() and '"' not in s for d in rest for s in d)  # examples unquoted, none empty
    # added to a text file: trained on, never held out
    a = write(tmp_path / "a.txt", "One here. Two here.\n\nThree here. Four here.")
    joined = iter_documents(f"{a}+wordnet")
    assert [type(d) for d in itertools.islice(joined, 3)] == [list, list, TrainOnly]


def test_gcide_is_one_document_per_entry_without_pronunciations_etymologies_or_authors(tmp_path):
    """`--corpus gcide`: the Collaborative International Dictionary of English (Debian's dict-gcide,
    which `make test` installs), read through its dictd index."""
    import itertools

    from bertkit.pretraining.corpus import TrainOnly
    docs = list(iter_documents("gcide"))
    assert len(docs) == 126_236  # the index's entries once each, the database's own notes left out
    # the first entry starts at its headword: the preface's closing quotation before it is dropped
    assert docs[0] == ["0 adj. 1. indicating the absence of any or all units under consideration; -- representing "
                       "the number zero as an Arabic numeral.", "Syn: zero"]
    abdomen = next(d for d in docs if d[0].startswith("Abdomen,"))
    assert abdomen[:2] == ["Abdomen, n. 1. (Anat.) The belly, or that part of the body between the thorax and the "
                           "pelvis.", "Also, the cavity of the belly, which is lined by the peritoneum, and contains "
                           "the stomach, bowels, and other viscera."]
    # a quotation stays, its author (wrapped onto a second line in the right-hand column) does not
    dizzy = next(d for d in docs if any(s.startswith("If the jangling of thy bells") for s in d))
    assert "If the jangling of thy bells had not dizzied thy understanding." in dizzy
    assert not any(s in ("Scott.", "W. Scott.") or "--Sir" in s for s in dizzy)
    sentences = [s for d in docs for s in d]
    # pronunciations, etymologies, cross-references: gone but for a few brackets the source leaves unclosed
    assert sum(any(c in s for c in "\\[]{}") for s in sentences) < len(sentences) / 2000
    assert 4.0e6 < sum(len(s.split()) for s in sentences) < 4.1e6
    a = write(tmp_path / "a.txt", "One here. Two here.\n\nThree here. Four here.")
    joined = iter_documents(f"{a}+gcide")
    assert [type(d) for d in itertools.islice(joined, 3)] == [list, list, TrainOnly]


def test_gcide_not_installed_is_named_before_the_run_writes_its_out(tmp_path, monkeypatch, capsys):
    from bertkit.cli import main
    from bertkit.pretraining import corpus
    monkeypatch.setattr(corpus, "GCIDE", tmp_path / "none" / "gcide.dict.dz")
    for source in ("gcide", "wiki+gcide"):
        out = tmp_path / source
        assert main(["pretrain", "--corpus", source, "--steps", "1", "--out", str(out)]) == 2
        assert "apt-get install dict-gcide" in capsys.readouterr().err
        assert not out.exists()
    with pytest.raises(BertkitError, match="GCIDE is not installed"):
        iter_documents("gcide")


def test_gcide_files_that_are_not_dictd_are_named(tmp_path, monkeypatch):
    import gzip

    from bertkit.pretraining import corpus
    (tmp_path / "gcide.dict.dz").write_bytes(gzip.compress(b"Word \\Word\\, n.\n   A word.\n"))
    (tmp_path / "gcide.index").write_text("Word\tA\tU\nWord two\t0\n")
    monkeypatch.setattr(corpus, "GCIDE", tmp_path / "gcide.dict.dz")
    with pytest.raises(BertkitError, match=r"gcide.index:2: not a dictd index line"):
        list(iter_documents("gcide"))
    (tmp_path / "gcide.index").write_text("Word\tA\tb\n")  # offset 0, length 27
    assert list(iter_documents("gcide")) == [["Word, n.", "A word."]]
    (tmp_path / "gcide.dict.dz").write_bytes(b"Word, n. A word.\n")  # not compressed
    with pytest.raises(BertkitError, match=r"gcide.dict.dz: not a dictzip \(gzip\) file"):
        list(iter_documents("gcide"))


def test_wordnet_not_installed_is_named_before_the_run_writes_its_out(tmp_path, monkeypatch, capsys):
    from bertkit.cli import main
    from bertkit.pretraining.train import PretrainConfig
    monkeypatch.setenv("WNSEARCHDIR", str(tmp_path / "none"))
    for source in ("wordnet", "wiki+wordnet"):
        out = tmp_path / source
        assert main(["pretrain", "--corpus", source, "--steps", "1", "--out", str(out)]) == 2
        assert "apt-get install -y wordnet-base" in capsys.readouterr().err
        assert not out.exists()
    monkeypatch.delenv("WNSEARCHDIR")
    with pytest.raises(BertkitError, match="--sentence-per-line is for text files"):
        PretrainConfig(corpus="wiki+wordnet", out=str(tmp_path / "o"), sentence_per_line=True)
