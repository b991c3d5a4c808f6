"""A pytest plugin that records every test's outcome the moment it is reported.

``PYTEST_RECORD=FILE python -m pytest -p benchmarks.pytest_record ...`` appends one JSON line per
test report to FILE (test id, phase, outcome, seconds, the failure's or skip's one-line message),
so a run stopped at a time limit still says what passed and what failed, and which failed first.
Under pytest-xdist only the controller writes (it receives every worker's reports, including
the "worker crashed" report of a worker that died).
"""

import json
import os


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else None


#: whether this process is a pytest-xdist worker of its run (set when pytest configures it; the
#: environment cannot tell: a pytest started by a test inherits its worker's variables)
_WORKER = False


def pytest_configure(config):
    global _WORKER
    _WORKER = hasattr(config, "workerinput")


def _write(test, when, outcome, seconds, message):
    path = os.environ.get("PYTEST_RECORD")
    if not path or _WORKER:
        return
    line = {"test": test, "when": when, "outcome": outcome, "seconds": round(seconds, 3),
            "message": message and message[:1000]}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def pytest_runtest_logreport(report):
    if report.passed and report.when != "call":
        return  # a passing setup or teardown says nothing
    _write(report.nodeid, report.when, report.outcome, report.duration,
           None if report.passed else _message(report))


def pytest_collectreport(report):
    if report.failed:  # a test file that does not even import
        _write(report.nodeid or "(collection)", "collect", "failed", 0, _message(report))
