"""Exported models on ONNX Runtime, without torch: `encode --backend onnx` starts in ONNX
Runtime's own start-up time (here 0.5 s, against 2.2 s for `import torch` alone)."""
from __future__ import annotations

import importlib
import json
import mmap
import os
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from ..config import ONE_SEGMENT_TYPE, BertConfig, load_config
from ..errors import BertkitError
from ..files import sha256, weight_files

ONNX = "model.onnx"
ONNX_INT8 = "model.int8.onnx"
HEAD_ONNX = "head.onnx"
MANIFEST = "onnx.json"  # what the ONNX files were exported from
EXPORTED_FROM = ("config.json", "bertkit.json")  # and the weight files


def _exported_from(folder: Path) -> list[str]:
    return [*weight_files(folder), *EXPORTED_FROM]


def source_files(folder: Path) -> dict:
    """Size, mtime and sha256 of the files an export is made from (the ones the folder has)."""
    return {name: {"bytes": (folder / name).stat().st_size, "mtime_ns": (folder / name).stat().st_mtime_ns,
                   "sha256": sha256(folder / name)} for name in _exported_from(folder) if (folder / name).is_file()}


def check_export_is_current(folder: Path) -> None:
    """The folder's ONNX files were exported from its present weights and config, or an error:
    a folder fine-tuned again over an export kept running the old encoder and head. A file with
    the size and mtime of the export is taken as it (no hashing at start-up); a copied one is
    hashed. Folders exported before the manifest are not checked."""
    path = folder / MANIFEST
    if not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise BertkitError(f"{path}: unreadable; run `bertkit export` again") from None
    for name in set(recorded) | {n for n in _exported_from(folder) if (folder / n).is_file()}:
        f, want = folder / name, recorded.get(name)
        stat = f.stat() if f.is_file() else None
        same = (want is not None and stat is not None and stat.st_size == want["bytes"]
                and (stat.st_mtime_ns == want["mtime_ns"] or sha256(f) == want["sha256"]))
        if not same:
            raise BertkitError(f"{folder}: its ONNX files were exported from another {name} (changed since the "
                               "export); run `bertkit export` again")
INPUTS = ("input_ids", "token_type_ids", "attention_mask")
OUTPUTS = ("sequence_output", "pooled_output")


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux names them; None where /proc/cpuinfo is not there."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def int8_pairs_saturate(flags: set[str] | None = None) -> bool:
    """Whether ONNX Runtime's uint8 x int8 matmul saturates on this CPU: with AVX2 or AVX-512 but
    no VNNI it multiplies with vpmaddubsw, which adds each two neighbouring products in 16 bits and
    clips them there (255 x 127 x 2 > 32,767). With VNNI (AVX512-VNNI, AVX-VNNI, AMX) the products
    add up in 32 bits, and without AVX2 they are widened to 16 bits first."""
    if flags is None:
        flags = _cpu_flags()
    if flags is None:  # not Linux: numpy's own probe (no AVX-VNNI there: such a CPU gets pair-safe weights)
        for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy 2, numpy 1
            features = getattr(importlib.import_module(module), "__cpu_features__", None) if find_spec(module) else None
            if features is not None:
                return bool(features.get("AVX2")) and not features.get("AVX512VNNI")
        return False
    return "avx2" in flags and not flags & {"avx512_vnni", "avx_vnni"}


# int8 matmuls of ONNX Runtime: the indices of their weight (B), its scale (None: MatMulInteger's
# is applied after it, named as quantize_dynamic names it) and its zero point
INT8_WEIGHT_INPUTS = {"MatMulInteger": (1, None, 3), "QAttention": (1, 4, 7), "DynamicQuantizeMatMul": (1, 2, 3)}
PAIR_LIMIT = 128  # |w + w'| of two neighbouring int8 weights: 255 x 128 = 32,640 fits int16


