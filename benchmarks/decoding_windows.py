"""Decoding in bounded memory: a language model generating far past its training
length with slope windows, side by side with the same model without them.

    python -m benchmarks.decoding_windows [--smoke] [--tokens 32768] [--segment 2048]
                                          [--cutoff 8] [--sinks 0] [--check 4096] [--threads 1]
                                          [--dims 2,128,8]
    python -m benchmarks.decoding_windows --attention-steps [--smoke] [--cutoff 8] [--heads 8]
                                          [--head-sizes 16,64] [--batches 1,5,10,40]
    python -m benchmarks.decoding_windows --beam-search [--smoke] [--cutoff 8] [--sinks S]
                                          [--tokens 100]
    python -m benchmarks.decoding_windows --sinks-cost --sinks 4 [--smoke] [--tokens 8192]
                                          [--dims 2,128,8]
    python -m benchmarks.decoding_windows --step-backends [--sinks S] [--dims 2,128,8]
                                          [--tokens 4608] [--smoke]

Two decoders of the quickstart's tiny size (``alibi_transformer_lm``: 2 layers, 128 dims,
8 heads, FFN 512; a vocabulary of 1000; randomly initialised: the step time and the cache do
not depend on training, and the windows depend only on the slopes and ``T``), the same
weights, one built with ``--alibi-window-cutoff T`` (``bounded``: windows
``ceil(T / m_h)``, with 8 heads and ``T = 8`` 16, 32, …, 2048 keys; its KV cache keeps the
last ``max_h W_h`` keys; with ``--sinks S`` also ``--alibi-window-sinks S``: its cache keeps
the first ``S`` keys too, ``S + max_h W_h`` in all) and one without (``dense``). From a prompt of 64 random tokens each
generates ``--tokens`` tokens greedily with cached decoding (one token per step, as
``fairseq-generate``'s steps with beam 1); their steps alternate, so load from other processes
hits both alike.

Per segment of ``--segment`` steps: the median step time of each model, as ratios measured side
by side (``bounded ÷ dense``, and each model's own step time ÷ its time in the first segment
that starts at or after ``max_h W_h`` cached keys: flat means within 10 %); at the end of each
checkpoint segment (doubling: 2k, 4k, …, 32k), the KV cache's bytes (every layer's key and
value buffers, spare room included). Those per-segment ratios of one model compare different minutes;
the flatness is then measured side by side too (:func:`aged_vs_young`): the bounded model
aged to ``--tokens`` tokens against itself just past ``max_h W_h``, steps alternating. The growth of the process's peak resident set (``VmHWM``,
reset after the prompt) over the generation, is measured for each model alone in a process of its own
(one process per model: a peak is per process). The equality check: the bounded model's
generated tokens are the greedy choices of one full forward with the same cutoff over the first
``--check`` generated tokens (a causal model's full forward at position ``p`` is that of the
tokens up to ``p``: the repeated full forwards of greedy decoding, at once).

``--attention-steps``: what ``auto``'s choice for a decoding step with slope windows rests on
(``tuning.WINDOWED_STEP_MIN_SKIPPED``): one query against ``S`` cached keys, ``--heads``
heads (8), float32, the windows of ``--cutoff``, ``windowed`` (each head group reads only its
window: ``windowed.few_queries``) ÷ ``sdpa`` (the dense windowed row, every key), per batch,
head size and ``S``, in interleaved rounds (:class:`benchmarks.timing.Rounds`, median of paired ratios),
beside the keys the windows skip (``dispatch.step_skipped_keys``) and ``auto``'s choice.

``--beam-search``: a short generation, where the windows are wider than anything generated:
8 prompts × beam 5 (40 rows), an 8-token prompt and 100 tokens (``--tokens``), each step a
token of every row and a reorder of the cache as beam search's (a random choice of each row's
beam), the two models in interleaved rounds; ``bounded ÷ dense`` time and each one's KV
buffer bytes at the end. The bounded model's cache must cost what the dense one's does: it had
allocated its whole bound (``max_h W_h`` positions a row) at the first step.

``--step-backends``: what ``auto``'s choice for a generation's step is worth: the bounded
model (with ``--sinks S``: and its sinks) built once per ``--alibi-attention`` (``sdpa``,
``windowed``, ``auto``; with sinks also ``windowed`` reading the sinks joined to the whole
window, as before 2026-11-30), the same weights, generate ``--tokens`` tokens greedily, steps
in rotating order; per backend the median step once the cache is at its bound, and the median of
its paired steps ÷ ``sdpa``'s.

``--sinks-cost``: what attention sinks cost a long generation: the bounded model with
``--sinks S`` and the same weights without sinks generate ``--tokens`` tokens greedily side by
side (steps alternating); per segment, the median of the paired step times with ÷ without.
From ``max_h W_h`` tokens on, the cache keeps its sinks apart from its window.
``--document-mask eos`` gives both models a document mask (the generation one document, the
sinks its first positions: ``keep_document_sinks``).
"""

