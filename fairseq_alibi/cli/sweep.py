"""Length-extrapolation sweep: perplexity of language models at several evaluation lengths.

Every point is one run of stock ``fairseq-eval-lm`` (with this package's ``--user-dir``), at
``--tokens-per-sample N`` for each evaluation length ``N``, in two modes:

* ``nonoverlapping``: the test text is cut into blocks of ``N`` tokens, each scored on its own
  (the ALiBi paper's main evaluation; a token's context is its offset within its block);
* ``sliding``: windows of ``N`` tokens advance by a stride ``S`` (default ``N // 2``,
  ``--context-window N - S``); only the last ``S`` tokens of each window are scored, so every
  token after the first window sees at least ``N - S`` tokens of context.

``fairseq-eval-lm`` silently skips samples longer than a model's maximum positions and then
prints "Evaluated 0 tokens ... Perplexity: 1.00". The sweep therefore parses the evaluated-token
count of every run and refuses to report a perplexity unless it equals the number of tokens of
the evaluated split (read from the binarized data): all points of one sweep score exactly the
same tokens. A model with position embeddings (stock sinusoidal ``transformer_lm``) evaluated
beyond its training length needs its limits raised at load time with
:func:`position_overrides`; an ALiBi model needs nothing.

Python::

    from fairseq_alibi.cli.sweep import SweepModel, position_overrides, run_sweep
    result = run_sweep(
        {"ALiBi": "ckpt/alibi/checkpoint_last.pt",
         "Sinusoidal": SweepModel("ckpt/sin/checkpoint_last.pt", overrides=position_overrides)},
        data="data-bin/wikitext-103", lengths=[512, 1024, 2048, 3072], out_dir="sweep",
        train_length=512,
    )
    result.check()  # raises SweepError if any point was refused

Command line::

    fairseq-alibi sweep --path ALiBi=ckpt/alibi/checkpoint_last.pt \\
        --data data-bin/wikitext-103 --lengths 512,1024,2048,3072 --out sweep
    fairseq-alibi sweep --path ckpt/sin/checkpoint_last.pt --sinusoidal-overrides ...
    fairseq-alibi sweep --path ALiBi=... --train-length 512 --slope-interpolation ...

Outputs in ``out_dir``: ``extrapolation.csv`` (one row per point), ``extrapolation.md`` (one
table per mode, models as rows, lengths as columns), ``extrapolation.png`` (perplexity against
evaluation length, one panel per mode) and ``logs/`` (the output of every run). The command
line refuses an ``--out`` that is not empty; ``--overwrite`` replaces an earlier sweep's results
and logs there.
"""

import argparse
import csv
import logging
import math
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

from fairseq_alibi.cli import fairseq_runs
from fairseq_alibi.cli.fairseq_runs import console_script, thread_env
from fairseq_alibi.cli.checkpoint_io import model_config, read_language_model
from fairseq_alibi.config_access import cfg_get, overrides_dict
from fairseq_alibi.files import refuse_taken
from fairseq_alibi.paths import user_dir
from fairseq_alibi.preprocess.pipeline_io import progress_bar

MODES = ("nonoverlapping", "sliding")
MODE_TITLES = {
    "nonoverlapping": "Non-overlapping evaluation",
    "sliding": "Sliding-window evaluation",
}


class SweepError(RuntimeError):
    """A run failed, or its perplexity cannot be trusted (tokens were dropped)."""


def position_overrides(length: int) -> dict:
    """Load-time overrides that let a sinusoidal ``transformer_lm`` read ``length`` tokens.

    Without them ``fairseq-eval-lm`` skips every sample longer than the training length.
    (Sinusoidal embeddings are computed, not learned, so any length can be built; a model
    with *learned* position embeddings cannot be evaluated beyond them at all.)
    """
    return {"max_target_positions": int(length), "tokens_per_sample": int(length)}


