"""bertkit serve: every endpoint and every error through FastAPI's test client, parity with the
library and the CLI, dynamic batching, and one real uvicorn process."""
import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from helpers import SENTENCES, free_port

from bertkit.cli import main
from bertkit.inference.encode import Encoder

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from bertkit.inference.serve import ServeConfig, create_app  # noqa: E402
from bertkit.inference.serve.app import uvicorn_config  # noqa: E402


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tiny_bert_factory):
    """A tiny BERT with trained-looking MLM and NSP heads (cls.* tensors in the file)."""
    from bertkit.model import BertForPreTraining
    return tiny_bert_factory.folder(tmp_path_factory.mktemp("pretrained"), BertForPreTraining, seed=1)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_bert):
    folder = tmp_path_factory.mktemp("classify")
    train = folder / "train.csv"
    rows = [("a wonderful, moving film", "fresh"), ("dull and far too long", "rotten")] * 4
    train.write_text("text,label\n" + "".join(f'"{t}",{lab}\n' for t, lab in rows))
    assert main(["finetune", "classify", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
                 "--out", str(folder / "model"), "--epochs", "1", "--batch-size", "4"]) == 0
    return folder / "model"


@pytest.fixture(scope="module")
def pair_classifier(tmp_path_factory, tiny_bert):
    """A classifier fine-tuned on text pairs."""
    folder = tmp_path_factory.mktemp("classify_pairs")
    train = folder / "train.jsonl"
    rows = [{"text": "a wonderful film", "text_pair": "moving", "label": "fresh"},
            {"text": "dull", "text_pair": "far too long", "label": "rotten"}] * 4
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["finetune", "classify", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
                 "--out", str(folder / "model"), "--epochs", "1", "--batch-size", "4"]) == 0
    return folder / "model"


@pytest.fixture(scope="module")
def qa_model(tmp_path_factory, tiny_bert):
    from bertkit.data.squad_subset import squad_subset_file
    squad = json.loads(squad_subset_file().read_text(encoding="utf-8"))
    article = squad["data"][0]
    article["paragraphs"] = article["paragraphs"][:1]
    folder = tmp_path_factory.mktemp("qa")
    small = folder / "small.json"
    small.write_text(json.dumps({"version": "1.1", "data": [article]}))
    assert main(["finetune", "qa", "--model", str(tiny_bert), "--train", str(small), "--eval", str(small),
                 "--out", str(folder / "model"), "--epochs", "1", "--batch-size", "8", "--max-len", "128"]) == 0
    return folder / "model", article["paragraphs"][0]["context"]


def client(folder, **options):
    return TestClient(create_app(ServeConfig(model=str(folder), **options)), raise_server_exceptions=False)


def test_health_info_and_openapi(tiny_bert, pretrained):
    with client(tiny_bert) as c:
        assert c.get("/health").json() == {"status": "ok"}
        head = c.head("/health")
        assert head.status_code == 200 and head.content == b""
        info = c.get("/info").json()
        assert info["task"] is None and info["fill_mask"] is False and info["hidden_size"] == 32
        assert info["limits"]["max_tokens"] == 512 and info["limits"]["max_texts"] == 256
        paths = c.get("/openapi.json").json()["paths"]
        assert {"/encode", "/v1/embeddings", "/fill-mask", "/predict", "/attention", "/health", "/info",
                "/metrics"} <= set(paths)
        assert "attention" in c.get("/").text
        # the API docs load Swagger UI and ReDoc from this server, never from a CDN (machines offline)
        for page, script in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
            html = c.get(page).text
            urls = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)
            assert urls and all(u.startswith("/") for u in urls), urls
            src = next(u for u in urls if u.endswith(script))
            r = c.get(src)
            assert r.status_code == 200 and len(r.content) > 500_000
    with client(pretrained) as c:
        assert c.get("/info").json()["fill_mask"] is True


def test_encode_equals_the_library_and_the_cli(tiny_bert, tmp_path):
    enc = Encoder.from_folder(tiny_bert, device="cpu")
    with client(tiny_bert) as c:
        for pooling in ("cls", "mean", "pooler"):
            r = c.post("/encode", json={"texts": SENTENCES, "pooling": pooling})
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(np.array(r.json()["vectors"]), enc.encode(SENTENCES, pooling=pooling),
                                       atol=1e-6)
        r = c.post("/encode", json={"texts": SENTENCES[:2], "text_pairs": SENTENCES[2:4], "normalize": True})
        np.testing.assert_allclose(np.array(r.json()["vectors"]),
                                   enc.encode(SENTENCES[:2], SENTENCES[2:4], normalize=True), atol=1e-6)
        assert r.json()["tokens"] == sum(len(t) for t in enc.tokenizer.encode(SENTENCES[:2], SENTENCES[2:4]).tokens)
        # /v1/embeddings is `bertkit encode --normalize` with the folder's pooling
        txt = tmp_path / "in.txt"
        txt.write_text("\n".join(SENTENCES) + "\n")
        assert main(["encode", "--model", str(tiny_bert), "--input", str(txt), "--output", str(tmp_path / "v.npy"),
                     "--normalize"]) == 0
        cli = np.load(tmp_path / "v.npy")
        body = c.post("/v1/embeddings", json={"input": SENTENCES, "model": "anything"}).json()
        assert body["object"] == "list" and [d["index"] for d in body["data"]] == list(range(len(SENTENCES)))
        np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), cli, atol=1e-6)
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(SENTENCES)
        packed = c.post("/v1/embeddings", json={"input": SENTENCES[0], "encoding_format": "base64"}).json()
        vector = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
        np.testing.assert_allclose(vector, cli[0], atol=1e-6)


