"""Running fairseq's console scripts from the tools: which script, its environment and log, the
CPU time it took, the machine it ran on, the model flags it may be given, ``--seeds``.

Every fairseq command a tool starts goes through :func:`start` (or :func:`run`). By default
that is a new interpreter, as from a shell. With ``FAIRSEQ_ALIBI_FORKSERVER=1`` in the
environment, a console script of this environment (``fairseq-train``, ``fairseq-generate``,
``fairseq-alibi`` …) is forked instead from one server process that imported torch and fairseq
once (``preload_server.py``): the same entry point with the same argv, environment,
folder and output, without the seconds of imports each interpreter pays (the tests, which start
hundreds of tiny runs, set it). ``fairseq-hydra-train`` always gets its own interpreter.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional


def console_script(name: str) -> str:
    """A fairseq console script: the one installed beside this interpreter, else PATH's."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def thread_env(threads: int) -> dict:
    """This environment for a fairseq subprocess: ``threads`` OpenMP/MKL threads, unbuffered
    output (its log is read while it runs)."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                PYTHONUNBUFFERED="1")


#: the environment variable that turns the preload server on (``1``)
FORKSERVER = "FAIRSEQ_ALIBI_FORKSERVER"

#: console scripts that configure the process themselves (hydra's logging and working folder)
OWN_INTERPRETER = {"fairseq-hydra-train"}

#: CPU seconds of the forked commands this process waited for (they are the server's
#: children, not this process's: :func:`cpu_seconds` adds them)
_forked_cpu = [0.0]


def _entry_point(cmd: List[str]) -> Optional[str]:
    """``module:function`` of the console script ``cmd`` starts, if it is one of this
    environment's fairseq or fairseq-alibi scripts that may be forked."""
    name = Path(cmd[0]).name
    if name in OWN_INTERPRETER or not name.startswith("fairseq-"):
        return None
    if Path(cmd[0]).is_absolute() and Path(cmd[0]) != Path(console_script(name)):
        return None  # another environment's script
    found = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == name]
    return found[0].value if found else None


class _Server:
    """This process's preload server (``preload_server.py``), started on first use."""

    process = address = owner = None
    lock = threading.Lock()  # the tools start runs from several threads

    @classmethod
    def address_for(cls, env: dict) -> str:
        with cls.lock:
            return cls._started(env)

    @classmethod
    def _started(cls, env: dict) -> str:
        if cls.owner != os.getpid() or cls.process.poll() is not None:
            # a socket's path has at most ~100 bytes: a long TMPDIR gives way to /tmp
            short = len(tempfile.gettempdir()) > 60 and os.path.isdir("/tmp")
            folder = tempfile.mkdtemp(prefix="fairseq-alibi-server-", dir="/tmp" if short else None)
            cls.address, cls.owner = os.path.join(folder, "socket"), os.getpid()
            script = Path(__file__).with_name("preload_server.py")
            cls.process = subprocess.Popen([sys.executable, str(script), cls.address],
                                           stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                           env=env)
            while not os.path.exists(cls.address):  # it listens once it has imported fairseq
                if cls.process.poll() is not None:
                    raise RuntimeError(f"{FORKSERVER}=1: the preload server did not start "
                                       f"(exit {cls.process.returncode}); unset {FORKSERVER} "
                                       "to run each command in its own interpreter")
                time.sleep(0.05)
        return cls.address