def slope_interpolation(train_length: int, trained_scale: float = 1.0) -> Callable[[int], dict]:
    """Load-time overrides scaling an ALiBi model's slopes by ``L_train / N`` beyond ``L_train``.

    At evaluation length ``N > L_train`` every slope is multiplied by ``L_train / N`` (the bias
    at distance ``N`` then equals the trained one at ``L_train``); up to ``L_train`` the model
    is evaluated as trained. An override replaces the saved ``alibi_slope_scale``, so a model
    trained with one (``trained_scale``: :func:`trained_slope_scale`) gets that times
    ``L_train / N``. Use as ``SweepModel(path, overrides=slope_interpolation(L, s))``.
    """
    if not train_length > 0:
        raise ValueError(f"slope interpolation needs the training length, got {train_length}")

    def overrides(length: int) -> dict:
        return {"alibi_slope_scale": trained_scale * min(1.0, train_length / length)}

    return overrides


def trained_slope_scale(state) -> float:
    """The ``alibi_slope_scale`` a checkpoint's ``state`` was saved with (the declared default
    where none)."""
    from fairseq_alibi.options import default_of

    return float(cfg_get(model_config(state), "alibi_slope_scale") or default_of("slope_scale"))


@dataclass(frozen=True)
class SweepModel:
    """A checkpoint to sweep, with optional load-time overrides that depend on the length.

    ``overrides(length) -> dict`` becomes ``--model-overrides`` of each run, for example
    :func:`position_overrides`, or ``lambda n: {"alibi_slope_scale": L / n}`` for slope
    interpolation. ``eval_args`` are extra ``fairseq-eval-lm`` arguments for this model only.
    """

    path: str
    overrides: Optional[Callable[[int], dict]] = None
    eval_args: Sequence[str] = ()


@dataclass
class SweepPoint:
    """One ``fairseq-eval-lm`` run. ``perplexity`` is None when the point was refused."""

    model: str
    mode: str
    length: int
    context_window: int
    tokens: int
    expected_tokens: Optional[int]
    loss_base2: Optional[float]
    perplexity: Optional[float]
    seconds: float
    log: str
    refused: str = ""  # why no perplexity is reported; empty when it is


@dataclass
class SweepResult:
    points: List[SweepPoint]
    models: List[str]
    lengths: List[int]
    modes: List[str]
    out_dir: Path
    train_length: Optional[int] = None
    files: Dict[str, Path] = field(default_factory=dict)

    def perplexity(self, model: str, mode: str, length: int) -> Optional[float]:
        return self._point(model, mode, length).perplexity

    def _point(self, model, mode, length) -> SweepPoint:
        for p in self.points:
            if (p.model, p.mode, p.length) == (model, mode, length):
                return p
        raise KeyError((model, mode, length))

    @property
    def refused(self) -> List[SweepPoint]:
        return [p for p in self.points if p.refused]

    def check(self):
        """Raise :class:`SweepError` naming every refused point."""
        if self.refused:
            lines = [f"  {p.model} {p.mode} N={p.length}: {p.refused} (log: {p.log})"
                     for p in self.refused]
            raise SweepError("no perplexity reported for:\n" + "\n".join(lines))

    def markdown(self) -> str:
        return format_markdown(self)


# ---------------------------------------------------------------------------------------------
# one run


