"""Next-sentence pairs: true pairs really follow each other, random partners come from elsewhere."""
import numpy as np
import pytest

from bertkit import WordPieceTokenizer
from bertkit.pretraining.batches import Position, PretrainingBatches
from bertkit.pretraining.corpus import iter_documents
from bertkit.pretraining.masking import MaskingConfig
from bertkit.pretraining.nsp import make_instances
from bertkit.pretraining.shards import tokenize_corpus


@pytest.fixture(scope="module")
def stores(tmp_path_factory, wiki_excerpt, minilm_folder):
    tok = WordPieceTokenizer.from_folder(minilm_folder)
    folder = tmp_path_factory.mktemp("shards") / "shards"
    # small shards, so that pairs and batches must cross shard boundaries
    train, held = tokenize_corpus(iter_documents(wiki_excerpt, per_line=True), tok, folder, holdout_every=6,
                                  shard_tokens=4000)
    return tok, train, held


def test_shards_hold_every_document_once(stores, wiki_excerpt):
    tok, train, held = stores
    assert len(train) > 3
    assert train.meta["documents"] + held.meta["documents"] == 12
    assert held.meta["documents"] == 2  # documents 3 and 9
    first = train.shard(0)
    assert isinstance(first.tokens, np.memmap)  # streamed from disk, not loaded
    docs = list(iter_documents(wiki_excerpt, per_line=True))
    sent = docs[0][0]
    ids = first.tokens[first.sentences[0]:first.sentences[1]]
    assert ids.tolist() == tok.tokenize_ids(sent)


@pytest.mark.parametrize("max_len", [16, 64, 128])
def test_pairs_are_consecutive_or_from_another_document(stores, max_len):
    _, train, _ = stores
    for s in range(len(train)):
        shard = train.shard(s)
        inst = make_instances(shard, max_len, np.random.default_rng(s))
        assert len(inst) > 0
        nxt = inst.is_random == 0
        # IsNext: B starts at the sentence where A ends, inside the same document
        assert (inst.b_sentences[nxt, 0] == inst.a_sentences[nxt, 1]).all()
        assert (inst.a_doc[nxt] == inst.b_doc[nxt]).all()
        doc_of = np.searchsorted(shard.documents, inst.b_sentences[nxt, 1] - 1, side="right") - 1
        assert (doc_of == inst.a_doc[nxt]).all()
        # NotNext: never the same document
        assert (inst.a_doc[~nxt] != inst.b_doc[~nxt]).all()
        b_doc = np.searchsorted(shard.documents, inst.b_sentences[~nxt, 0], side="right") - 1
        assert (b_doc == inst.b_doc[~nxt]).all()
        # both sides non-empty, and the pair fits with its three special tokens
        la, lb = inst.a_end - inst.a_start, inst.b_end - inst.b_start
        assert (la >= 1).all() and (lb >= 1).all() and (la + lb <= max_len - 3).all()
        # trimming only removes tokens from the ends of the untrimmed spans
        s_ = shard.sentences
        assert (inst.a_start >= s_[inst.a_sentences[:, 0]]).all() and (inst.a_end <= s_[inst.a_sentences[:, 1]]).all()
        assert (inst.b_start >= s_[inst.b_sentences[:, 0]]).all() and (inst.b_end <= s_[inst.b_sentences[:, 1]]).all()


def test_about_half_of_the_pairs_are_random(stores):
    _, train, _ = stores
    random_share = np.concatenate([make_instances(train.shard(s), 64, np.random.default_rng(s)).is_random
                                   for s in range(len(train))]).mean()
    assert 0.4 < random_share < 0.65  # single-sentence chunks are always random, as in BERT


def test_batches_have_bert_layout_and_a_reproducible_order(stores):
    tok, train, _ = stores
    pb = PretrainingBatches(train, tok, 64, 32, MaskingConfig(), seed=7)
    it = pb.iterate()
    batches = [next(it) for _ in range(5)]
    for _, b in batches:
        ids, types, mask = b["input_ids"], b["token_type_ids"], b["attention_mask"]
        assert ids.shape[0] == 32 and ids.shape[1] <= 64
        assert (ids[:, 0] == tok.cls_id).all()
        lengths = mask.sum(1)
        assert (ids[np.arange(32), lengths - 1] == tok.sep_id).all()
        assert ((ids == tok.sep_id).sum(1) >= 2).all()  # a [SEP] in the text itself is masked out below
        assert (types[mask == 0] == 0).all() and (types[np.arange(32), lengths - 1] == 1).all()
        assert set(b["nsp_labels"].tolist()) <= {0, 1}
    # resuming at a position rebuilds exactly the same batches
    again = pb.iterate(Position(batches[2][0].epoch, batches[2][0].batch))
    pos, b = next(again)
    assert pos == batches[3][0]
    for k in b:
        assert np.array_equal(b[k].numpy(), batches[3][1][k].numpy()), k
    # a new epoch has new masks and a new order
    n = sum(1 for _ in pb._epoch_batches(0))
    (_, b0), (p1, b1) = next(pb.iterate(Position(0, 0))), next(pb.iterate(Position(1, 0)))
    assert p1.epoch == 1 and not np.array_equal(b0["input_ids"].numpy()[:, :10], b1["input_ids"].numpy()[:, :10])
    assert n > 5


def test_batches_mix_shards_and_an_epoch_holds_every_pair_once(stores):
    """A corpus's shards follow its files: a batch must draw from many of them, and the mixing
    must neither drop nor repeat a sentence pair."""
    tok, train, _ = stores
    assert len(train) >= 4
    pb = PretrainingBatches(train, tok, 64, 16, MaskingConfig(), seed=3, drop_last=False)
    seen = []
    shards_per_batch = []
    for group in pb._epoch_batches(0):
        shards_per_batch.append(len({s for s, _ in group}))
        for s, inst in group:
            seen += [(s, int(a), int(b)) for a, b in zip(inst.a_start, inst.b_start)]
    every = [(s, int(a), int(b)) for s in range(len(train))
             for a, b in zip(pb._shard_instances(0, s).a_start, pb._shard_instances(0, s).b_start)]
    assert sorted(seen) == sorted(every) and len(set(seen)) == len(seen)  # each pair exactly once
    assert np.mean(shards_per_batch) >= 3  # shard by shard, almost every batch held one shard
