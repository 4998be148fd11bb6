import json

import numpy as np
import pytest
import torch
from helpers import SENTENCES

from bertkit import BertkitError, Encoder
from bertkit.cli import main
from bertkit.inference.encode import cosine, folder_pooling


@pytest.fixture(scope="module")
def encoder(minilm_folder):
    return Encoder.from_folder(minilm_folder, device="cpu")


def test_sentence_transformers_folder_declares_mean_pooling(minilm_folder, encoder):
    assert folder_pooling(minilm_folder) == "mean"
    assert encoder.default_pooling == "mean"


def test_padding_invariance_and_input_order(encoder):
    batch = encoder.encode(SENTENCES, pooling="cls", batch_size=5)
    for i, text in enumerate(SENTENCES):
        alone = encoder.encode([text], pooling="cls")
        assert np.abs(alone[0] - batch[i]).max() <= 1e-5
    # token vectors too: the longest and shortest sentence share a padded batch
    together = encoder.token_vectors(SENTENCES, batch_size=5)
    for i, text in enumerate(SENTENCES):
        alone = encoder.token_vectors([text])[0]
        assert together[i].tokens == alone.tokens
        assert np.abs(together[i].vectors - alone.vectors).max() <= 1e-5


def test_batches_run_longest_first(encoder):
    lengths = []
    hook = encoder.model.register_forward_hook(lambda m, args, kw, out: lengths.append(kw["input_ids"].size(1)),
                                               with_kwargs=True)
    try:
        encoder.encode(SENTENCES, batch_size=2)
    finally:
        hook.remove()
    # the first batch sizes the heap the others reuse
    assert len(lengths) == (len(SENTENCES) + 1) // 2 and lengths == sorted(lengths, reverse=True)
    assert lengths[0] > lengths[-1]


