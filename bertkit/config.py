"""BertConfig: one dataclass for the architecture, with named presets and HF config.json I/O.

Field names are HF's own, so config.json round-trips without a translation table.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import BertkitError

# hidden_act spellings that all mean the erf GELU of the original BERT
_GELU_NAMES = {"gelu", "gelu_python"}
# a text pair given to a model of one segment type (its embedding has no row for segment 1)
ONE_SEGMENT_TYPE = ("a text pair needs segment ids 0 and 1, but this model has one segment type "
                    "(config.json type_vocab_size 1); give single texts")


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class BertConfig:
    vocab_size: int = 30522            # BERT's uncased WordPiece vocabulary
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072      # feed-forward width, 4 x hidden in every published BERT
    hidden_act: str = "gelu"           # erf GELU; the only activation published BERTs use
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2           # segments A and B
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BertkitError(f"config field {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise BertkitError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in _GELU_NAMES:  # a list: unhashable
            raise BertkitError(f"hidden_act {self.hidden_act!r} is not supported (only the erf 'gelu')")
        # values that build a model without complaint and then compute NaN (a LayerNorm eps <= 0)
        # or nonsense (a dropout of 1 zeroes everything; a negative pad id counts from the end)
        if not _is_real(self.layer_norm_eps) or not 0 < self.layer_norm_eps < math.inf:
            raise BertkitError(f"config field layer_norm_eps must be a positive finite number, got {self.layer_norm_eps!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not _is_real(value) or not 0 <= value < 1:
                raise BertkitError(f"config field {name} must be a probability in [0, 1), got {value!r}")
        if not _is_real(self.initializer_range) or not 0 <= self.initializer_range < math.inf:
            raise BertkitError(f"config field initializer_range must be a finite number >= 0, "
                               f"got {self.initializer_range!r}")
        if (not isinstance(self.pad_token_id, int) or isinstance(self.pad_token_id, bool)
                or not 0 <= self.pad_token_id < self.vocab_size):
            raise BertkitError(f"config field pad_token_id must be an integer in [0, vocab_size "
                               f"{self.vocab_size}), got {self.pad_token_id!r}")
        # last: a size of 10^6 to 10^9 would otherwise be found by a failed allocation, after
        # tens of seconds and gigabytes; refused here, before any tensor exists
        self.check_fits_in_memory()

    def parameter_count(self, heads: bool = True) -> int:
        """Parameters of BertForPreTraining (heads=True; the MLM decoder is tied to the word
        embeddings, so only its bias counts) or of BertModel (heads=False), from the sizes alone."""
        V, H, I = self.vocab_size, self.hidden_size, self.intermediate_size
        embeddings = (V + self.max_position_embeddings + self.type_vocab_size) * H + 2 * H  # + LayerNorm
        layer = (3 * H * H + 3 * H      # fused query/key/value
                 + H * H + H            # attention output
                 + 2 * H                # LayerNorm
                 + H * I + I            # feed-forward in
                 + I * H + H            # feed-forward out
                 + 2 * H)               # LayerNorm
        pooler = H * H + H
        count = embeddings + self.num_hidden_layers * layer + pooler
        if heads:
            count += (H * H + H) + 2 * H + V   # MLM transform, its LayerNorm, decoder bias
            count += 2 * H + 2                 # NSP classifier
        return count

    def check_fits_in_memory(self, bytes_per_parameter: int = 4) -> None:
        """Refuse sizes whose fp32 parameters alone exceed this machine's memory."""
        count = self.parameter_count()
        need = count * bytes_per_parameter
        have = memory_bytes()
        if have is None or need <= have:
            return
        sizes = ", ".join(f"{name} {getattr(self, name)}" for name in (
            "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "max_position_embeddings",
            "type_vocab_size"))
        raise BertkitError(f"config ({sizes}): {count:.1e} parameters need {_gb(need)} GB in fp32; "
                           f"this machine has {_gb(have)} GB")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def preset(cls, name: str, **overrides) -> "BertConfig":
        if name not in PRESETS:
            raise BertkitError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    # ---- HF config.json ----
    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> "BertConfig":
        model_type = d.get("model_type", "bert")
        if model_type != "bert":
            raise BertkitError(f"{source}: model_type is {model_type!r}, bertkit reads BERT ('bert') only")
        pos = d.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise BertkitError(f"{source}: position_embedding_type {pos!r} is not supported (only 'absolute')")
        # a decoder's self-attention is causal in transformers (each token sees only those before
        # it): read as BERT's bidirectional encoder, every vector would differ without a word
        for key in ("is_decoder", "add_cross_attention"):
            if d.get(key):
                raise BertkitError(f"{source}: {key} is {d[key]!r}; bertkit runs BERT as an encoder only "
                                   "(bidirectional self-attention, no cross-attention)")
        fields = {f.name for f in dataclasses.fields(cls)}
        # pad_token_id null: transformers builds the embeddings without a padding row; the weights and
        # outputs are the same with the default (0), which only zeroes that row at initialisation
        kwargs = {k: v for k, v in d.items() if k in fields and not (k == "pad_token_id" and v is None)}
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
                   if k not in kwargs]
        if missing:
            raise BertkitError(f"{source}: missing required key(s) {', '.join(missing)}")
        try:
            return cls(**kwargs)
        except BertkitError as e:
            raise BertkitError(f"{source}: {e}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BertkitError(f"{path}: no such file") from None
        except OSError as e:  # unreadable, a folder
            raise BertkitError(f"{path}: cannot read the file ({e.strerror or e})") from None
        except (ValueError, RecursionError) as e:  # bad syntax or bytes, a 5,000-digit integer, deep nesting
            raise BertkitError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise BertkitError(f"{path}: expected a JSON object")
        return cls.from_dict(d, source=str(path))

    def to_dict(self, architecture: str = "BertModel") -> dict:
        d = dataclasses.asdict(self)
        d.update(model_type="bert", architectures=[architecture],
                 position_embedding_type="absolute", tie_word_embeddings=True)
        return d


def _gb(n: int) -> str:
    gb = n / 1e9
    return f"{gb:,.0f}" if gb >= 10 else f"{gb:.2g}"


def memory_bytes() -> int | None:
    """This machine's memory: physical RAM, or a smaller container (cgroup) limit; None if unknown."""
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(limit).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and 0 < int(value) < 1 << 60:  # "max" or a huge number: no limit
            sizes.append(int(value))
    sizes = [n for n in sizes if n > 0]
    return min(sizes) if sizes else None


def load_config(folder: str | Path) -> BertConfig:
    folder = Path(folder)
    if not folder.is_dir():
        raise BertkitError(f"{folder}: not a folder, expected a model folder" if folder.exists()
                           else f"{folder}: not a model folder (no such directory)")
    if not (folder / "config.json").is_file():
        raise BertkitError(f"{folder}: no config.json in this folder")
    return BertConfig.from_json(folder / "config.json")


def check_max_len(max_len: int, cfg, option: str = "--max-len") -> int:
    """A sequence length the model can take: at least 3 ([CLS], a token, [SEP]; below that the
    tokenizer drops truncation and a tagger read whole sentences), at most its position embeddings."""
    limit = cfg.max_position_embeddings
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 3:
        raise BertkitError(f"{option} must be an integer of at least 3 ([CLS], a token and [SEP]), got {max_len!r}")
    if max_len > limit:
        raise BertkitError(f"{option} {max_len} exceeds the model's limit of {limit} positions "
                           f"(config.json max_position_embeddings); use at most {limit}")
    return max_len


# Google's BERT miniatures (Turc et al. 2019) name tiny/mini/small; base and large are the paper's.
PRESETS: dict[str, dict] = {
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=256),
    "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
    "small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, intermediate_size=2048),
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    "large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
}