def test_fill_mask_predict_and_attention(pretrained, classifier, pair_classifier, qa_model, tiny_bert):
    from bertkit.folders import load_model
    from bertkit.inference.fill_mask import fill_mask
    from bertkit.tokenizer import load_tokenizer
    texts = ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK]."]
    model, _ = load_model(pretrained)
    expected = fill_mask(model, load_tokenizer(pretrained), texts, 3)
    with client(pretrained) as c:
        r = c.post("/fill-mask", json={"texts": texts, "top_k": 3})
        assert r.status_code == 200, r.text
        got = [x["masks"] for x in r.json()["results"]]
        assert [[[p["token"] for p in m] for m in t] for t in got] == [[[p["token"] for p in m] for m in t] for t in expected]
        assert len(got[1]) == 2
        r = c.post("/predict", json={"inputs": ["a film"]})
        assert r.status_code == 400 and "not fine-tuned" in r.json()["error"]
        a = c.post("/attention", json={"text": "The crane flew.", "text_pair": "It landed."}).json()
        T = len(a["tokens"])
        w = np.array(a["attention"])
        assert w.shape == (2, 4, T, T) and a["layers"] == 2 and a["heads"] == 4
        np.testing.assert_allclose(w.sum(-1), 1, atol=1e-3)
        assert a["tokens"][0] == "[CLS]" and a["sequence_ids"][-2] == 1
    with client(tiny_bert) as c:  # no cls.* weights: refuses rather than answer at random
        r = c.post("/fill-mask", json={"texts": texts})
        assert r.status_code == 400 and "no trained MLM head" in r.json()["error"]
    with client(classifier) as c:
        r = c.post("/predict", json={"inputs": ["a moving film", "dull and too long"]})
        assert r.status_code == 200, r.text
        preds = r.json()["predictions"]
        assert r.json()["task"] == "classify" and all(p["label"] in ("fresh", "rotten") for p in preds)
        r = c.post("/predict", json={"inputs": ["a film"], "top_k": 3})
        assert r.status_code == 422 and "top_k: words per input, an option of the word task" in r.json()["error"]
    with client(pair_classifier) as c:
        r = c.post("/predict", json={"inputs": [{"text": "dull", "text_pair": "too long"}]})
        assert r.status_code == 200, r.text
        assert r.json()["predictions"][0]["text_pair"] == "too long"
    captured = subprocess.run([sys.executable, "-m", "bertkit", "predict", "classify", "--model", str(classifier),
                               "a moving film"], capture_output=True, text=True, check=True).stdout
    assert json.loads(captured)["scores"] == pytest.approx(preds[0]["scores"], abs=1e-5)  # other batch, padding
    folder, context = qa_model
    with client(folder) as c:
        r = c.post("/predict", json={"inputs": [{"question": "What is it about?", "context": context}]})
        assert r.status_code == 200, r.text
        best = r.json()["predictions"][0]["nbest"][0]
        assert context[best["start_char"]:best["end_char"]] == r.json()["predictions"][0]["answer"]
        r = c.post("/predict", json={"inputs": ["a bare string"]})
        assert r.status_code == 422 and "question" in r.json()["error"]
        # the caller's ids come back (repeated ones too: answers follow their questions, not ids);
        # a misspelt field is named
        r = c.post("/predict", json={"inputs": [{"question": "What is it about?", "context": context, "id": "q1"},
                                                {"question": "What?", "context": context, "id": 7},
                                                {"question": "Who?", "context": context}]})
        assert [p["id"] for p in r.json()["predictions"]] == ["q1", "7", "2"], r.text
        r = c.post("/predict", json={"inputs": [{"question": "What?", "context": context, "contxt": "x"}]})
        assert r.status_code == 422 and "inputs[0].contxt: not a field" in r.json()["error"], r.text


def test_the_onnx_backend_serves_the_same_vectors_and_predictions(classifier, tmp_path):
    """serve --backend onnx on an exported fine-tuned folder: the encoder and the head on ONNX
    Runtime, /encode and /predict within 1e-4 of the torch backend's answers."""
    pytest.importorskip("onnxruntime")
    exported = tmp_path / "onnx"
    assert main(["export", "--model", str(classifier), "--out", str(exported)]) == 0
    inputs = ["a moving film", "dull and too long"]
    answers = {}
    for backend in ("torch", "onnx"):
        with client(exported, backend=backend) as c:
            assert c.get("/info").json()["backend"] == backend
            encoded = c.post("/encode", json={"texts": SENTENCES, "pooling": "mean"})
            predicted = c.post("/predict", json={"inputs": inputs})
            assert encoded.status_code == predicted.status_code == 200, (encoded.text, predicted.text)
            answers[backend] = (np.array(encoded.json()["vectors"]), predicted.json()["predictions"])
    np.testing.assert_allclose(answers["onnx"][0], answers["torch"][0], atol=1e-4)
    for a, b in zip(answers["onnx"][1], answers["torch"][1]):
        assert a["label"] == b["label"] and a["scores"] == pytest.approx(b["scores"], abs=1e-4)


@pytest.mark.parametrize("request_, status, words", [
    ({"texts": "not a list"}, 422, "texts"),
    ({}, 422, "texts"),
    ({"texts": []}, 422, "texts"),
    ({"texts": ["ok"], "pooling": "max"}, 422, "pooling"),
    ({"texts": ["ok"], "surprise": 1}, 422, "surprise"),
    ({"texts": [""]}, 422, "empty"),
    ({"texts": ["a", "b"], "text_pairs": ["c"]}, 422, "pairs"),
    ({"texts": ["x"] * 257}, 413, "--max-texts"),
    ({"texts": ["word " * 600]}, 413, "--max-tokens"),
])
def test_encode_errors_name_the_field_or_limit(tiny_bert, request_, status, words):
    with client(tiny_bert) as c:
        r = c.post("/encode", json=request_)
        assert r.status_code == status, r.text
        assert words in r.json()["error"]


