"""Pretraining and checkpoints: silent wrong results found in a review sweep."""
import numpy as np
import pytest

from bertkit import WordPieceTokenizer
from bertkit.pretraining.shards import tokenize_corpus


def test_special_token_text_in_the_corpus_is_not_a_special_token(tmp_path, minilm_folder):
    """A corpus that writes "[MASK]" or "[SEP]" (a text about BERT) holds those characters, not
    the tokens: as real [MASK] / [SEP] / [PAD] ids they sat unpredicted inside segments, could be
    chosen as MLM labels and counted as masked positions (BERT's create_pretraining_data splits
    them as any other text). Fill-mask keeps reading "[MASK]" as the token."""
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    docs = [["The model reads [CLS] text [SEP] and fills [MASK] in.", "Padding is [PAD] and [UNK] is unknown."],
            ["A second document.", "It has two sentences."]]
    train, _ = tokenize_corpus(iter(docs), tok, tmp_path / "shards", holdout_every=0)
    tokens = np.asarray(train.shard(0).tokens)
    assert not np.isin(tokens, tok.special_ids()).any()
    assert tok.tokenize("fill [MASK] in") == ["fill", "[MASK]", "in"]  # the tokenizer is left as it was


def test_skipped_steps_carry_over_a_resumption(tmp_path, wiki_excerpt, vocab, monkeypatch):
    """The count of non-finite steps (skipped_steps in metrics.jsonl and summary.json) and the
    run of them in a row (5 roll back) go on from the checkpoint: they restarted at 0, so a
    resumed run's records differed from an uninterrupted one's and a run of bad steps across
    the stop was never rolled back."""
    from helpers import Stop, stop_at
    from test_pretrain import _cfg, _lines

    import bertkit.pretraining.train as train
    real = train.accumulate_gradients

    def poison(calls):
        def poisoned(net, batch, **kw):
            stats = real(net, batch, **kw)
            calls.append(1)
            if len(calls) in (2, 3):
                for p in net.parameters():
                    p.grad.fill_(float("nan"))
                stats[0] = float("nan")
            return stats
        return poisoned
    monkeypatch.setattr(train, "accumulate_gradients", poison([]))
    straight = train.pretrain(_cfg(wiki_excerpt, tmp_path / "a", vocab=str(vocab), eval_pairs=8))
    monkeypatch.setattr(train, "accumulate_gradients", poison([]))
    with pytest.raises(Stop):
        train.pretrain(_cfg(wiki_excerpt, tmp_path / "b", vocab=str(vocab), eval_pairs=8), on_step=stop_at(3))
    monkeypatch.setattr(train, "accumulate_gradients", real)
    resumed = train.pretrain(_cfg(wiki_excerpt, tmp_path / "b", vocab=str(vocab), eval_pairs=8, resume=True))
    assert straight["skipped_steps"] == resumed["skipped_steps"] == 2
    assert _lines(tmp_path / "a") == _lines(tmp_path / "b")


@pytest.mark.parametrize("every", [-1, -4])
def test_a_negative_holdout_every_is_refused(tmp_path, every):
    """--holdout-every -1 held out nothing and -4 every 4th document (Python's modulo of a
    negative number), with no word said."""
    from bertkit import BertkitError
    from bertkit.pretraining.train import PretrainConfig
    with pytest.raises(BertkitError, match=rf"--holdout-every must be 0 \(none held out\) or at least 2 .*, got {every}"):
        PretrainConfig(corpus="wiki", out=str(tmp_path / "o"), steps=2, holdout_every=every)


@pytest.mark.parametrize("tokens", [0, -5])
def test_shard_tokens_below_one_is_refused(tmp_path, tokens):
    """shard_tokens 0 ran on, writing a shard every two documents."""
    from bertkit import BertkitError
    from bertkit.pretraining.train import PretrainConfig
    with pytest.raises(BertkitError, match=rf"shard.tokens must be at least 1, got {tokens}"):
        PretrainConfig(corpus="wiki", out=str(tmp_path / "o"), steps=2, shard_tokens=tokens)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete", "short_tokens", "past-vocab"])
