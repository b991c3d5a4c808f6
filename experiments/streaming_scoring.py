"""Streaming scoring against the stride-1 sliding window: the same held-out tokens, perplexity
and tokens/s side by side.

    python -m experiments.streaming_scoring [--out DIR] [--lengths 256,1024] [--cutoff 8]
                                            [--chunks 1,64] [--prefix-tokens 2048] [--rounds 3]
                                            [--L 64] [--max-update N]
                                            [--checkpoint PATH --data DIR] [--threads 1]
                                            [--smoke]

The quickstart's language model (its embedded corpus, its ``tiny`` model and training command
at ``L`` = 64), or an existing causal ALiBi model (``--checkpoint PATH --data DIR``), scores
the first ``--prefix-tokens`` tokens of the held-out ``test`` split (a binarized copy of them,
``prefix/``, so that both tools read exactly these tokens, and the first input token is the
end-of-sentence symbol for both) in two ways:

* the stride-1 sliding window of the ALiBi paper: ``fairseq-eval-lm --tokens-per-sample L'
  --context-window L'-1`` (fairseq 0.12 subtracts the window from the tokens per sample: blocks
  of one scored token, each run with the ``L' - 1`` tokens before it, so token ``t`` sees
  ``min(t, L' - 1)`` earlier tokens, one forward pass of up to ``L'`` tokens per scored token),
  at each ``L'`` of ``--lengths``, through :func:`fairseq_alibi.cli.sweep.eval_command`;
* streaming: ``fairseq-alibi eval-lm-stream`` (each token scored once, with every earlier key
  the model keeps: all of them dense, with the cutoff ``T`` those within each head's window),
  ``--stream-chunk c`` tokens per forward call for each ``c`` of ``--chunks`` (1: token by
  token, the cost of cached decoding), dense and with ``--model-overrides
  "{'alibi_window_cutoff': T}"``.

Every run must score every prefix token (checked). Per scorer the report gives the perplexity,
streaming's change against each window ``ppl_stream / ppl_window - 1`` (the goal:
``<= +0.5 %``), the tokens/s fairseq-eval-lm's timer reports (the forward passes only, the same
timer in both tools), and streaming's tokens/s over each window's (goal ``>= 20×`` at
``L' >= 256``): the runs follow each other in every round and the median of ``--rounds`` is
reported. Outputs in ``--out``: ``streaming_scoring.md``, ``streaming_scoring.csv``,
``run.json``, ``prefix/``, ``logs/``. ``--smoke``: the quickstart's smoke model, a few updates,
short lengths and prefix (used by the tests).
"""

import argparse
import csv
import math
import re
import sys
import time
from pathlib import Path
from statistics import median
from typing import List, Optional, Sequence

from benchmarks.tables import machine, table, today
from experiments.lm_runs import command_line, prepare_model, publish, start_run
from fairseq_alibi.cli.fairseq_runs import run_logged
from fairseq_alibi.cli.quickstart import SIZES, SMOKE_L
from fairseq_alibi.cli.sweep import (SweepModel, eval_command, parse_eval_output, refusal,
                                     split_token_count)

