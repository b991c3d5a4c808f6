"""The way out for a model BLOOM cannot hold: distil it into ``alibi_bloom``, export, measure.

    python -m experiments.huggingface [--out hf-demo] [--updates 800] [--L 64] [--smoke]

On WikiText-2 from ``../shared/data`` (valid split as training text, test split as evaluation
text; a 2,000-piece unigram sentencepiece model trained on the training text):

1. the teacher, ``alibi_transformer_lm`` as the paper trains it (ReLU, scaled embeddings, no
   embedding layer norm): ``fairseq-alibi export-hf`` refuses it, naming every blocking option;
2. the student, ``alibi_bloom`` of the same size, trained with ``--criterion lm_distillation
   --teacher-path`` for the same number of updates, and the same ``alibi_bloom`` trained with
   plain cross-entropy (what distillation adds);
3. the student exported with ``fairseq-alibi export-hf --bpe sentencepiece``; the exported
   tokenizer's ids compared with the binarized test split, and the perplexity transformers
   computes on fairseq-eval-lm's blocks compared with fairseq-eval-lm's, with token counts, at
   L and 4L.

Writes ``OUT/huggingface.md`` (the table docs/huggingface.md quotes) and ``OUT/logs/``.
"""

import argparse
import math
import re
import sys
import time
from pathlib import Path

from fairseq_alibi.cli import fairseq_runs

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "wikitext-2"
BIN = Path(sys.executable).parent


def run(cmd, log: Path, **kwargs):
    cmd = [str(c) for c in cmd]
    proc = fairseq_runs.run(cmd, **kwargs)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    return proc


