"""The data pipelines' input and output: what they read, what they write, how they fail.

* :func:`atomic_directory`: outputs are written to a hidden temporary folder beside the
  destination and renamed into place only when everything succeeded, so an error, Ctrl-C or
  SIGTERM never leaves a half-written dataset behind;
* :func:`read_batches`: streams a text, ``.jsonl`` or ``.jsonl.zst`` file in numbered batches of
  lines with a progress bar over its bytes (a 14 GB shard is never held in memory);
* :class:`IndexedWriter`: fairseq's mmap indexed dataset, the format ``fairseq-preprocess``
  writes;
* :func:`run_cli`: turns :class:`DataError` into a one-line message and exit status 1.

The worker processes that encode between reading and writing are
:mod:`fairseq_alibi.preprocess.process_pool`.
"""

import contextlib
import io
import json
import logging
import os
import select
import signal
import stat
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from fairseq_alibi import files

logger = logging.getLogger("fairseq_alibi.preprocess")


class DataError(Exception):
    """Malformed input or unusable arguments; the message names the file/row and the fix."""


def require(module: str):
    """Import an optional dependency of the pipelines, or say how to install it."""
    try:
        return __import__(module)
    except ImportError as e:
        raise DataError(
            f"this pipeline needs the '{module}' package: pip install {module} "
            f"(or pip install 'fairseq-alibi[examples]')"
        ) from e


def _taken(path) -> DataError:
    return DataError(f"{path} already exists and is not empty; pass --overwrite to replace it")


#: the files a pipeline writes into its output folder, which appears whole or not at all
#: (:func:`atomic_directory`): a folder with none of them is no complete output of a pipeline
#: (``pairs.json``: the parallel-text pipeline's; the others write ``stats.json``)
OUTPUT_MARKS = ("stats.json", "pairs.json")


def _not_an_output(dest: Path, own=None) -> Optional[str]:
    """Why ``dest``, a non-empty folder, is no complete output of a pipeline (it holds none of
    :data:`OUTPUT_MARKS`; ``own(name)``: whether an entry is one this output consists of, for a
    folder with no mark of its own), naming a few of its entries; else None."""
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in dest.iterdir())
    if any((dest / mark).is_file() for mark in OUTPUT_MARKS) or (
            own is not None and all(own(name) for name in entries)):
        return None
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    return f"is no pipeline's output (no {' or '.join(OUTPUT_MARKS)}; it holds {shown})"


def _refuse_replacing(dest: Path, own=None) -> None:
    """``--overwrite`` replaces the whole folder: refused for one that is no pipeline's output,
    whose other files it would delete."""
    cwd = Path.cwd().resolve()
    if dest.is_dir() and dest.resolve() in (cwd, *cwd.parents):
        raise DataError(f"{dest} is or holds the current folder: --overwrite replaces the "
                        "whole folder; give --destdir another folder (or run from outside it)")
    why = _not_an_output(dest, own) if dest.is_dir() and any(dest.iterdir()) else None
    if why:
        raise DataError(f"{dest} {why}: --overwrite would replace the whole folder, deleting "
                        "what else it holds; give --destdir a new or empty folder (or a "
                        "pipeline's output)")


def refuse_existing(dest, overwrite: bool = False, inputs=(), skip_existing: bool = False,
                    own=None):
    """What :func:`atomic_directory` refuses, checked before any work: every destination of a
    run is checked before anything is written, so that a refused run writes nothing.

    ``inputs``: the files the run reads (a destination that is, holds or lies inside one is
    refused: ``--overwrite`` would delete it). With ``skip_existing`` a non-empty ``dest`` is
    no error: True is returned (and said in one line), and the caller leaves it as it is.
    Either way a non-empty folder that is no pipeline's output is refused (``own``: see
    :func:`_not_an_output`): replaced, its other files would be lost; kept, it may be half
    written."""
    dest = files.refuse_taken(dest, True, None, inputs, DataError)  # a file; an input at stake
    if skip_existing and not overwrite and dest.is_dir() and any(dest.iterdir()):
        why = _not_an_output(dest, own)
        if why:  # left by another tool or a crashed run: not what a re-run should keep
            raise DataError(f"{dest} {why}: --skip-existing keeps only a pipeline's complete "
                            "output; if it is a complete dataset (e.g. fairseq-preprocess's), "
                            "train on it as it is and leave it out of this run, else give "
                            "another --destdir")
        print(f"skipped {dest}: it already exists (--overwrite rebuilds it)", flush=True)
        return True
    if overwrite:
        _refuse_replacing(dest, own)
    files.refuse_taken(dest, overwrite, _taken, inputs, DataError)
    return False


