"""The parts of a GPU run (``python -m benchmarks.gpu``) other than ``decode``
(``benchmarks/gpu_decode.py``): ``tests``, ``attention``, ``flex``, ``memory`` and ``train``
(:func:`run_train`), ``end_to_end``. Each measures, then hands its figures and its Markdown
section to its :class:`benchmarks.gpu_report.Part`."""

import collections
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks import subprocesses, tables, timing
from benchmarks.gpu_report import log
from benchmarks.gpu_supervisor import CHILD_GROUPS, wait_until
from benchmarks.trainer import build_trainer, random_batch, write_dictionary


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


def timed_rounds(timed, device, rounds, label):
    """``{name: [seconds per round]}`` of the calls ``timed`` (name -> ``fn()``): each compiled
    (or warmed up) before any timing, then ``rounds`` interleaved rounds of
    :func:`median_seconds`."""
    start = time.time()
    for fn in timed.values():
        fn()
    sync(device)
    log(f"{label}: compiled/warmed up in {time.time() - start:.0f} s")
    times = {name: [] for name in timed}
    for _ in range(rounds):
        for name, fn in timed.items():
            times[name].append(median_seconds(fn, device, budget=0.2, warmup=1))
    return times


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


def layer_bias(heads, variant, device):
    """What an attention backend's ``run`` takes as its bias for ``heads`` heads of ``variant``:
    a layer's view of a model's bias module (``modules/bias.py``)."""
    from fairseq_alibi.modules.bias import AlibiBias

    return AlibiBias(heads, variant=variant).to(device).layer(0)


def allow_many_flex_graphs():
    """One process here compiles flex for many variants, head sizes and grad modes: more graphs
    than dynamo's default recompile limit (8), past which it would silently run flex eagerly."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 1 << 16



# ------------------------------------------------------------------ tests


def read_records(path):
    """The lines ``benchmarks/pytest_record.py`` wrote (a last line cut short is dropped)."""
    found = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except FileNotFoundError:
        pass
    return found


def summarize_tests(records, output):
    """Counts per outcome (a test's worst report: failed > error > skipped > passed), the
    first failure's message, the skip reasons and the slowest tests, from the recorded
    reports and pytest's output so far."""
    rank = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}
    outcome = {}
    for r in records:
        kind = r["outcome"]
        if kind == "failed" and r["when"] in ("setup", "teardown", "collect"):
            kind = "error"  # (a crashed xdist worker's report has when "???": a failure)
        if rank[kind] >= rank[outcome.get(r["test"], "passed")]:
            outcome[r["test"]] = kind
    counts = collections.Counter(outcome.values())
    failures = [r for r in records if r["outcome"] == "failed"]
    collected = re.findall(r"(?:collected |\[)(\d+) items?", output)
    closing = [line.strip("= ") for line in output.splitlines()
               if re.match(r"^=+ .*\d+ (passed|failed|skipped|errors?|deselected)", line)]
    skips = collections.Counter(r["message"] for r in records if r["outcome"] == "skipped")
    return {
        "passed": counts["passed"], "failed": counts["failed"], "errors": counts["error"],
        "skipped": counts["skipped"], "reported": len(outcome),
        "collected": int(collected[-1]) if collected else None,
        "pytest_summary": closing[-1] if closing else None,
        "first_failure": failures and f"{failures[0]['test']}: "
                                      + " / ".join(str(failures[0]["message"]).splitlines()),
        "failed_tests": list(dict.fromkeys(r["test"] for r in failures))[:40],
        "skip_reasons": dict(skips.most_common(5)),
        "slowest": [[r["test"], r["seconds"]] for r in
                    sorted(records, key=lambda r: -r["seconds"])[:5]],
    }


def counts_line(found):
    line = (f"{found['passed']} passed, {found['failed']} failed, {found['errors']} errors, "
            f"{found['skipped']} skipped")
    total = found["collected"]
    return line + (f" ({found['reported']} of {total} tests reported)" if total else "")


