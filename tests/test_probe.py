"""The downstream check at the end of a pretraining run: a linear probe on rotten-tomatoes."""
import numpy as np
import pytest

from bertkit.pretraining.probe import PROBE_TRAIN, linear_probe, logistic_regression_accuracy, probe_data


def test_logistic_regression_predicts_as_scikit_learn_does():
    from sklearn.linear_model import LogisticRegression
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 20)).astype(np.float32)
    y = (x[:, :3].sum(1) + rng.normal(scale=1.5, size=600) > 0).astype(np.int64)
    x_train, y_train, x_test, y_test = x[:400], y[:400], x[400:], y[400:]
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    ours = logistic_regression_accuracy(x_train, y_train, x_test, y_test)
    clf = LogisticRegression(C=1.0, tol=1e-10, max_iter=5000).fit((x_train - mean) / std, y_train)
    assert ours == pytest.approx(clf.score((x_test - mean) / std, y_test), abs=1 / 200)
    assert ours > 0.7  # the signal is there to find


def test_probe_data_is_the_fixed_split_and_the_probe_scores_both_models(tiny_bert):
    from bertkit.folders import load_model
    from bertkit.tokenizer import WordPieceTokenizer
    data = probe_data()
    assert len(data["train"][0]) == PROBE_TRAIN and len(data["dev"][0]) == 1275
    assert set(np.unique(data["train"][1])) == {0, 1}
    model, _ = load_model(tiny_bert, heads=False)
    result = linear_probe(model, WordPieceTokenizer.from_folder(tiny_bert))
    assert 0.5 < result["majority_accuracy"] < 0.6
    # tiny_bert is itself random: both read bags of MiniLM's word pieces through random weights
    for key in ("accuracy", "random_weights_accuracy"):
        assert result["majority_accuracy"] - 0.05 < result[key] < 0.8
