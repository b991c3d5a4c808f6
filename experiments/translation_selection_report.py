"""The report of the selection (``translation_length --select``): ``selection.md`` (its text from
the templates below and the rule's :data:`~experiments.translation_selection_rule.RULE`),
``selection.json``, ``validation.csv``, and each test's CSV and plot, written from a
:class:`experiments.translation_selection.Selection`."""

import json
import resource
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.tables import machine as describe_machine
from experiments.seq2seq_runs import markdown_tables, plot, summarize, write_csv
from experiments.translation_runs import kept_table
from experiments.translation_selection_rule import (
    CONFIRM,
    CONFIRM_FACTOR,
    GOALS,
    RULE,
    decode_flags_of,
    describe,
    flags_of,
    in_range,
    judge,
    kept,
)
from fairseq_alibi.cli.fairseq_runs import machine

# ------------------------------------------------------------------------------- the templates

TITLE = "# Selection on validation, test read once\n"
HEADER = "Command: `{command}`\n\nMachine: {machine}\n\nSizes: {sizes}\n"
SIZE = ("{name}: {s.layers}+{s.layers} layers, {s.dim} dims, FFN {s.ffn}, {s.heads} heads, "
        "{s.max_update} updates")
RANKED = ("Scales ranked on the small size: {ranked}; going on to the large size: "
          "{going_on}.\n")
STEP4 = "\nStep 4 chose **{candidate}**.\n"
STEP5 = ("The chosen checkpoints decoded with the slopes of each slope scale of {scales} for "
         "the sources longer than training's (more than N + 1 = {longer_than} tokens, EOS "
         "included; the others keep the trained slopes), everything else as chosen, judged by "
         "the same rule:\n")
FINAL = "\nChosen: **{candidate}**: train with `{flags}`{decode} ({runs}).\n"
FINAL_DECODE = (" (a checkpoint trained without the inference slope scale: decode with "
                "`{decode}`)")
NO_CHOICE = "\nNo choice yet: the grid has not finished both sizes on validation.\n"
RESTORATION_STEP5 = ("Step 4's restoration checkpoints (small size) decoded on restoration's "
                     "validation buckets at each inference slope scale, by the same rule:\n")
RESTORATION_CHOSEN = "\nChosen for restoration: **{candidate}**.\n"
CONFIRMATION = ("The final setting and `alibi` trained again with every seed, without the "
                "pairs of a second test split: {factor} times the selection's pairs in each "
                "bucket, drawn after its test and validation pairs (the longest bucket: what is "
                "left), so disjoint from everything the selection read:\n")
DIFFERENCE = ("In-range BLEU, {ours} minus {theirs} (mean over seeds): {value:+.1f}; 95 % "
              "paired bootstrap interval {low:+.1f} to {high:+.1f} (the bucket's {n} sentences "
              "drawn with replacement 1,000 times, the same draw for every run).\n")
CPU = ("CPU time of the runs (their own processes): {corpora}; in all {hours:.2f} CPU-hours. "
       "This command: {wall:.0f} s wall, {cpu} CPU-s.\n")
CPU_CORPUS = "{corpus}: {train:.0f} CPU-s training, {decode:.0f} decoding"


# ------------------------------------------------------------------------------- the tables


def pct(x):
    return f"{x:.0%}"


def seeds_cell(values, fmt):
    if not values:
        return "–"
    text = fmt(statistics.fmean(values))
    return text + (f" ({fmt(min(values))}–{fmt(max(values))})" if len(values) > 1 else "")


def validation_rows(scores, baselines):
    """One line per (size, trained, decoding) on validation: in-range BLEU, kept, length."""
    lines = []
    for size_name, runs in scores.items():
        for (name, decoding), per_seed in runs.items():
            seeds = list(per_seed.values())
            verdict = judge(per_seed, baselines.get(size_name) if name != "alibi" else None)
            lines.append({
                "size": size_name, "trained": name, "decoding": decoding,
                "seeds": list(per_seed),
                "in_range_bleu": [rows[0]["bleu"] for rows in seeds],
                "kept_2N": [kept(rows, 1) for rows in seeds],
                "kept_4N": [kept(rows, 2) for rows in seeds],
                "kept_8N": [kept(rows, 3) for rows in seeds],
                "length": [[r["length_ratio"] for r in rows] for rows in seeds],
                "score": verdict["score"], "failed": verdict["failed"]})
    return lines


