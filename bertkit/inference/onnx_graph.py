"""Rewrites of the exported encoder graph for ONNX Runtime on CPU.

- `fuse_attention`: each layer's attention, as the exporter spells it out (the QKV projection,
  reshapes, transposes, two matmuls, the mask, softmax, a NaN guard), becomes one Attention node:
  the same vectors, fewer passes over the (B, heads, T, T) scores and the heads' copies.
- `quantize_int8`: dynamic int8 matmuls (ONNX Runtime's quantize_dynamic) that keep BERT's
  outlier channels. Dynamic quantisation gives a whole batch one activation scale per matmul, and
  a few channels of BERT's activations run 5-15x larger than the rest (MiniLM's channel 99 reaches
  28 where most stay under 2), so they set that scale and the other channels keep a few levels.
  Measured on real text at export:
  - a feed-forward's outlier channels (after GELU) leave the int8 path: their columns of the first
    matmul and rows of the second run on a small fp32 side path;
  - every other matmul's input (the attention's QKV projection's too) is smoothed (SmoothQuant):
    channel c is divided by s_c before quantisation and its weight row multiplied by s_c (the
    product is unchanged), s_c balancing the channel's range against its weight row's, so one
    activation scale fits all channels;
  - the pooler, one row per text, stays fp32.
"""
from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

# after GELU, a channel is an outlier where its largest |value| over the calibration tokens is over
# OUTLIER_RATIO times the median channel's; at most MAX_OUTLIERS per matmul (the largest)
OUTLIER_RATIO = 2.0
MAX_OUTLIERS = 16
# SmoothQuant's migration strength (Xiao et al., 2023): how much of the activations' spread over
# channels moves into the weights; in a sweep from 0.3 to 0.9 on 20,000 real texts, 0.7 and 0.8 gave
# the highest mean cosine to fp32 and no text under 0.99 (docs/benchmarks.md)
SMOOTHING = 0.7


def _linear(add, producer: dict, weights, uses: Counter):
    """`add` as x @ W + b: (the MatMul, the bias's name) where W and b are weights, the MatMul's
    output feeds only `add` and `add`'s only one node; else None. (The exporter shares equal weights, such as zero biases,
    among nodes: a caller that rewrites W or b checks `uses` of its own.)"""
    if add is None or add.op_type != "Add":
        return None
    matmul = next((producer[x] for x in add.input if x in producer), None)
    bias = next((x for x in add.input if x in weights), None)
    if (matmul is None or bias is None or matmul.op_type != "MatMul" or matmul.input[1] not in weights
            or uses[matmul.output[0]] > 1 or uses[add.output[0]] > 1):
        return None
    return matmul, bias


