"""Choosing the slope-window cutoff T for an encoder: ``python -m experiments.slope_windows
--family encoder`` (options: :mod:`experiments.slope_windows`).

Configurations of the encoder study (``--variants``, default ``offset``, the study's default
variant, and ``one_sided``, whose heads look one way each: its windows are one-sided) are
pretrained as the study pretrains them (:func:`experiments.encoder_study.pretrain`: ``fairseq-train
--task masked_lm --sample-break-mode none`` at ``L`` tokens a block), on WikiText-2's validation
split, and scored on the first ``--heldout-lines`` lines of its test split in blocks of
``N = L, 4L, 16L`` tokens: the masked-LM perplexity of every masked target
(:func:`experiments.encoder_study.mlm_perplexity`, what ``fairseq-validate --valid-subset test
--tokens-per-sample N`` computes, in this process and to full precision), dense and with the
load-time override ``{'alibi_window_cutoff': T}``, the same masking seed for all: the same
tokens are masked, so the change is the cutoff's alone,

    change(T, N) = ppl_T / ppl_dense - 1.

The largest lost attention mass is :class:`experiments.slope_windows.LostMassMeter`'s on the
same blocks (both directions of each head's window).
"""

import time
from types import SimpleNamespace

from benchmarks.tables import machine, table
from experiments.encoder_study import held_out_blocks, mlm_perplexity, pretrain
from experiments.encoder_study_configs import CONFIGS, Settings
from experiments.lm_runs import publish
from experiments.slope_windows import (DENSE, GOAL, LOST_MASS_TITLE, LostMassMeter, grid, label,
                                       report_head, smallest_within_goal, wikitext_data,
                                       write_csv)

#: the size of the measured encoders: the study's shape (4 heads) at 2 layers, a short budget
SIZE = dict(layers=2, dim=128, heads=4, ffn=512, vocab=2000, batch=32, lr=1e-3)
SMOKE_SIZE = dict(layers=1, dim=32, heads=4, ffn=64, vocab=400, batch=8, lr=1e-3)
#: the masking seed of every score (the same masked tokens for dense and every T)
MASK_SEED = 1


def settings(args) -> Settings:
    size = SMOKE_SIZE if args.smoke else SIZE
    return Settings(L=args.L, updates=args.max_update, warmup=max(1, args.max_update // 10),
                    heldout_lines=args.heldout_lines, mlm_seeds=(MASK_SEED,),
                    lengths=tuple(args.multiples), **size)


def score(checkpoint: str, text: str, cutoffs, lengths, variant: str, log) -> list:
    """One row per ``(T, N)`` (dense too): masked-LM perplexity and its change against dense."""
    rows = []
    for n in lengths:
        dense = None
        for t in [0.0] + list(cutoffs):
            found = mlm_perplexity(checkpoint, text, n, MASK_SEED,
                                   model_overrides={"alibi_window_cutoff": t})
            dense = dense or found
            rows.append({"variant": variant, "cutoff": label(t), "T": t or None, "length": n,
                         "tokens": found["tokens"], "masked_tokens": found["masked_tokens"],
                         "perplexity": found["perplexity"],
                         "change": found["perplexity"] / dense["perplexity"] - 1.0,
                         "text_change": found["text_perplexity"] / dense["text_perplexity"]
                         - 1.0})
        log(f"{variant} at N={n}: dense {dense['perplexity']:.3f}, changes "
            + ", ".join(f"{r['cutoff']} {r['change']:+.4%}" for r in rows[-len(cutoffs):]))
    return rows


def losses(checkpoint: str, text: str, cutoffs, lengths, sample_tokens: int) -> dict:
    """``{(T, N): largest lost mass}`` of the dense encoder on the held-out blocks of ``N``
    (at most ``sample_tokens`` tokens a length, at least one batch)."""
    import torch

    found = {}
    for n in lengths:
        model, _, _, batches = held_out_blocks(checkpoint, text, n, MASK_SEED,
                                               model_overrides={"alibi_window_cutoff": 0.0})
        meter = LostMassMeter(model, cutoffs)
        seen = 0
        with torch.no_grad(), meter.at(n):
            for sample in batches:
                model(sample["net_input"]["src_tokens"])
                seen += int(sample["ntokens"])
                if seen >= sample_tokens:
                    break
        found.update(meter.found)
    return found


def main(args, command: str, out, env, log) -> int:
    started = time.time()
    s = settings(args)
    lengths = [m * args.L for m in args.multiples]
    text = str(wikitext_data(args, out, s.vocab, env, log))
    rows, trained, lines = [], {}, []
    for variant in args.variants:
        if variant not in CONFIGS or not CONFIGS[variant].pretrain:
            raise SystemExit(f"--variants {variant}: not a pretrained configuration of the "
                             f"encoder study; choose among {', '.join(CONFIGS)}")
        run = pretrain(variant, {"text": text}, out, s, SimpleNamespace(seed=args.seed), env,
                       log)
        trained[variant] = run
        found = score(run["checkpoint"], text, args.cutoffs, lengths, variant, log)
        lost = losses(run["checkpoint"], text, args.cutoffs, lengths, args.sample_tokens)
        for row in found:
            row["lost_mass"] = lost.get((row["T"], row["length"]))
        rows += found
        names = [label(t) for t in args.cutoffs]
        heads = ["T"] + [f"{n // args.L}L = {n}" for n in lengths]
        chosen = smallest_within_goal(found, args.cutoffs)
        lines += [
            f"## {variant}: {CONFIGS[variant].label}", "",
            f"Pretrained {s.updates} updates of {s.batch} × {s.L} tokens ({s.layers} layers, "
            f"dim {s.dim}, {s.heads} heads) in {run['seconds']:.0f} s, final training loss "
            f"{run['final_train_loss']} (base 2). Masked-LM perplexity of every masked target "
            f"(dense row) and its change against dense, {found[0]['tokens']:,} held-out tokens "
            f"({found[0]['masked_tokens']:,} masked at N = L):", "",
            table(heads, grid(found, [DENSE], lengths, lambda r, _: f"{r['perplexity']:.3f}")
                  + grid(found, names, lengths, lambda r, _: f"{r['change']:+.4%}")), "",
            LOST_MASS_TITLE, "",
            table(heads, grid(found, names, lengths, lambda r, _: f"{r['lost_mass']:.1e}")), "",
            f"Smallest T within {GOAL:.1%} of dense at every length: "
            + (f"T = {chosen:g}." if chosen is not None else "none measured."), ""]
    write_csv(out / "slope_windows.csv", rows, ["variant", "text_change", "masked_tokens"])
    total = time.time() - started
    report = "\n".join([
        *report_head("an encoder of the encoder study", command, machine(), total),
        f"Data: {text} (WikiText-2 validation split to pretrain, the first "
        f"{args.heldout_lines} lines of its test split scored)", "", *lines])
    return publish(out, "slope_windows.md", report, {
        "command": command, "family": "encoder", "L": args.L, "lengths": lengths,
        "cutoffs": args.cutoffs, "variants": args.variants, "rows": rows, "training": trained,
        "data": text, "total_s": round(total, 1)}, log, total)
