"""The encoder study's report (``python -m experiments.encoder_study --steps report``):
``encoder_study.md``, ``mlm.csv``, ``glue.csv``, ``long.csv``, ``reach.csv`` and
``encoder_study.png``, read back from every finished piece's result file, a section each."""

import json
import math
import statistics
from pathlib import Path
from typing import Dict, List

from benchmarks.tables import machine, table, today
from experiments.encoder_study_configs import (
    BASELINE,
    CONFIGS,
    GLUE_TASKS,
    LONG_TASKS,
    Settings,
)


# ---------------------------------------------------------------------------- long inputs


def bucket_of(length: int, L: int) -> str:
    for factor, name in ((1, f"≤ L ({L})"), (2, f"L–2L ({L + 1}–{2 * L})"),
                         (4, f"2L–4L ({2 * L + 1}–{4 * L})")):
        if length <= factor * L:
            return name
    return f"> 4L (> {4 * L})"


def bucket_scores(record: dict, task: str, lengths, L: int) -> Dict[str, dict]:
    """Per dev-length bucket: the task's main metric of every seed, from the saved dev
    predictions (accuracy; Pearson for STS-B)."""
    import numpy as np

    from fairseq_alibi.cli.glue_finetune import RECIPES, pearson

    buckets = [bucket_of(int(n), L) for n in lengths]
    found = {}
    for run in sorted((r for r in record["runs"] if r["task"] == task), key=lambda r: r["seed"]):
        folder = Path(run["checkpoint"]).parent.parent
        pred = np.load(folder / "dev_predictions.npy")
        gold = np.load(folder / "dev_labels.npy")
        for bucket in dict.fromkeys(buckets):
            chosen = np.array([b == bucket for b in buckets])
            if RECIPES[task].regression:
                value = 100 * pearson(pred[chosen].astype(float), gold[chosen].astype(float))
                value = 0.0 if math.isnan(value) else value
            else:
                value = 100 * float((pred[chosen] == gold[chosen]).mean())
            entry = found.setdefault(bucket, {"n": int(chosen.sum()), "values": []})
            entry["values"].append(value)
    return found


# ---------------------------------------------------------------------------------- report