def fuse_attention(path: str | Path, num_heads: int) -> int:
    """Rewrite the ONNX file at `path` in place: each self-attention, from the fused QKV projection
    (x @ W + b, split in three) to the heads merged back before the output projection, becomes one
    com.microsoft.Attention node (the projection inside; quantize_dynamic makes it QAttention),
    masked by the 2-D attention_mask. Returns the number of layers fused (0 leaves the file as it
    was)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    graph = model.graph
    weights = {i.name for i in graph.initializer}
    nodes = list(graph.node)
    producer = {o: n for n in nodes for o in n.output}
    consumers = defaultdict(list)
    for n in nodes:
        for x in n.input:
            consumers[x].append(n)
    uses = Counter(x for n in nodes for x in n.input)
    fused = []  # (the projection's MatMul, its bias, the output projection's MatMul)
    for split in (n for n in nodes if n.op_type == "Split" and len(n.output) == 3):
        linear = _linear(producer.get(split.input[0]), producer, weights, uses)
        if linear is None:
            continue
        project, bias = linear
        # the attention is every node the split's outputs reach before a weight matmul: that matmul
        # is the output projection, its input the heads merged back to (B, T, H)
        region, frontier, out_proj = {}, list(split.output), None
        while frontier:
            for n in consumers[frontier.pop()]:
                if n.op_type == "MatMul" and n.input[1] in weights:
                    out_proj = n if out_proj is None or out_proj is n else False
                elif id(n) not in region:
                    region[id(n)] = n
                    frontier.extend(n.output)
        if out_proj and [n.op_type for n in region.values()].count("Softmax") == 1:
            fused.append((project, bias, out_proj))
    if not fused:
        return 0
    new = [helper.make_node("Cast", ["attention_mask"], ["attention_mask_int32"], to=TensorProto.INT32)]
    by_proj = {id(o): (p, b) for p, b, o in fused}
    for n in nodes:
        if id(n) in by_proj:
            project, bias = by_proj[id(n)]
            merged = n.input[0] + "_attention"
            new.append(helper.make_node("Attention", [project.input[0], project.input[1], bias, "attention_mask_int32"],
                                        [merged], domain="com.microsoft", num_heads=num_heads,
                                        name=project.name + "_attention"))
            n.input[0] = merged
        new.append(n)
    outputs = {o.name for o in graph.output}
    while True:  # drop what fed only the old attention
        used = {x for n in new for x in n.input} | outputs
        alive = [n for n in new if any(o in used for o in n.output)]
        if len(alive) == len(new):
            break
        new = alive
    used = {x for n in new for x in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)
    graph.ClearField("value_info")
    graph.ClearField("node")
    graph.node.extend(new)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(path))
    return len(fused)


def _channel_absmax(model, matmuls, batches: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each matmul's input: the largest |value| of each channel over the batches' real tokens."""
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for n in matmuls:
        probe.graph.output.append(onnx.ValueInfoProto(name=n.input[0]))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [n.input[0] for n in matmuls]
    absmax = {}
    for batch in batches:
        keep = batch["attention_mask"].astype(bool)
        for n, x in zip(matmuls, session.run(names, batch)):
            m = np.abs(x[keep]).max(0)
            absmax[n.name] = np.maximum(absmax.get(n.name, m), m)
    return absmax


def _outliers(absmax: np.ndarray) -> list[int]:
    top = np.argsort(-absmax)[:MAX_OUTLIERS]
    return sorted(int(c) for c in top if absmax[c] > OUTLIER_RATIO * np.median(absmax))