def int8_weights(model) -> dict[str, str]:
    """The int8 matmul weights of `model` (an onnx.ModelProto) that pair_safe_int8_weights can
    rescale: weight initializer -> its scale initializer, each once. A weight computed in the
    graph, with a zero point other than 0 or without a scale found is left out (never so in
    quantize_dynamic's graphs)."""
    from onnx import TensorProto, numpy_helper
    inits = {i.name: i for i in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        w, scale, zp = INT8_WEIGHT_INPUTS.get(node.op_type, (None, None, None))
        if w is None or len(node.input) <= w or node.input[w] not in inits:
            continue
        weight = node.input[w]
        if scale is None:  # MatMulInteger's scale is applied after it: quantize_dynamic names it W_scale
            scale_name = weight.removesuffix("_quantized") + "_scale"
        else:
            scale_name = node.input[scale] if len(node.input) > scale else ""
        zero = len(node.input) <= zp or not node.input[zp] or (
            node.input[zp] in inits and not numpy_helper.to_array(inits[node.input[zp]]).any())
        if inits[weight].data_type == TensorProto.INT8 and scale_name in inits and zero:
            found[weight] = scale_name
    return found


def pair_safe_int8_weights(model) -> int:
    """Rewrite `model` (an onnx.ModelProto, in place) so that no two neighbouring int8 weights of a
    column (rows 2i and 2i + 1, as ONNX Runtime's kernels pair them) add up past 128 in size: such a
    column is scaled down, its weights rounded again, and its scale raised to match. The saturating
    kernel (int8_pairs_saturate) then never clips: it computes what a CPU with VNNI computes on the
    same weights, at int8's speed. (Weights made uint8 give exact products too, but on ONNX
    Runtime's uint8 x uint8 kernel: 1.8-2.6x the time on the Xeons measured.) Only int8_weights
    are touched. Returns the number of columns rescaled."""
    from onnx import numpy_helper
    inits = {i.name: i for i in model.graph.initializer}
    rescaled = 0
    for weight, scale in int8_weights(model).items():
        b = numpy_helper.to_array(inits[weight]).astype(np.int32)  # (K, N)
        s = numpy_helper.to_array(inits[scale]).astype(np.float32)
        if b.ndim != 2 or s.size not in (1, b.shape[1]):
            continue
        padded = np.pad(b, ((0, b.shape[0] % 2), (0, 0)))
        pairs = np.abs(padded[0::2] + padded[1::2]).max(0)  # (N,) each column's largest pair
        if (pairs <= PAIR_LIMIT).all():
            continue
        # 127 / the largest pair: rounding can add 1 to a pair, to 128 at most
        f = np.minimum(1.0, 127.0 / np.maximum(pairs, 1))
        if s.size == 1:  # one scale for the whole matrix: one factor
            f[:] = f.min()
        inits[weight].CopyFrom(numpy_helper.from_array(np.rint(b * f).astype(np.int8), weight))
        new_scale = s / f[0] if s.size == 1 else s.reshape(-1) / f
        inits[scale].CopyFrom(numpy_helper.from_array(new_scale.astype(np.float32).reshape(s.shape), scale))
        rescaled += int((f < 1).sum())
    return rescaled


def model_for_this_cpu(path: str | Path) -> str | bytes:
    """The model to open here: `path`, or on a CPU where int8 products saturate, an int8 graph's
    bytes with its weights made pair-safe (pair_safe_int8_weights); the file stays as written, so
    CPUs with VNNI keep its weights. Simulated, the saturation took MiniLM's int8 vectors to a mean
    cosine of 0.950 to fp32; pair-safe they keep 0.998 (benchmarks/int8_saturation.py)."""
    if not int8_pairs_saturate():
        return str(path)
    # parsing MiniLM's fp32 graph takes most of a second: only a file naming an int8 matmul is parsed
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if all(data.find(op.encode()) < 0 for op in INT8_WEIGHT_INPUTS):
            return str(path)
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    if any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer):
        return str(path)  # weights in files beside it (over 2 GB): not an int8 BERT
    return model.SerializeToString() if pair_safe_int8_weights(model) else str(path)


def open_session(path: str | Path):
    """An ONNX Runtime CPU session, with as many threads as torch would use (OMP_NUM_THREADS
    when set, else ONNX Runtime's default of one per physical core)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        options.intra_op_num_threads = int(threads)
    options.log_severity_level = 3
    try:
        # ONNX Runtime's fused SkipLayerNormalization (the residual add and LayerNorm) took 30% of
        # the int8 graph's time, 3x the LayerNormalization and Add it replaces: int8 encoding 1.25x
        # faster without it, the vectors' cosine to fp32 as before (Xeon with AMX, ONNX Runtime
        # 1.31, docs/benchmarks.md); the fp32 graph is not fused either way
        return ort.InferenceSession(model_for_this_cpu(path), options, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=["SkipLayerNormFusion"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types
        raise BertkitError(f"{path}: cannot load the ONNX model ({e})") from None


class OnnxEncoder:
    """An exported encoder: int64 arrays in, (sequence_output (B, T, H), pooled_output (B, H))
    float32 arrays out."""

    def __init__(self, path: str | Path, config: BertConfig):
        self.session = open_session(path)
        self.config = config
        hidden = self.session.get_outputs()[0].shape[-1]
        if isinstance(hidden, int) and hidden != config.hidden_size:
            raise BertkitError(f"{path}: gives vectors of {hidden}, but config.json says hidden_size "
                               f"{config.hidden_size}; export the folder again")

    @classmethod
    def from_folder(cls, folder: str | Path, int8: bool = False) -> "OnnxEncoder":
        folder = Path(folder)
        path = folder / (ONNX_INT8 if int8 else ONNX)
        if not path.is_file():
            raise BertkitError(f"{folder}: no {path.name}; make it with `bertkit export --model FOLDER --out DIR"
                               f"{' --int8' if int8 else ''}` and use DIR")
        check_export_is_current(folder)
        return cls(path, load_config(folder))

    def run(self, input_ids: np.ndarray, token_type_ids: np.ndarray | None = None,
            attention_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(input_ids, dtype=np.int64)
        types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids, dtype=np.int64)
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        if self.config.type_vocab_size == 1 and types.any():  # as BertModel says it (ONNX Runtime: a Gather error)
            raise BertkitError(ONE_SEGMENT_TYPE)
        sequence, pooled = self.session.run(list(OUTPUTS), dict(zip(INPUTS, (ids, types, mask))))
        return sequence, pooled
