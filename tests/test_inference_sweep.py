"""Inference edge cases found in a review: each test names the wrong result it guards against."""
import numpy as np
import pytest
import torch

from bertkit import BertkitError, Encoder


@pytest.fixture(scope="module")
def encoder(minilm_folder):
    return Encoder.from_folder(minilm_folder, device="cpu")


def test_find_matches_a_whole_word_not_the_end_of_another(encoder):
    # "riverbank" is river ##bank: find("bank") gave that piece's vector, not the word "bank"
    [tv] = encoder.token_vectors(["the riverbank and the bank"])
    assert tv.tokens[2:4] == ["river", "##bank"]
    np.testing.assert_array_equal(tv.find("bank"), tv.vectors[tv.tokens.index("bank")])
    with pytest.raises(BertkitError, match="not found"):
        encoder.token_vectors(["the riverbank"])[0].find("bank")


def test_find_is_case_blind_with_a_cased_vocabulary(tiny_bert_factory):
    # a cased model keeps "Paris" as is: the lower-cased match missed it
    from bertkit import BertModel
    from bertkit.tokenizer import WordPieceTokenizer
    tok = WordPieceTokenizer.train(["Paris is in France.", "paris and Rome"] * 20, vocab_size=200, lowercase=False)
    torch.manual_seed(0)
    enc = Encoder(BertModel(tiny_bert_factory.config(vocab_size=tok.vocab_size)), tok, device="cpu")
    [tv] = enc.token_vectors(["He saw Paris."])
    assert "Paris" in tv.tokens
    np.testing.assert_array_equal(tv.find("Paris"), tv.vectors[tv.tokens.index("Paris")])


def test_a_sentence_transformers_step_encode_does_not_run_is_warned_of(tmp_path, tiny_bert):
    # LaBSE's pipeline ends Pooling(cls) -> Dense(tanh) -> Normalize: bertkit skipped the Dense
    # without a word, and a max-pooling folder was silently encoded with cls
    import json
    import warnings

    from helpers import sentence_transformers_copy

    from bertkit.inference.serve import Served
    folder = sentence_transformers_copy(tiny_bert, tmp_path / "st")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # mean pooling alone: nothing to warn of
        Encoder.from_folder(folder, device="cpu")
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    for load in (lambda: Encoder.from_folder(folder, device="cpu"), lambda: Served(folder)):
        with pytest.warns(UserWarning, match=r"Dense module \(2_Dense\).*pooling \(max_tokens\)") as caught:
            load()
        assert "differ from sentence-transformers'" in str(caught[0].message)


def test_fill_mask_never_answers_an_id_past_the_tokenizer(tiny_bert_factory):
    # a config.json vocab_size padded past the vocabulary (as some checkpoints are, to a multiple
    # of 8): a padded row scoring high came back as {"token": None}
    from bertkit import BertForPreTraining
    from bertkit.inference.fill_mask import fill_mask
    from bertkit.tokenizer import WordPieceTokenizer
    tok = WordPieceTokenizer.train(["the cat sat on the mat.", "a dog ran in the park."] * 20, vocab_size=120)
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_bert_factory.config(vocab_size=tok.vocab_size + 8)).eval()
    with torch.no_grad():
        model.mlm.bias[tok.vocab_size:] = 50.0  # the padded rows would win every slot
    [[cands]] = fill_mask(model, tok, ["the [MASK] sat."], top_k=3)
    assert [c["token"] for c in cands] == [c["token"] for c in cands if c["token"] in tok.tok.get_vocab()]
    assert len(cands) == 3 and all(c["token"] is not None for c in cands)


@pytest.mark.parametrize("lowercase", [True, False])
def test_find_normalizes_the_word_as_the_tokenizer_does(tiny_bert_factory, lowercase):
    # an uncased vocabulary strips accents: the pieces read "cafe" and find("Café") missed them;
    # a CJK word is split into one word per character by the normalizer
    from bertkit import BertModel
    from bertkit.tokenizer import WordPieceTokenizer
    tok = WordPieceTokenizer.train(["Café au lait at the Café.", "we met in 北京 today"] * 20, vocab_size=200,
                                   lowercase=lowercase)
    torch.manual_seed(0)
    enc = Encoder(BertModel(tiny_bert_factory.config(vocab_size=tok.vocab_size)), tok, device="cpu")
    [tv] = enc.token_vectors(["He saw the Café in 北京."])
    word = "cafe" if lowercase else "Café"
    assert word in tv.tokens
    np.testing.assert_array_equal(tv.find("Café"), tv.vectors[tv.tokens.index(word)])
    np.testing.assert_array_equal(tv.find("café"), tv.vectors[tv.tokens.index(word)])
    i = tv.tokens.index("北")
    assert tv.tokens[i + 1] == "京"
    np.testing.assert_allclose(tv.find("北京"), tv.vectors[i:i + 2].mean(0))
    with pytest.raises(BertkitError, match="not found"):
        tv.find("saw café")  # both words of the text, but not in a row


def test_find_keeps_word_boundaries_of_a_phrase(tmp_path, tiny_bert_factory):
    # "new york" must be two words: the pieces of "newyork" (new ##york) are not it
    from bertkit import BertModel
    from bertkit.tokenizer import SPECIAL_TOKENS, WordPieceTokenizer
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIAL_TOKENS + ["i", "love", "new", "york", "##york"]) + "\n")
    tok = WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt", lowercase=True)
    torch.manual_seed(0)
    enc = Encoder(BertModel(tiny_bert_factory.config(vocab_size=tok.vocab_size)), tok, device="cpu")
    glued, spaced = enc.token_vectors(["i love newyork", "i love new york"])
    assert "##york" in glued.tokens, glued.tokens
    with pytest.raises(BertkitError, match="not found"):
        glued.find("new york")
    i = spaced.tokens.index("new")
    np.testing.assert_allclose(spaced.find("new york"), spaced.vectors[i:i + 2].mean(0))