def run_tests(part, out, quick, workers, paths=("tests/cuda",)):
    """``pytest PATHS`` (``tests/cuda``) until the part's deadline, its outcomes recorded as
    they come (a progress line every 20 s)."""
    record, path = os.path.join(out, "tests.jsonl"), os.path.join(out, "tests.log")
    if os.path.exists(record):
        os.remove(record)
    if workers > 1 and importlib.util.find_spec("xdist") is None:
        part.note(f"pytest-xdist is not installed: the tests run in one process, not {workers}")
        workers = 1
    args = [*paths, "-v", "--tb=short", "-p", "no:cacheprovider",
            "-p", "benchmarks.pytest_record"] + (["-x"] if quick else []) + (
            ["-n", str(workers)] if workers > 1 else [])
    command = "python -m pytest " + " ".join(args)
    start = time.time()

    def update(final=False, stopped=False):
        with open(path, errors="replace") as f:
            found = summarize_tests(read_records(record), f.read())
        found.update(command=command, seconds=round(time.time() - start), stopped=stopped)
        part.record("tests", found)
        if not final:
            log(f"[tests] so far: {counts_line(found)} ({found['seconds']} s)")
        return found

    env = dict(os.environ, PYTEST_RECORD=record,
               PYTHONPATH=os.pathsep.join(filter(None, [subprocesses.REPO,
                                                        os.environ.get("PYTHONPATH")])))
    for name in [n for n in env if n.startswith("PYTEST_XDIST_")]:
        del env[name]  # its own pytest run, not a worker of one this process may belong to
    if workers > 1:  # the workers compile flex side by side: a share of the cores each
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, os.cpu_count() // workers)))
    with open(path, "w") as f:  # written as pytest goes: a run cut short still leaves its log
        proc = subprocess.Popen([sys.executable, "-m", "pytest", *args], stdout=f,
                                stderr=subprocess.STDOUT, cwd=subprocesses.REPO, env=env,
                                start_new_session=True)
        CHILD_GROUPS.append(proc)
        stopped = wait_until(proc, part.left() - 5, every=20, progress=update)
    found = update(final=True, stopped=stopped)
    summary = counts_line(found) + (f"; pytest: {found['pytest_summary']}"
                                    if found["pytest_summary"] else "")
    if stopped:
        summary = f"stopped at the time limit after {found['seconds']} s: {counts_line(found)}"
    log(f"[tests] {summary} ({found['seconds']} s)")
    if found["first_failure"]:
        log(f"[tests] first failure: {found['first_failure'][:500]}")
    lines = [f"`{command}`: **{summary}** (exit status {proc.returncode}, "
             f"{found['seconds']} s)."]
    if found["first_failure"]:
        lines.append(f"First failure: `{found['first_failure'][:600]}`")
    if found["failed"] + found["errors"] > 1:
        lines.append("Failed: " + ", ".join(f"`{t.split('::')[-1]}`"
                                            for t in found["failed_tests"]))
    if found["skip_reasons"]:
        lines.append("Skipped: " + "; ".join(f"{n} × {reason}"
                                             for reason, n in found["skip_reasons"].items()))
    slowest = [(t, s) for t, s in found["slowest"] if s >= 1]
    if slowest:
        lines.append("Slowest: " + ", ".join(f"`{t.split('::')[-1]}` {s:.0f} s"
                                             for t, s in slowest))
    part.section(f"CUDA correctness against float64 ({' '.join(paths)})", "\n\n".join(lines))


# ------------------------------------------------------------------ attention TFLOP/s


def attention_methods(q, k, v, variant, device):
    """name -> (function of (q, k, v), the name of its no-bias twin)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fairseq_alibi.modules.attention import dispatch, flex

    H, L, D = q.shape[1], q.shape[2], q.shape[3]
    scale = D**-0.5
    causal = variant == "causal"
    alibi = layer_bias(H, variant, device)

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
        if dispatch.serves("flash", call):
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
    body = tables.table(
        ["variant", "D", "L", "method", "fwd TFLOP/s", "fwd × same kernel no bias",
         "fwd × limit", "fwd+bwd TFLOP/s", "fwd+bwd × same kernel no bias", "fwd+bwd × limit"],
        rows)
    return results, shape, body


# ------------------------------------------------------------------ flex ALiBi ÷ flex, no bias


def eager_flex(*args, **kwargs):
    """flex_attention run eagerly (the CPU), its "use torch.compile" advice silenced."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*", category=UserWarning)
        return flex_attention(*args, **kwargs)