def must(proc, log):
    if proc.returncode != 0:
        raise SystemExit(f"{log}: failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout + proc.stderr


def lines_of(path):
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def prepare(out: Path, vocab: int, smoke: bool):
    from fairseq_alibi.preprocess.encoders import SentencePieceEncoder, train_sentencepiece

    train, test = lines_of(SHARED / "wiki.valid.tokens"), lines_of(SHARED / "wiki.test.tokens")
    if smoke:
        train, test = train[:400], test[:60]
    model = train_sentencepiece(train, out / "sp", vocab, num_threads=1)
    encoder = SentencePieceEncoder(model)
    encoder.dictionary.save(str(out / "dict.txt"))
    for split, lines in (("train", train), ("test", test)):
        with open(out / f"{split}.pieces", "w", encoding="utf-8") as f:
            for line in lines:
                f.write(" ".join(encoder.dictionary[i] for i in encoder.encode(line)[:-1]) + "\n")
    must(run([BIN / "fairseq-preprocess", "--only-source", "--srcdict", out / "dict.txt",
              "--trainpref", out / "train.pieces", "--validpref", out / "test.pieces",
              "--testpref", out / "test.pieces", "--destdir", out / "bin", "--workers", 1],
             out / "logs" / "preprocess.log"), out / "logs" / "preprocess.log")
    return Path(model), out / "bin", test


def train(out, name, data, user_dir, L, updates, extra):
    save = out / "checkpoints" / name
    cmd = [BIN / "fairseq-train", data, "--user-dir", user_dir, "--task", "language_modeling",
           "--decoder-layers", 2, "--decoder-embed-dim", 128, "--decoder-attention-heads", 4,
           "--tokens-per-sample", L, "--sample-break-mode", "none", "--max-tokens", 2048,
           "--optimizer", "adam", "--lr", 0.002, "--lr-scheduler", "inverse_sqrt",
           "--warmup-updates", min(100, updates), "--max-update", updates, "--dropout", 0.1,
           "--seed", 1, "--cpu", "--num-workers", 0, "--no-progress-bar", "--log-format",
           "simple", "--log-interval", 100, "--disable-validation", "--no-epoch-checkpoints",
           "--save-dir", save, *extra]
    started = time.time()
    log = out / "logs" / f"train_{name}.log"
    must(run(cmd, log), log)
    return save / "checkpoint_last.pt", time.time() - started


def eval_lm(out, name, data, ckpt, user_dir, length):
    log = out / "logs" / f"eval_{name}_{length}.log"
    text = must(run([BIN / "fairseq-eval-lm", data, "--path", ckpt, "--user-dir", user_dir,
                     "--cpu", "--gen-subset", "test", "--tokens-per-sample", length,
                     "--max-tokens", 8192, "--num-workers", 0, "--sample-break-mode", "none"],
                    log), log)
    tokens = int(re.search(r"Evaluated ([\d,]+) tokens", text).group(1).replace(",", ""))
    loss2 = float(re.search(r"Loss \(base 2\): ([\d.]+)", text).group(1))
    return tokens, loss2, float(re.search(r"Perplexity: ([\d.]+)", text).group(1))


def hf_perplexity(folder, stream, length, eos, fairseq_model):
    """transformers on fairseq-eval-lm's blocks: ``(tokens, base-2 loss, perplexity, largest
    per-token log-probability difference from the fairseq model on the same blocks)``."""
    import torch
    from fairseq_alibi.cli.hf_export_import import import_transformers

    model = import_transformers().AutoModelForCausalLM.from_pretrained(str(folder),
                                                                        dtype=torch.float32)
    model.eval()
    total, count, worst = 0.0, 0, 0.0
    for start in range(0, len(stream), length):
        target = stream[start: start + length]
        source = [eos] + target[:-1] if start == 0 else stream[start - 1: start - 1 + len(target)]
        with torch.no_grad():
            theirs = torch.log_softmax(model(torch.tensor([source])).logits.double(), -1)[0]
            ours = torch.log_softmax(fairseq_model(torch.tensor([source]))[0].double(), -1)[0]
        picked = torch.tensor(target)[:, None]
        worst = max(worst, (theirs.gather(-1, picked) - ours.gather(-1, picked)).abs().max().item())
        total -= theirs.gather(-1, picked).sum().item()
        count += len(target)
    loss2 = total / count / math.log(2)
    return count, loss2, 2 ** loss2, worst


# long: the docstring's steps 1-3 in order (teacher, students, export, comparison), then the table
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="hf-demo")
    parser.add_argument("--updates", type=int, default=800)
    parser.add_argument("--L", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help="toy sizes, every step")
    args = parser.parse_args(argv)
    if not SHARED.is_dir():
        raise SystemExit(f"needs WikiText-2 in {SHARED}")
    import torch
    from fairseq.data import Dictionary, data_utils

    from fairseq_alibi.cli.hf_export_import import export_main, import_transformers
    from fairseq_alibi.paths import user_dir

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    updates = 10 if args.smoke else args.updates
    started = time.time()
    sp_model, data, test_lines = prepare(out, 300 if args.smoke else args.vocab, args.smoke)
    ud = user_dir()
    teacher, t_teacher = train(out, "teacher", data, ud, args.L, updates,
                               ["--arch", "alibi_transformer_lm", "--decoder-ffn-embed-dim", 512,
                                "--decoder-input-dim", 128, "--decoder-output-dim", 128,
                                "--share-decoder-input-output-embed"])
    refused = run([sys.executable, "-m", "fairseq_alibi", "export-hf", teacher, "--dict",
                   data / "dict.txt", "--bpe", "sentencepiece", "--sentencepiece-model",
                   sp_model, "--out", out / "hf_teacher"], out / "logs" / "export_teacher.log")
    # fairseq_runs.run gives stdout and stderr together, in stdout
    refusal = next((line for line in reversed(refused.stdout.splitlines())
                    if line.startswith("error: ")), None)
    if refused.returncode == 0 or refusal is None:
        raise SystemExit(f"{out / 'logs' / 'export_teacher.log'}: export-hf did not refuse the "
                         "teacher (an alibi_transformer_lm, not BLOOM)")
    student, t_student = train(out, "student", data, ud, args.L, updates,
                               ["--arch", "alibi_bloom", "--criterion", "lm_distillation",
                                "--teacher-path", teacher, "--distill-alpha", 0.5,
                                "--distill-temperature", 2])
    plain, t_plain = train(out, "bloom_ce", data, ud, args.L, updates, ["--arch", "alibi_bloom"])
    hf_dir = out / "hf_student"
    if hf_dir.exists():
        import shutil

        shutil.rmtree(hf_dir)
    assert export_main([str(student), "--dict", str(data / "dict.txt"), "--bpe",
                        "sentencepiece", "--sentencepiece-model", str(sp_model),
                        "--out", str(hf_dir)]) == 0

    dictionary = Dictionary.load(str(data / "dict.txt"))
    test = data_utils.load_indexed_dataset(str(data / "test"), dictionary)
    stream = torch.cat([test[i] for i in range(len(test))]).tolist()
    tokenizer = import_transformers().AutoTokenizer.from_pretrained(str(hf_dir))
    same = sum(tokenizer(line)["input_ids"][1:] + [dictionary.eos()] == test[i].tolist()
               for i, line in enumerate(test_lines))

    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    fairseq_student = AlibiTransformerLanguageModel.from_pretrained(
        str(student.parent), student.name, data_name_or_path=str(data)).models[0]
    fairseq_student.eval()
    rows = []
    for length in (args.L, 4 * args.L):
        results = {name: eval_lm(out, name, data, ckpt, ud, length)
                   for name, ckpt in (("teacher", teacher), ("student", student),
                                      ("bloom_ce", plain))}
        results["hf"] = hf_perplexity(hf_dir, stream, length, dictionary.eos(), fairseq_student)
        rows.append((length, results))
    names = {"teacher": "teacher: alibi_transformer_lm (ReLU, scaled embeddings), fairseq",
             "bloom_ce": "alibi_bloom, cross-entropy only, fairseq",
             "student": "student: alibi_bloom distilled from the teacher, fairseq",
             "hf": "the student exported, transformers BloomForCausalLM"}
    table = [f"| model | {' | '.join(f'ppl at {length} (tokens)' for length, _ in rows)} |",
             "|---|" + "---:|" * len(rows)]
    for key, label in names.items():
        table.append(f"| {label} | " + " | ".join(
            f"{r[key][2]:.2f} ({r[key][0]:,})" for _, r in rows) + " |")
    diffs = [abs(r["student"][1] - r["hf"][1]) for _, r in rows]
    report = "\n".join([
        f"`python -m experiments.huggingface {' '.join(argv or sys.argv[1:])}`".replace(" `", "`"),
        "", f"{updates} updates each at L = {args.L}, 2 layers, 128 dims, 4 heads; "
        f"train {t_teacher:.0f} s (teacher), {t_student:.0f} s (student), {t_plain:.0f} s "
        "(cross-entropy only).", "", *table, "",
        f"fairseq-eval-lm base-2 loss vs transformers' on the same blocks: largest difference "
        f"{max(diffs):.2e} (eval-lm prints 4 decimals); largest per-token log-probability "
        f"difference (fairseq model vs transformers, every test token): "
        f"{max(r['hf'][3] for _, r in rows):.2e}.",
        f"Exported tokenizer = binarized test split on {same:,} of {len(test_lines):,} lines.",
        "", f"export-hf on the teacher: `{refusal}`", "",
        f"total {time.time() - started:.0f} s"])
    (out / "huggingface.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