def add_output_arguments(parser, what="a non-empty --destdir"):
    """``--overwrite`` and ``--skip-existing``, one or the other, as every pipeline spells them."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--overwrite", action="store_true",
                       help=f"replace {what} (only once the new output is complete)")
    group.add_argument("--skip-existing", action="store_true",
                       help="leave an output that already exists as it is (said in one line) and "
                       "build the missing ones, so that a re-run adds what is new")
    return group


#: the outputs this process completed (:func:`atomic_directory`), which an interrupted run of
#: several (GLUE's tasks) names: they are written, the rest is not
COMPLETED = []


@contextlib.contextmanager
def atomic_directory(dest, overwrite: bool = False, inputs=(), own=None):
    """:func:`fairseq_alibi.files.atomic_directory`, refusing a non-empty ``dest`` (without
    ``overwrite``), a file, or a destination clashing with ``inputs`` with a
    :class:`DataError`, and with ``overwrite`` a folder that is no pipeline's output (whose
    other files the replacement would delete). A SIGTERM (:func:`run_cli`) unwinds through it
    too."""
    if overwrite:
        _refuse_replacing(Path(dest).absolute(), own)
    with files.atomic_directory(dest, overwrite, _taken, inputs, DataError) as partial:
        yield partial
    COMPLETED.append(Path(dest))


class _SilentBar:
    def update(self, n=1): pass
    def set_postfix_str(self, s): pass
    def close(self): pass


def progress_bar(total=None, desc="", unit="B", enabled=True, position=0):
    """A tqdm bar on stderr: live on a terminal, a line every 30 s in a log file.

    A silent stand-in when ``enabled`` is false or tqdm is not installed (progress bars are a
    nicety, not a requirement).
    """
    try:
        from tqdm import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        return _SilentBar()
    tqdm.monitor_interval = 0  # no monitor thread: the pipelines fork worker processes
    return tqdm(
        total=total, desc=desc, unit=unit, unit_scale=unit == "B",
        unit_divisor=1024 if unit == "B" else 1000, position=position,
        mininterval=0.5 if sys.stderr.isatty() else 30.0, file=sys.stderr, leave=True,
    )


class _CountingReader(io.RawIOBase):
    """A binary reader that reports how many bytes it has read (progress over the raw file).

    A pipe is read only once it has data (or has ended), waited for in half-second steps: Python
    runs a signal's handler between bytecodes, so a SIGTERM that lands just before a blocking
    ``read`` of an idle pipe would wait for the pipe's next byte (forever, if it never comes);
    with the steps it is handled within half a second. Regular files never block for long.
    """

    def __init__(self, raw, on_read):
        self._raw, self._on_read = raw, on_read
        self._wait = os.name == "posix" and not stat.S_ISREG(os.fstat(raw.fileno()).st_mode)

    def readable(self):
        return True

    def readinto(self, buffer):
        while self._wait and not select.select([self._raw], [], [], 0.5)[0]:
            pass
        n = self._raw.readinto(buffer)
        if n:
            self._on_read(n)
        return n

    def close(self):
        self._raw.close()
        super().close()


class _ZstdFrames(io.RawIOBase):
    """Every frame of a ``.zst`` stream, decompressed; an incomplete last frame is an error.

    ``zstandard``'s ``stream_reader`` stops silently at the end of a truncated file (and, by
    default, after the first frame), which would lose documents without a word.
    """

    def __init__(self, raw):
        zstandard = require("zstandard")
        self._error = zstandard.ZstdError
        # the Pile's shards use long windows: allow them rather than fail on the frame header
        self._dctx = zstandard.ZstdDecompressor(max_window_size=2**31)
        self._raw = raw
        self._frame = None  # decompressor of the frame being read
        self._input = b""  # compressed bytes not fed yet
        self._output, self._offset = b"", 0  # decompressed bytes, how many already returned

    def readable(self):
        return True

    def readinto(self, buffer):
        while self._offset == len(self._output):
            if not self._input:
                self._input = self._raw.read(1 << 20)
                if not self._input:
                    if self._frame is not None:
                        raise self._error("the file ends inside a frame (truncated)")
                    return 0
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            self._output, self._offset = self._frame.decompress(self._input), 0
            self._input = b""
            if self._frame.eof:  # the next frame, if any, starts in the unused bytes
                self._input, self._frame = self._frame.unused_data, None
        n = min(len(buffer), len(self._output) - self._offset)
        buffer[:n] = self._output[self._offset: self._offset + n]
        self._offset += n
        return n

    def close(self):
        self._raw.close()
        super().close()


def open_text(path, on_read=lambda n: None, newline=None, encoding="utf-8"):
    """Open a UTF-8 text file, decompressing ``.zst`` on the fly; ``on_read(n)`` counts raw bytes.

    ``newline`` is :func:`open`'s: None splits lines as ``fairseq-preprocess`` reads them
    (``\\n``, ``\\r\\n`` or ``\\r``), ``"\\n"`` as ``cut`` and ``awk`` do.
    """
    path = Path(path)
    raw = _CountingReader(open(path, "rb", buffering=0), on_read)  # one read() a call
    if path.suffix == ".zst":
        raw = _ZstdFrames(raw)
    return io.TextIOWrapper(io.BufferedReader(raw, 1 << 20), encoding=encoding, newline=newline)


def not_utf8(path, newline=None) -> "DataError":
    """The :class:`DataError` of a file that is not UTF-8 text, naming its first line that is
    not: the decoder reads ahead in chunks, so the line where it failed is not that line. The
    file is read again as Latin-1 (every byte a character, the same line ends) and each line
    decoded on its own; UTF-8 never puts a line end inside a character."""
    fix = (f"convert the file to UTF-8 (iconv -f <its encoding> -t UTF-8 {path}) or fix that "
           f"line")
    with open_text(path, newline=newline, encoding="latin-1") as f:
        for lineno, line in enumerate(f, 1):
            raw = line.encode("latin-1")
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return DataError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                                 f"byte {e.start + 1} of the line); {fix}")
    return DataError(f"{path}: not UTF-8 text; {fix}")


def read_batches(path, batch_lines: int = 1000, desc=None, newline=None):
    """Yield ``(path, first line number, lines)`` batches of a text file, with a progress bar.

    Lines keep their line end; ``newline`` is :func:`open_text`'s. Undecodable bytes and
    corrupt ``.zst`` streams raise :class:`DataError` naming the file and the last good line.
    """
    path = Path(path)
    size = path.stat().st_size if path.is_file() else None  # a pipe has no size
    bar = progress_bar(total=size, desc=desc or path.name)
    lineno, batch, first = 0, [], 1
    try:
        with open_text(path, bar.update, newline) as f:
            try:
                for line in f:
                    lineno += 1
                    batch.append(line)
                    if len(batch) == batch_lines:
                        yield str(path), first, batch
                        batch, first = [], lineno + 1
            except UnicodeDecodeError as e:
                raise not_utf8(path, newline) from e
            except Exception as e:  # zstandard.ZstdError, without importing zstandard here
                if type(e).__name__ != "ZstdError":
                    raise
                raise DataError(
                    f"{path}: corrupt or truncated zstd stream after line {lineno} ({e}); "
                    "download the file again"
                ) from e
        if batch:
            yield str(path), first, batch
    finally:
        bar.close()


class IndexedWriter:
    """Writes ``<prefix>.bin``/``<prefix>.idx`` as ``fairseq-preprocess`` does (mmap format)."""

    def __init__(self, prefix, vocab_size: int, unk=None):
        from fairseq.data import indexed_dataset

        self.prefix = str(prefix)
        self._builder = indexed_dataset.make_builder(
            self.prefix + ".bin", impl="mmap", vocab_size=vocab_size
        )
        self.items = 0
        self.tokens = 0
        self._unk = unk  # the dictionary's <unk> index, counted in ``unk`` (None: not counted)
        self.unk = 0

    def add(self, ids: np.ndarray):
        import torch

        ids = np.asarray(ids, dtype=np.int64)
        self._builder.add_item(torch.from_numpy(ids))
        self.items += 1
        self.tokens += len(ids)
        if self._unk is not None:
            self.unk += int((ids == self._unk).sum())

    def finalize(self, empty_reason="no input"):
        """Write the index; an empty split is an error (fairseq cannot even open one)."""
        self._builder.finalize(self.prefix + ".idx")
        if not self.items:
            # the split's name: its folder is a temporary one until the whole output is done
            raise DataError(f"nothing to write to the {Path(self.prefix).name} split: "
                            f"{empty_reason}")


def save_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)  # SystemExit unwinds through atomic_directory's cleanup


def run_cli(main, argv=None) -> int:
    """Run a pipeline's ``main(argv)``: logging to stderr, clean exit on errors and SIGTERM."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        level=logging.INFO, stream=sys.stderr,
    )
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    COMPLETED.clear()  # this run's
    try:
        main(argv)
    except DataError as e:
        _close_bars()  # the error is the last line, not a bar's final state after it
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # atomic_directory has removed the partial output on its way up
        _close_bars()
        done = (f"wrote {', '.join(map(str, COMPLETED))}, nothing else" if COMPLETED
                else "nothing written")
        print(f"interrupted: {done} (an existing output is as it was)", file=sys.stderr)
        return 130
    return 0


def _close_bars():
    """Close the progress bars still open (tqdm prints each one's last state on closing)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