class Started:
    """A command started by :func:`start`: :meth:`wait` for its exit code; ``cpu_s``, its user +
    system CPU seconds, once waited for."""

    def __init__(self, cmd, env, output: Path, cwd=None, stdin: Optional[Path] = None):
        self.cmd, self.cpu_s, self.returncode = cmd, None, None
        self._proc = self._conn = None
        entry = _entry_point(cmd) if env.get(FORKSERVER) == "1" else None
        if entry is None:
            with open(output, "a") as f, open(stdin or os.devnull) as given:
                self._proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=f,
                                              stderr=subprocess.STDOUT, stdin=given)
            return
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(_Server.address_for(env))
        request = dict(entry=entry, argv=cmd, env=dict(env), cwd=str(cwd or os.getcwd()),
                       output=str(Path(output).absolute()),
                       stdin=str(Path(stdin).absolute()) if stdin else None)
        self._conn.sendall((json.dumps(request) + "\n").encode())
        self._answers = self._conn.makefile("r")
        self.pid = int(self._answer())

    def _answer(self) -> str:
        answer = self._answers.readline()
        if not answer:
            raise RuntimeError(f"{FORKSERVER}=1: the preload server ended while running "
                               f"{' '.join(self.cmd[:2])} ...; unset {FORKSERVER} to run each "
                               "command in its own interpreter")
        return answer

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit code; ``subprocess.TimeoutExpired`` (the command killed) after ``timeout``."""
        if self.returncode is not None:
            return self.returncode
        if self._proc is not None:
            if timeout is None:  # its own CPU time, from the kernel
                _, status, usage = os.wait4(self._proc.pid, 0)
                self._proc.returncode = os.waitstatus_to_exitcode(status)
                self.cpu_s = usage.ru_utime + usage.ru_stime
            else:
                try:
                    self._proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                    raise
            self.returncode = self._proc.returncode
            return self.returncode
        self._conn.settimeout(timeout)
        try:
            answer = self._answer()
        except socket.timeout:
            os.kill(self.pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(self.cmd, timeout)
        finally:
            self._conn.settimeout(None)
        result = json.loads(answer)
        self._conn.close()
        self.returncode, self.cpu_s = result["code"], result["cpu"]
        _forked_cpu[0] += self.cpu_s
        return self.returncode


def start(cmd: List[str], env: dict, output: Path, cwd=None, stdin: Optional[Path] = None):
    """Start ``cmd`` (its stdout and stderr appended to the file ``output``, its stdin the
    file ``stdin`` or nothing) in ``env`` and ``cwd``: a :class:`Started`."""
    return Started([str(c) for c in cmd], env, Path(output), cwd, stdin)


def run(cmd: List[str], env: Optional[dict] = None, cwd=None,
        timeout: Optional[float] = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` to completion, as ``subprocess.run(..., capture_output=True, text=True)``
    but with stdout and stderr together in ``stdout`` (in the order written) and ``stderr``
    empty."""
    with tempfile.TemporaryDirectory(prefix="fairseq-run-") as scratch:
        output = Path(scratch, "output")
        output.touch()
        started = start(cmd, dict(os.environ) if env is None else env, output, cwd)
        code = started.wait(timeout)
        text = output.read_text(errors="replace")
    return subprocess.CompletedProcess(started.cmd, code, text, "")


def run_to_log(cmd: List[str], env: dict, log: Path, cwd=None) -> Started:
    """Run ``cmd`` to completion with ``log`` holding ``$ cmd`` and then its output as it
    comes (a long run can be watched); the waited-for :class:`Started` (``returncode``,
    ``cpu_s``)."""
    cmd = [str(c) for c in cmd]
    Path(log).write_text("$ " + " ".join(cmd) + "\n")
    started = start(cmd, env, log, cwd)
    started.wait()
    return started


def run_logged(cmd: List[str], log: Path, env: dict, what: str) -> str:
    """Run a command to completion, its output in ``log``; a clear error if it fails."""
    proc = run_to_log(cmd, env, log)
    output = Path(log).read_text().split("\n", 1)[1]
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}); full output in {log}:\n"
                           + output[-3000:])
    return output


def cpu_seconds() -> float:
    """User + system CPU time of this process and every finished subprocess (the forked
    commands' included)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return float("nan")
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
            + _forked_cpu[0])


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


def declared_options(model_class) -> Dict[str, List[argparse.Action]]:
    """``dest -> argparse actions`` of every option ``model_class.add_args`` declares in this
    checkout: the model flags a ``fairseq-train`` command may pass (``action.option_strings``;
    a switch and its opposite, e.g. ``--layernorm-embedding`` and ``--no-layernorm-embedding``,
    share a ``dest``)."""
    from fairseq_alibi.models.checks import is_refused_flag

    parser = argparse.ArgumentParser(add_help=False)
    model_class.add_args(parser)
    found: Dict[str, List[argparse.Action]] = {}
    for action in parser._actions:
        if not is_refused_flag(action):  # a fork's or a stock flag the model refuses
            found.setdefault(action.dest, []).append(action)
    return found


def parse_seeds(parser, text: str) -> List[int]:
    """``--seeds 1,2,3`` as a list of ints; ``parser.error`` (exit 2, one line) otherwise."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds takes whole numbers separated by commas, got {text!r}")
    if not seeds:
        parser.error("--seeds: give at least one seed")
    return seeds
