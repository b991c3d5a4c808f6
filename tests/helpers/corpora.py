"""Tiny inputs in the real formats of the public corpora (a word-level corpus, GPT-2 BPE files,
WikiText, Pile shards, GLUE folders), written by the tests themselves."""

import json
import random
from pathlib import Path


def write_tiny_corpus(folder: Path, seed=0, vocab=60, lines=(400, 60, 60), max_len=30):
    """Random-word text files train/valid/test.txt (word level), written by the test itself."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines):
        with open(folder / f"{split}.txt", "w") as f:
            for _ in range(n):
                f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, max_len))) + "\n")
    return folder


WORDS = ("the cat sat on a mat and then the dog ran in at her , . where is it "
         "café über naïve 東京 zebra quantum").split()


MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("a", "t"), ("Ġ", "c"), ("Ġc", "at"),
          ("i", "n"), ("Ġ", "a"), ("o", "n"), ("e", "r")]


PILE_SETS = ("Pile-CC", "Wikipedia (en)", "Github")


def write_tiny_bpe(folder):
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    byte_symbols = bytes_to_unicode()
    symbols = [byte_symbols[b] for b in range(256)] + [a + b for a, b in MERGES]
    (folder / "encoder.json").write_text(json.dumps({s: i for i, s in enumerate(symbols)}))
    (folder / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    return folder


def sentence(rng, low=3, high=20):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def write_wikitext(folder, seed=0, paragraphs=(60, 12, 12)):
    """WikiText's layout: `` = Heading = `` lines, blank lines, paragraphs with ``<unk>``."""
    rng = random.Random(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), paragraphs):
        lines = []
        for i in range(n):
            if i % 6 == 0:
                lines += [" \n", f" = {sentence(rng, 1, 3)} = \n", " \n"]
            words = sentence(rng, 5, 40).split()
            words[rng.randrange(len(words))] = "<unk>"
            lines.append(" " + " ".join(words) + " \n")
        (folder / f"wiki.{split}.tokens").write_text("".join(lines), encoding="utf-8")
    return folder


def write_wikitext_raw(tokens, folder):
    """The raw layout (``wiki.<split>.raw``, what the GPT-2 pipeline reads) of the WikiText
    folder ``tokens`` (:func:`write_wikitext`), the same text."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(tokens).iterdir():
        (folder / f.name.replace(".tokens", ".raw")).write_bytes(f.read_bytes())
    return folder


def pile_documents(n, seed=0, max_sentences=12):
    """Documents of a few lines each (paragraphs), spread over three Pile subsets."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        text = "\n".join(sentence(rng) for _ in range(rng.randint(1, max_sentences)))
        docs.append({"text": text, "meta": {"pile_set_name": rng.choice(PILE_SETS)}})
    return docs


