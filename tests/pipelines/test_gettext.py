"""The gettext parallel corpus (fairseq_alibi.preprocess.gettext) on tiny catalogs written here.

The ``.mo`` files are written byte by byte in the MO format (no msgfmt), so every case a real
catalog has is exact: plural forms, contexts, the header, an empty translation, a big-endian
file, a corrupt one. A last test runs on this machine's French catalogs when they exist.
"""

import json
import random
import struct
from pathlib import Path

import pytest

from fairseq_alibi.preprocess import gettext as gt
from fairseq_alibi.preprocess.pipeline_io import DataError, run_cli

HEADER = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n > 1);\n"


def write_mo(path, messages, byteorder="<", header=HEADER):
    """A compiled catalog of ``[(msgid, msgstr), ...]``, sorted by msgid as msgfmt writes it."""
    items = sorted(([("", header)] if header is not None else []) + list(messages))
    items = [(i.encode("utf-8"), s.encode("utf-8")) for i, s in items]
    n = len(items)
    ids_at, strs_at = 28, 28 + 8 * n
    blob, tables = b"", {0: [], 1: []}
    for side in (0, 1):
        for item in items:
            tables[side].append((len(item[side]), strs_at + 8 * n + len(blob)))
            blob += item[side] + b"\0"
    data = struct.pack(byteorder + "7I", 0x950412DE, 0, n, ids_at, strs_at, 0, 0)
    for side in (0, 1):
        data += b"".join(struct.pack(byteorder + "2I", *entry) for entry in tables[side])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(data + blob)


WORDS = {"fichier": "file", "ouvrir": "open", "fermer": "close", "erreur": "error",
         "lecture": "read", "disque": "disk", "réseau": "network", "nom": "name",
         "valeur": "value", "ligne": "line", "page": "sheet", "clé": "key"}


def sentence_pairs(count, seed, max_words=40):
    """``count`` distinct (French, English) pairs of 1..max_words words, a word-by-word gloss."""
    rng = random.Random(seed)
    pairs = set()
    while len(pairs) < count:
        words = rng.choices(sorted(WORDS), k=rng.randint(1, max_words))
        pairs.add((" ".join(words) + " .", " ".join(WORDS[w] for w in words) + "."))
    return sorted(pairs)


@pytest.fixture
def locale(tmp_path):
    """A locale folder with French catalogs covering every case; returns its root."""
    root = tmp_path / "locale"
    messages = root / "fr" / "LC_MESSAGES"
    write_mo(messages / "gui.mo", [
        ("_File", "_Fichier"),  # a GUI catalog: accelerators on both sides are stripped
        ("Save _As", "Enregistrer _sous"),
        ("menu\x04_Open", "_Ouvrir"),  # a context, dropped from the msgid
        ("%d file\x00%d files", "%d fichier\x00%d fichiers"),  # plural: singular, form 0
        ("Untranslated", ""),  # no translation
        ("Whitespace", " \n"),
        ("Missing value", "Valeur absente"),
        ("_A and _B", "_A et _B"),  # nothing ambiguous: the same words on both sides
        ("_Cut or _Paste", "Co_uper ou C_oller"),  # two accelerators: ambiguous, dropped
        ("%s: %s", "%s\u00a0: %s"),  # no letter
        ("OK", "OK"),  # identical
    ])
    write_mo(messages / "cli.mo", [
        ("column_name", "nom_colonne"),  # no accelerators in this catalog: identifiers kept
        ("  Usage:\n\tprog  FILE\n", "Utilisation\u00a0:\n  prog   FICHIER  "),
        ("Not found", "Introuvable"),
        ("Missing value", "Valeur absente"),
    ] + sentence_pairs(300, seed=1), byteorder=">")  # a big-endian catalog
    write_mo(messages / "other.mo", [
        ("Not found", "Introuvable"),  # the same pair in two catalogs, once in the corpus
        ("Missing value", "Valeur manquante"),  # a second translation of the same English
        ("Absent value", "Valeur absente"),  # a second target for one source: the most
    ] + sentence_pairs(300, seed=2), header=None)  # catalogs win; no header: UTF-8
    write_mo(messages / "iso_639.mo", [("French", "français")])  # a name list, skipped
    (messages / "broken.mo").write_bytes(b"\x00" * 64)  # skipped with a warning
    return root


