"""A real parallel corpus from the machine's gettext catalogs: translations → English.

Installed software ships its translations as compiled gettext catalogs,
``<locale dir>/<lang>/LC_MESSAGES/*.mo``: tens of thousands of program messages, from one word to
whole ``--help`` texts, each translated by a person. This tool turns those of one language into a
sentence-aligned corpus, source = the translation (``--lang``), target = the English ``msgid``,
and binarizes it with the parallel pipeline (``fairseq_alibi.preprocess.parallel``) with one
joined dictionary (for ``--share-all-embeddings``).

What is read, and what is dropped:

* every ``*.mo`` of ``<locale dir>/<lang>/LC_MESSAGES``, in path order (``--locale-dir``,
  repeatable; default those of these that exist:
  {system_dirs});
  regional variants are separate languages (``--lang pt_BR``);
* name-list catalogs are skipped by file name, the ISO code catalogs and keyboard layouts:
  {name_lists}
  (language, country, currency and script names, not text);
* a catalog that cannot be parsed (not the MO format, truncated, an unknown charset) is skipped
  with a warning naming it; if every catalog is unreadable, that is an error;
* from each entry: the header (empty msgid) is skipped; a context (``ctx\\x04msgid``) is dropped
  from the msgid; a plural entry gives its singular msgid and its first form; entries with an
  empty translation are skipped (msgfmt leaves untranslated and fuzzy entries out of a ``.mo``
  unless ``--use-fuzzy``, which a compiled catalog does not record);
* whitespace is collapsed to single spaces and stripped (the text is otherwise kept); a pair with
  a side without any letter outside its format conversions (``%s: %d``, ``{{0}} (%s)``) or with
  two identical sides (an untranslated copy, which would teach copying) is dropped;
* keyboard accelerators (GTK's ``_File``, Qt's ``&File``) are stripped on both sides so that
  the corpus holds the words people read. They are a GUI toolkit's convention: a catalog uses
  them when one of its entries starts a word with a marker on both sides (``_Fichier``/``_File``);
  elsewhere (command-line tools) ``nom_colonne``/``column_name`` are identifiers and kept. In such
  a catalog, a word with one ``_``/``&`` before a letter (not between capitals, as in
  ``KP_Enter``) is an accelerator when both sides have one and the other side lacks that very
  word; a pair with two on a side is ambiguous and dropped; one on one side only is left as is
  (an identifier translated: ``Num_Fin``/``KP_End``);
* deduplication: identical pairs once; a source with several English targets keeps the target
  found in most catalogs (ties: the first in sorted order), so that no source has two answers.

Tokenization (reversible, deterministic, for BLEU on tokens): words (``\\w+``) and single
punctuation characters, separated by spaces; a punctuation token written against its neighbour
carries the joiner ``{joiner}`` on that side (the OpenNMT tokenizer's "joiner annotation"):
``Erreur : fichier « a.txt » introuvable.`` → ``Erreur : fichier « a ￭.￭ txt » introuvable ￭.``.
:func:`detokenize` gives the text back exactly. Lengths are counted in these tokens.

Splits by source length (tokens), deterministic given ``--seed``: training pairs have a source of
at most ``--N`` tokens; the test buckets are (N/2, N] (held out of training), (N, 2N], (2N, 4N],
(4N, 8N], ``--per-bucket`` pairs each; ``valid`` has the same buckets, ``--valid-per-bucket``
pairs each, disjoint from the test pairs and from training, so that settings are chosen on long
inputs without reading the test buckets. A pair longer than N is never trained on. The test
buckets are drawn first, so adding the validation buckets leaves the test pairs of a seed as
they were. Output (``--out``)::

    {{train,valid,test}}.{{LANG,en}}          the tokenized text (valid, test: every bucket, in order)
    test{{1,2,3,4}}.{{LANG,en}}               one bucket each: (N/2,N], (N,2N], (2N,4N], (4N,8N]
    {{valid,test}}.bucket                   the bucket of each line of valid.LANG / test.LANG, e.g. (8,16]
    dict.{{LANG,en}}.txt, *.bin, *.idx      fairseq binaries: splits train, valid, test, test1-4
    stats.json                            catalogs used and skipped, counts, length ratio

(``valid`` has no per-bucket files: fairseq-train refuses a data folder holding ``valid1``...
that it would not read, and ``valid.bucket`` says where each bucket starts.)

``stats.json``'s ``length_ratio`` is r = source tokens per target token on train (total over
total), what ``--cross-alibi-ratio`` expects.
"""

