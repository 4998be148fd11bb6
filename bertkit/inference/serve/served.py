"""The model folder behind the server: what it can do and the model calls each endpoint makes."""
from __future__ import annotations

import copy
from pathlib import Path


class Served:
    """What the folder can do: encode always; fill-mask with a trained MLM head; predict with a
    fine-tuned task (bertkit.json); attention with the torch backend's weights."""

    def __init__(self, folder: str | Path, backend: str = "torch"):
        from ...folders import has_trained_mlm_head, load_model
        from ...tokenizer import load_tokenizer
        from ..encode import Encoder, folder_max_len, folder_normalize, folder_pooling, warn_unsupported

        self.folder = Path(folder)
        self.name = self.folder.resolve().name
        warn_unsupported(self.folder)
        self.task = self.task_model = self.mlm_model = None
        from ...tasks.folder import fine_tuned_task
        from ..export import open_task_folder
        if fine_tuned_task(self.folder):  # on torch first: /attention keeps its weights when the rest runs on ONNX
            self.task, self.task_model, self.tokenizer = open_task_folder(self.folder, device="cpu")
            from ...tasks.folder import task_max_len
            self.max_len = task_max_len(self.task, self.task_model, None)  # what /predict reads of a text
            body = self.task_model.bert
        else:
            self.tokenizer = load_tokenizer(self.folder)
            model, _ = load_model(self.folder, heads=True, quiet=True)
            self.mlm_model = model.eval() if has_trained_mlm_head(self.folder) else None
            body = model.bert
        self.body = body.eval()
        self.config = body.config
        self.backend = backend
        if backend != "torch":  # the encoder and a task head on ONNX Runtime; /attention reads the torch weights
            from ..export import onnx_task_model
            from ..onnx_runtime import OnnxEncoder
            int8 = backend == "onnx-int8"
            if self.task_model is not None:
                onnx_task_model(self.folder, self.task_model, int8)
                encoder_body = self.task_model.bert.runtime
            else:
                encoder_body = OnnxEncoder.from_folder(self.folder, int8)
        else:
            encoder_body = body
        self.encoder = Encoder(encoder_body, self.tokenizer, folder_pooling(self.folder) or "cls", device="cpu",
                               normalize=folder_normalize(self.folder), max_len=folder_max_len(self.folder))
        # a second tokenizer for counting tokens on the event loop: the first one is reconfigured
        # (truncation) by the calls on the model thread
        from tokenizers import Tokenizer
        self.counter = Tokenizer.from_str(self.tokenizer.tok.to_str())
        self.counter.no_truncation()
        self.counter.no_padding()
        post = self.counter.post_processor  # [CLS] A [SEP] and [CLS] A [SEP] B [SEP] for BERT
        self.specials = {q: post.num_special_tokens_to_add(q) if post is not None else 0 for q in (False, True)}

    def count(self, texts: list[str], pairs: list[str] | None = None) -> tuple[list[int], list[int], list[int]]:
        """Tokens per text (or pair), specials included, never truncated; and which texts and
        which pairs hold no token at all (a zero-width space, control characters: what
        str.strip() keeps and the tokenizer drops)."""
        a = [len(e.ids) for e in self.counter.encode_batch(texts, add_special_tokens=False)]
        b = ([len(e.ids) for e in self.counter.encode_batch([p or "" for p in pairs], add_special_tokens=False)]
             if pairs is not None else [0] * len(texts))
        paired = [pairs is not None and p is not None for p in (pairs or [None] * len(texts))]
        counts = [n + m + self.specials[q] for n, m, q in zip(a, b, paired)]
        return (counts, [i for i, n in enumerate(a) if not n],
                [i for i, (m, q) in enumerate(zip(b, paired)) if q and not m])

    def info(self) -> dict:
        cfg = self.config
        return {"model": self.name, "backend": self.backend, "task": self.task.name if self.task else None,
                "labels": self.task.info.get("labels") if self.task else None,
                "hidden_size": cfg.hidden_size, "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
                "vocab_size": cfg.vocab_size, "max_positions": cfg.max_position_embeddings,
                "pooling": self.encoder.default_pooling, "fill_mask": self.mlm_model is not None,
                "attention": True}

    # each runs on the model thread, over the texts of one or more requests that share the key
    def run_encode(self, key: tuple, items: list) -> list:
        pooling, normalize, paired = key
        texts = [t for t, _ in items]
        pairs = [p for _, p in items] if paired else None
        return list(self.encoder.encode(texts, pairs, pooling=pooling, normalize=normalize, truncation=False))

    def run_fill_mask(self, key: tuple, items: list) -> list:
        from ..fill_mask import fill_mask
        return fill_mask(self.mlm_model, self.tokenizer, items, top_k=key[0])

    def run_predict(self, key: tuple, items: list) -> list:
        from ...tasks.runner import run_task
        feats = self.task.features(items, self.tokenizer, self.max_len)
        task = self.task
        if key:  # the word task's top_k: a copy, the served task stays as it is (calls run one at a time)
            task = copy.copy(self.task)
            task.top_k = key[0]
        preds, _ = run_task(task, self.task_model, feats, items, self.tokenizer)
        return [task.describe(p, ex) for p, ex in zip(preds, items)]

    def run_attention(self, key: tuple, items: list) -> list:
        from ..attention import attention_maps
        results = []
        for text, pair in items:
            batch = self.tokenizer.encode([text], [pair] if pair is not None else None,
                                          max_len=self.config.max_position_embeddings, truncation=False)
            maps, _ = attention_maps(self.body, **batch.model_inputs("cpu"))       # (L, 1, nh, T, T)
            results.append({"tokens": batch.tokens[0], "sequence_ids": batch.sequence_ids[0],
                            "attention": maps[:, 0].numpy().round(4).tolist()})
        return results
