"""Where the ``--cross-alibi pointer`` is, on inputs longer than any seen in training: the
evidence behind the translation-length results (docs/translation.md).

    python -m experiments.pointer_trace --out OUT [--config pointer] [--seed 1]

``OUT`` is an ``experiments.translation_length`` output folder (its ``data`` folder, or
``--data DIR``); the checkpoint is that configuration's and seed's. Every test pair is run
teacher-forced (the reference as the decoder's input), one sentence at a time, and each
decoder layer's pointer ``p_t`` (:func:`fairseq_alibi.cross_alibi.pointer_positions`, from the
layer's own cross-attention input) is read by a hook, with the attention of the biased heads.
Per source-length bucket it prints:

* ``end``: where the pointer is when the reference ends (the position that predicts EOS), as a
  fraction of the source's last real token (1.0: it reached the end; counted from the first
  real token, as the pointer is);
* ``step``: the pointer's mean step ``p_T / T`` against the pair's ``S / T`` (source tokens per
  target token): a pointer that learnt the pace of short pairs keeps it on long ones;
* ``on pointer``: the share of target steps whose biased heads put their largest weight within
  one token of the pointer.

and writes ``OUT/pointer_trace.{md,png}`` (the png: one long test pair, each layer's pointer
against the diagonal ``S/T·t``, over the biased heads' attention of the last layer).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.seq2seq_runs import length_buckets, pyplot
from experiments.translation_runs import (
    CONFIGS,
    data_bin,
    load_data,
    run_dir,
    test_sources,
)
from fairseq_alibi.cross_alibi import pointer_positions
from fairseq_alibi.modules.cross_position import CrossPositionAttention


def load(checkpoint, data, split="test"):
    """The model and the split ``split`` of ``data`` (a binarized folder)."""
    from fairseq_alibi.models.alibi_transformer import AlibiTransformerModel

    hub = AlibiTransformerModel.from_pretrained(str(Path(checkpoint).parent),
                                                Path(checkpoint).name,
                                                data_name_or_path=str(data))
    hub.task.load_dataset(split)
    model = hub.models[0]
    model.eval()
    return model, hub.task.dataset(split)


def trace(model, sample):
    """Teacher-force one collated ``sample``; per pointer layer ``(p (T,), heads' attention
    (K, T, S), first real source index)``."""
    layers = [m for m in model.decoder.modules()
              if isinstance(m, CrossPositionAttention) and m.mode == "pointer"]
    if not layers:
        raise SystemExit("this checkpoint has no --cross-alibi pointer layer")
    found, inside = [], [False]

    def hook(module, args, kwargs, output):
        if inside[0]:
            return
        query = kwargs["query"] if "query" in kwargs else args[0]
        steps = F.softplus(F.linear(query, module.pointer_step.weight,
                                    module.pointer_step.bias).float()).squeeze(-1).t()
        inside[0] = True  # the same call again, for every head's weights
        _, weights = module(**{**kwargs, "need_weights": True, "need_head_weights": True})
        inside[0] = False
        found.append((pointer_positions(steps)[0], weights[: module.biased_heads, 0]))

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in layers]
    try:
        with torch.no_grad():
            model(**sample["net_input"])
    finally:
        for h in handles:
            h.remove()
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="a translation_length output folder")
    parser.add_argument("--data", default=None, help="its data folder (default: OUT/data)")
    parser.add_argument("--config", default="pointer", choices=[n for n, c in CONFIGS.items()
                                                                 if not c.checkpoint_of])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checkpoint", default=None,
                        help="trace this checkpoint instead (e.g. a run of --select: "
                             "OUT/runs/<corpus>/<size>/<setting>/seed<k>/checkpoints/...; "
                             "--data names its data folder, OUT the folder written to)")
    parser.add_argument("--split", choices=("test", "valid"), default="test",
                        help="the pairs traced: the test buckets or the validation buckets")
    args = parser.parse_args(argv)
    out = Path(args.out)
    data = Path(args.data) if args.data else out / "data"
    meta = load_data(data)
    if args.checkpoint:
        checkpoint, what = args.checkpoint, f"`{args.checkpoint}`"
        binaries = data_bin(data, CONFIGS["pointer"])  # the data as it is (no marker)
    else:
        record = run_dir(out, args.config, args.seed) / "train.json"
        if not record.is_file():
            raise SystemExit(f"no trained {args.config} seed {args.seed} in {out} ({record})")
        checkpoint = json.loads(record.read_text())["checkpoint"]
        what = f"`{args.config}` seed {args.seed} ({checkpoint})"
        binaries = data_bin(data, CONFIGS[args.config])
    model, dataset = load(checkpoint, binaries, args.split)
    sources = test_sources(data, meta, args.split)
    pad = dataset.src_dict.pad()

    rows, example = [], None
    for low, high in length_buckets(meta["N"]):
        ids = [i for i, s in enumerate(sources) if low <= len(s.split()) <= high]
        ends, paces, on = {}, {}, {}
        for i in ids:
            sample = dataset.collater([dataset[i]])
            src = sample["net_input"]["src_tokens"][0]
            S = int((src != pad).sum())  # real source tokens, EOS (and marker) included
            T = sample["net_input"]["prev_output_tokens"].size(1)
            for layer, (p, attn) in enumerate(trace(model, sample)):
                first = int(src.size(0) - S)  # left padding
                ends.setdefault(layer, []).append(float(p[-1]) / (S - 1))
                paces.setdefault(layer, []).append((float(p[-1]) / max(T - 1, 1),
                                                    (S - 1) / max(T - 1, 1)))
                best = attn.argmax(dim=-1).float() - first  # (K, T)
                on.setdefault(layer, []).append(float(((best - p).abs() <= 1).float().mean()))
            if high == length_buckets(meta["N"])[-1][1] and (example is None or S > example[0]):
                example = (S, T, trace(model, sample), int(src.size(0) - S))
        for layer in sorted(ends):
            rows.append({"bucket": f"{low}-{high}", "layer": layer, "sentences": len(ids),
                         "end": statistics.mean(ends[layer]),
                         "step": statistics.mean(a for a, _ in paces[layer]),
                         "pair_ratio": statistics.mean(b for _, b in paces[layer]),
                         "on_pointer": statistics.mean(on[layer])})

    lines = [f"Pointer of {what}, teacher-forced on every {args.split} pair:", "",
             "| source tokens | layer | pairs | pointer at the end ÷ last source token | "
             "pointer step | source ÷ target tokens | biased heads' argmax within 1 of it |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['bucket']} | {r['layer']} | {r['sentences']} | {r['end']:.2f} | "
              f"{r['step']:.2f} | {r['pair_ratio']:.2f} | {r['on_pointer']:.0%} |" for r in rows]
    report = "\n".join(lines) + "\n"
    print(report)
    (out / "pointer_trace.md").write_text(report)
    (out / "pointer_trace.json").write_text(json.dumps(rows, indent=2))
    if example:
        plot(out / "pointer_trace.png", *example)
    return 0


def plot(path, S, T, layers, first):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    attn = layers[-1][1].mean(0)[:, first:].t()  # (S, T): source position up, target along
    ax.imshow(attn.numpy(), origin="lower", aspect="auto", cmap="Greys")
    for layer, (p, _) in enumerate(layers):
        ax.plot(p.numpy(), label=f"pointer, layer {layer}")
    ax.plot([0, T - 1], [0, S - 1], "k--", label="diagonal (S/T per step)")
    ax.set_xlabel("target position t")
    ax.set_ylabel("source position j")
    ax.set_title(f"longest pair ({S} source tokens), last layer's biased heads")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
