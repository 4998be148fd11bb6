"""Config sizes: the parameter count comes from the config alone, and a model whose fp32
parameters cannot fit in this machine's memory is refused before anything is allocated."""
import json

import pytest
import torch

import bertkit.config
from bertkit import BertConfig, BertForPreTraining, BertModel
from bertkit.cli import main
from bertkit.errors import BertkitError


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())  # a tied Parameter is listed once


@pytest.mark.parametrize("overrides", [None, {}, {"type_vocab_size": 3, "intermediate_size": 50}],
                         ids=["tiny", "hf_tester", "hf_tester_odd"])
def test_parameter_count_matches_the_built_model(tiny_bert_factory, overrides):
    cfg = BertConfig.preset("tiny") if overrides is None else tiny_bert_factory.config(**overrides)
    with torch.device("meta"):  # shapes only, nothing allocated
        assert cfg.parameter_count() == _numel(BertForPreTraining(cfg))
        assert cfg.parameter_count(heads=False) == _numel(BertModel(cfg))


def test_parameter_count_of_bert_base_is_the_published_one():
    # BERT-base with its pretraining heads: 110M (HF BertForPreTraining counts 110,106,428)
    assert BertConfig.preset("base").parameter_count() == 110_106_428


# 10^9 of any size is out of reach; 10^6 of a width or depth on top of BERT-base too (a million
# positions or vocabulary rows of BERT-base are 3 GB: they fit, and are not refused)
@pytest.mark.parametrize("preset, field, value", [
    *[("tiny", f, 10**9) for f in ("hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings",
                                  "num_hidden_layers")],
    *[("base", f, 10**6) for f in ("hidden_size", "intermediate_size", "num_hidden_layers")]])
def test_oversized_field_is_refused_before_allocation(monkeypatch, preset, field, value):
    monkeypatch.setattr(bertkit.config, "memory_bytes", lambda: 24 * 10**9)
    overrides = {field: value}
    if field == "hidden_size":
        overrides["num_attention_heads"] = 2
    built = []  # refused by the config itself: no layer is ever made (a clock here was flaky under load)
    monkeypatch.setattr(torch.nn.Module, "__init__", lambda self, *a, **k: built.append(self))
    with pytest.raises(BertkitError) as err:
        BertConfig.preset(preset, **overrides)
    assert built == []
    msg = str(err.value)
    assert f"{field} {value}" in msg
    assert "parameters need" in msg and "GB in fp32; this machine has 24 GB" in msg


def test_message_names_parameter_count_and_memory(monkeypatch):
    monkeypatch.setattr(bertkit.config, "memory_bytes", lambda: None)
    count = BertConfig(hidden_size=10**6, num_attention_heads=4).parameter_count()  # unknown memory: built
    assert 5.0e13 < count < 5.1e13  # 12 layers of 4H^2 + 2HI, pooler and MLM dense H^2, ...
    monkeypatch.setattr(bertkit.config, "memory_bytes", lambda: 24 * 10**9)
    with pytest.raises(BertkitError) as err:
        BertConfig(hidden_size=10**6, num_attention_heads=4)
    msg = str(err.value)
    assert msg.startswith("config (vocab_size 30522, hidden_size 1000000, num_hidden_layers 12, ")
    assert f"{count:.1e} parameters need {4 * count / 1e9:,.0f} GB in fp32; this machine has 24 GB" in msg


def test_models_that_fit_are_accepted(monkeypatch):
    monkeypatch.setattr(bertkit.config, "memory_bytes", lambda: 2 * 10**9)
    BertConfig.preset("large")  # 336M parameters: 1.3 GB in fp32
    with pytest.raises(BertkitError, match="this machine has 2 GB"):
        BertConfig.preset("large", num_hidden_layers=48)  # 2.6 GB
    monkeypatch.setattr(bertkit.config, "memory_bytes", lambda: None)  # unknown: no refusal
    BertConfig.preset("large", num_hidden_layers=48)


def test_real_machine_memory_is_found():
    have = bertkit.config.memory_bytes()
    assert have is None or have > 10**8


def test_config_json_refused_with_source(tmp_path, monkeypatch):
    monkeypatch.setattr(bertkit.config, "memory_bytes", lambda: 24 * 10**9)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert", "vocab_size": 10**9, "hidden_size": 128,
                                "num_hidden_layers": 2, "num_attention_heads": 2}))
    with pytest.raises(BertkitError) as err:
        BertConfig.from_json(path)
    assert str(path) in str(err.value) and "vocab_size 1000000000" in str(err.value)


def test_encode_with_huge_hidden_size_exits_2_before_building_and_writes_nothing(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "huge"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "bert", "architectures": ["BertModel"], "vocab_size": 99, "hidden_size": 10**6,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37,
        "max_position_embeddings": 64}))
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in
                                              ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]))
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": true}\n')
    texts = tmp_path / "texts.txt"
    texts.write_text("hello world\nworld\n")
    output = tmp_path / "out" / "vectors.npy"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    import bertkit.model
    built = []  # refused from config.json, before any layer is made (not a wall-clock bound)
    monkeypatch.setattr(bertkit.model.BertModel, "__init__", lambda self, *a, **k: built.append(self))
    code = main(["encode", "--model", str(folder), "--input", str(texts), "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert built == []
    assert "hidden_size 1000000" in err and "parameters need" in err and "GB in fp32; this machine has" in err
    assert str(folder / "config.json") in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
