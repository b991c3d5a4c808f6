"""Where the pipelines write: every destination of a run checked before anything is written, never
over one of its inputs, a file given as a destination refused in one line, a re-run that adds
what is missing (``--skip-existing``, what ``examples/*/prepare.sh`` pass); and a ``--dict`` of
another tokenization refused rather than binarized into ``<unk>``."""

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fairseq_alibi import files
from fairseq_alibi.preprocess import glue, parallel, pile, wikitext
from fairseq_alibi.preprocess.encoders import Gpt2BpeEncoder, dictionary_from_counts
from fairseq_alibi.preprocess.pipeline_io import DataError, run_cli
from tests.helpers import corpora
from tests.helpers.cli import REPO, SHARED_DATA


def contents(folder):
    """``{relative path: bytes}`` of every file under ``folder`` (what a run must not change)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def hidden(parent):
    """The temporary folders a run left in ``parent`` (none, ever)."""
    return sorted(p.name for p in Path(parent).iterdir() if p.name.startswith("."))


def cli(capsys, main, *args):
    """``run_cli(main, argv)``, as ``python -m`` runs it: ``(status, stdout, stderr)``."""
    handler = signal.getsignal(signal.SIGTERM)  # run_cli sets its own: this process's back
    try:
        status = run_cli(main, [str(a) for a in args])
    finally:
        signal.signal(signal.SIGTERM, handler)
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """The tiny GPT-2 BPE, with its fairseq dict.txt (the BPE ids as symbols)."""
    folder = corpora.write_tiny_bpe(tmp_path_factory.mktemp("bpe"))
    n = len(json.loads((folder / "encoder.json").read_text()))
    (folder / "dict.txt").write_text("".join(f"{i} {n - i}\n" for i in range(n)))
    return folder


def word_dictionary(path, text_dir):
    """A word-level dict.txt (what the WikiText pipeline writes) of ``text_dir``'s training text."""
    words = (Path(text_dir) / "wiki.train.tokens").read_text(encoding="utf-8").split()
    dictionary_from_counts(Counter(words)).save(str(path))
    return path


def parallel_text(folder, pairs=20):
    folder.mkdir(parents=True)
    for split in ("train", "valid"):
        for lang in ("src", "tgt"):
            (folder / f"{split}.{lang}").write_text(
                "".join(f"{lang} {split} sentence {i}\n" for i in range(pairs)))
    return folder


# --- a refused run writes nothing ------------------------------------------------------------


def test_a_refused_restoration_run_changes_neither_folder(tmp_path, capsys, monkeypatch):
    """``--restoration-from`` writes DESTDIR and DESTDIR.text: a second run on another text
    used to replace DESTDIR.text before refusing the non-empty DESTDIR, leaving two folders
    that describe different corpora."""
    first = corpora.write_wikitext(tmp_path / "a", seed=0) / "wiki.train.tokens"
    second = corpora.write_wikitext(tmp_path / "b", seed=1, paragraphs=(30, 6, 6)) \
        / "wiki.train.tokens"
    dest, text = tmp_path / "r", tmp_path / "r.text"
    run = ["--restoration-from", first, "--destdir", dest, "--workers", 1]
    assert cli(capsys, parallel.main, *run)[0] == 0
    recorded = json.loads((dest / "pairs.json").read_text())["files"]
    assert recorded == {s: str(text / s) for s in ("train", "valid", "test")}  # not the partial
    before = contents(dest), contents(text)

    status, _, err = cli(capsys, parallel.main, *run[:1], second, *run[2:])
    assert status == 1
    assert err.strip().splitlines()[-1] == \
        f"error: {dest} already exists and is not empty; pass --overwrite to replace it"
    assert (contents(dest), contents(text)) == before and not hidden(tmp_path)

    status, out, _ = cli(capsys, parallel.main, *run[:1], second, *run[2:], "--skip-existing")
    assert status == 0 and out.strip() == f"skipped {dest}: it already exists (--overwrite " \
        "rebuilds it)"
    assert (contents(dest), contents(text)) == before

    # the text folder alone (the binaries removed) is refused too, before DESTDIR is made
    os.rename(dest, tmp_path / "kept")
    status, _, err = cli(capsys, parallel.main, *run[:1], second, *run[2:])
    assert status == 1 and f"error: {text} already exists" in err
    assert not dest.exists() and contents(text) == before[1] and not hidden(tmp_path)

    # a run that fails while binarizing leaves no text folder either
    def fails(*args, **kwargs):
        raise DataError("binarizing failed")

    monkeypatch.setattr(parallel, "prepare", fails)
    os.rename(text, tmp_path / "kept.text")
    assert cli(capsys, parallel.main, *run)[0] == 1
    assert not text.exists() and not dest.exists() and not hidden(tmp_path)
    monkeypatch.undo()

    # --overwrite replaces both, together: the binaries count the new text's pairs
    os.rename(tmp_path / "kept", dest)
    os.rename(tmp_path / "kept.text", text)
    assert cli(capsys, parallel.main, *run[:1], second, *run[2:], "--overwrite")[0] == 0
    pairs = json.loads((dest / "pairs.json").read_text())["pairs"]
    assert pairs["train"] == len((text / "train.src").read_text().splitlines())
    assert contents(text) != before[1] and not hidden(tmp_path)


