"""Text to fairseq token indices: word level, GPT-2 byte-level BPE, or sentencepiece.

Every encoder maps a line or document to the indices of a fairseq :class:`Dictionary`, with
``</s>`` appended, exactly as ``fairseq-preprocess`` binarizes the encoded text:

* :class:`WordEncoder`: whitespace tokens (``fairseq.tokenizer.tokenize_line``), unknown words
  become ``<unk>``;
* :class:`Gpt2BpeEncoder`: fairseq's GPT-2 BPE (``encoder.json``/``vocab.bpe``) on the stripped
  text, as ``examples/roberta/multiprocessing_bpe_encoder.py`` does, then fairseq's GPT-2
  ``dict.txt`` (whose symbols are the BPE ids);
* :class:`SentencePieceEncoder`: a sentencepiece model's pieces, looked up in a dictionary of
  those pieces. Newlines inside a document become the piece :data:`NEWLINE`, so a document
  stays one sample and keeps its paragraphs.

Encoders hold file paths and load lazily, so they pickle cheaply into worker processes.
"""

import os
from pathlib import Path

import numpy as np

from fairseq_alibi.preprocess.pipeline_io import DataError, require

#: the user-defined sentencepiece symbol that stands for a newline inside a document
NEWLINE = "\u21b5"

#: fairseq's end-of-sentence symbol (Dictionary.eos_word), counted once per line
EOS_WORD = "</s>"

#: GPT-2 BPE words cached per worker before the cache is reset (the Pile has no end of them)
_BPE_CACHE_LIMIT = 500_000


def fairseq_dictionary():
    from fairseq.data import Dictionary

    return Dictionary


def _lookup_table(symbols, dictionary) -> np.ndarray:
    """Encoder id -> dictionary index (``<unk>`` where the dictionary lacks the symbol)."""
    return np.array([dictionary.index(s) for s in symbols], dtype=np.int64)


def _require_dict(dict_path):
    if dict_path and not os.path.isfile(dict_path):
        raise DataError(f"--dict {dict_path} not found: give the dict.txt to binarize with")


def refuse_foreign_dictionary(symbols, dictionary, dict_path, kind: str, fix: str,
                              part_allowed: bool = False):
    """A ``--dict`` of another tokenization (a word-level ``dict.txt`` given with
    ``--gpt2-bpe``): binarized with it, most tokens would be ``<unk>`` and the run would still
    succeed. Refused when it has no entries or its entries are mostly not the encoder's
    symbols, and, unless ``part_allowed``, when it lacks half of the encoder's symbols.
    ``part_allowed``: a dictionary of a part of the symbols is one built from a corpus (a GPT-2
    BPE ``dict.txt``, as a model was pretrained with), its ``<unk>`` counted in ``stats.json``;
    a sentencepiece model's own dictionary has every piece."""
    known = set(symbols)
    entries = [w for w in dictionary.symbols[dictionary.nspecial:]
               if not w.startswith("madeupword")]
    foreign = [w for w in entries if w not in known]
    found = len(entries) - len(foreign)
    if not entries or len(foreign) > len(entries) / 2:
        why = (f"{len(foreign)} of its {len(entries)} entries are not symbols of it (e.g. "
               f"{', '.join(foreign[:3])})" if entries else "it has no entries")
    elif not part_allowed and found < len(known) / 2:
        why = f"it has {found} of its {len(known)} symbols"
    else:
        return
    raise DataError(f"--dict {dict_path} is not a dictionary of this {kind}: {why}, so most "
                    f"tokens would become <unk>; {fix}")


def dictionary_from_counts(counts):
    """What ``fairseq-preprocess`` builds from word counts (``</s>`` counted once per line):
    specials, then words by descending count (ties in sorted order), padded to a multiple of 8."""
    d = fairseq_dictionary()()
    for word, n in sorted(counts.items()):
        d.add_symbol(word, n)
    d.finalize(threshold=0, nwords=-1, padding_factor=8)
    return d


class WordEncoder:
    """Whitespace-separated words, as ``fairseq-preprocess`` tokenizes (no BPE)."""

    def __init__(self, dictionary):
        self.dictionary = dictionary

    def encode(self, text: str) -> np.ndarray:
        return self.dictionary.encode_line(text, add_if_not_exist=False).numpy()


