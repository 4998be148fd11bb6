"""The server's options and limits."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ...errors import BertkitError

# validation errors a 422 lists (the first one is its "error")
MAX_ERRORS_SHOWN = 10

# characters a request's texts may have for their tokens to be counted on the event loop itself
COUNT_ON_THE_LOOP = 50_000

# [MASK] tokens x top_k per /fill-mask request: each answer is a {"token", "score"} object in the
# reply (256 texts of 510 [MASK]s at top_k 100 would have been 13 M of them, about 650 MB)
MAX_FILL_MASK_ANSWERS = 100_000


@dataclass
class ServeConfig:
    model: str
    host: str = "127.0.0.1"            # loopback unless the user opens it up
    port: int = 8000
    backend: str = "torch"             # or "onnx": the encoder on ONNX Runtime (needs `bertkit export`)
    batching: bool = True
    batch_window_ms: float = 0.0       # extra wait for company; 0: join what arrived while the model was busy
    batch_tokens: int = 16384          # a batch closes early once this many tokens wait
    max_body_bytes: int = 1 << 20      # 1 MiB
    max_texts: int = 256               # texts per request
    # tokens per text, specials included (default: a sentence-transformers folder's max_seq_length,
    # else the model's positions)
    max_tokens: int | None = None
    max_attention_tokens: int = 128    # /attention returns L x heads x T x T weights: kept small
    max_top_k: int = 100
    max_queue: int = 64                # requests in the server at once; past it, 503 with Retry-After

    def check(self) -> None:
        for name in ("port", "batch_tokens", "max_body_bytes", "max_texts", "max_attention_tokens", "max_top_k",
                     "max_queue"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "port" else 1):
                raise BertkitError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise BertkitError(f"--max-tokens must be a positive integer, got {self.max_tokens!r}")
        if self.port > 65535:  # bind() would end in an OverflowError traceback
            raise BertkitError(f"--port must be between 0 and 65535, got {self.port}")
        if not 0 <= self.batch_window_ms <= 1000:
            raise BertkitError(f"--batch-window-ms must be between 0 and 1000, got {self.batch_window_ms}")
        if self.backend not in ("torch", "onnx", "onnx-int8"):
            raise BertkitError(f"--backend must be torch, onnx or onnx-int8, got {self.backend!r}")


@dataclass(frozen=True)
class Limits:
    """The limits requests are checked against: the options, with the model's positions applied."""
    cfg: ServeConfig
    tokens: int            # per text, specials included
    attention_tokens: int  # per /attention text (with its pair)
    attention_name: str    # what a refusal names as /attention's limit

    @classmethod
    def of(cls, cfg: ServeConfig, positions: int, folder_max_len: int | None) -> Limits:
        # default: the tokens a sentence-transformers folder reads per text (MiniLM: 256), else the positions
        tokens = cfg.max_tokens or min(folder_max_len or positions, positions)
        if tokens > positions:
            raise BertkitError(f"--max-tokens {tokens} exceeds the model's {positions} positions")
        # /attention runs the whole text at once: past the model's positions it cannot, whatever the
        # option says (the default 128 is over a small model's positions too), so the limit is the lower
        attention = min(cfg.max_attention_tokens, positions)
        name = ("--max-attention-tokens" if attention == cfg.max_attention_tokens else
                f"the model's {positions} positions; --max-attention-tokens {cfg.max_attention_tokens} is over them")
        return cls(cfg, tokens, attention, name)

    def info(self) -> dict:
        """The limits and batching options /info shows, with the limits in force."""
        shown = {k: v for k, v in asdict(self.cfg).items() if k.startswith(("max_", "batch"))}
        return {**shown, "max_tokens": self.tokens, "max_attention_tokens": self.attention_tokens}
