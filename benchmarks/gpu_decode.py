"""``python -m benchmarks.gpu --only decode``: beam search on the device equals beam search on the CPU.

Two tiny models are trained here for a few updates on data this module writes (``--device``: on
the GPU, or with ``--cpu``): an ``alibi_transformer_lm`` on text from a fixed random word chain,
and an ``alibi_transformer`` with ``--cross-alibi pointer --cross-alibi-eos-guard 2`` on word
reversal (test sources up to twice the longest training source). Each then decodes with beam 5
through fairseq's own command lines — ``fairseq-interactive`` (the LM continues prompts past
its training length, ``--min-len`` above it) and ``fairseq-generate`` (the translation model) —
on the CPU in float32 and on the device in float32 and with ``--fp16``:

* device float32 against CPU float32: every hypothesis identical, scores within
  :data:`FP32_SCORE_TOL` (two float32 implementations of the same function);
* device fp16 against device float32: scores of the hypotheses both found within
  :data:`FP16_SCORE_TOL`; how many hypotheses are identical is reported (a near-tie between two
  beams may fall the other way in fp16).

With ``--device cpu`` the device runs are CPU runs too, so the comparison itself is exercised
by the test suite (``tests/benchmarks/test_gpu_benchmark.py``).
"""

import math
import os
import random
import re
import time
from typing import Dict, NamedTuple, Tuple

from benchmarks import subprocesses, tables

#: |Δ score| allowed between the device's and the CPU's float32 beam search. The score is what
#: fairseq prints on an ``H-`` line: the hypothesis' mean log2-probability per token
FP32_SCORE_TOL = 1e-4
#: |Δ score| allowed between fp16 and float32 (same hypothesis): 8 units of fp16 rounding
#: (2^-10 relative) of a score of magnitude up to 4 bits per token
FP16_SCORE_TOL = 8 * 2**-10 * 4
BEAM = 5

WORDS = [f"w{i}" for i in range(40)]

LM_L = 32  # the LM's training length (tokens per sample)
PROMPT_WORDS = 8
#: the full sizes (the LM's generations run past twice its training length) and --quick's
SIZES = {
    False: dict(updates=60, lm_lines=3000, prompts=48, pairs=3000, tests=96,
                min_len=2 * LM_L, max_len=3 * LM_L),
    True: dict(updates=12, lm_lines=400, prompts=4, pairs=400, tests=8,
               min_len=LM_L + 8, max_len=LM_L + 16),
}
TRAIN_SRC = (3, 12)  # words per training source
TEST_SRC = (3, 24)  # up to twice the longest training source

TINY_LM = ["--task", "language_modeling", "--arch", "alibi_transformer_lm",
           "--decoder-layers", 2, "--decoder-embed-dim", 64, "--decoder-ffn-embed-dim", 128,
           "--decoder-attention-heads", 4, "--decoder-input-dim", 64,
           "--decoder-output-dim", 64, "--tokens-per-sample", LM_L,
           "--sample-break-mode", "none", "--max-tokens", 2048]
TINY_TRANSLATION = ["--task", "translation", "--arch", "alibi_transformer",
                    "--source-lang", "src", "--target-lang", "tgt",
                    "--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 64,
                    "--decoder-embed-dim", 64, "--encoder-ffn-embed-dim", 128,
                    "--decoder-ffn-embed-dim", 128, "--encoder-attention-heads", 4,
                    "--decoder-attention-heads", 4, "--share-all-embeddings",
                    "--cross-alibi", "pointer", "--cross-alibi-eos-guard", 2,
                    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1,
                    "--max-tokens", 2048, "--required-batch-size-multiple", 1]
TRAINING = ["--optimizer", "adam", "--lr", 5e-3, "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", 5, "--clip-norm", 1.0, "--seed", 1, "--num-workers", 0,
            "--disable-validation", "--no-epoch-checkpoints", "--log-format", "json",
            "--log-interval", 10, "--no-progress-bar"]


