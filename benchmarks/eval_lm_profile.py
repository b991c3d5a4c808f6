"""Where ``fairseq-eval-lm``'s time goes, part by part, dense against a slope-window cutoff.

    python -m benchmarks.eval_lm_profile [--checkpoint PATH --data DIR] [--length 1024]
                                      [--max-tokens N] [--cutoff 8] [--rounds 3]
                                      [--threads 1] [--smoke [--work DIR]]

An ALiBi language model (default: the quickstart's, ``outputs/quickstart/checkpoints/alibi/
checkpoint_last.pt`` on ``outputs/quickstart/data/bin``) scores the ``test`` split as
``fairseq-eval-lm --tokens-per-sample N`` does (non-overlapping blocks of ``N``, the task's
own ``eval_lm_dataloader``, fairseq's ``SequenceScorer``), dense and with the load-time
override ``{'alibi_window_cutoff': T}``, in interleaved rounds (the median of each part over
the rounds). ``--max-tokens`` (default ``N``: one block a batch, as ``experiments.
slope_windows`` runs eval-lm) sets the batch.

fairseq-eval-lm's own tokens/s times ``SequenceScorer.generate`` only; here its parts are
timed with forward hooks (no autograd, the CPU: a part's wall time is its cost):

* ``attention backend``: the backend's call (``attend``: what ``auto`` picks, the fold for
  dense, ``windowed`` or ``sdpa`` with a cutoff), and ``attention projections``: the rest of
  the ALiBi self-attention modules (the q, k, v and output projections, reshapes);
* ``rest of the layers``: the decoder layers minus their attention (feed-forward, layer norms,
  residuals);
* ``embeddings``, ``output layer`` (the projection to the vocabulary), ``log-softmax``
  (``get_normalized_probs``), and ``scorer, other`` (what ``generate`` does besides the model:
  gathering the target's probabilities, building the hypotheses);
* ``data loading``: fetching the batches (outside fairseq-eval-lm's tokens/s).

The backend's share of the scorer's time gives the best tokens/s ratio any attention backend
can reach (Amdahl): ``scorer_dense / (scorer_dense - backend_dense)``; and with the whole
attention module at no cost, ``scorer_dense / (scorer_dense - attention_dense)``.
"""

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.tables import command_line, machine, table
from benchmarks.timing import Rounds

DEFAULT_CHECKPOINT = "outputs/quickstart/checkpoints/alibi/checkpoint_last.pt"
DEFAULT_DATA = "outputs/quickstart/data/bin"
#: the parts of the scorer's time, in the order of the table (data loading is outside it)
PARTS = ("attention backend", "attention projections", "rest of the layers", "embeddings",
         "output layer", "log-softmax", "scorer, other")


def load(checkpoint, data, length: int, cutoff: float):
    """``(model, task)`` as fairseq-eval-lm loads them (``--tokens-per-sample length``, the
    load-time cutoff override; 0 = dense)."""
    from fairseq import checkpoint_utils

    import fairseq_alibi  # noqa: F401  (registers the models)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data), "tokens_per_sample": length,
                                          "alibi_window_cutoff": cutoff})
    model = models[0].eval()
    return model, task


def batches(task, model, max_tokens: int):
    """The test split's batches, as fairseq-eval-lm's loop gets them, and the seconds it took."""
    task.load_dataset("test")
    started = time.perf_counter()
    found = [s for s in task.eval_lm_dataloader(
        dataset=task.dataset("test"), max_tokens=max_tokens, batch_size=None,
        max_positions=model.max_positions(), num_workers=0) if "net_input" in s]
    return found, time.perf_counter() - started


class PartTimer:
    """Wall seconds spent in hooked modules (and wrapped methods), summed by part."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.handles = []

    def hook(self, module, part: str):
        starts = []

        def before(*_):
            starts.append(time.perf_counter())

        def after(*_):
            self.seconds[part] += time.perf_counter() - starts.pop()

        self.handles += [module.register_forward_pre_hook(before),
                         module.register_forward_hook(after)]

    def wrap(self, fn, part: str):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started
        return timed


#: the timer of the pass that runs now (the backend's wrapper is one for the process)
_RUNNING = []


def time_backend():
    """Wrap the attention modules' ``attend`` (their module's global, this process only) so
    that it adds its seconds to the running pass's timer, once."""
    from fairseq_alibi.modules import alibi_multihead_attention as module

    if getattr(module.attend, "timed_backend", False):
        return
    attend = module.attend

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return attend(*args, **kwargs)
        finally:
            if _RUNNING:
                _RUNNING[-1].seconds["attention backend"] += time.perf_counter() - started

    timed.timed_backend = True
    module.attend = timed