import argparse
import codecs
import fnmatch
import logging
import random
import re
import struct
from collections import Counter, defaultdict
from pathlib import Path

from fairseq_alibi.preprocess.pipeline_io import (
    DataError, atomic_directory, refuse_existing, run_cli, save_json,
)
from fairseq_alibi.preprocess.parallel import prepare

logger = logging.getLogger("fairseq_alibi.preprocess.gettext")

#: the language of the msgids
TARGET_LANG = "en"
#: where Debian-like systems install catalogs: <dir>/<lang>/LC_MESSAGES/*.mo
SYSTEM_LOCALE_DIRS = ("/usr/share/locale", "/usr/local/share/locale", "/usr/share/locale-langpack")
#: catalogs of names rather than sentences (iso-codes, keyboard layouts), by file name
NAME_LIST_CATALOGS = ("iso_*", "iso-codes*", "xkeyboard-config*")
#: marks a punctuation token written against its neighbour, on that side
JOINER = "\uffed"

__doc__ = __doc__.format(system_dirs=", ".join(SYSTEM_LOCALE_DIRS),
                         name_lists=", ".join(f"``{p}.mo``" for p in NAME_LIST_CATALOGS),
                         joiner=JOINER)

MO_MAGIC = 0x950412DE


class CorruptCatalog(Exception):
    """A ``.mo`` file that cannot be parsed; the message says why."""


# ------------------------------------------------------------------------------ reading catalogs


def read_mo(path):
    """``[(msgid, msgstr), ...]`` of a compiled gettext catalog, header entry included.

    The MO format: a magic number (its byte order gives the file's), a revision, the number of
    strings and the offsets of two tables of ``(length, offset)`` pairs, the msgids' and the
    translations'. Strings are decoded with the header's charset (UTF-8 without one). Raises
    :class:`CorruptCatalog`.
    """
    data = Path(path).read_bytes()
    if len(data) < 20:
        raise CorruptCatalog(f"{len(data)} bytes, shorter than the MO header")
    for order in "<>":
        if struct.unpack(order + "I", data[:4])[0] == MO_MAGIC:
            break
    else:
        raise CorruptCatalog("not a compiled gettext catalog (bad magic number)")
    revision, count, ids_at, strs_at = struct.unpack(order + "4I", data[4:20])
    if revision >> 16 > 1:
        raise CorruptCatalog(f"unknown MO format revision {revision >> 16}")

    def strings(table_at):
        if table_at + 8 * count > len(data):
            raise CorruptCatalog("truncated: its string table runs past the end of the file")
        for i in range(count):
            length, offset = struct.unpack_from(order + "2I", data, table_at + 8 * i)
            if offset + length > len(data):
                raise CorruptCatalog(f"truncated: string {i} runs past the end of the file")
            yield data[offset: offset + length]

    entries = list(zip(strings(ids_at), strings(strs_at)))
    header = dict(entries).get(b"", b"").decode("ascii", "replace")
    charset = re.search(r"charset=([\w.:-]+)", header)
    charset = charset.group(1) if charset and charset.group(1) != "CHARSET" else "utf-8"
    try:
        codecs.lookup(charset)
        return [(i.decode(charset), s.decode(charset)) for i, s in entries]
    except LookupError as e:
        raise CorruptCatalog(f"unknown charset {charset!r}") from e
    except UnicodeDecodeError as e:
        raise CorruptCatalog(f"not {charset} text ({e})") from e