def test_attention_limit_is_the_models_positions_at_most(pretrained, tiny_bert):
    # --max-attention-tokens 1000 on a 512-position model: a 600-token text passed the check and
    # the tokenizer's own refusal came back as a 422, naming no limit
    with client(pretrained, max_attention_tokens=1000) as c:
        assert c.get("/info").json()["limits"]["max_attention_tokens"] == 512
        r = c.post("/attention", json={"text": "word " * 600})
        assert r.status_code == 413, r.text
        assert "over the limit of 512 tokens per text (the model's 512 positions; --max-attention-tokens 1000" \
            in r.json()["error"]
        assert c.post("/attention", json={"text": "The crane flew."}).status_code == 200
    # a /encode limit equal to the attention one was named --max-attention-tokens
    with client(tiny_bert, max_tokens=128) as c:
        assert c.get("/info").json()["limits"]["max_attention_tokens"] == 128
        r = c.post("/encode", json={"texts": ["word " * 200]})
        assert r.status_code == 413 and r.json()["error"].endswith("(--max-tokens)"), r.text


def test_other_errors(tiny_bert, pretrained):
    with client(tiny_bert, max_body_bytes=1000) as c:
        r = c.post("/encode", content=b"{" + b" " * 2000 + b"}", headers={"content-type": "application/json"})
        assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(30):
                yield b" " * 100
        r = c.post("/encode", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        r = c.post("/encode", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 422
        r = c.post("/v1/embeddings", json={"input": [[1, 2, 3]]})
        assert r.status_code == 422 and "token arrays" in r.json()["error"]
        r = c.post("/v1/embeddings", json={"input": "x", "dimensions": 8})
        assert r.status_code == 422 and "32 dimensions" in r.json()["error"]
        assert c.get("/health").json() == {"status": "ok"}  # still serving
    with client(pretrained) as c:
        r = c.post("/attention", json={"text": "word " * 200})
        assert r.status_code == 413 and "--max-attention-tokens" in r.json()["error"]
        r = c.post("/fill-mask", json={"texts": ["no mask here"]})
        assert r.status_code == 422 and "no [MASK]" in r.json()["error"]
        r = c.post("/fill-mask", json={"texts": ["a [MASK]"], "top_k": 1000})
        assert r.status_code == 422 and "top_k" in r.json()["error"]
        # 255 texts of 500 [MASK]s fit the body and token limits; their scores would have taken
        # 16 GB in one pass and their answers hundreds of MB: refused by the answers they ask for
        r = c.post("/fill-mask", json={"texts": ["[MASK] " * 500] * 255, "top_k": 1})
        assert r.status_code == 413 and "127500 answers, over the limit of 100000" in r.json()["error"], r.text
        for body in ({"top_k": 3}, {"text": "a [MASK]", "texts": ["a [MASK]"]}):
            r = c.post("/fill-mask", json=body)
            assert r.status_code == 422 and "give 'text' (one text) or 'texts'" in r.json()["error"], r.text


def test_fill_mask_runs_in_chunks_that_bound_its_memory_and_answers_as_the_design_says(pretrained, monkeypatch):
    """The scores over the vocabulary are held for a few texts at a time (texts x [MASK]s x
    vocabulary floats), with the same answers as one pass; {"text": ...} answers
    {"predictions": [[{"token", "score"}, ...] per [MASK]]} (DESIGN.md's form)."""
    from bertkit.folders import load_model
    from bertkit.inference import fill_mask as fm
    from bertkit.tokenizer import load_tokenizer
    model, _ = load_model(pretrained)
    tok = load_tokenizer(pretrained)
    texts = ["The [MASK] sat.", "[MASK] [MASK] and [MASK] went [MASK] home.", "Paris is the [MASK] of France.",
             "a [MASK] b [MASK]", "one [MASK]"]
    whole = fm.fill_mask(model, tok, texts, 4)
    monkeypatch.setattr(fm, "SCORES_AT_ONCE", 5 * model.config.vocab_size)  # a few texts per pass
    assert fm._chunks([1, 4, 1, 2, 1], model.config.vocab_size) == [[0], [1], [2, 3], [4]]
    chunked = fm.fill_mask(model, tok, texts, 4)
    assert [[[p["token"] for p in m] for m in t] for t in chunked] == [[[p["token"] for p in m] for m in t] for t in whole]
    for a, b in zip(chunked, whole):
        for ma, mb in zip(a, b):
            assert [p["score"] for p in ma] == pytest.approx([p["score"] for p in mb], abs=1e-6)
    with client(pretrained) as c:
        r = c.post("/fill-mask", json={"text": texts[1], "top_k": 4})
        assert r.status_code == 200 and set(r.json()) == {"predictions"}, r.text
        got = r.json()["predictions"]
        assert len(got) == 4 and [[p["token"] for p in m] for m in got] == [[p["token"] for p in m] for m in whole[1]]


def _raw(c, url, body: bytes):
    return c.post(url, content=body, headers={"content-type": "application/json"})


def _strict_json(r):
    """The answer as a strict parser reads it: UTF-8, no NaN or Infinity."""
    return json.loads(r.content.decode("utf-8"), parse_constant=lambda s: pytest.fail(f"{s} in {r.text}"))


def test_nan_and_infinity_in_a_body_are_a_422_not_a_500(tiny_bert):
    """Python's JSON parser takes NaN and Infinity: the error that echoes them must still be JSON."""
    with client(tiny_bert) as c:
        for url, body, field in (("/encode", b'{"texts": NaN}', "texts"),
                                 ("/encode", b'{"texts": ["a"], "pooling": Infinity}', "pooling"),
                                 ("/encode", b'{"texts": ["a"], "normalize": -Infinity}', "normalize"),
                                 ("/v1/embeddings", b'{"input": "a", "dimensions": NaN}', "dimensions"),
                                 ("/v1/embeddings", b'{"input": [NaN]}', "input")):
            r = _raw(c, url, body)
            assert r.status_code == 422, (body, r.text)
            assert field in _strict_json(r)["error"], r.text


def test_serve_refuses_a_port_over_65535(tiny_bert, capsys):
    from bertkit.errors import BertkitError
    assert main(["serve", "--model", str(tiny_bert), "--port", "99999"]) == 2
    assert "--port" in capsys.readouterr().err
    with pytest.raises(BertkitError, match="--port"):
        ServeConfig(model=str(tiny_bert), port=65536).check()
    ServeConfig(model=str(tiny_bert), port=65535).check()


def test_every_error_is_json_with_an_error_field(tiny_bert):
    """404, 405 and bodies that do not parse answer {"error": ...} with their 4xx, as the rest do."""
    def refused(r, status=None):
        assert 400 <= r.status_code < 500 and (status is None or r.status_code == status), r.text
        assert isinstance(_strict_json(r)["error"], str), r.text
        return r
    with client(tiny_bert) as c:
        assert "/no-such-path" in refused(c.get("/no-such-path"), 404).json()["error"]
        assert "POST" in refused(c.get("/encode"), 405).headers["allow"]
        refused(c.post("/health"), 405)
        for body in (b'{"texts": ["\xff"]}', b"[" * 100000, b"{not json", b'{"texts": ["a"]', b"\x00"):
            refused(_raw(c, "/encode", body))
        r = _raw(c, "/encode", b'\xef\xbb\xbf{"texts": ["a"]}')  # a BOM: a parser may ignore it (RFC 8259)
        assert r.status_code == 200 or refused(r)
        # nested just under the parser's limit: it parses, and the error's echo of it is too deep to
        # write (or, here, to read back: the status and the first key only)
        for n in range(900, 1000):
            r = _raw(c, "/encode", b'{"texts": ' + b"[" * n + b"]" * n + b"}")
            assert 400 <= r.status_code < 500 and r.text.startswith('{"error":'), (n, r.text[:200])


def test_booleans_and_integers_are_not_coerced(tiny_bert):
    with client(tiny_bert) as c:
        for url, body, field in (("/encode", {"texts": ["a"], "normalize": "yes"}, "normalize"),
                                 ("/encode", {"texts": ["a"], "normalize": 1}, "normalize"),
                                 ("/fill-mask", {"texts": ["a [MASK]"], "top_k": True}, "top_k"),
                                 ("/fill-mask", {"texts": ["a [MASK]"], "top_k": "5"}, "top_k"),
                                 ("/fill-mask", {"texts": ["a [MASK]"], "top_k": 5.0}, "top_k"),
                                 ("/v1/embeddings", {"input": "a", "dimensions": "32"}, "dimensions"),
                                 ("/v1/embeddings", {"input": "a", "dimensions": True}, "dimensions")):
            r = c.post(url, json=body)
            assert r.status_code == 422 and field in r.json()["error"], (body, r.text)
        assert c.post("/encode", json={"texts": ["a"], "normalize": True}).status_code == 200
        assert c.post("/v1/embeddings", json={"input": "a", "dimensions": 32}).status_code == 200
        r = c.post("/fill-mask", json={"texts": ["a [MASK]"], "top_k": 5})  # valid: on to the no-MLM-head 400
        assert r.status_code == 400 and "MLM head" in r.json()["error"]


def test_empty_text_pairs_are_refused_like_empty_texts(tiny_bert, pair_classifier):
    with client(tiny_bert) as c:
        for url, body, words in (("/encode", {"texts": ["a"], "text_pairs": [""]}, "text_pairs[0]: empty"),
                                 ("/encode", {"texts": ["a", "b"], "text_pairs": ["c", "   "]}, "text_pairs[1]: empty"),
                                 ("/attention", {"text": "a", "text_pair": ""}, "text_pair[0]: empty"),
                                 ("/attention", {"text": "a", "text_pair": " \n"}, "text_pair[0]: empty")):
            r = c.post(url, json=body)
            assert r.status_code == 422 and words in r.json()["error"], (body, r.text)
    with client(pair_classifier) as c:
        r = c.post("/predict", json={"inputs": [{"text": "a", "text_pair": "b"}, {"text": "a", "text_pair": "  "}]})
        assert r.status_code == 422 and "inputs[1].text_pair: empty" in r.json()["error"], r.text
        # nor is a pair that is not a string, or a misspelt field, dropped without a word
        for item, words in (({"text": "a", "text_pair": 5}, "inputs[0].text_pair: must be a string"),
                            ({"text": "a", "txt_pair": "b"}, "inputs[0].txt_pair: not a field")):
            r = c.post("/predict", json={"inputs": [item]})
            assert r.status_code == 422 and words in r.json()["error"], r.text

    # a classify input's text_pair counts against --max-tokens with its text, as /encode's pairs do
    with client(pair_classifier, max_tokens=12) as c:
        fits, over = {"text": "a good film", "text_pair": "yes"}, {"text": "a good film", "text_pair": "yes " * 8}
        r = c.post("/predict", json={"inputs": [fits]})
        assert r.status_code == 200, r.text
        r = c.post("/predict", json={"inputs": [fits, over]})
        assert r.status_code == 413 and "inputs[1]: 14 tokens, over the limit of 12" in r.json()["error"], r.text


def test_lone_surrogates_are_a_422_naming_the_field(tiny_bert, classifier):
    """A \\ud800 escape in a JSON string decodes to a lone surrogate, which neither the tokenizer
    nor the UTF-8 answer can hold."""
    with client(tiny_bert) as c:
        for url, body, field in (("/encode", b'{"texts": ["a", "\\ud800"]}', "texts: [1]"),
                                 ("/encode", b'{"texts": ["a"], "text_pairs": ["\\udfff"]}', "text_pairs: [0]"),
                                 ("/attention", b'{"text": "\\ud800"}', "text:"),
                                 ("/attention", b'{"text": "a", "text_pair": "b\\ud800"}', "text_pair:"),
                                 ("/fill-mask", b'{"texts": ["\\ud800 [MASK]"]}', "texts: [0]"),
                                 ("/v1/embeddings", b'{"input": "\\ud800"}', "input:"),
                                 ("/v1/embeddings", b'{"input": ["a", "\\ud800"]}', "input: [1]"),
                                 ("/v1/embeddings", b'{"input": "a", "model": "\\ud800"}', "model:")):
            r = _raw(c, url, body)
            assert r.status_code == 422, (body, r.text)
            error = _strict_json(r)["error"]
            assert error.startswith(field) and "not valid UTF-8" in error, (body, error)
        r = _raw(c, "/encode", b'{"texts": ["a"], "\\ud800": 1}')  # an unknown field, echoed in the error
        assert r.status_code == 422 and _strict_json(r)["error"]
        r = _raw(c, "/encode", b'{"texts": ["\\ud83d\\ude00 a pair is one character"]}')
        assert r.status_code == 200, r.text
    with client(classifier) as c:
        for body, field in ((b'{"inputs": ["\\ud800"]}', "inputs: [0]"),
                            (b'{"inputs": [{"text": "a", "text_pair": "\\ud800"}]}', "inputs: [0].text_pair")):
            r = _raw(c, "/predict", body)
            assert r.status_code == 422 and _strict_json(r)["error"].startswith(field), (body, r.text)


def test_metrics_count_requests_batches_and_tokens(tiny_bert):
    with client(tiny_bert) as c:
        c.post("/encode", json={"texts": SENTENCES})
        c.post("/encode", json={"texts": []})
        text = c.get("/metrics").text
    assert 'bertkit_requests_total{endpoint="/encode",status="200"} 1.0' in text
    assert 'bertkit_requests_total{endpoint="/encode",status="422"} 1.0' in text
    assert "bertkit_request_seconds_bucket" in text and "bertkit_batch_texts_count 1.0" in text
    assert f"bertkit_batch_texts_sum {float(len(SENTENCES))}" in text
    assert "bertkit_tokens_total" in text


def _concurrently(app, bodies):
    import httpx

    async def go():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                return await asyncio.gather(*(c.post("/encode", json=b) for b in bodies))
    return asyncio.run(go())


def test_dynamic_batching_joins_concurrent_requests_and_isolates_failures(tiny_bert):
    enc = Encoder.from_folder(tiny_bert, device="cpu")
    app = create_app(ServeConfig(model=str(tiny_bert), batch_window_ms=200))
    bodies = [{"texts": [s]} for s in SENTENCES * 4]
    responses = _concurrently(app, bodies)
    expected = enc.encode(SENTENCES * 4)
    for r, row in zip(responses, expected):
        assert r.status_code == 200
        np.testing.assert_allclose(r.json()["vectors"][0], row, atol=1e-6)
    # 20 requests in fewer model calls than requests
    served = app.state.served
    calls = []
    original = served.run_encode

    def counting(key, items):
        calls.append(len(items))
        if any(t == "poison" for t, _ in items):
            raise RuntimeError("a model failure")
        return original(key, items)
    served.run_encode = counting
    responses = _concurrently(app, bodies + [{"texts": ["poison"]}])
    assert max(calls) > 1 and sum(1 for n in calls if n > 1) >= 1
    statuses = [r.status_code for r in responses]
    assert statuses[:-1] == [200] * len(bodies) and statuses[-1] == 500  # only the failing request fails
    # batching off: one model call per request
    calls.clear()
    app_off = create_app(ServeConfig(model=str(tiny_bert), batching=False))
    app_off.state.served.run_encode = counting
    _concurrently(app_off, bodies[:5])
    assert calls == [1] * 5


def test_a_real_server_process(tiny_bert):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(tiny_bert), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/encode", data=json.dumps({"texts": ["hello"]}).encode(),
                                     headers={"content-type": "application/json"})
        body = json.loads(urllib.request.urlopen(req, timeout=30).read())
        assert len(body["vectors"][0]) == 32
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_refuses_bad_options(tiny_bert, capsys):
    assert main(["serve", "--model", str(tiny_bert), "--max-texts", "0"]) == 2
    assert "--max-texts" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_bert), "--max-tokens", "5000"]) == 2
    assert "512 positions" in capsys.readouterr().err
    for bad in ("0", "-1"):  # 0 fell back to the default; -1 refused every request
        assert main(["serve", "--model", str(tiny_bert), "--max-tokens", bad]) == 2
        assert "--max-tokens must be a positive integer" in capsys.readouterr().err