def instrument(model) -> PartTimer:
    """Hooks on ``model``'s attention, decoder layers, embeddings and output projection, and
    its ``get_normalized_probs`` wrapped (an instance attribute: this process only)."""
    from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention

    time_backend()
    timer = PartTimer()
    decoder = model.decoder
    for layer in decoder.layers:
        timer.hook(layer, "layers")
    for module in model.modules():
        if isinstance(module, AlibiMultiheadAttention):
            timer.hook(module, "attention")
    timer.hook(decoder.embed_tokens, "embeddings")
    if getattr(decoder, "output_projection", None) is not None:
        timer.hook(decoder.output_projection, "output layer")
    model.get_normalized_probs = timer.wrap(model.get_normalized_probs, "log-softmax")
    return timer


def score_pass(model, timer: PartTimer, samples, found: dict):
    """A case for :class:`Rounds`: the scorer over every batch; appends each part's seconds
    (and the scorer's total) to ``found``."""
    from fairseq.sequence_scorer import SequenceScorer

    scorer = SequenceScorer(model.decoder.dictionary)

    def call():
        timer.seconds.clear()
        _RUNNING.append(timer)
        try:
            started = time.perf_counter()
            for sample in samples:
                scorer.generate([model], sample)
            total = time.perf_counter() - started
        finally:
            _RUNNING.pop()
        parts = dict(timer.seconds)
        layers = parts.pop("layers", 0.0)
        attention = parts.pop("attention", 0.0)
        parts["attention projections"] = attention - parts.get("attention backend", 0.0)
        parts["rest of the layers"] = layers - attention
        parts["scorer, other"] = total - layers - sum(
            parts.get(p, 0.0) for p in ("embeddings", "output layer", "log-softmax"))
        parts["scorer"] = total
        for part, seconds in parts.items():
            found.setdefault(part, []).append(seconds)
    return call


