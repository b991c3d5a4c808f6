"""The data pipelines end to end on tiny inputs the tests write in the real formats.

Each output is checked three ways: against fairseq's own tools where a recipe exists
(``fairseq-preprocess`` for WikiText, ``multiprocessing_bpe_encoder`` + ``fairseq-preprocess``
for the RoBERTa and GLUE recipes, byte for byte), against an independent encoding of the
expected text, and by loading it with the fairseq task that trains on it. Malformed input must
give a message naming the file and line, and leave no output behind.
"""

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fairseq_alibi.preprocess import glue, pile, wikitext
from fairseq_alibi.preprocess.pipeline_io import DataError, atomic_directory
from fairseq_alibi.preprocess.process_pool import ordered_map, worker_state
from fairseq_alibi.preprocess.encoders import NEWLINE, Gpt2BpeEncoder, SentencePieceEncoder
from tests.helpers import corpora
from tests.helpers.cli import REPO, SHARED_DATA, preprocess

PYTHON = sys.executable
OUTPUT_FILES = ("dict.txt",) + tuple(f"{s}.{e}" for s in ("train", "valid", "test")
                                     for e in ("bin", "idx"))


def items(prefix, combine=False):
    """The samples of a binarized split, as numpy arrays."""
    from fairseq.data import data_utils

    ds = data_utils.load_indexed_dataset(str(prefix), None, combine=combine)
    assert ds is not None, f"no dataset at {prefix}"
    return [ds[i].numpy() for i in range(len(ds))]


def fairseq_task(*args):
    """A fairseq task set up from command-line arguments, as fairseq-train would."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from omegaconf import OmegaConf

    argv = [str(a) for a in args]
    arch = "transformer_lm" if "language_modeling" in argv else "roberta_base"
    criterion = "sentence_prediction" if "sentence_prediction" in argv else "cross_entropy"
    parsed = options.parse_args_and_arch(
        options.get_training_parser(), argv + ["--arch", arch, "--criterion", criterion])
    cfg = convert_namespace_to_omegaconf(parsed)
    OmegaConf.resolve(cfg)
    return tasks.setup_task(cfg.task)


def leftovers(parent):
    """Temporary folders a pipeline left behind (none, ever)."""
    parent = Path(parent)
    names = [p.name for p in parent.iterdir()] if parent.is_dir() else []
    return sorted(n for n in names if ".partial-" in n or ".old-" in n)


def call(main, *args):
    """A pipeline's ``main(argv)`` in this process."""
    main([str(a) for a in args])