def message_pair(msgid, msgstr):
    """``(translation, english)`` of one catalog entry, or None for the header and entries
    without a translation: contexts dropped, the singular and first form of a plural."""
    msgid = msgid.split("\x04", 1)[-1].split("\x00")[0]
    msgstr = msgstr.split("\x00")[0]
    if not msgid or not msgstr.strip():
        return None
    return msgstr, msgid


def find_catalogs(lang, locale_dirs):
    """``(catalogs, name_lists)``: the ``.mo`` files of ``lang`` to read and those skipped as
    name lists, sorted; a :class:`DataError` naming the folders searched when there are none."""
    found = sorted(p for root in locale_dirs for p in Path(root, lang, "LC_MESSAGES").glob("*.mo"))
    name_lists = [p for p in found
                  if any(fnmatch.fnmatch(p.stem, pattern) for pattern in NAME_LIST_CATALOGS)]
    catalogs = [p for p in found if p not in name_lists]
    if not catalogs:
        searched = ", ".join(str(Path(root, lang, "LC_MESSAGES")) for root in locale_dirs)
        available = Counter(p.parent.parent.name for root in locale_dirs
                            for p in Path(root).glob("*/LC_MESSAGES/*.mo"))
        others = ", ".join(f"{name} ({n})" for name, n in
                           sorted(available.items(), key=lambda item: (-item[1], item[0]))[:8])
        what = f"only name lists ({', '.join(p.name for p in name_lists)})" if name_lists else \
            "no gettext catalog (*.mo)"
        raise DataError(
            f"{what} for --lang {lang} in {searched or 'no locale folder'}: install software "
            f"translated into it (Ubuntu: apt-get install language-pack-{lang.split('_')[0]}; "
            f"Debian packages carry their own translations unless localepurge removed them), "
            f"point --locale-dir at a folder of <lang>/LC_MESSAGES/*.mo, or choose another --lang"
            + (f" (catalogs found: {others})" if others else "")
        )
    return catalogs, name_lists


# ---------------------------------------------------------------------- cleaning and tokenizing

_WORD_RUNS = re.compile(r"[\w&]+")
#: a word with one accelerator marker, ``_`` or ``&`` before a letter, and no other ``_``/``&``;
#: not between two capitals or after a digit (``LC_ALL``, ``FILE_LIST``, ``1_needed``: identifiers)
_ACCELERATED = re.compile(r"(?![^\W_]*(?:[A-Z][_&][A-Z]|\d[_&]))[^\W_]*[_&][^\W\d_][^\W_]*")
_TOKEN = re.compile(r"(\w+)|[^\w\s]")
#: printf conversions (``%s``, ``%1$-8.3lf``, ``%(name)s``) and ``{0}``/``{name}`` placeholders
_FORMAT = re.compile(r"%(?:\d+\$|\(\w+\))?[-+ #0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?"
                     r"(?:hh|ll|[hlLqjzt])?[a-zA-Z%]|\{\w*\}")


def _accelerated_words(text, other):
    """Words of ``text`` with one accelerator marker that ``other`` does not also have."""
    others = set(_WORD_RUNS.findall(other))
    return {m.group() for m in _WORD_RUNS.finditer(text)
            if _ACCELERATED.fullmatch(m.group()) and m.group() not in others
            and not (m.group().startswith("&") and text[m.end(): m.end() + 1] == ";")}  # &amp;


def _strip_accelerators(text, words):
    return _WORD_RUNS.sub(lambda m: re.sub(r"[_&]", "", m.group(), count=1)
                          if m.group() in words else m.group(), text)


def uses_accelerators(pairs):
    """Whether a catalog's ``(source, target)`` pairs follow a GUI toolkit's accelerator
    convention: one of them starts a word with a marker on both sides (``_Fichier``/``_File``)."""
    return any(any(w[0] in "_&" for w in _accelerated_words(s, t))
               and any(w[0] in "_&" for w in _accelerated_words(t, s)) for s, t in pairs)


