"""Installs xlmeta_jax: cross-lingual language model meta-pretraining in JAX/Flax."""

import pathlib
import re

import setuptools

# One place for the repository URL (xlmeta_jax/__init__.py), read without importing the package.
_REPOSITORY = re.search(
    r'^REPOSITORY = "([^"]+)"', (pathlib.Path(__file__).parent / "xlmeta_jax" / "__init__.py")
    .read_text(), re.M).group(1)

# Ranges, not pins: constraints.txt holds the versions CI tests (README's commands install with
# it). A bound here marks a known break; no upper bounds, as no release above the tested ones is
# known to break.
_RUNTIME = [
    # jax[cpu] by default; the `tpu` / `cuda` extras below pick accelerator builds.
    "jax>=0.10",
    # flax 0.10.7 to 0.11.1 install next to jax 0.10 but drop the activations' sharding
    # constraints under it (tests/test_step.py::test_activation_constraints_are_bound fails).
    "flax>=0.11.2",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "gin-config>=0.5",
    # seqio brings TensorFlow and tensorflow-text; 0.0.20 works with TF 2.21 on Python 3.11.
    "seqio==0.0.20",
    "tensorflow-datasets>=4.9",
    "sentencepiece>=0.2",
    "clu>=0.0.12",
    "tensorboard>=2.15",
    "safetensors>=0.4",
    # A released model's tokenizer.json (mmBERT, ModernBERT, XLM-R), read in its own ids.
    "tokenizers>=0.21",  # Tokenizer.encode_batch_fast
    "numpy",
    # Real text for the demo that exists on a fresh machine without internet (UDHR samples).
    "gflanguages>=0.7",
    "matplotlib",
]

_TEST = [
    "pytest>=8",
    "pytest-xdist>=3.5",
    # CPU build; other torch releases pull multi-GB CUDA builds.
    "torch==2.13.0",
    "transformers>=4.45",
    # The reference of the contrastive losses and the loader of embedding exports.
    "sentence-transformers>=5.0",
    "ruff>=0.6",
    # The Beam jobs (data preparation, token cache) run in the tests on the DirectRunner.
    "apache-beam>=2.60",
    # Reference implementation the entity-F1 scorer is cross-checked against.
    "seqeval>=1.2",
    # tests/test_notebooks.py executes notebooks/ headless.
    "nbclient>=0.10",
    "nbconvert>=7",
    "ipykernel>=6",
]

# `python -m t5x.train` (gin/meta.gin, gin/xlmr.gin): t5x's dependencies that the package index
# has. t5x, airio and jestimator themselves are not on the index: install them from their git
# repositories or from built wheels with --no-deps (docs/t5x.md).
_T5X = [
    "grain>=0.2",
    "fiddle>=0.3",
    "jaxtyping>=0.2",
    "chex>=0.1.90",
    "cached_property>=1.5",
    "tensorboard>=2.15",
]

setuptools.setup(
    name="xlmeta_jax",
    version="0.1.0",
    description="Cross-lingual language model meta-pretraining (XLM-R-style MLM) in JAX/Flax",
    url=_REPOSITORY,
    packages=setuptools.find_packages(include=["xlmeta_jax", "xlmeta_jax.*", "tasks", "tasks.*"]),
    package_data={"": ["*.gin"]},
    python_requires=">=3.10",
    install_requires=_RUNTIME,
    extras_require={
        "test": _TEST,
        "t5x": _T5X,
        "tpu": ["jax[tpu]"],
        # libtpu only as a compiler: python -m xlmeta_jax.tools.aot compiles the train step
        # for a TPU slice on a CPU machine (same jax pin as above, so libtpu matches jaxlib).
        "aot": ["jax[tpu]"],
        "cuda": ["jax[cuda12]"],
        # python -m xlmeta_jax.data.prepare: CC-100 to shards, statistics, vocabulary
        # sample and token cache on Apache Beam (DirectRunner here; Dataflow, Flink, Spark).
        # seqio's Beam transforms (seqio.beam_utils) need array-record, a TensorFlow dependency.
        "beam": ["apache-beam>=2.60"],
    },
    entry_points={
        "console_scripts": [
            "xlmeta-train=xlmeta_jax.train:run",
        ],
    },
)