def context_window(length: int, mode: str, stride: Optional[int] = None) -> int:
    """``--context-window`` of a mode: 0, or ``length - stride`` (stride ``length // 2``)."""
    if mode == "nonoverlapping":
        return 0
    if mode != "sliding":
        raise ValueError(f"unknown evaluation mode {mode!r}; choose from {', '.join(MODES)}")
    stride = stride or max(1, length // 2)
    if not 0 < stride < length:
        raise ValueError(
            f"the sliding-window stride must lie between 1 and the length - 1 ({length - 1}), "
            f"got {stride}"
        )
    return length - stride


def eval_command(
    model: SweepModel,
    data: str,
    length: int,
    mode: str,
    stride: Optional[int] = None,
    gen_subset: str = "test",
    extra_eval_args: Sequence[str] = (),
) -> List[str]:
    """The ``fairseq-eval-lm`` command line of one point."""
    cmd = [
        console_script("fairseq-eval-lm"), str(data),
        "--user-dir", user_dir(),
        "--path", str(model.path),
        "--gen-subset", gen_subset,
        "--tokens-per-sample", str(length),
        "--context-window", str(context_window(length, mode, stride)),
        "--num-workers", "0",
        "--no-progress-bar",
    ]
    if model.overrides is not None:
        cmd += ["--model-overrides", repr(dict(model.overrides(length)))]
    return cmd + [str(a) for a in extra_eval_args] + [str(a) for a in model.eval_args]


_EVALUATED = re.compile(r"Evaluated ([\d,]+) tokens")
_LOSS = re.compile(r"Loss \(base 2\): ([-\d.eE+naif]+), Perplexity: ([-\d.eE+naif]+)")


def parse_eval_output(text: str):
    """``(tokens, loss_base2)`` from ``fairseq-eval-lm``'s output; SweepError if absent."""
    tokens = _EVALUATED.findall(text)
    loss = _LOSS.findall(text)
    if not tokens or not loss:
        raise SweepError(
            "fairseq-eval-lm printed no 'Evaluated N tokens' / 'Loss (base 2)' lines; "
            "is this fairseq's eval_lm? Output tail:\n" + text[-2000:]
        )
    return int(tokens[-1].replace(",", "")), float(loss[-1][0])


def split_token_count(data: str, subset: str = "test") -> Optional[int]:
    """Tokens (end-of-line tokens included) of a binarized split; None if unreadable."""
    from fairseq.data import data_utils

    first_shard = str(data).split(os.pathsep)[0]
    logging.getLogger("fairseq.data.data_utils").setLevel(logging.WARNING)
    dataset = data_utils.load_indexed_dataset(os.path.join(first_shard, subset), None)
    return None if dataset is None else int(dataset.sizes.sum())


def refusal(tokens: int, expected: Optional[int], loss: float) -> str:
    """Why a run's perplexity must not be reported ('' when it may)."""
    if tokens == 0:
        return ("0 tokens evaluated: fairseq-eval-lm skipped every sample, longer than the "
                "model's maximum positions (for a model with position embeddings, use "
                "position_overrides / --sinusoidal-overrides)")
    if expected is not None and tokens < expected:
        return (f"only {tokens:,} of the {expected:,} tokens evaluated: samples longer than "
                f"the model's maximum positions were dropped")
    if expected is not None and tokens > expected:
        return f"{tokens:,} tokens evaluated but the split holds {expected:,}"
    if not math.isfinite(loss):
        return f"the loss is not finite ({loss})"
    return ""


def _run_point(name, model, data, length, mode, stride, gen_subset, extra, env, log_dir,
               expected) -> SweepPoint:
    cmd = eval_command(model, data, length, mode, stride, gen_subset, extra)
    log = log_dir / f"{_slug(name)}_{mode}_{length}.log"
    started = time.time()
    proc = fairseq_runs.run(cmd, env)
    seconds = time.time() - started
    output = proc.stdout + proc.stderr
    tmp = log.with_suffix(".log.tmp")
    tmp.write_text("$ " + " ".join(_quote(c) for c in cmd) + "\n" + output)
    os.replace(tmp, log)
    if proc.returncode != 0:  # its last line: the plugin's hint, or the error itself
        last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
        raise SweepError(
            f"fairseq-eval-lm failed for {name} ({mode}, N={length}), exit {proc.returncode}: "
            f"{last.strip()} (full output in {log})")
    tokens, loss = parse_eval_output(output)
    why = refusal(tokens, expected, loss)
    return SweepPoint(
        model=name, mode=mode, length=length,
        context_window=context_window(length, mode, stride), tokens=tokens,
        expected_tokens=expected, loss_base2=None if why else loss,
        perplexity=None if why else 2.0 ** loss, seconds=round(seconds, 2), log=str(log),
        refused=why,
    )


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "model"


def _quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w@%+=:,./-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


# ---------------------------------------------------------------------------------------------
# the sweep


# long: a public function whose signature and docstring name every option of the sweep
def run_sweep(
    models: Mapping[str, Union[str, Path, SweepModel]],
    data,
    lengths: Sequence[int],
    out_dir,
    modes: Sequence[str] = MODES,
    extra_eval_args: Sequence[str] = (),
    stride: Optional[int] = None,
    gen_subset: str = "test",
    train_length: Optional[int] = None,
    jobs: int = 1,
    threads: Optional[int] = None,
    progress: bool = True,
    title: Optional[str] = None,
    overwrite: Optional[bool] = None,
) -> SweepResult:
    """Evaluate every model at every length in every mode; write CSV, Markdown and PNG.

    ``models`` maps a row name to a checkpoint path or a :class:`SweepModel`; rows keep that
    order. ``extra_eval_args`` go to every ``fairseq-eval-lm`` run (e.g. ``["--cpu"]``,
    ``["--max-tokens", "4096"]``; load-time overrides belong in ``SweepModel.overrides``).
    ``jobs`` runs are in flight at once, each with ``threads`` OpenMP threads (default: the
    environment's ``OMP_NUM_THREADS``, else the CPU count divided by ``jobs``).
    ``train_length`` marks the training length in the table and plot. ``overwrite``: see
    :func:`output_folder` (the default writes into ``out_dir`` as it is).

    Points whose token count differs from the split's are kept with ``perplexity=None`` and a
    ``refused`` reason, shown as such in every output; call :meth:`SweepResult.check` to turn
    them into an error. A failing run raises :class:`SweepError` at once.
    """
    if not models:
        raise ValueError("no models to sweep")
    if any("--model-overrides" in str(a) for a in extra_eval_args):
        raise ValueError("pass load-time overrides as SweepModel(path, overrides=...), not in "
                         "extra_eval_args (one --model-overrides per run is built from them)")
    lengths = sorted({int(n) for n in lengths})
    if not lengths or lengths[0] < 2:
        raise ValueError(f"evaluation lengths must be at least 2 tokens, got {lengths}")
    for mode in modes:
        for n in lengths:
            context_window(n, mode, stride)  # validates mode and stride before any run
    specs = {name: m if isinstance(m, SweepModel) else SweepModel(str(m))
             for name, m in models.items()}
    slugs = [_slug(name) for name in specs]
    if len(set(slugs)) < len(slugs):
        raise ValueError(f"model names {list(specs)} give clashing log file names; rename them")
    for name, spec in specs.items():
        if not Path(spec.path).is_file():
            raise FileNotFoundError(f"checkpoint of {name!r} not found: {spec.path}")
    if not Path(str(data).split(os.pathsep)[0]).is_dir():
        raise FileNotFoundError(f"binarized data folder not found: {data}")

    out = output_folder(out_dir, overwrite)
    log_dir = out / "logs"
    expected = split_token_count(data, gen_subset)
    if expected == 0:
        raise SweepError(f"the {gen_subset} split of {data} holds no tokens")
    jobs = max(1, int(jobs))
    threads = threads or int(os.environ.get("OMP_NUM_THREADS", 0)) or max(
        1, (os.cpu_count() or 1) // jobs
    )
    env = thread_env(threads)

    tasks = [(name, mode, n) for name in specs for mode in modes for n in lengths]
    points = [None] * len(tasks)
    bar = progress_bar(len(tasks), "evaluating", unit="run", enabled=progress)
    lock = threading.Lock()

    def work(i):
        name, mode, n = tasks[i]
        point = _run_point(name, specs[name], data, n, mode, stride, gen_subset,
                           extra_eval_args, env, log_dir, expected)
        with lock:
            points[i] = point
            shown = "refused" if point.refused else f"ppl {point.perplexity:.2f}"
            bar.set_postfix_str(f"{name} {mode} N={n}: {shown}")
            bar.update(1)

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for future in [pool.submit(work, i) for i in range(len(tasks))]:
                future.result()  # re-raises the first failure
    finally:
        bar.close()

    if expected is None:  # unknown split size: all points must at least agree
        most = max(p.tokens for p in points)
        for p in points:
            if p.tokens < most and not p.refused:
                p.refused = (f"only {p.tokens:,} tokens evaluated, {most:,} at other points: "
                             "samples were dropped")
                p.perplexity = p.loss_base2 = None

    result = SweepResult(points, list(specs), lengths, list(modes), out, train_length)
    write_outputs(result, title=title)
    return result


# ---------------------------------------------------------------------------------------------
# outputs

STEM = "extrapolation"
#: what a sweep writes in its folder: write_outputs' files and the runs' logs
SWEEP_OUTPUTS = ("logs", *(f"{STEM}.{ext}" for ext in ("csv", "md", "png")))


def output_folder(out_dir, overwrite: Optional[bool] = None) -> Path:
    """``out_dir`` made ready for a sweep (with ``logs/``), or a :class:`SweepError` naming the
    fix: when it is a file, or (``overwrite`` False) a folder that is not empty. ``overwrite``
    True removes an earlier sweep's results and logs first, so that none of them mix with the
    new ones (nothing else in the folder is touched); None writes into the folder as it is (a
    caller's own folder, as the quickstart's)."""
    out = Path(out_dir)
    try:  # None or True: only a file in the way is refused
        refuse_taken(out, overwrite is not False, not_empty=lambda _: SweepError(
            f"--out {out} already exists and is not empty; pass --overwrite to replace the "
            "results of the sweep there, or give a new folder"))
    except FileExistsError as e:  # a file at --out (or above it): files.py says which
        raise SweepError(f"--out {e}") from None
    if overwrite:
        for target in (out / name for name in SWEEP_OUTPUTS):
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    return out


CSV_FIELDS = [f for f in SweepPoint.__dataclass_fields__]


def _cell(point: SweepPoint) -> str:
    return f"{point.perplexity:.2f}" if point.perplexity is not None else "refused"


def format_markdown(result: SweepResult, title: Optional[str] = None) -> str:
    """One table per mode: perplexity, models as rows, evaluation lengths as columns."""
    lines = []
    if title:
        lines += [f"## {title}", ""]
    for mode in result.modes:
        heads = [f"{n} (L)" if n == result.train_length else str(n) for n in result.lengths]
        lines += [f"### {MODE_TITLES.get(mode, mode)}: perplexity by evaluation length", ""]
        lines.append("| model | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---:|" * len(heads))
        for model in result.models:
            cells = [_cell(result._point(model, mode, n)) for n in result.lengths]
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        counts = sorted({p.tokens for p in result.points if p.mode == mode})
        expected = next((p.expected_tokens for p in result.points), None)
        note = f"Tokens evaluated: {', '.join(f'{c:,}' for c in counts)}"
        if expected is not None:
            note += f" (the split holds {expected:,})"
        if mode == "sliding":
            strides = {p.length: p.length - p.context_window for p in result.points
                       if p.mode == mode}
            note += "; stride " + ", ".join(f"{s} at N={n}" for n, s in sorted(strides.items()))
        lines += ["", note + ".", ""]
    # fairseq-eval-lm prints the loss to 4 decimals and the perplexity to 2: 2 ** loss is the
    # finer figure below a perplexity of about 144, and may differ from the log's last digit
    lines += ["Perplexity: 2 ** the base-2 loss fairseq-eval-lm printed (4 decimals), as in "
              "the csv; it can differ in the last digit from the perplexity its log prints.", ""]
    refused = result.refused
    if refused:
        lines += ["Refused points (no perplexity reported):", ""]
        lines += [f"- {p.model}, {p.mode}, N={p.length}: {p.refused}" for p in refused]
        lines.append("")
    return "\n".join(lines)


def write_outputs(result: SweepResult, title: Optional[str] = None, stem: str = STEM):
    """Write ``<stem>.csv``, ``<stem>.md`` and ``<stem>.png`` into ``result.out_dir``."""
    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path, png_path = (out / f"{stem}.{ext}" for ext in ("csv", "md", "png"))

    tmp = csv_path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for p in result.points:
            writer.writerow(asdict(p))
    os.replace(tmp, csv_path)

    tmp = md_path.with_suffix(".md.tmp")
    tmp.write_text(format_markdown(result, title))
    os.replace(tmp, md_path)

    missing = plot(result, png_path, title)
    result.files = {"csv": csv_path, "markdown": md_path}
    if missing:  # the figures are in the CSV and the table: no work is lost
        logging.getLogger(__name__).warning(missing)
    else:
        result.files["png"] = png_path
    return result.files


def plot(result: SweepResult, path, title: Optional[str] = None) -> Optional[str]:
    """Perplexity against evaluation length, one panel per mode (as in the ALiBi paper); or
    why it was not drawn (matplotlib, an optional package, not installed)."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's root logger is verbose
    try:
        import matplotlib
    except ImportError:
        return (f"no {Path(path).name}: matplotlib is not installed (pip install matplotlib, "
                "or pip install 'fairseq-alibi[examples]')")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result.modes), figsize=(5.2 * len(result.modes), 4.2),
                             squeeze=False, sharey=True)
    values = [p.perplexity for p in result.points if p.perplexity is not None]
    log_y = bool(values) and max(values) / min(values) > 3
    markers = "osD^v<>p*h"
    for ax, mode in zip(axes[0], result.modes):
        for i, model in enumerate(result.models):
            xs, ys = [], []
            for n in result.lengths:
                ppl = result.perplexity(model, mode, n)
                if ppl is not None:
                    xs.append(n)
                    ys.append(ppl)
            ax.plot(xs, ys, marker=markers[i % len(markers)], label=model)
        if result.train_length:
            ax.axvline(result.train_length, color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"trained at L={result.train_length}", (result.train_length, 0.97),
                        xycoords=("data", "axes fraction"), ha="left", va="top", fontsize=8,
                        color="grey", xytext=(3, 0), textcoords="offset points")
        ax.set_xscale("log", base=2)
        ax.set_xticks(result.lengths)
        ax.set_xticklabels([str(n) for n in result.lengths])
        ax.minorticks_off()
        if log_y:
            ax.set_yscale("log")
        ax.set_title(MODE_TITLES.get(mode, mode), fontsize=10)
        ax.set_xlabel("evaluation length (tokens)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("perplexity" + (" (log scale)" if log_y else ""))
    axes[0][0].legend()
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return None


# ---------------------------------------------------------------------------------------------
# command line


def _parse_path(spec: str):
    name, sep, path = spec.partition("=")
    if not sep or "/" in name or not name:  # no NAME= prefix: name the row after the folder
        path = spec
        name = Path(spec).parent.name or Path(spec).stem
    return name, path


def _lengths(text: str) -> List[int]:
    """``--lengths 512,1024``: whole numbers of at least 2 tokens (argparse reports the error)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        lengths = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers of tokens, e.g. 512,1024,2048, got {text!r}")
    if not lengths or min(lengths) < 2:
        raise argparse.ArgumentTypeError(
            f"every evaluation length must be at least 2 tokens, got {text!r}")
    return lengths


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


#: what the sweep evaluates, said when a checkpoint holds something else
SWEPT_MODELS = "the sweep evaluates language models with fairseq-eval-lm; give one with --path"


def _overrides(text: str) -> dict:
    """``--model-overrides``: a Python dict of option names, as fairseq-eval-lm takes it."""
    value = overrides_dict(text)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a dict of option names, e.g. \"{{'alibi_window_cutoff': 8}}\"")
    return value