class Gpt2BpeEncoder:
    """GPT-2 byte-level BPE from local ``encoder.json``/``vocab.bpe``, with fairseq's dictionary.

    ``dict_path`` is fairseq's GPT-2 ``dict.txt`` (symbols are BPE ids as strings). Without it,
    the dictionary lists every BPE id in id order, padded to a multiple of 8.
    """

    def __init__(self, encoder_json, vocab_bpe, dict_path=None):
        for f in (encoder_json, vocab_bpe):
            if not os.path.isfile(f):
                raise DataError(
                    f"GPT-2 BPE file not found: {f}. Point at a folder with encoder.json, "
                    "vocab.bpe (and fairseq's dict.txt), e.g. fairseq's gpt2_bpe files"
                )
        _require_dict(dict_path)
        self.files = (str(encoder_json), str(vocab_bpe))
        self.dict_path = str(dict_path) if dict_path else None
        self._bpe = self._table = self._dictionary = None

    @property
    def inputs(self):
        """The files this encoder reads (a pipeline must not write over them)."""
        return self.files + ((self.dict_path,) if self.dict_path else ())

    @classmethod
    def from_dir(cls, folder, dict_path=None):
        folder = Path(folder)
        if dict_path is None and (folder / "dict.txt").is_file():
            dict_path = folder / "dict.txt"
        return cls(folder / "encoder.json", folder / "vocab.bpe", dict_path)

    def __getstate__(self):
        return {"files": self.files, "dict_path": self.dict_path,
                "_bpe": None, "_table": None, "_dictionary": None}

    @property
    def bpe(self):
        if self._bpe is None:
            from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

            try:
                self._bpe = get_encoder(*self.files)
            except (ValueError, KeyError) as e:
                raise DataError(f"malformed GPT-2 BPE files {self.files}: {e}") from e
        return self._bpe

    @property
    def dictionary(self):
        if self._dictionary is None:
            Dictionary = fairseq_dictionary()
            if self.dict_path:
                self._dictionary = self._checked(Dictionary.load(self.dict_path))
            else:
                d = Dictionary()
                for i in range(len(self.bpe.encoder)):
                    d.add_symbol(str(i), n=1)
                d.pad_to_multiple_(8)
                self._dictionary = d
        return self._dictionary

    def _checked(self, dictionary):
        """``dictionary`` (the ``--dict``), refused when it is another tokenization's."""
        folder_dict = Path(self.files[0]).parent / "dict.txt"
        right = (f"{folder_dict} (fairseq's GPT-2 dict.txt)" if folder_dict.is_file()
                 else "fairseq's GPT-2 dict.txt")
        refuse_foreign_dictionary(
            [str(i) for i in range(len(self.bpe.encoder))], dictionary, self.dict_path,
            "GPT-2 BPE", "a GPT-2 BPE dict.txt lists the BPE ids (0, 1, ...) as symbols: give "
            f"--dict {right}, or the dict.txt of the data the model was pretrained on",
            part_allowed=True)
        return dictionary

    def ids(self, text: str):
        """The BPE ids of the stripped text (what multiprocessing_bpe_encoder writes)."""
        bpe = self.bpe
        if len(bpe.cache) > _BPE_CACHE_LIMIT:
            bpe.cache.clear()
        return bpe.encode(text.strip())

    def encode(self, text: str) -> np.ndarray:
        if self._table is None:
            self._table = _lookup_table(
                [str(i) for i in range(len(self.bpe.encoder))], self.dictionary
            )
        ids = self._table[np.asarray(self.ids(text), dtype=np.int64)]
        return np.append(ids, self.dictionary.eos())


class SentencePieceEncoder:
    """A sentencepiece model's pieces, with a fairseq dictionary of those pieces.

    ``dict_path`` defaults to the dictionary :func:`sentencepiece_dictionary` derives from the
    model (every piece in model order, padded to a multiple of 8).
    """

    def __init__(self, model_path, dict_path=None):
        if not os.path.isfile(model_path):
            raise DataError(f"sentencepiece model not found: {model_path}")
        _require_dict(dict_path)
        self.model_path = str(model_path)
        self.dict_path = str(dict_path) if dict_path else None
        self._sp = self._table = self._dictionary = None

    @property
    def inputs(self):
        """The files this encoder reads (a pipeline must not write over them)."""
        return (self.model_path,) + ((self.dict_path,) if self.dict_path else ())

    def __getstate__(self):
        return {"model_path": self.model_path, "dict_path": self.dict_path,
                "_sp": None, "_table": None, "_dictionary": None}

    @property
    def sp(self):
        if self._sp is None:
            spm = require("sentencepiece")
            self._sp = spm.SentencePieceProcessor(model_file=self.model_path)
        return self._sp

    @property
    def dictionary(self):
        if self._dictionary is None:
            if self.dict_path:
                d = fairseq_dictionary().load(self.dict_path)
                refuse_foreign_dictionary(
                    [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())], d,
                    self.dict_path, f"sentencepiece model ({self.model_path})",
                    "give --dict the dict.txt written beside this model (or none: it is then "
                    "derived from the model)")
                self._dictionary = d
            else:
                self._dictionary = sentencepiece_dictionary(self.sp)
        return self._dictionary

    def encode(self, text: str) -> np.ndarray:
        if self._table is None:
            pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
            self._table = _lookup_table(pieces, self.dictionary)
        ids = self.sp.encode(text.strip().replace("\n", NEWLINE), out_type=int)
        return np.append(self._table[np.asarray(ids, dtype=np.int64)], self.dictionary.eos())


