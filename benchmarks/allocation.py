"""The CPU's memory allocation, end to end: :mod:`benchmarks.end_to_end` (fairseq's training
step and eval-lm's scoring, dense, slope windows, document masks) in a process of its own per
setting of how PyTorch's CPU memory is allocated, the settings alternating round by round.

    python -m benchmarks.allocation [--settings default,huge_pages,glibc_keep] [--rounds 3]
        [--quick] [--json FILE] [-- END_TO_END ARGS ...]

Why: on Linux a large tensor (over glibc's mmap threshold) is fresh memory from the kernel,
and glibc returns it when freed, so the next step of the same shapes faults every 4 KiB page
in again (and the kernel zeroes it). The settings (:data:`SETTINGS`):

* ``default``: as a process starts, none of the variables below set;
* ``huge_pages``: ``THP_MEM_ALLOC_ENABLE=1``, PyTorch's own switch (torch >= 2.2): its CPU
  allocations of 2 MiB or more are aligned to and advised as transparent huge pages, one fault
  per 2 MiB (the kernel's ``transparent_hugepage/enabled`` must be ``always`` or
  ``madvise``);
* ``glibc_keep``: ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` at 2 GiB: glibc
  serves large blocks from its heap and keeps what is freed (the process's memory stays at
  its peak).

Each round runs every setting once (``end_to_end --rounds 1``: one warm-up and one timed call
of each case), the order rotated from round to round; per case the median tokens/s over the
rounds, ``÷ default`` the median of each round's ratio, and the largest resident memory of
each setting's processes (``ru_maxrss``).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.subprocesses import REPO
from benchmarks.tables import comma_choices, command_line, machine, table
from fairseq_alibi.cli.fairseq_runs import thread_env

#: what each setting sets in the child's environment (every other variable named here unset)
SETTINGS = {
    "default": {},
    "huge_pages": {"THP_MEM_ALLOC_ENABLE": "1"},
    "glibc_keep": {"MALLOC_MMAP_THRESHOLD_": str(2**31), "MALLOC_TRIM_THRESHOLD_": str(2**31)},
}
NAMED = sorted({name for extra in SETTINGS.values() for name in extra})
PARTS = ("training", "scoring")


def setting_env(setting: str, threads: int) -> dict:
    env = {k: v for k, v in thread_env(threads).items() if k not in NAMED}
    return dict(env, **SETTINGS[setting])


def run_once(setting: str, passed, threads: int, work: Path):
    """One ``end_to_end --rounds 1`` process under ``setting``: ``(record, peak RSS MiB)``."""
    out = work / f"{setting}.json"
    cmd = [sys.executable, "-m", "benchmarks.end_to_end", *passed, "--rounds", "1",
           "--threads", str(threads), "--json", str(out), "--work", str(work / "data")]
    with open(work / f"{setting}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=setting_env(setting, threads),
                                stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = (work / f"{setting}.log").read_text().strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"benchmarks.end_to_end under {setting} failed "
                           f"({proc.returncode}): {tail[0][:300]}")
    return json.loads(out.read_text()), usage.ru_maxrss / 1024  # KiB on Linux


def measure(settings, rounds: int, passed, threads: int, log=print):
    """``{setting: [(record, rss), ...]}``, one entry a round."""
    found = {s: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="allocation-") as tmp:
        for r in range(rounds):
            for s in settings[r % len(settings):] + settings[:r % len(settings)]:
                found[s].append(run_once(s, passed, threads, Path(tmp)))
                speeds = found[s][-1][0]
                log(f"[allocation] round {r + 1} {s}: " + ", ".join(
                    f"{part} dense {speeds[part]['tokens_per_second']['dense']:,.0f} tokens/s"
                    for part in PARTS))
    return found


def report(found, settings):
    """The Markdown table: per part and case, tokens/s and ``÷ default`` per setting."""
    base = settings[0]
    cases = list(found[base][0][0]["training"]["tokens_per_second"])
    rows = []
    for part in PARTS:
        for case in cases:
            row = [part, case]
            for s in settings:
                speeds = [rec[part]["tokens_per_second"][case] for rec, _ in found[s]]
                cell = f"{statistics.median(speeds):,.0f}"
                if s != base:
                    ratios = [rec[part]["tokens_per_second"][case]
                              / b[part]["tokens_per_second"][case]
                              for (rec, _), (b, _) in zip(found[s], found[base])]
                    cell += f" ({statistics.median(ratios):.2f}×)"
                row.append(cell)
            rows.append(row)
    rows.append(["peak memory", "the largest process, MiB"]
                + [f"{max(rss for _, rss in found[s]):,.0f}" for s in settings])
    headers = ["part", "case"] + [f"{s} tokens/s" + ("" if s == base else f" (÷ {base})")
                                  for s in settings]
    return table(headers, rows)


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    passed = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.allocation",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="-- FLAGS: what follows -- is passed to each "
                                     "benchmarks.end_to_end run (e.g. -- --corpus DATA-BIN)")
    parser.add_argument("--settings", default="default,huge_pages,glibc_keep",
                        help=f"comma-separated, the first the base: {', '.join(SETTINGS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true",
                        help="end_to_end --quick, one round (a smoke run)")
    args = parser.parse_args(own)
    args.settings = comma_choices(parser, args.settings, SETTINGS, "--settings")
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    if "--rounds" in passed or "--json" in passed:
        parser.error("--rounds and --json are this benchmark's own (before --)")
    if args.quick:
        passed, args.rounds = ["--quick"] + passed, 1
    return args, passed


def main(argv=None):
    args, passed = parse_args(argv)
    torch.set_num_threads(args.threads)  # the machine line reports the children's threads
    found = measure(args.settings, args.rounds, passed, args.threads)
    print("\n".join([command_line("benchmarks.allocation", argv), f"Machine: {machine()}", "",
                     "## CPU memory allocation, end to end", "",
                     f"benchmarks.end_to_end {' '.join(passed)} --rounds 1, one process per "
                     f"setting and round, {args.rounds} alternating round(s), median",
                     "", report(found, args.settings)]))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"settings": args.settings, "passed": passed,
             "rounds": {s: [{"record": rec, "rss_mib": rss} for rec, rss in found[s]]
                        for s in args.settings}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