def _with_fixed(per_length, fixed: dict, parser, lengths: Sequence[int]):
    """``per_length`` overrides (``length -> dict``, or ``None``) with ``fixed`` ones added; a
    key both set at any of ``lengths`` is the parser's error, before any run."""
    if not fixed:
        return per_length

    def overrides(length):
        own = per_length(length) if per_length else {}
        both = sorted(k for k in own if k in fixed and own[k] != fixed[k])
        if both:
            parser.error(f"--model-overrides sets {both[0]}, which the sweep sets per length")
        return {**fixed, **own}
    for length in lengths:
        overrides(length)
    return overrides


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-alibi sweep",
        description="Perplexity of fairseq language models at several evaluation lengths, "
        "non-overlapping and with a sliding window, through stock fairseq-eval-lm.",
        epilog="Any other option goes to every fairseq-eval-lm run (e.g. --cpu, "
        "--max-tokens 4096, --fp16). A perplexity is reported only when a run evaluated every "
        "token of the split; the exit status is 1 when any point was refused.",
    )
    parser.add_argument("--path", action="append", required=True, metavar="[NAME=]CKPT",
                        help="a checkpoint to evaluate (repeat for several); NAME is its row")
    parser.add_argument("--data", required=True, help="binarized data folder (fairseq-preprocess)")
    parser.add_argument("--lengths", required=True, type=_lengths,
                        help="comma-separated evaluation lengths, e.g. 512,1024,2048,3072")
    parser.add_argument("--out", required=True,
                        help="folder for the CSV, Markdown, PNG, logs (new or empty)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results and logs of an earlier sweep in --out")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, from {', '.join(MODES)} (default: both)")
    parser.add_argument("--stride", type=_at_least(1), default=None,
                        help="sliding-window stride (default: half the evaluation length)")
    parser.add_argument("--sinusoidal-overrides", action="store_true",
                        help="raise max_target_positions/tokens_per_sample to each length at "
                        "load time (needed by stock sinusoidal transformer_lm beyond L)")
    parser.add_argument("--train-length", type=_at_least(1), default=None,
                        help="the training length L, marked in the table and plot")
    parser.add_argument("--slope-interpolation", action="store_true",
                        help="ALiBi models: also evaluate each with its slopes scaled by L/N "
                        "beyond L (a second row per model; needs --train-length)")
    parser.add_argument("--gen-subset", default="test", help="the split to evaluate")
    parser.add_argument("--jobs", type=_at_least(1), default=1, help="runs in flight at once")
    parser.add_argument("--threads", type=_at_least(1), default=None,
                        help="OpenMP threads per run")
    parser.add_argument("--title", default=None, help="a title for the table and plot")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--model-overrides", type=_overrides, default={}, metavar="DICT",
                        help="load-time overrides of every run, e.g. \"{'alibi_window_cutoff': "
                        "8}\" (merged with the per-length ones of the options above)")
    return parser