import argparse
import statistics
import subprocess
import sys
import time
from typing import Dict, List

import torch

from benchmarks.decoding import build
from benchmarks.tables import command_line, machine, table
from benchmarks.timing import Rounds, forward_call
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from fairseq_alibi.modules.attention.windowed import decoding_reach

#: the quickstart's tiny LM (fairseq_alibi/cli/quickstart.py, SIZES["tiny"]): layers, dims,
#: heads (the FFN is 4 × dims = 512, as there)
DIMS = (2, 128, 8)
VOCAB, PROMPT = 1000, 64
MODELS = ("bounded", "dense")


def twins(dims, **flags) -> dict:
    """``{name: (decoder, step)}``: one decoder per ``name=[model flags]``, sharing the first
    one's weights."""
    built = {name: build("alibi_transformer_lm", dims, VOCAB, extra)
             for name, extra in flags.items()}
    first = next(iter(built.values()))[0].state_dict()
    for decoder, _ in built.values():
        decoder.load_state_dict(first)
    return built


def in_turn(names, t: int) -> list:
    """``names`` in the order of step ``t``: rotated by ``t``, so that each model takes each
    place of the round equally often (two models: alternating) and load from other processes,
    or one model's cache traffic, hits them alike."""
    names = list(names)
    shift = t % len(names)
    return names[shift:] + names[:shift]


def cache_reach(decoder, layers: int) -> int:
    """``max_h W_h`` over the decoder's layers: the keys its KV cache keeps (besides its sinks),
    as the attention module bounds it (:func:`~fairseq_alibi.modules.attention.windowed.
    decoding_reach`)."""
    return max(decoding_reach(decoder.alibi.layer(i)) for i in range(layers))


def models(cutoff: float, dims=DIMS, sinks: int = 0):
    """``{name: (decoder, step)}``: the two decoders, sharing their weights."""
    flags = ["--alibi-window-cutoff", str(cutoff)]
    flags += ["--alibi-window-sinks", str(sinks)] if sinks else []
    return twins(dims, bounded=flags, dense=[])


def cache_bytes(decoder, state) -> int:
    """The bytes of every layer's cached keys and values: their buffers, spare room included."""
    total = 0
    for module in decoder.modules():
        if isinstance(module, AlibiMultiheadAttention):
            saved = module._get_input_buffer(state)
            for name in ("key", "value"):
                held = saved.get(f"{name}_room")
                held = saved[f"prev_{name}"] if held is None else held
                total += held.numel() * held.element_size()
    return total


class Generation:
    """One model's greedy generation: its token buffer, its cache, its step times."""

    def __init__(self, model, prompt: torch.Tensor, tokens: int):
        self.decoder, self.step_fn = model
        self.tokens = torch.zeros(1, prompt.numel() + tokens, dtype=torch.long)
        self.tokens[0, :prompt.numel()] = prompt
        self.state, self.times = {}, []
        with torch.no_grad():  # the prompt, one token per call (fairseq's decoder reads the
            for length in range(1, prompt.numel() + 1):  # last token only): forced steps
                self.last = self.step_fn(self.tokens[:, :length], self.state)[0][:, -1]
        self.length = prompt.numel()

    def step(self):
        with torch.no_grad():
            start = time.perf_counter()
            self.tokens[0, self.length] = self.last[0, 4:].argmax() + 4  # no specials
            self.length += 1
            self.last = self.step_fn(self.tokens[:, :self.length], self.state)[0][:, -1]
            self.times.append(time.perf_counter() - start)


