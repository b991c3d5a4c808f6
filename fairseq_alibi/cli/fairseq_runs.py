"""Running fairseq's console scripts from the tools: which script, its environment and log, the
CPU time it took, the machine it ran on, the model flags it may be given, ``--seeds``."""

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Dict, List


def console_script(name: str) -> str:
    """A fairseq console script: the one installed beside this interpreter, else PATH's."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def thread_env(threads: int) -> dict:
    """This environment for a fairseq subprocess: ``threads`` OpenMP/MKL threads, unbuffered
    output (its log is read while it runs)."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                PYTHONUNBUFFERED="1")


def run_logged(cmd: List[str], log: Path, env: dict, what: str) -> str:
    """Run a command to completion, its output in ``log``; a clear error if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    output = proc.stdout + proc.stderr
    log.write_text("$ " + " ".join(cmd) + "\n" + output)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}); full output in {log}:\n"
                           + output[-3000:])
    return output


def cpu_seconds() -> float:
    """User + system CPU time of this process and every finished subprocess."""
    try:
        import resource
    except ImportError:  # not on Windows
        return float("nan")
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine() -> dict:
    """What the timings were measured on, including the load other processes put on it."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return dict(cpu=cpu, cores=os.cpu_count(), load_average=load,
                platform=platform.platform(), python=platform.python_version())


def machine_line() -> str:
    """:func:`machine` as one line, with the GPU, torch and its thread count (the benchmarks'
    reports): CPU model, cores, GPU, torch, threads, and the load when it started."""
    import torch

    found = machine()
    load = found["load_average"]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{found['cpu']}, {found['cores']} cores, {gpu}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), load average "
        f"{'unknown' if load is None else f'{load:.1f}'} at start"
    )


def declared_options(model_class) -> Dict[str, argparse.Action]:
    """``dest -> argparse action`` of every option ``model_class.add_args`` declares in this
    checkout: the model flags a ``fairseq-train`` command may pass (``action.option_strings``)."""
    parser = argparse.ArgumentParser(add_help=False)
    model_class.add_args(parser)
    return {action.dest: action for action in parser._actions}


def parse_seeds(parser, text: str) -> List[int]:
    """``--seeds 1,2,3`` as a list of ints; ``parser.error`` (exit 2, one line) otherwise."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds takes whole numbers separated by commas, got {text!r}")
    if not seeds:
        parser.error("--seeds: give at least one seed")
    return seeds