def main(argv=None):
    parser = _parser()
    args, extra = parser.parse_known_args(argv)

    if args.slope_interpolation and (args.train_length is None or args.sinusoidal_overrides):
        parser.error("--slope-interpolation needs --train-length, and applies to ALiBi models "
                     "(sweep sinusoidal ones in a separate run)")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"argument --modes: choose from {', '.join(MODES)}, got {args.modes!r}")
    if "sliding" in modes and args.stride is not None and args.stride >= min(args.lengths):
        parser.error(f"argument --stride: must be below the shortest length "
                     f"({min(args.lengths)}), got {args.stride}")
    if not Path(str(args.data).split(os.pathsep)[0]).is_dir():
        parser.error(f"argument --data: no folder {args.data}: give the --destdir of "
                     "fairseq-preprocess")
    fixed = args.model_overrides
    overrides = position_overrides if args.sinusoidal_overrides else None
    models = {}
    for spec in args.path:
        name, path = _parse_path(spec)
        if name in models:
            parser.error(f"--path: two checkpoints named {name!r}: give them names with "
                         "NAME=CKPT")
        state, refused = read_language_model(path, SWEPT_MODELS, forks=True)
        if refused:
            parser.error(f"--path {refused}")
        scale = trained_slope_scale(state)
        del state  # the runs load it themselves
        models[name] = SweepModel(path, overrides=_with_fixed(overrides, fixed, parser,
                                                              args.lengths))
        if args.slope_interpolation:
            models[f"{name}, slopes x L/N"] = SweepModel(
                path, overrides=_with_fixed(slope_interpolation(args.train_length, scale),
                                            fixed, parser, args.lengths))
    try:
        result = run_sweep(
            models, args.data, args.lengths, args.out, modes=modes,
            extra_eval_args=extra, stride=args.stride, gen_subset=args.gen_subset,
            train_length=args.train_length, jobs=args.jobs, threads=args.threads,
            progress=not args.no_progress, title=args.title, overwrite=args.overwrite,
        )
    except SweepError as exc:
        print(f"fairseq-alibi sweep: error: {exc}", file=sys.stderr)
        return 1
    print(result.markdown())
    for kind, path in result.files.items():
        print(f"{kind}: {path}")
    if result.refused:
        print(f"error: {len(result.refused)} point(s) refused, see above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
