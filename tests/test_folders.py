import json

import pytest
import torch
from safetensors.torch import load_file

from bertkit import BertForPreTraining, BertkitError, BertModel, load_model, save_model
from bertkit.folders import name_map


def _hf_config(cfg):
    from transformers import BertConfig as HFConfig
    return HFConfig(**{k: v for k, v in cfg.to_dict().items() if k != "architectures"})


@pytest.mark.parametrize("heads", [False, True])
def test_name_map_covers_every_tensor_both_ways(tiny_bert_factory, heads):
    from transformers import BertForPreTraining as HFPreTraining
    from transformers import BertModel as HFBert
    cfg = tiny_bert_factory.config()
    ours = BertForPreTraining(cfg) if heads else BertModel(cfg)
    theirs = HFPreTraining(_hf_config(cfg)) if heads else HFBert(_hf_config(cfg))
    table = name_map(cfg, heads)
    # every bertkit parameter (the tied decoder counted once) has an HF name ...
    assert set(table) == {n for n, _ in ours.named_parameters()}
    # ... and every HF tensor (less tied copies) is reached exactly once
    hf_names = [t for names in table.values() for t in names]
    assert len(hf_names) == len(set(hf_names))
    expected = {n for n, _ in theirs.named_parameters()} - {"cls.predictions.decoder.weight",
                                                            "cls.predictions.decoder.bias"}
    assert set(hf_names) == expected


def test_bertkit_save_loads_in_hf_with_identical_tensors_and_outputs(tmp_path, tiny_bert_factory):
    from transformers import BertForPreTraining as HFPreTraining
    from transformers import BertModel as HFBert
    ours = tiny_bert_factory.model(BertForPreTraining)
    torch.nn.init.normal_(ours.mlm.bias)  # non-zero, so a dropped bias would show
    save_model(ours, tmp_path)
    hf = HFPreTraining.from_pretrained(tmp_path).eval()
    ours.eval()
    sd = hf.state_dict()
    q, k, v = ours.bert.layers[1].attn.qkv.weight.chunk(3)
    assert torch.equal(sd["bert.encoder.layer.1.attention.self.key.weight"], k)
    assert torch.equal(sd["cls.predictions.bias"], ours.mlm.bias)
    assert torch.equal(sd["cls.predictions.decoder.weight"], ours.bert.embeddings.word.weight)
    ids = torch.randint(5, 99, (3, 8))
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    positions = torch.arange(8).repeat(3, 1)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, mlm_positions=positions)
        b = hf(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(a.mlm_logits, b.prediction_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.nsp_logits, b.seq_relationship_logits, atol=1e-5, rtol=0)
    # the encoder alone loads as HF BertModel too
    body = HFBert.from_pretrained(tmp_path)
    assert torch.equal(body.state_dict()["embeddings.word_embeddings.weight"], ours.bert.embeddings.word.weight)


def test_hf_folder_load_save_load_is_identical(tmp_path, minilm_folder, tiny_bert_factory):
    original = load_file(str(minilm_folder / "model.safetensors"))
    model, _ = load_model(minilm_folder, heads=False)
    save_model(model, tmp_path / "a")
    saved = load_file(str(tmp_path / "a" / "model.safetensors"))
    assert set(saved) == set(original) - {"embeddings.position_ids"}
    for name, tensor in saved.items():
        assert torch.equal(tensor, original[name]), name
    again, _ = load_model(tmp_path / "a", heads=False)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    # HF-saved BertForPreTraining (with heads) -> bertkit -> save -> same tensors
    from transformers import BertForPreTraining as HFPreTraining
    cfg = tiny_bert_factory.config()
    torch.manual_seed(3)
    HFPreTraining(_hf_config(cfg)).save_pretrained(tmp_path / "hf")
    ours, _ = load_model(tmp_path / "hf")
    save_model(ours, tmp_path / "b")
    hf_tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    ours_tensors = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert set(ours_tensors) == set(hf_tensors)
    assert all(torch.equal(ours_tensors[n], hf_tensors[n]) for n in hf_tensors)


def test_missing_heads_are_initialised_tied_and_reported(minilm_folder, capfd):
    model, _ = load_model(minilm_folder)
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no MLM head and no NSP head" in err[0] and "tied" in err[0]
    assert model.mlm.decoder_weight is model.bert.embeddings.word.weight
    assert torch.count_nonzero(model.mlm.bias) == 0
    assert model.nsp.classifier.weight.std().item() == pytest.approx(0.02, rel=0.3)


def test_folder_without_weights(tmp_path, minilm_folder):
    (tmp_path / "config.json").write_text((minilm_folder / "config.json").read_text())
    with pytest.raises(BertkitError, match="no model.safetensors in this folder"):
        load_model(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(BertkitError, match="pickled weights are never loaded"):
        load_model(tmp_path)
    with pytest.raises(BertkitError, match="no such directory"):
        load_model(tmp_path / "nope")
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(BertkitError, match="cannot read safetensors"):
        load_model(tmp_path)


def test_config_that_does_not_match_the_weights_names_the_tensor(tmp_path, minilm_folder):
    config = json.loads((minilm_folder / "config.json").read_text())
    (tmp_path / "model.safetensors").symlink_to(minilm_folder / "model.safetensors")
    config["intermediate_size"] = 1024
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match=r"'encoder.layer.0.intermediate.dense.weight' has shape "
                                           r"\(1536, 384\) but config.json implies \(1024, 384\)"):
        load_model(tmp_path)
    config["intermediate_size"] = 1536
    config["num_hidden_layers"] = 8
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match="'encoder.layer.6.attention.self.query.weight' is missing"):
        load_model(tmp_path)
    config["num_hidden_layers"] = 4  # fewer: layers 4 and 5 were dropped without a word
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match=r"holds tensor 'encoder.layer.5\.[a-z.A-Z]+', but "
                                           r"config.json describes 4 layers"):
        load_model(tmp_path)