def clean_pair(source, target, accelerators=False):
    """``(pair, why)``: the normalised ``(source, target)`` with ``why`` None, or ``None`` with
    the reason it is dropped (a key of stats.json's ``dropped``); ``why`` is ``"accelerators"``
    for a pair kept with its accelerators stripped (only if ``accelerators``: the catalog
    :func:`uses_accelerators`; elsewhere ``nom_colonne``/``column_name`` are identifiers)."""
    source, target = " ".join(source.split()), " ".join(target.split())
    if not all(any(c.isalpha() for c in _FORMAT.sub("", side)) for side in (source, target)):
        return None, "format_only"
    if JOINER in source or JOINER in target:
        return None, "contains_joiner"
    marked = _accelerated_words(source, target), _accelerated_words(target, source)
    why = None
    if accelerators and all(marked):
        if max(map(len, marked)) > 1:
            return None, "ambiguous_accelerators"
        source, target = _strip_accelerators(source, marked[0]), _strip_accelerators(target, marked[1])
        why = "accelerators"
    if source == target:
        return None, "identical"
    return (source, target), why


def tokenize(text):
    """Words and punctuation characters; a punctuation token carries :data:`JOINER` on the side
    where it touches its neighbour (two words always have a space between them)."""
    tokens, end = [], None
    for m in _TOKEN.finditer(text):
        token = m.group()
        if m.start() == end:  # written against the previous token
            if m.group(1):  # a word: the previous token is punctuation
                tokens[-1] += JOINER
            else:
                token = JOINER + token
        tokens.append(token)
        end = m.end()
    return tokens


def detokenize(line):
    """The text :func:`tokenize` made ``line`` (tokens separated by spaces) from."""
    return line.replace(" " + JOINER, "").replace(JOINER + " ", "")


# ------------------------------------------------------------------------------- the corpus


def read_pairs(catalogs):
    """Cleaned pairs of every catalog, deduplicated; ``(pairs, stats)``.

    ``pairs`` is a sorted list of ``(source, target)``, one target per source.
    """
    support = defaultdict(Counter)  # source -> target -> catalogs having the pair
    used, corrupt, dropped, with_accelerators = {}, {}, Counter(), []
    entries = accelerators = 0
    for path in catalogs:
        try:
            messages = read_mo(path)
        except (CorruptCatalog, OSError) as e:
            logger.warning(f"skipping {path}: {e}")
            corrupt[str(path)] = str(e)
            continue
        messages = [pair for pair in (message_pair(*m) for m in messages) if pair]
        entries += len(messages)
        accelerated = uses_accelerators(messages)
        pairs = set()
        for message in messages:
            pair, why = clean_pair(*message, accelerated)
            if pair is None:
                dropped[why] += 1
                continue
            accelerators += why == "accelerators"
            pairs.add(pair)
        used[str(path)] = len(pairs)
        if accelerated:
            with_accelerators.append(str(path))
        for source, target in pairs:
            support[source][target] += 1
    if not used:
        reasons = "; ".join(f"{p}: {e}" for p, e in corrupt.items())
        raise DataError(f"every catalog is unreadable ({reasons}); reinstall the packages that "
                        "own them (dpkg -S FILE names the package)")
    distinct = sum(map(len, support.values()))
    pairs = sorted((source, min(targets, key=lambda t: (-targets[t], t)))
                   for source, targets in support.items())
    stats = {"catalogs_used": used, "catalogs_corrupt": corrupt, "entries": entries,
             "dropped": dict(sorted(dropped.items())), "accelerators_stripped": accelerators,
             "catalogs_with_accelerators": with_accelerators,
             "distinct_pairs": distinct, "pairs": len(pairs),
             "sources_with_several_targets": sum(len(t) > 1 for t in support.values())}
    return pairs, stats