class Hypothesis(NamedTuple):
    score: float  # fairseq's H- line: mean log2-probability per token
    text: str
    token_scores: Tuple[float, ...]  # its P- line (4 decimals)


def parse_hypotheses(output: str) -> Dict[int, Hypothesis]:
    """The best hypothesis of every sentence in fairseq-generate's or fairseq-interactive's
    output, by sentence id."""
    tokens = {int(i): tuple(float(x) for x in scores.split())
              for i, scores in re.findall(r"^P-(\d+)\t(.*)$", output, flags=re.M)}
    found = {}
    for i, score, text in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", output, flags=re.M):
        found.setdefault(int(i), Hypothesis(float(score), text, tokens.get(int(i), ())))
    return found


def compare(reference: Dict[int, Hypothesis], other: Dict[int, Hypothesis]) -> dict:
    """How ``other``'s hypotheses match ``reference``'s, sentence by sentence."""
    produced = [i for i in reference if i in other]
    same = [i for i in produced if other[i].text == reference[i].text]

    def largest(diffs):
        diffs = list(diffs)
        if not diffs:
            return None
        return math.inf if any(not math.isfinite(d) for d in diffs) else max(diffs)

    return {
        "sentences": len(reference),
        "produced": len(produced),
        "identical": len(same),
        "finite": all(math.isfinite(h.score) for h in other.values()),
        "max_score_diff": largest(abs(other[i].score - reference[i].score) for i in same),
        "max_token_score_diff": largest(
            abs(a - b) for i in same
            for a, b in zip(other[i].token_scores, reference[i].token_scores)),
        "max_best_score_diff": largest(abs(other[i].score - reference[i].score)
                                       for i in produced),
        "differing": [i for i in sorted(reference) if i not in same][:10],
    }


def verdict(found: dict, tolerance: float, all_identical: bool) -> bool:
    """Whether a comparison meets its goal: every sentence decoded, finite, the identical
    hypotheses' scores within ``tolerance`` (and, for ``all_identical``, every one identical)."""
    score = found["max_score_diff"]
    return (found["sentences"] > 0 and found["produced"] == found["sentences"]
            and found["finite"] and score is not None and score <= tolerance
            and (found["identical"] == found["sentences"] or not all_identical))


# ------------------------------------------------------------------ data, training, decoding


def write_corpora(raw: str, quick: bool, seed: int = 0):
    """Text for the LM (a fixed random chain: each word is followed by one of three, with
    probabilities of its own, so that no two continuations tie by construction), prompts of its
    first words, and word-reversal pairs for the translation model."""
    size = SIZES[quick]
    rng = random.Random(seed)
    after = {w: (rng.sample(WORDS, 3), [0.1 + rng.random() for _ in range(3)]) for w in WORDS}

    def chain(n):
        words = [rng.choice(WORDS)]
        while len(words) < n:
            successors, weights = after[words[-1]]
            words.append(rng.choices(successors, weights)[0])
        return " ".join(words)

    os.makedirs(raw, exist_ok=True)
    texts = {"train": [chain(rng.randint(8, 40)) for _ in range(size["lm_lines"])],
             "valid": [chain(rng.randint(8, 40)) for _ in range(20)]}
    for split, lines in texts.items():
        with open(os.path.join(raw, f"lm.{split}"), "w") as f:
            f.write("\n".join(lines) + "\n")
    with open(os.path.join(raw, "prompts.txt"), "w") as f:
        f.write("\n".join(chain(PROMPT_WORDS) for _ in range(size["prompts"])) + "\n")
    for split, n, (low, high) in (("train", size["pairs"], TRAIN_SRC), ("valid", 20, TRAIN_SRC),
                                  ("test", size["tests"], TEST_SRC)):
        sources = [[rng.choice(WORDS) for _ in range(rng.randint(low, high))] for _ in range(n)]
        for side, lines in (("src", sources), ("tgt", [s[::-1] for s in sources])):
            with open(os.path.join(raw, f"rev.{split}.{side}"), "w") as f:
                f.write("\n".join(" ".join(words) for words in lines) + "\n")
    return os.path.join(raw, "prompts.txt")