def test_save_is_atomic_and_keeps_extra_tensors(tmp_path, tiny_bert_factory):
    cfg = tiny_bert_factory.config()
    model = BertModel(cfg)
    extra = {"classifier.weight": torch.randn(3, 32)}
    save_model(model, tmp_path, extra_tensors=extra, bertkit_info={"task": "classify"})
    assert not list(tmp_path.glob(".*.tmp"))
    loaded, found = load_model(tmp_path, heads=False)
    assert torch.equal(found["classifier.weight"], extra["classifier.weight"])
    assert json.loads((tmp_path / "bertkit.json").read_text()) == {"task": "classify"}


def test_a_masked_lm_file_keeps_its_mlm_head_and_gets_a_pooler_and_nsp_head(tmp_path, capfd, tiny_bert_factory):
    """HF's BertForMaskedLM stores no pooler and no NSP head: the folder was refused (pooler
    missing), and with the NSP head alone missing the trained MLM head was thrown away too."""
    from transformers import BertForMaskedLM
    cfg = tiny_bert_factory.config()
    torch.manual_seed(0)
    theirs = BertForMaskedLM(_hf_config(cfg)).eval()
    with torch.no_grad():
        theirs.cls.predictions.bias.normal_()  # a trained-looking bias, not HF's zeros
    theirs.save_pretrained(tmp_path / "mlm")
    capfd.readouterr()  # transformers' progress bar
    ours, _ = load_model(tmp_path / "mlm")
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no NSP head and no pooler" in err[0] and "MLM" not in err[0], err
    ids = torch.randint(5, cfg.vocab_size, (2, 9))
    positions = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        expected = theirs(input_ids=ids).logits                                       # (2, 9, V)
        got = ours(ids, mlm_positions=positions).mlm_logits.view(2, 9, -1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert ours.bert.pooler.dense.weight.std().item() == pytest.approx(0.02, rel=0.3)
    body, _ = load_model(tmp_path / "mlm", heads=False)  # the encoder alone: the pooler initialised too
    torch.testing.assert_close(body(ids).sequence_output, theirs.bert(input_ids=ids).last_hidden_state)


def test_layernorm_gamma_and_beta_of_converted_tensorflow_checkpoints_load(tmp_path, minilm_folder):
    """bert-base-uncased and the other checkpoints converted from Google's TensorFlow release
    name LayerNorm's tensors gamma and beta; transformers renames them as it loads."""
    import shutil

    from safetensors.torch import save_file
    old = tmp_path / "old"
    shutil.copytree(minilm_folder, old)
    tensors = load_file(str(old / "model.safetensors"))
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    assert sum(k.endswith("gamma") for k in renamed) == 13
    save_file(renamed, str(old / "model.safetensors"), metadata={"format": "pt"})
    new_model, _ = load_model(minilm_folder, heads=False)
    old_model, extra = load_model(old, heads=False)
    assert not extra
    for (name, a), b in zip(new_model.state_dict().items(), old_model.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoints_are_kept_and_found_by_step_number_past_seven_digits(tmp_path):
    """step_10000000 sorts before step_9999999 by name: the newest was pruned first and the
    run resumed from an older one."""
    from bertkit.training.checkpoints import latest_checkpoint, save_checkpoint
    write = lambda folder: (folder / "model.safetensors").write_bytes(b"weights")  # noqa: E731
    for step in (9_999_998, 9_999_999, 10_000_000, 10_000_001):
        save_checkpoint(tmp_path, step, write, {}, {"step": step}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_10000000", "step_10000001"]
    assert latest_checkpoint(tmp_path).name == "step_10000001"


def test_an_untied_mlm_decoder_is_refused_not_replaced(tmp_path, tiny_bert_factory):
    """bertkit ties the MLM decoder to the word embeddings; a file whose decoder differs loaded
    without a word and its logits were off by up to 29."""
    from transformers import BertForMaskedLM
    cfg = tiny_bert_factory.config()
    hf_cfg = _hf_config(cfg)
    hf_cfg.tie_word_embeddings = False
    theirs = BertForMaskedLM(hf_cfg)
    with torch.no_grad():
        theirs.cls.predictions.decoder.weight.normal_()
    theirs.save_pretrained(tmp_path / "untied")
    with pytest.raises(BertkitError, match="MLM decoder .* is not the word embeddings"):
        load_model(tmp_path / "untied")
    assert load_model(tmp_path / "untied", heads=False)[0] is not None  # the encoder alone is fine


def test_load_model_builds_undrawn_and_refuses_a_tensor_it_did_not_load(tmp_path, monkeypatch, tiny_bert_factory):
    """load_model allocates the weights without drawing them (each one is loaded): one left
    unloaded would hold whatever memory held, so it is an error, not a silent garbage weight."""
    import threading

    from bertkit import folders
    from bertkit.model import Linear, weights_not_drawn
    model = tiny_bert_factory.model(BertForPreTraining)
    save_model(model, tmp_path / "m")
    loaded, _ = load_model(tmp_path / "m")
    for (name, theirs), ours in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(theirs, ours), name
    # the undrawn build holds in its own thread only: a model built meanwhile elsewhere is drawn
    drawn = {}
    with weights_not_drawn():
        thread = threading.Thread(target=lambda: drawn.update(w=Linear(64, 64).weight.detach().clone()))
        thread.start()
        thread.join()
    assert drawn["w"].abs().max() > 0 and drawn["w"].std() > 0.01
    full = folders.name_map
    monkeypatch.setattr(folders, "name_map", lambda c, heads: {
        k: v for k, v in full(c, heads).items() if k != "bert.embeddings.position.weight"})
    with pytest.raises(BertkitError, match="not loaded: bert.embeddings.position.weight"):
        load_model(tmp_path / "m")


def test_a_sharded_checkpoint_loads_as_transformers_saves_it(tmp_path, tiny_bert_factory):
    """transformers saves a model over max_shard_size as model.safetensors.index.json and shards
    (model-00001-of-0000N.safetensors): such a folder was refused as having no model.safetensors."""
    import shutil

    from transformers import BertForPreTraining as HFPreTraining

    from bertkit.files import weight_files
    from bertkit.folders import has_trained_mlm_head
    cfg = tiny_bert_factory.config()
    torch.manual_seed(0)
    theirs = HFPreTraining(_hf_config(cfg)).eval()
    theirs.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    names = weight_files(tmp_path / "hf")
    assert names[0] == "model.safetensors.index.json" and len(names) > 3, names
    ours, _ = load_model(tmp_path / "hf")
    assert has_trained_mlm_head(tmp_path / "hf")
    ids = torch.randint(5, cfg.vocab_size, (2, 9))
    with torch.no_grad():
        expected = theirs(input_ids=ids)
        got = ours(ids, mlm_positions=torch.arange(9).expand(2, 9))
    torch.testing.assert_close(got.mlm_logits.view(2, 9, -1), expected.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.nsp_logits, expected.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    # a bad index is named: a shard outside the folder, a missing shard, a tensor its shard lacks
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    for change, message in (
            (lambda m: m.update({next(iter(m)): "../elsewhere.safetensors"}), "not a .safetensors file in this folder"),
            (lambda m: m.update({next(iter(m)): "model-gone.safetensors"}), "names shard 'model-gone.safetensors'"),
            (lambda m: m.update({"bert.extra.weight": names[1]}), f"maps tensor 'bert.extra.weight' to {names[1]}")):
        bad = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        shutil.copytree(tmp_path / "hf", bad)
        weight_map = json.loads(json.dumps(index["weight_map"]))
        change(weight_map)
        (bad / "model.safetensors.index.json").write_text(json.dumps({**index, "weight_map": weight_map}))
        with pytest.raises(BertkitError, match=message):
            load_model(bad)
    (bad / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(BertkitError, match="index.json: not a safetensors index"):
        load_model(bad)


def test_a_pair_for_a_model_of_one_segment_type_is_refused_in_words(tmp_path, tiny_bert_factory):
    """config.json type_vocab_size 1 (no segment B embedding): a text pair ended in an
    IndexError from deep inside torch; single texts run, and the export still traces."""
    cfg = tiny_bert_factory.config(num_hidden_layers=1, intermediate_size=64, type_vocab_size=1)
    model = BertModel(cfg).eval()
    ids = torch.tensor([[2, 5, 6, 3, 7, 3]])
    with pytest.raises(BertkitError, match="one segment type \\(config.json type_vocab_size 1\\)"):
        model(ids, torch.tensor([[0, 0, 0, 0, 1, 1]]))
    assert model(ids, torch.zeros_like(ids)).sequence_output.shape == (1, 6, 32)
    pytest.importorskip("onnxruntime")
    from bertkit.inference.export import export_onnx
    from bertkit.inference.onnx_runtime import OnnxEncoder
    export_onnx(model, tmp_path / "m.onnx")
    onnx = OnnxEncoder(tmp_path / "m.onnx", cfg)
    with pytest.raises(BertkitError, match="type_vocab_size 1"):
        onnx.run(ids.numpy(), ids.numpy() * 0 + (ids.numpy() == 7))


def test_a_tensorflow_or_flax_folder_is_named_as_one(tmp_path, minilm_folder):
    (tmp_path / "config.json").write_text((minilm_folder / "config.json").read_text())
    (tmp_path / "tf_model.h5").write_bytes(b"x")
    (tmp_path / "flax_model.msgpack").write_bytes(b"x")
    with pytest.raises(BertkitError, match=r"no model.safetensors in this folder \(found tf_model.h5, "
                                           r"flax_model.msgpack: TensorFlow and Flax weights are not read"):
        load_model(tmp_path)


def test_a_model_saved_over_a_sentence_transformers_folder_leaves_none_of_its_pipeline(tmp_path, minilm_folder,
                                                                                        tiny_bert_factory):
    # `finetune --overwrite` into an old MiniLM copy kept its modules.json: encode then pooled the
    # new model by the mean and normalised it, as the old folder declared
    import shutil

    from bertkit.inference.encode import Encoder, folder_pooling
    out = tmp_path / "out"
    shutil.copytree(minilm_folder, out)
    assert folder_pooling(out) == "mean"
    tiny_bert_factory.folder(out)
    assert not any((out / n).exists() for n in ("modules.json", "sentence_bert_config.json",
                                                "config_sentence_transformers.json"))
    enc = Encoder.from_folder(out, device="cpu")
    # the length is the tokenizer_config.json model_max_length that bertkit writes: the model's positions
    assert (enc.default_pooling, enc.default_normalize, enc.default_max_len) == ("cls", False, 512)
