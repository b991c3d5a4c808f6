"""``--bpe hf_tokenizer``: a Hugging Face ``tokenizer.json`` as fairseq's BPE step.

What ``fairseq-alibi import-hf`` writes beside an imported BLOOM or MPT model: the text becomes the
tokenizer's ids (as strings), which the imported ``dict.txt`` maps to the model's rows, exactly as
fairseq's ``gpt2`` BPE does with GPT-2 ids. fairseq's own ``hf_byte_bpe`` rebuilds a tokenizer
from ``vocab.json``/``merges.txt`` with a fixed pre-tokenizer, which is not BLOOM's; this one
loads the whole pipeline (normalizer, pre-tokenizer, model) from the file. The ``tokenizers``
library is imported only when the BPE is built.
"""

from dataclasses import dataclass, field

from fairseq.data.encoders import register_bpe
from fairseq.dataclass import FairseqDataclass


@dataclass
class HfTokenizerConfig(FairseqDataclass):
    hf_tokenizer: str = field(default="???", metadata={"help": "path to a tokenizer.json"})


@register_bpe("hf_tokenizer", dataclass=HfTokenizerConfig)
class HfTokenizerBPE:
    def __init__(self, cfg):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError("--bpe hf_tokenizer needs the tokenizers library: "
                              "pip install 'fairseq-alibi[hf]'") from e
        self.tokenizer = Tokenizer.from_file(str(cfg.hf_tokenizer))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def encode(self, x: str) -> str:
        return " ".join(map(str, self.tokenizer.encode(x, add_special_tokens=False).ids))

    def decode(self, x: str) -> str:
        return self.tokenizer.decode([int(t) for t in x.split() if t.isdigit()],
                                     skip_special_tokens=False)

    def is_beginning_of_word(self, x: str) -> bool:
        return self.decode(x).startswith(" ")