# --- never over an input ---------------------------------------------------------------------


def test_what_clashes_with_an_input(tmp_path):
    (tmp_path / "in").mkdir()
    source = tmp_path / "in" / "a.txt"
    source.write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "in")
    assert files.clash_with_inputs(tmp_path / "in" / "a.txt", [source]) == f"is the input {source}"
    assert files.clash_with_inputs(tmp_path / "in", [source]) == f"holds the input {source}"
    assert files.clash_with_inputs(tmp_path / "link", [source]) == f"holds the input {source}"
    assert files.clash_with_inputs(tmp_path / "in" / "a.txt" / "bin", [source]) == \
        f"lies inside the input file {source}"
    assert files.clash_with_inputs(tmp_path / "in" / "bin", [source]) is None  # beside: fine
    assert files.clash_with_inputs(tmp_path / "in" / "bin", [tmp_path / "in"]) is None
    with pytest.raises(ValueError, match=r"holds the input .*a\.txt: write the output "
                       "somewhere else"):
        files.refuse_taken(tmp_path / "in", overwrite=True, inputs=[source], error=ValueError)


def test_overwrite_never_deletes_an_input(tmp_path, bpe):
    """``--destdir`` that is or holds what the run reads: with ``--overwrite`` the inputs used
    to be deleted along with the old output. Refused, in every pipeline (gettext's catalogs:
    test_gettext.py)."""
    text = corpora.write_wikitext(tmp_path / "wt")
    par = parallel_text(tmp_path / "par")
    shards = tmp_path / "shards"
    shards.mkdir()
    corpora.write_pile_shard(shards / "train.jsonl", corpora.pile_documents(8))
    corpora.write_glue(tmp_path / "glue", rows=6)
    glue.prepare(tmp_path / "glue", tmp_path / "g", ["CoLA"], Gpt2BpeEncoder.from_dir(bpe))
    dict_inside = tmp_path / "g" / "CoLA-bin" / "input0" / "dict.txt"
    own_bpe = tmp_path / "own_bpe"
    own_bpe.mkdir()
    for f in bpe.iterdir():
        (own_bpe / f.name).write_bytes(f.read_bytes())
    runs = [
        (wikitext.main, ["--text-dir", text, "--destdir", text], text),
        (wikitext.main, ["--text-dir", text, "--destdir", tmp_path, "--gpt2-bpe", bpe], text),
        (parallel.main, ["--trainpref", par / "train", "-s", "src", "-t", "tgt",
                         "--destdir", par], par),
        (parallel.main, ["--trainpref", par / "train", "-s", "src", "-t", "tgt", "--srcdict",
                         dict_inside, "--destdir", tmp_path / "g" / "CoLA-bin"], tmp_path / "g"),
        (pile.main, ["--train", shards / "train.jsonl", "--gpt2-bpe", bpe, "--destdir", shards],
         shards),
        (pile.main, ["--train", shards / "train.jsonl", "--gpt2-bpe", own_bpe, "--destdir",
                     own_bpe], own_bpe),
        (glue.main, ["--glue-dir", tmp_path / "glue", "--tasks", "CoLA", "--gpt2-bpe", bpe,
                     "--dict", dict_inside, "--destdir", tmp_path / "g"], tmp_path / "g"),
    ]
    for main, argv, kept in runs:
        before = contents(kept)
        with pytest.raises(DataError, match=r"^the destination .* (is|holds) the input .*: "
                           r"write the output somewhere else"):
            main([str(a) for a in argv] + ["--overwrite"])
        assert contents(kept) == before, argv
    assert not any(".partial-" in p.name for p in tmp_path.rglob(".*"))


