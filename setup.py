"""fairseq-alibi: ALiBi (Attention with Linear Biases) as a plugin for stock fairseq.

fairseq itself is deliberately *not* a hard requirement: users with their own fairseq build
(a GPU build, an editable checkout, a fork installed under another distribution name such as
``fairseq-fixed``) keep it. ``pip install -e .[fairseq]`` adds fairseq-fixed, the fairseq that
works on Python 3.11; install it with ``PIP_CONSTRAINT=examples/constraints.txt`` so that torch
and numpy are not upgraded behind your back.
"""

import os

from setuptools import find_packages, setup

here = os.path.dirname(os.path.abspath(__file__))
version = {}
with open(os.path.join(here, "fairseq_alibi", "version.py")) as f:
    exec(f.read(), version)

setup(
    name="fairseq-alibi",
    version=version["__version__"],
    description="ALiBi (Attention with Linear Biases) for stock fairseq, via --user-dir",
    long_description=open(os.path.join(here, "README.md")).read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.8",
    packages=find_packages(include=["fairseq_alibi", "fairseq_alibi.*"]),
    package_data={"fairseq_alibi": ["config/**/*.yaml"]},
    install_requires=["numpy<2"],  # numpy 2 breaks fairseq (np.compat.long in its data code)
    extras_require={
        # a working fairseq for Python 3.11; skip this extra if you already have fairseq
        "fairseq": ["fairseq-fixed==0.12.3.1"],
        "examples": ["sentencepiece", "matplotlib", "tqdm", "zstandard"],
        "test": ["pytest", "pytest-xdist", "sentencepiece", "matplotlib", "tqdm", "zstandard"],
        # export-hf / import-hf (docs/huggingface.md); the package imports them only there
        "hf": ["transformers==5.24.0", "tokenizers==0.23.3", "safetensors==0.8.0",
               "protobuf==7.36.2"],  # protobuf: reading a sentencepiece model (--bpe sentencepiece)
    },
    entry_points={"console_scripts": ["fairseq-alibi=fairseq_alibi.__main__:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
