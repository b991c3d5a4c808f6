"""Choosing the slope-window cutoff T for a translation model: ``python -m
experiments.slope_windows --family translation`` (options: :mod:`experiments.slope_windows`).

``alibi_transformer`` (offset encoder, causal decoder, stock cross-attention: the translation
study's ``alibi`` configuration, :data:`experiments.translation_runs.CONFIGS`) is trained on
French→English from the machine's gettext catalogs (:func:`experiments.translation_runs.
build_gettext`, the recipe of docs/translation.md) with sources of at most ``N = --L`` tokens,
and translates the test split, ``--per-bucket`` sentences in each source-length bucket
(N/2, N], (N, 2N], (2N, 4N], (4N, 8N], with stock ``fairseq-generate`` (beam 4): dense, and with
the load-time override ``--model-overrides "{'encoder_alibi_window_cutoff': T,
'decoder_alibi_window_cutoff': T}"`` (the cutoff on the encoder's and the decoder's
self-attention; the cross-attention has no distance bias here and no window), and with
``--sinks S`` each ``T`` with ``S`` attention sinks on both sides too
(``encoder_alibi_window_sinks``, ``decoder_alibi_window_sinks``). Per ``T`` and
bucket: BLEU (sacrebleu on the tokens as they are) and its change against dense, in points,

    change(T, bucket) = BLEU_T - BLEU_dense,

and the largest attention mass a query of the dense model loses (:class:`experiments.
slope_windows.LostMassMeter` on both sides' self-attention, the reference translations teacher
-forced, per bucket).
"""

import json
import time
from types import SimpleNamespace

from benchmarks.tables import machine, table
from experiments.lm_runs import publish
from experiments.seq2seq_runs import (bucket_names, generate_command, length_buckets,
                                      read_generate_log, score, train_command)
from experiments.slope_windows import (DENSE, LOST_MASS_TITLE, LostMassMeter, grid, label,
                                       load_dense, report_head, setting, write_csv)
from experiments.translation_runs import (CONFIGS, GETTEXT_VOCAB, build_gettext, generate_once,
                                          in_parallel, test_sources, train_once)
from fairseq_alibi.cli.windows_check import window_overrides

#: the issue's quality goal for translation: BLEU within this many points of dense
BLEU_GOAL = 0.2
#: the translation study's size (experiments/translation_length.py's defaults)
SIZE = dict(layers=2, dim=64, heads=4, lr=0.004, max_tokens=1024, warmup=100)
SMOKE_SIZE = dict(layers=1, dim=16, heads=4, lr=0.004, max_tokens=256, warmup=2)
#: the ALiBi sides whose self-attention gets the cutoff (``window_overrides``' prefixes)
SIDES = ("encoder_alibi", "decoder_alibi")
ALL = "all"


def corpus(args, out, log) -> dict:
    """The gettext corpus (built once in ``out/data``): ``{"bin", "meta", "sources"}``."""
    data = out / "data"
    stats = data / "plain" / "bin" / "stats.json"
    if not stats.is_file():
        log(f"building gettext French->English (N = {args.L}, {args.per_bucket} test sentences "
            "a bucket) ...")
        data.mkdir(parents=True, exist_ok=True)
        build_gettext(data, SimpleNamespace(vocab=GETTEXT_VOCAB, N=args.L,
                                            per_bucket=args.per_bucket, data_seed=args.seed,
                                            smoke=args.smoke))
    meta = {"plain_text": "plain/bin", "langs": ["fr", "en"],
            "splits": json.loads(stats.read_text())["splits"]}
    return {"bin": data / "plain" / "bin", "meta": meta, "sources": test_sources(data, meta)}


def translate(checkpoint, data: dict, cutoffs, out, env, N: int, jobs: int = 1) -> list:
    """One row per ``(T, bucket)`` (dense too, and every test sentence: :data:`ALL`): BLEU and
    its change against dense in points; ``cutoffs``: cutoffs ``T`` or pairs ``(T, S)`` with
    ``S`` attention sinks (:func:`~experiments.slope_windows.setting`); ``jobs``
    fairseq-generate runs at a time."""
    sources = data["sources"]
    bounds = length_buckets(N)
    bounds_all = bounds + [(bounds[0][0], bounds[-1][1])]
    names = bucket_names(N, bounds) + [ALL]
    runs = [(setting(c), out / "generate" / f"{label(*setting(c)).replace('=', '')}.log"
             .replace(" ", "_")) for c in [0.0] + list(cutoffs)]
    in_parallel(max(1, jobs), [
        lambda t=t, log_file=log_file: generate_once(
            label(*t), log_file, generate_command(
                data["bin"], checkpoint, beam=4, langs=("fr", "en"),
                model_overrides=window_overrides(SIDES, *t) if t[0] else None), env, len(sources))
        for t, log_file in runs])
    rows, dense = [], None
    for (t, sinks), log_file in runs:
        hyps, refs, _ = read_generate_log(label(t, sinks), log_file.read_text(), log_file,
                                          len(sources))
        scored = score(hyps, refs, sources, N, bounds_all)
        dense = dense or scored
        rows += [{"cutoff": label(t, sinks), "T": t or None, "S": sinks, "length": name,
                  "tokens": r["sentences"],
                  "bleu": r["bleu"], "change": r["bleu"] - d["bleu"],
                  "length_ratio": r["length_ratio"]}
                 for name, r, d in zip(names, scored, dense)]
    return rows