def commands(work: str, device: str, size: dict, user_dir: str, log_to: str, prompts: str):
    """``{step: {key: (module, args, log)}}``: preprocess, train and decode, each step's runs
    side by side; and the decoding runs' names (``{name: extra flags}``)."""
    updates = size["updates"]
    cpu = ["--cpu"] if device == "cpu" else []
    raw, lm_bin, rev_bin = (os.path.join(work, d) for d in ("raw", "lm-bin", "rev-bin"))
    steps = {
        "preprocess": {
            "lm": ("fairseq_cli.preprocess", [
                "--only-source", "--trainpref", f"{raw}/lm.train", "--validpref",
                f"{raw}/lm.valid", "--destdir", lm_bin, "--workers", 1], log_to),
            "translation": ("fairseq_cli.preprocess", [
                "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/rev.train",
                "--validpref", f"{raw}/rev.valid", "--testpref", f"{raw}/rev.test",
                "--destdir", rev_bin, "--joined-dictionary", "--workers", 1], log_to)},
        "train": {
            "lm": ("fairseq_cli.train", [
                lm_bin, *TINY_LM, *TRAINING, *cpu, "--max-update", updates, "--user-dir",
                user_dir, "--save-dir", os.path.join(work, "lm")], log_to),
            "translation": ("fairseq_cli.train", [
                rev_bin, *TINY_TRANSLATION, *TRAINING, *cpu, "--max-update", updates,
                "--user-dir", user_dir, "--save-dir", os.path.join(work, "translation")], log_to)},
    }
    runs = {"CPU fp32": ["--cpu"], f"{device} fp32": cpu, f"{device} fp16": cpu + ["--fp16"]}
    steps["decode"] = {}
    for name, extra in runs.items():
        # (fairseq-interactive's own main, with numpy 2's missing np.compat.long put back)
        steps["decode"][("lm", name)] = ("benchmarks.fairseq_on_numpy2", [
            "fairseq_cli.interactive", lm_bin, "--task", "language_modeling",
            "--user-dir", user_dir, "--path", os.path.join(work, "lm", "checkpoint_last.pt"),
            "--beam", BEAM, "--nbest", 1, "--min-len", size["min_len"],
            "--max-len-b", size["max_len"], "--input", prompts, "--batch-size", 16,
            "--buffer-size", 16, *extra], log_to)
        steps["decode"][("translation", name)] = ("fairseq_cli.generate", [
            rev_bin, "--user-dir", user_dir, "--gen-subset", "test",
            "--path", os.path.join(work, "translation", "checkpoint_last.pt"), "--beam", BEAM,
            "--batch-size", 32, "--required-batch-size-multiple", 1, "--max-len-a", 1.2,
            "--max-len-b", 10, *extra], log_to)
    return steps, runs


def run_steps(part, steps: dict, threads: int):
    """Every step's runs side by side, step after step within the part's time; ``(outputs,
    the runs that failed)``. A failed preprocess or training stops the part."""
    outputs, failed = {}, []
    for step, jobs in steps.items():
        if part.left() < 5:
            raise RuntimeError(f"no time left for {step} ({part.left():.0f} s)")
        start = time.time()
        found = subprocesses.concurrently(jobs, timeout=part.left() - 3, threads=threads)
        part.log(f"[decode] {step}: {len(jobs)} runs side by side, {time.time() - start:.0f} s")
        for key, out in found.items():
            if not isinstance(out, str):
                part.note(f"{step} {key}: {out}")
                failed.append(f"{step} {key}")
        if failed and step != "decode":
            raise RuntimeError(f"{', '.join(failed)} failed (fairseq.log has the output)")
        outputs.update(found)
    return outputs, failed


