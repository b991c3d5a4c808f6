"""A long generation as a user runs it: the hub's ``generate`` (fairseq's ``SequenceGenerator``,
beam 1) of a model with slope windows, step time and memory over the whole generation.

    python -m benchmarks.hub_generation [--tokens 100000] [--cutoff 8] [--sinks 4]
                                        [--dims 2,128,8] [--threads 1] [--smoke]

``benchmarks.decoding_windows`` times the model's own steps; this one times what fairseq's
generator adds around them, which grows with the length: each step it re-selects the whole
``tokens[:, :step + 1]`` prefix for the beams (``O(step)``) and keeps its ``(rows, max_len)``
token and score buffers. An ``alibi_transformer_lm`` of the quickstart's size (random weights,
1000 words: the times and the memory do not depend on training) is saved by fairseq's own
Trainer, loaded with ``from_pretrained(..., alibi_window_cutoff=T, alibi_window_sinks=S)`` and
generates ``--tokens`` tokens greedily after a 3-token prompt (``min_len``: no early end).

Per eighth of the generation: the median decoder step (the model's forward, timed by a hook)
and the median whole step (from one decoder call to the next: the model and the generator), as
ratios to the first eighth; the process's resident set at each eighth. One run, so the ratios
compare different minutes of it (a machine under load shows as noise in both columns alike).
"""

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

import torch

from benchmarks.tables import section, table
from benchmarks.trainer import build_trainer, write_dictionary

PROMPT = 3
VOCAB = 1000


def resident_mib() -> float:
    """The process's resident set now (``/proc/self/statm``), MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def saved_model(folder, dims) -> str:
    """A random ``alibi_transformer_lm`` of ``dims`` ``(layers, dim, heads)`` saved by fairseq's
    Trainer in ``folder`` (beside its ``dict.txt``)."""
    layers, dim, heads = dims
    trainer, _ = build_trainer(write_dictionary(folder, VOCAB), "alibi_transformer_lm", 256, [
        "--decoder-layers", str(layers), "--decoder-embed-dim", str(dim),
        "--decoder-ffn-embed-dim", str(4 * dim), "--decoder-attention-heads", str(heads),
        "--decoder-input-dim", str(dim), "--decoder-output-dim", str(dim)])
    trainer.consolidate_optimizer()
    path = os.path.join(folder, "checkpoint.pt")
    trainer.save_checkpoint(path, {})
    return path


class StepClock:
    """The decoder's forward, timed: each call's start and duration (the generator calls
    ``decoder.forward`` itself, so module hooks never run)."""

    def __init__(self, decoder, eighth: int, log):
        self.steps, self.starts, self.resident = [], [], []
        self.eighth, self.log, self.forward = eighth, log, decoder.forward
        decoder.forward = self.timed

    def timed(self, *args, **kwargs):
        self.starts.append(time.perf_counter())
        out = self.forward(*args, **kwargs)
        self.steps.append(time.perf_counter() - self.starts[-1])
        if len(self.steps) % self.eighth == 0:
            self.resident.append(resident_mib())
            self.log(f"{len(self.steps)} steps")
        return out


def eighths(values, size: int):
    return [statistics.median(values[i * size:(i + 1) * size]) for i in range(8)]


def run(tokens: int, cutoff: float, sinks: int, dims, command: str, log=print) -> str:
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    with tempfile.TemporaryDirectory() as folder:
        saved_model(folder, dims)
        lm = AlibiTransformerLanguageModel.from_pretrained(
            folder, "checkpoint.pt", folder, alibi_window_cutoff=cutoff,
            alibi_window_sinks=sinks).eval()
    size = max(1, tokens // 8)
    clock = StepClock(lm.models[0].decoder, size, log)
    prompt = torch.arange(4, 4 + PROMPT)
    before = resident_mib()
    start = time.perf_counter()
    with torch.no_grad():
        out = lm.generate(prompt, beam=1, min_len=PROMPT + tokens, max_len_b=PROMPT + tokens)
    elapsed = time.perf_counter() - start
    generated = len(out[0]["tokens"]) - PROMPT - 1  # the prompt, and the final </s>
    whole = [b - a for a, b in zip(clock.starts, clock.starts[1:])]
    model, step = eighths(clock.steps, size), eighths(whole, size)
    rows = [[f"{(i + 1) * size:,}", f"{model[i] * 1e3:.3f}", f"{model[i] / model[0]:.2f}",
             f"{step[i] * 1e3:.3f}", f"{step[i] / step[0]:.2f}",
             f"{clock.resident[i] - before:+.1f}" if i < len(clock.resident) else ""]
            for i in range(8)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return section("A long generation through the hub", command, "\n".join([
        f"{generated:,} tokens generated through from_pretrained(...).generate (beam 1), "
        f"T = {cutoff:g}, S = {sinks}, {dims[0]} layers × {dims[1]} × {dims[2]} heads: "
        f"{elapsed:.1f} s, {generated / elapsed:.0f} tokens/s; resident set before "
        f"{before:.1f} MiB, peak {peak:.1f} MiB",
        "",
        table(["tokens generated (end of eighth)", "decoder step ms", "÷ first",
                        "whole step ms", "÷ first", "resident set MiB, + since start"], rows),
        "",
        f"last eighth ÷ first: decoder step {model[-1] / model[0]:.3f}, whole step "
        f"{step[-1] / step[0]:.3f}; the generator's share of the last eighth's step "
        f"{1 - model[-1] / step[-1]:.0%}",
    ]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--cutoff", type=float, default=8.0)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--dims", default="2,128,8", help="layers,dim,heads")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="800 tokens, 1 layer of 32")
    args = parser.parse_args(argv)
    try:
        dims = tuple(int(x) for x in args.dims.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1 or dims[1] % dims[2]:
        parser.error(f"--dims {args.dims!r}: give layers,dim,heads, dim a multiple of heads")
    if args.tokens < 8 or not 0 < args.cutoff < float("inf") or args.sinks < 0:
        parser.error("--tokens must be at least 8, --cutoff a positive finite number and "
                     "--sinks at least 0")
    if args.smoke:
        args.tokens, dims = 800, (1, 32, 4)
    torch.set_num_threads(args.threads)
    command = " ".join(["python -m benchmarks.hub_generation", *(argv or sys.argv[1:])])
    print(run(args.tokens, args.cutoff, args.sinks, dims, command,
              log=lambda line: print(line, file=sys.stderr, flush=True)))


if __name__ == "__main__":
    main()