def losses(checkpoint, data: dict, cutoffs, N: int) -> dict:
    """``{(T, bucket): largest lost mass}`` of the dense model, both sides' self-attention, on
    each bucket's test pairs (the ``test1`` … ``test4`` splits of the corpus) teacher-forced;
    ``cutoffs`` as :func:`translate`'s (a pair ``(T, S)`` keys its own)."""
    import torch
    from fairseq import utils

    model, task = load_dense(checkpoint, dict({"data": str(data["bin"])},
                                              **window_overrides(SIDES, 0.0)))
    meter = LostMassMeter(model, cutoffs)
    names = bucket_names(N, length_buckets(N))
    with torch.no_grad():
        for k, name in enumerate(names, 1):
            task.load_dataset(f"test{k}")
            batches = task.get_batch_iterator(
                dataset=task.dataset(f"test{k}"), max_tokens=4096,
                max_positions=utils.resolve_max_positions(task.max_positions(),
                                                          model.max_positions()),
                required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
            with meter.at(name):
                for sample in batches:
                    model(**sample["net_input"])
    for t in cutoffs:
        meter.found[(t, ALL)] = max(meter.found[(t, name)] for name in names)
    return meter.found


def main(args, command: str, out, env, log) -> int:
    started = time.time()
    data = corpus(args, out, log)
    size = SMOKE_SIZE if args.smoke else SIZE
    where = out / "train"
    cmd = train_command(data["bin"], where / "checkpoints", CONFIGS["alibi"].model,
                        layers=size["layers"], dim=size["dim"], lr=size["lr"],
                        max_tokens=size["max_tokens"], max_update=args.max_update,
                        seed=args.seed, warmup=size["warmup"], langs=("fr", "en"),
                        heads=size["heads"])
    log(f"training alibi_transformer ({size['layers']} + {size['layers']} layers, dim "
        f"{size['dim']}, {args.max_update} updates of {size['max_tokens']} tokens) ...")
    trained = train_once("alibi", where, cmd, env, args.max_update)
    settings = [t if not sinks else (t, sinks) for t in args.cutoffs for sinks in args.sinks]
    rows = translate(trained["checkpoint"], data, settings, out, env, args.L, args.jobs)
    lost = losses(trained["checkpoint"], data, settings, args.L)
    for row in rows:
        key = row["T"] if not row["S"] else (row["T"], row["S"])
        row["lost_mass"] = lost.get((key, row["length"]))
    write_csv(out / "slope_windows.csv", rows, ["bleu", "length_ratio"])
    names = [label(*setting(c)) for c in settings]
    columns = list(dict.fromkeys(r["length"] for r in rows))
    heads = ["T"] + [f"{c} ({next(r['tokens'] for r in rows if r['length'] == c)})"
                     for c in columns]
    within = [name for name in names if all(
        abs(r["change"]) <= BLEU_GOAL for r in rows if r["cutoff"] == name)]
    total = time.time() - started
    report = "\n".join([
        *report_head("a translation model", command, machine(), total),
        f"Model: alibi_transformer ({CONFIGS['alibi'].what}), {size['layers']} + "
        f"{size['layers']} layers, dim {size['dim']}, {size['heads']} heads, trained "
        f"{args.max_update} updates of {size['max_tokens']} tokens in {trained['wall_s']:.0f} s "
        f"on {data['meta']['splits']['train']:,} gettext pairs (sources of at most N = "
        f"{args.L} tokens)", "",
        "BLEU of fairseq-generate (beam 4; dense row) and its change against dense in points, "
        "per source-length bucket (test sentences in brackets); the cutoff on the encoder's and "
        "the decoder's self-attention:", "",
        table(heads, grid(rows, [DENSE], columns, lambda r, _: f"{r['bleu']:.2f}")
              + grid(rows, names, columns, lambda r, _: f"{r['change']:+.2f}")), "",
        LOST_MASS_TITLE.replace("(every layer and head)", "(every layer and head of both "
                                "sides' self-attention, references teacher-forced)"), "",
        table(heads, grid(rows, names, columns, lambda r, _: f"{r['lost_mass']:.1e}")), "",
        f"Smallest T within {BLEU_GOAL} BLEU of dense in every bucket: "
        + (f"{within[0]}" + (" (S: attention sinks on both sides)" if "S=" in within[0] else "")
           + "." if within else "none measured."),
        ""])
    return publish(out, "slope_windows.md", report, {
        "command": command, "family": "translation", "N": args.L, "cutoffs": args.cutoffs,
        "sinks": args.sinks,
        "rows": rows, "training": trained, "data": str(data["bin"]),
        "machine": machine(), "total_s": round(total, 1)}, log, total)
