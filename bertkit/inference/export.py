"""`bertkit export`: the encoder as ONNX (dynamic batch and length), and the ONNX Runtime
stand-in for it behind `--backend onnx`.

The export folder is a complete model folder: the source folder's files (config, vocabulary,
weights, bertkit.json) plus model.onnx, so `encode`, `predict` and `serve` take it with either
backend. With `--backend onnx` the encoder runs on ONNX Runtime and a fine-tuned task's small
head stays in PyTorch, reading the encoder's outputs.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import BertkitError
from ..files import copy_into, write_file
from ..model import BertModel, BertOutput, gather_rows
from . import onnx_graph
from .onnx_runtime import HEAD_ONNX, INPUTS, MANIFEST, ONNX, ONNX_INT8, OUTPUTS, OnnxEncoder, open_session, source_files

SKIP_FOLDERS = ("checkpoints", "data", "tensorboard")  # a run's state and prepared corpus: not the model
# the files that decide how a model folder is read (weights, tokenizer, task, pooling)
MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "vocab.txt", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "bertkit.json", "modules.json",
               "sentence_bert_config.json", "config_sentence_transformers.json")


class _Graph(nn.Module):
    """BertModel with plain tensor outputs, as the exporter wants them."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.bert(input_ids, token_type_ids, attention_mask)
        return out.sequence_output, out.pooled_output


def _export(module: nn.Module, args: tuple, path, input_names, output_names, dynamic_shapes) -> None:
    import logging
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module.eval(), args, dynamo=True, input_names=list(input_names),
                                    output_names=list(output_names), dynamic_shapes=dynamic_shapes, verbose=False)
    program.save(str(path), external_data=False)


def export_onnx(bert: BertModel, path: str | Path, fuse: bool = True) -> None:
    """Write the encoder to `path` as ONNX, batch and length dynamic (length up to the model's
    positions), each layer's attention one Attention node (fuse=False: as the exporter
    writes it, the plain graph the fused one is tested against)."""
    # an example of batch 2 and length 8: the exporter would fix a dimension of size 1 as a constant
    ids = torch.full((2, 8), 5, dtype=torch.long)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length", max=bert.config.max_position_embeddings)}
    _export(_Graph(bert), (ids, torch.zeros_like(ids), torch.ones_like(ids)), path, INPUTS, OUTPUTS,
            (dims, dims, dims))
    if fuse:
        onnx_graph.fuse_attention(path, bert.config.num_attention_heads)


# what each task's head reads: (B, H) sentence vectors, or (B, T, H) token or sentence vectors
HEAD_INPUT_DIMS = {"classify": 2, "word": 2, "ner": 3, "tag": 3, "qa": 3, "summarize": 3}
HEAD_OUTPUTS = {"qa": ("start_logits", "end_logits")}


def export_head(task_name: str, head: nn.Module, hidden: int, path: str | Path) -> None:
    """Write a task head to `path` as ONNX: input "x" as the task feeds it, output its logits
    (qa: start and end). A CRF's transitions stay in model.safetensors (Viterbi runs outside)."""
    dims = HEAD_INPUT_DIMS[task_name]
    x = torch.randn((2, hidden) if dims == 2 else (2, 8, hidden))
    shapes = {0: torch.export.Dim("batch")} if dims == 2 else {0: torch.export.Dim("batch"), 1: torch.export.Dim("length")}
    _export(head, (x,), path, ["x"], HEAD_OUTPUTS.get(task_name, ("logits",)), (shapes,))


CALIBRATION_QUESTIONS, CALIBRATION_PARAGRAPHS, CALIBRATION_TOKENS = 192, 64, 128


def calibration_batches(tokenizer, max_len: int, size: int = 64) -> list[dict]:
    """Real text to find the activations' outlier channels on (quantize_int8): the first questions
    and paragraphs of the SQuAD subset that ships inside bertkit (Wikipedia, CC BY-SA), the
    paragraphs cut to 128 tokens; batches of the graph's inputs as int64 arrays."""
    from ..data.squad_subset import squad_subset_file
    from ..inputs import read_text
    articles = json.loads(read_text(squad_subset_file()))["data"]
    paragraphs = [p for a in articles for p in a["paragraphs"]]
    texts = ([q["question"] for p in paragraphs for q in p["qas"]][:CALIBRATION_QUESTIONS]
             + [p["context"] for p in paragraphs][:CALIBRATION_PARAGRAPHS])
    # given where=, the tokenizer leaves the cut unreported: no warning for a paragraph cut short
    encodings = tokenizer.encode_unpadded(texts, max_len=min(max_len, CALIBRATION_TOKENS), where=str)
    batches = []
    for i in range(0, len(encodings), size):
        batch = tokenizer.pad(encodings[i:i + size], tensors="np")
        batches.append({name: getattr(batch, name) for name in INPUTS})
    return batches


