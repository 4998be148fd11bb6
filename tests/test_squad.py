"""Extractive QA without a model: SQuAD reading, windows, span search against brute force, metrics."""
import json
import random

import pytest
import torch
from tokenizers import Tokenizer

from bertkit import BertkitError, WordPieceTokenizer
from bertkit.data.squad_subset import squad_subset_file
from bertkit.tasks.squad import (
    QAExample,
    best_spans,
    exact_match,
    f1,
    make_windows,
    normalize_answer,
    predictions,
    read_squad,
    split_by_article,
    squad_metrics,
)

SQUAD = squad_subset_file()  # ships inside the bertkit package


@pytest.fixture(scope="module")
def examples():
    return read_squad(SQUAD)


@pytest.fixture(scope="module")
def tok(minilm_folder):
    return WordPieceTokenizer.from_folder(minilm_folder)


def write(tmp_path, obj, name="qa.json"):
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def squad(qas, context="The cat sat on the mat.", title="Cats"):
    return {"version": "v2.0", "data": [{"title": title, "paragraphs": [{"context": context, "qas": qas}]}]}


# ---- reading ----
def test_reads_the_real_subset(examples):
    assert len(examples) == 434
    assert len({ex.title for ex in examples}) == 9
    assert len({ex.id for ex in examples}) == 434
    for ex in examples:
        assert ex.answers and not ex.is_impossible
        for a in ex.answers:
            assert ex.context[a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]