def test_ner_predict_refuses_texts_longer_than_the_model_reads(tmp_path, tiny_bert):
    """Words past the max_len a tagger was fine-tuned with came back 'O', as if read; the server's
    warning went to its own stderr, never to the client."""
    train = tmp_path / "train.conll"
    train.write_text("Peter B-PER\nruns O\n\nMary B-PER\nsings O\n\n" * 2)
    assert main(["finetune", "ner", "--model", str(tiny_bert), "--train", str(train), "--eval", str(train),
                 "--out", str(tmp_path / "ner"), "--epochs", "1", "--max-len", "16"]) == 0
    with client(tmp_path / "ner") as c:
        r = c.post("/predict", json={"inputs": ["Peter runs", " ".join(["Mary sings"] * 8)]})
        assert r.status_code == 413, r.text
        assert r.json()["error"] == ("inputs[1]: 18 tokens, over the limit of 16 tokens per text (the max_len "
                                     "the ner model was fine-tuned with)")
        r = c.post("/predict", json={"inputs": ["Peter runs", " ".join(["Mary sings"] * 7)]})
        assert r.status_code == 200 and len(r.json()["predictions"][1]["tags"]) == 14, r.text



def test_a_sentence_transformers_folder_is_served_with_its_own_steps(tmp_path, tiny_bert):
    """Pooling, Normalize and max_seq_length of a sentence-transformers folder are /encode's
    defaults, as they are `bertkit encode`'s (serve built its encoder with the pooling alone)."""
    import json

    from helpers import sentence_transformers_copy

    from bertkit.inference.encode import Encoder
    folder = sentence_transformers_copy(tiny_bert, tmp_path / "st")
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    reference = Encoder.from_folder(folder, device="cpu")
    with client(folder) as c:
        assert c.get("/info").json()["limits"]["max_tokens"] == 40
        r = c.post("/encode", json={"texts": SENTENCES[:3]}).json()
        assert r["pooling"] == "mean" and r["normalized"] is True
        np.testing.assert_allclose(np.array(r["vectors"]), reference.encode(SENTENCES[:3]), atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(r["vectors"], axis=1), 1.0, rtol=1e-5)
        plain = c.post("/encode", json={"texts": SENTENCES[:3], "normalize": False}).json()
        np.testing.assert_allclose(np.array(plain["vectors"]), reference.encode(SENTENCES[:3], normalize=False),
                                   atol=1e-5)
        r = c.post("/encode", json={"texts": ["word " * 50]})
        assert r.status_code == 413 and "limit of 40 tokens" in r.json()["error"], r.text
    # and --help says so (it said "the model's positions": 512 for all-MiniLM-L6-v2, served at 256)
    from bertkit.cli import build_parser
    serve_help = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    assert "max_seq_length" in " ".join(serve_help.split())


