"""Model folders in the HuggingFace layout, and the one name map between bertkit and HF.

A folder holds config.json (HF BERT keys), model.safetensors (or, as transformers saves a large
model, model.safetensors.index.json and its shards), vocab.txt and/or tokenizer.json, and
bertkit.json for what bertkit adds. Weights are read with safetensors only: nothing is
ever unpickled.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import BertConfig, load_config
from .errors import BertkitError
from .files import WEIGHTS, WEIGHTS_INDEX, atomic_write, copy_into, read_shard_index, weights_path
from .model import BertForPreTraining, BertModel, init_weights, weights_not_drawn
from .pooling import folder_modules

# ---- the name map ---------------------------------------------------------------------------
# bertkit name -> HF BertModel name(s). Several HF names are concatenated along dim 0 (our fused
# qkv). "{i}" stands for the layer index. Head names are HF BertForPreTraining's, whose encoder
# names carry the "bert." prefix.
ENCODER_MAP: dict[str, tuple[str, ...]] = {
    "embeddings.word.weight": ("embeddings.word_embeddings.weight",),
    "embeddings.position.weight": ("embeddings.position_embeddings.weight",),
    "embeddings.segment.weight": ("embeddings.token_type_embeddings.weight",),
    "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
    "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
    "layers.{i}.attn.qkv.weight": ("encoder.layer.{i}.attention.self.query.weight",
                                   "encoder.layer.{i}.attention.self.key.weight",
                                   "encoder.layer.{i}.attention.self.value.weight"),
    "layers.{i}.attn.qkv.bias": ("encoder.layer.{i}.attention.self.query.bias",
                                 "encoder.layer.{i}.attention.self.key.bias",
                                 "encoder.layer.{i}.attention.self.value.bias"),
    "layers.{i}.attn.out.weight": ("encoder.layer.{i}.attention.output.dense.weight",),
    "layers.{i}.attn.out.bias": ("encoder.layer.{i}.attention.output.dense.bias",),
    "layers.{i}.attn_norm.weight": ("encoder.layer.{i}.attention.output.LayerNorm.weight",),
    "layers.{i}.attn_norm.bias": ("encoder.layer.{i}.attention.output.LayerNorm.bias",),
    "layers.{i}.ffn_in.weight": ("encoder.layer.{i}.intermediate.dense.weight",),
    "layers.{i}.ffn_in.bias": ("encoder.layer.{i}.intermediate.dense.bias",),
    "layers.{i}.ffn_out.weight": ("encoder.layer.{i}.output.dense.weight",),
    "layers.{i}.ffn_out.bias": ("encoder.layer.{i}.output.dense.bias",),
    "layers.{i}.ffn_norm.weight": ("encoder.layer.{i}.output.LayerNorm.weight",),
    "layers.{i}.ffn_norm.bias": ("encoder.layer.{i}.output.LayerNorm.bias",),
    "pooler.dense.weight": ("pooler.dense.weight",),
    "pooler.dense.bias": ("pooler.dense.bias",),
}
HEADS_MAP: dict[str, tuple[str, ...]] = {
    "mlm.dense.weight": ("cls.predictions.transform.dense.weight",),
    "mlm.dense.bias": ("cls.predictions.transform.dense.bias",),
    "mlm.norm.weight": ("cls.predictions.transform.LayerNorm.weight",),
    "mlm.norm.bias": ("cls.predictions.transform.LayerNorm.bias",),
    "mlm.bias": ("cls.predictions.bias",),
    "nsp.classifier.weight": ("cls.seq_relationship.weight",),
    "nsp.classifier.bias": ("cls.seq_relationship.bias",),
}
# Tensors HF may store that carry nothing of their own: tied copies of other tensors, and the
# position-id buffer older HF versions saved.
HF_DERIVED = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
              "bert.embeddings.position_ids"}


def name_map(cfg: BertConfig, heads: bool) -> dict[str, tuple[str, ...]]:
    """Every bertkit parameter name of a model with this config -> its HF name(s)."""
    out = {}
    prefix = "bert." if heads else ""
    for ours, theirs in ENCODER_MAP.items():
        layers = range(cfg.num_hidden_layers) if "{i}" in ours else [None]
        for i in layers:
            out[(prefix + ours).format(i=i)] = tuple(prefix + t.format(i=i) for t in theirs)
    if heads:
        out.update(HEADS_MAP)
    return out


def to_hf(state: dict[str, torch.Tensor], cfg: BertConfig, heads: bool) -> dict[str, torch.Tensor]:
    hf = {}
    for ours, theirs in name_map(cfg, heads).items():
        for name, part in zip(theirs, state[ours].chunk(len(theirs), dim=0)):
            hf[name] = part.contiguous()
    return hf


# ---- loading --------------------------------------------------------------------------------
def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    if not (folder / WEIGHTS).is_file() and (folder / WEIGHTS_INDEX).is_file():
        out: dict[str, torch.Tensor] = {}
        for name, tensors in read_shard_index(folder).items():
            try:
                shard = load_file(str(folder / name))
            except (SafetensorError, OSError, ValueError) as e:
                raise BertkitError(f"{folder / name}: cannot read safetensors file ({e})") from None
            if absent := [t for t in tensors if t not in shard]:
                raise BertkitError(f"{folder / WEIGHTS_INDEX}: maps tensor {absent[0]!r} to {name}, which does "
                                   "not hold it")
            out.update({t: shard[t] for t in tensors})
        return out
    path = folder / WEIGHTS
    if not path.is_file():
        others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = (f" (found {', '.join(others)}: pickled weights are never loaded; convert them to "
                "safetensors)") if others else ""
        # a TensorFlow or Flax release (tf_model.h5, flax_model.msgpack) has no PyTorch weights at all
        found = sorted(p.name for p in folder.glob("*.h5")) + sorted(p.name for p in folder.glob("*.msgpack"))
        if found and not others:
            hint = f" (found {', '.join(found)}: TensorFlow and Flax weights are not read; convert them to safetensors)"
        raise BertkitError(f"{folder}: no {WEIGHTS} in this folder{hint}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise BertkitError(f"{path}: cannot read safetensors file ({e})") from None


def _normalised_names(raw: dict[str, torch.Tensor]) -> dict[str, str]:
    """HF file name -> the name with the 'bert.' prefix of the task models (BertModel files
    store the encoder without it), and LayerNorm's weight and bias under their names of today:
    the checkpoints converted from Google's TensorFlow release (bert-base-uncased ...) call them
    gamma and beta, which transformers renames as it loads them."""
    def today(k: str) -> str:
        if ".LayerNorm." in k and k.endswith((".gamma", ".beta")):
            return k.rsplit(".", 1)[0] + (".weight" if k.endswith(".gamma") else ".bias")
        return k
    prefixed = any(k.startswith("bert.") for k in raw)
    return {k: today(k if prefixed or k.startswith("cls.") else "bert." + k) for k in raw}


def has_trained_mlm_head(folder: str | Path) -> bool:
    """Whether the folder's weights hold an MLM head (HF's cls.predictions.*): a plain encoder
    such as MiniLM and fine-tuned folders have none, and load_model gives them a random one."""
    from safetensors import safe_open
    folder = Path(folder)
    try:
        if not (folder / WEIGHTS).is_file() and (folder / WEIGHTS_INDEX).is_file():
            return any("cls.predictions.transform.dense.weight" in t for t in read_shard_index(folder).values())
        with safe_open(str(folder / WEIGHTS), "pt") as f:
            return "cls.predictions.transform.dense.weight" in set(f.keys())
    except (SafetensorError, OSError, ValueError, BertkitError):
        return False


def _check_values(tensor: torch.Tensor, name: str, source: Path) -> None:
    """A weight must be floating point (bertkit saves fp32; published files fp16 or bf16 too) and
    finite: an int8 cast or a NaN would run on, every answer the same or NaN."""
    if not tensor.is_floating_point():
        raise BertkitError(f"{source}: tensor {name!r} is {str(tensor.dtype).removeprefix('torch.')}, not a "
                           "floating-point weight")
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise BertkitError(f"{source}: tensor {name!r} holds {bad} NaN or infinite value{'s' * (bad > 1)}")


def load_model(folder: str | Path, heads: bool = True, quiet: bool = False):
    """A model folder -> BertForPreTraining (heads=True) or BertModel, in eval mode.

    Missing MLM/NSP heads (a plain HF BertModel folder) are initialised, the decoder tied to
    the word embeddings, and reported in one line on stderr.
    Returns (model, extra_tensors): HF tensors the BERT body and heads did not use, for task heads.
    """
    folder = Path(folder)
    cfg = load_config(folder)
    raw = _read_weights(folder)
    source = weights_path(folder)  # what errors name: the file, or the shards' index
    file_names = {norm: name for name, norm in _normalised_names(raw).items()}
    hf = {norm: raw[name] for norm, name in file_names.items()}
    with weights_not_drawn():  # each one is loaded or initialised below (checked after loading)
        model = BertForPreTraining(cfg) if heads else BertModel(cfg)
    target = model.state_dict()
    wanted = name_map(cfg, heads=True)
    # each head is read if the file has all of it (a BertForMaskedLM file has no NSP head) and
    # initialised otherwise; so is the pooler, which HF's MLM and token-level models leave out
    absent = {part for part in ("mlm.", "nsp.", "bert.pooler.")
              if not all(t in hf for ours, theirs in wanted.items() if ours.startswith(part) for t in theirs)}
    used: set[str] = set(HF_DERIVED)
    state = {}
    for ours, theirs in wanted.items():
        if (ours.startswith(("mlm.", "nsp.")) and not heads) or ours.startswith(tuple(absent)):
            continue
        missing = [t for t in theirs if t not in hf]
        if missing:
            name = missing[0] if any(k.startswith("bert.") for k in raw) else missing[0].removeprefix("bert.")
            raise BertkitError(f"{source}: tensor {name!r} is missing "
                               f"(config.json describes {cfg.num_hidden_layers} layers)")
        key = ours if heads else ours.removeprefix("bert.")
        expected = target[key].shape
        expected = torch.Size((expected[0] // len(theirs), *expected[1:]))  # one part of a fused tensor
        for t in theirs:
            if hf[t].shape != expected:
                raise BertkitError(
                    f"{source}: tensor {file_names[t]!r} has shape {tuple(hf[t].shape)} but "
                    f"config.json implies {tuple(expected)}")
        for t in theirs:
            _check_values(hf[t], file_names[t], source)
        tensor = torch.cat([hf[t] for t in theirs]) if len(theirs) > 1 else hf[theirs[0]]
        state[key] = tensor.to(target[key].dtype)
        used.update(theirs)
    new = []
    if heads and "mlm." in absent:
        init_weights(model.mlm, cfg)
        torch.nn.init.zeros_(model.mlm.bias)
        new.append("the MLM head (cls.predictions.*), its decoder tied to the word embeddings")
    if heads and "nsp." in absent:
        init_weights(model.nsp, cfg)
        new.append("the NSP head (cls.seq_relationship.*)")
    if "bert.pooler." in absent:
        init_weights((model.bert if heads else model).pooler, cfg)
        new.append("the pooler (pooler.dense.*)")
    if new and not quiet:
        print(f"bertkit: {folder} has no {' and no '.join(n.split(' (')[0].removeprefix('the ') for n in new)}; "
              f"initialised {'; '.join(new)}", file=sys.stderr)
    decoder = hf.get("cls.predictions.decoder.weight")
    if heads and "mlm." not in absent and decoder is not None and not torch.equal(
            decoder.to(state["bert.embeddings.word.weight"].dtype), state["bert.embeddings.word.weight"]):
        raise BertkitError(f"{source}: its MLM decoder (cls.predictions.decoder.weight) is not the word "
                           "embeddings; bertkit ties the two, as BERT does, so its logits would differ")
    stray = sorted((k for k in hf if k not in used and k.startswith("bert.encoder.layer.")),
                   key=lambda k: int(k.split(".")[3]) if k.split(".")[3].isdigit() else 0)
    if stray:  # a config.json with fewer layers than the file: the rest would be dropped unseen
        raise BertkitError(f"{source}: holds tensor {file_names[stray[-1]]!r}, but config.json describes "
                           f"{cfg.num_hidden_layers} layers (num_hidden_layers); its layers would go unused")
    # strict=False only because the tied decoder weight and skipped heads are not in `state`
    missing = model.load_state_dict(state, strict=False).missing_keys
    initialised = tuple(part if heads else part.removeprefix("bert.") for part in absent)
    unset = [k for k in missing if k != "mlm.decoder_weight" and not k.startswith(initialised)]
    if unset:  # built undrawn, such a tensor would hold whatever memory held
        raise BertkitError(f"{source}: internal error, tensors not loaded: {', '.join(unset)}")
    extra = {file_names[k]: v for k, v in hf.items() if k not in used}
    for name, tensor in extra.items():  # a task head's (index buffers such as *_ids aside)
        if tensor.is_floating_point() or not name.endswith("_ids"):
            _check_values(tensor, name, source)
    model.eval()
    return model, extra


# ---- saving ---------------------------------------------------------------------------------
def save_model(model, folder: str | Path, tokenizer=None, bertkit_info: dict | None = None,
               extra_tensors: dict[str, torch.Tensor] | None = None, architecture: str | None = None,
               config_extra: dict | None = None) -> Path:
    """Write a model folder (HF layout). Each file is written to a temporary name then renamed,
    so a crash never leaves a half-written model behind.

    extra_tensors are a task head's (e.g. classifier.weight); with them the encoder is saved under
    HF's "bert." prefix, as transformers' task models (BertForSequenceClassification ...) expect."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    heads = isinstance(model, BertForPreTraining)
    cfg: BertConfig = model.config
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    hf = to_hf(state, cfg, heads)
    if extra_tensors:
        if not heads:
            hf = {"bert." + k: v for k, v in hf.items()}
        hf.update({k: v.detach().cpu().contiguous() for k, v in extra_tensors.items()})
    arch = architecture or ("BertForPreTraining" if heads else "BertModel")
    config = {**cfg.to_dict(arch), **(config_extra or {})}
    atomic_write(folder / WEIGHTS, lambda p: save_file(hf, p, metadata={"format": "pt"}))
    atomic_write(folder / "config.json", lambda p: Path(p).write_text(json.dumps(config, indent=2) + "\n"))
    if tokenizer is not None:
        tokenizer.save(folder, model_max_length=cfg.max_position_embeddings)
    if bertkit_info is not None:
        atomic_write(folder / "bertkit.json",
                     lambda p: Path(p).write_text(json.dumps(bertkit_info, indent=2) + "\n"))
    for name in SENTENCE_TRANSFORMERS_FILES:  # an earlier model's (saved over with --overwrite): its pooling,
        (folder / name).unlink(missing_ok=True)  # normalising and length would be read as this model's
    return folder


