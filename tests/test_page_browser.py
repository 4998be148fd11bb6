"""The page at / in a real browser: headless Chromium (Debian's chromium and chromium-driver,
installed by `make test`) driven by Selenium against a real `bertkit serve` on 127.0.0.1."""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import free_port

from bertkit.cli import main

webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# `make test` installs both; running pytest by hand without them is a set-up gap, not a pass
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="Debian's chromium and chromium-driver are "
                                                                   "not installed (make test installs them)")


class Server:
    def __init__(self, folder):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(folder),
                                      "--port", str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for _ in range(600):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except OSError:
                assert self.proc.poll() is None, self.proc.stderr.read()
                time.sleep(0.1)
        raise AssertionError("the server did not start in 60 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1200,1400"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def _wait(driver, css, timeout=30):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout).until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))


def _ready(driver, timeout=30):
    """The page has read /info and wired its buttons."""
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.getElementById('info').textContent.startsWith('model')"))


def _type(driver, element_id, text):
    from selenium.webdriver.common.by import By
    box = driver.find_element(By.ID, element_id)
    box.clear()
    box.send_keys(text)


def test_fill_mask_and_attention_on_a_model_bertkit_pretrained(browser, tmp_path_factory, wiki_excerpt):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    folder = tmp_path_factory.mktemp("pretrained") / "run"
    assert main(["pretrain", "--corpus", str(wiki_excerpt), "--out", str(folder), "--steps", "2", "--batch-size", "8",
                 "--max-len", "32", "--vocab-size", "500", "--eval-pairs", "16", "--no-samples"]) == 0
    server = Server(folder)
    try:
        browser.get(server.url + "/")
        _ready(browser)
        _type(browser, "text", "The cat sat on the [MASK].")
        browser.find_element(By.ID, "run-fill-mask").click()
        _wait(browser, "#fill-mask-result .bar")
        candidates = browser.find_elements(By.CSS_SELECTOR, "#fill-mask-result .bar")
        assert len(candidates) == 5 and all("%" in c.text for c in candidates)
        browser.find_element(By.ID, "run-attention").click()
        _wait(browser, "#attention-svg")
        tokens = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#attention-svg text.left")]
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(tokens) > 5
        assert browser.find_elements(By.CSS_SELECTOR, "#attention-svg line.weight")
        Select(browser.find_element(By.ID, "layer")).select_by_value("1")
        Select(browser.find_element(By.ID, "head")).select_by_value("1")
        svg = _wait(browser, "#attention-svg")
        assert (svg.get_attribute("data-layer"), svg.get_attribute("data-head")) == ("1", "1")
        Select(browser.find_element(By.ID, "view")).select_by_value("heatmap")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#attention-svg rect.weight")) == len(tokens) ** 2
        assert len(Select(browser.find_element(By.ID, "head")).options) == 1 + 2  # "all" and tiny's 2 heads
        shot = tmp_path_factory.mktemp("shots") / "page.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        assert not browser.find_element(By.ID, "error").text
        # the API docs render offline: Swagger UI from the server's own files lists the endpoints
        browser.get(server.url + "/docs")
        _wait(browser, ".swagger-ui .opblock")
        paths = {e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
        assert {"/encode", "/v1/embeddings", "/fill-mask", "/attention"} <= paths, paths
    finally:
        server.stop()


def test_question_answering_highlights_the_answer(browser, tmp_path_factory, tiny_bert):
    from selenium.webdriver.common.by import By

    from bertkit.data.squad_subset import squad_subset_file
    squad = json.loads(squad_subset_file().read_text(encoding="utf-8"))
    article = squad["data"][0]
    article["paragraphs"] = article["paragraphs"][:1]
    work = tmp_path_factory.mktemp("qa")
    (work / "small.json").write_text(json.dumps({"version": "1.1", "data": [article]}))
    assert main(["finetune", "qa", "--model", str(tiny_bert), "--train", str(work / "small.json"), "--eval",
                 str(work / "small.json"), "--out", str(work / "model"), "--epochs", "1", "--max-len", "128"]) == 0
    server = Server(work / "model")
    try:
        browser.get(server.url + "/")
        _ready(browser)
        # emoji before the answer: the server counts code points, a JS string UTF-16 units (the
        # highlight slipped one character per emoji); ChromeDriver types only the BMP, so the
        # context is set as the page's value
        context = "\U0001F600\U0001F600\U0001F600 The theory of relativity was written by Albert Einstein in the early twentieth century."
        _type(browser, "text", "Who wrote the theory of relativity?")
        browser.execute_script("document.getElementById('pair').value = arguments[0]", context)
        browser.find_element(By.ID, "run-predict").click()
        answer = _wait(browser, "#predict-result mark.answer")
        request = urllib.request.Request(server.url + "/predict", headers={"content-type": "application/json"},
                                         data=json.dumps({"inputs": [{"question": "Who wrote the theory of relativity?",
                                                                      "context": context}]}).encode())
        served = json.loads(urllib.request.urlopen(request, timeout=60).read())["predictions"][0]
        best = served["nbest"][0]
        assert answer.text and answer.text == context[best["start_char"]:best["end_char"]].strip()
        browser.find_element(By.ID, "run-attention").click()
        _wait(browser, "#attention-svg")
        assert browser.find_elements(By.CSS_SELECTOR, "#attention-svg line.weight")
        tokens = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#attention-svg text.left")]
        assert tokens.count("[SEP]") == 2  # the question and its context, as one pair
    finally:
        server.stop()


def test_summaries_are_shown_sentence_by_sentence(browser, tmp_path_factory, tiny_bert):
    """/predict gives a summarize folder's summary as a list of sentences (the page called
    .replace on it and showed a TypeError instead)."""
    from selenium.webdriver.common.by import By

    from bertkit.data.registry import export
    work = tmp_path_factory.mktemp("summarize")
    export("aclsum", work / "aclsum")
    rows = (work / "aclsum" / "train.jsonl").read_text().splitlines()[:8]
    (work / "small.jsonl").write_text("\n".join(rows) + "\n")
    assert main(["finetune", "summarize", "--model", str(tiny_bert), "--train", str(work / "small.jsonl"), "--eval",
                 str(work / "small.jsonl"), "--out", str(work / "model"), "--epochs", "1", "--max-len", "128"]) == 0
    server = Server(work / "model")
    try:
        browser.get(server.url + "/")
        _ready(browser)
        _type(browser, "text", "BERT reads text both ways. It was trained on books. The weather was nice. "
                               "It helps many tasks. Lunch was late.")
        browser.find_element(By.ID, "run-predict").click()
        _wait(browser, "#predict-result p")
        shown = [p.text for p in browser.find_elements(By.CSS_SELECTOR, "#predict-result p")]
        assert shown and all(shown) and not browser.find_element(By.ID, "error").text
    finally:
        server.stop()


def test_entities_are_highlighted_whole(browser, tmp_path_factory, tiny_bert):
    """The page marks each entity /predict gives, over all its words, labelled with its type."""
    from selenium.webdriver.common.by import By
    work = tmp_path_factory.mktemp("ner")
    (work / "train.conll").write_text("Peter B-person\nBlackburn I-person\nvisited O\nParis B-geo-loc\n.\tO\n\n" * 16)
    assert main(["finetune", "ner", "--model", str(tiny_bert), "--train", str(work / "train.conll"), "--eval",
                 str(work / "train.conll"), "--out", str(work / "model"), "--epochs", "4", "--lr", "1e-3",
                 "--batch-size", "8", "--seed", "0"]) == 0
    server = Server(work / "model")
    try:
        browser.get(server.url + "/")
        _ready(browser)
        text = "Peter Blackburn visited Paris ."
        _type(browser, "text", text)
        browser.find_element(By.ID, "run-predict").click()
        _wait(browser, "#predict-result mark.entity")
        request = urllib.request.Request(server.url + "/predict", headers={"content-type": "application/json"},
                                         data=json.dumps({"inputs": [text]}).encode())
        served = json.loads(urllib.request.urlopen(request, timeout=60).read())["predictions"][0]["entities"]
        assert [e["text"] for e in served] == ["Peter Blackburn", "Paris"], served  # what it was trained on
        marks = browser.find_elements(By.CSS_SELECTOR, "#predict-result mark.entity")
        shown = [(m.get_attribute("title"), browser.execute_script("return arguments[0].firstChild.textContent", m))
                 for m in marks]  # the mark's words, before its <small> type label
        assert shown == [(e["type"], e["text"]) for e in served]
        assert not browser.find_element(By.ID, "error").text
    finally:
        server.stop()