def write_pile_shard(path, documents, extra_lines=(), frames=1):
    """A ``.jsonl`` or (by suffix) ``.jsonl.zst`` shard; ``extra_lines`` are appended raw.

    A ``.zst`` shard is ``frames`` zstd frames one after the other (what concatenating
    compressed files, or a multi-threaded compressor, gives).
    """
    path = Path(path)
    lines = [json.dumps(d) + "\n" for d in documents] + list(extra_lines)
    if path.suffix == ".zst":
        import zstandard

        step = -(-len(lines) // frames)
        path.write_bytes(b"".join(
            zstandard.ZstdCompressor(level=3).compress("".join(lines[i: i + step]).encode())
            for i in range(0, len(lines), step)
        ))
    else:
        path.write_text("".join(lines), encoding="utf-8")
    return path


def _glue_single(s, rng, rows, make_row, header, labelled=None):
    """A single-sentence task's train/dev (``make_row(x, y)``, ``header`` or None; their
    sentences ``labelled()``, else ``s()``) and test (sentences ``s()``)."""
    expected, files = {}, {}
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [((labelled or s)(), rng.choice("01")) for _ in range(rows)]
        files[name] = (header, [make_row(x, y) for x, y in data])
        expected[split] = {"inputs": [[x for x, _ in data]], "labels": [y for _, y in data]}
    test = [s() for _ in range(rows // 2)]
    files["test"] = ("index\tsentence", [f"{i}\t{x}" for i, x in enumerate(test)])
    expected["test"] = {"inputs": [test], "labels": None}
    return files, expected


def _pairs(data):
    return {"inputs": [[row[0] for row in data], [row[1] for row in data]],
            "labels": [row[2] for row in data] if data and len(data[0]) > 2 else None}


def _glue_mrpc(s, rng, rows):
    # Quality, #1 ID, #2 ID, #1 String, #2 String (test: index first)
    expected, files = {}, {}
    head = "#1 ID\t#2 ID\t#1 String\t#2 String"
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s(), s(), rng.choice("01")) for _ in range(rows)]
        files[name] = ("Quality\t" + head, [f"{y}\t{100 + i}\t{200 + i}\t{a}\t{b}"
                                            for i, (a, b, y) in enumerate(data)])
        expected[split] = _pairs(data)
    data = [(s(), s()) for _ in range(rows // 2)]
    files["test"] = ("index\t" + head, [f"{i}\t1\t2\t{a}\t{b}" for i, (a, b) in enumerate(data)])
    expected["test"] = _pairs(data)
    return files, expected


def _glue_stsb(s, rng, rows):
    # 7 metadata columns, sentence1, sentence2, score (test: no score)
    expected, files = {}, {}
    meta = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s(), s(), rng.choice(["0.000", "1.500", "3.800", "4.750", "5.000"]))
                for _ in range(rows)]
        files[name] = (meta + "\tscore", [f"{i}\tmain\tMSRvid\t2012\t{i:04d}\tnone\tnone\t"
                                          f"{a}\t{b}\t{y}" for i, (a, b, y) in enumerate(data)])
        expected[split] = _pairs([(a, b, float(y) / 5.0) for a, b, y in data])
    data = [(s(), s()) for _ in range(rows // 2)]
    files["test"] = (meta, [f"{i}\tmain\tMSRvid\t2012\t{i:04d}\tnone\tnone\t{a}\t{b}"
                            for i, (a, b) in enumerate(data)])
    expected["test"] = _pairs(data)
    return files, expected


def _glue_qqp(s, rng, rows):
    # id, qid1, qid2, question1, question2, is_duplicate (test: id, q1, q2)
    expected, files = {}, {}
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s(), s(), rng.choice("01")) for _ in range(rows)]
        files[name] = ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                       [f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{y}"
                        for i, (a, b, y) in enumerate(data)])
        expected[split] = _pairs(data)
    data = [(s(), s()) for _ in range(rows // 2)]
    files["test"] = ("id\tquestion1\tquestion2",
                     [f"{i}\t{a}\t{b}" for i, (a, b) in enumerate(data)])
    expected["test"] = _pairs(data)
    return files, expected


def _glue_mnli(s, rng, rows):
    # 8 metadata/parse columns, sentence1, sentence2, then label1 (+ label2-5 in dev) and
    # gold_label last; label1 disagrees with gold_label now and then
    nli = ("contradiction", "entailment", "neutral")
    lead = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
            "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")
    expected, files = {}, {}
    for name, split, votes in (("train", "train", 1), ("dev_matched", "valid", 5),
                               ("dev_mismatched", "valid1", 5)):
        data = [(s(), s(), rng.choice(nli), rng.choice(nli)) for _ in range(rows)]
        labels = "\t".join(f"label{k + 1}" for k in range(votes))
        files[name] = (f"{lead}\t{labels}\tgold_label",
                       [f"{i}\t{i}\t{i}n\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t{a}\t{b}\t"
                        + "\t".join([first] + [gold] * (votes - 1)) + f"\t{gold}"
                        for i, (a, b, first, gold) in enumerate(data)])
        expected[split] = _pairs([(a, b, gold) for a, b, _, gold in data])
    for name, split in (("test_matched", "test"), ("test_mismatched", "test1")):
        data = [(s(), s()) for _ in range(rows // 2)]
        files[name] = (lead, [f"{i}\t{i}\t{i}n\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t{a}\t{b}"
                              for i, (a, b) in enumerate(data)])
        expected[split] = _pairs(data)
    return files, expected


def _glue_entailment(s, rng, rows, header):
    # QNLI and RTE: index, two texts, label (test: no label)
    expected, files = {}, {}
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s(), s(), rng.choice(("entailment", "not_entailment"))) for _ in range(rows)]
        files[name] = (header + "\tlabel",
                       [f"{i}\t{a}\t{b}\t{y}" for i, (a, b, y) in enumerate(data)])
        expected[split] = _pairs(data)
    data = [(s(), s()) for _ in range(rows // 2)]
    files["test"] = (header, [f"{i}\t{a}\t{b}" for i, (a, b) in enumerate(data)])
    expected["test"] = _pairs(data)
    return files, expected


def write_glue(root, seed=0, rows=24):
    """Every GLUE task in the download script's layout; returns what each split should hold.

    The result maps task -> fairseq split -> ``{"inputs": [[...], ...], "labels": [...]}``.
    """
    rng = random.Random(seed)
    root = Path(root)

    def s():
        return sentence(rng)

    tasks = {  # in this order: they draw from one generator
        # CoLA: source, label, original label (often empty), sentence; train/dev: no header
        "CoLA": lambda: _glue_single(s, rng, rows, lambda x, y: f"gj04\t{y}\t"
                                     f"{'*' if y == '0' else ''}\t{x}", None),
        # SST-2: sentence (with GLUE's trailing space), label
        "SST-2": lambda: _glue_single(s, rng, rows, lambda x, y: f"{x}\t{y}",
                                      "sentence\tlabel", labelled=lambda: s() + " "),
        "MRPC": lambda: _glue_mrpc(s, rng, rows),
        "STS-B": lambda: _glue_stsb(s, rng, rows),
        "QQP": lambda: _glue_qqp(s, rng, rows),
        "MNLI": lambda: _glue_mnli(s, rng, rows),
        "QNLI": lambda: _glue_entailment(s, rng, rows, "index\tquestion\tsentence"),
        "RTE": lambda: _glue_entailment(s, rng, rows, "index\tsentence1\tsentence2"),
    }
    expected = {}
    for task, make in tasks.items():
        files, expected[task] = make()
        folder = root / task
        folder.mkdir(parents=True, exist_ok=True)
        for name, (header, lines) in files.items():
            text = (header + "\n" if header is not None else "") + "".join(l + "\n" for l in lines)
            (folder / f"{name}.tsv").write_text(text, encoding="utf-8")
    return expected