def test_mean_pooling_equals_sentence_transformers_recipe(encoder, minilm_folder):
    """The folder's modules run as sentence-transformers runs them: transformers' BertModel, the
    masked mean (1_Pooling), unit length (2_Normalize), texts read up to max_seq_length 256 of
    the 512 positions (sentence_bert_config.json); computed independently here."""
    from transformers import AutoTokenizer
    from transformers import BertModel as HFBert
    hf = HFBert.from_pretrained(str(minilm_folder)).eval()
    long = " ".join(["the bank of the river was steep and muddy after the rain"] * 40)  # ~480 tokens
    texts = SENTENCES + [long]
    batch = AutoTokenizer.from_pretrained(str(minilm_folder))(texts, padding=True, truncation=True,
                                                              max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = hf(**batch).last_hidden_state
    m = batch["attention_mask"][..., None].float()
    ref = ((h * m).sum(1) / m.sum(1)).numpy()
    assert (encoder.default_pooling, encoder.default_normalize, encoder.default_max_len) == ("mean", True, 256)
    plain = encoder.encode(texts, batch_size=2, normalize=False)
    assert np.abs(plain - ref).max() <= 1e-4
    ours = encoder.encode(texts, batch_size=2)  # the folder's defaults
    assert np.abs(ours - ref / np.linalg.norm(ref, axis=1, keepdims=True)).max() <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    whole = encoder.encode([long], max_len=512, normalize=False)  # the whole text when asked
    assert np.abs(whole - plain[-1]).max() > 1e-3


def test_poolings_differ_and_pairs_work(encoder):
    cls = encoder.encode(SENTENCES[:2], pooling="cls")
    mean = encoder.encode(SENTENCES[:2], pooling="mean")
    pooler = encoder.encode(SENTENCES[:2], pooling="pooler")
    assert cls.shape == mean.shape == pooler.shape == (2, 384)
    assert not np.allclose(cls, mean) and not np.allclose(cls, pooler)
    single = encoder.encode(["Paris is the capital of France."])
    pair = encoder.encode(["Paris is the capital"], ["of France."])
    assert not np.allclose(single, pair)


def test_same_word_gets_different_vectors_in_different_contexts(encoder):
    texts = ["a crane is flying", "a crane driver came", "the crane flew south for the winter"]
    tv = encoder.token_vectors(texts)
    bird, machine, bird2 = (t.find("crane") for t in tv)
    assert cosine(bird, machine) < 0.999          # context changes the vector ...
    assert cosine(bird, bird2) > cosine(bird2, machine)  # ... toward its sense


def test_bad_encoder_inputs(encoder):
    with pytest.raises(BertkitError, match="empty"):
        encoder.encode([])
    with pytest.raises(BertkitError, match="unknown pooling 'max'"):
        encoder.encode(["x"], pooling="max")
    with pytest.raises(BertkitError, match="exceeds the model's 512 positions"):
        encoder.encode(["x"], max_len=1000)
    long_text = "word " * 600
    with pytest.warns(UserWarning, match="truncated"):
        assert encoder.encode([long_text]).shape == (1, 384)
    with pytest.raises(BertkitError, match="over the limit of 256"):
        encoder.encode([long_text], truncation=False)
    # numbers of the wrong type are named, not a TypeError from range() or the tokenizers library
    for kwargs, message in (({"batch_size": 2.5}, "batch_size must be an integer of at least 1, got 2.5"),
                            ({"batch_size": 0}, "batch_size must be an integer of at least 1, got 0"),
                            ({"max_len": "64"}, "max_len must be an integer of at least 3, got '64'"),
                            ({"max_len": 64.0}, "max_len must be an integer of at least 3, got 64.0")):
        with pytest.raises(BertkitError, match=message):
            encoder.encode(["x"], **kwargs)
    with pytest.raises(BertkitError, match="max_len must be an integer of at least 1, got 8.0"):
        encoder.tokenizer.encode(["x"], max_len=8.0)


def test_cli_encode_txt_and_jsonl(tmp_path, minilm_folder, capsys):
    txt = tmp_path / "in.txt"
    txt.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "vec.npy"
    assert main(["encode", "--model", str(minilm_folder), "--input", str(txt), "--output", str(out)]) == 0
    vec = np.load(out)
    assert vec.shape == (len(SENTENCES), 384)
    enc = Encoder.from_folder(minilm_folder, device="cpu")
    np.testing.assert_allclose(vec, enc.encode(SENTENCES), atol=1e-5)
    assert "(mean pooling, unit length)" in capsys.readouterr().out  # the folder's Normalize step
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, rtol=1e-5)
    assert main(["encode", "--model", str(minilm_folder), "--input", str(txt), "--output", str(tmp_path / "p.npy"),
                 "--no-normalize"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), enc.encode(SENTENCES, normalize=False), atol=1e-5)
    # never overwrite without asking
    assert main(["encode", "--model", str(minilm_folder), "--input", str(txt), "--output", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    rows = tmp_path / "in.jsonl"
    rows.write_text("\n".join(json.dumps({"text": a, "text_pair": b}) for a, b in zip(SENTENCES, SENTENCES[::-1])))
    out2 = tmp_path / "pairs.npy"
    assert main(["encode", "--model", str(minilm_folder), "--input", str(rows), "--output", str(out2),
                 "--pooling", "cls"]) == 0
    np.testing.assert_allclose(np.load(out2), enc.encode(SENTENCES, SENTENCES[::-1], pooling="cls"), atol=1e-5)


def test_cli_encode_bad_files(tmp_path, minilm_folder, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("first line\ncaf\xe9 au lait\n".encode("latin-1"))
    args = ["encode", "--model", str(minilm_folder), "--output", str(tmp_path / "o.npy"), "--input"]
    assert main(args + [str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: not UTF-8 text: byte 0xe9 at byte offset 14 (line 2)" in err
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "ok"}\n{"txt": "typo"}\n')
    assert main(args + [str(rows)]) == 2
    assert "rows.jsonl, line 2: expected an object with a string field 'text'" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(args + [str(empty)]) == 2
    assert "no texts in this file" in capsys.readouterr().err
    assert main(["encode", "--model", str(tmp_path), "--input", str(bad), "--output", "x.npy"]) == 2
    assert not (tmp_path / "o.npy").exists()


def test_cli_tokenizer_train(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The quick brown fox jumps over the lazy dog.\n" * 20)
    (corpus / "b.txt").write_text("Pack my box with five dozen liquor jugs.\n" * 20)
    out = tmp_path / "vocab"
    assert main(["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "120", "--out", str(out)]) == 0
    assert (out / "vocab.txt").read_text().splitlines()[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    before = (out / "vocab.txt").read_bytes()
    assert main(["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "60", "--out", str(out)]) == 2
    assert "already holds" in capsys.readouterr().err and (out / "vocab.txt").read_bytes() == before
    (corpus / "c.txt").write_bytes(b"ok\n\xff\xfe")
    assert main(["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "60", "--out", str(tmp_path / "v2")]) == 2
    assert "c.txt: not UTF-8 text: byte 0xff at byte offset 3 (line 2)" in capsys.readouterr().err
    assert not (tmp_path / "v2").exists()


def test_jsonl_texts_may_hold_unicode_line_separators(tmp_path):
    from bertkit.inputs import read_text_inputs
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"text": "first\u2028still first"}, ensure_ascii=False) + "\n" +
                    json.dumps({"text": "second"}) + "\n", encoding="utf-8")
    assert read_text_inputs(rows).texts == ["first\u2028still first", "second"]


def _watch_first_linear(model):
    """Record, at the first Linear of every forward, whether autocast is on and the output dtype."""
    seen = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    handle = linear.register_forward_hook(
        lambda m, i, o: seen.append((torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"), o.dtype)))
    return seen, handle


def test_encode_runs_in_fp32_unless_bf16_is_asked_for(minilm_folder, encoder):
    # bf16 autocast (once the default on a GPU) moves vectors off their fp32 values
    import contextlib

    from bertkit.inference.encode import precision_context
    assert isinstance(precision_context(torch.device("cuda")), contextlib.nullcontext)  # the GPU default too
    seen, handle = _watch_first_linear(encoder.model)
    try:
        ref = encoder.encode(SENTENCES)
        assert seen and all(s == (False, torch.float32) for s in seen)
        assert ref.dtype == np.float32
        seen.clear()
        # on a CPU a bf16 request runs (CPU autocast): asked for, so done, and close to fp32
        bf16 = Encoder(encoder.model, encoder.tokenizer, pooling="mean", device="cpu", precision="bf16")
        vec = bf16.encode(SENTENCES)
        assert seen and all(s == (True, torch.bfloat16) for s in seen)
        assert vec.dtype == np.float32 and min(cosine(a, b) for a, b in zip(vec, ref)) > 0.99
    finally:
        handle.remove()
    with pytest.raises(BertkitError, match="unknown precision 'fp16'"):
        Encoder(encoder.model, encoder.tokenizer, device="cpu", precision="fp16")


def test_predict_runs_in_fp32_by_default(minilm_folder, tiny_bert_factory):
    from bertkit import BertModel
    from bertkit.tasks import get_task
    from bertkit.tasks.base import TaskModel
    from bertkit.tasks.runner import run_task
    from bertkit.tokenizer import WordPieceTokenizer
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    task = get_task("classify")()
    examples = task.read_inputs(texts=["a fine film", "dull"])
    task.fit([{**ex, "label": lab} for ex, lab in zip(examples, ["good", "bad"])], {"pooling": "cls"})
    cfg = tiny_bert_factory.config(vocab_size=30522)
    bert = BertModel(cfg)
    model = TaskModel(bert, task.head(cfg, bert))
    feats = task.features(examples, tok, 32)
    seen, handle = _watch_first_linear(model)
    try:
        run_task(task, model, feats, examples, tok)
        assert seen and all(s == (False, torch.float32) for s in seen)
        seen.clear()
        run_task(task, model, feats, examples, tok, precision="bf16")
        assert seen and all(s == (True, torch.bfloat16) for s in seen)
    finally:
        handle.remove()


def test_cli_encode_precision(tmp_path, minilm_folder, capsys):
    txt = tmp_path / "in.txt"
    txt.write_text("\n".join(SENTENCES) + "\n")
    assert main(["encode", "--model", str(minilm_folder), "--input", str(txt), "--output", str(tmp_path / "a.npy"),
                 "--precision", "bf16"]) == 0
    ref = Encoder.from_folder(minilm_folder, device="cpu").encode(SENTENCES)
    vec = np.load(tmp_path / "a.npy")
    assert min(cosine(a, b) for a, b in zip(vec, ref)) > 0.99
    with pytest.raises(SystemExit):
        main(["encode", "--model", str(minilm_folder), "--input", str(txt), "--output", str(tmp_path / "b.npy"),
              "--precision", "fp16"])


def _broken_copy(minilm_folder, folder, **config):
    import shutil
    folder.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        shutil.copy(minilm_folder / name, folder / name)
    cfg = json.loads((minilm_folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **config}))
    return folder


def _encode_fails(folder, tmp_path, capsys):
    """`bertkit encode` of SENTENCES with the model in `folder`: exit code 2; (stderr, output path)."""
    txt = tmp_path / "in.txt"
    txt.write_text("\n".join(SENTENCES) + "\n")
    out = tmp_path / "vec.npy"
    assert main(["encode", "--model", str(folder), "--input", str(txt), "--output", str(out)]) == 2
    return capsys.readouterr().err, out


def test_cli_encode_refuses_a_config_that_computes_nan(tmp_path, minilm_folder, capsys):
    # layer_norm_eps -1 once wrote all-NaN vectors and exited 0
    folder = _broken_copy(minilm_folder, tmp_path / "broken", layer_norm_eps=-1)
    err, out = _encode_fails(folder, tmp_path, capsys)
    assert err.count("\n") == 1 and "layer_norm_eps must be a positive finite number, got -1" in err
    assert not out.exists()


def test_non_finite_vectors_are_an_error_not_a_result(tmp_path, minilm_folder, capsys):
    import safetensors.torch

    from bertkit.folders import load_model
    # a NaN in one token's embedding: only the texts holding that token turn NaN
    enc = Encoder.from_folder(minilm_folder, device="cpu")
    crane = enc.tokenizer.token_to_id("crane")
    with torch.no_grad():
        enc.model.embeddings.word.weight[crane] = float("nan")
    with pytest.raises(BertkitError, match=r"2 of 5 output row\(s\) are not finite \(NaN or inf; first: text 0\)"):
        enc.encode(SENTENCES)
    with pytest.raises(BertkitError, match="not finite"):
        enc.token_vectors(SENTENCES)
    # and the CLI writes nothing
    folder = _broken_copy(minilm_folder, tmp_path / "nan")
    tensors = safetensors.torch.load_file(str(folder / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("word_embeddings.weight"))
    tensors[name][crane] = float("nan")
    safetensors.torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    # the folder is refused when opened, by the tensor, before any text is encoded
    with pytest.raises(BertkitError, match=r"word_embeddings.weight' holds 384 NaN or infinite values"):
        load_model(folder, heads=False)
    err, out = _encode_fails(folder, tmp_path, capsys)
    assert err.count("\n") == 1 and "holds 384 NaN or infinite values" in err
    assert not out.exists()


def test_an_encoder_takes_the_model_load_model_gives_by_default(minilm_folder):
    """load_model returns BertForPreTraining unless heads=False: Encoder(model, tok) failed on
    its first batch (mlm_positions missing)."""
    from bertkit import load_model
    from bertkit.tokenizer import load_tokenizer
    model, _ = load_model(minilm_folder, quiet=True)
    body, _ = load_model(minilm_folder, heads=False)
    tok = load_tokenizer(minilm_folder)
    np.testing.assert_array_equal(Encoder(model, tok, device="cpu").encode(SENTENCES[:3]),
                                  Encoder(body, tok, device="cpu").encode(SENTENCES[:3]))
    with pytest.raises(BertkitError, match="not one string"):
        Encoder(body, tok, device="cpu").encode("one text")


def test_fill_mask_names_a_top_k_that_is_not_an_integer(minilm_folder):
    from bertkit import load_model
    from bertkit.inference.fill_mask import fill_mask
    from bertkit.tokenizer import load_tokenizer
    model, _ = load_model(minilm_folder, quiet=True)
    tok = load_tokenizer(minilm_folder)
    for bad in (2.5, 0, "3"):
        with pytest.raises(BertkitError, match=f"top_k must be an integer of at least 1, got {bad!r}"):
            fill_mask(model, tok, ["a [MASK] day"], top_k=bad)
    assert len(fill_mask(model, tok, ["a [MASK] day"], top_k=2)[0][0]) == 2


def test_the_example_runs_on_any_folder(tiny_bert, minilm_folder, capsys):
    """examples/contextual_vectors.py [MODEL_FOLDER] (its docstring's usage) on a folder of one's
    own: it asserted MiniLM's answer (the kitten sentence nearest the cat one), a traceback on a
    one-minute pretraining run's folder; it prints which sentence is nearest instead."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "examples" / "contextual_vectors.py"
    spec = importlib.util.spec_from_file_location("contextual_vectors", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(str(tiny_bert))
    printed = capsys.readouterr().out
    assert "crane: " in printed and "bank: " in printed and "nearest in its own sense: " in printed
    assert "nearest to 'The cat sat on the mat.': " in printed
    # MiniLM tells the senses apart: nearer within a sense, and 3 of 4 nearest neighbours in it
    from bertkit import Encoder
    encoder = Encoder.from_folder(minilm_folder)
    for word, (first, second) in example.SENSES.items():
        within, across, own = example.senses(encoder, word, first, second)
        assert within > across and own == 3, word


def test_tokenizer_config_length_and_a_null_pad_id_are_read_as_transformers_reads_them(tmp_path, minilm_folder):
    """model_max_length of tokenizer_config.json was ignored (texts read to the positions, where
    transformers' tokenizer cuts them), and config.json's pad_token_id null was refused."""
    import json
    import shutil

    import numpy as np

    from bertkit.errors import BertkitError
    from bertkit.inference.encode import Encoder
    folder = tmp_path / "plain"
    shutil.copytree(minilm_folder, folder, ignore=shutil.ignore_patterns("modules.json", "sentence_bert_config.json",
                                                                         "1_Pooling", "2_Normalize"))
    texts = ["word " * 40, "a short text"]
    whole = Encoder.from_folder(folder).encode(texts, pooling="mean")
    cut = Encoder.from_folder(folder).encode(texts, pooling="mean", max_len=16)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 16}))
    with pytest.warns(UserWarning, match="truncated"):
        np.testing.assert_array_equal(Encoder.from_folder(folder).encode(texts, pooling="mean"), cut)
    assert not np.allclose(whole[0], cut[0])
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": int(1e30)}))  # no limit
    np.testing.assert_array_equal(Encoder.from_folder(folder).encode(texts, pooling="mean"), whole)
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": -1}))
    with pytest.raises(BertkitError, match=r"tokenizer_config.json: model_max_length must be an integer of at least 3"):
        Encoder.from_folder(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    model_config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**model_config, "pad_token_id": None}))
    np.testing.assert_array_equal(Encoder.from_folder(folder).encode(texts, pooling="mean"), whole)
