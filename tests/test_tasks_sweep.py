"""Fine-tuning tasks on inputs that gave silent wrong results or tracebacks: each test names the bug."""
import pytest
import torch

from bertkit import BertkitError
from bertkit.tasks import get_task
from bertkit.tasks.base import TaskModel
from bertkit.tokenizer import WordPieceTokenizer


def test_word_targets_that_are_chinese_characters_are_reachable(minilm_folder):
    """The normaliser spaces Chinese characters apart ("中" -> " 中 "): such a target was looked up
    with its spaces, counted as no token, never learned and always scored wrong."""
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    task = get_task("word")()
    examples = [{"text": "middle", "word": "中"}, {"text": "big", "word": "size"}]
    labels = [f["labels"] for f in task.features(examples, tok, 16)]
    assert labels == [tok.token_to_id("中"), tok.token_to_id("size")] and -100 not in labels


def test_word_task_runs_on_a_model_whose_embeddings_outnumber_the_tokenizers_ids(tmp_path, tiny_bert_factory):
    """A vocabulary padded to a multiple of 8 (config vocab_size 30528, 30522 tokens) is a valid
    folder; the word task's candidate mask (one per token id) did not broadcast over its logits."""
    from bertkit.folders import load_model
    from bertkit.tasks.runner import run_task
    from bertkit.tokenizer import load_tokenizer
    folder = tiny_bert_factory.folder(tmp_path / "padded", vocab_size=30528)
    tok, (bert, _) = load_tokenizer(folder), load_model(folder, heads=False)
    task = get_task("word")()
    examples = [{"text": "large", "word": "size"}, {"text": "very heavy", "word": "weight"}]
    model = TaskModel(bert, task.head(bert.config, bert)).eval()
    with torch.no_grad():  # the padded rows score highest: still never predicted
        model.head.bias[tok.vocab_size:] = 100.0
    preds, loss = run_task(task, model, task.features(examples, tok, 16), examples, tok)
    assert loss is not None and all(t["word"] is not None for p in preds for t in p["top"])


def test_qa_max_answer_len_past_the_window_is_no_limit_not_out_of_memory(minilm_folder):
    """`--option max_answer_len=1000000000` ("no limit") sized the span search's band by it: out
    of memory at once. No span is longer than its window, so any such value means the window."""
    from bertkit.data.squad_subset import squad_subset_file
    from bertkit.tasks.squad import best_spans, make_windows, read_squad
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    examples = read_squad(squad_subset_file())[:4]
    f = make_windows(examples, tok, max_len=48, doc_stride=8, max_query_len=16)
    T = max(map(len, f.input_ids))
    g = torch.Generator().manual_seed(0)
    S, E = torch.randn(len(f), T, generator=g), torch.randn(len(f), T, generator=g)
    want = best_spans(S, E, f, examples, max_answer_len=T)
    assert best_spans(S, E, f, examples, max_answer_len=10**12) == want


def test_a_fine_tuned_folders_task_options_are_checked_when_it_is_loaded(tmp_path, tiny_bert):
    """bertkit.json's task options were used unchecked: "k": 0 gave every document an empty
    summary (ROUGE 0, no error), "n_best": "5" a ValueError from deep inside decoding."""
    import json

    import pytest

    from bertkit.errors import BertkitError
    from bertkit.folders import load_model
    from bertkit.tasks.folder import load_task_model, save_task_model
    from bertkit.tokenizer import load_tokenizer
    tok, (bert, _) = load_tokenizer(tiny_bert), load_model(tiny_bert, heads=False)
    task = get_task("summarize")()
    task.fit([{"sentences": ["A cat sat.", "It slept."], "labels": [1, 0]}], {"k": 2, "max_len": 64})
    save_task_model(TaskModel(bert, task.head(bert.config, bert)), task, tok, tmp_path / "m")
    assert load_task_model(tmp_path / "m")[0].info["k"] == 2  # as saved: loads
    info_path = tmp_path / "m" / "bertkit.json"
    info = json.loads(info_path.read_text())
    for key, value, why in (("k", 0, "must be at least 1"), ("k", "3", "expected an integer"),
                            ("dropout", 1.5, "below 1")):
        info_path.write_text(json.dumps({**info, key: value}))
        with pytest.raises(BertkitError, match=f"bertkit.json: '{key}': .*{why}"):
            load_task_model(tmp_path / "m")