def test_a_damaged_shard_is_named_not_a_traceback_or_short_pairs(tmp_path, damage):
    """A shard file cut short, overwritten or gone (a full disk, a stray edit in OUT/data) raised
    numpy's ValueError or FileNotFoundError from the batch thread; a token file shorter than its
    sentence offsets gave pairs cut short without a word."""
    from bertkit import BertkitError
    from bertkit.pretraining.shards import TokenStore
    tok = WordPieceTokenizer.train(["the cat sat on the mat and here"] * 20, 100)
    docs = [["the cat sat.", "on the mat."], ["and here.", "the cat."]] * 3
    train, _ = tokenize_corpus(iter(docs), tok, tmp_path / "shards", holdout_every=0)
    assert len(TokenStore(train.folder).shard(0).tokens) == train.meta["tokens"]  # whole, it opens
    path = train.folder / "shard_00000.tokens.npy"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:-4])
    elif damage == "garbage":
        path.write_bytes(b"garbage")
    elif damage == "delete":
        path.unlink()
    elif damage == "past-vocab":  # overwritten in place: a token id the vocabulary does not have
        tokens = np.load(path)
        tokens[5] = 0xFFFF
        np.save(path, tokens)
    else:  # a valid .npy file, of fewer tokens than the sentences say
        np.save(path, np.load(path)[:-3])
    with pytest.raises(BertkitError, match=r"shard_00000: damaged or missing \(.+\); delete .*shards to tokenize"):
        TokenStore(train.folder).shard(0)


def test_a_resumption_between_two_records_logs_what_an_uninterrupted_run_logs(tmp_path, wiki_excerpt, vocab):
    """A checkpoint between two records (--save-every 3, --log-every 4; or a Ctrl-C) lost the
    steps since the last record: the resumed run's record of step 4 was the mean of step 4
    alone, not of steps 1-4."""
    from helpers import Stop, stop_at
    from test_pretrain import _cfg, _lines

    from bertkit.pretraining.train import pretrain
    kw = dict(vocab=str(vocab), steps=8, log_every=4, save_every=3, eval_pairs=8)
    pretrain(_cfg(wiki_excerpt, tmp_path / "a", **kw))
    with pytest.raises(Stop):
        pretrain(_cfg(wiki_excerpt, tmp_path / "b", **kw), on_step=stop_at(3))
    pretrain(_cfg(wiki_excerpt, tmp_path / "b", resume=True, **kw))
    a, b = _lines(tmp_path / "a"), _lines(tmp_path / "b")
    assert [r["step"] for r in a if "loss" in r] == [4, 8]
    assert a == b


def test_resuming_a_finished_budgeted_run_trains_no_more(tmp_path, wiki_excerpt, vocab):
    """A budgeted run resumed from its final checkpoint (it stopped while writing the model, or
    --resume given twice) ran one more step at lr 0: a step and records past the end, its AdamW
    moments moved. A run by steps stops at once; so does one by budget now."""
    from test_pretrain import _cfg, _lines

    from bertkit.pretraining.train import pretrain
    kw = dict(vocab=str(vocab), steps=None, budget="3s", save_every=0, eval_pairs=8)
    out = tmp_path / "b"
    done = pretrain(_cfg(wiki_excerpt, out, **kw))
    lines = _lines(out)
    again = pretrain(_cfg(wiki_excerpt, out, resume=True, **kw))
    assert again["steps"] == done["steps"]
    assert _lines(out) == lines
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step_{done['steps']:07d}"]
    assert again["final_eval"] == done["final_eval"] is not None  # summary.json keeps its evaluation


def test_a_trainer_json_that_is_not_a_checkpoints_record_is_damaged_not_a_traceback(tmp_path):
    """Valid JSON of another shape ([], a number, no file list) raised AttributeError, or passed
    as a whole checkpoint with nothing checked."""
    from bertkit.training.checkpoints import checkpoint_problem, latest_checkpoint
    for i, text in enumerate(("[]", "3", '{"step": 3}', '{"files": {"model.safetensors": 5}}')):
        ckpt = tmp_path / "run" / "checkpoints" / f"step_{i + 1:08d}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer.json").write_text(text)
        assert checkpoint_problem(ckpt) == "trainer.json does not list the checkpoint's files", text
    assert latest_checkpoint(tmp_path / "run") is None