def test_a_long_text_is_counted_off_the_event_loop_and_500s_are_in_the_metrics(tiny_bert):
    """Counting the tokens of ~900 k characters takes seconds; done on the event loop it held up
    every other client (/health answered in 1.65 s). An internal error (500) is answered outside
    the metrics middleware: it was never counted."""
    import httpx
    app = create_app(ServeConfig(model=str(tiny_bert)))
    order = []

    async def go():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as c:
                async def big():
                    r = await c.post("/encode", json={"texts": ["!" * 900_000]})
                    order.append("big")
                    return r

                async def health():
                    await asyncio.sleep(0.05)  # once the big request is being counted
                    r = await c.get("/health")
                    order.append("health")
                    return r
                big_r, health_r = await asyncio.gather(big(), health())
                assert big_r.status_code == 413 and "--max-tokens" in big_r.json()["error"]
                assert health_r.status_code == 200

                def boom(key, items):
                    raise RuntimeError("boom")
                app.state.served.run_encode = boom
                r = await c.post("/encode", json={"texts": ["fine"]})
                assert r.status_code == 500
                return (await c.get("/metrics")).text
    metrics = asyncio.run(go())
    assert order == ["health", "big"]
    assert 'bertkit_requests_total{endpoint="/encode",status="500"} 1.0' in metrics