def flex_pair(q, k, v, grad, device):
    """``{"no bias": call, "ALiBi": call}``: the compiled flex kernel (eager on the CPU) with no
    score_mod and the ``flex`` backend with the ALiBi one, the same causal block mask; each call
    forward+backward on CUDA, forward on the CPU."""
    from fairseq_alibi.modules.attention import dispatch, flex

    H, L, D = q.shape[1], q.shape[2], q.shape[3]
    scale = D**-0.5
    alibi = layer_bias(H, "causal", device)
    block_mask = flex._block_mask("causal", H, L, L, q.device)
    plain = flex._compiled_flex() if device == "cuda" else eager_flex
    cases = {
        "no bias": lambda: plain(q, k, v, block_mask=block_mask, scale=scale),
        "ALiBi": lambda: dispatch.REGISTRY["flex"].run(q, k, v, alibi, None, None, 0.0, scale),
    }
    if device == "cuda":
        return {name: (lambda fn: lambda: torch.autograd.grad(fn(), (q, k, v), grad))(fn)
                for name, fn in cases.items()}
    return {name: (lambda fn: lambda: fn().sum())(fn) for name, fn in cases.items()}


def run_flex(part, quick, device, length=None, dims=None, rounds=3):
    """Compiled flex with the ALiBi score_mod ÷ the same compiled kernel with no score_mod
    (the same causal block mask), forward+backward, median of ``rounds`` paired ratios (on the
    CPU: eager flex, forward only, float32: PyTorch has no CPU backward for it)."""
    allow_many_flex_graphs()
    torch.manual_seed(0)
    cuda = device == "cuda"
    if quick:
        L, tokens, dims = length or 128, 256, [(d, {64: 2, 128: 2}[d]) for d in dims or (64,)]
    else:
        L, tokens, dims = length or 4096, 16384, [(d, {64: 16, 128: 8}[d])
                                                 for d in dims or (64, 128)]
    dtype = torch.bfloat16 if cuda else torch.float32
    rows, title = [], None
    for D, H in dims:
        if part.left() < (40 if cuda else 5):
            part.note(f"flex: D = {D} not run: {part.left():.0f} s left (compiling flex "
                      f"forward and backward twice takes longer)")
            break
        B = max(1, tokens // L)
        q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=cuda)
                   for _ in range(3))
        grad = torch.randn_like(q)
        timed = flex_pair(q, k, v, grad, device)
        times = timed_rounds(timed, device, rounds, f"[flex] D={D}")
        ratio = statistics.median(a / b for a, b in zip(times["no bias"], times["ALiBi"]))
        flops = attention_flops(B, H, L, D, causal=True) * (3.5 if cuda else 1.0)
        tflops = {name: flops / statistics.median(t) / 1e12 for name, t in times.items()}
        record = {"L": L, "D": D, "H": H, "B": B, "dtype": str(dtype).replace("torch.", ""),
                  "pass": "forward+backward" if cuda else "forward",
                  "alibi_vs_no_bias": ratio, "tflops": tflops,
                  "seconds": {name: statistics.median(t) for name, t in times.items()},
                  "goal_0.90": ratio >= 0.90}
        part.record(f"flex D={D}", record)
        log(f"[flex] L={L} D={D}: ALiBi {tflops['ALiBi']:.3g} TFLOP/s, no bias "
            f"{tflops['no bias']:.3g} TFLOP/s: ALiBi ÷ no bias {ratio:.2f}x (goal ≥ 0.90)")
        rows.append([L, D, H, B, f"{tflops['no bias']:.3g}", f"{tflops['ALiBi']:.3g}",
                     f"{ratio:.2f}", "yes" if ratio >= 0.90 else "no"])
        title = (f"Compiled flex: ALiBi score_mod ÷ no bias, {record['pass']}, "
                 f"{record['dtype']}, causal, L = {L}" if cuda else
                 f"Eager flex (CPU): ALiBi score_mod ÷ no bias, forward, float32, L = {L}")
        part.section(title, tables.table(
            ["L", "D", "H", "B", "no bias TFLOP/s", "ALiBi TFLOP/s", "ALiBi ÷ no bias",
             "≥ 0.90"], rows),
            f"Same block mask (causal) for both; median of {rounds} paired ratios, each of "
            "the median of CUDA-event timings (causal FLOPs: half the square; backward = 2.5× "
            "forward)." if cuda else "A smoke run: CPU timings of eager flex mean nothing.")
        del q, k, v, grad, timed
        if cuda:
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ training throughput and memory