def test_ner_knows_i_x_for_a_type_trained_only_in_one_word_entities():
    """A type seen only as B-X in training (one-word entities) refused an evaluation file's I-X
    as a tag the model did not know: every BIO type gets both labels."""
    for name in ("ner", "tag"):
        task = get_task(name)()
        train = [{"words": ["Paris", "is", "big"], "tags": ["B-LOC", "O", "O"]},
                 {"words": ["Ada", "Lovelace", "wrote"], "tags": ["B-PER", "I-PER", "O"]}]
        task.fit(train, {})
        assert task.info["labels"] == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"], name
        task.check([{"words": ["New", "York"], "tags": ["B-LOC", "I-LOC"]}], "dev.conll")


def test_bioes_and_bilou_tags_are_learned_decoded_and_scored_as_their_entities():
    """BIOES / BILOU tags were no scheme to ner and tag: the CRF refused them, ner fell back to
    argmax, a type seen only as U-X got no B-/I-/L- labels, and seqeval read BILOU's L-X and U-X as
    no entity end (two one-word entities U-PER U-PER scored as one, the gold B-PER L-PER)."""
    import itertools
    import random

    import pytest
    from seqeval.metrics.sequence_labeling import get_entities

    from bertkit.tasks.crf import CRF, scheme_constraints
    from bertkit.tasks.ner import entities, write_entities
    assert entities(["U-PER", "U-PER", "O", "B-LOC", "I-LOC", "L-LOC"]) == [("PER", 0, 1), ("PER", 1, 2), ("LOC", 3, 6)]
    assert entities(["S-PER", "B-PER", "E-PER", "B-LOC"]) == [("PER", 0, 1), ("PER", 1, 3), ("LOC", 3, 4)]
    rng = random.Random(0)
    for _ in range(2000):  # as seqeval reads BIO, IOB1 and BIOES, broken sequences too; BILOU as BIOES
        seq = [rng.choice(["O", "B-A", "I-A", "E-A", "S-A", "B-B", "I-B", "E-B", "S-B"]) for _ in range(rng.randint(1, 7))]
        assert sorted((k, a, b - 1) for k, a, b in entities(seq)) == sorted(get_entities(seq)), seq
        bilou = [t.replace("E-", "L-").replace("S-", "U-") for t in seq]
        assert entities(bilou) == entities(seq) == entities(write_entities(entities(seq), len(seq), "bilou"))

    for scheme, (b, i, last, unit) in (("bioes", "BIES"), ("bilou", "BILU")):
        train = [{"words": ["Paris", "is", "big"], "tags": [f"{unit}-LOC", "O", "O"]},
                 {"words": ["Ada", "M", "Lovelace"], "tags": [f"{b}-PER", f"{i}-PER", f"{last}-PER"]},
                 {"words": ["Ada", "wrote"], "tags": [f"{b}-PER", "O"]}]  # broken: learned as U-PER O
        for name in ("ner", "tag"):
            task = get_task(name)()
            task.fit(train, {})  # the CRF's constraints refused them
            assert task.info["scheme"] == scheme and task.info.get("decode", "bio") == "bio"
            assert task.info["labels"] == ["O"] + [f"{p}-{t}" for t in ("LOC", "PER") for p in (b, i, last, unit)]
            task.check([{"words": ["New", "York"], "tags": [f"{b}-LOC", f"{last}-LOC"]}], "dev.conll")
            assert task._as_learned(train[2]["tags"]) == [f"{unit}-PER", "O"]
            gold = [{"words": ["A", "B"], "tags": [f"{unit}-PER", f"{unit}-PER"]}]
            assert task.metrics([[f"{unit}-PER", f"{unit}-PER"]], gold)["f1"] == 1.0
            assert task.metrics([[f"{b}-PER", f"{last}-PER"]], gold)["f1"] == 0.0  # seqeval alone: 1.0

        # the constraints: an entity opened must end in E-X / L-X, before the sentence ends too
        labels = task.info["labels"]
        crf = CRF(len(labels), scheme_constraints(labels))
        emissions = torch.randn(64, 4, len(labels), generator=torch.Generator().manual_seed(1)) * 5
        emissions[:8, -1, labels.index(f"{b}-PER")] = 50.0  # screams "an entity begins" at the last word
        for path in crf.decode(emissions, torch.ones(64, 4, dtype=torch.bool)):
            tags = [labels[t] for t in path]
            assert write_entities(entities(tags), len(tags), scheme) == tags, tags  # valid in the scheme
        allowed, start, end = scheme_constraints(labels)
        n_valid = sum(write_entities(entities(s), 3, scheme) == list(s) for s in itertools.product(labels, repeat=3))
        n_allowed = sum(bool(start[x] and end[z] and allowed[x, y] and allowed[y, z])
                        for x, y, z in itertools.product(range(len(labels)), repeat=3))
        assert n_allowed == n_valid  # exactly the valid sequences
    with pytest.raises(Exception, match="mix BIOES's E-/S- with BILOU's L-/U-"):
        get_task("tag")().fit([{"words": ["a", "b"], "tags": ["S-PER", "U-LOC"]}], {})


