"""A server that imports torch and fairseq's command lines once, then forks one process per
command: ``python fairseq_alibi/cli/preload_server.py SOCKET`` (run as a file, so that it does
not import this package: a command without ``--user-dir`` must not find its models
registered). :func:`fairseq_alibi.cli.fairseq_runs.start` starts it and sends it the commands
(``FAIRSEQ_ALIBI_FORKSERVER=1``).

Each command is a forked child that runs a console script's entry point with the command's
argv, environment, folder, stdin and output file, as a new interpreter would, minus the seconds
of imports. The socket appears at ``SOCKET`` once the imports are done. Per connection: the client sends one JSON line (``entry``, ``argv``, ``env``,
``cwd``, ``output``, ``stdin``); the server answers the child's pid, then, when it has ended,
``{"code": exit code, "cpu": user + system seconds}``. The server ends when the client closes
its stdin (the client ended).
"""

import json
import os
import select
import signal
import socket
import sys

#: what the server imports once
PRELOAD = ["torch", "fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.eval_lm",
           "fairseq_cli.interactive", "fairseq_cli.preprocess"]


def run_command(request):  # in the forked child; never returns
    out = os.open(request["output"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.dup2(os.open(request["stdin"] or os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)
    sys.stdout.reconfigure(line_buffering=True)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.argv = list(request["argv"])
    code = 1
    try:
        import torch

        torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
        module, _, function = request["entry"].partition(":")
        result = getattr(__import__(module, fromlist=[function]), function)()
        code = result if isinstance(result, int) else 0
    except SystemExit as stop:  # what the interpreter does with it
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except BaseException:  # as uncaught: the hook (the package chains its hints to it)
        sys.excepthook(*sys.exc_info())
    finally:
        import atexit

        atexit._run_exitfuncs()  # what the interpreter runs at exit, then no finalization
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def handle(conn):  # in a forked handler: fork the command, wait for it, report; never returns
    try:
        request = json.loads(conn.makefile("r").readline())
        pid = os.fork()
        if pid == 0:
            conn.close()
            run_command(request)
        conn.sendall(f"{pid}\n".encode())
        _, status, usage = os.wait4(pid, 0)
        result = dict(code=os.waitstatus_to_exitcode(status),
                      cpu=usage.ru_utime + usage.ru_stime)
        conn.sendall((json.dumps(result) + "\n").encode())
    finally:
        os._exit(0)


def serve(address):
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the handlers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening = address + ".new"
    listener.bind(listening)
    listener.listen(16)
    os.rename(listening, address)  # the client connects once the address exists
    try:
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [])
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
                return  # the client ended
            if listener in ready:
                conn, _ = listener.accept()
                if os.fork() == 0:
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # it waits for its command
                    listener.close()
                    handle(conn)
                conn.close()
    finally:
        os.unlink(address)
        os.rmdir(os.path.dirname(address))  # the client's folder for it


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: its modules are not top-level names
    serve(sys.argv[1])
