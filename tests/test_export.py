"""ONNX export and --backend onnx: outputs within 1e-4 of PyTorch; the attention weights the
page shows are the ones the model uses."""
import json

import numpy as np
import pytest
import torch
from helpers import SENTENCES, sentence_transformers_copy

from bertkit.cli import main
from bertkit.inference.attention import attention_maps
from bertkit.inference.encode import Encoder

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_bert):
    out = tmp_path_factory.mktemp("exported") / "onnx"
    assert main(["export", "--model", str(tiny_bert), "--out", str(out), "--int8"]) == 0
    return out


def test_attention_maps_are_the_ones_the_model_uses(tiny_bert_factory):
    model = tiny_bert_factory.model().eval()
    ids = torch.randint(5, 99, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    maps, last = attention_maps(model, ids, None, mask)
    assert maps.shape == (2, 2, 4, 9, 9)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 2, 4, 9))
    assert maps[:, 1, :, :, 6:].abs().max() == 0  # padding is never attended to
    with torch.no_grad():
        torch.testing.assert_close(last, model(ids, None, mask).sequence_output)
        # probabilities @ values, through the output projection, is the layer's own attention output
        x = model.embeddings(ids, torch.zeros_like(ids))
        layer = model.layers[0]
        B, T, H = x.shape
        v = layer.attn.qkv(x).split(H, dim=2)[2].view(B, T, 4, H // 4).transpose(1, 2)
        mine = layer.attn.out((maps[0] @ v).transpose(1, 2).reshape(B, T, H))
        torch.testing.assert_close(mine, layer.attn(x, mask.bool()[:, None, None, :]), atol=1e-5, rtol=0)


def test_export_gives_a_model_folder_within_1e4_of_pytorch(tiny_bert, exported):
    for name in ("model.onnx", "model.int8.onnx", "config.json", "model.safetensors", "vocab.txt"):
        assert (exported / name).is_file(), name
    torch_vectors = Encoder.from_folder(tiny_bert, device="cpu").encode(SENTENCES * 3, batch_size=4, pooling="mean")
    onnx = Encoder.from_folder(exported, backend="onnx")
    np.testing.assert_allclose(onnx.encode(SENTENCES * 3, batch_size=4, pooling="mean"), torch_vectors, atol=1e-4)
    pairs = Encoder.from_folder(tiny_bert, device="cpu").encode(SENTENCES, SENTENCES[::-1], pooling="pooler")
    np.testing.assert_allclose(onnx.encode(SENTENCES, SENTENCES[::-1], pooling="pooler"), pairs, atol=1e-4)


def test_cli_encode_and_predict_with_the_onnx_backend(tmp_path, tiny_bert, exported, capsys):
    txt = tmp_path / "in.txt"
    txt.write_text("\n".join(SENTENCES) + "\n")
    assert main(["encode", "--model", str(exported), "--input", str(txt), "--output", str(tmp_path / "o.npy"),
                 "--backend", "onnx"]) == 0
    assert main(["encode", "--model", str(exported), "--input", str(txt), "--output", str(tmp_path / "t.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), np.load(tmp_path / "t.npy"), atol=1e-4)
    # --backend onnx-int8 runs the int8 file `export --int8` wrote: near the fp32 vectors, not them
    assert main(["encode", "--model", str(exported), "--input", str(txt), "--output", str(tmp_path / "i.npy"),
                 "--backend", "onnx-int8"]) == 0
    a, b = np.load(tmp_path / "i.npy"), np.load(tmp_path / "o.npy")
    cosines = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert np.abs(a - b).max() > 1e-5 and cosines.min() > 0.95, cosines
    # a folder without model.onnx says how to make one
    assert main(["encode", "--model", str(tiny_bert), "--input", str(txt), "--output", str(tmp_path / "x.npy"),
                 "--backend", "onnx"]) == 2
    assert "bertkit export" in capsys.readouterr().err
    # ONNX Runtime runs the exported fp32 graph: bf16 is refused, not silently ignored
    assert main(["encode", "--model", str(exported), "--input", str(txt), "--output", str(tmp_path / "b.npy"),
                 "--backend", "onnx", "--precision", "bf16"]) == 2
    assert "runs in fp32" in capsys.readouterr().err
    # a fine-tuned classifier: the encoder on ONNX Runtime, its head in PyTorch, same scores
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + '"a wonderful film",fresh\n"dull and long",rotten\n' * 4)
    assert main(["finetune", "classify", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
                 "--out", str(tmp_path / "clf"), "--epochs", "1", "--batch-size", "4"]) == 0
    assert main(["export", "--model", str(tmp_path / "clf"), "--out", str(tmp_path / "clf-onnx")]) == 0
    capsys.readouterr()
    outs = []
    for backend in ("torch", "onnx"):
        assert main(["predict", "classify", "--model", str(tmp_path / "clf-onnx"), "--backend", backend,
                     "a wonderful film", "too long"]) == 0
        outs.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    for a, b in zip(*outs):
        assert a["label"] == b["label"] and a["scores"] == pytest.approx(b["scores"], abs=1e-4)
    # without model.int8.onnx, --backend onnx-int8 says how to make it
    assert main(["predict", "classify", "--model", str(tmp_path / "clf-onnx"), "--backend", "onnx-int8", "x"]) == 2
    assert "--int8" in capsys.readouterr().err


def test_export_keeps_a_sentence_transformers_pooling(tmp_path, tiny_bert):
    """The exported folder pools as its source does (modules.json and 1_Pooling/ come along)."""
    src = sentence_transformers_copy(tiny_bert, tmp_path / "st")
    assert main(["export", "--model", str(src), "--out", str(tmp_path / "onnx")]) == 0
    onnx = Encoder.from_folder(tmp_path / "onnx", backend="onnx")
    assert onnx.default_pooling == "mean"
    np.testing.assert_allclose(onnx.encode(SENTENCES), Encoder.from_folder(src, device="cpu").encode(SENTENCES),
                               atol=1e-4)


def test_export_refuses_to_overwrite(tiny_bert, exported, capsys):
    assert main(["export", "--model", str(tiny_bert), "--out", str(exported)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", "--model", str(tiny_bert), "--out", str(tiny_bert), "--overwrite"]) == 2


def test_onnx_encode_never_imports_torch(tmp_path, tiny_bert, exported):
    """`encode --backend onnx` runs on ONNX Runtime alone (its start-up is ONNX Runtime's, not
    torch's), every pooling and --normalize within 1e-4 of the PyTorch path."""
    import subprocess
    import sys
    txt = tmp_path / "in.txt"
    txt.write_text("\n".join(SENTENCES) + "\n")
    script = ("import sys\nfrom bertkit.cli import main\n"
              "for pooling in ('cls', 'mean', 'pooler'):\n"
              f"    assert main(['encode', '--model', {str(exported)!r}, '--input', {str(txt)!r}, '--output',"
              f" {str(tmp_path)!r} + f'/{{pooling}}.npy', '--backend', 'onnx', '--pooling', pooling,"
              " '--normalize']) == 0\n"
              "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert run.stdout.strip().splitlines()[-1] == "[]", run.stdout
    torch_encoder = Encoder.from_folder(exported, device="cpu")
    for pooling in ("cls", "mean", "pooler"):
        np.testing.assert_allclose(np.load(tmp_path / f"{pooling}.npy"),
                                   torch_encoder.encode(SENTENCES, pooling=pooling, normalize=True), atol=1e-4)


def test_export_onnx_file_is_the_encoder_alone(tmp_path, tiny_bert, capsys):
    """`export --onnx FILE` (the design's form) writes one .onnx graph that plain ONNX Runtime
    runs within 1e-4 of PyTorch; an existing file is kept unless --overwrite; --out and --onnx
    are one or the other."""
    path = tmp_path / "sub" / "encoder.onnx"
    assert main(["export", "--model", str(tiny_bert), "--onnx", str(path), "--int8"]) == 0
    assert sorted(p.name for p in path.parent.iterdir()) == ["encoder.int8.onnx", "encoder.onnx"]
    _assert_onnx_file_equals_pytorch(path, tiny_bert, SENTENCES, SENTENCES[::-1])

    before = path.stat().st_mtime_ns
    capsys.readouterr()
    assert main(["export", "--model", str(tiny_bert), "--onnx", str(path)]) == 2
    assert "already exists" in capsys.readouterr().err and path.stat().st_mtime_ns == before
    assert main(["export", "--model", str(tiny_bert), "--onnx", str(tmp_path / "encoder.bin")]) == 2
    assert ".onnx" in capsys.readouterr().err and not (tmp_path / "encoder.bin").exists()
    with pytest.raises(SystemExit):
        main(["export", "--model", str(tiny_bert), "--onnx", str(path), "--out", str(tmp_path / "o")])
    assert "not allowed with" in capsys.readouterr().err


def test_export_runs_the_plain_linear_where_fp32_inference_takes_onednn(tmp_path, tiny_bert, monkeypatch):
    """On a CPU where bertkit's fp32 inference runs oneDNN's linear kernel (kernels.AUTO), the
    exported graph still holds plain ONNX operators that ONNX Runtime runs within 1e-4."""
    import onnx

    from bertkit import kernels
    path = tmp_path / "encoder.onnx"
    with torch.no_grad(), kernels.use(kernels.Backend(onednn_linear=True)):  # as a caller of the Python API may export
        assert main(["export", "--model", str(tiny_bert), "--onnx", str(path)]) == 0
    assert {node.domain for node in onnx.load(str(path)).graph.node} <= {"", "ai.onnx"}
    _assert_onnx_file_equals_pytorch(path, tiny_bert, SENTENCES)


def _assert_onnx_file_equals_pytorch(path, folder, texts, pairs=None):
    """The ONNX file's outputs on ONNX Runtime within 1e-4 of the folder's model in PyTorch."""
    import onnxruntime as ort

    from bertkit.folders import load_model
    from bertkit.tokenizer import load_tokenizer
    batch = load_tokenizer(folder).encode(texts, pairs)
    bert, _ = load_model(folder, heads=False, quiet=True)
    with torch.inference_mode():
        ref = bert.eval()(**batch.model_inputs("cpu"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {k: getattr(batch, k).numpy() for k in ("input_ids", "token_type_ids", "attention_mask")}
    sequence, pooled = session.run(["sequence_output", "pooled_output"], feeds)
    keep = batch.attention_mask.bool().numpy()
    np.testing.assert_allclose(sequence[keep], ref.sequence_output.numpy()[keep], atol=1e-4)
    np.testing.assert_allclose(pooled, ref.pooled_output.numpy(), atol=1e-4)


def test_an_export_is_refused_once_its_weights_change_and_never_leaves_stale_files(tmp_path, tiny_bert, exported,
                                                                                    capsys):
    """A folder fine-tuned again over an export kept running the old model.onnx and head.onnx (a
    label dropped without a word); export --overwrite left the last export's int8 file; --out
    inside the model folder copied the folder into itself."""
    import shutil

    from bertkit import load_model, save_model
    txt = tmp_path / "in.txt"
    txt.write_text("\n".join(SENTENCES) + "\n")
    encode = lambda folder, name: main(["encode", "--model", str(folder), "--input", str(txt), "--output",  # noqa: E731
                                        str(tmp_path / name), "--backend", "onnx"])
    copied = tmp_path / "copied"
    shutil.copytree(exported, copied, copy_function=shutil.copy)  # new mtimes, the same bytes: hashed, accepted
    assert encode(copied, "a.npy") == 0
    model, _ = load_model(copied, heads=False)
    with torch.no_grad():
        model.embeddings.word.weight.mul_(2)
    save_model(model, copied)  # new weights beside the old model.onnx
    capsys.readouterr()
    assert encode(copied, "b.npy") == 2
    assert "exported from another model.safetensors" in capsys.readouterr().err
    assert main(["export", "--model", str(tiny_bert), "--out", str(copied), "--overwrite"]) == 0  # no --int8 now
    assert not (copied / "model.int8.onnx").exists() and encode(copied, "c.npy") == 0
    assert "use it with --backend onnx (" in capsys.readouterr().out
    assert main(["export", "--model", str(tiny_bert), "--out", str(copied), "--overwrite", "--int8"]) == 0
    assert "use it with --backend onnx or onnx-int8 (" in capsys.readouterr().out
    assert main(["export", "--model", str(copied), "--out", str(copied / "onnx")]) == 2
    assert "is inside the model folder" in capsys.readouterr().err and not (copied / "onnx").exists()


def test_a_fine_tuned_folder_whose_head_cannot_load_writes_nothing(tmp_path, tiny_bert, capsys):
    """The head was read after the copy and the encoder's export: the half-made --out then
    served as an export and refused the retry as not empty."""
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(tiny_bert, broken)
    (broken / "bertkit.json").write_text(json.dumps({"task": "classify", "labels": ["a", "b"]}))  # no head tensors
    assert main(["export", "--model", str(broken), "--out", str(tmp_path / "out")]) == 2
    assert "head's tensor 'classifier.weight' is missing" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_int8_export_keeps_a_scale_per_output_channel(exported, tmp_path):
    """One scale per weight matrix (the export before) moved a fine-tuned classifier's
    predictions more (benchmarks/onnx_int8.py): each matmul weight now has one per column."""
    import onnx
    from onnx import numpy_helper

    from bertkit.inference.export import quantize_int8

    def weight_scales(path):
        model = onnx.load(str(path))
        # the embeddings' Gathers keep one scale each whatever the setting: count the rest
        return [numpy_helper.to_array(t).size for t in model.graph.initializer
                if t.name.endswith("_scale") and ".embeddings." not in t.name]
    ours = weight_scales(exported / "model.int8.onnx")
    # tiny_bert: 2 layers of q/k/v (fused or not), output, FFN in and out (the pooler stays fp32)
    assert len(ours) >= 2 * 4 and all(size > 1 for size in ours), ours
    quantize_int8(exported / "model.onnx", tmp_path / "one.onnx", per_channel=False)
    one = weight_scales(tmp_path / "one.onnx")  # without calibration text the pooler is quantised too
    assert len(one) == len(ours) + 1 and all(size == 1 for size in one), one


def test_int8_export_prints_no_advice_of_onnx_runtime(exported, tmp_path, caplog):
    """quantize_dynamic warned on the root logger, so `bertkit export --int8` printed
    "WARNING:root:Please consider to run pre-processing before quantization. Refer to example:
    https://..." to its user; the root logger is left as it was."""
    import logging

    from bertkit.inference.export import quantize_int8
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    with caplog.at_level(logging.WARNING):
        root.setLevel(logging.WARNING)  # as a plain process has it
        quantize_int8(exported / "model.onnx", tmp_path / "q.onnx")
        assert root.level == logging.WARNING
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()], caplog.text
    root.setLevel(level)
    assert root.handlers == handlers


def test_export_over_an_earlier_one_leaves_none_of_its_model_files(tmp_path, tiny_bert, exported):
    """export --overwrite into an earlier export kept the files the new model lacks: its
    tokenizer.json was read in place of the new vocab.txt (other ids, without a word), its
    bertkit.json named a task the new model was not fine-tuned for."""
    import shutil

    from bertkit.tokenizer import load_tokenizer
    src = tmp_path / "src"
    src.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert / name, src / name)
    lines = (tiny_bert / "vocab.txt").read_text().splitlines()
    a, b = lines.index("the"), lines.index("a")
    lines[a], lines[b] = lines[b], lines[a]  # another vocabulary of the same size
    (src / "vocab.txt").write_text("\n".join(lines) + "\n")
    (src / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    out = tmp_path / "out"
    shutil.copytree(exported, out)
    (out / "bertkit.json").write_text(json.dumps({"task": "classify", "labels": ["a", "b"]}))
    assert main(["export", "--model", str(src), "--out", str(out), "--overwrite"]) == 0
    assert not (out / "tokenizer.json").exists() and not (out / "bertkit.json").exists()
    text = ["the cat sat on a mat"]
    assert load_tokenizer(out).encode(text).input_ids.tolist() == load_tokenizer(src).encode(text).input_ids.tolist()


def test_export_runs_each_attention_as_one_node(tiny_bert, tmp_path):
    """export_onnx's fusion (fuse_attention, run on the graph it exported) makes each layer's
    attention one Attention node (no softmax of its own left), and the fused graph gives the plain
    graph's outputs on a padded batch."""
    import shutil

    import onnx

    from bertkit.folders import load_model
    from bertkit.inference.export import export_onnx
    from bertkit.inference.onnx_graph import fuse_attention
    from bertkit.inference.onnx_runtime import OnnxEncoder
    from bertkit.tokenizer import load_tokenizer

    bert, _ = load_model(tiny_bert, heads=False, quiet=True)
    bert.eval()
    export_onnx(bert, tmp_path / "plain.onnx", fuse=False)
    shutil.copy(tmp_path / "plain.onnx", tmp_path / "fused.onnx")
    fuse_attention(tmp_path / "fused.onnx", bert.config.num_attention_heads)  # what export_onnx does next
    ops = [n.op_type for n in onnx.load(str(tmp_path / "fused.onnx")).graph.node]
    assert ops.count("Attention") == bert.config.num_hidden_layers and "Softmax" not in ops
    assert "Attention" not in [n.op_type for n in onnx.load(str(tmp_path / "plain.onnx")).graph.node]
    batch = load_tokenizer(tiny_bert).encode(SENTENCES[:5])  # five lengths: padding in every row but one
    inputs = [getattr(batch, k).numpy() for k in ("input_ids", "token_type_ids", "attention_mask")]
    fused, plain = (OnnxEncoder(tmp_path / f"{name}.onnx", bert.config).run(*inputs) for name in ("fused", "plain"))
    keep = inputs[2].astype(bool)
    assert np.abs(fused[0] - plain[0])[keep].max() < 1e-5 and np.abs(fused[1] - plain[1]).max() < 1e-5


def test_int8_keeps_the_outlier_channels_of_minilm(minilm_folder, tmp_path):
    """A few of MiniLM's activation channels run 5-15x the rest and set each matmul's one int8
    activation scale. smooth_for_int8's rewrite (the feed-forward's outlier channels on an fp32
    side path, every other matmul's input smoothed) computes the same vectors in fp32; quantised,
    each real review's mean-pooled vector stays at a cosine of 0.997 or more to fp32, above what
    plain dynamic quantisation keeps (lowest 0.9991 against 0.9959 on a Zen 4). The graph is the
    folder export's (each attention one node). MiniLM's first two layers, to export and calibrate
    in seconds; benchmarks/onnx_int8.py measures all six, fine-tuned."""
    import dataclasses

    import onnx

    from bertkit.data.rotten_tomatoes import build
    from bertkit.folders import load_model
    from bertkit.inference.export import calibration_batches, export_onnx, quantize_int8
    from bertkit.inference.onnx_graph import smooth_for_int8
    from bertkit.inference.onnx_runtime import OnnxEncoder
    from bertkit.tokenizer import load_tokenizer

    fp32 = tmp_path / "minilm.onnx"
    bert, _ = load_model(minilm_folder, heads=False, quiet=True)
    bert.layers = bert.layers[:2]
    bert.config = dataclasses.replace(bert.config, num_hidden_layers=2)
    export_onnx(bert.eval(), fp32)
    tok, config = load_tokenizer(minilm_folder), bert.config
    calibration = calibration_batches(tok, 512)
    model = onnx.load(str(fp32))
    side = smooth_for_int8(model, calibration)
    assert len(side) == 2 * config.num_hidden_layers  # each feed-forward has outlier channels after GELU
    # the attention's input, its output projection's and the feed-forward's first matmul's smoothed
    smoothed = [n for n in model.graph.node if n.op_type == "Mul" and n.name.endswith("_int8_smooth")]
    assert len(smoothed) == 3 * config.num_hidden_layers
    onnx.save(model, str(tmp_path / "rewritten.onnx"))
    quantize_int8(fp32, tmp_path / "ours.onnx", tok)
    quantize_int8(fp32, tmp_path / "plain.onnx")
    ops, plain_ops = ([n.op_type for n in onnx.load(str(tmp_path / f"{name}.onnx")).graph.node]
                      for name in ("ours", "plain"))
    # each layer's attention (QKV projection inside) and three weight matmuls in int8; the side
    # path's matmuls and the pooler (one row per text) in fp32
    assert ops.count("QAttention") == config.num_hidden_layers == plain_ops.count("QAttention")
    assert ops.count("MatMulInteger") == 3 * config.num_hidden_layers == plain_ops.count("MatMulInteger") - 1
    assert ops.count("MatMul") == plain_ops.count("MatMul") + len(side) + 1
    reviews = [json.loads(line)["text"] for line in build().files["train.jsonl"].splitlines()[:96]]

    def vectors(path):
        encoder, out = OnnxEncoder(path, config), []
        for i in range(0, len(reviews), 32):
            batch = tok.encode(reviews[i:i + 32])
            mask = batch.attention_mask.numpy()
            sequence, _ = encoder.run(batch.input_ids.numpy(), batch.token_type_ids.numpy(), mask)
            out.append((sequence * mask[..., None]).sum(1) / mask.sum(1, keepdims=True))
        return np.concatenate(out)

    def cosine(a, b):
        return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    ref = vectors(fp32)
    assert np.abs(vectors(tmp_path / "rewritten.onnx") - ref).max() < 1e-4
    ours, plain = cosine(vectors(tmp_path / "ours.onnx"), ref), cosine(vectors(tmp_path / "plain.onnx"), ref)
    assert ours.min() >= 0.997 and ours.min() > plain.min() and ours.mean() > plain.mean(), (ours.min(), plain.min())


def _int8_weights(model) -> dict:
    """name -> (int8 weight (K, N), its scale) of each int8 matmul of a quantize_dynamic graph."""
    from onnx import numpy_helper

    from bertkit.inference.onnx_runtime import INT8_WEIGHT_INPUTS, int8_weights
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found = int8_weights(model)
    # every int8 matmul of the graph is one pair_safe_int8_weights can rescale
    assert len(found) == sum(n.op_type in INT8_WEIGHT_INPUTS for n in model.graph.node)
    return {w: (inits[w].astype(np.int32), inits[scale]) for w, scale in found.items()}


def _largest_pair(b: np.ndarray) -> int:
    """The largest |w + w'| over neighbouring rows 2i, 2i + 1 (ONNX Runtime's kernels pair them)."""
    b = np.pad(b, ((0, b.shape[0] % 2), (0, 0)))
    return int(np.abs(b[0::2] + b[1::2]).max())


def test_pair_safe_int8_weights_cannot_clip_and_stay_near_the_weights_as_written(exported):
    """On CPUs with AVX2 but no VNNI, ONNX Runtime's uint8 x int8 kernel (vpmaddubsw) adds each two
    neighbouring products in 16 bits and clips them (255 x 127 x 2 > 32,767). pair_safe_int8_weights
    leaves no neighbouring pair past 128 (255 x 128 fits): it rescales a column only where it must,
    raises its scale to match (each weight within one rounding step of the one before), moves the
    outputs little, and leaves pair-safe weights as they are."""
    import onnx
    import onnxruntime as ort

    from bertkit.inference.onnx_runtime import pair_safe_int8_weights
    model = onnx.load(str(exported / "model.int8.onnx"))
    before = _int8_weights(model)
    assert len(before) >= 2 * 4  # tiny_bert: 2 layers of QKV, output, FFN in and out
    assert max(_largest_pair(b) for b, _ in before.values()) > 128  # as written: such pairs clip on those CPUs
    rescaled = pair_safe_int8_weights(model)
    after = _int8_weights(model)
    assert 0 < rescaled < sum(b.shape[1] for b, _ in before.values())
    for name, (b, scale) in before.items():
        b2, scale2 = after[name]
        assert _largest_pair(b2) <= 128 and np.all(scale2 >= scale)
        kept = scale2 == scale  # columns not rescaled: untouched
        assert np.array_equal(b2[:, kept], b[:, kept])
        assert np.abs(b2 * scale2 - b * scale).max() <= scale2.max() / 2 + 1e-9
    assert max(int(np.abs(b).max()) for b, _ in after.values()) == 127  # the int8 range still used
    assert pair_safe_int8_weights(model) == 0  # pair-safe already
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, (3, 9))
    feed = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": np.ones_like(ids)}
    fp32, old, new = (ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(["sequence_output"], feed)[0]
                      for m in (str(exported / "model.onnx"), str(exported / "model.int8.onnx"),
                                model.SerializeToString()))
    cos = lambda a, b: (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)  # noqa: E731
    assert cos(new, old).min() > 0.99 and abs(cos(new, fp32).mean() - cos(old, fp32).mean()) < 0.01


def test_int8_graphs_open_pair_safe_only_where_the_cpu_saturates(exported, monkeypatch):
    import onnx

    from bertkit.inference import onnx_runtime
    from bertkit.inference.onnx_runtime import OnnxEncoder, int8_pairs_saturate
    # Linux's flag names: AVX2 alone saturates; VNNI (AVX-512's, AVX's, AMX CPUs have it) or no AVX2 does not
    assert int8_pairs_saturate({"sse4_2", "avx", "avx2", "fma"})
    assert int8_pairs_saturate({"avx2", "avx512f", "avx512bw"})
    assert not int8_pairs_saturate({"avx2", "avx512f", "avx512_vnni", "amx_int8"})
    assert not int8_pairs_saturate({"avx2", "avx_vnni"})
    assert not int8_pairs_saturate({"sse4_2"}) and not int8_pairs_saturate({"asimd", "asimddp"})

    int8, fp32 = exported / "model.int8.onnx", exported / "model.onnx"
    opened = onnx_runtime.model_for_this_cpu
    assert opened(int8) == str(int8)  # this CPU: the weights as written
    ids = np.array([[2, 40, 41, 42, 3]])
    here = OnnxEncoder.from_folder(exported, int8=True).run(ids)[0]
    monkeypatch.setattr(onnx_runtime, "int8_pairs_saturate", lambda flags=None: True)
    rewritten = opened(int8)
    assert isinstance(rewritten, bytes)
    assert max(_largest_pair(b) for b, _ in _int8_weights(onnx.load_from_string(rewritten)).values()) <= 128
    saturating = OnnxEncoder.from_folder(exported, int8=True).run(ids)[0]
    assert np.abs(saturating - here).max() > 0 and (saturating * here).sum() / np.linalg.norm(saturating) \
        / np.linalg.norm(here) > 0.99
    assert opened(fp32) == str(fp32)  # the fp32 graph names no int8 matmul: opened from its path, unparsed