def test_attention_requests_are_never_joined(pretrained):
    """Each /attention answer is layers x heads x T x T weights: joined requests were all built
    before any was answered, so they run one call each (and give what they give alone)."""
    import httpx
    app = create_app(ServeConfig(model=str(pretrained), batch_window_ms=200))
    calls = []

    async def go():
        async with app.router.lifespan_context(app):
            served = app.state.served
            original = served.run_attention
            served.run_attention = lambda key, items: calls.append(len(items)) or original(key, items)
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                together = await asyncio.gather(*(c.post("/attention", json={"text": t}) for t in SENTENCES[:4]))
                alone = [await c.post("/attention", json={"text": t}) for t in SENTENCES[:4]]
                return together, alone
    together, alone = asyncio.run(go())
    assert calls == [1] * 8
    assert [r.json() for r in together] == [r.json() for r in alone]


def test_a_body_of_many_bad_items_gets_one_short_422(tiny_bert):
    """500,000 wrong items in one 1 MB body held the event loop 10 s (an error built, encoded and
    rendered for each) and came back as 50 MB; a list now stops at its first bad item, and a 422
    lists its first 10 errors without the input each echoed."""
    with client(tiny_bert) as c:
        for url, field in (("/encode", "texts"), ("/v1/embeddings", "input"), ("/predict", "inputs")):
            body = b'{"' + field.encode() + b'":[' + b"1," * 400_000 + b"1]}"
            r = c.post(url, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422 and len(r.content) < 5_000, (url, len(r.content))
        r = c.post("/encode", json={"texts": ["a"], **{f"x{i}": "y" * 1000 for i in range(25)}})
        answer = r.json()
        assert r.status_code == 422 and answer["error"] == "x0: Extra inputs are not permitted"
        assert len(answer["detail"]) == 10 and answer["more_errors"] == 15 and "y" * 1000 not in r.text
        assert {"type", "loc", "msg"} == set(answer["detail"][0])
        r = c.post("/encode", content=b'{"texts": ["a"]} trailing', headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["error"] == "body: invalid JSON at character 17 (Extra data)"
        r = c.post("/encode", content=b'{"texts": ["a"]}', headers={"content-type": "text/plain"})
        assert r.status_code == 422 and "Content-Type: application/json" in r.json()["error"], r.text
        # bodies FastAPI cannot parse were a 400 naming Python's exception; a compressed one is a 415
        import gzip
        for body, words in ((b'{"texts": ["\xff"]}', "not UTF-8 text"), (b"[" * 5000 + b"]" * 5000, "nested too deeply")):
            r = c.post("/encode", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422 and r.json()["error"] == f"body: not valid JSON ({words})", r.text
        r = c.post("/encode", content=gzip.compress(b'{"texts": ["a"]}'),
                   headers={"content-type": "application/json", "content-encoding": "gzip"})
        assert r.status_code == 415 and "Content-Encoding 'gzip'" in r.json()["error"], r.text


def test_texts_with_no_tokens_are_refused_like_empty_texts(tiny_bert, classifier):
    """A zero-width space, NUL or a lone combining mark passes str.strip() and tokenizes to nothing:
    such texts were encoded as [CLS] [SEP] (one vector for all of them) and classified."""
    with client(tiny_bert) as c:
        for url, body, words in (("/encode", {"texts": ["a", "\u200b"]}, "texts[1]: no tokens"),
                                 ("/encode", {"texts": ["\u0000\ufeff"]}, "texts[0]: no tokens"),
                                 ("/encode", {"texts": ["a"], "text_pairs": ["\u200b"]}, "text_pairs[0]: no tokens"),
                                 ("/v1/embeddings", {"input": "\u200b"}, "input[0]: no tokens"),
                                 ("/attention", {"text": "a", "text_pair": "\u200b"}, "text_pair[0]: no tokens")):
            r = c.post(url, json=body)
            assert r.status_code == 422 and words in r.json()["error"], (body, r.text)
        r = c.post("/encode", json={"texts": ["a", "b"], "text_pairs": ["c", "d"]})
        assert r.status_code == 200 and r.json()["tokens"] == 10, r.text  # counted apart, summed as pairs
    with client(classifier) as c:
        r = c.post("/predict", json={"inputs": ["fine", "\u200b"]})
        assert r.status_code == 422 and "inputs[1]: no tokens" in r.json()["error"], r.text


def test_predict_refuses_what_a_classifier_or_qa_model_would_cut_off(classifier, qa_model):
    """Past the max_len a classifier was fine-tuned with, and past a qa model's max_query_len,
    text was cut and answered as if read whole (two different long reviews, one score)."""
    import json as json_
    max_len = json_.loads((classifier / "bertkit.json").read_text())["max_len"]
    with client(classifier) as c:
        fits, over = "good " * (max_len - 2), "good " * (max_len - 1)
        assert c.post("/predict", json={"inputs": [fits]}).status_code == 200
        r = c.post("/predict", json={"inputs": ["fine", over]})
        assert r.status_code == 413 and r.json()["error"] == (
            f"inputs[1]: {max_len + 1} tokens, over the limit of {max_len} tokens per text (the max_len the "
            "classify model was fine-tuned with)"), r.text
    folder, context = qa_model
    with client(folder) as c:  # fine-tuned at --max-len 128: questions of up to 32 tokens
        fits, over = "why " * 32, "why " * 33
        r = c.post("/predict", json={"inputs": [{"question": fits, "context": context}]})
        assert r.status_code == 200, r.text
        r = c.post("/predict", json={"inputs": [{"question": over, "context": context}]})
        assert r.status_code == 413 and r.json()["error"] == (
            "inputs.question[0]: 35 tokens, over the limit of 34 tokens per text (the max_query_len of the qa "
            "model, 32, and [CLS] [SEP])"), r.text


def test_a_port_in_use_or_an_unknown_host_is_one_line_naming_the_flag(tiny_bert, capsys):
    """uvicorn's own line and exit 3 before; now the flag, exit 2, before the model loads."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--model", str(tiny_bert), "--port", str(port)]) == 2
        assert f"--port {port}: already in use on 127.0.0.1" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_bert), "--host", "no-such-host.invalid", "--port", "8000"]) == 2
    assert "--host 'no-such-host.invalid': not a host name or address this machine knows" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_bert), "--host", "192.0.2.1", "--port", "8000"]) == 2  # TEST-NET-1
    assert "--host '192.0.2.1': not an address of this machine" in capsys.readouterr().err


def test_abandoned_requests_are_dropped_and_a_full_queue_answers_503(tiny_bert):
    """Four requests whose clients leave while the model is busy are never computed: a request
    behind them waits for the call in flight only. Past --max-queue requests, a 503 with
    Retry-After. A real uvicorn server, raw sockets for the clients that leave; the model call is
    held on an event, not a clock, so a busy machine cannot change what the test sees."""
    import threading

    import uvicorn
    app = create_app(ServeConfig(model=str(tiny_bert), max_queue=4))
    served, batcher, calls = app.state.served, app.state.batcher, []
    original, release = served.run_encode, threading.Event()

    def held(key, items):  # a model call that ends when the test says so
        calls.append(len(items))
        assert release.wait(timeout=60), "the test never released the model call"
        return original(key, items)
    served.run_encode = held
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    body = json.dumps({"texts": ["a review that nobody will read"]}).encode()

    def send():
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        return s

    def post(texts):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/encode", data=json.dumps({"texts": texts}).encode(),
                                     headers={"content-type": "application/json"})
        return urllib.request.urlopen(req, timeout=60)

    def until(what, condition):
        for _ in range(1200):
            if condition():
                return
            time.sleep(0.05)
        raise AssertionError(f"waited 60 s for {what}")

    def abandoned():
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
        return float(re.search(r"bertkit_abandoned_requests_total ([0-9.]+)", metrics).group(1))
    try:
        until("the server to start", lambda: server.started)
        gone = [send() for _ in range(4)]
        until("four requests in the server, one call in the model", lambda: batcher.in_server == 4 and calls)
        for s in gone:
            s.close()
        until("the server to see the four clients gone", lambda: abandoned() == 4)
        release.set()  # the call in flight ends; nobody waits for it
        assert len(json.loads(post(["hi"]).read())["vectors"]) == 1
        # two model calls: the one already running when the clients left (it may have joined more
        # than one of them) and "hi"'s own; the queued ones never ran
        assert len(calls) == 2 and calls[1] == 1, calls
        # a full queue: four requests in the server, the fifth is turned away with a time to retry
        release.clear()
        busy = [send() for _ in range(4)]
        until("four requests in the server", lambda: batcher.in_server == 4)
        with pytest.raises(urllib.error.HTTPError) as e:
            post(["one too many"])
        assert e.value.code == 503 and int(e.value.headers["Retry-After"]) >= 1
        assert "the server is busy: 4 requests are in it (--max-queue 4)" in json.loads(e.value.read())["error"]
        release.set()
        for s in busy:
            assert b"200 OK" in s.recv(100)
            s.close()
    finally:
        release.set()
        server.should_exit = True
        thread.join(timeout=30)


def _read_ok(s: socket.socket) -> None:
    """One whole 200 answer off a kept-alive connection (headers and body may come apart)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(1000)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
    while len(body) < length:
        body += s.recv(1000)
    assert head.startswith(b"HTTP/1.1 200 OK") and len(body) == length, data


def _answer(s: socket.socket) -> tuple[int, dict, float]:
    """What a raw socket reads until the server closes it: the status, the JSON body, the wait."""
    start, data = time.monotonic(), b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower() and b"connection: close" in head.lower(), head
    return int(head.split()[1]), json.loads(body), time.monotonic() - start


def test_slow_headers_are_answered_408_and_bad_requests_get_the_json_error(tiny_bert, monkeypatch):
    """A real uvicorn server on bertkit's connection: a client that opens a connection and sends
    nothing, or its headers a byte at a time (slowloris), is answered 408 and closed once
    HEADER_TIMEOUT_S passes, on a first request or a kept-alive connection's next; what h11 cannot
    parse is 400 (431 for unfinished headers past its bound) with the server's {"error": ...}, each
    answer followed by a FIN however much the client sent. A client that keeps to the deadline is
    served, and the server stays healthy."""
    import threading

    import uvicorn

    from bertkit.inference.serve import connection
    monkeypatch.setattr(connection, "HEADER_TIMEOUT_S", 1)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(create_app(ServeConfig(model=str(tiny_bert))), host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    try:
        for _ in range(600):
            if server.started:
                break
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as silent, \
                socket.create_connection(("127.0.0.1", port), timeout=30) as dribbling:
            for byte in health[:7]:  # a byte every 0.12 s: each one in time, the whole not
                dribbling.sendall(bytes([byte]))
                time.sleep(0.12)
            for s in (silent, dribbling):
                status, body, _ = _answer(s)
                assert status == 408 and body == {"error": "the request's line and headers did not arrive within 1 s"}
        with socket.create_connection(("127.0.0.1", port), timeout=30) as kept:
            kept.sendall(health)
            _read_ok(kept)
            time.sleep(0.5)  # idle under the keep-alive timer; then a second request, sent in time
            kept.sendall(health[:10])
            time.sleep(0.5)
            kept.sendall(health[10:])
            _read_ok(kept)
            kept.sendall(health[:10])  # a third that stops half-way
            assert _answer(kept)[0] == 408
        # headers past the bound are refused with the rest unread: read 0.2 s later, the answer
        # is still there (closing on unread bytes sent a reset in its place)
        for request, status, words in ((b"NOT HTTP AT ALL\r\n\r\n", 400, "invalid HTTP request: "),
                                       (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 300_000, 431,
                                        "invalid HTTP request: ")):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(request)
                time.sleep(0.2)
                got, body, _ = _answer(s)
                assert got == status and body["error"].startswith(words) and len(body["error"]) > len(words), body
        assert json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30).read())["status"] == "ok"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_predict_refuses_pairs_for_a_single_text_classifier_and_the_reverse(classifier, pair_classifier):
    """As `bertkit predict` and `evaluate` refuse them: the model would read inputs it never saw."""
    for folder, good, bad, words in (
            (classifier, "a film", {"text": "a", "text_pair": "b"},
             "a text pair (text_pair), but the model was fine-tuned on single texts"),
            (pair_classifier, {"text": "a", "text_pair": "b"}, "a film",
             "a single text, but the model was fine-tuned on text pairs")):
        with client(folder) as c:
            assert c.post("/predict", json={"inputs": [good]}).status_code == 200
            r = c.post("/predict", json={"inputs": [good, bad, bad]})
            assert r.status_code == 422 and f"inputs[1]: {words}; 2 such input(s)" in r.json()["error"], r.text
            assert c.get("/health").status_code == 200


def test_an_over_limit_body_is_read_to_its_end_before_the_413():
    """Answered before its body was read, the 413 could reach a client still sending as a reset.
    The body is read (up to DRAIN_BYTES) first; past that the answer says the connection closes."""
    import asyncio

    from bertkit.inference.serve.middleware import DRAIN_BYTES, BodyLimit

    async def never_called(scope, receive, send):
        raise AssertionError("the app ran")

    def run(declared: int, chunks: int):
        events = []

        async def receive():
            events.append("read")
            left = chunks - events.count("read")
            return {"type": "http.request", "body": b"x" * 1000, "more_body": left > 0}

        async def send(message):
            events.append(message)
        scope = {"type": "http", "headers": [(b"content-length", str(declared).encode())]}
        asyncio.run(BodyLimit(never_called, max_bytes=100)(scope, receive, send))
        return events
    events = run(5 * 1000, 5)
    start = next(i for i, e in enumerate(events) if isinstance(e, dict))
    assert events[:start] == ["read"] * 5 and events[start]["status"] == 413  # all read, then answered
    assert (b"connection", b"close") not in events[start]["headers"]
    events = run(DRAIN_BYTES + 1, 1)  # too large to read: answered at once, the connection closed
    assert events[0]["status"] == 413 and (b"connection", b"close") in events[0]["headers"]


def test_a_body_that_stops_arriving_is_answered_408(monkeypatch):
    """A client that sends part of a body and then nothing (slowloris) gets 408 after
    BODY_READ_TIMEOUT_S, the connection closed, instead of holding its request open."""
    import asyncio

    import bertkit.inference.serve.middleware as mw
    monkeypatch.setattr(mw, "BODY_READ_TIMEOUT_S", 0.05)
    sent, reads = [], []

    async def app(scope, receive, send):  # reads its body as an endpoint does
        while (await receive()).get("more_body"):
            pass

    async def receive():
        reads.append(1)
        if len(reads) == 1:
            return {"type": "http.request", "body": b"{", "more_body": True}
        await asyncio.sleep(3600)  # the client sends no more

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "headers": [(b"content-length", b"50")]}
    asyncio.run(mw.BodyLimit(app, max_bytes=100)(scope, receive, send))
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
