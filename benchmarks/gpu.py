"""Every CUDA figure of docs/benchmarks.md ("GPU (H100)") in one command, within a time budget.

    python -m benchmarks.gpu --budget 420 --out DIR [--only tests,decode,memory,flex]
    python -m benchmarks.gpu --quick --device cpu --out DIR    # a CPU smoke run (the test suite)

The default parts, in this order:

* ``tests``: ``pytest tests/cuda/test_cuda.py`` whole (every backend × variant × dtype against
  float64, cached decoding included), with pytest-xdist; each test's outcome is recorded as it
  finishes (``benchmarks/pytest_record.py``): the summary, the first failure's message;
* ``decode``: tiny ``alibi_transformer_lm`` and ``alibi_transformer`` (``--cross-alibi pointer
  --cross-alibi-eos-guard 2``) trained here for a few updates, then beam 5 through
  ``fairseq-interactive`` / ``fairseq-generate`` on the CPU (fp32) and on the device (fp32,
  ``--fp16``): device hypotheses identical to the CPU's, fp16 scores within tolerance
  (``benchmarks/gpu_decode.py``);
* ``memory``: fairseq Trainer steps of ``alibi_transformer_lm --alibi-attention auto`` and of
  stock ``transformer_lm``, ``--fp16``, L = 2048 and 8192: peak CUDA memory and tokens/s, each
  ALiBi ÷ stock, measured side by side;
* ``flex``: compiled flex with the ALiBi ``score_mod`` ÷ the same compiled kernel with no bias
  (same block mask), forward+backward, bf16, causal, L = 4096, D = 64 and 128.

By name only: ``attention`` (every CUDA backend's TFLOP/s against the no-bias kernels at
L = 1k…16k), ``train`` (Trainer steps of each backend at L = 512…8192), ``end_to_end``
(``fairseq-train`` fp32/fp16/bf16 of three models on WikiText-2, ``fairseq-eval-lm`` at 8×L,
``fairseq-generate``).

Each part runs in a process of its own (a sticky CUDA fault or a hang in one cannot cost the
others their figures). ``--budget SECONDS`` bounds the whole run: before each part the time left
is checked, a part whose minimum (:data:`NEEDS`) no longer fits is skipped and the report says
so, and a part gets the time left less the later parts' minimums, after which it is stopped.
Into ``--out`` go ``gpu.md`` (the tables, with command, machine and date, and each part's
status), ``results.json`` and ``log.txt``, rewritten after every figure, ``tests.log`` (pytest's
output, as it goes) and ``fairseq.log`` (every fairseq command line run and its output): a run
cut at its limit keeps everything measured so far. ``--quick`` runs toy sizes (on the CPU with
``--device cpu``, where the device side of each comparison runs on the CPU): its figures mean
nothing.
"""

import time

STARTED = time.time()  # --budget counts from here, before the slow imports below

import argparse
import collections
import importlib.util
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import traceback

import torch
import torch.nn.functional as F

from benchmarks import common, gpu_decode
from benchmarks.train import build_trainer, random_batch, write_dictionary

PARTS = ("tests", "decode", "memory", "flex", "attention", "train", "end_to_end")
DEFAULT_PARTS = ("tests", "decode", "memory", "flex")
#: the least time, in seconds, worth starting each part with (full sizes on an H100, --quick
#: on a CPU): estimates of start-up, compilation and the smallest useful measurement. A part
#: gets the time left less the later parts' minimums
NEEDS = {"tests": (90, 15), "decode": (60, 60), "memory": (90, 25), "flex": (60, 15),
         "attention": (180, 30), "train": (180, 30), "end_to_end": (300, 120)}
#: seconds between a part's own deadline and its process being stopped from outside
GRACE = 10
LOG = None
#: the processes a part started in sessions of their own (pytest and its workers): their
#: groups are stopped with the part
CHILD_GROUPS = []


def log(msg):
    print(msg, file=sys.stderr, flush=True)
    if LOG:
        with open(LOG, "a") as f:
            f.write(msg + "\n")


# ------------------------------------------------------------------ the report, written as it goes