def aged_vs_young(model, prompt: torch.Tensor, tokens: int, reach: int, steps: int) -> float:
    """The bounded model's step after ``tokens`` generated tokens ÷ its step just past
    ``reach`` (its cache already at the bound), measured side by side: two generations of the
    same model, steps alternating, the median of ``steps`` paired ratios. Unlike comparing
    segments of one generation, the two are timed in the same minutes, so a change in the
    machine's load cancels out: what is left is what the length itself costs."""
    aged = Generation(model, prompt, tokens + steps)
    for _ in range(tokens):
        aged.step()
    young = Generation(model, prompt, reach + steps)
    for _ in range(reach):
        young.step()
    aged.times.clear()
    young.times.clear()
    for i in range(steps):
        for run in in_turn((aged, young), i):
            run.step()
    return statistics.median(a / y for a, y in zip(aged.times, young.times))


def checkpoints(tokens: int, segment: int) -> List[int]:
    """``segment, 2·segment, 4·segment, … tokens``."""
    found, n = [], segment
    while n <= tokens:
        found.append(n)
        n *= 2
    return found


def generate_side_by_side(cutoff, tokens, segment, dims=DIMS, log=print, sinks=0):
    """``(runs, cache)``: each model's :class:`Generation` (steps alternating) and its cache
    bytes at each checkpoint."""
    torch.manual_seed(0)
    built = models(cutoff, dims, sinks)
    prompt = torch.randint(4, VOCAB, (PROMPT,))
    runs = {name: Generation(built[name], prompt, tokens) for name in MODELS}
    marks = set(checkpoints(tokens, segment))
    cache: Dict[str, Dict[int, int]] = {name: {} for name in MODELS}
    for t in range(1, tokens + 1):
        for name in in_turn(MODELS, t):
            runs[name].step()
        if t in marks:
            for name in MODELS:
                cache[name][t] = cache_bytes(runs[name].decoder, runs[name].state)
            log(f"{t} tokens generated")
    return runs, cache


def greedy_agreement(model, cutoff, generated: torch.Tensor, check: int):
    """``(agreeing, checked)``: how many of the first ``check`` generated tokens (after the
    prompt) are the greedy choice of the full forward with the cutoff over them."""
    decoder = model[0]
    tokens = generated[:, :PROMPT + check]
    with torch.no_grad():
        logits = decoder(tokens)[0][0, PROMPT - 1:-1, 4:]
    choices = logits.argmax(-1) + 4
    return int((choices == tokens[0, PROMPT:]).sum()), check


def _status_kib(field: str) -> int:
    """``VmRSS``/``VmHWM`` of this process, KiB (``/proc/self/status``)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1])


def peak_rss_growth(name: str, cutoff: float, tokens: int, dims, sinks: int = 0) -> int:
    """Bytes the peak resident set grew by while model ``name`` alone generated ``tokens``
    tokens after its prompt (this process: run through :func:`rss_in_own_process`). The peak
    is reset after the prompt (``/proc/self/clear_refs``), so the imports' and the build's
    earlier peak does not hide the generation's."""
    torch.manual_seed(0)
    model = models(cutoff, dims, sinks)[name]
    run = Generation(model, torch.randint(4, VOCAB, (PROMPT,)), tokens)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    for _ in range(tokens):
        run.step()
    return (_status_kib("VmHWM") - before) * 1024