def pretraining_origin(folder: str | Path) -> str | None:
    """The preset (random weights) that the bertkit pretraining run in `folder` started from,
    through any runs it continued; None for any other folder (a published checkpoint, a run that
    started from one, a fine-tuned model). Runs from before this was recorded started from "tiny"
    as most runs do."""
    from .config import PRESETS
    try:
        info = json.loads((Path(folder) / "bertkit.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("task") != "pretraining":
        return None
    origin = info.get("pretrained_from", "tiny")
    return origin if origin in PRESETS else None


# what makes a folder a sentence-transformers one; bertkit keeps a saved model's pooling in bertkit.json
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def keep_sentence_transformers(source: str | Path, folder: str | Path) -> bool:
    """A model trained on from a sentence-transformers folder stays one, of the same width: the
    source's sentence-transformers files and its modules' folders (a Pooling's config) copied
    into the new folder, so that it is pooled and normalised as the source was. A module path
    that is not a plain folder name in the source is not followed. Returns whether it copied."""
    source, folder = Path(source), Path(folder)
    if not folder_modules(source):
        return False
    for name in SENTENCE_TRANSFORMERS_FILES:
        if (source / name).is_file():
            copy_into(source / name, folder / name)
    for module in folder_modules(source):
        path = module.get("path")
        if isinstance(path, str) and path == Path(path).name and path not in ("", ".", "..") \
                and (source / path).is_dir():
            copy_into(source / path, folder / path)
    return True