def validation_table(lines):
    out = ["| size | trained | decoding | in-range BLEU | kept (N,2N] | kept (2N,4N] | "
           "kept (4N,8N] | length, min–max over buckets and seeds | score (min over seeds) | "
           "fails |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in sorted(lines, key=lambda r: (r["size"] != "small", r["trained"], r["decoding"])):
        lengths = [x for per in row["length"] for x in per if x is not None]
        out.append(
            f"| {row['size']} | {row['trained']} | {row['decoding']} | "
            f"{seeds_cell(row['in_range_bleu'], '{:.1f}'.format)} | "
            + " | ".join(seeds_cell(row[k], pct) for k in ("kept_2N", "kept_4N", "kept_8N"))
            + f" | {min(lengths):.2f}–{max(lengths):.2f} | {row['score']:.2f} | "
            f"{', '.join(row['failed']) or '–'} |")
    return "\n".join(out) + "\n"


def write_validation_csv(path, lines):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["size", "trained", "decoding", "seed", "in_range_bleu", "kept_2N",
                    "kept_4N", "kept_8N", "length_N", "length_2N", "length_4N", "length_8N",
                    "candidate_score", "fails"])
        for row in lines:
            for i, seed in enumerate(row["seeds"]):
                w.writerow([row["size"], row["trained"], row["decoding"], seed,
                            f"{row['in_range_bleu'][i]:.2f}", f"{row['kept_2N'][i]:.3f}",
                            f"{row['kept_4N'][i]:.3f}", f"{row['kept_8N'][i]:.3f}",
                            *[f"{x:.3f}" if x is not None else "" for x in row["length"][i]],
                            f"{row['score']:.3f}", "; ".join(row["failed"])])


def test_tables(runs, N):
    """BLEU, BLEU kept and length tables of the test runs ``{label: {seed: rows}}``, and their
    summary over seeds."""
    summary = summarize({label: list(seeds.values()) for label, seeds in runs.items()})
    bleu, _, length = markdown_tables(summary, N).split("\n\n")[:3]
    return f"{bleu}\n\n{kept_table(runs, N)}\n{length}\n", summary


def difference_line(found, ours, theirs):
    if found is None:
        return ""
    value, low, high, n = found
    return DIFFERENCE.format(ours=ours, theirs=theirs, value=value, low=low, high=high, n=n)


def goals_table(test, restoration, chosen_label):
    """Each goal per size and seed: met or missed, with the figure."""
    lines = ["| goal | size | seed | measured | |", "|---|---|---:|---|---|"]

    def row(goal, size, seed, text, ok):
        lines.append(f"| {goal} | {size} | {seed} | {text} | {'met' if ok else 'missed'} |")

    low, high = GOALS["length"]
    for size_name, runs in test.items():
        chosen, alibi = runs.get(chosen_label, {}), runs.get("alibi", {})
        for seed, rows in chosen.items():
            row("≥ 60 % of in-range BLEU kept at (2N, 4N]", size_name, seed,
                pct(kept(rows, 2)), kept(rows, 2) >= GOALS["kept_4N"])
            row("≥ 40 % kept at (4N, 8N]", size_name, seed, pct(kept(rows, 3)),
                kept(rows, 3) >= GOALS["kept_8N"])
            ratios = [r["length_ratio"] for r in rows]
            row("output ÷ reference length within 0.9–1.1 in every bucket", size_name, seed,
                ", ".join(f"{x:.2f}" for x in ratios), all(low <= x <= high for x in ratios))
        if chosen and alibi:
            ours, theirs = in_range(chosen.values()), in_range(alibi.values())
            row("in-range BLEU within 1 point of alibi, or better", size_name, "mean",
                f"{ours:.1f} vs {theirs:.1f} ({ours - theirs:+.1f})",
                ours >= theirs - GOALS["in_range"])
    for seed, rows in restoration.get(chosen_label, {}).items():
        row("restoration: ≥ 80 % kept at (2N, 4N]", "small", seed, pct(kept(rows, 2)),
            kept(rows, 2) >= GOALS["restoration_kept_4N"])
    return "\n".join(lines) + "\n"


