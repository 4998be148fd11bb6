import json

import pytest

from bertkit import PRESETS, BertConfig, BertkitError


def test_presets_have_the_published_shapes():
    assert set(PRESETS) == {"tiny", "mini", "small", "base", "large"}
    tiny = BertConfig.preset("tiny")
    assert (tiny.num_hidden_layers, tiny.hidden_size, tiny.num_attention_heads, tiny.intermediate_size) == (2, 128, 2, 256)
    base = BertConfig.preset("base")
    assert (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.intermediate_size) == (12, 768, 12, 3072)
    large = BertConfig.preset("large")
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads, large.intermediate_size) == (24, 1024, 16, 4096)
    assert BertConfig.preset("tiny", vocab_size=1000).vocab_size == 1000


def test_unknown_preset_names_the_choices():
    with pytest.raises(BertkitError, match="unknown preset 'huge'.*tiny, mini, small, base, large"):
        BertConfig.preset("huge")


def test_heads_must_divide_hidden():
    with pytest.raises(BertkitError, match="not divisible"):
        BertConfig(hidden_size=100, num_attention_heads=3)


def test_hf_config_json_round_trip(tmp_path, minilm_folder):
    cfg = BertConfig.from_json(minilm_folder / "config.json")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size) == (6, 384, 12, 1536)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    assert BertConfig.from_json(path) == cfg
    # and transformers reads what we write
    from transformers import BertConfig as HFConfig
    hf = HFConfig.from_json_file(str(path))
    assert (hf.hidden_size, hf.num_hidden_layers, hf.layer_norm_eps) == (384, 6, 1e-12)


def test_bad_config_json_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "bert", "hidden_size": 64}')
    with pytest.raises(BertkitError, match=r"config.json: missing required key\(s\) vocab_size"):
        BertConfig.from_json(path)
    path.write_text('{"model_type": "roberta"}')
    with pytest.raises(BertkitError, match="model_type is 'roberta'"):
        BertConfig.from_json(path)
    path.write_text("{not json")
    with pytest.raises(BertkitError, match="config.json: not valid JSON"):
        BertConfig.from_json(path)


@pytest.mark.parametrize("field, value", [
    ("layer_norm_eps", -1), ("layer_norm_eps", 0), ("layer_norm_eps", float("nan")), ("layer_norm_eps", float("inf")),
    ("layer_norm_eps", "1e-12"), ("hidden_dropout_prob", 1.0), ("hidden_dropout_prob", -0.1),
    ("attention_probs_dropout_prob", 1.5), ("attention_probs_dropout_prob", float("nan")),
    ("initializer_range", -0.02), ("initializer_range", float("inf")),
    ("pad_token_id", -1), ("pad_token_id", 99), ("pad_token_id", None), ("pad_token_id", 1.0)])
def test_nonsense_values_are_refused(field, value):
    # each of these builds a model that silently computes NaN or nonsense
    with pytest.raises(BertkitError, match=f"config field {field} must be"):
        BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, **{field: value})


def test_sensible_edge_values_are_accepted_and_compute():
    import torch

    from bertkit import BertModel
    from bertkit.model import init_weights
    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
                     hidden_dropout_prob=0, attention_probs_dropout_prob=0.0, initializer_range=0, layer_norm_eps=1,
                     pad_token_id=98)
    assert (cfg.hidden_dropout_prob, cfg.initializer_range, cfg.layer_norm_eps, cfg.pad_token_id) == (0, 0, 1, 98)
    model = BertModel(cfg)
    init_weights(model, cfg)  # every weight 0: the outputs are LayerNorm's bias, finite
    out = model(torch.tensor([[2, 5, 98]]), attention_mask=torch.tensor([[1, 1, 0]]))
    assert torch.isfinite(out.sequence_output).all() and torch.isfinite(out.pooled_output).all()
    torch.testing.assert_close(out.sequence_output, torch.zeros(1, 3, 32))


def test_bad_value_in_config_json_is_named(tmp_path, minilm_folder):
    d = json.loads((minilm_folder / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**d, "layer_norm_eps": -1}))
    with pytest.raises(BertkitError, match=r"config.json: config field layer_norm_eps must be a positive finite number, got -1"):
        BertConfig.from_json(path)


@pytest.mark.parametrize("key", ["is_decoder", "add_cross_attention"])
def test_decoder_config_is_refused(tmp_path, key):
    # transformers runs such a BertModel with causal (and cross) attention: read as an encoder,
    # its outputs differed without a word
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 1,
                                "num_attention_heads": 4, "is_decoder": key == "is_decoder",
                                "add_cross_attention": True if key == "add_cross_attention" else False}))
    with pytest.raises(BertkitError, match=f"config.json: {key} is True; bertkit runs BERT as an encoder only"):
        BertConfig.from_json(path)
    path.write_text(json.dumps({"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 1,
                                "num_attention_heads": 4, "is_decoder": False, "add_cross_attention": False}))
    assert BertConfig.from_json(path).num_hidden_layers == 1


def test_hidden_act_not_a_string_is_named():
    with pytest.raises(BertkitError, match=r"hidden_act \['gelu'\] is not supported"):
        BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, hidden_act=["gelu"])
