"""fairseq's command-line tools as subprocesses of the benchmarks, their output returned (and
logged), a failure raised with the end of it; several at once."""

import os
import shlex
import subprocess
import sys
from typing import Dict, Optional

from fairseq_alibi.cli.fairseq_runs import thread_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fairseq_cli(tool: str, *args, threads: int = 1) -> str:
    """Run a fairseq console script of this environment; returns stdout+stderr, raises on error."""
    binary = os.path.join(os.path.dirname(sys.executable), tool)
    proc = subprocess.run([binary] + [str(a) for a in args], capture_output=True, text=True,
                          env=thread_env(threads))
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} failed ({proc.returncode}):\n{out[-4000:]}")
    return out


def python_module(module: str, *args, log_to: Optional[str] = None, timeout: Optional[float] = None,
                  threads: int = 2) -> str:
    """``python -m MODULE ARGS`` from the repository (``fairseq_cli.train``, ...): its output
    (appended to ``log_to`` with the command); raises ``RuntimeError`` on failure or when it
    runs past ``timeout`` seconds."""
    cmd = [sys.executable, "-m", module] + [str(a) for a in args]
    env = thread_env(threads)
    timeout = timeout if timeout is not None and timeout < float("inf") else None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env,
                              timeout=None if timeout is None else max(1.0, timeout))
        out, failed = proc.stdout + proc.stderr, proc.returncode != 0 and proc.returncode
    except subprocess.TimeoutExpired as expired:
        out = "".join(x.decode() if isinstance(x, bytes) else x or ""
                      for x in (expired.stdout, expired.stderr))
        failed = f"stopped after {timeout:.0f} s"
    if log_to:
        with open(log_to, "a") as f:
            f.write(f"$ {' '.join(shlex.quote(c) for c in cmd[1:])}\n{out}\n")
    if failed:
        last = out.strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"{module} failed ({failed}): {last[0][:300]}")
    return out


def concurrently(jobs: Dict, timeout: Optional[float] = None, threads: int = 2) -> Dict:
    """``{key: output or RuntimeError}`` of ``{key: (module, args, log_to)}`` runs of
    :func:`python_module`, all at once (small models: their wall times are not figures)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        module, args, log_to = job
        try:
            return python_module(module, *args, log_to=log_to, timeout=timeout, threads=threads)
        except RuntimeError as error:
            return error

    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        return dict(zip(jobs, pool.map(one, jobs.values())))