def quantize_int8(src: str | Path, dst: str | Path, tokenizer=None, max_len: int = 512, per_channel: bool = True) -> None:
    """model.int8.onnx from model.onnx: dynamic int8 matmuls with a weight scale per output channel,
    keeping the outlier channels found on calibration text where a tokenizer is given
    (onnx_graph.quantize_int8)."""
    calibration = None if tokenizer is None else calibration_batches(tokenizer, max_len)
    onnx_graph.quantize_int8(src, dst, calibration, per_channel=per_channel)


class OnnxBert(nn.Module):
    """An exported encoder (OnnxEncoder) with BertModel's call and outputs, so fine-tuned task
    models and the server use it unchanged. CPU only."""

    def __init__(self, runtime: OnnxEncoder):
        super().__init__()
        self.runtime = runtime
        self.config = runtime.config

    @classmethod
    def from_folder(cls, folder: str | Path, int8: bool = False) -> "OnnxBert":
        return cls(OnnxEncoder.from_folder(folder, int8))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, last_layer_rows=None) -> BertOutput:
        sequence, pooled = self.runtime.run(*(None if t is None else t.detach().cpu().numpy()
                                              for t in (input_ids, token_type_ids, attention_mask)))
        sequence = torch.from_numpy(sequence)  # (B, T, H): the graph runs every position
        if last_layer_rows is not None:
            sequence = gather_rows(sequence, last_layer_rows)
        return BertOutput(sequence, torch.from_numpy(pooled))


class OnnxHead(nn.Module):
    """A task head on ONNX Runtime, called as the torch head is; a CRF stays the torch one."""

    def __init__(self, path: str | Path, torch_head: nn.Module):
        super().__init__()
        self.session = open_session(path)
        self.crf = getattr(torch_head, "crf", None)
        self.anchor = nn.Parameter(torch.zeros(()), requires_grad=False)  # run_task asks the device

    def forward(self, x):
        outs = [torch.from_numpy(o) for o in self.session.run(None, {"x": x.detach().float().cpu().numpy()})]
        return tuple(outs) if len(outs) > 1 else outs[0]


def onnx_task_model(folder: str | Path, model, int8: bool = False) -> None:
    """Swap a loaded task model's encoder (int8: model.int8.onnx) and head for their ONNX Runtime
    stand-ins, in place."""
    folder = Path(folder)
    model.bert = OnnxBert.from_folder(folder, int8)
    if not (folder / HEAD_ONNX).is_file():
        raise BertkitError(f"{folder}: no {HEAD_ONNX}; export the fine-tuned folder with `bertkit export`")
    model.head = OnnxHead(folder / HEAD_ONNX, model.head)


def open_task_folder(folder: str | Path, task_name: str | None = None, backend: str = "torch", device=None):
    """A fine-tuned folder ready to predict, the one way `bertkit predict` and the server open it:
    (task, model in eval mode, tokenizer), with the encoder and head on ONNX Runtime for
    backend "onnx" or "onnx-int8" (the folder exported by `bertkit export`)."""
    from ..tasks.folder import load_task_model
    task, model, tok = load_task_model(folder, task_name, device=device)
    if backend != "torch":
        onnx_task_model(folder, model, int8=backend == "onnx-int8")
    return task, model, tok