def build(locale, out, **kwargs):
    options = dict(locale_dirs=[locale], n=4, per_bucket=10, valid_per_bucket=5, min_per_bucket=3)
    options.update(kwargs)
    return gt.build("fr", out, **options)


def text(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------------------------


def test_read_mo_entries_header_plural_context(tmp_path):
    path = tmp_path / "a.mo"
    messages = [("ctx\x04Open", "Ouvrir"), ("%d file\x00%d files", "%d fichier\x00%d fichiers"),
                ("Empty", ""), ("Clé", "Schlüssel")]
    for order in "<>":
        write_mo(path, messages, byteorder=order)
        assert sorted(gt.read_mo(path)) == sorted([("", HEADER)] + messages)
    pairs = [gt.message_pair(*m) for m in gt.read_mo(path)]
    assert sorted(p for p in pairs if p) == [("%d fichier", "%d file"), ("Ouvrir", "Open"),
                                            ("Schlüssel", "Clé")]


def test_read_mo_charset_from_the_header(tmp_path):
    path = tmp_path / "latin1.mo"  # written by hand: write_mo writes UTF-8
    entries = [(b"", b"Content-Type: text/plain; charset=ISO-8859-1\n"),
               (b"Key", "Clé".encode("latin-1"))]
    blob, ids, strs = b"", [], []
    for side, table in ((0, ids), (1, strs)):
        for e in entries:
            table.append((len(e[side]), 28 + 32 + len(blob)))
            blob += e[side] + b"\0"
    data = struct.pack("<7I", 0x950412DE, 0, 2, 28, 44, 0, 0)
    data += b"".join(struct.pack("<2I", *t) for t in ids + strs) + blob
    path.write_bytes(data)
    assert gt.read_mo(path)[1] == ("Key", "Clé")


@pytest.mark.parametrize("damage", ["magic", "truncated", "short", "revision", "charset"])
def test_corrupt_catalogs_raise(tmp_path, damage):
    path = tmp_path / "bad.mo"
    write_mo(path, [("File", "Fichier")],
             header="Content-Type: text/plain; charset=NO-SUCH\n" if damage == "charset" else HEADER)
    data = path.read_bytes()
    data = {"magic": b"\x12\x34\x56\x78" + data[4:], "truncated": data[:-12], "short": data[:10],
            "revision": data[:4] + struct.pack("<I", 7 << 16) + data[8:],
            "charset": data}[damage]
    path.write_bytes(data)
    with pytest.raises(gt.CorruptCatalog):
        gt.read_mo(path)


def test_clean_pair():
    assert gt.clean_pair("  Erreur\u00a0:\n\t%s  ", "Error:\n%s\n") == (("Erreur : %s", "Error: %s"), None)
    assert gt.clean_pair("%s\u00a0: %d", "%s: %d") == (None, "format_only")
    assert gt.clean_pair("%1$-8.3lf/%(name)s", "{0} %%") == (None, "format_only")
    assert gt.clean_pair("%s\u00a0: a", "%s: a")[0] == ("%s : a", "%s: a")
    assert gt.clean_pair("OK ", "OK") == (None, "identical")
    assert gt.clean_pair("_Fichier", "_File", True) == (("Fichier", "File"), "accelerators")
    assert gt.clean_pair("&Fichier", "&File", True) == (("Fichier", "File"), "accelerators")
    assert gt.clean_pair("Enre_gistrer _sous", "Save _As", True) == (None, "ambiguous_accelerators")
    assert gt.clean_pair("_Fichier", "_File") == (("_Fichier", "_File"), None)  # not a GUI catalog
    # identifiers: the same word on both sides, between capitals, after a digit, on one side only
    assert gt.clean_pair("Définir LC_ALL", "Set LC_ALL", True)[0] == ("Définir LC_ALL", "Set LC_ALL")
    assert gt.clean_pair("Num_Fin", "KP_End", True)[0] == ("Num_Fin", "KP_End")
    assert gt.clean_pair("nom_fichier", "filename", True)[0] == ("nom_fichier", "filename")
    assert gt.clean_pair("Tom &amp; _Jerry", "Tom &amp; _Jerry2", True)[0] == ("Tom &amp; Jerry",
                                                                               "Tom &amp; Jerry2")
    assert gt.clean_pair("a\uffedb", "ab") == (None, "contains_joiner")


def test_uses_accelerators():
    assert gt.uses_accelerators([("x", "y"), ("_Fichier", "_File")])
    assert not gt.uses_accelerators([("nom_colonne", "column_name"), ("_Fichier", "File")])


@pytest.mark.parametrize("sentence", [
    "Erreur : fichier « a.txt » introuvable.", "l'homme", "%s: %d...", "(1970-01-01 UTC)",
    "Utilisez LC_ALL=C, pas «%s».", "x", "...", "a -- b -c", "naïve café ½ œ",
])
def test_tokenize_is_reversible(sentence):
    tokens = gt.tokenize(sentence)
    assert gt.detokenize(" ".join(tokens)) == sentence
    assert all(t and " " not in t for t in tokens)


def test_tokenize_marks_punctuation_on_its_joined_side():
    j = gt.JOINER
    assert gt.tokenize("Erreur : « a.txt » l'homme.") == [
        "Erreur", ":", "«", "a", f"{j}.{j}", "txt", "»", "l", f"{j}'{j}", "homme", f"{j}."]
    assert gt.tokenize("%s...") == ["%" + j, "s", j + ".", j + ".", j + "."]


def test_read_pairs_dedup_and_skips(locale, caplog):
    catalogs, name_lists = gt.find_catalogs("fr", [locale])
    assert [p.name for p in name_lists] == ["iso_639.mo"]
    assert [p.name for p in catalogs] == ["broken.mo", "cli.mo", "gui.mo", "other.mo"]
    pairs, stats = gt.read_pairs(catalogs)
    assert "broken.mo" in caplog.text and list(stats["catalogs_corrupt"]) == [str(catalogs[0])]
    found = dict(pairs)
    assert found["Fichier"] == "File" and found["Enregistrer sous"] == "Save As"
    assert found["Ouvrir"] == "Open" and found["%d fichier"] == "%d file"
    assert found["_A et _B"] == "_A and _B"
    assert found["nom_colonne"] == "column_name"
    assert found["Utilisation : prog FICHIER"] == "Usage: prog FILE"
    assert found["Introuvable"] == "Not found"
    # two targets for one source: the one of two catalogs beats the one of one
    assert found["Valeur absente"] == "Missing value"
    assert found["Valeur manquante"] == "Missing value"
    for dropped in ("OK", "", "Co_uper ou C_oller", "Couper ou Coller", "%s\u00a0: %s"):
        assert dropped not in found
    assert stats["dropped"] == {"ambiguous_accelerators": 1, "identical": 1, "format_only": 1}
    assert stats["catalogs_with_accelerators"] == [str(catalogs[2])]
    assert stats["sources_with_several_targets"] == 1
    assert len(pairs) == len(found) == stats["pairs"]
    assert sum(p == ("Introuvable", "Not found") for p in pairs) == 1
    assert pairs == sorted(pairs)


def test_build_splits_by_source_length(locale, tmp_path):
    out = tmp_path / "out"
    stats = build(locale, out)
    n = 4
    buckets = {"test1": (2, 4), "test2": (4, 8), "test3": (8, 16), "test4": (16, 32)}
    lengths = {split: [len(line.split()) for line in text(out / f"{split}.fr")]
               for split in ["train", "valid", *buckets]}
    assert lengths["train"] and max(lengths["train"]) <= n
    for name, (low, high) in buckets.items():
        assert len(lengths[name]) == 10 and all(low < k <= high for k in lengths[name]), name
        assert stats["buckets"][name]["pairs"] == 10
    assert stats["splits"] == {"train": len(lengths["train"]), "valid": 20, "test": 40,
                               **{name: 10 for name in buckets}}
    # the test file is the buckets in order, and test.bucket says which
    for lang in ("fr", "en"):
        assert text(out / f"test.{lang}") == sum((text(out / f"{b}.{lang}") for b in buckets), [])
    assert text(out / "test.bucket") == [f"({lo},{hi}]" for lo, hi in buckets.values() for _ in range(10)]
    # the validation split: the same buckets, 5 pairs each, in order, valid.bucket says which
    want = [f"({lo},{hi}]" for lo, hi in buckets.values() for _ in range(5)]
    assert text(out / "valid.bucket") == want
    assert all(lo < k <= hi for k, (lo, hi) in zip(lengths["valid"], [
        tuple(map(int, b.strip("(]").split(","))) for b in want]))
    assert [v["pairs"] for v in stats["valid_buckets"].values()] == [5, 5, 5, 5]
    assert not list(out.glob("valid[0-9]*"))  # fairseq-train refuses unread valid1, valid2...
    # no pair twice, no test or validation source in training
    sources = {split: text(out / f"{split}.fr") for split in ["train", "valid", *buckets]}
    everything = sum(sources.values(), [])
    assert len(everything) == len(set(everything))
    for split in ("fr", "en"):
        assert len(text(out / f"train.{split}")) == stats["splits"]["train"]
    train = list(zip(text(out / "train.fr"), text(out / "train.en")))
    ratio = sum(len(s.split()) for s, _ in train) / sum(len(t.split()) for _, t in train)
    assert stats["length_ratio"] == pytest.approx(ratio)
    assert stats["mean_train_source_length"] == pytest.approx(
        sum(len(s.split()) for s, _ in train) / len(train))
    assert json.loads((out / "stats.json").read_text()) == stats
    assert "Fichier" in sources["train"]  # 1 token: never a test or validation pair
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []


def test_validation_buckets_leave_the_test_pairs_and_thin_ones_are_refused(locale, tmp_path):
    pairs, _ = gt.read_pairs(gt.find_catalogs("fr", [locale])[0])
    tokenized = [(gt.tokenize(s), gt.tokenize(t)) for s, t in pairs]
    without = gt.split_by_length(tokenized, 4, 10, 0, seed=2)
    with_valid = gt.split_by_length(tokenized, 4, 10, 5, seed=2)
    for b in range(1, 5):
        assert with_valid[f"test{b}"] == without[f"test{b}"]
        assert without[f"valid{b}"] == [] and len(with_valid[f"valid{b}"]) == 5
    # the in-range validation pairs are the only ones training loses
    assert sorted(without["train"]) == sorted(with_valid["train"] + with_valid["valid1"])
    # (2,4] has about 35 pairs: 30 for the test, too few left for validation
    with pytest.raises(DataError, match=r"too few pairs for the valid buckets of --N 4: \(2,4\] "
                                        r"has \d+ pairs, fewer than --min-per-bucket 30"):
        build(locale, tmp_path / "x", per_bucket=30, valid_per_bucket=30, min_per_bucket=30)


def test_build_is_deterministic(locale, tmp_path):
    build(locale, tmp_path / "a", seed=3)
    build(locale, tmp_path / "b", seed=3)
    build(locale, tmp_path / "c", seed=4)
    for name in ("train.fr", "train.en", "valid.fr", "test.fr", "test.en", "dict.fr.txt",
                 "train.fr-en.fr.bin", "test.fr-en.en.bin", "stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert text(tmp_path / "a" / "test.fr") != text(tmp_path / "c" / "test.fr")


def test_binaries_load_in_fairseq(locale, tmp_path):
    from fairseq.data import Dictionary, data_utils
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    out = tmp_path / "out"
    build(locale, out)
    assert (out / "dict.fr.txt").read_text() == (out / "dict.en.txt").read_text()  # joined
    task = TranslationTask.setup_task(TranslationConfig(
        data=str(out), source_lang="fr", target_lang="en", dataset_impl="mmap"))
    def as_read(line, dictionary):  # a word the training text lacks is <unk>
        return " ".join(w if dictionary.index(w) != dictionary.unk() else "<unk>"
                        for w in line.split())

    for split in ("train", "valid", "test", "test1", "test2", "test3", "test4"):
        task.load_dataset(split)
        dataset = task.dataset(split)
        sources, targets = text(out / f"{split}.fr"), text(out / f"{split}.en")
        assert len(dataset) == len(sources)
        for i in (0, len(sources) - 1):
            assert task.src_dict.string(dataset[i]["source"]) == as_read(sources[i], task.src_dict)
            assert task.tgt_dict.string(dataset[i]["target"]) == as_read(targets[i], task.tgt_dict)
    dictionary = Dictionary.load(str(out / "dict.fr.txt"))
    test4 = data_utils.load_indexed_dataset(str(out / "test4.fr-en.en"), dictionary)
    assert [dictionary.string(test4[i]) for i in range(len(test4))] == [
        as_read(line, dictionary) for line in text(out / "test4.en")]
    assert any("<unk>" not in as_read(line, dictionary) for line in text(out / "test4.en"))


def test_an_interrupted_build_leaves_nothing(locale, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gt, "prepare", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(locale, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locale"]


def test_errors(locale, tmp_path, capsys):
    with pytest.raises(DataError, match=r"no gettext catalog \(\*\.mo\) for --lang de in .*de/"
                                        r"LC_MESSAGES: install .*apt-get install .*fr \(5\)"):
        gt.build("de", tmp_path / "x", [locale])
    iso_only = tmp_path / "iso"
    write_mo(iso_only / "es" / "LC_MESSAGES" / "iso_3166.mo", [("France", "Francia")])
    with pytest.raises(DataError, match=r"only name lists \(iso_3166.mo\) for --lang es"):
        gt.build("es", tmp_path / "x", [iso_only])
    broken = tmp_path / "broken"
    for name in ("a.mo", "b.mo"):
        (broken / "it" / "LC_MESSAGES").mkdir(parents=True, exist_ok=True)
        (broken / "it" / "LC_MESSAGES" / name).write_bytes(b"not a catalog")
    with pytest.raises(DataError, match=r"every catalog is unreadable .*a\.mo.*b\.mo"):
        gt.build("it", tmp_path / "x", [broken])
    with pytest.raises(DataError, match=r"too few pairs for the test buckets of --N 4: "
                                        r"\(2,4\] has \d+, \(4,8\] has \d+, \(8,16\] has \d+ pairs, "
                                        r"fewer than --min-per-bucket 200; lower --N"):
        build(locale, tmp_path / "x", min_per_bucket=200, per_bucket=200)
    with pytest.raises(DataError, match="--lang en is the language of the msgids"):
        gt.build("en", tmp_path / "x", [locale])
    assert not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []

    out = tmp_path / "out"
    out.mkdir()
    argv = ["--lang", "fr", "--out", str(out), "--locale-dir", str(locale), "--N", "4",
            "--per-bucket", "10", "--valid-per-bucket", "5", "--min-per-bucket", "3"]
    assert run_cli(gt.main, argv) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == f"error: {out} already exists: pass --force to replace it, or choose another --out"
    assert run_cli(gt.main, argv + ["--force"]) == 0
    assert "test4:     10 pairs" in capsys.readouterr().out and (out / "stats.json").is_file()
    assert run_cli(gt.main, argv + ["--overwrite"]) == 0  # as the other pipelines name it
    assert "test4:     10 pairs" in capsys.readouterr().out


def test_out_never_deletes_a_catalog_and_a_file_is_one_line(locale, tmp_path, capsys):
    """``--out`` the catalogs' folder with ``--force`` deleted the catalogs the run had read; a
    file as ``--out`` with ``--force`` was a FileExistsError traceback."""
    argv = ["--lang", "fr", "--locale-dir", str(locale), "--N", "4", "--per-bucket", "10",
            "--valid-per-bucket", "5", "--min-per-bucket", "3"]
    catalogs = sorted(locale.rglob("*.mo"))
    before = [p.read_bytes() for p in catalogs]
    for out in (locale, locale / "fr" / "LC_MESSAGES", catalogs[0]):
        assert run_cli(gt.main, argv + ["--out", str(out), "--force"]) == 1
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith(f"error: the destination {out} ") and \
            "the input" in error and error.endswith("write the output somewhere else (a new "
                                                    "or empty folder outside the inputs)")
    assert [p.read_bytes() for p in catalogs] == before
    plain = tmp_path / "notes.txt"
    plain.write_text("not a folder")
    for force in ([], ["--force"]):
        assert run_cli(gt.main, argv + ["--out", str(plain)] + force) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().splitlines()[-1] == \
            f"error: {plain} exists and is not a folder: give the destination a new or empty folder"
    assert plain.read_text() == "not a folder"


def test_help_names_the_skipped_catalogs(capsys):
    with pytest.raises(SystemExit):
        gt.main(["--help"])
    help_text = capsys.readouterr().out
    assert "iso_*" in help_text and "xkeyboard-config" in help_text
    assert "/usr/share/locale," in help_text and gt.JOINER in help_text


FRENCH = Path("/usr/share/locale/fr/LC_MESSAGES")


@pytest.mark.skipif(not list(FRENCH.glob("*.mo")), reason="no French gettext catalogs installed")
def test_real_french_catalogs():
    """This machine's catalogs, parsed, cleaned and split (numbers in docs/configs_and_data.md)."""
    catalogs, name_lists = gt.find_catalogs("fr", [FRENCH.parent.parent])
    assert all(p.name.startswith(("iso_", "xkeyboard-config")) for p in name_lists)
    pairs, stats = gt.read_pairs(catalogs)
    tokenized = [(gt.tokenize(s), gt.tokenize(t)) for s, t in pairs]
    assert all(gt.detokenize(" ".join(s)) == p[0] for (s, _), p in zip(tokenized, pairs))
    splits = gt.split_by_length(tokenized, 16, 100, 100, seed=1)
    assert all(len(s) <= 16 for s, _ in splits["train"])
    if len(catalogs) >= 50:  # a machine like this one: enough for the experiment
        assert len(splits["train"]) > 5000
        assert all(len(splits[f"{kind}{b}"]) == 100 for b in range(1, 5)
                   for kind in ("test", "valid"))


def test_a_second_test_split_skips_an_earlier_builds_test_and_validation(locale, tmp_path):
    """``--skip-per-bucket``: with the seed of an earlier build and M = its test + validation
    pairs a bucket, a new test split disjoint from both (their pairs in no split of it);
    ``--valid-per-bucket 0``: no validation split at all (nothing for fairseq to load)."""
    pairs, _ = gt.read_pairs(gt.find_catalogs("fr", [locale])[0])
    tokenized = [(gt.tokenize(s), gt.tokenize(t)) for s, t in pairs]
    as_set = lambda split: {(tuple(s), tuple(t)) for s, t in split}  # noqa: E731
    first = gt.split_by_length(tokenized, 4, 3, 2, seed=2)
    second = gt.split_by_length(tokenized, 4, 6, 0, seed=2, skip_per_bucket=5)
    held = set().union(*(as_set(first[f"{kind}{b}"]) for kind in ("test", "valid")
                         for b in range(1, 5)))
    for b in range(1, 5):
        assert len(first[f"test{b}"]) == 3 and len(first[f"valid{b}"]) == 2
        assert second[f"test{b}"] and not as_set(second[f"test{b}"]) & held
        assert second[f"valid{b}"] == []
    assert not as_set(second["train"]) & held  # skipped: not trained on either
    in_range = as_set(first["train"]) - as_set(second["test1"])
    assert in_range == as_set(second["train"])  # training loses the new in-range test only
    stats = build(locale, tmp_path / "second", per_bucket=6, valid_per_bucket=0,
                  skip_per_bucket=5, min_per_bucket=1, seed=2)
    assert stats["skip_per_bucket"] == 5 and stats["splits"]["valid"] == 0
    assert not list((tmp_path / "second").glob("valid*"))
    with pytest.raises(DataError, match="give 0 or more"):
        build(locale, tmp_path / "x", skip_per_bucket=-1)


@pytest.mark.parametrize("counts,error", [
    (dict(per_bucket=0), r"^--per-bucket 0: a test bucket needs at least 1 pair \(and "
                         r"--min-per-bucket 3 to be kept\): give --per-bucket 3 or more$"),
    (dict(per_bucket=2), r"^--per-bucket 2 is below --min-per-bucket 3, .*give --per-bucket 3 "
                         r"or more, or lower --min-per-bucket$"),
])
def test_bucket_sizes_no_bucket_could_pass_are_refused_first(locale, tmp_path, counts, error):
    """Not the corpus's thin buckets ("has 0 pairs ... lower --per-bucket"): the flag asked."""
    with pytest.raises(DataError, match=error):
        build(locale, tmp_path / "x", min_per_bucket=3, **counts)
    assert not (tmp_path / "x").exists()