def test_a_destination_that_is_a_file_is_one_line(tmp_path, capsys, bpe):
    """A file as the destination (or above it) was a FileExistsError traceback (gettext's
    --out: test_gettext.py)."""
    text = corpora.write_wikitext(tmp_path / "wt")
    par = parallel_text(tmp_path / "par")
    shard = corpora.write_pile_shard(tmp_path / "train.jsonl", corpora.pile_documents(8))
    corpora.write_glue(tmp_path / "glue", rows=6)
    plain = tmp_path / "notes.txt"
    plain.write_text("not a folder")
    test = text / "wiki.test.tokens"
    runs = [
        (wikitext.main, ["--text-dir", text, "--destdir", test],
         f"error: the destination {test} is the input {test}: write the output somewhere else "
         "(a new or empty folder outside the inputs)"),
        (wikitext.main, ["--text-dir", text, "--destdir", plain],
         f"error: {plain} exists and is not a folder: give the destination a new or empty "
         "folder"),
        (wikitext.main, ["--text-dir", text, "--destdir", plain / "bin"],
         f"error: {plain} exists and is not a folder (under {plain / 'bin'}): give the "
         "destination a new or empty folder"),
        (parallel.main, ["--trainpref", par / "train", "-s", "src", "-t", "tgt",
                         "--destdir", plain], None),
        (parallel.main, ["--restoration-from", test, "--destdir", plain], None),
        (pile.main, ["--train", shard, "--gpt2-bpe", bpe, "--destdir", plain], None),
        (glue.main, ["--glue-dir", tmp_path / "glue", "--tasks", "CoLA", "--gpt2-bpe", bpe,
                     "--destdir", plain], None),
    ]
    for main, argv, expected in runs:
        status, _, err = cli(capsys, main, *argv)
        last = err.strip().splitlines()[-1]
        assert status == 1 and "Traceback" not in err, err[-2000:]
        assert last == expected if expected else \
            last.startswith(f"error: {plain} exists and is not a folder"), last
    assert plain.read_text() == "not a folder"


# --- a re-run adds what is missing -----------------------------------------------------------