def smooth_for_int8(model, batches: Iterable[dict[str, np.ndarray]]) -> list[str]:
    """Rewrite `model` (an onnx.ModelProto, in place, still fp32 and computing the same function)
    so that quantize_dynamic keeps the outlier channels (the feed-forward's on a side path, the
    other inputs' channels smoothed); returns the names of the side path's matmuls, to be left in
    fp32."""
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    nodes = list(graph.node)
    producer = {o: n for n in nodes for o in n.output}
    uses = Counter(x for n in nodes for x in n.input)
    # weights rewritten in place: only those no other node reads (a tied matrix stays as it is)
    # (an Attention node projects its input with its weight, input 1, as a MatMul does)
    matmuls = [n for n in nodes if n.op_type in ("MatMul", "Attention") and n.input[1] in inits
               and len(inits[n.input[1]].dims) == 2 and uses[n.input[1]] == 1]
    absmax = _channel_absmax(model, matmuls, batches)

    def array(name):
        return numpy_helper.to_array(inits[name])

    def replace(name, value):
        inits[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(value, dtype=np.float32), name))

    def ffn_in(n):  # n's input is GELU(x @ W1 + b1): (the W1 matmul, the bias name, the GELU), else None
        gelu = producer.get(n.input[0])
        if gelu is None or gelu.op_type != "Gelu" or uses[gelu.output[0]] > 1:
            return None
        linear = _linear(producer.get(gelu.input[0]), producer, inits, uses)
        if linear is None or uses[linear[0].input[1]] > 1 or uses[linear[1]] > 1:  # W1 and b1 are rewritten
            return None
        return (*linear, gelu)

    before, after, side = {}, {}, []  # nodes to insert before / after a matmul
    for n in matmuls:
        p = n.name + "_int8_"
        ffn = ffn_in(n) if n.op_type == "MatMul" else None
        if ffn is not None:  # the outlier channels' columns of W1 and rows of W2 on an fp32 side path
            channels = _outliers(absmax[n.name])
            if not channels:
                continue
            first, bias, gelu = ffn
            w1, b1, w2 = array(first.input[1]), array(bias), array(n.input[1])
            rest = np.setdiff1d(np.arange(w1.shape[1]), channels)
            replace(first.input[1], w1[:, rest])
            replace(bias, b1[rest])
            replace(n.input[1], w2[rest])
            graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(w1[:, channels]), p + "w1"),
                                      numpy_helper.from_array(b1[channels], p + "b1"),
                                      numpy_helper.from_array(np.ascontiguousarray(w2[channels]), p + "w2")])
            main = n.output[0] + "_int8"
            side_gelu = onnx.NodeProto()
            side_gelu.CopyFrom(gelu)  # the graph's own GELU (its domain and approximation)
            side_gelu.name = p + "gelu"
            side_gelu.ClearField("input")
            side_gelu.ClearField("output")
            side_gelu.input.append(p + "zb")
            side_gelu.output.append(p + "g")
            after[n.name] = [
                helper.make_node("MatMul", [first.input[0], p + "w1"], [p + "z"], name=p + "first"),
                helper.make_node("Add", [p + "z", p + "b1"], [p + "zb"]),
                side_gelu,
                helper.make_node("MatMul", [p + "g", p + "w2"], [p + "y"], name=p + "second"),
                helper.make_node("Add", [main, p + "y"], [n.output[0]])]
            n.output[0] = main
            side += [p + "first", p + "second"]
        else:  # x[:, c] / s_c and W[c] * s_c, s_c = m_c^a / w_c^(1-a) (SmoothQuant): channels evened out
            m = absmax[n.name]
            if not np.median(m) > 0:  # most channels silent on the calibration text: nothing to balance
                continue
            m = np.maximum(m, 0.1 * np.median(m))  # a channel silent on the calibration text: not blown up
            w = array(n.input[1])
            smooth = m ** SMOOTHING / np.maximum(np.abs(w).max(1), 1e-8) ** (1 - SMOOTHING)
            smooth /= np.median(smooth)
            replace(n.input[1], w * smooth[:, None])
            graph.initializer.append(numpy_helper.from_array((1 / smooth).astype(np.float32), p + "smooth"))
            before[n.name] = [helper.make_node("Mul", [n.input[0], p + "smooth"], [p + "x"], name=p + "smooth")]
            n.input[0] = p + "x"
    ordered = []
    for n in nodes:
        ordered += before.get(n.name, []) + [n] + after.get(n.name, [])
    graph.ClearField("value_info")  # shapes changed (the feed-forward's width)
    graph.ClearField("node")
    graph.node.extend(ordered)
    return side


def quantize_int8(src: str | Path, dst: str | Path, calibration: Iterable[dict[str, np.ndarray]] | None = None,
                  per_channel: bool = True) -> None:
    """Dynamic int8 quantisation of the matmul weights (ONNX Runtime's quantize_dynamic), a scale
    per output channel (one per matrix, per_channel=False, flipped more predictions of a fine-tuned
    classifier: benchmarks/onnx_int8.py). With `calibration` (batches of the graph's inputs), the
    outlier channels measured on them are kept (smooth_for_int8)."""
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32_nodes = []
    with tempfile.TemporaryDirectory() as tmp:
        if calibration is not None:
            model = onnx.load(str(src))
            # and the pooler (a Gemm on one row per text: nothing to gain) stays fp32, [CLS]'s outliers
            # too; quantize_dynamic turns a Gemm into a MatMul named NAME_MatMul before it quantises
            fp32_nodes = smooth_for_int8(model, calibration) + [n.name + "_MatMul" for n in model.graph.node
                                                              if n.op_type == "Gemm" and n.name]
            src = Path(tmp) / "outliers.onnx"
            onnx.save(model, str(src))
        # its advice on the root logger ("WARNING:root:Please consider to run pre-processing before
        # quantization. Refer to example: https://...") reached every `bertkit export --int8` user; the
        # root logger's level and handlers (logging.warning adds one where there is none) are put back
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        root.setLevel(logging.ERROR)
        try:
            # shape inference stops at com.microsoft nodes (Attention): their outputs are float
            quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                             nodes_to_exclude=fp32_nodes, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        finally:
            root.setLevel(level)
            for handler in [h for h in root.handlers if h not in handlers]:
                root.removeHandler(handler)