def test_resuming_pretraining_from_a_fine_tuning_checkpoint_is_refused_by_name(tmp_path):
    """A fine-tuning run's checkpoint records its own options: pretrain --resume on its --out ended
    in a KeyError (or compared options pretraining does not have)."""
    import json

    from bertkit import BertkitError
    from bertkit.pretraining.train import PretrainConfig, check_resumable
    ckpt = tmp_path / "ft" / "checkpoints" / "step_0000003"
    ckpt.mkdir(parents=True)
    cfg = PretrainConfig(corpus="wiki", out=str(tmp_path / "ft"), steps=2)
    for state in ({"step": 3, "files": {}}, {"step": 3, "options": {"task": "classify", "epochs": 3}, "files": {}}):
        (ckpt / "trainer.json").write_text(json.dumps(state))
        with pytest.raises(BertkitError, match="is not a checkpoint of `bertkit pretrain`"):
            check_resumable(ckpt, cfg, None)
    # a pretraining checkpoint of a newer version: its unknown option named, with this version
    (ckpt / "trainer.json").write_text(json.dumps({"step": 3, "files": {}, "options": {"corpus": "wiki",
                                                                                       "future_option": 1}}))
    with pytest.raises(BertkitError, match=r"records option\(s\) this bertkit \(.+\) does not know: future_option"):
        check_resumable(ckpt, cfg, None)


def test_a_trainer_json_whose_step_is_not_a_count_is_a_damaged_checkpoint(tmp_path):
    import json

    from bertkit.training.checkpoints import checkpoint_problem
    ckpt = tmp_path / "checkpoints" / "step_0000003"
    ckpt.mkdir(parents=True)
    for step in ("12", -12, True, None):
        (ckpt / "trainer.json").write_text(json.dumps({"step": step, "files": {}}))
        assert "step is not a count of steps" in checkpoint_problem(ckpt), step
    (ckpt / "trainer.json").write_text(json.dumps({"step": 3, "files": {}}))
    assert checkpoint_problem(ckpt) is None


def test_resume_with_a_budget_replaces_the_steps_the_run_began_with(tmp_path, wiki_excerpt):
    """A run begun with --steps, resumed with --budget: the budget is the run's length now (the
    saved --steps beside it was refused as "give --steps or --budget, not both")."""
    import dataclasses
    import json

    from bertkit.pretraining.recipes import PretrainConfig
    out = tmp_path / "run"
    out.mkdir()
    first = PretrainConfig(corpus=str(wiki_excerpt), out=str(out), steps=40)
    (out / "pretrain_config.json").write_text(json.dumps(dataclasses.asdict(first)))
    cfg = PretrainConfig.from_command({"resume": True, "out": str(out), "budget": "20s"})
    assert (cfg.budget, cfg.steps, cfg.corpus) == (20.0, None, str(wiki_excerpt))
    again = PretrainConfig.from_command({"resume": True, "out": str(out)})
    assert (again.steps, again.budget) == (40, None)


def test_a_model_folder_of_one_segment_type_is_refused_before_any_tokenizing(tmp_path, tiny_bert_factory):
    """Pretraining a type_vocab_size 1 folder tokenized the corpus, then hit an IndexError inside
    torch at the first sentence pair (segment 1 has no embedding)."""
    from bertkit import BertkitError
    from bertkit.pretraining.train import PretrainConfig, pretrain
    folder = tiny_bert_factory.folder(tmp_path / "one_type", type_vocab_size=1)
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat. It slept.\n\nA dog ran. It barked.\n")
    with pytest.raises(BertkitError, match="type_vocab_size is 1, but pretraining's sentence pairs need two"):
        pretrain(PretrainConfig(corpus=str(corpus), model=str(folder), out=str(tmp_path / "o"), steps=2, progress=False))
    assert not (tmp_path / "o").exists()
