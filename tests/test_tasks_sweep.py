"""Fine-tuning tasks on inputs that gave silent wrong results or tracebacks: each test names the bug."""
import torch

from bertkit.tasks import get_task
from bertkit.tasks.base import TaskModel
from bertkit.tokenizer import WordPieceTokenizer
from conftest import save_tiny_bert


def test_word_targets_that_are_chinese_characters_are_reachable(minilm_folder):
    """The normaliser spaces Chinese characters apart ("中" -> " 中 "): such a target was looked up
    with its spaces, counted as no token, never learned and always scored wrong."""
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    task = get_task("word")()
    examples = [{"text": "middle", "word": "中"}, {"text": "big", "word": "size"}]
    labels = [f["labels"] for f in task.features(examples, tok, 16)]
    assert labels == [tok.token_to_id("中"), tok.token_to_id("size")] and -100 not in labels


def test_word_task_runs_on_a_model_whose_embeddings_outnumber_the_tokenizers_ids(tmp_path, minilm_folder):
    """A vocabulary padded to a multiple of 8 (config vocab_size 30528, 30522 tokens) is a valid
    folder; the word task's candidate mask (one per token id) did not broadcast over its logits."""
    from bertkit.checkpoint import load_model, load_tokenizer
    from bertkit.finetune import run_task
    folder = save_tiny_bert(tmp_path / "padded", minilm_folder, vocab_size=30528)
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


def test_a_fine_tuned_folders_task_options_are_checked_when_it_is_loaded(tmp_path, minilm_folder):
    """bertkit.json's task options were used unchecked: "k": 0 gave every document an empty
    summary (ROUGE 0, no error), "n_best": "5" a ValueError from deep inside decoding."""
    import json

    import pytest

    from bertkit.checkpoint import load_model, load_tokenizer
    from bertkit.errors import BertkitError
    from bertkit.finetune import load_task_model, save_task_model
    folder = save_tiny_bert(tmp_path / "base", minilm_folder)
    tok, (bert, _) = load_tokenizer(folder), load_model(folder, heads=False)
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