def rss_in_own_process(name, cutoff, tokens, dims, sinks=0) -> int:
    """:func:`peak_rss_growth` in a process of its own."""
    args = [sys.executable, "-m", "benchmarks.decoding_windows", "--rss-of", name,
            "--cutoff", str(cutoff), "--tokens", str(tokens), "--sinks", str(sinks),
            "--dims", ",".join(str(x) for x in dims)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return int(proc.stdout.split()[-1])


def report(runs, cache, segment, reach, rss, agreement, aged, sinks=0) -> str:
    """The Markdown table and the lines under it."""
    marks = sorted(cache["bounded"])
    medians = {name: [statistics.median(runs[name].times[t - segment:t]) for t in marks]
               for name in MODELS}
    # the first checkpoint segment that starts with max W_h keys cached or more
    flat_from = next((i for i, t in enumerate(marks) if t - segment >= reach), len(marks) - 1)
    rows = []
    for i, t in enumerate(marks):
        rows.append([f"{t:,}",
                     f"{medians['bounded'][i] / medians['dense'][i]:.2f}",
                     f"{medians['bounded'][i] / medians['bounded'][flat_from]:.2f}",
                     f"{medians['dense'][i] / medians['dense'][flat_from]:.2f}",
                     f"{cache['bounded'][t] / 2**20:.2f}", f"{cache['dense'][t] / 2**20:.2f}"])
    base = marks[flat_from]
    body = table(["tokens generated", "step time bounded ÷ dense (segment ending here)",
                  f"bounded step ÷ its step at {base:,}", f"dense step ÷ its step at {base:,}",
                  "KV cache MiB bounded", "KV cache MiB dense"], rows)
    after = [medians["bounded"][i] / medians["bounded"][flat_from]
             for i in range(flat_from, len(marks))]
    spread = max(after) / min(after) - 1
    cache_after = {cache["bounded"][t] for t in marks[flat_from:]}
    agree, checked = agreement
    lines = [
        "",
        f"Bounded model: max_h W_h = {reach:,} keys"
        + (f", plus {sinks} attention sinks (its cache's bound: {reach + sinks:,} keys)"
           if sinks else "") + f". From {base:,} tokens on its step time "
        f"spreads by {100 * spread:.1f} % (max ÷ min − 1 of the segment medians) and its KV "
        f"cache is {'constant' if len(cache_after) == 1 else 'not constant'}.",
        f"Side by side (the same minutes): its step after {marks[-1]:,} tokens ÷ its step just "
        f"past max_h W_h, steps alternating, median of {segment:,} pairs: {aged:.3f}.",
        f"Peak RSS growth over the generation, each model alone in its own process: bounded "
        f"{rss['bounded'] / 2**20:.1f} MiB, dense {rss['dense'] / 2**20:.1f} MiB.",
        f"Equality: {agree:,} of the first {checked:,} generated tokens are the greedy choices "
        f"of the full forward with the same cutoff{' and sinks' if sinks else ''} ({'all' if agree == checked else 'NOT all'}).",
    ]
    return body + "\n".join(lines)


def attention_steps(cutoff: float, smoke: bool, log=print, heads: int = 8,
                    head_sizes=(16, 64), batches=None) -> str:
    """The table of ``windowed ÷ sdpa`` for one decoding step's attention (see the module)."""
    from fairseq_alibi.modules.attention import dense, dispatch, windowed
    from fairseq_alibi.modules.bias import AlibiBias

    rounds = 3 if smoke else 200
    lengths = (65, 257) if smoke else (65, 129, 257, 513, 1025, 2049, 4097)
    alibi = AlibiBias(heads, window_cutoff=cutoff).layer(0)
    rows = []
    for head_dim in head_sizes:
        for batch in batches or ((1, 5) if smoke else (1, 5, 10, 40)):
            for keys in lengths:
                q = torch.randn(batch, heads, 1, head_dim)
                k, v = (torch.randn(batch, heads, keys, head_dim) for _ in range(2))
                args = (q, k, v, alibi, None, None, 0.0, head_dim**-0.5)
                timed = Rounds({"sdpa": forward_call(dense.sdpa, *args),
                                "windowed": forward_call(windowed.run, *args)},
                               rounds=rounds, warmup=3)
                call = dispatch.call_of(q, k, v, alibi)
                rows.append([head_dim, batch, keys, f"{dispatch.step_skipped_keys(call):,}",
                             f"{timed.ratio('windowed', 'sdpa'):.2f}",
                             dispatch.auto_backend(call)])
                log(" ".join(str(c) for c in rows[-1]))
    return table(["head size", "batch", "cached keys S", "keys the windows skip (batch)",
                  "windowed ÷ sdpa", "auto"], rows)


def beam_search(cutoff: float, smoke: bool, sinks: int = 0, log=print, tokens=None) -> str:
    """The table of ``--beam-search`` (see the module): time and KV buffer bytes."""
    dims, rows, prompt, length = ((1, 32, 8), 10, 4, 20) if smoke else (DIMS, 40, 8, 100)
    tokens = tokens or length
    generator = torch.Generator().manual_seed(0)
    sequence = torch.randint(4, VOCAB, (rows, prompt + tokens), generator=generator)
    orders = [torch.randint(0, 5, (rows,), generator=generator) + torch.arange(rows) // 5 * 5
              for _ in range(tokens)]
    built, held = models(cutoff, dims, sinks), {}

    def generation(name):
        decoder, step = built[name]

        def call():
            state = {}
            with torch.no_grad():
                for t in range(1, prompt + tokens + 1):
                    step(sequence[:, :t], state)
                    if t > prompt:
                        decoder.reorder_incremental_state_scripting(state, orders[t - prompt - 1])
            held[name] = cache_bytes(decoder, state)
        return call

    timed = Rounds({name: generation(name) for name in MODELS}, rounds=1 if smoke else 5)
    log(f"beam search: bounded ÷ dense {timed.ratio('bounded', 'dense'):.3f}")
    return table(["rows", "prompt", "tokens", "bounded ÷ dense time", "bounded KV bytes",
                  "dense KV bytes"],
                 [[rows, prompt, tokens, f"{timed.ratio('bounded', 'dense'):.3f}",
                   f"{held['bounded']:,}", f"{held['dense']:,}"]])


def sinks_cost(cutoff: float, sinks: int, tokens: int, segment: int, dims=DIMS,
               document_mask: str = "none") -> str:
    """The table of ``--sinks-cost`` (see the module)."""
    torch.manual_seed(0)
    flags = ["--alibi-window-cutoff", str(cutoff), "--alibi-document-mask", document_mask]
    built = twins(dims, **{"with": flags + ["--alibi-window-sinks", str(sinks)],
                           "without": flags})
    prompt = torch.randint(4, VOCAB, (PROMPT,))
    runs = {name: Generation(model, prompt, tokens) for name, model in built.items()}
    for t in range(tokens):
        for name in in_turn(runs, t):
            runs[name].step()
    rows = []
    for end in checkpoints(tokens, segment):
        pairs = zip(*(runs[name].times[end - segment:end] for name in ("with", "without")))
        rows.append([f"{end:,}", f"{statistics.median(a / b for a, b in pairs):.3f}"])
    return table(["tokens generated", f"step time with {sinks} sinks ÷ without (segment ending "
                  "here, median of paired steps)"], rows)


def bound_reached(cutoff: float, sinks: int, heads: int) -> int:
    """The step from which a generation's KV cache is at its bound (the prompt, the sinks and
    ``max_h W_h``: :func:`~fairseq_alibi.modules.attention.windowed.decoding_reach`)."""
    from fairseq_alibi.modules.bias import AlibiBias

    layer = AlibiBias(heads, window_cutoff=cutoff, window_sinks=sinks).layer(0)
    return decoding_reach(layer) + sinks + PROMPT


def step_backends(cutoff: float, sinks: int, tokens: int, dims=DIMS) -> str:
    """The table of ``--step-backends`` (see the module)."""
    from fairseq_alibi.modules.attention import dispatch

    torch.manual_seed(0)
    flags = ["--alibi-window-cutoff", str(cutoff)] + (
        ["--alibi-window-sinks", str(sinks)] if sinks else [])
    names = {"sdpa": ["--alibi-attention", "sdpa"], "windowed": ["--alibi-attention", "windowed"],
             "auto": []}
    if sinks:  # windowed reading the sinks joined to the window: the code before 2026-11-30
        names["windowed, sinks joined"] = names["windowed"]
    built = twins(dims, **{name: flags + extra for name, extra in names.items()})
    prompt = torch.randint(4, VOCAB, (PROMPT,))
    runs = {name: Generation(model, prompt, tokens) for name, model in built.items()}
    start = bound_reached(cutoff, sinks, dims[2])
    kept = dict(dispatch.SINKS_APART)
    for t in range(tokens):
        for name in in_turn(runs, t):
            if name == "windowed, sinks joined":
                dispatch.SINKS_APART.pop("windowed")
            try:
                runs[name].step()
            finally:
                dispatch.SINKS_APART.update(kept)
    base = runs["sdpa"].times[start:]
    rows = [[name, f"{statistics.median(run.times[start:]) * 1e3:.2f}",
             f"{statistics.median(a / b for a, b in zip(run.times[start:], base)):.3f}"]
            for name, run in runs.items()]
    return (f"Steps {start:,}–{tokens:,} (the cache at its bound, max_h W_h = "
            f"{start - sinks - PROMPT:,}):\n\n"
            + table(["--alibi-attention", "median step (ms)",
                     "÷ sdpa (median of paired steps)"], rows))


def arguments() -> argparse.ArgumentParser:
    """The command line's options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="a smoke run: 1 layer of 32 dims, 512 tokens, T = 0.5")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens generated past the prompt (default 32768; with --sinks-cost "
                             "8192, with --beam-search 100)")
    parser.add_argument("--segment", type=int, default=None,
                        help="steps per timed segment, the first checkpoint (default 2048)")
    parser.add_argument("--cutoff", type=float, default=None, help="window cutoff T (nats)")
    parser.add_argument("--sinks", type=int, default=0,
                        help="the bounded model's attention sinks, --alibi-window-sinks S "
                             "(default 0)")
    parser.add_argument("--check", type=int, default=None,
                        help="generated tokens checked against the full forward (default 4096)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--attention-steps", action="store_true",
                        help="time one decoding step's attention, windowed vs sdpa, instead")
    parser.add_argument("--beam-search", action="store_true",
                        help="time a short beam search (40 rows, 100 tokens), bounded vs dense, "
                             "and its KV buffers, instead")
    parser.add_argument("--sinks-cost", action="store_true",
                        help="time a long generation with --sinks S against the same model "
                             "without sinks, instead")
    parser.add_argument("--document-mask", choices=("none", "eos", "doc"), default="none",
                        help="--sinks-cost: both models' --alibi-document-mask (default none; "
                             "with a mask the sinks are each document's first positions)")
    parser.add_argument("--step-backends", action="store_true",
                        help="time the bounded model's generation step per attention backend "
                             "(sdpa, windowed, auto), instead")
    parser.add_argument("--heads", type=int, default=8,
                        help="--attention-steps: attention heads (default 8)")
    parser.add_argument("--head-sizes", default="16,64", metavar="D1,D2,...",
                        help="--attention-steps: head sizes (default 16,64)")
    parser.add_argument("--batches", default=None, metavar="B1,B2,...",
                        help="--attention-steps: batch sizes (default 1,5,10,40)")
    parser.add_argument("--dims", default=None, metavar="L,D,H",
                        help="layers, model dims and heads of the decoders (default 2,128,8: "
                             "the quickstart's tiny LM; --smoke: 1,32,8)")
    parser.add_argument("--rss-of", choices=MODELS, help=argparse.SUPPRESS)
    return parser


def dims_of(parser, args) -> tuple:
    """``(layers, dims, heads)`` of ``--dims`` (``--smoke``'s or the quickstart's without it)."""
    try:
        dims = (tuple(int(x) for x in args.dims.split(",")) if args.dims
                else (1, 32, 8) if args.smoke else DIMS)
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1 or dims[1] % dims[2]:
        parser.error("--dims takes L,D,H: positive layers, dims and heads, D a multiple of H")
    return dims


def long_generation(args, cutoff, tokens, segment, dims, log) -> tuple:
    """``(shape, body)`` of the default run: the two models' long generation (see the
    module)."""
    check = min(tokens, args.check or (512 if args.smoke else 4096))
    runs, cache = generate_side_by_side(cutoff, tokens, segment, dims, log, args.sinks)
    bounded = runs["bounded"]
    reach = cache_reach(bounded.decoder, dims[0])
    agreement = greedy_agreement((bounded.decoder, None), cutoff, bounded.tokens, check)
    aged = aged_vs_young((bounded.decoder, bounded.step_fn), bounded.tokens[0, :PROMPT],
                         tokens, reach, segment)
    rss = {name: rss_in_own_process(name, cutoff, tokens, dims, args.sinks)
           for name in MODELS}
    body = report(runs, cache, segment, reach, rss, agreement, aged, args.sinks)
    shape = (f"{dims[0]} layers, {dims[1]} dims, {dims[2]} heads, vocabulary {VOCAB}, "
             f"T = {cutoff:g}, sinks {args.sinks}, prompt {PROMPT}, {tokens:,} tokens, greedy, "
             f"batch 1, {args.threads} thread(s)")
    return shape, body


def main(argv=None):
    parser = arguments()
    args = parser.parse_args(argv)
    if args.sinks < 0:
        parser.error("--sinks must be 0 or more")
    if args.tokens is not None and args.tokens < 1:
        parser.error("--tokens must be 1 or more")
    if args.cutoff is not None and not 0 < args.cutoff < float("inf"):
        parser.error("--cutoff must be a positive finite number of nats")
    if args.document_mask != "none" and not args.sinks_cost:
        parser.error("--document-mask is read by --sinks-cost only: add --sinks-cost --sinks S")
    torch.set_num_threads(args.threads)
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    dims = dims_of(parser, args)
    cutoff = args.cutoff or (0.5 if args.smoke and not (args.attention_steps or args.beam_search)
                             else 8.0)
    threads = f"{args.threads} thread(s)"
    sizes = f"{dims[0]} layers, {dims[1]} dims, {dims[2]} heads, T = {cutoff:g}"
    if args.attention_steps:
        try:
            sizes = [int(x) for x in args.head_sizes.split(",")]
            batches = [int(x) for x in args.batches.split(",")] if args.batches else None
        except ValueError:
            sizes = []
        if not sizes or min(sizes + (batches or []) + [args.heads]) < 1:
            parser.error("--heads, --head-sizes and --batches take positive integers: 16,64")
        shape = f"one query, {args.heads} heads, float32, T = {cutoff:g}, {threads}"
        body = attention_steps(cutoff, args.smoke, log, args.heads, sizes, batches)
    elif args.beam_search:
        shape = (f"{'smoke sizes' if args.smoke else 'the quickstart LM'}, T = {cutoff:g}, "
                 f"sinks {args.sinks}, {threads}")
        body = beam_search(cutoff, args.smoke, args.sinks, log, args.tokens)
    elif args.step_backends:
        shape = f"{sizes}, sinks {args.sinks}, greedy, batch 1, {threads}"
        tokens = args.tokens or (512 if args.smoke else 4608)
        if tokens <= bound_reached(cutoff, args.sinks, dims[2]):
            parser.error(f"--step-backends times the steps past the KV cache's bound: --tokens "
                         f"must exceed {bound_reached(cutoff, args.sinks, dims[2])} here")
        body = step_backends(cutoff, args.sinks, tokens, dims)
    else:
        tokens = args.tokens or (512 if args.smoke else 8192 if args.sinks_cost else 32768)
        segment = args.segment or (64 if args.smoke else 2048)
        if args.sinks_cost and not args.sinks:
            parser.error("--sinks-cost needs --sinks S (S > 0): the sinks whose cost it times")
        if args.rss_of:
            print(peak_rss_growth(args.rss_of, cutoff, tokens, dims, args.sinks))
            return None
        if args.sinks_cost:
            shape = f"{sizes}, greedy, batch 1, {threads}"
            shape += f", --alibi-document-mask {args.document_mask}"
            body = sinks_cost(cutoff, args.sinks, tokens, segment, dims, args.document_mask)
        else:
            shape, body = long_generation(args, cutoff, tokens, segment, dims, log)
    print(f"{command_line('benchmarks.decoding_windows', argv)}\nMachine: {machine()}  \n"
          f"{shape}\n\n{body}")
    return body


if __name__ == "__main__":
    main()