def fmt(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def load_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def collect(out: Path, names: List[str], s: Settings) -> dict:
    """Every finished piece's results, read back from their files."""
    found = {"pretrain": {}, "mlm": {}, "glue": {}, "long": {}, "reach": {}}
    for name in names:
        pretrained = load_json(out / "pretrain" / name / "result.json")
        if pretrained:
            found["pretrain"][name] = pretrained
        for factor in s.lengths:
            n = factor * s.L
            runs = [load_json(out / "mlm" / name / f"N{n}_seed{seed}.json")
                    for seed in s.mlm_seeds]
            if all(runs):
                found["mlm"][(name, n)] = runs
        for kind in ("glue", "long"):
            record = load_json(out / kind / name / "glue.json")
            if record:
                found[kind][name] = record
        record = load_json(out / "reach" / f"{name}.json")
        if record:
            found["reach"][name] = record
    return found


def cpu_time(out: Path) -> Dict[str, float]:
    """CPU seconds per kind of piece, from the pieces' own records."""
    spent = {"pretrain": 0.0, "mlm": 0.0, "glue": 0.0, "long": 0.0, "reach": 0.0}
    for path in (out / "pretrain").glob("*/result.json"):
        spent["pretrain"] += json.loads(path.read_text()).get("cpu_seconds") or 0
    for path in (out / "mlm").glob("*/*.json"):
        spent["mlm"] += json.loads(path.read_text()).get("cpu_seconds") or 0
    for kind in ("glue", "long"):
        for path in (out / kind).glob("*/cost.json"):
            spent[kind] += sum(c["cpu_seconds"] for c in json.loads(path.read_text()))
    for path in (out / "reach").glob("*.json"):
        spent["reach"] += json.loads(path.read_text()).get("cpu_seconds") or 0
    return spent


def plot(out: Path, found: dict, names: List[str], s: Settings):
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    markers = "osD^v<>ph*X"
    lengths = [f * s.L for f in s.lengths]
    ax = axes[0]
    for k, name in enumerate(names):
        xs = [n for n in lengths if (name, n) in found["mlm"]]
        if xs:
            ys = [statistics.mean(r["text_perplexity"] for r in found["mlm"][(name, n)])
                  for n in xs]
            ax.plot(xs, ys, marker=markers[k % len(markers)], label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("tokens per block (L = %d)" % s.L)
    ax.set_ylabel("masked-LM perplexity, held-out text (<s> not scored)")
    ax.set_title("Length extrapolation (lower is better)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)

    ax = axes[1]
    glue_names = [n for n in names if n in found["glue"]]
    width = 0.8 / max(1, len(glue_names))
    for k, name in enumerate(glue_names):
        summary = found["glue"][name]["summary"]
        labelled = False
        for t, task in enumerate(GLUE_TASKS):
            if task not in summary:
                continue
            metric = next(iter(summary[task]["metrics"].values()))
            values = metric["values"]
            x = t + (k - (len(glue_names) - 1) / 2) * width
            ax.bar(x, metric["median"], width, color=f"C{k}",
                   label=None if labelled else name)
            labelled = True
            ax.plot([x] * len(values), values, "k.", ms=3)
    ax.set_xticks(range(len(GLUE_TASKS)),
                  ["CoLA (MCC)", "SST-2 (accuracy)", "STS-B (Pearson)"])
    ax.set_ylabel("dev score × 100: median (bars) and seeds (dots)")
    ax.set_title("GLUE dev, inputs cut to L", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=6)

    ax = axes[2]
    for k, name in enumerate(n for n in names if n in found["reach"]):
        for when, style in (("before", "--"), ("after", "-")):
            rows = found["reach"][name][when]["reach"]
            per_layer = [statistics.mean(row) for row in rows]
            ax.plot(range(len(per_layer)), per_layer, style, color=f"C{k}",
                    marker=markers[k % len(markers)], label=f"{name} ({when})")
    ax.set_xlabel("layer")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("<s>'s attention reach Σ p·j (tokens), mean over heads")
    ax.set_title("<s>'s reach, before (dashed) / after (solid) SST-2 fine-tuning", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "encoder_study.png", dpi=110)
    plt.close(fig)


def write_csv(path: Path, header: List[str], rows: List[list]):
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def header(s: Settings, command: str, data: dict) -> List[str]:
    """The title, command, machine, date, the model and the data."""
    lines = [f"## Encoder study (L = {s.L})", "",
             f"Command: `{command}`  ", f"Machine: {machine()}  ", f"Date: {today()}", "",
             f"Model: alibi_roberta, {s.layers} layers × {s.dim} dims, {s.heads} heads, FFN "
             f"{s.ffn}, sentencepiece vocabulary {s.vocab}; pretraining: {s.updates} updates "
             f"of {s.batch} blocks × {s.L} tokens (`--sample-break-mode none`: the same tokens "
             f"for every configuration), Adam lr {s.lr}, {s.warmup} warm-up updates, "
             "polynomial decay, dropout 0.1, seed 1.", ""]
    if data:
        lines += [f"Data: pretraining text {data['pretrain_lines']:,} lines (WikiText-2 valid "
                  f"+ Python's documentation), held-out text {data['heldout_lines']:,} lines of "
                  "WikiText-2 test; GLUE rows: "
                  + ", ".join(f"{k} {v:,}" for k, v in data["rows"].items()) + ".", ""]
    return lines


def mlm_section(out: Path, found: dict, names: List[str], s: Settings) -> List[str]:
    """Masked-LM perplexity: of the text (the goal's measure) and as fairseq-validate
    counts it; ``mlm.csv``."""
    lengths = [f * s.L for f in s.lengths]
    lines = []
    # masked-LM perplexity: of the text (the goal's measure) and as fairseq-validate counts
    tables, csv_rows = {"text_perplexity": [], "perplexity": []}, []
    for name in names:
        if not any((name, n) in found["mlm"] for n in lengths):
            continue
        for key, rows in tables.items():
            cells, base = [], None
            for n in lengths:
                runs = found["mlm"].get((name, n))
                if not runs:
                    cells.append("n/a (L positions)" if CONFIGS[name].learned_positions
                                 else "–")
                    continue
                mean = statistics.mean(r[key] for r in runs)
                base = mean if n == s.L else base
                change = ("" if n == s.L or base is None
                          else f" ({100 * (mean / base - 1):+.1f} %)")
                cells.append(f"{mean:.2f}{change}")
            rows.append([name] + cells)
        for n in lengths:
            for seed, r in zip(s.mlm_seeds, found["mlm"].get((name, n)) or []):
                csv_rows.append([name, n, seed, f"{r['text_perplexity']:.4f}",
                                 r["text_masked_tokens"], f"{r['perplexity']:.4f}",
                                 r["masked_tokens"], r["tokens"], r["blocks"]])
    if tables["perplexity"]:
        counts = []
        for n in lengths:
            scored = next((found["mlm"][(k, n)][0] for k in names if (k, n) in found["mlm"]),
                          None)
            if scored:
                counts.append(f"N={n}: {scored['tokens']:,} tokens, "
                              f"{scored['text_masked_tokens']:,} masked text tokens "
                              f"(+{scored['masked_tokens'] - scored['text_masked_tokens']:,} "
                              "masked `<s>`)")
        header = ["configuration"] + [f"N={n}" + (" (L)" if n == s.L else "") for n in lengths]
        lines += ["### Masked-LM perplexity on held-out text", "",
                  f"Mean over masking seeds {', '.join(map(str, s.mlm_seeds))} (in brackets: "
                  "change from L) of the masked text tokens. Scored per seed: "
                  + "; ".join(counts) + ".", "",
                  table(header, tables["text_perplexity"]), "",
                  "As `fairseq-validate` counts it, every masked target: `masked_lm` also masks "
                  "the block's first token `<s>` (1 token in N), which every model predicts "
                  "almost surely, so this figure falls with 1/N and makes longer blocks look "
                  "worse than the text is modelled:", "",
                  table(header, tables["perplexity"]), ""]
    write_csv(out / "mlm.csv", ["config", "N", "seed", "text_perplexity", "text_masked_tokens",
                                "perplexity", "masked_tokens", "tokens", "blocks"], csv_rows)
    return lines


def glue_section(out: Path, found: dict, names: List[str], s: Settings) -> List[str]:
    """GLUE dev, inputs cut to L; ``glue.csv``."""
    from fairseq_alibi.cli.glue_finetune import METRIC_NAMES

    lines = []
    rows, csv_rows = [], []
    for name in names:
        record = found["glue"].get(name)
        if not record:
            continue
        cells = []
        for task in GLUE_TASKS:
            entry = record["summary"].get(task)
            if not entry:
                cells.append("–")
                continue
            metric, values = next(iter(entry["metrics"].items()))
            cells.append(f"{values['median']:.1f} [{values['min']:.1f}–{values['max']:.1f}] "
                         f"{entry['collapsed']}/{entry['runs']}")
            for seed, v in zip(entry["seeds"], values["values"]):
                run = next(r for r in record["runs"] if r["task"] == task and r["seed"] == seed)
                csv_rows.append([name, task, seed, METRIC_NAMES[metric], f"{v:.3f}",
                                 run["collapsed"], run["collapse"] or ""])
        rows.append([name] + cells)
    if rows:
        majority = next(iter(found["glue"].values()))["summary"]
        lines += ["### GLUE dev (inputs cut to L for every model)", "",
                  "Median [min–max] over fine-tuning seeds and collapsed runs / runs; CoLA: "
                  "MCC, SST-2: accuracy, STS-B: Pearson, all × 100. Majority-class rate: "
                  + ", ".join(f"{t} {majority[t]['majority_rate']:.1f} %" for t in GLUE_TASKS
                              if t in majority and "majority_rate" in majority[t]) + ". "
                  f"Protocol: `fairseq-alibi glue`, Adam (0.9, 0.98, eps 1e-6, bias-corrected), "
                  f"lr {s.glue_lr}, {s.glue_epochs} epochs, 6 % linear warm-up then linear "
                  "decay, batch 32 (SST-2) / 16, weight decay 0.1, dropout 0.1, the best epoch "
                  "by the dev metric (MCC for CoLA, accuracy for SST-2, MSE for STS-B).", "",
                  table(["configuration", "CoLA MCC", "SST-2 accuracy", "STS-B Pearson"], rows),
                  ""]
    write_csv(out / "glue.csv", ["config", "task", "seed", "metric", "value", "collapsed",
                                 "collapse"], csv_rows)
    return lines


def long_section(out: Path, found: dict, names: List[str], s: Settings, data: dict) -> List[str]:
    """Inputs longer than pretraining, per dev-length bucket; ``long.csv``."""
    from fairseq_alibi.cli.glue_finetune import input_lengths

    lines = []
    rows, csv_rows = [], []
    glue_bin = Path(data.get("glue", out / "data" / "glue-bin"))
    buckets = list(dict.fromkeys(bucket_of(n, s.L) for n in (s.L, 2 * s.L, 4 * s.L, 5 * s.L)))
    counts = {}
    for task in LONG_TASKS:
        if not (glue_bin / f"{task}-bin").is_dir():
            continue
        dev_lengths = input_lengths(glue_bin / f"{task}-bin", "valid")
        counts[task] = {b: sum(bucket_of(int(n), s.L) == b for n in dev_lengths)
                        for b in buckets}
        entries = []
        for name in names:
            if name in found["glue"] and (name == BASELINE or CONFIGS[name].long):
                entries.append((name, "cut to L", found["glue"][name]))
            if name in found["long"]:
                entries.append((name, "whole", found["long"][name]))
        for name, how, record in entries:
            if not any(r["task"] == task for r in record["runs"]):
                continue
            scored = bucket_scores(record, task, dev_lengths, s.L)
            cells = []
            for bucket in buckets:
                entry = scored.get(bucket)
                cells.append(f"{statistics.median(entry['values']):.1f}" if entry else "–")
                for v in entry["values"] if entry else []:
                    csv_rows.append([task, name, how, bucket, entry["n"], f"{v:.3f}"])
            rows.append([task, name, how] + cells)
    if rows:
        lines += ["### Inputs longer than pretraining", "",
                  "Dev sets split by input length (tokens as the model sees them, `<s>` and "
                  "separators included; "
                  + "; ".join(f"{t}: " + ", ".join(f"{c[b]} in {b}" for b in buckets)
                              for t, c in counts.items())
                  + "); median over seeds of accuracy (SST-2) / Pearson (STS-B) × 100 in each "
                  f"bucket. 'cut to L': inputs cut to {s.L} tokens (the longer segment first) "
                  "in training and evaluation; 'whole': fine-tuned and evaluated on the "
                  "untruncated inputs (ALiBi only).", "",
                  table(["task", "configuration", "inputs"] + buckets, rows), ""]
    write_csv(out / "long.csv", ["task", "config", "inputs", "bucket", "n", "value"], csv_rows)
    return lines


def reach_section(out: Path, found: dict, names: List[str]) -> List[str]:
    """``<s>``'s attention reach per layer, before and after fine-tuning; ``reach.csv``."""
    lines = []
    rows, csv_rows = [], []
    for name in names:
        record = found["reach"].get(name)
        if not record:
            continue
        cells = []
        for when in ("before", "after"):
            per_layer = [statistics.mean(row) for row in record[when]["reach"]]
            spread = [f"{min(row):.1f}–{max(row):.1f}" for row in record[when]["reach"]]
            cells.append(" / ".join(f"{m:.1f} ({r})" for m, r in zip(per_layer, spread)))
            for layer, row in enumerate(record[when]["reach"]):
                for head, v in enumerate(row):
                    csv_rows.append([name, when, layer, head, f"{v:.3f}"])
        rows.append([name] + cells)
    if rows:
        n_inputs = next(iter(found["reach"].values()))["before"]
        lines += ["### `<s>`'s attention reach", "",
                  f"Attention-weighted mean distance Σ_j p(0→j)·j of the first token's query, "
                  f"on {n_inputs['inputs']} SST-2 dev inputs (mean "
                  f"{n_inputs['mean_input_length']:.1f}"
                  " tokens, cut to L), per layer: mean over heads (min–max over heads); before "
                  "= the pretrained model, after = SST-2 seed 1 fine-tuned. reach.csv has every "
                  "head.", "",
                  table(["configuration", "before: layer 0 / 1 / ...", "after"], rows), ""]
    write_csv(out / "reach.csv", ["config", "when", "layer", "head", "reach"], csv_rows)
    return lines


def cost_section(out: Path, names: List[str], skipped: Dict[str, str],
                 found: dict) -> List[str]:
    """What did not run and why (a configuration's GLUE or long-input pieces with no result
    too), and the CPU time of every kind of piece."""
    spent = cpu_time(out)
    partial = {n: CONFIGS[n].note for n in names if CONFIGS[n].note}
    for n in names:
        missing = [(what, step) for what, step, planned in (
            ("GLUE", "glue", CONFIGS[n].glue),
            ("inputs longer than pretraining", "long", CONFIGS[n].long))
            if planned and n not in found[step]]
        if missing:
            partial[n] = (f"{' and '.join(w for w, _ in missing)}: no result in this folder "
                          f"(`--configs {n} --steps {','.join(s for _, s in missing)}`)")
    lines = ["### Not run", ""] + [f"- `{n}`: {why}" for n, why in skipped.items()]
    lines += [f"- `{n}`: {why}" for n, why in partial.items()] + [""]
    lines += ["### CPU time", "",
              ", ".join(f"{k} {v / 3600:.2f} h" for k, v in spent.items())
              + f"; total {sum(spent.values()) / 3600:.2f} CPU-hours (the pieces' own records).",
              ""]
    return lines


def report(out: Path, names: List[str], skipped: Dict[str, str], s: Settings, args,
           command: str, log) -> str:
    """``encoder_study.md`` (returned), the CSVs and the plot, from every finished piece."""
    found = collect(out, names, s)
    data = load_json(out / "data" / "ready.json") or {}
    lines = (header(s, command, data) + mlm_section(out, found, names, s)
             + glue_section(out, found, names, s) + long_section(out, found, names, s, data)
             + reach_section(out, found, names) + cost_section(out, names, skipped, found))
    plot(out, found, names, s)
    text = "\n".join(lines)
    (out / "encoder_study.md").write_text(text)
    log(f"report: {out / 'encoder_study.md'}, encoder_study.png, mlm/glue/long/reach.csv")
    return text
