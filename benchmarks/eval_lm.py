"""Benchmark 3: ``fairseq-eval-lm`` tokens/s with a sliding window at 4x the training length.

Both models (the sizes of the training benchmark) are trained for a few steps on random
tokens by fairseq's Trainer in this process and saved as ordinary checkpoints; then the real
``fairseq-eval-lm`` scores the same binarized test set with ``--tokens-per-sample 4L
--context-window 3L``: every forward sees a window of up to ``4L`` tokens and scores the last
``L`` (fairseq-eval-lm subtracts the context from the tokens per sample). The stock sinusoidal model is evaluated the same way, told its new maximum length with
``--model-overrides`` (it passes its causal mask to attention as a float mask, as stock fairseq
does). The runs of the two models alternate; figures are fairseq's own "tokens/s" line (model
loading excluded), and both must report the same, non-zero, number of evaluated tokens.
"""

import os
import random
import re
import statistics

from benchmarks.subprocesses import fairseq_cli
from benchmarks.tables import table
from benchmarks.trainer import build_trainer, random_batch
from fairseq_alibi.paths import user_dir

EVALUATED = re.compile(r"Evaluated ([\d,]+) tokens in ([\d.]+)s \(([\d.]+) tokens/s\)")


def write_corpus(folder, vocab, tokens, seed=0):
    """Random-word train/valid/test text (the numbers do not depend on what the words are)."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    sizes = {"train": max(200, tokens // 10), "valid": 200, "test": tokens}
    for split, n in sizes.items():
        with open(os.path.join(folder, f"{split}.txt"), "w") as f:
            left = n
            while left > 0:
                line = min(left, rng.randint(20, 60))
                f.write(" ".join(f"w{rng.randrange(vocab)}" for _ in range(line)) + "\n")
                left -= line
    return folder


def binarize(raw, dest, threads):
    fairseq_cli(
        "fairseq-preprocess", "--only-source", "--trainpref", os.path.join(raw, "train.txt"),
        "--validpref", os.path.join(raw, "valid.txt"), "--testpref", os.path.join(raw, "test.txt"),
        "--destdir", dest, "--workers", "1", threads=threads,
    )
    return dest


def train_checkpoint(data, arch, length, dims, path, steps):
    trainer, task = build_trainer(data, arch, length, dims)
    sample = random_batch(task, 4, length, seed=0)
    for _ in range(steps):
        trainer.train_step([sample])
    trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does
    trainer.save_checkpoint(path, {})
    return path


def evaluate(data, checkpoint, length, window, threads, overrides=None):
    args = [
        data, "--path", checkpoint, "--user-dir", user_dir(), "--gen-subset", "test", "--cpu",
        # fairseq-eval-lm scores tokens_per_sample - context_window tokens per window
        "--tokens-per-sample", window, "--context-window", window - length,
        "--batch-size", 4, "--num-workers", 0,
    ]
    if overrides:
        args += ["--model-overrides", overrides]
    out = fairseq_cli("fairseq-eval-lm", *args, threads=threads)
    found = EVALUATED.findall(out)
    if not found:
        raise RuntimeError(f"no 'Evaluated ... tokens/s' line in fairseq-eval-lm's output:\n{out[-3000:]}")
    tokens, _, per_second = found[-1]
    tokens = int(tokens.replace(",", ""))
    if tokens == 0:
        raise RuntimeError(f"fairseq-eval-lm evaluated 0 tokens ({checkpoint}): check the lengths")
    return tokens, float(per_second)


def run(work, quick=False, rounds=3, threads=None, log=print):
    threads = threads or 1
    if quick:
        dims = ["--decoder-layers", "1", "--decoder-embed-dim", "32",
                "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2"]
        length, vocab, test_tokens, steps, rounds = 16, 100, 600, 1, 1
    else:
        dims = ["--decoder-layers", "2", "--decoder-embed-dim", "256",
                "--decoder-ffn-embed-dim", "1024", "--decoder-attention-heads", "4"]
        length, vocab, test_tokens, steps = 512, 1000, 16384, 3
    window = 4 * length
    root = os.path.join(work, "eval-lm")
    log(f"[eval] binarizing {test_tokens} test tokens")
    data = binarize(write_corpus(os.path.join(root, "raw"), vocab, test_tokens),
                    os.path.join(root, "bin"), threads)
    models = {
        "transformer_lm (sinusoidal)": (
            train_checkpoint(data, "transformer_lm", length, dims,
                             os.path.join(root, "stock.pt"), steps),
            f"{{'max_target_positions': {window}, 'tokens_per_sample': {window}}}",
        ),
        "alibi_transformer_lm": (
            train_checkpoint(data, "alibi_transformer_lm", length, dims,
                             os.path.join(root, "alibi.pt"), steps),
            None,
        ),
    }
    results = {name: [] for name in models}
    for r in range(rounds):
        for name, (checkpoint, overrides) in models.items():
            tokens, per_second = evaluate(data, checkpoint, length, window, threads, overrides)
            results[name].append((tokens, per_second))
            log(f"[eval] round {r + 1}: {name}: {tokens} tokens, {per_second:,.0f} tokens/s")
    base = "transformer_lm (sinusoidal)"
    counts = {tokens for runs in results.values() for tokens, _ in runs}
    if len(counts) != 1:
        raise RuntimeError(f"the two models evaluated different token counts: {sorted(counts)}")
    (scored,) = counts
    rows = []
    for name, runs in results.items():
        speed = statistics.median(s for _, s in runs)
        paired = statistics.median(s / b for (_, s), (_, b) in zip(runs, results[base]))
        rows.append([name, f"{scored:,}", f"{speed:,.0f}", f"{paired:.2f}"])
    shape = (f"trained at L={length}, window {window}, stride {length}, "
             f"{' '.join(dims).replace('--decoder-', '')}, {threads} thread(s), "
             f"{rounds} alternating round(s), median")
    body = table(["model", "tokens scored", "eval tokens/s", "× stock"], rows)
    notes = (f"Both with `fairseq-eval-lm --tokens-per-sample {window} --context-window "
             f"{window - length} --batch-size 4 --cpu`; the stock model with "
             f"`--model-overrides \"{models[base][1]}\"`.")
    return shape, body, notes