#: the goals: streaming's perplexity at most this much above the stride-1 window's, at
#: least this many times its tokens/s
PERPLEXITY_GOAL, SPEED_GOAL = 0.005, 20.0
#: tokens of one forward pass of the sliding window (its batch: this many // L' windows)
WINDOW_BATCH_TOKENS = 16384
_SPEED = re.compile(r"Evaluated [\d,]+ tokens in [\d.]+s \(([\d.]+) tokens/s\)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/streaming_scoring")
    parser.add_argument("--lengths", default=None,
                        help="sliding-window lengths L' (comma-separated; default 256,1024)")
    parser.add_argument("--cutoff", type=float, default=8.0,
                        help="the slope-window cutoff T of the windowed stream (nats)")
    parser.add_argument("--chunks", default=None,
                        help="tokens per forward call of the stream (comma-separated; "
                        "default 1,64)")
    parser.add_argument("--prefix-tokens", type=int, default=None,
                        help="held-out tokens scored (the start of the test split; "
                        "default 2048)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds (tokens/s: the median; default 3, --smoke 1)")
    parser.add_argument("--L", type=int, default=None, help="training length (default 64)")
    parser.add_argument("--max-update", type=int, default=None,
                        help="training updates (default: the quickstart's 1000)")
    parser.add_argument("--checkpoint", default=None,
                        help="score this causal ALiBi model instead of training one (needs "
                        "--data)")
    parser.add_argument("--data", default=None, help="binarized corpus (with a test split)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="threads of each process")
    parser.add_argument("--smoke", action="store_true", help="toy model, every step")
    args = parser.parse_args(argv)
    if args.checkpoint and not args.data:
        parser.error("--checkpoint needs --data (the binarized corpus it is scored on)")
    args.L = args.L or (SMOKE_L if args.smoke else 64)
    args.max_update = args.max_update or (6 if args.smoke else SIZES["tiny"]["max_update"])
    args.lengths = positive_list(parser, "--lengths", args.lengths,
                                 (32, 64) if args.smoke else (256, 1024), minimum=2)
    args.chunks = positive_list(parser, "--chunks", args.chunks,
                                (1, 16) if args.smoke else (1, 64), minimum=1)
    args.prefix_tokens = args.prefix_tokens or (160 if args.smoke else 2048)
    args.rounds = args.rounds or (1 if args.smoke else 3)
    if args.prefix_tokens < 1 or args.rounds < 1:
        parser.error("--prefix-tokens and --rounds must be at least 1")
    if not (math.isfinite(args.cutoff) and args.cutoff > 0):
        parser.error(f"--cutoff must be a finite number of nats > 0 (dense streaming is always "
                     f"measured), got {args.cutoff}")
    return args


def positive_list(parser, flag: str, text: Optional[str], default: Sequence[int],
                  minimum: int) -> List[int]:
    """``text`` (``a,b``) as sorted distinct integers ``>= minimum``; ``default`` if absent."""
    if text is None:
        return sorted(set(default))
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        parser.error(f"{flag}: not a comma-separated list of integers: {text!r}")
    if not values or values[0] < minimum:
        parser.error(f"{flag}: give integers >= {minimum}, got {text!r}")
    return values


def write_prefix(data: Path, tokens: int, folder: Path) -> int:
    """A binarized corpus in ``folder`` whose ``test`` split is the first ``tokens`` tokens of
    ``data``'s (its lines in order, the last one cut), with ``data``'s dictionary; returns its
    token count (fewer if the split is shorter)."""
    import shutil

    from fairseq.data import Dictionary, data_utils, indexed_dataset

    source = data_utils.load_indexed_dataset(str(data / "test"), None)
    if source is None or len(source) == 0:
        raise SystemExit(f"no test split with text in {data}")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(data / "dict.txt", folder / "dict.txt")
    vocab = len(Dictionary.load(str(folder / "dict.txt")))
    builder = indexed_dataset.make_builder(str(folder / "test.bin"), impl="mmap",
                                           vocab_size=vocab)
    written = 0
    for index in range(len(source)):
        line = source[index][: tokens - written]
        builder.add_item(line)
        written += line.numel()
        if written >= tokens:
            break
    builder.finalize(str(folder / "test.idx"))
    return written


def scorers(args, checkpoint: Path, prefix: Path, python: str) -> dict:
    """Every run of a round, by name: its command line and what the report says of it."""
    runs = {}
    for length in args.lengths:
        batch = max(1, WINDOW_BATCH_TOKENS // length)
        runs[f"window L'={length}"] = {
            "kind": "window", "length": length, "T": None, "chunk": None,
            "command": eval_command(SweepModel(str(checkpoint)), str(prefix), length,
                                    "sliding", stride=1,
                                    extra_eval_args=["--cpu", "--batch-size", str(batch)])}
    for cutoff in (None, args.cutoff):
        for chunk in args.chunks:
            command = [python, "-m", "fairseq_alibi", "eval-lm-stream", str(prefix), "--path",
                       str(checkpoint), "--cpu", "--num-workers", "0", "--stream-chunk",
                       str(chunk)]
            if cutoff:
                command += ["--model-overrides", repr({"alibi_window_cutoff": cutoff})]
            name = f"stream {'dense' if cutoff is None else f'T={cutoff:g}'}, chunk {chunk}"
            runs[name] = {"kind": "stream", "length": None, "T": cutoff, "chunk": chunk,
                          "command": command}
    return runs


def measure(runs: dict, expected: int, rounds: int, out: Path, env: dict, log) -> List[dict]:
    """Each run ``rounds`` times, one after the other in every round: a row per run with its
    perplexity (every run must score all ``expected`` tokens) and median tokens/s."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    speeds = {name: [] for name in runs}
    losses = {}
    for turn in range(rounds):
        for name, run in runs.items():
            log(f"round {turn + 1} of {rounds}: {name} ...")
            slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
            output = run_logged(run["command"], out / "logs" / f"{slug}_round{turn + 1}.log",
                                env, name)
            tokens, loss = parse_eval_output(output)
            why = refusal(tokens, expected, loss)
            if why:
                raise SystemExit(f"{name}: {why}")
            losses[name] = loss
            speeds[name].append(float(_SPEED.findall(output)[-1]))
    return [{"scorer": name, "kind": run["kind"], "length": run["length"], "T": run["T"],
             "chunk": run["chunk"], "tokens": expected, "loss_base2": losses[name],
             "perplexity": 2.0 ** losses[name], "tokens_per_s": median(speeds[name]),
             "tokens_per_s_rounds": speeds[name]} for name, run in runs.items()]


def compare(rows: List[dict]) -> List[dict]:
    """A row per (stream, window): the perplexity change and the tokens/s ratio."""
    windows = [r for r in rows if r["kind"] == "window"]
    return [{"stream": s["scorer"], "window": w["scorer"], "length": w["length"],
             "change": s["perplexity"] / w["perplexity"] - 1.0,
             "speedup": s["tokens_per_s"] / w["tokens_per_s"]}
            for s in rows if s["kind"] == "stream" for w in windows]


def report_tables(rows: List[dict], pairs: List[dict]) -> str:
    def speed(value):
        return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"

    scored = table(["scorer", "perplexity", "loss (base 2)", "tokens/s (median)",
                    "tokens/s of the rounds"],
                   [[r["scorer"], f"{r['perplexity']:.3f}", f"{r['loss_base2']:.4f}",
                     speed(r["tokens_per_s"]),
                     ", ".join(speed(v) for v in r["tokens_per_s_rounds"])] for r in rows])
    lengths = sorted({p["length"] for p in pairs})
    streams = list(dict.fromkeys(p["stream"] for p in pairs))
    cell = {(p["stream"], p["length"]): p for p in pairs}
    heads = ["stream"] + [f"vs window L'={n}: ppl change / speed" for n in lengths]
    body = [[s] + [f"{cell[s, n]['change']:+.3%} / {cell[s, n]['speedup']:.1f}×"
                   for n in lengths] for s in streams]
    met = [p for p in pairs if p["change"] <= PERPLEXITY_GOAL and p["speedup"] >= SPEED_GOAL]
    verdict = (f"Goal (perplexity at most {PERPLEXITY_GOAL:+.1%} against the stride-1 window and "
               f"≥ {SPEED_GOAL:g}× its tokens/s): met by {len(met)} of the {len(pairs)} pairs"
               + (": " + "; ".join(f"{p['stream']} vs {p['window']}" for p in met)
                  if met else "") + ".")
    return "\n".join([scored, "", "Streaming against each stride-1 window (perplexity change "
                      "`ppl_stream / ppl_window - 1`; speed: tokens/s ratio):", "",
                      table(heads, body), "", verdict])


def write_csv(path: Path, rows: List[dict]):
    fields = [k for k in rows[0] if k != "tokens_per_s_rounds"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    args = parse_args(argv)
    out, env, log = start_run(args.out, "streaming-scoring", args.threads)
    started = time.time()
    command = command_line("experiments.streaming_scoring", argv)
    machine_line = machine()
    model = prepare_model(args, out, env, log)
    prefix = out / "prefix"
    tokens = write_prefix(model["data"], args.prefix_tokens, prefix)
    assert split_token_count(str(prefix), "test") == tokens
    log(f"scoring the first {tokens:,} test tokens ({prefix})")
    runs = scorers(args, model["checkpoint"], prefix, sys.executable)
    rows = measure(runs, tokens, args.rounds, out, env, log)
    pairs = compare(rows)
    write_csv(out / "streaming_scoring.csv", rows)
    total = time.time() - started
    report = "\n".join([
        "# Streaming scoring against the stride-1 sliding window", "",
        f"Command: `{command}`  ", f"Machine: {machine_line}; {args.threads} thread(s) a run  ",
        f"Date: {today()}; total wall time {total:.0f} s  ",
        f"Model: {model['checkpoint']} (trained at L = {args.L}); the first {tokens:,} tokens "
        f"of the test split of {model['data']}, every one scored by every run; "
        f"{args.rounds} round(s)", "",
        report_tables(rows, pairs), ""])
    return publish(out, "streaming_scoring.md", report, {
        "command": command, "machine": machine_line, "L": args.L, "tokens": tokens,
        "lengths": args.lengths, "chunks": args.chunks, "cutoff": args.cutoff, "rows": rows,
        "pairs": pairs, "commands": {n: r["command"] for n, r in runs.items()},
        "checkpoint": str(model["checkpoint"]), "data": str(model["data"]),
        "training": model["trained"], "total_s": round(total, 1)}, log, total)


if __name__ == "__main__":
    sys.exit(main())