def test_reads_v2_unanswerable(tmp_path):
    path = write(tmp_path, squad([
        {"id": "a", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 15}], "is_impossible": False},
        {"id": "b", "question": "Why?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "cat", "answer_start": 4}]}]))
    a, b = read_squad(path)
    assert (a.is_impossible, a.answers, a.title) == (False, [{"text": "the mat", "answer_start": 15}], "Cats")
    assert (b.is_impossible, b.answers) == (True, [])


@pytest.mark.parametrize("qas, context, expect", [
    ([{"id": "q7", "question": "Who?", "answers": [{"text": "dog", "answer_start": 4}]}], "The cat sat on the mat.",
     ["q7", "answer 'dog' does not occur at answer_start 4", "'cat'"]),
    ([{"id": "q8", "question": "Who?", "answers": [{"text": "cat", "answer_start": 99}]}], "The cat sat on the mat.",
     ["q8", "answer_start 99", "''"]),
    ([{"id": "q9", "answers": [{"text": "cat", "answer_start": 4}]}], "The cat sat on the mat.",
     ["question q9", "missing key 'question'"]),
    ([{"id": "q10", "question": "Who?", "answers": [{"text": "cat"}]}], "The cat sat on the mat.",
     ["question q10", "missing key 'answer_start'"]),
    ([{"question": "Who?", "answers": []}], "The cat sat on the mat.", ["paragraph 1, question 1", "missing key 'id'"]),
    ([{"id": "q11", "question": "Who?", "answers": []}], "The cat sat on the mat.", ["q11", "is_impossible"]),
    ([{"id": "q12", "question": "Who?", "answers": [{"text": "cat", "answer_start": 4}], "is_impossible": True}],
     "The cat sat on the mat.", ["q12", "is_impossible"]),
    ([{"id": "q1", "question": "Who?", "answers": [{"text": "cat", "answer_start": 4}]}] * 2,
     "The cat sat on the mat.", ["q1", "twice"]),
    ([{"id": "q13", "question": " ", "answers": [{"text": "cat", "answer_start": 4}]}], "The cat sat on the mat.",
     ["question q13", "the question is empty"]),  # was trained on
])
def test_read_errors_name_file_question_and_problem(tmp_path, qas, context, expect):
    path = write(tmp_path, squad(qas, context))
    with pytest.raises(BertkitError) as err:
        read_squad(path)
    for part in [str(path)] + expect:
        assert part in str(err.value)


def test_read_errors_missing_context_not_json_no_file(tmp_path):
    doc = squad([])
    del doc["data"][0]["paragraphs"][0]["context"]
    path = write(tmp_path, doc)
    with pytest.raises(BertkitError, match=r"qa\.json: article 1 \('Cats'\), paragraph 1: missing key 'context'"):
        read_squad(path)
    path = write(tmp_path, '{"data": [', "broken.json")
    with pytest.raises(BertkitError, match=r"broken\.json: not valid JSON"):
        read_squad(path)
    with pytest.raises(BertkitError, match="no such file"):
        read_squad(tmp_path / "absent.json")


# ---- windows ----
def long_example():
    words = " ".join(f"Word{i} is number {i}." for i in range(120))  # ~700 tokens
    s = words.index("Word77")
    return QAExample("long", "Which word is number seventy-seven?", words,
                     [{"text": "Word77", "answer_start": s}], False, "T")


def test_windows_overlap_by_the_stride(tok):
    ex = long_example()
    f = make_windows([ex], tok, max_len=64, doc_stride=16, max_query_len=64 - 16 - 4)
    assert len(f) > 5
    q = tok.tokenize_ids(ex.question)
    ctx = [[o for o in offs if o is not None] for offs in f.offsets]
    for w in range(len(f)):
        ids = f.input_ids[w]
        assert len(ids) <= 64 and len(ids) == len(f.offsets[w]) == len(f.token_type_ids[w]) == len(f.attention_mask[w])
        assert ids[:len(q) + 2] == [tok.cls_id] + q + [tok.sep_id] and ids[-1] == tok.sep_id
        assert f.token_type_ids[w] == [0] * (len(q) + 2) + [1] * (len(ids) - len(q) - 2)
        if w + 1 < len(f):
            assert ctx[w][-16:] == ctx[w + 1][:16]  # exactly doc_stride shared tokens
            assert ctx[w][-17] != ctx[w + 1][0]
    assert ctx[0][0][0] == 0 and ctx[-1][-1][1] == len(ex.context)
    hits = [w for w in range(len(f)) if f.start_positions[w]]
    assert hits and all(ex.context[f.offsets[w][f.start_positions[w]][0]:f.offsets[w][f.end_positions[w]][1]]
                        == "Word77" for w in hits)
    batch = f.batch(range(len(f)))
    assert batch["input_ids"].shape == (len(f), max(map(len, f.input_ids)))


def test_windows_match_tokenizers_overflow(tok, examples):
    ref = Tokenizer.from_str(tok.tok.to_str())  # a copy: truncation settings stay off the shared one
    ref.enable_truncation(96, stride=24, strategy="only_second")
    exs = [long_example()] + examples[::40]
    f = make_windows(exs, tok, max_len=96, doc_stride=24, max_query_len=40)
    for n, ex in enumerate(exs):
        enc = ref.encode(ex.question, ex.context)
        want = [enc] + enc.overflowing
        rows = [w for w in range(len(f)) if f.example_index[w] == n]
        assert [f.input_ids[w] for w in rows] == [e.ids for e in want]
        assert [f.token_type_ids[w] for w in rows] == [e.type_ids for e in want]
        assert [[o for o in f.offsets[w] if o is not None] for w in rows] == \
               [[o for o, s in zip(e.offsets, e.sequence_ids) if s == 1] for e in want]


def test_long_questions_are_cut(tok):
    ex = long_example()
    ex = QAExample("q", " ".join(["why"] * 100), ex.context, ex.answers, False, "T")
    f = make_windows([ex], tok, max_len=128, doc_stride=32, max_query_len=20)
    assert all(ids[:22] == [tok.cls_id] + [tok.token_to_id("why")] * 20 + [tok.sep_id] for ids in f.input_ids)
    assert all(len(ids) <= 128 for ids in f.input_ids)
    with pytest.raises(BertkitError, match="max_len"):
        make_windows([ex], tok, max_len=64, doc_stride=32, max_query_len=40)


@pytest.mark.parametrize("max_len, stride", [(384, 128), (128, 32)])
def test_every_answer_maps_back_to_its_characters(tok, examples, max_len, stride):
    # Each of the (up to 3) gold answers in turn as the training target.
    unaligned = set()
    for turn in range(3):
        exs = [QAExample(e.id, e.question, e.context, e.answers[turn:turn + 1], False, e.title)
               for e in examples if len(e.answers) > turn]
        f = make_windows(exs, tok, max_len=max_len, doc_stride=stride)
        found = [False] * len(exs)
        for w in range(len(f)):
            ex, offs = exs[f.example_index[w]], f.offsets[w]
            text, s = ex.answers[0]["text"], ex.answers[0]["answer_start"]
            e = s + len(text.rstrip())
            s += len(text) - len(text.lstrip())
            ctx = [o for o in offs if o is not None]
            covered = ctx[0][0] <= s and ctx[-1][1] >= e  # judged from characters, not tokens
            sp, ep = f.start_positions[w], f.end_positions[w]
            assert (sp > 0) == covered and (ep > 0) == covered and sp <= ep
            if covered:
                found[f.example_index[w]] = True
                a, b = offs[sp][0], offs[ep][1]
                if (a, b) != (s, e):  # the answer starts or ends inside a word piece
                    unaligned.add((ex.id, text))
                    assert a <= s and b >= e and not any(c.isspace() for c in ex.context[a:s] + ex.context[e:b])
        assert all(found), "an answer fits no window"
    # 4 of 1427 real answers end inside a word piece ("gold rush" in "gold rushes")
    assert len(unaligned) <= 4, unaligned


# ---- span search against brute force ----
def brute_force(S, E, f, ex_rows, context, n_best, max_answer_len):
    """Every (window, start, end) triple in plain Python loops; S, E are lists of lists."""
    best = {}
    for w in ex_rows:
        offs = f.offsets[w]
        for i in range(len(offs)):
            for j in range(i, min(len(offs), i + max_answer_len)):
                if offs[i] is None or offs[j] is None:
                    continue
                key, score = (offs[i][0], offs[j][1]), S[w][i] + E[w][j]
                best[key] = max(best.get(key, float("-inf")), score)
    spans = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:n_best]
    null = min(S[w][0] + E[w][0] for w in ex_rows)
    return [{"text": context[a:b], "score": v, "start_char": a, "end_char": b} for (a, b), v in spans], null


def test_best_spans_equals_brute_force(tok, examples):
    rng = random.Random(0)
    exs = [long_example()] + examples[::60]
    f = make_windows(exs, tok, max_len=48, doc_stride=8, max_query_len=16)
    assert len(f) > 3 * len(exs)  # several windows per question
    T = max(map(len, f.input_ids)) + 3  # extra padding positions must never be chosen
    nulls = decisions = 0
    for trial in range(60):
        g = torch.Generator().manual_seed(trial)
        S, E = torch.randn(len(f), T, generator=g), torch.randn(len(f), T, generator=g)
        S[:, -1] = E[:, -1] = 50.0       # padding
        S[:, 1] = E[:, 2] = 30.0         # question tokens
        S[:, 0] += rng.uniform(0, 8)     # [CLS]: sometimes "no answer" wins
        n_best, max_answer_len = rng.choice([1, 3, 20]), rng.choice([1, 4, 30])
        version_2, diff = rng.random() < 0.5, rng.choice([0.0, 1.5, -1.0])
        got = best_spans(S, E, f, exs, n_best=n_best, max_answer_len=max_answer_len,
                         null_score_diff=diff, version_2=version_2)
        preds = predictions(got)
        Sl, El = S.double().tolist(), E.double().tolist()
        for n, ex in enumerate(exs):
            rows = [w for w in range(len(f)) if f.example_index[w] == n]
            want, null = brute_force(Sl, El, f, rows, ex.context, n_best, max_answer_len)
            spans = [d for d in got[n] if d["start_char"] is not None]
            assert spans == want
            if version_2:
                assert [d["score"] for d in got[n] if d["start_char"] is None] == [null]
                is_null = null - want[0]["score"] > diff
                nulls, decisions = nulls + is_null, decisions + 1
                assert preds[n] == ("" if is_null else want[0]["text"])
            else:
                assert preds[n] == want[0]["text"] and len(got[n]) == len(want)
    assert 10 < nulls < decisions - 10, (nulls, decisions)  # both outcomes of the null decision


def test_best_spans_finds_the_gold_with_oracle_logits(tok, examples):
    f = make_windows(examples, tok, max_len=128, doc_stride=32)
    T = max(map(len, f.input_ids))
    S, E = torch.full((len(f), T), -10.0), torch.full((len(f), T), -10.0)
    S[torch.arange(len(f)), torch.tensor(f.start_positions)] = 10.0
    E[torch.arange(len(f)), torch.tensor(f.end_positions)] = 10.0
    preds = dict(zip((ex.id for ex in examples), predictions(best_spans(S, E, f, examples))))
    assert squad_metrics(preds, examples) == {"exact": 100.0, "f1": 100.0, "total": 434}
    with pytest.raises(BertkitError, match="windows"):
        best_spans(S[:-1], E[:-1], f, examples)


# ---- metrics ----
def test_normalize_answer():
    assert normalize_answer("The  Cat's, hat!") == "cats hat"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("theatre  ANd\tthe   Anthem.") == "theatre and anthem"
    assert normalize_answer("  ") == ""


def test_exact_match_and_f1_by_hand():
    assert exact_match("the Denver Broncos!", ["Denver Broncos", "Broncos"]) == 1.0
    assert exact_match("Denver", ["Denver Broncos"]) == 0.0
    # pred {denver, broncos, won} vs gold {denver, broncos}: P = 2/3, R = 1, F1 = 0.8
    assert f1("Denver Broncos won", ["the Denver Broncos"]) == pytest.approx(0.8)
    # against "Broncos": P = 1/3, R = 1 -> 0.5; the max over golds is 0.8
    assert f1("Denver Broncos won", ["Broncos", "Denver Broncos"]) == pytest.approx(0.8)
    # counts clip: common = cat 1 + dog 1 = 2, P = R = 2/3
    assert f1("cat cat dog", ["cat dog dog"]) == pytest.approx(2 / 3)
    assert f1("Paris", ["London"]) == 0.0
    # v2: no gold answer means "" is right and anything else wrong
    assert exact_match("", []) == f1("", []) == 1.0
    assert exact_match("Denver", []) == f1("Denver", []) == 0.0
    assert exact_match("", ["Denver"]) == f1("", ["Denver"]) == 0.0
    assert exact_match("", ["The"]) == 1.0  # a gold that normalizes to nothing counts as no answer


def test_squad_metrics_v1_and_v2():
    def ex(i, golds, impossible=False):
        return QAExample(i, "q?", "ctx", [{"text": g, "answer_start": 0} for g in golds], impossible, "T")
    exs = [ex("a", ["Denver Broncos"]), ex("b", ["the Denver Broncos"]), ex("c", ["Paris"])]
    preds = {"a": "Denver Broncos", "b": "Denver Broncos won", "c": "London", "z": "ignored"}
    m = squad_metrics(preds, exs)
    assert m == {"exact": pytest.approx(100 / 3), "f1": pytest.approx(100 * 1.8 / 3), "total": 3}
    exs.append(ex("d", [], impossible=True))
    m = squad_metrics({**preds, "d": ""}, exs)
    assert m["total"] == 4 and m["exact"] == pytest.approx(50.0) and m["f1"] == pytest.approx(100 * 2.8 / 4)
    assert (m["HasAns_total"], m["NoAns_total"], m["NoAns_exact"]) == (3, 1, 100.0)
    assert m["HasAns_f1"] == pytest.approx(100 * 1.8 / 3)
    with pytest.raises(BertkitError, match="no prediction for 1 of 4 questions"):
        squad_metrics(preds, exs)


# ---- splitting ----
def test_split_by_article(examples):
    train, held = split_by_article(examples, eval_share=0.2, seed=0)
    assert len(train) + len(held) == len(examples)
    assert not {e.title for e in train} & {e.title for e in held}
    assert len({e.title for e in held}) == 2  # round(0.2 * 9)
    again = split_by_article(list(reversed(examples)), eval_share=0.2, seed=0)[1]
    assert {e.id for e in again} == {e.id for e in held}  # seeded, and independent of input order
    assert len({frozenset(e.title for e in split_by_article(examples, 0.2, s)[1]) for s in range(10)}) > 1
    with pytest.raises(BertkitError, match="at least 2"):
        split_by_article([e for e in examples if e.title == examples[0].title])


def test_qa_answers_come_from_their_own_question_whatever_the_ids(tok):
    """predict's ids come from the input (or its line numbers) and serve numbers each request's
    questions from 0, so ids repeat: each answer must still come from its own context (they
    were keyed by id, and a repeated id took the last context's answer)."""
    from bertkit.tasks.qa import QATask
    exs = [QAExample("q", "Who wrote it?", "Shakespeare wrote Hamlet around 1600.", [], False, ""),
           QAExample("q", "What is the capital?", "Paris is the capital of France.", [], False, ""),
           QAExample("3", "What colour?", "Blue skies over the sea.", [], False, ""),
           QAExample("3", "Which river?", "Seine flows through Paris.", [], False, "")]
    task = QATask()
    feats = task.features(exs, tok, 64)
    T = max(len(f["input_ids"]) for f in feats)
    start, end = torch.full((len(feats), T), -10.0), torch.full((len(feats), T), -10.0)
    for w, f in enumerate(feats):  # every window points at its context's first token
        first = next(i for i, o in enumerate(f["offsets"]) if o is not None)
        start[w, first] = end[w, first] = 10.0
    answers = [p["answer"] for p in task.decode([(start, end)], feats, exs)]
    assert answers == ["Shakespeare", "Paris", "Blue", "Seine"]


def test_answers_keep_a_decomposed_accent_on_their_last_letter(tok):
    """An uncased vocabulary's normaliser drops combining accents, so the last token of
    "e\\u0301te\\u0301" ends before its final accent: the answer is taken up to the end of the
    marks (it came back as "e\\u0301te" and scored no exact match)."""
    from bertkit.tasks.qa import QATask
    word = "e\u0301te\u0301"
    exs = [QAExample("a", "When?", f"{word} chaud, cafe\u0301 froid.", [], False, ""),
           QAExample("b", "What?", "Un cafe\u0301\u0300 noir.", [], False, "")]
    task = QATask()
    feats = task.features(exs, tok, 64)
    T = max(len(f["input_ids"]) for f in feats)
    start, end = torch.full((len(feats), T), -10.0), torch.full((len(feats), T), -10.0)
    for w, (f, want) in enumerate(zip(feats, (word, "Un cafe\u0301\u0300"))):
        offs = f["offsets"]
        first = next(i for i, o in enumerate(offs) if o is not None)
        last = max(i for i, o in enumerate(offs) if o is not None and o[1] <= len(want))
        start[w, first], end[w, last] = 10.0, 10.0
    answers = [p["answer"] for p in task.decode([(start, end)], feats, exs)]
    assert answers == [word, "Un cafe\u0301\u0300"]


def test_a_squad_file_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Every other reader drops a leading BOM; SQuAD's said "not valid JSON (Unexpected UTF-8 BOM)"."""
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + SQUAD.read_bytes())
    assert read_squad(path) == read_squad(SQUAD)