def cpu_seconds(out, corpus):
    """CPU-seconds of every run recorded under ``out/runs/corpus``, training and decoding."""
    total = {"train": 0.0, "decode": 0.0}
    for record in (out / "runs" / corpus).rglob("*.json"):
        total["train" if record.name == "train.json" else "decode"] += \
            json.loads(record.read_text())["cpu_s"]
    return total


def choice_table(rows):
    """The :class:`~experiments.translation_selection_rule.Ranked` rows of a choice, best
    first (ten at most)."""
    return ("| rank | candidate | score (min over sizes and seeds) | fails | in-range BLEU |\n"
            "|---:|---|---:|---|---:|\n" + "".join(
                f"| {i} | {describe(row.candidate)} | {row.key[1]:.2f} | "
                f"{failures(row.verdicts)} | {row.key[2]:.1f} |\n"
                for i, row in enumerate(rows[:10], 1)))


def failures(verdicts):
    return "; ".join(f"{s}: {f}" for s, v in verdicts.items() for f in v["failed"]) or "–"


def decode_scales_of(decode_table):
    return sorted(row.candidate[3] for row in decode_table)


def choice_json(row):
    return {"candidate": list(row.candidate), "flags": flags_of(row.candidate),
            "decode_flags": decode_flags_of(row.candidate), "runs": row.runs} if row else None


def ranked_json(row):
    return {"candidate": list(row.candidate), "score": row.key[1],
            "failed_conditions": -row.key[0], "in_range_bleu": row.key[2]}


# ------------------------------------------------------------------------------- the report


def choice_text(sel):
    """Steps 4 and 5: the candidates, the choice and its flags (or why there is none yet)."""
    parts = [choice_table(sel.table)] if sel.table else []
    if not sel.chosen:
        return parts + [NO_CHOICE]
    final = sel.final
    decode = decode_flags_of(final.candidate)
    return parts + [
        STEP4.format(candidate=describe(sel.chosen.candidate)),
        "## The decode-time slope scale (step 5)\n",
        STEP5.format(scales=", ".join(f"{x:g}" for x in decode_scales_of(sel.decode_table)),
                     longer_than=sel.N + 1),
        choice_table(sel.decode_table),
        FINAL.format(candidate=describe(final.candidate), flags=flags_of(final.candidate),
                     decode=FINAL_DECODE.format(decode=decode) if decode else "",
                     runs=", ".join(f"{s}: {t} decoded {d}" for s, (t, d) in final.runs.items()))]


def tests_text(sel, summaries):
    """Step 6 and 7: each test read once, the restoration's step 5, the goals."""
    parts = []
    for size_name, runs in sel.test.items():
        text, summaries[size_name] = test_tables(runs, sel.N)
        parts += [f"## Test, {size_name} size ({sel.grid.corpus}), read once\n", text,
                  difference_line(sel.differences.get(("test", size_name)), "chosen", "alibi")]
    if sel.restoration_table:
        parts += ["## Restoration: the inference slope scale on its validation (step 5)\n",
                  RESTORATION_STEP5, choice_table(sel.restoration_table),
                  RESTORATION_CHOSEN.format(
                      candidate=describe(sel.restoration_table[0].candidate))]
    if sel.restoration:
        text, summaries["restoration"] = test_tables(sel.restoration, sel.N)
        parts += ["## Test, punctuation and case restoration (small size)\n", text]
    if sel.test:
        parts += ["## The goals, per size and seed (the final choice)\n",
                  goals_table(sel.test, sel.restoration, "chosen")]
    for size_name, runs in sel.confirmation.items():
        text, summaries[f"{CONFIRM}_{size_name}"] = test_tables(runs, sel.N)
        parts += [f"## Confirmation, {size_name} size: a fresh test split, read once (step 7)\n",
                  CONFIRMATION.format(factor=CONFIRM_FACTOR), text,
                  difference_line(sel.differences.get((CONFIRM, size_name)), "chosen", "alibi")]
    if sel.confirmation:
        parts += ["## The goals on the confirmation split\n",
                  goals_table(sel.confirmation, {}, "chosen")]
    return parts


def cpu_text(cpu, started):
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total_cpu = round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 1)
    return CPU.format(corpora="; ".join(CPU_CORPUS.format(corpus=c, **v) for c, v in cpu.items()),
                      hours=sum(sum(v.values()) for v in cpu.values()) / 3600,
                      wall=time.time() - started, cpu=total_cpu)


