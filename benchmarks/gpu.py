"""Every CUDA figure of docs/benchmarks.md ("GPU") in one command.

    python -m benchmarks.gpu [--only tests,attention,train,end_to_end] [--out DIR]
                             [--data ../shared/data] [--quick]

* ``tests``: ``pytest tests/test_cuda.py`` (every backend × variant × dtype against float64),
  its summary line;
* ``attention``: forward and forward+backward TFLOP/s of each CUDA backend in bf16 at
  L = 1k…16k, D = 64/128, causal and bidirectional variants, against the same kernel with no
  bias and against the fastest no-bias kernel (SDPA's flash kernel: the limit);
* ``train``: fairseq Trainer steps (``--fp16``) of ``alibi_transformer_lm`` (each backend) vs
  stock ``transformer_lm``: tokens/s and peak CUDA memory at L = 512…8192
  (``benchmarks/train.py``'s models and batches, on the GPU);
* ``end_to_end``: ``fairseq-train`` fp32 / ``--fp16`` / bf16 of ``alibi_transformer_lm``,
  ``alibi_roberta`` and ``alibi_transformer`` on WikiText-2 text, ``fairseq-eval-lm`` at 8×L,
  ``fairseq-generate`` beam 5, each compared with the fp32 run.

Writes ``gpu.md`` (the tables, with command, machine and date), ``results.json`` and
``log.txt`` into ``--out``. ``--quick`` runs toy sizes (also on the CPU, ``--device cpu``, where
only the parts that need no CUDA kernel run): a smoke run whose figures mean nothing.
"""

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from benchmarks import common
from benchmarks.train import build_trainer, random_batch, write_dictionary

PARTS = ("tests", "attention", "train", "end_to_end")
LOG = None


def log(msg):
    print(msg, file=sys.stderr, flush=True)
    if LOG:
        with open(LOG, "a") as f:
            f.write(msg + "\n")


