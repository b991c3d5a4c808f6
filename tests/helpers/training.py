"""Tiny fairseq-train runs: the causal LM and the ALiBi encoder at test dimensions (deterministic,
so two runs compare bit for bit), one process or several (CPU distributed), and what their logs
say."""

import json
import re
import socket
import subprocess

from tests.helpers.cli import BIN, child_env, run_cli


COMMON = ["--cpu", "--num-workers", 0, "--no-progress-bar", "--log-format", "json",
          "--log-interval", 1, "--seed", 1, "--optimizer", "adam", "--lr", 0.003,
          "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 5, "--disable-validation"]


MODELS = {
    "lm": ["--task", "language_modeling", "--arch", "alibi_transformer_lm",
           "--decoder-layers", 2, "--decoder-embed-dim", 32, "--decoder-ffn-embed-dim", 64,
           "--decoder-attention-heads", 4, "--decoder-input-dim", 32, "--decoder-output-dim", 32,
           "--tokens-per-sample", 16,
           "--sample-break-mode", "none", "--max-tokens", 128],
    "encoder": ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "alibi_roberta_base",
                "--encoder-layers", 2, "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
                "--encoder-attention-heads", 4, "--alibi-variant", "offset",
                "--tokens-per-sample", 16, "--batch-size", 8],
}


#: MODELS' tiny sizes with the stock architectures (checkpoints the plugin must refuse or name)
STOCK = {
    "lm": [*MODELS["lm"], "--arch", "transformer_lm"],
    "encoder": ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta_base",
                "--encoder-layers", 2, "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
                "--encoder-attention-heads", 4, "--tokens-per-sample", 16, "--batch-size", 8],
}


def train_args(model, data, user_dir, save_dir, *extra):
    return [data, "--user-dir", user_dir, *MODELS[model], *COMMON, "--save-dir", save_dir, *extra]


def train(model, data, user_dir, save_dir, *extra, **kwargs):
    """fairseq-train of ``model`` ("lm" or "encoder"); returns its output."""
    return run_cli("fairseq-train", *train_args(model, data, user_dir, save_dir, *extra), **kwargs)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def distributed_flags(world_size, rank, port, ddp_backend="legacy_ddp"):
    """The CPU recipe: every worker started by hand, rendezvous over TCP, gloo all-reduce."""
    return ["--distributed-world-size", world_size, "--distributed-rank", rank,
            "--distributed-no-spawn", "--distributed-init-method", f"tcp://127.0.0.1:{port}",
            "--distributed-backend", "gloo", "--ddp-backend", ddp_backend]


def train_distributed(model, data, user_dir, save_dir, *extra, world_size=2,
                      ddp_backend="legacy_ddp", timeout=600, rank_extra=None, expect_ok=True):
    """``world_size`` fairseq-train workers on this machine (``rank_extra``: ``{rank: flags}``
    one worker adds); returns rank 0's output (every worker's, ``[(status, output)]``, with
    ``expect_ok=False``)."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        args = train_args(model, data, user_dir, save_dir, *extra,
                          *(rank_extra or {}).get(rank, ()),
                          *distributed_flags(world_size, rank, port, ddp_backend))
        procs.append(subprocess.Popen(
            [str(BIN / "fairseq-train")] + [str(a) for a in args], env=child_env(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:  # never leave a worker behind when another one failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if not expect_ok:
        return [(proc.returncode, out) for proc, out in zip(procs, outputs)]
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"worker {rank} failed ({proc.returncode}):\n{out[-5000:]}"
    return outputs[0]


def logged_losses(output):
    """``[(num_updates, loss)]`` of every ``train_inner`` line fairseq printed (json format)."""
    found = []
    for line in output.splitlines():
        if "| train_inner |" in line:
            stats = json.loads(line.split("| train_inner |", 1)[1])
            found.append((int(stats["num_updates"]), stats["loss"]))
    return found


def loaded_at(output):
    """The update count of the checkpoint fairseq-train resumed from (None: started afresh)."""
    found = re.search(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)", output)
    return int(found.group(1)) if found else None