def test_skip_existing_builds_only_what_is_missing(tmp_path, capsys, bpe):
    corpora.write_glue(tmp_path / "glue", rows=6)
    encoder = Gpt2BpeEncoder.from_dir(bpe)
    glue.prepare(tmp_path / "glue", tmp_path / "g", ["RTE"], encoder)
    before = contents(tmp_path / "g")
    status, out, _ = cli(capsys, glue.main, "--glue-dir", tmp_path / "glue", "--tasks", "RTE",
                         "CoLA", "--gpt2-bpe", bpe, "--destdir", tmp_path / "g",
                         "--skip-existing")
    assert status == 0
    assert out.splitlines()[0] == f"skipped {tmp_path / 'g' / 'RTE-bin'}: it already exists " \
        "(--overwrite rebuilds it)"
    assert out.splitlines()[1].startswith("CoLA: train 6")
    assert {k: v for k, v in contents(tmp_path / "g").items() if k.startswith("RTE")} == before
    # nothing to build: no "wrote" line; a file still refused; both flags at once refused
    status, out, _ = cli(capsys, glue.main, "--glue-dir", tmp_path / "glue", "--tasks", "RTE",
                         "--gpt2-bpe", bpe, "--destdir", tmp_path / "g", "--skip-existing")
    assert status == 0 and "wrote" not in out
    text = corpora.write_wikitext(tmp_path / "wt")
    with pytest.raises(DataError, match="is the input"):
        wikitext.main(["--text-dir", str(text), "--destdir", str(text / "wiki.valid.tokens"),
                       "--skip-existing"])
    with pytest.raises(SystemExit):
        wikitext.main(["--text-dir", str(text), "--destdir", str(tmp_path / "w"),
                       "--skip-existing", "--overwrite"])
    # WikiText: skipped before the download it would need
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "dict.txt").write_text("built before\n")
    # a folder no pipeline completed (no stats.json: another tool's, a crashed run's) is not
    # kept as if it were an output
    with pytest.raises(DataError, match=r"w is no pipeline's output \(no stats.json or "
                                        r"pairs.json; it holds dict.txt\): --skip-existing"):
        wikitext.prepare(tmp_path / "absent", tmp_path / "w", fetch=True, skip_existing=True)
    (tmp_path / "w" / "stats.json").write_text("{}\n")
    assert wikitext.prepare(tmp_path / "absent", tmp_path / "w", fetch=True, urls=["file:///no"],
                            skip_existing=True) is None
    assert not (tmp_path / "absent").exists()


def _run_script(name, out, *args, **env):
    return subprocess.run(
        ["bash", str(REPO / "examples" / name / "prepare.sh"), str(out), *map(str, args)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHON=sys.executable, WORKERS="1", OMP_NUM_THREADS="1",
                 **{k: str(v) for k, v in env.items()}))


def _inode(path):
    return Path(path).stat().st_ino


@pytest.mark.slow
def test_example_scripts_rerun_to_add_an_output(tmp_path, bpe):
    """docs/configs_and_data.md: a second run of a prepare.sh with more settings adds the new
    output; it used to stop at the first one, which existed ("pass --overwrite", a flag the
    scripts could not pass). OVERWRITE=1 rebuilds; a flag given to a script is refused."""
    text = corpora.write_wikitext(tmp_path / "wt")
    raw = corpora.write_wikitext_raw(text, tmp_path / "wt_raw")
    out = tmp_path / "out"
    bins = out / "data-bin"
    assert _run_script("wikitext103", out, WIKITEXT=text).returncode == 0
    words = _inode(bins / "wikitext-103")
    proc = _run_script("wikitext103", out, WIKITEXT=text, WIKITEXT_RAW=raw, GPT2_BPE=bpe)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"skipped {bins / 'wikitext-103'}: it already exists" in proc.stdout
    assert (bins / "wikitext-103-bpe" / "train.bin").is_file()
    assert _inode(bins / "wikitext-103") == words
    proc = _run_script("wikitext103", out, "--overwrite", WIKITEXT=text)
    assert proc.returncode == 2 and "settings are environment variables" in proc.stderr
    assert _run_script("wikitext103", out, WIKITEXT=text, OVERWRITE="1").returncode == 0
    assert _inode(bins / "wikitext-103") != words

    pile_dir = tmp_path / "pile"
    (pile_dir / "train").mkdir(parents=True)
    corpora.write_pile_shard(pile_dir / "train" / "00.jsonl", corpora.pile_documents(10))
    proc = _run_script("pile", out, PILE=pile_dir, GPT2_BPE=bpe, ONLY="foo")  # did nothing, 0
    assert proc.returncode == 2 and proc.stderr.startswith("ONLY=foo: set ONLY=mlm or ONLY=lm")
    assert _run_script("pile", out, PILE=pile_dir, GPT2_BPE=bpe, ONLY="mlm").returncode == 0
    proc = _run_script("pile", out, PILE=pile_dir, GPT2_BPE=bpe)
    assert proc.returncode == 0 and f"skipped {bins / 'pile-mlm'}" in proc.stdout
    assert (bins / "pile-lm" / "train.bin").is_file()

    corpora.write_glue(tmp_path / "glue", rows=6)
    assert _run_script("glue", out, "RTE", GLUE=tmp_path / "glue", GPT2_BPE=bpe).returncode == 0
    proc = _run_script("glue", out, "RTE", "CoLA", GLUE=tmp_path / "glue", GPT2_BPE=bpe)
    assert proc.returncode == 0 and f"skipped {bins / 'glue' / 'RTE-bin'}" in proc.stdout
    assert sorted(p.name for p in (bins / "glue").iterdir()) == ["CoLA-bin", "RTE-bin"]
    assert _run_script("glue", out, "--overwrite", GLUE=tmp_path / "glue",
                       GPT2_BPE=bpe).returncode == 2

    restoration = bins / "restoration.text"
    for source in ("wiki.train.tokens", "wiki.test.tokens"):
        proc = subprocess.run(
            ["bash", str(REPO / "examples" / "translation" / "prepare.sh"), "-", "src", "tgt",
             str(out)], capture_output=True, text=True, timeout=300,
            env=dict(os.environ, PYTHON=sys.executable, WORKERS="1", OMP_NUM_THREADS="1",
                     RESTORATION=str(text / source)))
        assert proc.returncode == 0, proc.stderr[-3000:]
        if source == "wiki.train.tokens":
            kept = contents(restoration)
    assert "skipped" in proc.stdout and contents(restoration) == kept


