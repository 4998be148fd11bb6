"""Helpers the tests import (conftest.py holds the fixtures): real sentences, tiny configs and
model folders."""
import torch

# Real sentences of different lengths: a padded batch exercises the attention mask.
SENTENCES = [
    "A crane is flying over the lake.",
    "The crane driver came late to the construction site, and nobody noticed until noon.",
    "Hi.",
    "BERT reads the whole sentence at once, so every word sees its left and right context.",
    "Paris is the capital of France.",
]


def hf_tester_config(**overrides):
    """HF's tester shape: vocab 99, hidden 32, 2 layers, 4 heads; milliseconds per forward."""
    from bertkit import BertConfig
    return BertConfig(**{**dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=37, max_position_embeddings=64), **overrides})


def save_tiny_bert(folder, minilm_folder, **overrides):
    """A 2-layer, 32-wide random BERT with MiniLM's real uncased vocabulary, saved as a model
    folder: seconds to fine-tune or encode with."""
    from bertkit import BertModel, save_model
    from bertkit.model import init_weights
    from bertkit.tokenizer import WordPieceTokenizer
    cfg = hf_tester_config(**{"vocab_size": 30522, "max_position_embeddings": 512, **overrides})
    torch.manual_seed(0)
    model = BertModel(cfg)
    init_weights(model, cfg)
    save_model(model, folder, tokenizer=WordPieceTokenizer.from_folder(minilm_folder))
    return folder


def sentence_transformers_copy(folder, out):
    """A copy of a model folder that declares mean pooling as a sentence-transformers folder
    does (modules.json and 1_Pooling/config.json)."""
    import json
    import shutil
    shutil.copytree(folder, out)
    (out / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                   "type": "sentence_transformers.models.Pooling"}]))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a server or a rendezvous to start there)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, nodes: int | None = None, rdzv_id: str = "bertkit-test") -> list[str]:
    """The torchrun launcher: one node (--standalone), or one of `nodes` launches meeting through
    the c10d rendezvous on a fresh port of 127.0.0.1. The program and its arguments follow."""
    import sys
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    if nodes is None:
        return cmd + ["--standalone"]
    return cmd + ["--nnodes", str(nodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
                  "--rdzv_id", rdzv_id]


class Stop(Exception):
    """Raised by stop_at's callback: a run stopped as by a crash, after a step."""


def stop_at(n):
    """An on_step callback that stops a run right after step n (and its checkpoint, if any)."""
    def stop(step, model):
        if step == n:
            raise Stop
    return stop
