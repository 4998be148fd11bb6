"""Sentence vectors from token vectors (pool), and what a sentence-transformers folder declares
about them: its pooling, whether it normalizes, the tokens it reads per text, and the steps of
its pipeline bertkit does not run. Read by encode, the server and the classify task alike."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from .errors import BertkitError

POOLINGS = ("cls", "mean", "pooler")


def folder_modules(folder: Path) -> list:
    """A sentence-transformers folder's modules.json (its pipeline after the encoder), or []."""
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []


def folder_normalize(folder: str | Path) -> bool:
    """Whether a sentence-transformers folder ends with a Normalize module (unit-length vectors)."""
    return any(str(m.get("type", "")).endswith("models.Normalize") for m in folder_modules(Path(folder)))


def folder_max_len(folder: str | Path) -> int | None:
    """The max_seq_length of a sentence-transformers folder (sentence_bert_config.json): the
    tokens it reads per text, fewer than the model's positions (MiniLM: 256 of 512); else the
    model_max_length of tokenizer_config.json, where transformers' tokenizer truncates."""
    path = Path(folder) / "sentence_bert_config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))["max_seq_length"]
    except (OSError, ValueError, KeyError, TypeError):
        return _tokenizer_max_len(Path(folder))
    return _checked_length(value, path, "max_seq_length")  # -3 was ignored: 512 tokens read unsaid


def _checked_length(value, path: Path, key: str) -> int | None:
    """A folder's declared tokens per text: None where it declares none, else at least 3."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 3:
        raise BertkitError(f"{path}: {key} must be an integer of at least 3 ([CLS], a token, [SEP]), "
                           f"got {json.dumps(value)}")
    return value


def _tokenizer_max_len(folder: Path) -> int | None:
    """tokenizer_config.json's model_max_length; None where it is missing or transformers' "no
    limit" (a huge sentinel, 1e30); a value that is no length is named."""
    path = folder / "tokenizer_config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("model_max_length")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1e9:
        return None
    return _checked_length(value, path, "model_max_length")


def _pooling_config(folder: Path) -> dict | None:
    """A sentence-transformers folder's Pooling config (modules.json -> its path/config.json)."""
    try:
        pooling = next(m for m in folder_modules(folder) if m.get("type", "").endswith("models.Pooling"))
        cfg = json.loads((folder / pooling["path"] / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
        return None
    return cfg if isinstance(cfg, dict) else None


def folder_pooling(folder: str | Path) -> str | None:
    """The pooling a sentence-transformers folder declares (modules.json -> Pooling config)."""
    cfg = _pooling_config(Path(folder))
    if cfg is None:
        return None
    if cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    return None


# the steps of a sentence-transformers pipeline that encode runs (Dropout does nothing at inference)
ST_STEPS = ("models.Transformer", "models.Pooling", "models.Normalize", "models.Dropout")


def unsupported_pooling(folder: str | Path) -> str | None:
    """The pooling modes a sentence-transformers folder declares ("max_tokens", "cls_token +
    mean_tokens") where they are other than one of cls and mean, which bertkit runs; else None."""
    cfg = _pooling_config(Path(folder)) or {}
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in cfg.items() if k.startswith("pooling_mode_") and v)
    return " + ".join(modes) if modes and modes not in (["cls_token"], ["mean_tokens"]) else None


def folder_unsupported(folder: str | Path, modules: bool = True, pooling: bool = True) -> list[str]:
    """What a sentence-transformers folder asks of its pipeline that encode does not do: a Dense
    or other module after pooling (LaBSE's Dense + tanh), a pooling other than one of cls and
    mean, lower-casing the text. Its vectors would differ from sentence-transformers' ones.
    modules, pooling: False leaves those out (a classifier trains its own head on a pooling it
    may be told)."""
    folder = Path(folder)
    found = [f"its {str(m.get('type')).rsplit('.', 1)[-1]} module ({m.get('path')})"
             for m in folder_modules(folder) if modules and not str(m.get("type", "")).endswith(ST_STEPS)]
    if pooling and (modes := unsupported_pooling(folder)):
        found.append(f"its pooling ({modes})")
    try:
        lower = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8")).get("do_lower_case")
    except (OSError, ValueError, AttributeError):
        lower = False
    if lower is True:
        found.append("its do_lower_case (sentence_bert_config.json)")
    return found


def warn_unsupported(folder: str | Path, runs: str = "encodes",
                     outcome: str = "its vectors differ from sentence-transformers' ones", **which: bool) -> None:
    """A warning where folder_unsupported finds something (which: its modules and pooling
    flags): the vectors are not silently other than the ones the folder's model card promises.
    runs and outcome: what bertkit does without them, and what follows."""
    found = folder_unsupported(folder, **which)
    if found:
        warnings.warn(f"{folder}: bertkit {runs} without {', '.join(found)}, which its sentence-transformers "
                      f"pipeline declares: {outcome}", stacklevel=3)


def pool(sequence_output, pooled_output, attention_mask, pooling: str):
    """Sentence vectors (B, H) from torch tensors or numpy arrays alike."""
    if pooling == "cls":
        return sequence_output[:, 0]                               # (B, H)
    if pooling == "pooler":
        return pooled_output                                       # (B, H)
    if pooling == "mean":  # masked mean over all tokens, specials included (sentence-transformers)
        m = attention_mask[..., None] != 0                         # (B, T, 1)
        return (sequence_output * m).sum(1) / m.sum(1).clip(min=1)
    raise BertkitError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