# --- a dictionary of another tokenization ----------------------------------------------------


def test_a_dictionary_of_another_tokenization_is_refused(tmp_path, bpe):
    """A word-level dict.txt given with --gpt2-bpe binarized nearly every token as <unk> and
    exited 0, with no <unk> count in stats.json."""
    corpora.write_glue(tmp_path / "glue", rows=6)
    words = word_dictionary(tmp_path / "words.txt", corpora.write_wikitext(tmp_path / "wt"))
    argv = ["--glue-dir", tmp_path / "glue", "--tasks", "CoLA", "--gpt2-bpe", bpe,
            "--destdir", tmp_path / "g"]
    with pytest.raises(DataError, match=rf"^--dict {words} is not a dictionary of this GPT-2 "
                       rf"BPE: \d+ of its \d+ entries are not symbols of it \(e.g. .*\), so "
                       rf"most tokens would become <unk>;"
                       rf" .* give --dict {bpe / 'dict.txt'} \(fairseq's GPT-2 dict.txt\)"):
        glue.main([str(a) for a in argv + ["--dict", words]])
    assert not (tmp_path / "g").exists()
    with pytest.raises(DataError, match="is not a dictionary of this GPT-2 BPE"):  # the API too
        glue.prepare(tmp_path / "glue", tmp_path / "g", ["CoLA"],
                     Gpt2BpeEncoder.from_dir(bpe, words))
    assert not (tmp_path / "g" / "CoLA-bin").exists()

    # a dictionary of most of the ids is the BPE's (one built from a corpus): its <unk> counted
    n = len(json.loads((bpe / "encoder.json").read_text()))
    partial = tmp_path / "partial.txt"
    partial.write_text("".join(f"{i} 1\n" for i in range(n) if i % 4))
    glue.main([str(a) for a in argv + ["--dict", partial]])
    stats = json.loads((tmp_path / "g" / "CoLA-bin" / "stats.json").read_text())
    encoder = Gpt2BpeEncoder.from_dir(bpe)
    lines = (tmp_path / "glue" / "CoLA" / "train.tsv").read_text().splitlines()
    ids = [i for line in lines for i in encoder.ids(line.split("\t")[3])]
    assert stats["unk"]["train"] == sum(i % 4 == 0 for i in ids) > 0
    assert stats["tokens"]["train"] == len(ids) + len(lines)  # and one </s> a row
    # one of a few of the ids (a model pretrained on a small corpus): the same
    few = tmp_path / "few.txt"
    few.write_text("".join(f"{i} 1\n" for i in range(0, n, 10)))
    glue.main([str(a) for a in argv + ["--dict", few, "--overwrite"]])
    stats = json.loads((tmp_path / "g" / "CoLA-bin" / "stats.json").read_text())
    assert stats["unk"]["train"] == sum(i % 10 != 0 for i in ids) > 0
    glue.main([str(a) for a in argv + ["--overwrite"]])  # the BPE folder's own dict.txt
    stats = json.loads((tmp_path / "g" / "CoLA-bin" / "stats.json").read_text())
    assert stats["unk"] == {"train": 0, "valid": 0, "test": 0}