def write_json(path, data):
    """Replaced whole (written beside, then renamed): a process stopped meanwhile leaves the
    previous version, never half a file."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def state_path(out, name):
    return os.path.join(out, "parts", f"{name}.json")


def write_report(out):
    """``results.json`` and ``gpu.md`` from the run's and each part's state file."""
    run = read_json(state_path(out, "run"))
    if run is None:
        return
    parts = {name: read_json(state_path(out, name)) or {"status": "not started"}
             for name in run["parts"]}
    write_json(os.path.join(out, "results.json"), {"run": run, "parts": parts})

    def cell(text):
        return str(text).replace("|", "\\|").replace("\n", " ")

    rows = [[name, p.get("status", ""), p.get("seconds", "–"), p.get("limit_s") or "–",
             cell("; ".join(p.get("notes", [])))] for name, p in parts.items()]
    budget = run["budget_s"]
    lines = ["## GPU run", "", f"Command: `{run['command']}`  ", f"Machine: {run['machine']}  ",
             f"Date: {run['date']}  ",
             f"Budget: {'none' if budget is None else f'{budget:.0f} s'}", "",
             common.table(["part", "status", "seconds", "limit (s)", "notes"], rows), ""]
    for p in parts.values():
        for title, (body, notes) in p.get("sections", {}).items():
            lines.append(common.section(title, run["command"], body, notes,
                                        machine_line=run["machine"], date=run["date"]))
    with open(os.path.join(out, "gpu.md.tmp"), "w") as f:
        f.write("\n".join(lines))
    os.replace(os.path.join(out, "gpu.md.tmp"), os.path.join(out, "gpu.md"))


class Part:
    """One part's figures and status in ``OUT/parts/NAME.json``: every change saves it and
    rewrites the report, so a part stopped at its limit keeps what it measured."""

    def __init__(self, out, name, deadline=None, fresh=False):
        self.out, self.name, self.deadline = out, name, deadline
        self.state = None if fresh else read_json(state_path(out, name))
        self.state = self.state or {"part": name}

    def left(self):
        """Seconds until this part's deadline (infinite without a budget)."""
        return math.inf if self.deadline is None else self.deadline - time.time()

    def log(self, msg):
        log(msg)

    def record(self, key, value):
        self.state.setdefault("results", {})[key] = value
        self.save()

    def section(self, title, body, notes=""):
        self.state.setdefault("sections", {})[title] = [body, notes]
        self.save()

    def note(self, text):
        log(f"[{self.name}] {text}")
        self.state.setdefault("notes", []).append(text)
        self.save()

    def update(self, **fields):
        self.state.update(fields)
        self.save()

    def save(self):
        write_json(state_path(self.out, self.name), self.state)
        write_report(self.out)


def stop_group(proc):
    """SIGTERM to the process group of ``proc`` (a ``Popen`` started in a session of its own),
    SIGKILL to what is left of it 5 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + 5
        while time.time() < deadline:
            proc.poll()  # (reaped, the leader no longer holds the group)
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def wait_until(proc, seconds, every=None, progress=None):
    """Wait for ``proc`` at most ``seconds`` (calling ``progress()`` every ``every`` seconds);
    past that, stop its process group. True if it had to be stopped."""
    end = time.time() + seconds
    while True:
        step = end - time.time()
        if every:
            step = min(step, every)
        try:
            proc.wait(timeout=max(0.1, step))
            return False
        except subprocess.TimeoutExpired:
            if time.time() >= end:
                stop_group(proc)
                proc.wait()
                return True
            if progress:
                progress()


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


def run_tests(part, out, quick, workers):
    """``pytest tests/cuda/test_cuda.py`` until the part's deadline, its outcomes recorded as they
    come (a progress line every 20 s)."""
    record, path = os.path.join(out, "tests.jsonl"), os.path.join(out, "tests.log")
    if os.path.exists(record):
        os.remove(record)
    if workers > 1 and importlib.util.find_spec("xdist") is None:
        part.note(f"pytest-xdist is not installed: the tests run in one process, not {workers}")
        workers = 1
    args = ["tests/cuda/test_cuda.py", "-v", "--tb=short", "-p", "no:cacheprovider",
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
               PYTHONPATH=os.pathsep.join(filter(None, [common.REPO,
                                                        os.environ.get("PYTHONPATH")])))
    if workers > 1:  # the workers compile flex side by side: a share of the cores each
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, os.cpu_count() // workers)))
    with open(path, "w") as f:  # written as pytest goes: a run cut short still leaves its log
        proc = subprocess.Popen([sys.executable, "-m", "pytest", *args], stdout=f,
                                stderr=subprocess.STDOUT, cwd=common.REPO, env=env,
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
    part.section("CUDA correctness against float64 (tests/cuda/test_cuda.py)", "\n\n".join(lines))


# ------------------------------------------------------------------ attention TFLOP/s


def attention_methods(q, k, v, variant, device):
    """name -> (function of (q, k, v), the name of its no-bias twin)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fairseq_alibi.modules.attention import dispatch, flash, flex

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