# ------------------------------------------------------------------ timing and memory on a GPU


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, device, budget=0.25, warmup=2, min_reps=5, max_reps=200):
    """Median time of ``fn()``: CUDA events around each call (a host clock on the CPU), after
    ``warmup`` calls, repeated to fill about ``budget`` seconds."""
    for _ in range(warmup):
        fn()
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    reps = max(min_reps, min(max_reps, int(budget / max(time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(reps):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cuda_peak_bytes(fn):
    """Peak CUDA memory allocated during ``fn()`` above what was allocated at its start.

    fairseq's ``Trainer.train_step`` resets the peak itself (to log ``gb_free``), which made a
    first version of this read 260 KiB for every model: the reset is held off meanwhile.
    """
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    reset, torch.cuda.reset_peak_memory_stats = torch.cuda.reset_peak_memory_stats, lambda *a: None
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        torch.cuda.reset_peak_memory_stats = reset
    return torch.cuda.max_memory_allocated() - base


def allow_many_flex_graphs():
    """One process here compiles flex for many variants, head sizes and grad modes: more graphs
    than dynamo's default recompile limit (8), past which it would silently run flex eagerly."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 1 << 16


# ------------------------------------------------------------------ tests


def run_tests(out, quick, workers):
    args = [sys.executable, "-m", "pytest", "tests/test_cuda.py", "-q", "-p", "no:cacheprovider",
            "-rs"] + (["-x"] if quick else []) + (["-n", str(workers)] if workers > 1 else [])
    start = time.time()
    path = os.path.join(out, "tests.log")
    with open(path, "w") as f:  # written as pytest goes: a run cut short still leaves its log
        proc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, text=True,
                              cwd=common.REPO)
    with open(path) as f:
        text = f.read()
    summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped)", line)]
    summary = summary[-1].strip("= ") if summary else f"pytest exited {proc.returncode}"
    log(f"[tests] {summary} ({time.time() - start:.0f} s)")
    body = f"`python -m pytest tests/test_cuda.py`: **{summary}** (exit status {proc.returncode})"
    return {"summary": summary, "returncode": proc.returncode}, body


# ------------------------------------------------------------------ attention TFLOP/s


def attention_methods(q, k, v, variant, device):
    """name -> (function of (q, k, v), the name of its no-bias twin)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fairseq_alibi.modules.attention import dispatch, flash, flex
    from fairseq_alibi.modules.bias_cache import CachedAlibiBias

    H, L, D = q.shape[1], q.shape[2], q.shape[3]
    scale = D**-0.5
    causal = variant == "causal"
    alibi = CachedAlibiBias(H, variant).to(device)

    def backend(name):
        run = dispatch.REGISTRY[name].run
        return lambda q, k, v: run(q, k, v, alibi, None, None, 0.0, scale)

    def sdpa_no_bias(kernel=None):
        def call(q, k, v):
            if kernel is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            with sdpa_kernel(kernel):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return call

    found = {
        "no bias (SDPA, fastest kernel)": (sdpa_no_bias(), None),
        "no bias (SDPA, efficient kernel)": (sdpa_no_bias(SDPBackend.EFFICIENT_ATTENTION), None),
        "sdpa (float bias)": (backend("sdpa"), "no bias (SDPA, efficient kernel)"),
    }
    if device == "cuda":
        block_mask = flex._block_mask(variant, H, L, L, q.device)
        found["no bias (flex, same block mask)"] = (
            lambda q, k, v: flex._compiled_flex()(q, k, v, block_mask=block_mask, scale=scale),
            None)
        found["flex (ALiBi score_mod)"] = (backend("flex"), "no bias (flex, same block mask)")
        call = dispatch.Call(device, q.dtype, variant, L, L, q.shape[0], H, grad=True)
        if flash.unsupported(call) is None:
            found["flash (alibi_slopes)"] = (backend("flash"), "no bias (SDPA, fastest kernel)")
    return found


def attention_flops(B, H, L, D, causal):
    """Forward FLOPs of attention (QKᵀ and PV), halved for a causal mask; backward = 2.5×."""
    return 4 * B * H * L * L * D * (0.5 if causal else 1.0)


def run_attention(quick, device, lengths=None, variants=None, dims=None, dtype=torch.bfloat16):
    allow_many_flex_graphs()
    torch.manual_seed(0)
    if quick:
        lengths, dims, tokens, variants = (256, 512), ((64, 2),), 1024, ("causal", "symmetric")
    else:
        tokens = 16384
        lengths = lengths or (1024, 2048, 4096, 8192, 16384)
        dims = [(d, {64: 16, 128: 8}[d]) for d in (dims or (64, 128))]
        variants = variants or ("causal", "symmetric", "offset")
    rows, results = [], []
    for variant in variants:
        for D, H in dims:
            if variant == "offset" and D != 64 and not quick:
                continue  # (the encoder default; its kernel shape is symmetric's)
            for L in lengths:
                B = max(1, tokens // L)
                q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=True)
                           for _ in range(3))
                grad = torch.randn_like(q)
                methods = attention_methods(q, k, v, variant, device)
                fwd_flops = attention_flops(B, H, L, D, variant == "causal")
                measured = {}
                for name, (fn, _) in methods.items():
                    try:
                        with torch.no_grad():
                            t_fwd = median_seconds(lambda: fn(q, k, v), device)

                        def fwd_bwd():
                            torch.autograd.grad(fn(q, k, v), (q, k, v), grad)
                        t_fb = median_seconds(fwd_bwd, device)
                        peak = cuda_peak_bytes(fwd_bwd) if device == "cuda" else None
                    except Exception as error:  # a kernel that cannot run this shape: say so
                        log(f"[attention] {variant} D={D} L={L} {name}: {type(error).__name__}: "
                            f"{str(error).splitlines()[0][:200]}")
                        continue
                    measured[name] = (t_fwd, t_fb, peak)
                limit = measured.get("no bias (SDPA, fastest kernel)")
                for name, (fn, twin) in methods.items():
                    if name not in measured:
                        rows.append([variant, D, L, name, "failed", "", "", "", "", ""])
                        continue
                    t_fwd, t_fb, peak = measured[name]
                    same = measured.get(twin) if twin else None
                    record = {
                        "variant": variant, "D": D, "H": H, "B": B, "L": L, "method": name,
                        "fwd_s": t_fwd, "fwd_bwd_s": t_fb, "peak_bytes": peak,
                        "fwd_tflops": fwd_flops / t_fwd / 1e12,
                        "fwd_bwd_tflops": 3.5 * fwd_flops / t_fb / 1e12,
                        "fwd_vs_same_kernel": same and same[0] / t_fwd,
                        "fwd_bwd_vs_same_kernel": same and same[1] / t_fb,
                        "fwd_vs_limit": limit and limit[0] / t_fwd,
                        "fwd_bwd_vs_limit": limit and limit[1] / t_fb,
                    }
                    results.append(record)

                    def ratio(x):
                        return "–" if x is None else f"{x:.2f}"
                    rows.append([variant, D, L, name, f"{record['fwd_tflops']:.0f}",
                                 ratio(record["fwd_vs_same_kernel"]), ratio(record["fwd_vs_limit"]),
                                 f"{record['fwd_bwd_tflops']:.0f}",
                                 ratio(record["fwd_bwd_vs_same_kernel"]),
                                 ratio(record["fwd_bwd_vs_limit"])])
                    log(f"[attention] {variant} D={D} L={L} {name}: fwd "
                        f"{record['fwd_tflops']:.0f} TFLOP/s, fwd+bwd "
                        f"{record['fwd_bwd_tflops']:.0f} TFLOP/s")
                del q, k, v, grad, methods
                if device == "cuda":
                    torch.cuda.empty_cache()
    heads = ", ".join(f"H = {H} at D = {D}" for D, H in dims)
    shape = (f"{str(dtype).replace('torch.', '')}, B·L = {tokens} tokens, {heads}, "
             f"median of CUDA-event timings")
    body = common.table(
        ["variant", "D", "L", "method", "fwd TFLOP/s", "fwd × same kernel no bias",
         "fwd × limit", "fwd+bwd TFLOP/s", "fwd+bwd × same kernel no bias", "fwd+bwd × limit"],
        rows)
    return results, shape, body


# ------------------------------------------------------------------ training throughput


def run_train(work, quick, device, lengths=None):
    allow_many_flex_graphs()
    if quick:
        dims = ["--decoder-layers", "1", "--decoder-embed-dim", "64",
                "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4"]
        lengths, tokens, vocab, rounds, warmup = (64, 128), 256, 100, 2, 1
    else:
        dims = ["--decoder-layers", "6", "--decoder-embed-dim", "1024",
                "--decoder-ffn-embed-dim", "4096", "--decoder-attention-heads", "16"]
        lengths, tokens, vocab, rounds, warmup = lengths or (512, 1024, 2048, 4096, 8192), 16384, 1000, 10, 3
    precision = ["--fp16"] if device == "cuda" else []
    backends = ["auto", "flex"] if device == "cuda" else ["auto"]  # (auto is sdpa without flash)
    data = write_dictionary(os.path.join(work, "train-dict"), vocab)
    rows, results = [], []
    base = "transformer_lm (stock)"
    for L in lengths:
        batch = max(1, tokens // L)
        models = {base: build_trainer(data, "transformer_lm", L, dims, precision, device)}
        for backend in backends:
            models[f"alibi_transformer_lm ({backend})"] = build_trainer(
                data, "alibi_transformer_lm", L, dims,
                precision + ["--alibi-attention", backend], device)
        samples = {name: random_batch(task, batch, L, seed=0) for name, (_, task) in models.items()}

        def step(name):
            def call():
                models[name][0].train_step([samples[name]])
                sync(device)
            return call

        log(f"[train] L={L}, batch {batch} x {L} tokens: {', '.join(models)}")
        timed = common.Rounds({name: step(name) for name in models}, rounds, warmup=warmup)
        peaks = {name: cuda_peak_bytes(step(name)) if device == "cuda"
                 else common.peak_bytes(step(name)) for name in models}
        for name in models:
            speed = batch * L / timed.median(name)
            record = {"L": L, "model": name, "tokens_per_s": speed,
                      "throughput_vs_stock": 1 / timed.ratio(name, base),
                      "peak_bytes": peaks[name], "peak_vs_stock": peaks[name] / peaks[base]}
            results.append(record)
            rows.append([L, name, f"{speed:,.0f}", f"{record['throughput_vs_stock']:.2f}",
                         common.mib(peaks[name]), f"{record['peak_vs_stock']:.2f}"])
            log(f"[train] L={L} {name}: {speed:,.0f} tokens/s "
                f"({record['throughput_vs_stock']:.2f}x), peak {common.mib(peaks[name])} MiB")
        del models, samples
        if device == "cuda":
            torch.cuda.empty_cache()
    shape = (f"{' '.join(dims).replace('--decoder-', '')}, vocab {vocab}, {tokens} tokens per "
             f"batch, {' '.join(precision) or 'float32'}, Adam, {rounds} interleaved rounds, median")
    body = common.table(["L", "model", "train tokens/s", "× stock", "peak step MiB",
                         "peak × stock"], rows)
    return results, shape, body


# ------------------------------------------------------------------ end to end through the CLIs


def fairseq(module, *args, log_to=None):
    """``python -m MODULE ARGS`` (fairseq_cli.train, ...); its output, raising on failure."""
    cmd = [sys.executable, "-m", module] + [str(a) for a in args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2"))
    out = proc.stdout + proc.stderr
    if log_to:
        with open(log_to, "a") as f:
            f.write(f"$ {' '.join(shlex.quote(c) for c in cmd[1:])}\n{out}\n")
    if proc.returncode != 0:
        raise RuntimeError(f"{module} failed ({proc.returncode}): {out.strip().splitlines()[-1:]}")
    return out


def wikitext_lines(data, split):
    path = os.path.join(data, "wikitext-2", f"wiki.{split}.tokens")
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.startswith(" =")]


def prepare_corpora(data, work, quick, log_to):
    """Binarized WikiText-2 (train: its valid split, valid/test: its test split) for the LM and
    the encoder, and a word-reversal translation task built from the same lines (source: up to
    20 words of a line, target: the same words reversed), joined dictionary."""
    raw = os.path.join(work, "raw")
    os.makedirs(raw, exist_ok=True)
    splits = {"train": wikitext_lines(data, "valid"), "test": wikitext_lines(data, "test")}
    if quick:
        splits = {k: v[:200] for k, v in splits.items()}
    for split, lines in splits.items():
        with open(os.path.join(raw, f"lm.{split}"), "w") as f:
            f.write("\n".join(lines) + "\n")
        pairs = [line.split()[:20] for line in lines if len(line.split()) >= 5]
        with open(os.path.join(raw, f"rev.{split}.src"), "w") as src, \
                open(os.path.join(raw, f"rev.{split}.tgt"), "w") as tgt:
            for words in pairs:
                src.write(" ".join(words) + "\n")
                tgt.write(" ".join(reversed(words)) + "\n")
    lm = os.path.join(work, "lm-bin")
    fairseq("fairseq_cli.preprocess", "--only-source", "--trainpref", f"{raw}/lm.train",
            "--validpref", f"{raw}/lm.test", "--testpref", f"{raw}/lm.test", "--destdir", lm,
            "--workers", "8", log_to=log_to)
    rev = os.path.join(work, "rev-bin")
    fairseq("fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
            "--trainpref", f"{raw}/rev.train", "--validpref", f"{raw}/rev.test",
            "--testpref", f"{raw}/rev.test", "--destdir", rev, "--joined-dictionary",
            "--workers", "8", log_to=log_to)
    return lm, rev


E2E_L = 256
E2E_MODELS = {
    "alibi_transformer_lm": lambda lm, rev: [
        lm, "--task", "language_modeling", "--arch", "alibi_transformer_lm",
        "--decoder-layers", 4, "--decoder-embed-dim", 512, "--decoder-ffn-embed-dim", 2048,
        "--decoder-attention-heads", 8, "--decoder-input-dim", 512, "--decoder-output-dim", 512,
        "--tokens-per-sample", E2E_L, "--sample-break-mode", "none", "--max-tokens", 8192,
        "--lr", 5e-4],
    "alibi_roberta": lambda lm, rev: [
        lm, "--task", "masked_lm", "--criterion", "masked_lm", "--arch", "alibi_roberta_base",
        "--encoder-layers", 4, "--encoder-embed-dim", 512, "--encoder-ffn-embed-dim", 2048,
        "--encoder-attention-heads", 8, "--alibi-variant", "offset",
        "--tokens-per-sample", E2E_L, "--sample-break-mode", "none", "--batch-size", 32,
        "--lr", 5e-4],
    "alibi_transformer": lambda lm, rev: [
        rev, "--task", "translation", "--arch", "alibi_transformer",
        "--encoder-layers", 3, "--decoder-layers", 3, "--encoder-embed-dim", 256,
        "--decoder-embed-dim", 256, "--encoder-ffn-embed-dim", 1024,
        "--decoder-ffn-embed-dim", 1024, "--encoder-attention-heads", 4,
        "--decoder-attention-heads", 4, "--share-all-embeddings", "--max-tokens", 8192,
        "--required-batch-size-multiple", 1, "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", 0.1, "--lr", 1e-3],
}
PRECISIONS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}
#: --quick: toy sizes (later flags override earlier ones)
QUICK_DIMS = {
    "alibi_transformer_lm": ["--decoder-layers", 1, "--decoder-embed-dim", 32,
                             "--decoder-ffn-embed-dim", 64, "--decoder-input-dim", 32,
                             "--decoder-output-dim", 32, "--decoder-attention-heads", 4],
    "alibi_roberta": ["--encoder-layers", 1, "--encoder-embed-dim", 32,
                      "--encoder-ffn-embed-dim", 64, "--encoder-attention-heads", 4],
    "alibi_transformer": ["--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 32,
                          "--decoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
                          "--decoder-ffn-embed-dim", 64],
}


def train_losses(output):
    """``(first, last)`` logged training losses and the last validation loss of a json log."""
    losses = [float(m) for m in re.findall(r'train_inner\W+\{.*?"loss": "([-\d.]+)"', output)]
    valid = re.findall(r'"valid_loss": "([-\d.]+)"', output)
    return losses, float(valid[-1]) if valid else None


def concurrently(jobs):
    """``{key: output or RuntimeError}`` of ``{key: (module, args)}`` fairseq runs, all at once
    (small models: the GPU and 16 cores hold them together; their wall times are not figures)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        module, args, log_to = job
        try:
            return fairseq(module, *args, log_to=log_to)
        except RuntimeError as error:
            return error

    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        return dict(zip(jobs, pool.map(one, jobs.values())))


def run_end_to_end(data, work, quick, log_to, user_dir, device, updates=None, models=None):
    updates = updates or (20 if quick else 300)
    models = models or list(E2E_MODELS)
    cpu = ["--cpu"] if device == "cpu" else []
    lm, rev = prepare_corpora(data, work, quick, log_to)
    results = {"updates": updates}
    rows, gen_rows = [], []
    jobs = {"stock --bf16": (  # stock fairseq-train --bf16 on a GPU (it implies --tpu)
        "fairseq_cli.train", [*E2E_MODELS["alibi_transformer_lm"](lm, rev), "--bf16", *cpu,
                              "--user-dir", user_dir, "--max-update", 1, "--no-save"], log_to)}
    for model in models:
        for precision, extra in PRECISIONS.items():
            module = "benchmarks.bf16_train" if precision == "bf16" else "fairseq_cli.train"
            jobs[(model, precision)] = (module, [
                *E2E_MODELS[model](lm, rev), *QUICK_DIMS[model] * quick, *cpu, *extra,
                "--user-dir", user_dir, "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
                "--clip-norm", 1.0, "--lr-scheduler", "inverse_sqrt",
                "--warmup-updates", updates // 3, "--max-update", updates, "--seed", 1,
                "--log-format", "json", "--log-interval", 10, "--no-epoch-checkpoints",
                "--save-dir", os.path.join(work, f"{model}-{precision}"), "--num-workers", 0,
                "--validate-interval-updates", updates, "--validate-interval", 1000,
                "--save-interval", 1000], log_to)
    start = time.time()
    outputs = concurrently(jobs)
    log(f"[end_to_end] {len(jobs)} fairseq-train runs at once: {time.time() - start:.0f} s")
    stock = outputs.pop("stock --bf16")
    results["stock_bf16"] = "ran" if isinstance(stock, str) else str(stock)
    log(f"[end_to_end] stock fairseq-train --bf16: {results['stock_bf16']}")
    for (model, precision), out in outputs.items():
        if not isinstance(out, str):
            log(f"[end_to_end] {model} {precision}: {out}")
            rows.append([model, precision, "failed", str(out)[:80], "", ""])
            results[f"{model}/{precision}"] = {"error": str(out)}
            continue
        losses, valid = train_losses(out)
        scale = re.findall(r'"loss_scale": "([\d.]+)"', out)
        record = {"first_loss": losses[0] if losses else None,
                  "last_loss": losses[-1] if losses else None, "valid_loss": valid,
                  "overflows": len(re.findall(r"gradient overflow detected", out)),
                  "last_loss_scale": scale[-1] if scale else None,
                  "finite": "nan" not in out.lower()}
        results[f"{model}/{precision}"] = record
        log(f"[end_to_end] {model} {precision}: {record}")
        rows.append([model, precision, f"{record['first_loss']} → {record['last_loss']}",
                     f"{valid}", record["overflows"], record["last_loss_scale"] or "–"])
    # fairseq-eval-lm at 8×L and fairseq-generate beam 5, fp32 and --fp16, of every checkpoint
    jobs = {}
    for precision in PRECISIONS:
        for decode, extra in (("fp32", []), ("fp16", ["--fp16"])):
            path = os.path.join(work, f"alibi_transformer_lm-{precision}", "checkpoint_last.pt")
            if os.path.exists(path):
                jobs[("eval_lm", precision, decode)] = ("fairseq_cli.eval_lm", [
                    lm, "--path", path, "--user-dir", user_dir, "--tokens-per-sample",
                    8 * E2E_L, "--max-tokens", 8 * 8 * E2E_L, "--gen-subset", "valid", *cpu,
                    *extra], log_to)
            path = os.path.join(work, f"alibi_transformer-{precision}", "checkpoint_last.pt")
            if os.path.exists(path):
                jobs[("generate", precision, decode)] = ("fairseq_cli.generate", [
                    rev, "--path", path, "--user-dir", user_dir, "--beam", 5, "--batch-size",
                    128, "--required-batch-size-multiple", 1, "--gen-subset", "test", *cpu,
                    *extra], log_to)
    outputs = concurrently(jobs)
    reference = outputs.get(("generate", "fp32", "fp32"), "")
    reference = dict(re.findall(r"^H-(\d+)\t[^\t]*\t(.*)$", reference if isinstance(
        reference, str) else "", flags=re.M))
    for (tool, precision, decode), out in outputs.items():
        out = out if isinstance(out, str) else f"failed: {out}"
        if tool == "eval_lm":
            ppl = re.findall(r"Perplexity: ([\d.]+)", out)
            tokens = re.findall(r"Evaluated ([\d,]+) tokens", out)
            record = {"ppl": float(ppl[-1]) if ppl else None,
                      "tokens": tokens[-1] if tokens else out[-200:]}
            gen_rows.append(["fairseq-eval-lm at 8×L", precision, decode,
                             f"perplexity {record['ppl']}", f"{record['tokens']} tokens"])
        else:
            bleu = re.findall(r"BLEU4? = ([\d.]+)", out)
            hyps = dict(re.findall(r"^H-(\d+)\t[^\t]*\t(.*)$", out, flags=re.M))
            same = sum(hyps.get(i) == h for i, h in reference.items()) / max(1, len(reference))
            record = {"bleu": float(bleu[-1]) if bleu else None, "sentences": len(hyps),
                      "same_as_fp32_run": same}
            gen_rows.append(["fairseq-generate beam 5", precision, decode,
                             f"BLEU {record['bleu']}",
                             f"{len(hyps)} sentences, {same:.1%} hypotheses identical to "
                             "the fp32-trained model decoded in fp32"])
        results[f"{tool}/{precision}/{decode}"] = record
        log(f"[end_to_end] {tool}: trained {precision}, run {decode}: {record}")
    train_table = common.table(["model", "precision", "train loss, first → last logged",
                                "valid loss", "overflow notes", "last loss scale"], rows)
    eval_table = common.table(["tool", "trained", "run", "score", "detail"], gen_rows)
    return results, f"{updates} updates, seed 1, L = {E2E_L}", train_table, eval_table


# ------------------------------------------------------------------ main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    parser.add_argument("--out", default="outputs/gpu", help="folder for gpu.md, results.json, logs")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(common.REPO), "shared", "data"),
                        help="the shared data folder (wikitext-2/) for end_to_end")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke run of what needs no CUDA kernel (with --quick)")
    parser.add_argument("--quick", action="store_true", help="toy sizes: a smoke run")
    parser.add_argument("--lengths", default=None, help="attention lengths (default 1k…16k)")
    parser.add_argument("--variants", default=None, help="attention variants (default "
                        "causal,symmetric,offset)")
    parser.add_argument("--head-dims", default=None, help="attention head sizes (default 64,128)")
    parser.add_argument("--train-lengths", default=None, help="training lengths (default 512…8192)")
    parser.add_argument("--models", default=None, help=f"end_to_end models (default "
                        f"{','.join(E2E_MODELS)})")
    parser.add_argument("--updates", type=int, default=None, help="end_to_end updates (300)")
    parser.add_argument("--test-workers", type=int, default=1,
                        help="pytest-xdist workers for the tests (compiling flex is CPU-bound)")
    parser.add_argument("--append", action="store_true",
                        help="add to the gpu.md and results.json already in --out")
    args = parser.parse_args(argv)
    ints = lambda text: tuple(int(x) for x in text.split(",")) if text else None  # noqa: E731
    args.lengths, args.head_dims = ints(args.lengths), ints(args.head_dims)
    args.train_lengths = ints(args.train_lengths)
    args.variants = args.variants and tuple(args.variants.split(","))
    args.models = args.models and common.comma_choices(parser, args.models, E2E_MODELS, "model")
    args.only = common.comma_choices(parser, args.only, PARTS, "part")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it on a GPU machine (or --device cpu --quick)")
    if "end_to_end" in args.only and not os.path.isdir(os.path.join(args.data, "wikitext-2")):
        parser.error(f"no wikitext-2/ in {args.data}: pass --data DIR (the shared data folder)")
    return args


def main(argv=None):
    global LOG
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    LOG = os.path.join(args.out, "log.txt")
    command = "python -m benchmarks.gpu " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    log(f"[gpu] {common.machine()}")
    if args.device == "cuda":
        import triton

        log(f"[gpu] {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, triton {triton.__version__}")
    results, sections = {}, []
    md_path = os.path.join(args.out, "gpu.md")
    if args.append and os.path.exists(md_path):
        with open(md_path) as f:
            sections.append(f.read())
        with open(os.path.join(args.out, "results.json")) as f:
            results = json.load(f)

    def emit(title, body, notes=""):
        sections.append(common.section(title, command, body, notes))
        print(sections[-1], flush=True)
        with open(md_path, "w") as f:  # rewritten after each part: a timeout keeps the rest
            f.write("\n".join(sections))
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)

    user_dir = os.path.join(common.REPO, "fairseq_alibi")
    with tempfile.TemporaryDirectory() as work:
        for part in args.only:
            start = time.time()
            try:
                if part == "tests":
                    results["tests"], body = run_tests(args.out, args.quick, args.test_workers)
                    emit("CUDA correctness against float64", body)
                elif part == "attention":
                    results[f"attention {len(results)}"], shape, body = run_attention(
                        args.quick, args.device, args.lengths, args.variants, args.head_dims)
                    emit(f"CUDA attention TFLOP/s against the no-bias kernels ({shape})", body)
                elif part == "train":
                    results["train"], shape, body = run_train(work, args.quick, args.device,
                                                              args.train_lengths)
                    emit(f"CUDA training: alibi_transformer_lm ÷ stock transformer_lm ({shape})",
                         body)
                elif part == "end_to_end":
                    results["end_to_end"], shape, train_table, eval_table = run_end_to_end(
                        args.data, work, args.quick, os.path.join(args.out, "fairseq.log"),
                        user_dir, args.device, args.updates, args.models)
                    emit(f"End to end through fairseq's CLIs ({shape})", train_table)
                    emit("End to end: eval-lm at 8×L and generate, each checkpoint", eval_table)
            except Exception as error:  # one part failing must not lose the others' figures
                log(f"[gpu] {part} failed: {type(error).__name__}: {error}")
                results[f"{part}_error"] = f"{type(error).__name__}: {error}"
            log(f"[gpu] {part}: {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