def length_buckets(n):
    """The test buckets' ``(low, high]`` source lengths for training length ``n``."""
    return [(n // 2, n), (n, 2 * n), (2 * n, 4 * n), (4 * n, 8 * n)]


def bucket_of(length, buckets):
    """The 1-based bucket of a source length, 0 for none (at most N/2 or over 8N)."""
    return next((b for b, (low, high) in enumerate(buckets, 1) if low < length <= high), 0)


def split_by_length(pairs, n, per_bucket, valid_per_bucket, seed, skip_per_bucket=0):
    """``{split: [(source tokens, target tokens), ...]}`` with splits train, test1-4 and
    valid1-4 (the validation buckets, the same source lengths as test1-4).

    ``pairs`` are tokenized and in a fixed order; the result depends only on them and ``seed``.
    The first ``skip_per_bucket`` pairs of each bucket in the shuffled order go nowhere (an
    earlier build's test and validation pairs, with its seed); the test buckets take the next
    ``per_bucket``, the validation buckets the next ``valid_per_bucket``, training the rest of
    at most ``n``.
    """
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    buckets = length_buckets(n)
    splits = {f"{kind}{b}": [] for kind in ("test", "valid")
              for b in range(1, len(buckets) + 1)}
    train, skipped = [], Counter()
    for pair in pairs:
        length = len(pair[0])
        b = bucket_of(length, buckets)
        if b and skipped[b] < skip_per_bucket:
            skipped[b] += 1
        elif b and len(splits[f"test{b}"]) < per_bucket:
            splits[f"test{b}"].append(pair)
        elif b and len(splits[f"valid{b}"]) < valid_per_bucket:
            splits[f"valid{b}"].append(pair)
        elif length <= n:
            train.append(pair)
    splits["train"] = train
    return splits


def write_text(folder, name, lang, pairs):
    for side, suffix in ((0, lang), (1, TARGET_LANG)):
        with open(folder / f"{name}.{suffix}", "w", encoding="utf-8") as f:
            f.writelines(" ".join(pair[side]) + "\n" for pair in pairs)


# long: the corpus build's steps in order (read catalogues, bucket, split, write, stats)
def _check_counts(per_bucket, valid_per_bucket, skip_per_bucket, min_per_bucket):
    """The bucket sizes asked for: counts, and test buckets no smaller than what a bucket needs
    to be kept (else none could pass; the corpus's own thin buckets are found after the
    split)."""
    if min(per_bucket, valid_per_bucket, skip_per_bucket) < 0:
        raise DataError("--per-bucket, --valid-per-bucket and --skip-per-bucket count pairs: "
                        "give 0 or more")
    least = max(1, min_per_bucket)
    if per_bucket < 1:
        raise DataError(f"--per-bucket {per_bucket}: a test bucket needs at least 1 pair (and "
                        f"--min-per-bucket {min_per_bucket} to be kept): give --per-bucket "
                        f"{least} or more")
    if per_bucket < least:
        raise DataError(f"--per-bucket {per_bucket} is below --min-per-bucket {min_per_bucket}, "
                        f"which every test bucket needs to be kept: give --per-bucket {least} "
                        f"or more, or lower --min-per-bucket")


def _check_split(splits, buckets, n, min_per_bucket, valid_per_bucket):
    """The corpus's thin buckets (fewer than ``min_per_bucket`` pairs), and a training split
    left empty."""
    for kind in ("test", "valid") if valid_per_bucket else ("test",):
        thin = [f"({low},{high}] has {len(splits[f'{kind}{b}'])}"
                for b, (low, high) in enumerate(buckets, 1)
                if len(splits[f"{kind}{b}"]) < min_per_bucket]
        if thin:
            raise DataError(
                f"too few pairs for the {kind} buckets of --N {n}: {', '.join(thin)} pairs, "
                f"fewer than --min-per-bucket {min_per_bucket}; lower --N (long messages are "
                f"rare), --min-per-bucket or --{'valid-' if kind == 'valid' else ''}per-bucket, "
                f"or choose a --lang with more catalogs"
            )
    if len(splits["train"]) < 1:
        raise DataError(f"no pair of at most --N {n} source tokens left for training: raise "
                        "--N or lower --per-bucket/--valid-per-bucket")


def build(lang, out, locale_dirs=None, n=16, per_bucket=200, valid_per_bucket=None,
          min_per_bucket=20, seed=1, nwords=None, workers=1, force=False, skip_per_bucket=0):
    """Build the corpus of ``lang`` into ``out``; returns its stats (as in stats.json).
    ``valid_per_bucket``: pairs of each validation bucket (default ``per_bucket``; 0: no
    validation buckets, no ``valid`` files: train with ``--disable-validation``); ``skip_per_bucket``: as in
    :func:`split_by_length`."""
    valid_per_bucket = per_bucket if valid_per_bucket is None else valid_per_bucket
    _check_counts(per_bucket, valid_per_bucket, skip_per_bucket, min_per_bucket)
    if lang == TARGET_LANG:
        raise DataError(f"--lang {lang} is the language of the msgids (the target side): "
                        "give the language of the translations, e.g. --lang fr")
    if n < 2:
        raise DataError(f"--N {n}: the training length must be at least 2 tokens")
    out = Path(out)
    if out.is_dir() and not force:  # a file is refused below, once the catalogs are known
        raise DataError(f"{out} already exists: pass --force to replace it, or choose another --out")
    locale_dirs = [str(d) for d in locale_dirs] if locale_dirs else \
        [d for d in SYSTEM_LOCALE_DIRS if Path(d).is_dir()]
    catalogs, name_lists = find_catalogs(lang, locale_dirs)
    inputs = catalogs + name_lists  # --force must not delete the catalogs it reads
    refuse_existing(out, force, inputs)
    pairs, stats = read_pairs(catalogs)
    tokenized = [(tokenize(s), tokenize(t)) for s, t in pairs]
    splits = split_by_length(tokenized, n, per_bucket, valid_per_bucket, seed, skip_per_bucket)

    buckets = length_buckets(n)
    available = Counter(bucket_of(len(s), buckets) for s, _ in tokenized)
    _check_split(splits, buckets, n, min_per_bucket, valid_per_bucket)

    train = splits["train"]
    source_tokens = sum(len(s) for s, _ in train)
    target_tokens = sum(len(t) for _, t in train)
    tests = [f"test{b}" for b in range(1, len(buckets) + 1)]
    valids = [f"valid{b}" for b in range(1, len(buckets) + 1)]
    stats.update({
        "lang": lang, "target_lang": TARGET_LANG, "locale_dirs": locale_dirs,
        "catalogs_name_lists_skipped": [str(p) for p in name_lists],
        "N": n, "per_bucket": per_bucket, "valid_per_bucket": valid_per_bucket, "seed": seed,
        "skip_per_bucket": skip_per_bucket,
        "tokenizer": f"words and punctuation characters, joiner {JOINER!r} (reversible)",
        "splits": {"train": len(train), "valid": sum(len(splits[name]) for name in valids),
                   **{name: len(splits[name]) for name in tests}},
        "buckets": {name: {"source_tokens": list(buckets[b]),
                           "pairs": len(splits[name]), "available": available[b + 1]}
                    for b, name in enumerate(tests)},
        "valid_buckets": {name: {"source_tokens": list(buckets[b]), "pairs": len(splits[name])}
                          for b, name in enumerate(valids)},
        "longer_than_8N_unused": sum(len(s) > 8 * n for s, _ in tokenized),
        "length_ratio": source_tokens / target_tokens,
        "mean_pair_length_ratio": sum(len(s) / len(t) for s, t in train) / len(train),
        "mean_train_source_length": source_tokens / len(train),
        "mean_train_target_length": target_tokens / len(train),
    })
    stats["splits"]["test"] = sum(stats["splits"][name] for name in tests)

    with atomic_directory(out, force, inputs) as tmp:
        for name in ["train"] + tests:
            write_text(tmp, name, lang, splits[name])
        written = (("test", tests), ("valid", valids)) if valid_per_bucket else (("test", tests),)
        for split, names in written:
            write_text(tmp, split, lang, [pair for name in names for pair in splits[name]])
            with open(tmp / f"{split}.bucket", "w") as f:
                f.writelines(f"({low},{high}]\n" for name, (low, high) in zip(names, buckets)
                             for _ in splits[name])
        binaries = tmp / "bin"
        prepare(binaries, lang, TARGET_LANG, tmp / "train",
                tmp / "valid" if valid_per_bucket else None,
                [tmp / "test"] + [tmp / name for name in tests], joined_dictionary=True,
                workers=workers, nwords=nwords)
        (binaries / "pairs.json").unlink()  # names the temporary folder; stats.json says more
        for path in binaries.iterdir():  # one folder: the text beside fairseq's binaries
            path.rename(tmp / path.name)
        binaries.rmdir()
        save_json(tmp / "stats.json", stats)
    return stats


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_alibi.preprocess.gettext", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lang", required=True,
                        help="language of the translations (the source side), e.g. fr, de, pt_BR")
    parser.add_argument("--out", required=True, help="output folder (fairseq's data-bin)")
    parser.add_argument("--locale-dir", action="append", metavar="DIR",
                        help="a folder of <lang>/LC_MESSAGES/*.mo (repeatable); default: "
                        + ", ".join(SYSTEM_LOCALE_DIRS) + " (those that exist)")
    parser.add_argument("--N", type=int, default=16, dest="n",
                        help="training length: training pairs have at most N source tokens; test "
                        "buckets (N/2,N], (N,2N], (2N,4N], (4N,8N] (default 16)")
    parser.add_argument("--per-bucket", type=int, default=200,
                        help="test pairs per bucket, at most (default 200)")
    parser.add_argument("--min-per-bucket", type=int, default=20,
                        help="fewer pairs than this in a bucket is an error (default 20)")
    parser.add_argument("--valid-per-bucket", type=int, default=None,
                        help="validation pairs per bucket, the same buckets as the test's and "
                        "disjoint from them and from training (default: --per-bucket)")
    parser.add_argument("--skip-per-bucket", type=int, default=0, metavar="M",
                        help="leave each bucket's first M pairs of the shuffled order out of "
                        "every split: with an earlier build's --seed and M = its --per-bucket + "
                        "--valid-per-bucket, a test disjoint from its test and validation "
                        "(default 0)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the split (default 1)")
    parser.add_argument("--nwords", type=int, metavar="N",
                        help="keep the N most frequent tokens in the joined dictionary (the rest "
                        "is <unk>); default: every token of the training text")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--force", "--overwrite", action="store_true",
                        help="replace an existing --out (--overwrite, as the other pipelines)")
    args = parser.parse_args(argv)
    stats = build(args.lang, args.out, args.locale_dir, args.n, args.per_bucket,
                  args.valid_per_bucket, args.min_per_bucket, args.seed, args.nwords, args.workers,
                  args.force, args.skip_per_bucket)
    print(f"{len(stats['catalogs_used'])} catalogs read, {len(stats['catalogs_corrupt'])} "
          f"unreadable, {len(stats['catalogs_name_lists_skipped'])} name lists skipped; "
          f"{stats['entries']} translated entries, {stats['pairs']} pairs after cleaning and "
          f"deduplication")
    for name, count in stats["splits"].items():
        bucket = stats["buckets"].get(name)
        where = f"  source tokens ({bucket['source_tokens'][0]},{bucket['source_tokens'][1]}], " \
                f"{bucket['available']} available" if bucket else ""
        if name == "valid":
            where = "  the test's buckets: " + ", ".join(
                str(v["pairs"]) for v in stats["valid_buckets"].values())
        print(f"{name:>6}: {count:6d} pairs{where}")
    print(f"length ratio r = {stats['length_ratio']:.4f} source tokens per target token on train; "
          f"mean training source length {stats['mean_train_source_length']:.2f} tokens")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
