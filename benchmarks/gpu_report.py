"""What a GPU run (``python -m benchmarks.gpu``) writes as it goes: ``log.txt``, each part's
state file (``OUT/parts/NAME.json``), and from them ``results.json`` and ``gpu.md``, rewritten
after every figure (a part stopped at its limit keeps what it measured)."""

import json
import math
import os
import sys
import time

from benchmarks import tables

#: ``OUT/log.txt`` once the run has started (``benchmarks.gpu.main`` sets it)
LOG = None


def log(msg):
    print(msg, file=sys.stderr, flush=True)
    if LOG:
        with open(LOG, "a") as f:
            f.write(msg + "\n")



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
             tables.table(["part", "status", "seconds", "limit (s)", "notes"], rows), ""]
    for p in parts.values():
        for title, (body, notes) in p.get("sections", {}).items():
            lines.append(tables.section(title, run["command"], body, notes,
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


def describe_machine(device):
    """The machine line of the report: CPU, GPU, and the versions the figures depend on."""
    import platform
    from importlib import metadata

    import numpy
    import torch

    versions = []
    for dist in ("fairseq-fixed", "fairseq"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
            break
        except metadata.PackageNotFoundError:
            pass
    line = (f"{tables.machine()}, Python {platform.python_version()}, numpy {numpy.__version__}, "
            + (", ".join(versions) or "no fairseq distribution"))
    if device == "cuda":
        import triton

        memory = torch.cuda.get_device_properties(0).total_memory / 2**30
        line += f", CUDA {torch.version.cuda}, triton {triton.__version__}, {memory:.0f} GiB"
    return line
