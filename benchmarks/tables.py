"""What the benchmark commands write: Markdown tables and sections that carry the command, the
machine and the date of their figures; and their comma-separated choice flags."""

import datetime
import shlex
import sys
from typing import List, Optional


def machine() -> str:
    """One line: CPU model, cores, GPU, torch, threads, and the load when it started."""
    from fairseq_alibi.cli.fairseq_runs import machine_line

    return machine_line()


def today() -> str:
    return datetime.date.today().isoformat()


def command_line(module: str, argv=None) -> str:
    """The ``Command:`` line a benchmark prints above its figures, so that a pasted output keeps
    its command: ``python -m MODULE ARGS`` (this process's arguments unless ``argv`` is given),
    each argument quoted as a shell reads it back."""
    args = sys.argv[1:] if argv is None else argv
    return f"Command: `{' '.join(['python -m', module, *map(shlex.quote, args)])}`  "


def fill_unset(args, preset: dict):
    """Give each flag of ``preset`` (``{dest: value}``) that was not given (``None``) its
    preset value: ``--quick`` and the full run's defaults, where a flag given beside
    ``--quick`` wins over its preset."""
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def section(title: str, command: str, body: str, notes: str = "",
            machine_line: Optional[str] = None, date: Optional[str] = None) -> str:
    """A Markdown section with the command, machine and date the figures come from (this
    machine and today unless given: a report rewritten later keeps its run's)."""
    parts = [
        f"### {title}",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine_line or machine()}  ",
        f"Date: {date or today()}",
        "",
        body,
    ]
    if notes:
        parts += ["", notes]
    return "\n".join(parts) + "\n"


def comma_numbers(parser, text: str, flag: str, least: int = 1) -> List[int]:
    """The whole numbers in ``text`` (``512,4096``), each at least ``least``; else
    ``parser``'s error naming ``flag``."""
    try:
        numbers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < least:
        parser.error(f"{flag} {text}: comma-separated whole numbers >= {least}, e.g. 512,4096")
    return numbers


def comma_choices(parser, text: str, choices, what: str) -> List[str]:
    """The names in ``text`` (``a,b``), each one of ``choices``; else ``parser``'s error naming
    the unknown ones and the choices."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in choices]
    if unknown:
        parser.error(f"unknown {what}(s) {', '.join(unknown)}; choose from {', '.join(choices)}")
    return names