def test_a_sentencepiece_dictionary_of_another_model_is_refused(tmp_path):
    pytest.importorskip("sentencepiece")
    from fairseq_alibi.preprocess.encoders import SentencePieceEncoder, train_sentencepiece

    text = corpora.write_wikitext(tmp_path / "wt")
    lines = (text / "wiki.train.tokens").read_text(encoding="utf-8").splitlines()
    model = train_sentencepiece([line for line in lines if line.strip()], tmp_path / "spm", 40,
                                num_threads=1)
    words = word_dictionary(tmp_path / "words.txt", text)
    with pytest.raises(DataError, match=rf"--dict {words} is not a dictionary of this "
                       r"sentencepiece model \(.*spm\.model\): \d+ of its \d+ entries are "
                       r"not symbols "
                       ".*; give --dict the dict.txt written beside this model"):
        SentencePieceEncoder(model, words).dictionary
    assert len(SentencePieceEncoder(model).dictionary) > 0
    # a smaller model's pieces (each of them this model's too), and an empty file
    own = SentencePieceEncoder(model).dictionary
    (tmp_path / "other.txt").write_text("".join(f"{own[i]} 1\n" for i in range(
        own.nspecial, own.nspecial + 10)))
    with pytest.raises(DataError, match=r"it has 10 of its 40 symbols"):
        SentencePieceEncoder(model, tmp_path / "other.txt").dictionary
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="it has no entries"):
        SentencePieceEncoder(model, tmp_path / "empty.txt").dictionary


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="no ../shared/data")
def test_real_gpt2_bpe_refuses_a_wikitext_word_dictionary(tmp_path):
    """The new-user report: CoLA with a WikiText-2 word-level dict.txt and fairseq's GPT-2 BPE
    wrote 73.6 % <unk>; refused, naming the BPE folder's dict.txt."""
    glue_dir = tmp_path / "glue" / "CoLA"
    glue_dir.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        head = (SHARED_DATA / "glue" / "CoLA" / f"{split}.tsv").read_text(encoding="utf-8")
        (glue_dir / f"{split}.tsv").write_text("".join(head.splitlines(True)[:150]),
                                               encoding="utf-8")
    text = tmp_path / "wt"
    text.mkdir()
    valid = (SHARED_DATA / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    (text / "wiki.train.tokens").write_text("".join(valid.splitlines(True)[:3000]),
                                            encoding="utf-8")
    words = word_dictionary(tmp_path / "words.txt", text)
    gpt2 = SHARED_DATA / "gpt2_bpe"
    argv = ["--glue-dir", tmp_path / "glue", "--tasks", "CoLA", "--gpt2-bpe", gpt2,
            "--destdir", tmp_path / "g"]
    with pytest.raises(DataError, match=rf"give --dict {gpt2 / 'dict.txt'} "):
        glue.main([str(a) for a in argv + ["--dict", words]])
    assert not (tmp_path / "g").exists()
    glue.main([str(a) for a in argv + ["--dict", gpt2 / "dict.txt"]])
    stats = json.loads((tmp_path / "g" / "CoLA-bin" / "stats.json").read_text())
    assert stats["unk"] == {"train": 0, "valid": 0, "test": 0} and stats["tokens"]["train"] > 0