def report_text(sel, lines, command, started, cpu, summaries):
    """``selection.md``; fills ``summaries`` (``{table name: summary}``) for the CSVs."""
    going_on = ", ".join(f"{x:g}" for x in sel.going_on) or "– (the small size is not complete)"
    sizes = "; ".join(SIZE.format(name=n, s=s) for n, s in sel.sizes.items())
    parts = [TITLE, HEADER.format(command=command, machine=describe_machine(), sizes=sizes),
             "## The rule\n", RULE + "\n", "## Validation (every candidate)\n",
             validation_table(lines),
             RANKED.format(ranked=", ".join(f"{x:g}" for x in sel.ranked) or "–",
                           going_on=going_on),
             "## The choice\n", *choice_text(sel), *tests_text(sel, summaries),
             cpu_text(cpu, started)]
    return "\n".join(parts)


def saved_json(sel, lines, command, cpu):
    """``selection.json``: every figure the report shows, and the choices' flags."""
    return {"command": command, "machine": machine(), "complete": bool(sel.complete),
            "sizes": {n: vars(s) for n, s in sel.sizes.items()}, "scales": list(sel.scales),
            "decode_grid": {k: list(v) for k, v in sel.decode_grid.items()},
            "ranked_scales": sel.ranked, "large_scales": sel.going_on,
            "baseline_in_range_valid": sel.baselines,
            "choice": choice_json(sel.final), "step4_choice": choice_json(sel.chosen),
            "restoration_choice": choice_json(sel.restoration_table[0]
                                              if sel.restoration_table else None),
            "decode_scales": [ranked_json(row) for row in sel.decode_table],
            "candidates": [dict(ranked_json(row), verdicts=row.verdicts) for row in sel.table],
            "validation": lines, "test": sel.test, "restoration": sel.restoration,
            "confirmation": sel.confirmation,
            "in_range_differences": {f"{split} {size}": found
                                     for (split, size), found in sel.differences.items()},
            "cpu_s": cpu}


def write_tests(out, sel, summaries):
    """Each test's CSV and plot; the paths written."""
    confirmed = f"{sel.grid.corpus}_{CONFIRM}"
    tables = [(name, sel.grid.corpus, name, runs) for name, runs in sel.test.items()]
    tables += [("restoration", "restoration", "small", sel.restoration)] if sel.restoration else []
    tables += [(f"{CONFIRM}_{size_name}", confirmed, size_name, runs)
               for size_name, runs in sel.confirmation.items()]
    written = []
    for name, corpus, size_name, runs in tables:
        csv_path = out / f"test_{corpus}_{size_name}.csv"
        write_csv(csv_path, runs, summaries[name])
        png = out / f"test_{corpus}_{size_name}.png"
        what = ("punctuation and case restoration" if corpus == "restoration"
                else "French to English (gettext)" + (
                    f", {CONFIRM} split" if corpus == confirmed else ""))
        plot(png, summaries[name], sel.N, f"{what}, {size_name} size, test, trained on <= "
                                          f"N={sel.N} tokens")
        written += [csv_path] + ([png] if png.is_file() else [])
    return written


def write(out, args, command, started, sel):
    """Every file of the selection into ``out`` (and ``--docs``); the report's text."""
    lines = validation_rows(sel.scores, sel.baselines)
    write_validation_csv(out / "validation.csv", lines)
    corpora = [sel.grid.corpus, "restoration"] + (
        [f"{sel.grid.corpus}_{CONFIRM}"] if sel.confirmation else [])
    cpu = {corpus: cpu_seconds(out, corpus) for corpus in dict.fromkeys(corpora)}
    summaries = {}
    report = report_text(sel, lines, command, started, cpu, summaries)
    (out / "selection.md").write_text(report)
    (out / "selection.json").write_text(json.dumps(saved_json(sel, lines, command, cpu),
                                                   indent=2, default=str))
    written = [out / "selection.md", out / "validation.csv"] + write_tests(out, sel, summaries)
    if args.docs:
        docs = Path(args.docs)
        for path in written:
            shutil.copy(path, docs / f"translation_selection_{path.name}"
                        if path.name != "selection.md" else docs / "translation_selection.md")
    return report