def run_module(module, *args, expect_ok=True):
    """``python -m fairseq_alibi.preprocess.<module>``: the pipeline's real command line."""
    proc = subprocess.run(
        [PYTHON, "-m", f"fairseq_alibi.preprocess.{module}", *map(str, args)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert (proc.returncode == 0) == expect_ok, proc.stdout + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """The tiny BPE, with a fairseq dict.txt that lists its ids out of order (as fairseq's does)."""
    folder = corpora.write_tiny_bpe(tmp_path_factory.mktemp("bpe"))
    n = len(json.loads((folder / "encoder.json").read_text()))
    order = list(range(n))
    np.random.RandomState(0).shuffle(order)
    (folder / "dict.txt").write_text("".join(f"{i} {1000 - k}\n" for k, i in enumerate(order)))
    return folder


@pytest.fixture(scope="module")
def reference_bpe(bpe_dir):
    """fairseq's GPT-2 encoder and dictionary, used directly: the independent expectation."""
    from fairseq.data import Dictionary
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    bpe = get_encoder(str(bpe_dir / "encoder.json"), str(bpe_dir / "vocab.bpe"))
    d = Dictionary.load(str(bpe_dir / "dict.txt"))

    def encode(text):
        return np.array([d.index(str(i)) for i in bpe.encode(text.strip())] + [d.eos()])

    encode.dictionary = d
    return encode


class _InProcessPool:
    """``multiprocessing.Pool`` as the encoder script uses it (an initializer, ``imap``), in
    this process: a Pool forked from a test worker's threads can deadlock on a lock copied
    while held (seen once in a full run: a pool worker waiting forever on its queue's lock)."""

    def __init__(self, processes=None, initializer=None):
        if initializer is not None:
            initializer()

    def imap(self, fn, iterable, chunksize=1):
        return map(fn, iterable)


def fairseq_bpe_encode(bpe_dir, src, dst):
    """fairseq's examples/roberta/multiprocessing_bpe_encoder.py, as the RoBERTa recipes run it
    (its encoding, with its pool in this process: :class:`_InProcessPool`)."""
    argv = sys.argv
    sys.argv = ["multiprocessing_bpe_encoder", "--encoder-json", str(bpe_dir / "encoder.json"),
                "--vocab-bpe", str(bpe_dir / "vocab.bpe"), "--inputs", str(src),
                "--outputs", str(dst), "--keep-empty", "--workers", "1"]
    script = importlib.import_module("fairseq.examples.roberta.multiprocessing_bpe_encoder")
    pool, script.Pool = script.Pool, _InProcessPool
    try:
        script.main()
    finally:
        sys.argv, script.Pool = argv, pool


def assert_same_files(ours, theirs, names):
    for name in names:
        assert (Path(ours) / name).read_bytes() == (Path(theirs) / name).read_bytes(), name


# --- WikiText -------------------------------------------------------------------------------


def test_wikitext_word_level_equals_fairseq_preprocess(tmp_path):
    text = corpora.write_wikitext(tmp_path / "wikitext-103")
    call(wikitext.main, "--text-dir", text, "--destdir", tmp_path / "ours", "--workers", 2)
    preprocess(  # the paper's command
        "--only-source", "--trainpref", text / "wiki.train.tokens",
        "--validpref", text / "wiki.valid.tokens", "--testpref", text / "wiki.test.tokens",
        "--destdir", tmp_path / "fairseq", "--workers", "2",
    )
    assert_same_files(tmp_path / "ours", tmp_path / "fairseq", OUTPUT_FILES)
    # one sample per line, words and </s>, as counted straight from the text
    for split in ("train", "valid", "test"):
        lines = (text / f"wiki.{split}.tokens").read_text(encoding="utf-8").splitlines()
        samples = items(tmp_path / "ours" / split)
        assert [len(s) for s in samples] == [len(line.split()) + 1 for line in lines]
    assert not leftovers(tmp_path)


def test_wikitext_gpt2_equals_fairseq_roberta_recipe(tmp_path, bpe_dir):
    """README.pretraining.md: multiprocessing_bpe_encoder, then fairseq-preprocess --srcdict."""
    text = corpora.write_wikitext(tmp_path / "raw")
    for split in ("train", "valid", "test"):
        (text / f"wiki.{split}.tokens").rename(text / f"wiki.{split}.raw")
    call(wikitext.main, "--text-dir", text, "--raw", "--gpt2-bpe", bpe_dir, "--destdir",
         tmp_path / "ours", "--workers", 2)
    for split in ("train", "valid", "test"):
        fairseq_bpe_encode(bpe_dir, text / f"wiki.{split}.raw", tmp_path / f"{split}.bpe")
    preprocess("--only-source", "--srcdict", bpe_dir / "dict.txt",
               "--trainpref", tmp_path / "train.bpe", "--validpref", tmp_path / "valid.bpe",
               "--testpref", tmp_path / "test.bpe", "--destdir", tmp_path / "fairseq",
               "--workers", "1")
    assert_same_files(tmp_path / "ours", tmp_path / "fairseq", OUTPUT_FILES)


def test_wikitext_download(tmp_path):
    """--download: the first URL that answers (here file://), its three files extracted."""
    text = corpora.write_wikitext(tmp_path / "src")
    archive = tmp_path / "wikitext-103-v1.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(text.iterdir()):
            z.write(f, f"wikitext-103/{f.name}")
    dead = (tmp_path / "missing.zip").as_uri()
    stats = wikitext.prepare(tmp_path / "fetched", tmp_path / "bin", fetch=True,
                             urls=[dead, archive.as_uri()])
    for f in text.iterdir():
        assert (tmp_path / "fetched" / f.name).read_bytes() == f.read_bytes()
    assert stats["valid"]["lines"] == len((text / "wiki.valid.tokens").read_text().splitlines())

    with pytest.raises(DataError, match="could not download WikiText(.|\n)*missing.zip(.|\n)*"
                                        "--text-dir \\(prepare.sh: WIKITEXT=\\)"):
        wikitext.prepare(tmp_path / "elsewhere", tmp_path / "bin2", fetch=True, urls=[dead])
    assert not (tmp_path / "elsewhere").exists()  # the folder it made for the download
    with pytest.raises(DataError, match=r"has no wiki.train.tokens.*--download"):
        wikitext.prepare(tmp_path / "elsewhere", tmp_path / "bin2")
    assert not (tmp_path / "bin2").exists() and not leftovers(tmp_path)
    # a folder of the user's own splits, one missing: the download would replace the others
    (tmp_path / "fetched" / "wiki.test.tokens").unlink()
    mine = (tmp_path / "fetched" / "wiki.train.tokens").read_bytes()
    with pytest.raises(DataError, match=r"has wiki.train.tokens, wiki.valid.tokens but no "
                                        r"wiki.test.tokens: --download fetches all three"):
        wikitext.prepare(tmp_path / "fetched", tmp_path / "bin2", fetch=True,
                         urls=[archive.as_uri()])
    assert (tmp_path / "fetched" / "wiki.train.tokens").read_bytes() == mine
    # a download interrupted between two splits leaves none of them (the next run is no
    # "folder of the user's own splits")
    copy, calls = shutil.copyfileobj, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return copy(*args, **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wikitext.shutil, "copyfileobj", interrupted)
        with pytest.raises(KeyboardInterrupt):
            wikitext.prepare(tmp_path / "again", tmp_path / "bin3", fetch=True,
                             urls=[archive.as_uri()])
    assert not (tmp_path / "again").exists()
    assert wikitext.prepare(tmp_path / "again", tmp_path / "bin3", fetch=True,
                            urls=[archive.as_uri()])["valid"]["lines"] > 0


# --- The Pile -------------------------------------------------------------------------------


def pile_inputs(folder):
    """Two train shards (.zst of 3 frames, and plain), a .zst valid file; an empty document."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = [corpora.pile_documents(60, seed=1), corpora.pile_documents(40, seed=2)]
    shards[0][3] = {"text": "  \n ", "meta": {"pile_set_name": "Pile-CC"}}
    valid = corpora.pile_documents(20, seed=3)
    paths = [corpora.write_pile_shard(folder / "00.jsonl.zst", shards[0], frames=3),
             corpora.write_pile_shard(folder / "01.jsonl", shards[1])]
    return paths, shards, corpora.write_pile_shard(folder / "val.jsonl.zst", valid), valid


def expected_documents(docs, encode, subsets, limit, policy):
    out = []
    for d in docs:
        if d["meta"]["pile_set_name"] not in subsets or not d["text"].strip():
            continue
        ids = encode(d["text"])
        if len(ids) > limit and policy == "drop":
            continue
        if len(ids) > limit and policy == "truncate":
            ids = np.append(ids[: limit - 1], ids[-1])
        out.append(ids)
    return out


@pytest.mark.parametrize("policy", ["drop", "truncate", "keep"])
def test_pile_gpt2_subsets_and_long_documents(tmp_path, bpe_dir, reference_bpe, policy):
    train, shards, valid, valid_docs = pile_inputs(tmp_path / "pile")
    subsets, L = ("Pile-CC", "Wikipedia (en)"), 160
    stats = pile.prepare(tmp_path / "bin", train, [valid], encoder=Gpt2BpeEncoder.from_dir(bpe_dir),
                         subsets=subsets, tokens_per_sample=L, long_docs=policy, workers=2)
    out = tmp_path / "bin"
    for name, docs in (("train", shards[0]), ("train1", shards[1]), ("valid", valid_docs)):
        want = expected_documents(docs, reference_bpe, subsets, L - 1, policy)
        got = items(out / name)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want)), name
    longer = sum(len(reference_bpe(d["text"])) > L - 1 for s in shards for d in s
                 if d["meta"]["pile_set_name"] in subsets and d["text"].strip())
    assert longer > 0 and stats["train"].counts["longer"] == longer
    assert stats["train"].counts["dropped" if policy == "drop" else "truncated"] == (
        0 if policy == "keep" else longer)
    assert stats["train"].counts["empty"] == 1
    saved = json.loads((out / "stats.json").read_text())
    assert saved["splits"]["train"]["counts"]["longer"] == longer

    # fairseq's masked_lm reads train + train1 as one split: one document per sample
    task = fairseq_task(out, "--task", "masked_lm", "--tokens-per-sample", L,
                        "--sample-break-mode", "complete")
    task.load_dataset("train", combine=True)
    dataset = task.dataset("train")
    longest = max(dataset.num_tokens(i) for i in range(len(dataset)))  # <s> + whole documents
    assert longest <= L if policy != "keep" else longest > L
    assert len(items(out / "train", combine=True)) == len(items(out / "train")) + len(items(out / "train1"))


def test_pile_sentencepiece_trained_on_a_sample(tmp_path):
    train, shards, valid, _ = pile_inputs(tmp_path / "pile")
    call(pile.main, "--train", *train, "--valid", valid, "--destdir", tmp_path / "bin",
         "--train-sentencepiece", 40, "--sentencepiece-sample", 30, "--workers", 2)
    out = tmp_path / "bin"
    encoder = SentencePieceEncoder(out / "spm.model", out / "dict.txt")
    kept = [d["text"] for d in shards[0] if d["text"].strip()]
    got = items(out / "train")
    assert len(got) == len(kept)
    assert all(np.array_equal(g, encoder.encode(t)) for g, t in zip(got, kept))
    newline = encoder.dictionary.index(NEWLINE)
    assert newline != encoder.dictionary.unk() and any(newline in g for g in got)

    task = fairseq_task(out, "--task", "language_modeling", "--tokens-per-sample", 16)
    task.load_dataset("valid")
    assert len(task.dataset("valid")) > 0


@pytest.mark.slow
def test_pile_malformed_input_names_file_and_line(tmp_path, bpe_dir):
    docs = corpora.pile_documents(30)
    bad = corpora.write_pile_shard(tmp_path / "bad.jsonl.zst", docs, ['{"text": "unterminated\n'])
    proc = run_module("pile", "--train", bad, "--destdir", tmp_path / "out", "--gpt2-bpe",
                      bpe_dir, "--workers", 2, expect_ok=False)
    assert f"{bad}:31: not valid JSON" in proc.stderr
    assert "%|" in proc.stderr  # the progress bar ran
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)

    encoder = Gpt2BpeEncoder.from_dir(bpe_dir)
    no_text = corpora.write_pile_shard(tmp_path / "no_text.jsonl", docs[:3], ['{"content": "x"}\n'])
    with pytest.raises(DataError, match=r"no_text.jsonl:4: expected an object with a string \"text\""):
        pile.prepare(tmp_path / "out", [no_text], encoder=encoder)
    no_meta = corpora.write_pile_shard(tmp_path / "no_meta.jsonl", docs[:2], ['{"text": "x"}\n'])
    with pytest.raises(DataError, match=r"no_meta.jsonl:3: no \"meta\""):
        pile.prepare(tmp_path / "out", [no_meta], encoder=encoder, subsets=["Pile-CC"])
    cc = corpora.write_pile_shard(tmp_path / "cc.jsonl",
                                  [{"text": "a b", "meta": {"pile_set_name": "Pile-CC"}}] * 2)
    with pytest.raises(DataError, match=r"no document left in .*cc.jsonl: 2 not in --subsets"):
        pile.prepare(tmp_path / "out", [cc], encoder=encoder, subsets=["ArXiv"])
    pipe = tmp_path / "pipe.jsonl"
    os.mkfifo(pipe)
    with pytest.raises(DataError, match="--train-sentencepiece reads the training shards twice"):
        pile.prepare(tmp_path / "out", [pipe], train_sentencepiece_vocab=40)
    truncated = tmp_path / "truncated.jsonl.zst"
    whole = corpora.write_pile_shard(tmp_path / "whole.jsonl.zst",
                                     corpora.pile_documents(400)).read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"truncated.jsonl.zst: corrupt or truncated zstd"):
        pile.prepare(tmp_path / "out", [truncated], encoder=encoder)
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


def _square_plus_offset(x):
    if isinstance(x, str):  # what to do wrong
        if x == "die":
            os._exit(3)
        if x == "bad":
            raise DataError("bad item")
        raise ValueError(lambda: None)  # unpicklable
    return x * x + worker_state()["offset"]


def _worker_pids(_):
    return os.getpid()


@pytest.fixture
def hang_guard():
    """A deadlock aborts the run with every thread's stack instead of hanging it."""
    import faulthandler

    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize("workers", [1, 3])
def test_ordered_map_keeps_order_and_state(workers, hang_guard):
    big = np.arange(200_000)  # items and results larger than a socket's buffer: no deadlock
    out = list(ordered_map(_square_plus_offset, (big + i for i in range(20)), workers,
                           {"offset": 1}))
    assert all(np.array_equal(o, (big + i) ** 2 + 1) for i, o in enumerate(out))


def test_ordered_map_errors_and_dead_workers(hang_guard):
    # the worker's own exception, with its traceback as the cause
    with pytest.raises(DataError, match="bad item") as info:
        list(ordered_map(_square_plus_offset, [1, 2, "bad", 4], 2, {"offset": 0}))
    assert "_square_plus_offset" in str(info.value.__cause__)
    with pytest.raises(RuntimeError, match="could not send its error ValueError"):
        list(ordered_map(_square_plus_offset, [1, "unpicklable"], 2, {"offset": 0}))
    with pytest.raises(DataError, match=r"worker process exited \(code 3\).*fewer --workers"):
        list(ordered_map(_square_plus_offset, [1, 2, "die", 4, 5], 2, {"offset": 0}))
    # a consumer that stops early stops the workers (none left behind)
    results = ordered_map(_worker_pids, range(100), 2)
    pids = {next(results), next(results)}
    results.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# A worker started late (a loaded machine): SIGTERM reaches the pipeline while a worker still
# runs the at-fork hooks, where a SIGTERM handler's SystemExit would be swallowed (the workers
# are stopped with SIGKILL, which nothing delays).
SLOW_WORKER_START = (
    "import os, sys, time; os.register_at_fork(after_in_child=lambda: time.sleep(3)); "
    "from fairseq_alibi.preprocess import pile, pipeline_io; "
    "sys.exit(pipeline_io.run_cli(pile.main))"
)
# A SIGTERM that lands just before the read of an idle pipe (a loaded machine: the process is
# descheduled between its last check for signals and the read): its handler is due but the
# read is not interrupted. ``interrupt_main`` makes exactly that state, on a cue from the test
# (the file ``trip``), once the pipeline waits on the pipe; before the fix it waited forever.
SIGTERM_BEFORE_READ = (
    "import _thread, os, signal, sys, threading, time\n"
    "def trip(cue):\n"
    "    while not os.path.exists(cue):\n"
    "        time.sleep(0.05)\n"
    "    time.sleep(1)\n"
    "    _thread.interrupt_main(signal.SIGTERM)\n"
    "threading.Thread(target=trip, args=(sys.argv[sys.argv.index('--train') + 1] + '.trip',),"
    " daemon=True).start()\n"
    "from fairseq_alibi.preprocess import pile, pipeline_io\n"
    "sys.exit(pipeline_io.run_cli(pile.main))"
)


@pytest.mark.slow
@pytest.mark.parametrize("launch", [
    pytest.param(["-m", "fairseq_alibi.preprocess.pile"], id="pile"),
    pytest.param(["-c", SLOW_WORKER_START], id="slow_worker_start"),
    pytest.param(["-c", SIGTERM_BEFORE_READ], id="sigterm_before_read")])
def test_pile_sigterm_leaves_nothing_behind(tmp_path, bpe_dir, launch):
    """SIGTERM mid-run: the shard is a pipe that never ends, so the run is caught in progress."""
    shard = tmp_path / "live.jsonl"
    os.mkfifo(shard)
    log = tmp_path / "stderr.txt"
    proc = subprocess.Popen(
        [PYTHON, *launch, "--train", str(shard), "--destdir", str(tmp_path / "out"),
         "--gpt2-bpe", str(bpe_dir), "--workers", "2"],
        stderr=log.open("w"), cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1"),
    )
    writer = None
    try:
        while writer is None:  # the pipeline opens the pipe once it has started
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                writer = os.open(shard, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.1)
        os.write(writer, "".join(json.dumps(d) + "\n" for d in corpora.pile_documents(20)).encode())
        while not leftovers(tmp_path):  # its output folder is being written
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        if launch[-1] == SIGTERM_BEFORE_READ:
            Path(f"{shard}.trip").touch()  # the pipeline's own thread trips SIGTERM
        else:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a hang: signal state and stacks, for the report
            pids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split() + [str(proc.pid)]
            status = {pid: Path(f"/proc/{pid}/status") for pid in pids}
            signals = "\n".join(
                f"{pid} {line}" for pid, path in status.items() if path.exists()
                for line in path.read_text().splitlines()
                if line.startswith(("Sig", "ShdPnd", "State", "Threads")))
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGABRT)
                except ProcessLookupError:  # it ended meanwhile
                    pass
            time.sleep(2)
            pytest.fail(f"the pipeline did not exit on SIGTERM:\n{signals}\n"
                        + log.read_text()[-8000:])
        assert code == 128 + signal.SIGTERM, log.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait()
        if writer is not None:
            os.close(writer)
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


def test_a_pipeline_ends_in_its_one_line_after_its_bars(capsys, tmp_path):
    """An error is the last line (an open progress bar used to print its final state after
    it), and Ctrl-C one line, exit status 130, where it was a traceback."""
    from fairseq_alibi.preprocess import pipeline_io

    def fails(argv):
        bar = pipeline_io.progress_bar(total=10, desc="shard.jsonl", unit="line")
        bar.update(10)
        raise DataError("shard.jsonl:2: not valid JSON")

    def interrupted(argv):
        raise KeyboardInterrupt

    handler = signal.getsignal(signal.SIGTERM)  # run_cli sets its own: this process's back
    try:
        assert pipeline_io.run_cli(fails) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == \
            "error: shard.jsonl:2: not valid JSON"
        assert pipeline_io.run_cli(interrupted) == 130
        assert capsys.readouterr().err.strip() == \
            "interrupted: nothing written (an existing output is as it was)"

        def second_task_interrupted(argv):  # GLUE's tasks: the first one is complete
            for task in ("CoLA-bin", "SST-2-bin"):
                with atomic_directory(tmp_path / task) as out:
                    (out / "stats.json").write_text("{}")
                    if task == "SST-2-bin":
                        raise KeyboardInterrupt
        assert pipeline_io.run_cli(second_task_interrupted) == 130
        assert capsys.readouterr().err.strip() == (
            f"interrupted: wrote {tmp_path / 'CoLA-bin'}, nothing else (an existing output is "
            "as it was)")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["CoLA-bin"]
    finally:
        signal.signal(signal.SIGTERM, handler)


def test_existing_output_is_kept_or_replaced_whole(tmp_path, monkeypatch):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    with pytest.raises(DataError, match="not empty; pass --overwrite"):
        with atomic_directory(dest):
            pass
    # --overwrite replaces the whole folder: not one that no pipeline wrote (it deleted a
    # user's notes and checkpoints kept beside the data), nor the current folder
    with pytest.raises(DataError, match=r"dest is no pipeline's output \(no stats.json or "
                                        r"pairs.json; it holds old.txt\): --overwrite would "
                                        r"replace the whole folder, deleting what else"):
        with atomic_directory(dest, overwrite=True):
            pass
    (dest / "stats.json").write_text("{}")
    monkeypatch.chdir(dest)
    with pytest.raises(DataError, match="dest is or holds the current folder: --overwrite "
                                        "replaces the whole folder; give --destdir another"):
        with atomic_directory(dest, overwrite=True):
            pass
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(dest, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("half")
            raise KeyboardInterrupt
    assert sorted(p.name for p in dest.iterdir()) == ["old.txt", "stats.json"]
    assert not leftovers(tmp_path)
    with atomic_directory(dest, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in dest.iterdir()) == ["new.txt"] and not leftovers(tmp_path)


# --- GLUE -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def glue_data(tmp_path_factory, bpe_dir):
    root = tmp_path_factory.mktemp("glue")
    expected = corpora.write_glue(root / "glue_data")
    call(glue.main, "--glue-dir", root / "glue_data", "--destdir", root / "bin", "--gpt2-bpe",
         bpe_dir, "--workers", 2)
    return root, expected


@pytest.mark.slow
def test_glue_every_task_layout(glue_data, reference_bpe):
    from fairseq.data import Dictionary

    root, expected = glue_data
    assert sorted(p.name for p in (root / "bin").iterdir()) == sorted(f"{t}-bin" for t in expected)
    for task, splits in expected.items():
        out = root / "bin" / f"{task}-bin"
        regression = task == "STS-B"
        for split, want in splits.items():
            for k, texts in enumerate(want["inputs"]):
                got = items(out / f"input{k}" / split)
                assert len(got) == len(texts), (task, split)
                assert all(np.array_equal(g, reference_bpe(t)) for g, t in zip(got, texts)), (task, split, k)
            assert not (out / f"input{len(want['inputs'])}").exists()
            if want["labels"] is None:
                continue
            if regression:
                values = [float(v) for v in (out / "label" / f"{split}.label").read_text().split()]
                assert values == pytest.approx(want["labels"], abs=1e-6)
            else:
                labels = Dictionary.load(str(out / "label" / "dict.txt"))
                got = [labels[int(ids[0])] for ids in items(out / "label" / split)]
                assert got == want["labels"], (task, split)
        # and fairseq's sentence_prediction task trains on it
        sp_task = sentence_prediction(out, task)
        for split in splits:
            sp_task.load_dataset(split)
            assert len(sp_task.dataset(split)) == len(splits[split]["inputs"][0])
        sample = sp_task.dataset("train")[0]
        assert sample["net_input.src_tokens"][0] == 0  # <s> as init_token


def sentence_prediction(data, task):
    """fairseq's sentence_prediction task on a GLUE task's binaries, as the GLUE configs set it."""
    classes = {"STS-B": 1, "MNLI": 3}.get(task, 2)
    regression = ["--regression-target"] if task == "STS-B" else []
    return fairseq_task(data, "--task", "sentence_prediction", "--num-classes", classes,
                        "--init-token", 0, "--separator-token", 2, "--max-positions", 512,
                        *regression)


def script_columns(src, dst, column, header=True):
    """`tail -n +2 | cut -f N` as preprocess_GLUE_tasks.sh extracts a column."""
    skip = "tail -n +2" if header else "cat"
    subprocess.run(f"{skip} '{src}' | cut -f{column} > '{dst}'", shell=True, check=True)


def test_glue_equals_fairseq_preprocess_glue_tasks(tmp_path, glue_data, bpe_dir):
    """MNLI (gold label column of dev, matched/mismatched), CoLA (no header), STS-B (scores):
    the steps of examples/roberta/preprocess_GLUE_tasks.sh, run with fairseq's own tools."""
    root, _ = glue_data
    raw = root / "glue_data"
    plans = {  # task: splits, input columns, test input columns, label column(s)
        "MNLI": (["train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"],
                 (9, 10), (9, 10), {"train": 12, "dev_matched": 16, "dev_mismatched": 16}),
        "CoLA": (["train", "dev", "test"], (4,), (2,), {"train": 2, "dev": 2}),
        "STS-B": (["train", "dev", "test"], (8, 9), (8, 9), {"train": 10, "dev": 10}),
    }
    for task, (splits, columns, test_columns, label_columns) in plans.items():
        work = tmp_path / task
        work.mkdir()
        for split in splits:
            header = not (task == "CoLA" and split != "test")
            cols = test_columns if split.startswith("test") else columns
            for k, c in enumerate(cols):
                script_columns(raw / task / f"{split}.tsv", work / f"{split}.raw.input{k}", c, header)
                fairseq_bpe_encode(bpe_dir, work / f"{split}.raw.input{k}", work / f"{split}.input{k}")
            if split in label_columns:
                script_columns(raw / task / f"{split}.tsv", work / f"{split}.label",
                               label_columns[split], header)
        dev = [s for s in splits if s.startswith("dev")]
        test = [s for s in splits if s.startswith("test")]
        for k in range(len(columns)):
            preprocess("--only-source", "--srcdict", bpe_dir / "dict.txt", "--workers", "1",
                       "--trainpref", work / f"train.input{k}",
                       "--validpref", ",".join(str(work / f"{s}.input{k}") for s in dev),
                       "--testpref", ",".join(str(work / f"{s}.input{k}") for s in test),
                       "--destdir", work / "bin" / f"input{k}")
            names = ["dict.txt"] + [f"{s}.{e}" for s in ("train", "valid", "test") for e in ("bin", "idx")]
            if task == "MNLI":
                names += [f"{s}1.{e}" for s in ("valid", "test") for e in ("bin", "idx")]
            assert_same_files(root / "bin" / f"{task}-bin" / f"input{k}", work / "bin" / f"input{k}", names)
        if task == "STS-B":  # awk '{print $1 / 5.0}'
            (work / "bin" / "label").mkdir()
            for split, name in (("train", "train"), ("dev", "valid")):
                subprocess.run(f"awk '{{print $1 / 5.0 }}' '{work / f'{split}.label'}' > "
                               f"'{work / 'bin' / 'label' / f'{name}.label'}'", shell=True, check=True)
            assert_same_files(root / "bin" / "STS-B-bin" / "label", work / "bin" / "label",
                              ["train.label", "valid.label"])
        else:
            preprocess("--only-source", "--workers", "1", "--trainpref", work / "train.label",
                       "--validpref", ",".join(str(work / f"{s}.label") for s in dev),
                       "--destdir", work / "bin" / "label")
            names = ["dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx"]
            names += ["valid1.bin", "valid1.idx"] if task == "MNLI" else []
            assert_same_files(root / "bin" / f"{task}-bin" / "label", work / "bin" / "label", names)


def test_glue_malformed_rows(tmp_path, bpe_dir):
    corpora.write_glue(tmp_path / "glue", rows=10)
    cola = tmp_path / "glue" / "CoLA" / "train.tsv"
    lines = cola.read_text().splitlines(keepends=True)
    lines[6] = "gj04\t1\tmissing a column\n"
    cola.write_text("".join(lines))
    encoder = Gpt2BpeEncoder.from_dir(bpe_dir)
    with pytest.raises(DataError, match="CoLA train.tsv line 7: expected 4 tab-separated "
                       "columns, found 3"):
        glue.prepare(tmp_path / "glue", tmp_path / "bin", ["CoLA"], encoder)
    assert not (tmp_path / "bin" / "CoLA-bin").exists() and not leftovers(tmp_path / "bin")

    sst = tmp_path / "glue" / "SST-2" / "dev.tsv"
    sst.write_text(sst.read_text().replace("\t0\n", "\t2\n", 1))
    with pytest.raises(DataError, match=r"SST-2 dev.tsv line \d+: label '2' is not one of 0, 1"):
        glue.prepare(tmp_path / "glue", tmp_path / "bin", ["SST-2"], encoder)
    sts = tmp_path / "glue" / "STS-B" / "train.tsv"
    lines = sts.read_text().splitlines(keepends=True)
    lines[3] = lines[3].rsplit("\t", 1)[0] + "\tn/a\n"
    sts.write_text("".join(lines))
    with pytest.raises(DataError, match=r"STS-B train.tsv line 4: score 'n/a' is not a number"):
        glue.prepare(tmp_path / "glue", tmp_path / "bin", ["STS-B"], encoder)
    mrpc = tmp_path / "glue" / "MRPC" / "dev.tsv"
    mrpc.write_text(mrpc.read_text().splitlines(keepends=True)[0])  # the header alone
    with pytest.raises(DataError, match=r"MRPC dev.tsv has no rows"):
        glue.prepare(tmp_path / "glue", tmp_path / "bin", ["MRPC"], encoder)
    shutil.rmtree(tmp_path / "glue" / "RTE")
    with pytest.raises(DataError, match=r"RTE: .* has no train.tsv, dev.tsv"):
        glue.prepare(tmp_path / "glue", tmp_path / "bin", ["RTE"], encoder)
    # the layout named is the task's own files (MNLI: dev_matched, dev_mismatched)
    assert "MNLI/{train,dev_matched,dev_mismatched,test_matched,test_mismatched}.tsv" in \
        glue.missing_files(glue.TASKS["MNLI"], tmp_path / "nowhere")

    # QQP's train and dev: rows with a wrong column count are dropped, as fairseq's script does
    qqp = tmp_path / "glue" / "QQP" / "train.tsv"
    lines = qqp.read_text().splitlines(keepends=True)
    lines[2] = "1\t2\t3\tonly one question\n"
    qqp.write_text("".join(lines))
    rows = glue.prepare(tmp_path / "glue", tmp_path / "bin", ["QQP"], encoder)
    assert rows["QQP"]["train"] == 9 and rows["QQP"]["valid"] == 10
    assert not leftovers(tmp_path / "bin")
    # a task missing among several (ALL on a partial folder): refused before any is written,
    # naming the tasks there are; the comma form of --tasks too
    with pytest.raises(DataError, match=r"RTE: .* has no train.tsv, dev.tsv .*; give --tasks the "
                       "tasks you have: --tasks QNLI"):
        glue.prepare(tmp_path / "glue", tmp_path / "bin2", ["QNLI,RTE"], encoder)
    assert not (tmp_path / "bin2").exists()
    with pytest.raises(DataError, match="QQP-bin already exists and is not empty; pass "
                       "--overwrite"):
        glue.prepare(tmp_path / "glue", tmp_path / "bin", ["QNLI", "QQP"], encoder)
    assert not (tmp_path / "bin" / "QNLI-bin").exists()


@pytest.mark.slow
def test_example_scripts(tmp_path, bpe_dir):
    """examples/*/prepare.sh, the thin wrappers, on local inputs in the real layouts."""
    text = corpora.write_wikitext(tmp_path / "wikitext-103")
    raw = corpora.write_wikitext_raw(text, tmp_path / "wikitext-103-raw")
    pile_dir = tmp_path / "pile"
    (pile_dir / "train").mkdir(parents=True)
    corpora.write_pile_shard(pile_dir / "train" / "00.jsonl.zst", corpora.pile_documents(20))
    corpora.write_pile_shard(pile_dir / "val.jsonl.zst", corpora.pile_documents(6, seed=1))
    corpora.write_glue(tmp_path / "glue", rows=6)
    out = tmp_path / "out"
    for script, env, args in (
        ("wikitext103", {"WIKITEXT": text, "WIKITEXT_RAW": raw, "GPT2_BPE": bpe_dir}, []),
        ("pile", {"PILE": pile_dir, "GPT2_BPE": bpe_dir, "SUBSETS": "Pile-CC,Wikipedia (en)"}, []),
        ("glue", {"GLUE": tmp_path / "glue", "GPT2_BPE": bpe_dir}, ["RTE", "CoLA"]),
    ):
        proc = subprocess.run(
            ["bash", str(REPO / "examples" / script / "prepare.sh"), str(out), *args],
            capture_output=True, text=True, timeout=300,
            env=dict(os.environ, PYTHON=PYTHON, WORKERS="2", OMP_NUM_THREADS="1",
                     **{k: str(v) for k, v in env.items()}),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    bins = out / "data-bin"
    assert sorted(p.name for p in bins.iterdir()) == [
        "glue", "pile-lm", "pile-mlm", "wikitext-103", "wikitext-103-bpe"]
    assert sorted(p.name for p in (bins / "glue").iterdir()) == ["CoLA-bin", "RTE-bin"]
    stats = json.loads((bins / "pile-mlm" / "stats.json").read_text())
    assert stats["subsets"] == ["Pile-CC", "Wikipedia (en)"] and stats["tokens_per_sample"] == 2048
    assert len(items(bins / "pile-lm" / "valid")) == stats["splits"]["valid"]["documents"]


# --- real data, when ../shared/data is there --------------------------------------------------

needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="no ../shared/data")


@pytest.mark.slow
@needs_shared
def test_real_wikitext2(tmp_path):
    """WikiText-2 word level (its train split is not shipped there: valid stands in for it)."""
    src = SHARED_DATA / "wikitext-2"
    text = tmp_path / "wikitext-2"
    text.mkdir()
    for split, name in (("train", "valid"), ("valid", "valid"), ("test", "test")):
        (text / f"wiki.{split}.tokens").symlink_to(src / f"wiki.{name}.tokens")
    stats = wikitext.prepare(text, tmp_path / "bin", workers=2)
    for split in ("valid", "test"):
        raw = (text / f"wiki.{split}.tokens").read_text(encoding="utf-8")
        tokens = sum(len(line.split()) + 1 for line in raw.splitlines())
        assert stats[split]["tokens"] == tokens
        assert sum(len(s) for s in items(tmp_path / "bin" / split)) == tokens
    # the dictionary is valid's own: its only <unk> are WikiText's
    valid_words = (text / "wiki.valid.tokens").read_text(encoding="utf-8").split()
    assert stats["valid"]["unk"] == valid_words.count("<unk>") > 0

    task = fairseq_task(tmp_path / "bin", "--task", "language_modeling")
    task.load_dataset("test")
    assert sum(task.dataset("test").sizes) == stats["test"]["tokens"]


@pytest.mark.slow
@needs_shared
def test_real_glue_sst2_cola_stsb(tmp_path):
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    # the real files, but SST-2's 67k training rows cut to their first 3000 (time)
    glue_dir = tmp_path / "glue"
    for task in ("SST-2", "CoLA", "STS-B"):
        shutil.copytree(SHARED_DATA / "glue" / task, glue_dir / task, symlinks=True)
    sst_train = glue_dir / "SST-2" / "train.tsv"
    sst_train.write_text("".join(sst_train.read_text(encoding="utf-8").splitlines(True)[:3001]),
                         encoding="utf-8")
    bpe_files = SHARED_DATA / "gpt2_bpe"
    rows = glue.prepare(glue_dir, tmp_path / "bin", ["SST-2", "CoLA", "STS-B"],
                        Gpt2BpeEncoder.from_dir(bpe_files), workers=2)
    bpe = get_encoder(str(bpe_files / "encoder.json"), str(bpe_files / "vocab.bpe"))
    for task, headerless in (("SST-2", False), ("CoLA", True), ("STS-B", False)):
        folder = glue_dir / task
        for split, name in (("train", "train"), ("valid", "dev"), ("test", "test")):
            text = (folder / f"{name}.tsv").read_text(encoding="utf-8")
            n = len(text.rstrip("\n").split("\n")) - (0 if headerless and name != "test" else 1)
            assert rows[task][split] == n, (task, split)
        out = tmp_path / "bin" / f"{task}-bin"
        sp_task = sentence_prediction(out, task)
        sp_task.load_dataset("valid")
        assert len(sp_task.dataset("valid")) == rows[task]["valid"]
        # the first dev sentence decodes back from the binaries
        first = (folder / "dev.tsv").read_text(encoding="utf-8").split("\n")
        row = first[0 if headerless else 1].split("\t")
        column = {"SST-2": 0, "CoLA": 3, "STS-B": 7}[task]
        ids = items(out / "input0" / "valid")[0][:-1]
        d = sp_task.source_dictionary
        assert bpe.decode([int(d[i]) for i in ids]) == row[column].strip()