def run(checkpoint, data, length: int, cutoff: float, rounds: int, max_tokens: int, log=print):
    """``(shape line, Markdown table, summary)``: each part's seconds (median over rounds) for
    dense and the cutoff, their shares of the scorer, and the ratios."""
    names = {"dense": 0.0, f"T={cutoff:g}": cutoff}
    found, cases, tokens, loading = {}, {}, {}, {}
    for name, value in names.items():
        model, task = load(checkpoint, data, length, value)
        samples, loading[name] = batches(task, model, max_tokens)
        tokens[name] = sum(s["ntokens"] for s in samples)
        found[name] = {}
        cases[name] = score_pass(model, instrument(model), samples, found[name])
    if len(set(tokens.values())) != 1:
        raise RuntimeError(f"the settings scored different token counts: {tokens}")
    log(f"[eval_lm_profile] N={length}: {rounds} interleaved round(s) of "
        f"{next(iter(tokens.values())):,} tokens ...")
    timed = Rounds(cases, rounds, warmup=1)
    median = {name: {part: statistics.median(v) for part, v in parts.items()}
              for name, parts in found.items()}
    dense, windowed = list(names)
    rows = []
    for part in PARTS + ("scorer",):
        cells = [part]
        for name in names:
            seconds = median[name].get(part, 0.0)
            cells += [f"{seconds:.3f}", f"{seconds / median[name]['scorer']:.0%}"]
        base = median[dense].get(part, 0.0)
        cells.append(f"{base / median[windowed][part]:.2f}" if median[windowed].get(part)
                     else "–")
        rows.append(cells)
    rows.append(["data loading (outside eval-lm's tokens/s)"]
                + [f"{loading[n]:.3f}" if i == 0 else "–" for n in names for i in (0, 1)]
                + ["–"])
    def share(name, *parts):
        return sum(median[name][p] for p in parts) / median[name]["scorer"]

    attention = ("attention backend", "attention projections")
    summary = {
        "tokens": next(iter(tokens.values())), "length": length, "cutoff": cutoff,
        "speedup": timed.ratio(dense, windowed),
        "backend_share_dense": share(dense, "attention backend"),
        "backend_share_windowed": share(windowed, "attention backend"),
        "attention_share_dense": share(dense, *attention),
        "backend_speedup": (median[dense]["attention backend"]
                            / median[windowed]["attention backend"]),
        "amdahl_backend": 1.0 / (1.0 - share(dense, "attention backend")),
        "amdahl_attention": 1.0 / (1.0 - share(dense, *attention)), "seconds": median,
    }
    heads = ["part"] + [f"{n} {c}" for n in names for c in ("s", "share")] + [
        f"dense ÷ {windowed}"]
    shape = (f"{checkpoint}, test split ({summary['tokens']:,} tokens) in blocks of {length}, "
             f"--max-tokens {max_tokens}, float32, CPU, {rounds} interleaved round(s), median")
    return shape, table(heads, rows), summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT)
    parser.add_argument("--data", default=DEFAULT_DATA, help="binarized corpus (test split)")
    parser.add_argument("--length", type=int, default=1024, help="tokens per block N")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="tokens per batch (default N: one block a batch)")
    parser.add_argument("--cutoff", type=float, default=8.0, help="the window cutoff T, nats")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="a toy model trained for one step on random text (seconds)")
    parser.add_argument("--work", default="outputs/eval_lm_profile_smoke",
                        help="--smoke: where its model and corpus are written")
    args = parser.parse_args(argv)
    if args.cutoff <= 0 or args.length < 2 or args.rounds < 1:
        parser.error("--cutoff must be > 0, --length >= 2, --rounds >= 1")
    torch.set_num_threads(args.threads)
    checkpoint, data = args.checkpoint, args.data
    if args.smoke:
        checkpoint, data = smoke_model(Path(args.work), args.threads)
        args.length, args.rounds = min(args.length, 64), 1
    for path in (checkpoint, data):
        if not Path(path).exists():
            raise SystemExit(f"{path} not found: run `fairseq-alibi quickstart` first, or give "
                             "--checkpoint PATH --data DIR (or --smoke)")
    shape, body, summary = run(checkpoint, data, args.length, args.cutoff, args.rounds,
                               args.max_tokens or args.length,
                               log=lambda line: print(line, file=sys.stderr))
    print(f"{command_line('benchmarks.eval_lm_profile', argv)}\nMachine: {machine()}  \n"
          f"{shape}\n\n{body}\n\n"
          f"Scorer tokens/s with T={args.cutoff:g}: {summary['speedup']:.2f}× dense (paired "
          f"rounds). The attention backend is {summary['backend_share_dense']:.0%} of the dense "
          f"scorer's time ({summary['backend_speedup']:.2f}× faster with the cutoff); with the "
          f"backend at no cost the ratio would be at most {summary['amdahl_backend']:.2f}×, "
          f"with the whole attention module ({summary['attention_share_dense']:.0%}) at no cost "
          f"{summary['amdahl_attention']:.2f}× (Amdahl).")
    return summary


def smoke_model(work: Path, threads: int):
    """A 1-layer ALiBi LM trained one step on random text, and its binarized corpus."""
    from benchmarks.eval_lm import binarize, train_checkpoint, write_corpus

    data = work / "bin"
    if not (data / "test.bin").is_file():
        binarize(write_corpus(str(work / "raw"), 100, 600), str(data), threads)
    # the input and output dims too: stock transformer_lm defaults them to 512, and the package
    # warns about that mismatch
    dims = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-input-dim", "32",
            "--decoder-output-dim", "32", "--decoder-ffn-embed-dim", "64",
            "--decoder-attention-heads", "4"]
    checkpoint = work / "alibi.pt"
    if not checkpoint.is_file():
        train_checkpoint(str(data), "alibi_transformer_lm", 16, dims, str(checkpoint), 1)
    return str(checkpoint), str(data)


if __name__ == "__main__":
    main()
