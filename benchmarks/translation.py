"""Benchmark: alibi_transformer vs stock transformer (sinusoidal) of the same size, translation.

* Training: fairseq's own ``Trainer`` (label-smoothed cross-entropy, Adam, clipping), one
  ``train_step`` per batch of ``tokens_per_batch`` source tokens, at source/target length
  ``L``: lengths drawn in ``[3L/4, L]``, sources padded on the left and targets on the right as
  the translation task batches them. Tokens/s counts target tokens. Peak memory: the peak of
  tensor bytes during one step above what was alive before it (``timing.peak_bytes``).
* Generation: the task's ``SequenceGenerator`` (what ``fairseq-generate`` runs), beam 4,
  sentences of ``gen_length`` source tokens, every hypothesis forced to ``gen_length`` target
  tokens (``min_len`` = ``max_len``) so that both models do exactly the same number of steps.

Both models come from the same command line except the architecture; stock sinusoidal
embeddings have no parameters, so the parameters are the same. Cases alternate within each
round and ratios are medians of paired ratios (``timing.Rounds``).
"""

import argparse
import os
import random

import torch

from benchmarks.tables import table
from benchmarks.timing import Rounds, mib, peak_bytes
from benchmarks.trainer import trainer_from_flags

MODELS = {"transformer (sinusoidal)": ["--arch", "transformer"],
          "alibi_transformer": ["--arch", "alibi_transformer"]}
#: training only: the bias folded into the fused kernel on both sides, no mask tensor at all
#: (``auto`` keeps a dense float mask for padded bidirectional encoders, measured faster)
FOLDED = {"alibi_transformer --alibi-attention fold":
          ["--arch", "alibi_transformer", "--alibi-attention", "fold"]}
BASE = "transformer (sinusoidal)"
#: the cross-attention position options (docs/translation.md) against today's alibi_transformer
CROSS_BASE = "alibi_transformer"
CROSS = {
    "alibi_transformer": ["--arch", "alibi_transformer"],
    "+ pointer, length scale 8, EOS guard 2": [
        "--arch", "alibi_transformer", "--cross-alibi", "pointer",
        "--cross-attention-length-scale", "8", "--cross-alibi-eos-guard", "2"],
    "+ ratio 1.0": ["--arch", "alibi_transformer", "--cross-alibi", "ratio",
                    "--cross-alibi-ratio", "1.0"],
    "+ length scale 8": ["--arch", "alibi_transformer", "--cross-attention-length-scale", "8"],
}


def write_dictionaries(folder, vocab):
    os.makedirs(folder, exist_ok=True)
    for lang in ("src", "tgt"):
        with open(os.path.join(folder, f"dict.{lang}.txt"), "w") as f:
            f.write("".join(f"{lang}{i} {vocab - i}\n" for i in range(vocab)))
    return folder


def build_trainer(data, model_flags, dims):
    return trainer_from_flags([
        data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
        *model_flags, "--cpu", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--optimizer", "adam", "--lr", "1e-4", "--clip-norm", "1.0",
        "--dropout", "0.1", "--seed", "1", "--max-source-positions", "4096",
        "--max-target-positions", "4096", *dims,
    ])