# ------------------------------------------------------------------ flex ALiBi ÷ flex, no bias


def run_flex(part, quick, device, length=None, dims=None, rounds=3):
    """Compiled flex with the ALiBi score_mod ÷ the same compiled kernel with no score_mod
    (the same causal block mask), forward+backward, median of ``rounds`` paired ratios (on the
    CPU: eager flex, forward only, float32: PyTorch has no CPU backward for it)."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    from fairseq_alibi.modules.attention import dispatch, flex

    def eager_flex(*args, **kwargs):
        with warnings.catch_warnings():  # its "use torch.compile" advice: the CPU runs eager
            warnings.filterwarnings("ignore", message=".*flex_attention.*", category=UserWarning)
            return flex_attention(*args, **kwargs)

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
        scale = D**-0.5
        alibi = layer_bias(H, "causal", device)
        block_mask = flex._block_mask("causal", H, L, L, q.device)
        plain = flex._compiled_flex() if cuda else eager_flex
        cases = {
            "no bias": lambda: plain(q, k, v, block_mask=block_mask, scale=scale),
            "ALiBi": lambda: dispatch.REGISTRY["flex"].run(q, k, v, alibi, None, None, 0.0,
                                                           scale),
        }
        if cuda:
            timed = {name: (lambda fn: lambda: torch.autograd.grad(fn(), (q, k, v), grad))(fn)
                     for name, fn in cases.items()}
        else:
            timed = {name: (lambda fn: lambda: fn().sum())(fn) for name, fn in cases.items()}
        start = time.time()
        for fn in timed.values():  # compile (or warm up) both before any timing
            fn()
        sync(device)
        log(f"[flex] D={D}: compiled/warmed up in {time.time() - start:.0f} s")
        times = {name: [] for name in timed}
        for _ in range(rounds):
            for name, fn in timed.items():
                times[name].append(median_seconds(fn, device, budget=0.2, warmup=1))
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
        part.section(title, common.table(
            ["L", "D", "H", "B", "no bias TFLOP/s", "ALiBi TFLOP/s", "ALiBi ÷ no bias",
             "≥ 0.90"], rows),
            f"Same block mask (causal) for both; median of {rounds} paired ratios, each of "
            "the median of CUDA-event timings (causal FLOPs: half the square; backward = 2.5× "
            "forward)." if cuda else "A smoke run: CPU timings of eager flex mean nothing.")
        del q, k, v, grad, cases, timed
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
        timed = common.Rounds({name: step(name) for name in models}, rounds, warmup=warmup)
        peaks = {name: cuda_peak_bytes(step(name)) if cuda else common.peak_bytes(step(name))
                 for name in models}
        for name in models:
            speed = batch * L / timed.median(name)
            record = {"L": L, "model": name, "tokens_per_s": speed,
                      "throughput_vs_stock": 1 / timed.ratio(name, base),
                      "peak_bytes": peaks[name], "peak_vs_stock": peaks[name] / peaks[base]}
            results.append(record)
            rows.append([L, name, f"{speed:,.0f}", f"{record['throughput_vs_stock']:.2f}",
                         common.mib(peaks[name]), f"{record['peak_vs_stock']:.2f}"])
            log(f"[{key}] L={L} {name}: {speed:,.0f} tokens/s "
                f"({record['throughput_vs_stock']:.2f}x stock), peak {common.mib(peaks[name])} "
                f"MiB ({record['peak_vs_stock']:.2f}x stock)")
        part.record(key, results)
        part.section(f"{title}: alibi_transformer_lm ÷ stock transformer_lm ({shape})",
                     common.table(["L", "model", "train tokens/s", "× stock", "peak step MiB",
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
    common.python_module("fairseq_cli.preprocess", "--only-source", "--trainpref", f"{raw}/lm.train",
            "--validpref", f"{raw}/lm.test", "--testpref", f"{raw}/lm.test", "--destdir", lm,
            "--workers", "8", log_to=log_to)
    rev = os.path.join(work, "rev-bin")
    common.python_module("fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
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
    outputs = common.concurrently(jobs)
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
    outputs = common.concurrently(jobs)
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
    parser.add_argument("--only", default=",".join(DEFAULT_PARTS),
                        help=f"comma-separated parts, run in the order given, of "
                        f"{','.join(PARTS)} (default: {','.join(DEFAULT_PARTS)})")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run: parts that no longer fit are skipped, "
                        "each part is stopped at its share (default: no limit)")
    parser.add_argument("--out", default="outputs/gpu", help="folder for gpu.md, results.json, logs")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(common.REPO), "shared", "data"),
                        help="the shared data folder (wikitext-2/) for end_to_end")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke run (with --quick); the device side of each "
                        "comparison runs on the CPU")
    parser.add_argument("--quick", action="store_true", help="toy sizes: a smoke run")
    parser.add_argument("--lengths", default=None, help="attention lengths (default 1k…16k)")
    parser.add_argument("--variants", default=None, help="attention variants (default "
                        "causal,symmetric,offset)")
    parser.add_argument("--head-dims", default=None, help="attention and flex head sizes "
                        "(default 64,128)")
    parser.add_argument("--train-lengths", default=None,
                        help="Trainer lengths (default: memory 2048,8192; train 512…8192)")
    parser.add_argument("--flex-length", type=int, default=None, help="flex length (4096)")
    parser.add_argument("--models", default=None, help=f"end_to_end models (default "
                        f"{','.join(E2E_MODELS)})")
    parser.add_argument("--updates", type=int, default=None, help="end_to_end updates (300)")
    parser.add_argument("--test-workers", type=int, default=None,
                        help="pytest-xdist workers for the tests (default: 8 on CUDA, at most "
                        "one per core; none on the CPU)")
    parser.add_argument("--append", action="store_true",
                        help="keep the parts already reported in --out (those run again are "
                        "replaced)")
    parser.add_argument("--run-part", default=None, help=argparse.SUPPRESS)  # a part's process
    parser.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ints = lambda text: tuple(int(x) for x in text.split(",")) if text else None  # noqa: E731
    args.lengths, args.head_dims = ints(args.lengths), ints(args.head_dims)
    args.train_lengths = ints(args.train_lengths)
    args.variants = args.variants and tuple(args.variants.split(","))
    args.models = args.models and common.comma_choices(parser, args.models, E2E_MODELS, "model")
    args.only = common.comma_choices(parser, args.only, PARTS, "part")
    if args.test_workers is None:  # compiling flex, most of the tests' time, is CPU-bound
        args.test_workers = min(8, os.cpu_count() or 1) if args.device == "cuda" else 1
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be a positive number of seconds, got {args.budget:g}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it on a GPU machine (or --device cpu --quick)")
    if "end_to_end" in args.only and not os.path.isdir(os.path.join(args.data, "wikitext-2")):
        parser.error(f"no wikitext-2/ in {args.data}: pass --data DIR (the shared data folder)")
    return args


def describe_machine(device):
    """The machine line of the report: CPU, GPU, and the versions the figures depend on."""
    import platform
    from importlib import metadata

    import numpy

    versions = []
    for dist in ("fairseq-fixed", "fairseq"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
            break
        except metadata.PackageNotFoundError:
            pass
    line = (f"{common.machine()}, Python {platform.python_version()}, numpy {numpy.__version__}, "
            + (", ".join(versions) or "no fairseq distribution"))
    if device == "cuda":
        import triton

        memory = torch.cuda.get_device_properties(0).total_memory / 2**30
        line += f", CUDA {torch.version.cuda}, triton {triton.__version__}, {memory:.0f} GiB"
    return line


def exit_on_sigterm(signum, frame):
    """Stopped from outside: stop the processes this one started in sessions of their own
    (the part a run is waiting for goes down through ``run_child``'s handler), then exit."""
    for proc in CHILD_GROUPS:
        stop_group(proc)
    raise SystemExit(128 + signum)


def run_part(args):
    """One part, in this process (``--run-part``), until ``--deadline``."""
    part = Part(args.out, args.run_part, args.deadline)
    user_dir = os.path.join(common.REPO, "fairseq_alibi")
    name, fairseq_log = args.run_part, os.path.join(args.out, "fairseq.log")
    try:
        with tempfile.TemporaryDirectory() as work:
            if name == "tests":
                run_tests(part, args.out, args.quick, args.test_workers)
            elif name == "decode":
                gpu_decode.run(part, work, args.device, args.quick, user_dir, fairseq_log)
            elif name == "memory":
                run_train(part, work, args.quick, args.device,
                          args.train_lengths or (None if args.quick else (2048, 8192)),
                          backends=["auto"], rounds=5, warmup=2, key="memory",
                          title="Peak memory and tokens/s of Trainer steps")
            elif name == "flex":
                run_flex(part, args.quick, args.device, args.flex_length, args.head_dims)
            elif name == "attention":
                results, shape, body = run_attention(args.quick, args.device, args.lengths,
                                                     args.variants, args.head_dims)
                part.record("attention", results)
                part.section(f"CUDA attention TFLOP/s against the no-bias kernels ({shape})",
                             body)
            elif name == "train":
                run_train(part, work, args.quick, args.device, args.train_lengths)
            elif name == "end_to_end":
                results, shape, train_table, eval_table = run_end_to_end(
                    args.data, work, args.quick, fairseq_log, user_dir, args.device,
                    args.updates, args.models)
                part.record("end_to_end", results)
                part.section(f"End to end through fairseq's CLIs ({shape})", train_table)
                part.section("End to end: eval-lm at 8×L and generate, each checkpoint",
                             eval_table)
    except Exception as error:  # said in the report; the other parts go on
        log(traceback.format_exc())
        part.note(f"failed: {type(error).__name__}: {str(error)[:500]}")
        return 1
    return 0


def run_child(argv, args, name, limit):
    """``name`` in a process of its own: its deadline ``GRACE`` seconds before ``limit``, then
    stopped. ``(exit status, seconds, whether it was stopped)``."""
    start = time.time()
    cmd = [sys.executable, "-m", "benchmarks.gpu", *argv, "--run-part", name,  # (from REPO:)
           "--out", os.path.abspath(args.out), "--data", os.path.abspath(args.data)]
    if limit is not None:
        cmd += ["--deadline", repr(start + limit - GRACE)]
    proc = subprocess.Popen(cmd, cwd=common.REPO, start_new_session=True)
    try:
        stopped = wait_until(proc, math.inf if limit is None else limit)
    except BaseException:  # this run interrupted: take the part down with it
        stop_group(proc)
        raise
    return proc.returncode, time.time() - start, stopped


def part_limit(name, later, left, quick):
    """Seconds for part ``name`` when ``left`` seconds of the budget remain and the parts
    ``later`` follow: what is left less the later parts' minimums, at least its own minimum;
    0 (skip it) when even that does not fit."""
    need = NEEDS[name][quick]
    if left < need:
        return 0
    return min(left, max(need, left - sum(NEEDS[p][quick] for p in later)))


def main(argv=None, started=None):
    """The run (or, with ``--run-part``, one part); the budget counts from ``started``."""
    global LOG
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    os.makedirs(os.path.join(args.out, "parts"), exist_ok=True)
    LOG = os.path.join(args.out, "log.txt")
    if args.run_part:
        return run_part(args)
    start = started or time.time()
    end = None if args.budget is None else start + args.budget
    run = {"command": "python -m benchmarks.gpu " + " ".join(shlex.quote(a) for a in argv),
           "machine": describe_machine(args.device), "date": common.today(),
           "budget_s": args.budget, "parts": list(args.only)}
    previous = read_json(state_path(args.out, "run")) if args.append else None
    if previous:
        run["parts"] = [p for p in previous["parts"] if p not in args.only] + list(args.only)
    else:
        for name in os.listdir(os.path.join(args.out, "parts")):
            os.remove(os.path.join(args.out, "parts", name))
        for name in ("log.txt", "tests.log", "tests.jsonl", "fairseq.log"):
            if os.path.exists(os.path.join(args.out, name)):
                os.remove(os.path.join(args.out, name))
    write_json(state_path(args.out, "run"), run)
    log(f"[gpu] {run['machine']}")
    for name in args.only:
        Part(args.out, name, fresh=True).update(status="waiting")
    failed = []
    for i, name in enumerate(args.only):
        part = Part(args.out, name)
        left = math.inf if end is None else end - time.time()
        limit = part_limit(name, args.only[i + 1:], left, args.quick)
        if limit == 0:
            part.update(status="skipped")
            part.note(f"skipped: needs about {NEEDS[name][args.quick]} s, "
                      f"{max(0.0, left):.0f} s of the budget left")
            continue
        limit = None if limit == math.inf else limit
        part.update(status="running", limit_s=limit and round(limit))
        log(f"[gpu] {name}: started" + (f", limit {limit:.0f} s" if limit else ""))
        try:
            returncode, seconds, stopped = run_child(argv, args, name, limit)
        except BaseException:  # (this run stopped from outside: the part is stopped too)
            Part(args.out, name).update(status="stopped with the run")
            raise
        part = Part(args.out, name)  # (the part's process wrote its figures there)
        status = ("done" if returncode == 0 else
                  f"stopped at its limit ({limit:.0f} s)" if stopped else
                  f"failed (exit status {returncode})")
        if returncode != 0:
            failed.append(name)
        part.update(status=status, seconds=round(seconds))
        log(f"[gpu] {name}: {status}, {seconds:.0f} s")
    log(f"[gpu] {time.time() - start:.0f} s in all; {os.path.join(args.out, 'gpu.md')}")
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    sys.exit(main(started=STARTED))