def sentencepiece_dictionary(sp, pad_to_multiple: int = 8):
    """The fairseq dictionary of a sentencepiece model: its normal and user-defined pieces.

    ``<unk>`` and control pieces are left out (fairseq has its own specials); the order is the
    model's, padded with ``madeupword`` symbols to a multiple of ``pad_to_multiple``. Write it
    with ``.save(path)`` for ``fairseq-preprocess --srcdict``.
    """
    d = fairseq_dictionary()()
    for i in range(sp.get_piece_size()):
        if not (sp.is_unknown(i) or sp.is_control(i)):
            d.add_symbol(sp.id_to_piece(i), n=1)
    d.pad_to_multiple_(pad_to_multiple)
    return d


def train_sentencepiece(sentences, model_prefix, vocab_size: int, model_type="unigram",
                        newline_piece: bool = True, **options):
    """Train a sentencepiece model on an iterator of lines (or a text file); return the ``.model`` path.

    With ``newline_piece`` the model keeps :data:`NEWLINE` as a piece of its own (documents of
    several lines); it never has ``<s>``/``</s>``/``<pad>`` (fairseq adds them). ``options`` go
    to the trainer as they are (e.g. ``byte_fallback=True``, ``num_threads=1``).
    """
    spm = require("sentencepiece")
    settings = dict(character_coverage=0.9999, minloglevel=2)
    if newline_piece:
        settings.update(user_defined_symbols=[NEWLINE], bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0)
    settings.update(options)
    if isinstance(sentences, (str, Path)):
        settings["input"] = str(sentences)
    else:
        settings["sentence_iterator"] = iter(sentences)
    try:
        spm.SentencePieceTrainer.train(
            model_prefix=str(model_prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            **settings,
        )
    except RuntimeError as e:  # e.g. "Vocabulary size too high (60). ... <= 54."
        raise DataError(f"sentencepiece training failed: {e}") from e
    return f"{model_prefix}.model"


def add_encoder_arguments(parser, sentencepiece_training=False):
    """``--gpt2-bpe DIR`` | ``--sentencepiece MODEL`` [``--dict``] (and, optionally, training)."""
    group = parser.add_argument_group("tokenization")
    group.add_argument(
        "--gpt2-bpe", metavar="DIR",
        help="GPT-2 byte-level BPE: a folder with encoder.json, vocab.bpe and (optional) "
        "fairseq's dict.txt",
    )
    group.add_argument("--sentencepiece", metavar="MODEL", help="a sentencepiece .model file")
    group.add_argument(
        "--dict", metavar="DICT",
        help="the fairseq dictionary to binarize with (default: the BPE folder's dict.txt, or "
        "the one derived from the sentencepiece model); give the pretraining data's dict.txt "
        "when fine-tuning",
    )
    if sentencepiece_training:
        group.add_argument(
            "--train-sentencepiece", metavar="VOCAB", type=int,
            help="train a sentencepiece model of this vocabulary size on a sample of the "
            "training documents (see --sentencepiece-sample)",
        )
    return group


def encoder_from_args(args, required=True):
    """The encoder the tokenization arguments ask for (None for word level, if allowed)."""
    chosen = [a for a in ("gpt2_bpe", "sentencepiece") if getattr(args, a, None)]
    if getattr(args, "train_sentencepiece", None):
        chosen.append("train_sentencepiece")
    if len(chosen) > 1:
        raise DataError(f"choose one tokenization, got {', '.join('--' + c.replace('_', '-') for c in chosen)}")
    encoder = None
    if args.gpt2_bpe:
        encoder = Gpt2BpeEncoder.from_dir(args.gpt2_bpe, args.dict)
    elif args.sentencepiece:
        encoder = SentencePieceEncoder(args.sentencepiece, args.dict)
    if encoder is not None:
        encoder.dictionary  # loaded (and a --dict of another tokenization refused) before any work
        return encoder
    if required and not chosen:
        raise DataError("choose a tokenization: --gpt2-bpe DIR or --sentencepiece MODEL")
    return None
