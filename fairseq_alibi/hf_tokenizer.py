"""``--bpe hf_tokenizer``: a Hugging Face ``tokenizer.json`` as fairseq's BPE step.

What ``fairseq-alibi import-hf`` writes beside an imported BLOOM or MPT model: the text becomes the
tokenizer's ids (as strings), which the imported ``dict.txt`` maps to the model's rows, exactly as
fairseq's ``gpt2`` BPE does with GPT-2 ids. fairseq's own ``hf_byte_bpe`` rebuilds a tokenizer
from ``vocab.json``/``merges.txt`` with a fixed pre-tokenizer, which is not BLOOM's; this one
loads the whole pipeline (normalizer, pre-tokenizer, model) from the file. The ``tokenizers``
library is imported only when a tokenizer is loaded (:func:`load_tokenizer`, which export-hf and
import-hf share with the BPE).
"""

import hashlib
import json
from dataclasses import dataclass, field

from fairseq.data.encoders import register_bpe
from fairseq.dataclass import FairseqDataclass


@dataclass
class HfTokenizerConfig(FairseqDataclass):
    hf_tokenizer: str = field(default="???", metadata={"help": "path to a tokenizer.json"})


FIX = "give --hf-tokenizer the tokenizer.json import-hf wrote beside the checkpoint"


def load_tokenizer(path, fix=FIX, error=ValueError):
    """The ``tokenizers.Tokenizer`` in ``path``, or a one-line ``error`` naming the file and
    ``fix`` (tokenizers itself raises a bare ``Exception`` that names neither)."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise ImportError("--bpe hf_tokenizer needs the tokenizers library: "
                          "pip install 'fairseq-alibi[hf]'") from e
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - a missing, damaged or foreign file
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise error(f"cannot read {path} as a tokenizer.json (missing or damaged? {reason}): "
                    f"{fix}") from e


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the vocabulary (each piece and its id, added tokens included), which an
    import's rows follow; not of the file, whose bytes change when the same tokenizer is saved
    again."""
    vocab = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda p: (p[1], p[0]))
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()


@register_bpe("hf_tokenizer", dataclass=HfTokenizerConfig)
class HfTokenizerBPE:
    def __init__(self, cfg):
        self.tokenizer = load_tokenizer(cfg.hf_tokenizer)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def encode(self, x: str) -> str:
        return " ".join(map(str, self.tokenizer.encode(x, add_special_tokens=False).ids))

    def decode(self, x: str) -> str:
        return self.tokenizer.decode([int(t) for t in x.split() if t.isdigit()],
                                     skip_special_tokens=False)

    def is_beginning_of_word(self, x: str) -> bool:
        return self.decode(x).startswith(" ")