def export(folder: str | Path, out: str | Path, int8: bool = False, overwrite: bool = False) -> dict:
    """Copy the model folder to `out` and add model.onnx (and model.int8.onnx); returns the
    largest difference between the ONNX and PyTorch outputs on a check batch."""
    from ..folders import load_model
    from ..outputs import check_output_folder
    from ..tokenizer import load_tokenizer

    folder = Path(folder)
    out = check_output_folder(out, overwrite)
    if out.resolve() == folder.resolve():
        raise BertkitError(f"--out {out} is the model folder itself; give a new folder")
    if folder.resolve() in out.resolve().parents:  # the copy would go into itself, deeper at each run
        raise BertkitError(f"--out {out} is inside the model folder {folder}; give a folder outside it")
    tokenizer = load_tokenizer(folder)
    bert, _ = load_model(folder, heads=False, quiet=True)
    bert.eval()
    from ..tasks.folder import fine_tuned_task, load_task_model
    # a fine-tuned folder's head is read before anything is written: a damaged one left a
    # half-made --out behind, which then refused the retry
    task, task_model, _ = load_task_model(folder, device="cpu") if fine_tuned_task(folder) else (None, None, None)
    out.mkdir(parents=True, exist_ok=True)
    for name in (ONNX, ONNX_INT8, HEAD_ONNX, MANIFEST):  # an earlier export's (--overwrite): never left stale
        (out / name).unlink(missing_ok=True)
    for name in MODEL_FILES:  # an earlier export's file the model lacks would be read in place of the model's:
        if (out / name).is_file() and not (folder / name).exists():  # its tokenizer.json before this vocab.txt
            (out / name).unlink()
    for f in folder.iterdir():  # the folder's files and sub-folders (a sentence-transformers pooling config)
        if (f.is_file() and f.name not in (ONNX, ONNX_INT8, HEAD_ONNX, MANIFEST)) or (
                f.is_dir() and f.name not in SKIP_FOLDERS):
            copy_into(f, out / f.name)  # a link in --out is replaced, never written through
    export_onnx(bert, out / ONNX)
    report = {"onnx": str(out / ONNX), "max_abs_diff": check_parity(bert, tokenizer, out / ONNX)}
    if task is not None:
        export_head(task.name, task_model.head, bert.config.hidden_size, out / HEAD_ONNX)
        report["head"] = str(out / HEAD_ONNX)
        x = torch.randn((3, bert.config.hidden_size) if HEAD_INPUT_DIMS[task.name] == 2
                        else (3, 11, bert.config.hidden_size))
        with torch.inference_mode():
            ref = task_model.head(x)
        got = OnnxHead(out / HEAD_ONNX, task_model.head)(x)
        ref, got = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
        report["head_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(ref, got))
    if int8:
        quantize_int8(out / ONNX, out / ONNX_INT8, tokenizer, bert.config.max_position_embeddings)
        report["int8"] = str(out / ONNX_INT8)
        report["int8_max_abs_diff"] = check_parity(bert, tokenizer, out / ONNX_INT8)
    write_file(out / MANIFEST, json.dumps({"files": source_files(out)}, indent=2) + "\n")
    return report


def export_file(folder: str | Path, path: str | Path, int8: bool = False, overwrite: bool = False) -> dict:
    """Write the encoder alone as one ONNX file (`bertkit export --onnx FILE`), for ONNX Runtime
    outside bertkit: inputs input_ids, token_type_ids, attention_mask; outputs sequence_output,
    pooled_output. With int8, also FILE's stem + .int8.onnx. Returns what export() returns."""
    from ..files import atomic_write
    from ..folders import load_model
    from ..outputs import check_output_file
    from ..tokenizer import load_tokenizer

    if Path(path).suffix != ".onnx":
        raise BertkitError(f"--onnx {path}: give a file name ending in .onnx")
    path = check_output_file(path, overwrite, option="--onnx")
    int8_path = path.with_name(path.stem + ".int8.onnx")
    if int8:
        check_output_file(int8_path, overwrite, option="--onnx (its int8 copy)")
    tokenizer = load_tokenizer(folder)
    bert, _ = load_model(folder, heads=False, quiet=True)
    bert.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    # plain ONNX operators only, for any runtime: no com.microsoft Attention
    atomic_write(path, lambda tmp: export_onnx(bert, tmp, fuse=False))
    report = {"onnx": str(path), "max_abs_diff": check_parity(bert, tokenizer, path)}
    if int8:
        atomic_write(int8_path, lambda tmp: quantize_int8(path, tmp, tokenizer, bert.config.max_position_embeddings))
        report["int8"] = str(int8_path)
        report["int8_max_abs_diff"] = check_parity(bert, tokenizer, int8_path)
    return report


CHECK_TEXTS = ["The quick brown fox jumps over the lazy dog.", "BERT reads both ways.",
               "A longer sentence, with commas and numbers like 1984, to vary the padding within the batch."]


@torch.inference_mode()
def check_parity(bert: BertModel, tokenizer, path: str | Path) -> float:
    """Largest absolute difference of the two outputs over a padded batch of real sentences."""
    batch = tokenizer.encode(CHECK_TEXTS, max_len=bert.config.max_position_embeddings)
    inputs = batch.model_inputs("cpu")
    ref = bert(**inputs)
    got = OnnxBert(OnnxEncoder(path, bert.config))(**inputs)
    keep = batch.attention_mask.bool()
    return max(float((ref.sequence_output - got.sequence_output)[keep].abs().max()),
               float((ref.pooled_output - got.pooled_output).abs().max()))