def translation_batch(task, batch, length, seed):
    """A translation sample: lengths in [3L/4, L], sources left-padded, targets right-padded."""
    from fairseq.data import data_utils

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    eos, pad = d.eos(), d.pad()

    def sentence(n):
        return torch.cat([torch.randint(d.nspecial, len(d), (n - 1,), generator=gen),
                          torch.tensor([eos])])

    sources = [sentence(rng.randint(3 * length // 4, length)) for _ in range(batch)]
    targets = [sentence(rng.randint(3 * length // 4, length)) for _ in range(batch)]
    target = data_utils.collate_tokens(targets, pad, eos, left_pad=False)
    return {
        "id": torch.arange(batch),
        "nsentences": batch,
        "ntokens": int(sum(len(t) for t in targets)),
        "net_input": {
            "src_tokens": data_utils.collate_tokens(sources, pad, eos, left_pad=True),
            "src_lengths": torch.tensor([len(s) for s in sources]),
            "prev_output_tokens": data_utils.collate_tokens(targets, pad, eos, left_pad=False,
                                                            move_eos_to_beginning=True),
        },
        "target": target,
    }


def run_training(data, dims, lengths, tokens_per_batch, rounds, warmup, log,
                 cases=None, base=BASE, base_label="stock"):
    """The training table of ``cases`` (name: model flags; default: stock, ALiBi, folded),
    throughput and peak memory as ratios to ``base``; and a note on the state's size."""
    rows, state_bytes = [], None
    cases = cases or {**MODELS, **FOLDED}
    for L in lengths:
        batch = max(1, tokens_per_batch // L)
        models = {name: build_trainer(data, flags, dims) for name, flags in cases.items()}
        samples = {name: translation_batch(task, batch, L, seed=0)
                   for name, (_, task) in models.items()}

        def step(name):
            def call():
                models[name][0].train_step([samples[name]])
            return call

        log(f"[translation] training, L={L}, batch {batch}")
        timed = Rounds({name: step(name) for name in models}, rounds, warmup=warmup)
        peaks = {name: peak_bytes(step(name)) for name in models}
        trainer = models[base][0]
        state_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters()) + sum(
            t.numel() * t.element_size() for s in trainer.optimizer.optimizer.state.values()
            for t in s.values() if torch.is_tensor(t))
        for name in models:
            tokens = samples[name]["ntokens"] / timed.median(name)
            rows.append([L, name, f"{tokens:,.0f}", f"{1 / timed.ratio(name, base):.2f}",
                         mib(peaks[name]), f"{peaks[name] / peaks[base]:.3f}"])
            log(f"[translation] L={L} {name}: {tokens:,.0f} target tokens/s, "
                f"peak {mib(peaks[name])} MiB")
    body = table(["L", "model", "train target tokens/s", f"throughput × {base_label}",
                  "peak step MiB", f"peak × {base_label}"], rows)
    return body, f"Parameters + Adam state of {base}: {mib(state_bytes)} MiB."


def generation(task, model, sentences, beam, length):
    """A call translating ``sentences`` random sources of ``3L/4..L`` tokens with beam ``beam``
    (fairseq's ``SequenceGenerator``), every hypothesis forced to ``length`` target tokens."""
    generator = task.build_generator([model], argparse.Namespace(
        beam=beam, max_len_a=0, max_len_b=length, min_len=length))
    sample = translation_batch(task, sentences, length, seed=1)
    sample["net_input"].pop("prev_output_tokens")

    def call():
        with torch.no_grad():
            hypos = task.inference_step(generator, [model], sample)
        assert len(hypos) == sentences  # every input translated
    return call


def run_generation(data, dims, sentences, gen_length, rounds, warmup, log):
    calls = {}
    for name, flags in MODELS.items():
        trainer, task = build_trainer(data, flags, dims)
        calls[name] = generation(task, trainer.model.eval(), sentences, 4, gen_length)
    log(f"[translation] generation, {sentences} sentences, beam 4, {gen_length} tokens")
    timed = Rounds(calls, rounds, warmup=warmup)
    rows = [[name, f"{sentences / timed.median(name):.2f}", f"{1 / timed.ratio(name, BASE):.2f}"]
            for name in calls]
    return table(["model", "sentences/s (beam 4)", "× stock"], rows)


def run_cross_generation(work, quick=False, rounds=5, log=print, lengths=(16, 64)):
    """``(title, body, notes)``: whole sentences through fairseq's ``SequenceGenerator`` with
    the pointer recipe (the first option of ``benchmarks.cases.CROSS``) ÷ today's
    ``alibi_transformer``, and a second ``alibi_transformer`` (the noise floor), all with the
    same weights: one sentence, beam 1 (one sequence) and beam 4 (four), sources of
    ``3L/4..L`` tokens, ``L`` target tokens. The sentence's setup (the source's keys, the
    options' per-sentence state) is spread over its steps as in ``fairseq-generate``."""
    from benchmarks.cases import CROSS as DECODING_CROSS, PAIRS_PER_ROUND, SAME, share_weights

    dims, _, _, vocab, rounds, warmup, _, _ = sizes(quick, rounds)
    lengths = (8,) if quick else lengths
    data = write_dictionaries(os.path.join(work, "translation-dicts"), vocab)
    recipe = next(iter(DECODING_CROSS))
    cases = {CROSS_BASE: ["--arch", CROSS_BASE], SAME: ["--arch", CROSS_BASE],
             recipe: ["--arch", CROSS_BASE, *DECODING_CROSS[recipe]]}
    models = {}
    for name, flags in cases.items():
        trainer, task = build_trainer(data, flags, dims)
        models[name] = (task, trainer.model.eval())
        if name != CROSS_BASE:  # the option's own parameters stay its own
            share_weights(models[CROSS_BASE][1], models[name][1])
    rows = []
    for length in lengths:
        for beam in (1, 4):
            log(f"[translation] generation with the cross-attention options, beam {beam}, "
                f"{length} tokens")
            timed = Rounds({name: generation(task, model, 1, beam, length)
                            for name, (task, model) in models.items()},
                           rounds * PAIRS_PER_ROUND, warmup=warmup)
            for name in (SAME, recipe):
                rows.append([name, beam, length, f"{timed.median(CROSS_BASE) * 1e3:.1f}",
                             f"{timed.median(name) * 1e3:.1f}",
                             f"{timed.ratio(name, CROSS_BASE):.2f}"])
    shape = (f"{' '.join(dims).replace('--', '')}, vocab {vocab}, float32, "
             f"{rounds} round(s) of {PAIRS_PER_ROUND} sentences per model, alternating order, "
             f"median of paired ratios")
    return (f"Translation generation, whole sentences: cross-attention options ÷ "
            f"alibi_transformer ({shape})",
            table(["model", "sequences (beam, one sentence)", "target tokens L",
                   "alibi_transformer ms/sentence", "with the option ms/sentence",
                   "option ÷ alibi_transformer"], rows),
            "Every hypothesis is forced to L target tokens (min_len = max_len), so both "
            "models run the same steps; random weights, the source lengths drawn in "
            "[3L/4, L] (beyond the recipe's 17 tokens at L = 64, so its inference slopes "
            "apply).")


def sizes(quick, rounds):
    """``(dims, lengths, tokens_per_batch, vocab, rounds, warmup, sentences, gen_length)``."""
    if quick:
        dims = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
                "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
                "--decoder-attention-heads", "2"]
        lengths, tokens_per_batch, vocab, rounds, warmup = (16, 32), 64, 100, 1, 1
        sentences, gen_length = 2, 8
    else:
        dims = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "256",
                "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                "--decoder-attention-heads", "4"]
        lengths, tokens_per_batch, vocab, warmup = (256, 1024), 4096, 1000, 1
        sentences, gen_length = 8, 64
    return dims, lengths, tokens_per_batch, vocab, rounds, warmup, sentences, gen_length


def run(work, quick=False, rounds=5, log=print):
    """``[(title, body, notes)]``: the training and the generation tables."""
    dims, lengths, tokens_per_batch, vocab, rounds, warmup, sentences, gen_length = \
        sizes(quick, rounds)
    data = write_dictionaries(os.path.join(work, "translation-dicts"), vocab)
    shape = (f"{' '.join(dims).replace('--', '')}, vocab {vocab}, float32, "
             f"{rounds} interleaved round(s), median")
    train_body, train_notes = run_training(data, dims, lengths, tokens_per_batch, rounds,
                                           warmup, log)
    gen_body = run_generation(data, dims, sentences, gen_length, rounds, warmup, log)
    return [
        (f"Translation training: alibi_transformer ÷ transformer ({shape}, "
         f"{tokens_per_batch} source tokens/batch)", train_body, train_notes),
        (f"Translation generation, beam 4: alibi_transformer ÷ transformer ({shape}, "
         f"{sentences} sentences of {gen_length} tokens)", gen_body, ""),
    ]


def run_cross(work, quick=False, rounds=5, log=print, lengths=(64, 256)):
    """``(title, body, notes)``: training with the cross-attention position options ÷ today's
    alibi_transformer (translation sentences are short: 64 and 256 tokens by default)."""
    dims, _, tokens_per_batch, vocab, rounds, warmup, _, _ = sizes(quick, rounds)
    lengths = (16, 32) if quick else lengths
    data = write_dictionaries(os.path.join(work, "translation-dicts"), vocab)
    body, notes = run_training(data, dims, lengths, tokens_per_batch, rounds, warmup, log,
                               cases=CROSS, base=CROSS_BASE, base_label="alibi_transformer")
    shape = (f"{' '.join(dims).replace('--', '')}, vocab {vocab}, float32, "
             f"{rounds} interleaved round(s), median, {tokens_per_batch} source tokens/batch")
    return (f"Translation training, cross-attention options ÷ alibi_transformer ({shape})",
            body, notes)