def test_classify_warns_of_a_pooling_the_folder_declares_and_it_cannot_run(tmp_path):
    """A sentence-transformers folder pooling with max was fine-tuned on the tanh pooler without a
    word (encode and serve warned of it); a chosen pooling is not warned of, lower-casing is."""
    import json
    import warnings

    import pytest
    folder = tmp_path / "st"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    train = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}]

    def fit(pooling_config, **options):
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
        task = get_task("classify")()
        task.fit(train, {"base_model": str(folder), **options})
        return task.info["pooling"]

    with pytest.warns(UserWarning, match=r"fine-tunes classify without its pooling \(max_tokens\), which its "
                                         r"sentence-transformers pipeline declares: classify is fine-tuned on the "
                                         r"tanh pooler instead \(--option pooling=pooler\|cls\|mean chooses\)"):
        assert fit({"pooling_mode_max_tokens": True}) == "pooler"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # chosen, or one it runs (its Dense module: the head replaces it)
        assert fit({"pooling_mode_max_tokens": True}, pooling="mean") == "mean"
        assert fit({"pooling_mode_mean_tokens": True}) == "mean"
    (folder / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": True}))
    with pytest.warns(UserWarning, match=r"without its do_lower_case \(sentence_bert_config.json\), which .*: "
                                         r"classify is fine-tuned on \[CLS\]$"):
        fit({"pooling_mode_max_tokens": True}, pooling="cls")


def test_ner_predictions_give_the_entity_spans_of_their_tags():
    """predict gave tags alone: every user re-read the spans from them, and BILOU's U-X U-X (two
    entities) is easy to read as one."""
    from bertkit.tasks.ner import NerTask
    task = NerTask()
    task.fit([{"words": ["Peter", "Blackburn", "in", "Paris"], "tags": ["B-PER", "I-PER", "O", "B-LOC"]}], {})
    words = ["Peter", "Blackburn", "met", "Anna", "in", "Paris"]
    got = task.describe(["B-PER", "I-PER", "O", "B-PER", "O", "B-LOC"], {"words": words})
    assert got["entities"] == [{"type": "PER", "start": 0, "end": 2, "text": "Peter Blackburn"},
                               {"type": "PER", "start": 3, "end": 4, "text": "Anna"},
                               {"type": "LOC", "start": 5, "end": 6, "text": "Paris"}]
    bilou = NerTask()
    bilou.fit([{"words": ["Anna", "Bo"], "tags": ["U-PER", "U-PER"]}], {})
    assert [e["text"] for e in bilou.describe(["U-PER", "U-PER"], {"words": ["Anna", "Bo"]})["entities"]] == ["Anna", "Bo"]
    pos = NerTask()  # tags of no entity scheme (parts of speech): no spans to give
    pos.fit([{"words": ["a", "cat"], "tags": ["DET", "NOUN"]}], {})
    assert "entities" not in pos.describe(["DET", "NOUN"], {"words": ["a", "cat"]})


def test_classify_refuses_evaluation_inputs_of_the_other_kind_than_it_was_trained_on(tmp_path):
    """A model fine-tuned on single texts was scored on a file of pairs (or the reverse) without a
    word: it read [CLS] A [SEP] B [SEP], inputs it never saw in training."""
    from bertkit.tasks.classify import ClassifyTask
    singles = [{"text": "good", "text_pair": None, "label": "a"}, {"text": "bad", "text_pair": None, "label": "b"}]
    pairs = [{**r, "text_pair": "film", "line": i + 2} for i, r in enumerate(singles)]
    on_texts, on_pairs = ClassifyTask(), ClassifyTask()
    on_texts.fit(singles, {})
    on_pairs.fit(pairs, {})
    assert (on_texts.info["inputs"], on_pairs.info["inputs"]) == ("texts", "pairs")
    on_texts.check(singles, "dev.csv")
    on_pairs.check(pairs, "dev.csv")
    with pytest.raises(BertkitError, match=r"dev\.csv, line 2: a text pair \(text_pair\), but the model was "
                                           r"fine-tuned on single texts; 2 such row\(s\)"):
        on_texts.check(pairs, "dev.csv")
    with pytest.raises(BertkitError, match=r"dev\.csv, row 1: a single text \(text_pair\), but the model was "
                                           r"fine-tuned on text pairs"):
        on_pairs.check(singles, "dev.csv")
    both = ClassifyTask()  # trained on both kinds: either is fine
    both.fit(singles + pairs, {})
    both.check(singles + pairs, "dev.csv")
    old = ClassifyTask({"labels": ["a", "b"]})  # a folder from before "inputs" was recorded: not checked
    old.check(pairs, "dev.csv")


def test_each_task_parses_server_inputs_and_names_the_token_limits_that_apply():
    """/predict's inputs are the task's to read (the server knows no task): strings, classify's
    {"text", "text_pair"} objects, qa's {"question", "context", "id"}; each names the limits its
    texts are counted against (the model's max_len where it is below the server's limit)."""
    from bertkit.errors import BertkitError
    from bertkit.tasks import get_task
    pairs = get_task("classify")({"labels": ["neg", "pos"], "inputs": "pairs"})
    inputs = [{"text": "a film", "text_pair": "a play"}]
    examples = pairs.request_examples(inputs)
    assert examples == [{"text": "a film", "text_pair": "a play"}]
    [check] = pairs.request_token_checks(inputs, examples, 512, 128)
    assert (check.texts, check.pairs, check.field, check.limit) == (["a film"], ["a play"], "inputs", 128)
    assert check.limit_name == "the max_len the classify model was fine-tuned with"
    lower = pairs.request_token_checks(inputs, examples, 64, 128)[0]  # the server's limit is the lower
    assert (lower.limit, lower.limit_name) == (64, None)
    for bad, message in ((["a film"], r"inputs\[0\]: a single text, but the model was fine-tuned on text pairs"),
                         ([{"text": "a", "txt_pair": "b"}], r"inputs\[0\]\.txt_pair: not a field"),
                         ([3], r"inputs\[0\]: the classify task takes strings or")):
        with pytest.raises(BertkitError, match=message):
            pairs.request_examples(bad)
    qa = get_task("qa")({})
    examples = qa.request_examples([{"question": "who?", "context": "Ann did.", "id": 7}])
    assert (examples[0].id, examples[0].question, examples[0].context) == ("7", "who?", "Ann did.")
    question, context = qa.request_token_checks([], examples, 512, 384)
    assert (question.field, question.limit, context.field, context.limit) == ("inputs.question", 66,
                                                                             "inputs.context", 8 * 512)
    with pytest.raises(BertkitError, match=r"inputs\[0\]: the qa task takes objects"):
        qa.request_examples(["who?"])
    ner = get_task("ner")({})
    with pytest.raises(BertkitError, match=r"inputs\[1\]: the ner task takes strings"):
        ner.request_examples(["Ann lives here", {"text": "x"}])
    [check] = get_task("summarize")({}).request_token_checks(["One. Two."], [], 512, 128)
    assert check.limit == 512  # a long document is scored on its first sentences: read, not refused