def compare_runs(part, outputs: dict, runs: dict, device: str, results: dict):
    """The device's fp32 hypotheses against the CPU's, its fp16 against its fp32: the table's
    rows (and ``results`` filled)."""
    rows = []
    for model in ("lm", "translation"):
        hyps = {name: parse_hypotheses(outputs[(model, name)])
                for name in runs if isinstance(outputs.get((model, name)), str)}
        for (name, base, tolerance, all_identical) in (
                (f"{device} fp32", "CPU fp32", FP32_SCORE_TOL, True),
                (f"{device} fp16", f"{device} fp32", FP16_SCORE_TOL, False)):
            key = f"{model}: {name} vs {base}"
            if name not in hyps or base not in hyps:
                results[key] = {"error": "a run failed (see the notes)"}
                rows.append([model, f"{name} ÷ {base}", "failed", "", "", "", "", "no"])
                continue
            found = compare(hyps[base], hyps[name])
            found["tolerance"] = tolerance
            found["ok"] = verdict(found, tolerance, all_identical)
            results[key] = found

            def num(x):
                return "–" if x is None else f"{x:.2g}"
            rows.append([model, f"{name} vs {base}", found["sentences"],
                         f"{found['identical']}/{found['sentences']}",
                         num(found["max_score_diff"]), num(found["max_token_score_diff"]),
                         num(found["max_best_score_diff"]), num(tolerance),
                         "yes" if found["ok"] else "**no**"])
            part.log(f"[decode] {key}: {found['identical']}/{found['sentences']} hypotheses "
                     f"identical, max |Δ score| {num(found['max_score_diff'])} "
                     f"(tolerance {num(tolerance)}): {'ok' if found['ok'] else 'NOT OK'}"
                     + (f"; differing ids {found['differing']}" if found["differing"] else ""))
        part.record("decode", results)
    return rows


def run(part, work: str, device: str, quick: bool, user_dir: str, log_to: str):
    """Train, decode, compare; figures go to ``part`` (see ``benchmarks.gpu_report.Part``)."""
    size = SIZES[quick]
    updates = size["updates"]
    threads = 1 if device == "cpu" else 2  # (a CPU smoke run: the runs share few cores)
    prompts = write_corpora(os.path.join(work, "raw"), quick)
    steps, runs = commands(work, device, size, user_dir, log_to, prompts)
    outputs, failed = run_steps(part, steps, threads)
    results = {"updates": updates, "beam": BEAM}
    rows = compare_runs(part, outputs, runs, device, results)
    body = tables.table(["model", "run vs reference", "sentences", "identical hypotheses",
                         "max Δ score, identical ones", "max Δ token score, identical ones",
                         "max Δ best score, all", "tolerance", "within"], rows)
    notes = (f"lm: `alibi_transformer_lm` 2 × 64, trained at L = {LM_L}, `fairseq-interactive` "
             "(through `benchmarks/fairseq_on_numpy2.py` where numpy lacks `np.compat`) "
             f"on {PROMPT_WORDS}-word prompts, `--min-len {size['min_len']} --max-len-b "
             f"{size['max_len']}`; "
             "translation: `alibi_transformer` 2+2 × 64, `--cross-alibi pointer "
             "--cross-alibi-eos-guard 2`, word reversal, `fairseq-generate` on sources up to "
             f"{TEST_SRC[1]} words (training: up to {TRAIN_SRC[1]}). Both trained {updates} "
             f"updates on {device} in float32; beam {BEAM}. Scores: fairseq's `H-` score (mean "
             "log2-probability per token) and `P-` token scores (4 decimals), compared where "
             "the hypotheses are identical (Δ: absolute difference); a hypothesis that differs "
             "with a best score within the tolerance is a near-tie between two beams. Within: "
             "every sentence decoded, finite, within the tolerance, and for float32 every "
             "hypothesis identical.")
    part.section(f"Beam search on {device} against the CPU (fairseq-interactive, "
                 "fairseq-generate)", body, notes)
    if failed:
        raise RuntimeError(f"{', '.join(failed)} failed (fairseq.log has the output)")