def run_train(part, work, quick, device, lengths=None, backends=None, rounds=10, warmup=3,
              key="train", title="CUDA training"):
    """fairseq Trainer steps of ``alibi_transformer_lm`` (each of ``backends``) and stock
    ``transformer_lm``, interleaved: tokens/s and peak memory, each ÷ stock, per length (the
    table is rewritten after each)."""
    allow_many_flex_graphs()
    cuda = device == "cuda"
    if quick:
        dims = ["--decoder-layers", "1", "--decoder-embed-dim", "64",
                "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4"]
        lengths, tokens, vocab, rounds, warmup = lengths or (64, 128), 256, 100, 2, 1
    else:
        dims = ["--decoder-layers", "6", "--decoder-embed-dim", "1024",
                "--decoder-ffn-embed-dim", "4096", "--decoder-attention-heads", "16"]
        lengths, tokens, vocab = lengths or (512, 1024, 2048, 4096, 8192), 16384, 1000
    precision = ["--fp16"] if cuda else []
    backends = backends or (["auto", "flex"] if cuda else ["auto"])
    data = write_dictionary(os.path.join(work, "train-dict"), vocab)
    base = "transformer_lm (stock)"
    shape = (f"{' '.join(dims).replace('--decoder-', '')}, vocab {vocab}, {tokens} tokens per "
             f"batch, {' '.join(precision) or 'float32'}, Adam, {rounds} interleaved rounds "
             f"after {warmup} warm-up, median; peak: "
             + ("CUDA bytes allocated above the step's start" if cuda else
                "torch.profiler tensor bytes above the step's start"))
    rows, results = [], []
    for L in lengths:
        if part.left() < (45 if cuda else 5):
            part.note(f"{key}: L = {L} not run: {part.left():.0f} s left")
            break
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

        log(f"[{key}] L={L}, batch {batch} x {L} tokens: {', '.join(models)}")
        timed = timing.Rounds({name: step(name) for name in models}, rounds, warmup=warmup)
        peaks = {name: cuda_peak_bytes(step(name)) if cuda else timing.peak_bytes(step(name))
                 for name in models}
        for name in models:
            speed = batch * L / timed.median(name)
            record = {"L": L, "model": name, "tokens_per_s": speed,
                      "throughput_vs_stock": 1 / timed.ratio(name, base),
                      "peak_bytes": peaks[name], "peak_vs_stock": peaks[name] / peaks[base]}
            results.append(record)
            rows.append([L, name, f"{speed:,.0f}", f"{record['throughput_vs_stock']:.2f}",
                         timing.mib(peaks[name]), f"{record['peak_vs_stock']:.2f}"])
            log(f"[{key}] L={L} {name}: {speed:,.0f} tokens/s "
                f"({record['throughput_vs_stock']:.2f}x stock), peak {timing.mib(peaks[name])} "
                f"MiB ({record['peak_vs_stock']:.2f}x stock)")
        part.record(key, results)
        part.section(f"{title}: alibi_transformer_lm ÷ stock transformer_lm ({shape})",
                     tables.table(["L", "model", "train tokens/s", "× stock", "peak step MiB",
                                   "peak × stock"], rows),
                     "Goals: ≥ 1.00× stock tokens/s, ≤ 1.00× stock peak memory.")
        del models, samples, timed
        if cuda:
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ end to end through the CLIs


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
    subprocesses.python_module("fairseq_cli.preprocess", "--only-source", "--trainpref", f"{raw}/lm.train",
            "--validpref", f"{raw}/lm.test", "--testpref", f"{raw}/lm.test", "--destdir", lm,
            "--workers", "8", log_to=log_to)
    rev = os.path.join(work, "rev-bin")
    subprocesses.python_module("fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
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



def evaluate_checkpoints(work, lm, rev, user_dir, cpu, log_to, results):
    """fairseq-eval-lm at 8×L and fairseq-generate beam 5, fp32 and --fp16, of every checkpoint
    ``run_end_to_end`` trained: the table's rows (and ``results`` filled)."""
    gen_rows = []
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
    outputs = subprocesses.concurrently(jobs)
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
    return gen_rows


def run_end_to_end(data, work, quick, log_to, user_dir, device, updates=None, models=None):
    updates = updates or (20 if quick else 300)
    models = models or list(E2E_MODELS)
    cpu = ["--cpu"] if device == "cpu" else []
    lm, rev = prepare_corpora(data, work, quick, log_to)
    results = {"updates": updates}
    rows = []
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
    outputs = subprocesses.concurrently(jobs)
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
    gen_rows = evaluate_checkpoints(work, lm, rev, user_dir, cpu, log_to, results)
    train_table = tables.table(["model", "precision", "train loss, first → last logged",
                                "valid loss", "overflow notes", "last loss scale"], rows)
    eval_table = tables.table(["tool", "trained", "run", "score", "detail"], gen_rows)
    return results, f"{updates} updates, seed 1, L = {E2E_L}", train_table, eval_table



# ------------------------------------------------------------------ main
