"""What the tests share: fairseq's real command lines, tiny models and training runs, tiny data,
and the float64 references the models are checked against.

Fixtures (the session-wide tiny corpora and trained LM) are in ``conftest.py``; everything else
a test file imports from here, never from another test file (tests/test_layout.py checks).
"""

import copy
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import fairseq_alibi  # noqa: F401  (registers the models for the in-process builds)

# ---------------------------------------------------------------------------------------------
# running fairseq's real command lines


REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
BIN = Path(sys.executable).parent  # fairseq-* console scripts of this environment


def user_dir() -> str:
    """What users pass to --user-dir (``python -m fairseq_alibi --user-dir``)."""
    out = subprocess.run(
        [sys.executable, "-m", "fairseq_alibi", "--user-dir"],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def run_cli(tool, *args, cwd=None, expect_ok=True, timeout=600, env=None):
    """Run a fairseq console script (``fairseq-train`` ...) and return its combined output."""
    cmd = [str(BIN / tool)] + [str(a) for a in args]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    full_env.update(env or {})
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env
    )
    out = proc.stdout + proc.stderr
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-6000:]}")
    if not expect_ok and proc.returncode == 0:
        raise AssertionError(f"{' '.join(cmd)} was expected to fail:\n{out[-3000:]}")
    return out


def preprocess(*args):
    """fairseq-preprocess in this process: the CLI's own parser and ``main``, for data that is
    not what a test is about (the per-call log file handler it adds is removed again)."""
    import logging

    from fairseq import options
    from fairseq_cli.preprocess import main

    log = logging.getLogger("fairseq_cli.preprocess")
    before = list(log.handlers)
    try:
        main(options.get_preprocessing_parser().parse_args([str(a) for a in args]))
    finally:
        for handler in log.handlers[len(before):]:
            log.removeHandler(handler)
            handler.close()


def write_tiny_corpus(folder: Path, seed=0, vocab=60, lines=(400, 60, 60), max_len=30):
    """Random-word text files train/valid/test.txt (word level), written by the test itself."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines):
        with open(folder / f"{split}.txt", "w") as f:
            for _ in range(n):
                f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, max_len))) + "\n")
    return folder


# ---------------------------------------------------------------------------------------------
# models built in-process exactly as fairseq-train builds them from its command line


def write_dictionary(folder: Path, vocab: int) -> Path:
    """A fairseq ``dict.txt`` of ``vocab`` words (fairseq adds its 4 specials)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "dict.txt", "w") as f:
        for i in range(vocab):
            f.write(f"w{i} {vocab - i}\n")
    return folder


_COMPOSED = {}  # the parsed options -> fairseq's config (see training_config)


def training_config(argv):
    """fairseq's config for a fairseq-train command line, as fairseq-train builds it: parsed by
    fairseq's parser every call, then composed by hydra (a second or more per call, most of an
    in-process test's time) once per distinct set of parsed options, and copied."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parsed = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])
    key = repr(sorted(vars(parsed).items()))
    if key not in _COMPOSED:
        _COMPOSED[key] = convert_namespace_to_omegaconf(parsed)
    return copy.deepcopy(_COMPOSED[key])


def setup_from_command_line(data, *args):
    """``(cfg, task)`` for fairseq-train arguments (after the data folder)."""
    from fairseq import tasks

    cfg = training_config([data, *args])
    return cfg, tasks.setup_task(cfg.task)


def build_from_command_line(data, *args):
    """``(model, task)`` for fairseq-train arguments (after the data folder)."""
    cfg, task = setup_from_command_line(data, *args)
    return task.build_model(cfg.model), task


# ---------------------------------------------------------------------------------------------
# tiny fairseq-train runs (the causal LM and the ALiBi encoder at test dimensions; deterministic, so two runs compare bit for bit)


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


def train_args(model, data, user_dir, save_dir, *extra):
    return [data, "--user-dir", user_dir, *MODELS[model], *COMMON, "--save-dir", save_dir, *extra]


def train(model, data, user_dir, save_dir, *extra, **kwargs):
    """fairseq-train of ``model`` ("lm" or "encoder"); returns its output."""
    return run_cli("fairseq-train", *train_args(model, data, user_dir, save_dir, *extra), **kwargs)


#: MODELS' tiny sizes with the stock architectures (checkpoints the plugin must refuse or name)
STOCK = {
    "lm": [*MODELS["lm"], "--arch", "transformer_lm"],
    "encoder": ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta_base",
                "--encoder-layers", 2, "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
                "--encoder-attention-heads", 4, "--tokens-per-sample", 16, "--batch-size", 8],
}


def last_line(output):
    """The last non-empty line a command printed (where the plugin puts its one-line fix)."""
    return output.strip().splitlines()[-1]


def snapshot(folder):
    """Name -> bytes of every file in ``folder``: equal before and after = nothing written."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def child_env(**extra):
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                **extra)


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
                      ddp_backend="legacy_ddp", timeout=600):
    """``world_size`` fairseq-train workers on this machine; returns rank 0's output."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        args = train_args(model, data, user_dir, save_dir, *extra,
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


def build_model(model, data, *extra):
    """``(model, task)`` of ``model`` ("lm" or "encoder") built in this process, as fairseq-train
    would from the same flags (``extra`` overrides them, e.g. ``--alibi-variant symmetric``)."""
    cfg, task = setup_from_command_line(data, *MODELS[model], "--cpu", *extra)
    return task.build_model(cfg.model), task


def decode_token_by_token(model, tokens):
    """``(B, T, V)``: the decoder's output for ``tokens`` ``(B, T)``, one new token per call
    through fairseq's incremental state (the KV cache), as a generator decodes; equals the full
    forward pass."""
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1]
             for t in range(tokens.size(1))]
    return torch.stack(steps, 1)


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def max_weight_difference(a, b):
    """Largest absolute difference between the weights of two checkpoints (same keys)."""
    assert a["model"].keys() == b["model"].keys()
    return max((a["model"][k].double() - b["model"][k].double()).abs().max().item()
               for k in a["model"] if a["model"][k].numel())


def train_loss(state):
    """The exact training loss meters a checkpoint holds: (last update, epoch average)."""
    meters = {name: meter for _, name, _, meter in dict(state["extra_state"]["metrics"])["train"]}
    loss = meters["loss"]
    return float(loss["val"]), float(loss["sum"]) / float(loss["count"])


def python_module(*args, expect_ok=True):
    """``python -m ...`` in this environment; returns (exit code, combined output)."""
    proc = subprocess.run([sys.executable, "-m", *[str(a) for a in args]], env=child_env(),
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    if expect_ok:
        assert proc.returncode == 0, out[-3000:]
    return proc.returncode, out


# ---------------------------------------------------------------------------------------------
# tiny inputs in the real formats of the public corpora (GPT-2 BPE files, WikiText, Pile shards, GLUE folders), written by the tests themselves


WORDS = ("the cat sat on a mat and then the dog ran in at her , . where is it "
         "café über naïve 東京 zebra quantum").split()
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("a", "t"), ("Ġ", "c"), ("Ġc", "at"),
          ("i", "n"), ("Ġ", "a"), ("o", "n"), ("e", "r")]
PILE_SETS = ("Pile-CC", "Wikipedia (en)", "Github")


def write_tiny_bpe(folder):
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    byte_symbols = bytes_to_unicode()
    symbols = [byte_symbols[b] for b in range(256)] + [a + b for a, b in MERGES]
    (folder / "encoder.json").write_text(json.dumps({s: i for i, s in enumerate(symbols)}))
    (folder / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    return folder


def sentence(rng, low=3, high=20):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def write_wikitext(folder, seed=0, paragraphs=(60, 12, 12)):
    """WikiText's layout: `` = Heading = `` lines, blank lines, paragraphs with ``<unk>``."""
    rng = random.Random(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), paragraphs):
        lines = []
        for i in range(n):
            if i % 6 == 0:
                lines += [" \n", f" = {sentence(rng, 1, 3)} = \n", " \n"]
            words = sentence(rng, 5, 40).split()
            words[rng.randrange(len(words))] = "<unk>"
            lines.append(" " + " ".join(words) + " \n")
        (folder / f"wiki.{split}.tokens").write_text("".join(lines), encoding="utf-8")
    return folder


def pile_documents(n, seed=0, max_sentences=12):
    """Documents of a few lines each (paragraphs), spread over three Pile subsets."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        text = "\n".join(sentence(rng) for _ in range(rng.randint(1, max_sentences)))
        docs.append({"text": text, "meta": {"pile_set_name": rng.choice(PILE_SETS)}})
    return docs


def write_pile_shard(path, documents, extra_lines=(), frames=1):
    """A ``.jsonl`` or (by suffix) ``.jsonl.zst`` shard; ``extra_lines`` are appended raw.

    A ``.zst`` shard is ``frames`` zstd frames one after the other (what concatenating
    compressed files, or a multi-threaded compressor, gives).
    """
    path = Path(path)
    lines = [json.dumps(d) + "\n" for d in documents] + list(extra_lines)
    if path.suffix == ".zst":
        import zstandard

        step = -(-len(lines) // frames)
        path.write_bytes(b"".join(
            zstandard.ZstdCompressor(level=3).compress("".join(lines[i: i + step]).encode())
            for i in range(0, len(lines), step)
        ))
    else:
        path.write_text("".join(lines), encoding="utf-8")
    return path


def write_glue(root, seed=0, rows=24):
    """Every GLUE task in the download script's layout; returns what each split should hold.

    The result maps task -> fairseq split -> ``{"inputs": [[...], ...], "labels": [...]}``.
    """
    rng = random.Random(seed)
    root = Path(root)
    expected = {}

    def task_files(task, files):
        folder = root / task
        folder.mkdir(parents=True, exist_ok=True)
        for name, (header, lines) in files.items():
            text = (header + "\n" if header is not None else "") + "".join(l + "\n" for l in lines)
            (folder / f"{name}.tsv").write_text(text, encoding="utf-8")

    def s():
        return sentence(rng)

    # CoLA: source, label, original label (often empty), sentence; train/dev have no header
    cola = {}
    files = {}
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s(), rng.choice("01")) for _ in range(rows)]
        files[name] = (None, [f"gj04\t{y}\t{'*' if y == '0' else ''}\t{x}" for x, y in data])
        cola[split] = {"inputs": [[x for x, _ in data]], "labels": [y for _, y in data]}
    test = [s() for _ in range(rows // 2)]
    files["test"] = ("index\tsentence", [f"{i}\t{x}" for i, x in enumerate(test)])
    cola["test"] = {"inputs": [test], "labels": None}
    task_files("CoLA", files)
    expected["CoLA"] = cola

    # SST-2: sentence (with GLUE's trailing space), label
    sst, files = {}, {}
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s() + " ", rng.choice("01")) for _ in range(rows)]
        files[name] = ("sentence\tlabel", [f"{x}\t{y}" for x, y in data])
        sst[split] = {"inputs": [[x for x, _ in data]], "labels": [y for _, y in data]}
    test = [s() for _ in range(rows // 2)]
    files["test"] = ("index\tsentence", [f"{i}\t{x}" for i, x in enumerate(test)])
    sst["test"] = {"inputs": [test], "labels": None}
    task_files("SST-2", files)
    expected["SST-2"] = sst

    # MRPC: Quality, #1 ID, #2 ID, #1 String, #2 String (test: index first)
    mrpc, files = {}, {}
    head = "#1 ID\t#2 ID\t#1 String\t#2 String"
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s(), s(), rng.choice("01")) for _ in range(rows)]
        files[name] = ("Quality\t" + head, [f"{y}\t{100 + i}\t{200 + i}\t{a}\t{b}"
                                            for i, (a, b, y) in enumerate(data)])
        mrpc[split] = {"inputs": [[a for a, _, _ in data], [b for _, b, _ in data]],
                       "labels": [y for _, _, y in data]}
    data = [(s(), s()) for _ in range(rows // 2)]
    files["test"] = ("index\t" + head, [f"{i}\t1\t2\t{a}\t{b}" for i, (a, b) in enumerate(data)])
    mrpc["test"] = {"inputs": [[a for a, _ in data], [b for _, b in data]], "labels": None}
    task_files("MRPC", files)
    expected["MRPC"] = mrpc

    # STS-B: 7 metadata columns, sentence1, sentence2, score (test: no score)
    sts, files = {}, {}
    meta = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s(), s(), rng.choice(["0.000", "1.500", "3.800", "4.750", "5.000"]))
                for _ in range(rows)]
        files[name] = (meta + "\tscore", [f"{i}\tmain\tMSRvid\t2012\t{i:04d}\tnone\tnone\t"
                                          f"{a}\t{b}\t{y}" for i, (a, b, y) in enumerate(data)])
        sts[split] = {"inputs": [[a for a, _, _ in data], [b for _, b, _ in data]],
                      "labels": [float(y) / 5.0 for _, _, y in data]}
    data = [(s(), s()) for _ in range(rows // 2)]
    files["test"] = (meta, [f"{i}\tmain\tMSRvid\t2012\t{i:04d}\tnone\tnone\t{a}\t{b}"
                            for i, (a, b) in enumerate(data)])
    sts["test"] = {"inputs": [[a for a, _ in data], [b for _, b in data]], "labels": None}
    task_files("STS-B", files)
    expected["STS-B"] = sts

    # QQP: id, qid1, qid2, question1, question2, is_duplicate (test: id, q1, q2)
    qqp, files = {}, {}
    for name, split in (("train", "train"), ("dev", "valid")):
        data = [(s(), s(), rng.choice("01")) for _ in range(rows)]
        files[name] = ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                       [f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{y}"
                        for i, (a, b, y) in enumerate(data)])
        qqp[split] = {"inputs": [[a for a, _, _ in data], [b for _, b, _ in data]],
                      "labels": [y for _, _, y in data]}
    data = [(s(), s()) for _ in range(rows // 2)]
    files["test"] = ("id\tquestion1\tquestion2", [f"{i}\t{a}\t{b}" for i, (a, b) in enumerate(data)])
    qqp["test"] = {"inputs": [[a for a, _ in data], [b for _, b in data]], "labels": None}
    task_files("QQP", files)
    expected["QQP"] = qqp

    # MNLI: 8 metadata/parse columns, sentence1, sentence2, then label1 (+ label2-5 in dev)
    # and gold_label last; label1 disagrees with gold_label now and then
    nli = ("contradiction", "entailment", "neutral")
    lead = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
            "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")
    mnli, files = {}, {}
    for name, split, votes in (("train", "train", 1), ("dev_matched", "valid", 5),
                               ("dev_mismatched", "valid1", 5)):
        data = [(s(), s(), rng.choice(nli), rng.choice(nli)) for _ in range(rows)]
        labels = "\t".join(f"label{k + 1}" for k in range(votes))
        files[name] = (f"{lead}\t{labels}\tgold_label",
                       [f"{i}\t{i}\t{i}n\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t{a}\t{b}\t"
                        + "\t".join([first] + [gold] * (votes - 1)) + f"\t{gold}"
                        for i, (a, b, first, gold) in enumerate(data)])
        mnli[split] = {"inputs": [[a for a, _, _, _ in data], [b for _, b, _, _ in data]],
                       "labels": [g for _, _, _, g in data]}
    for name, split in (("test_matched", "test"), ("test_mismatched", "test1")):
        data = [(s(), s()) for _ in range(rows // 2)]
        files[name] = (lead, [f"{i}\t{i}\t{i}n\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t{a}\t{b}"
                              for i, (a, b) in enumerate(data)])
        mnli[split] = {"inputs": [[a for a, _ in data], [b for _, b in data]], "labels": None}
    task_files("MNLI", files)
    expected["MNLI"] = mnli

    # QNLI and RTE: index, two texts, label (test: no label)
    for task, header in (("QNLI", "index\tquestion\tsentence"), ("RTE", "index\tsentence1\tsentence2")):
        out, files = {}, {}
        for name, split in (("train", "train"), ("dev", "valid")):
            data = [(s(), s(), rng.choice(("entailment", "not_entailment"))) for _ in range(rows)]
            files[name] = (header + "\tlabel", [f"{i}\t{a}\t{b}\t{y}" for i, (a, b, y) in enumerate(data)])
            out[split] = {"inputs": [[a for a, _, _ in data], [b for _, b, _ in data]],
                          "labels": [y for _, _, y in data]}
        data = [(s(), s()) for _ in range(rows // 2)]
        files["test"] = (header, [f"{i}\t{a}\t{b}" for i, (a, b) in enumerate(data)])
        out["test"] = {"inputs": [[a for a, _ in data], [b for _, b in data]], "labels": None}
        task_files(task, files)
        expected[task] = out
    return expected


# ---------------------------------------------------------------------------------------------
# checkpoints written in this process, and hydra configs composed as fairseq-hydra-train does


def saved_in_process(path, data, *flags):
    """A fairseq checkpoint of a model built in this process from fairseq-train flags
    (untrained: these tests only need files fairseq reads as it reads a trained one)."""
    from omegaconf import OmegaConf

    cfg, task = setup_from_command_line(data, "--cpu", *flags)
    model = task.build_model(cfg.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": {},
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                               "optimizer_name": "Adam", "lr_scheduler_state": {},
                               "num_updates": 0}],
        "task_state": {},
        "extra_state": {},
        "last_optimizer_state": None,
    }, path)
    return path


def compose(config_dir, name, overrides=()):
    """Compose a config as fairseq-hydra-train does (fairseq's ConfigStore schema, then the
    registered dataclasses' defaults), without running it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import fairseq_alibi.hydra_support  # noqa: F401  (the resolver, as hydra's callback would)
    from fairseq.dataclass.initialize import add_defaults, hydra_init

    hydra_init(name)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.1"):
        cfg = hydra_compose(config_name=name, overrides=list(overrides))
    add_defaults(cfg)
    return cfg


# ---------------------------------------------------------------------------------------------
# float64 references written from the definitions: the encoder's bias, one attention layer with
# learned slope scales


def naive_slopes(variant, heads):
    """2^(-8k/n), k = 1..n, with n = H (n = H/2 per half for one_sided)."""
    n = heads // 2 if variant == "one_sided" else heads
    return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)] * (heads // n)


def naive_bias(variant, h, heads, i, j, m, ratio):
    """The bias of one (head, query, key) from the definitions; None = the key is invisible."""
    if variant == "symmetric":
        return -m * abs(i - j)
    if variant == "offset":
        return -m * (i - j) if j <= i else -m * (j - i - 0.5)
    if variant == "asymmetric":
        return -m * (i - j) if j <= i else -m * ratio * (j - i)
    if variant == "one_sided":
        looks_ahead = h >= heads // 2
        if (looks_ahead and j < i) or (not looks_ahead and j > i):
            return None
        return -m * abs(i - j)
    raise AssertionError(variant)


def scaled_bias(heads, layers, variant, mode, init=1.0, ratio=1.0):
    """An AlibiBias with learned scales set away from 1, so that every scale counts."""
    from fairseq_alibi.modules.bias import AlibiBias

    alibi = AlibiBias(heads, variant=variant, future_slope_ratio=ratio, num_layers=layers,
                      learned_scales=mode, scale_init=init)
    with torch.no_grad():
        torch.manual_seed(7)
        alibi.scales.uniform_(0.3, 3.0)
    return alibi


#: the references' finite stand-in for -inf: a row with no visible key stays finite, as the
#: module's does
MASKED = -1e9


def reference_bias(variant, slopes, future, T, global_tokens=0):
    """``(H, T, T)`` float64 bias straight from the table of fairseq_alibi/alibi.py; MASKED where
    hidden. ``slopes``/``future`` float64 ``(H,)`` (differentiable). The first
    ``global_tokens`` positions get bias 0 as queries and as keys (causality kept)."""
    slopes = torch.as_tensor(slopes, dtype=torch.float64)
    i = torch.arange(T, dtype=torch.float64)[:, None]
    j = torch.arange(T, dtype=torch.float64)[None, :]
    d = (i - j)[None]  # i - j
    m = slopes[:, None, None]
    inf = torch.tensor(MASKED, dtype=torch.float64)
    if variant == "causal":
        bias = torch.where(d >= 0, -m * d, inf)
    elif variant == "symmetric":
        bias = -m * d.abs()
    elif variant == "offset":
        bias = torch.where(d >= 0, -m * d, -m * (-d - 0.5))
    elif variant == "asymmetric":
        future = torch.as_tensor(future, dtype=torch.float64)
        bias = torch.where(d >= 0, -m * d, -future[:, None, None] * (-d))
    else:  # one_sided: the first half of the heads look back, the rest ahead
        ahead = (torch.arange(len(slopes)) >= len(slopes) // 2)[:, None, None]
        hidden = torch.where(ahead, d > 0, d < 0)
        bias = torch.where(hidden, inf, -m * d.abs())
    if global_tokens:
        exempt = ((i < global_tokens) | (j < global_tokens))[None]
        zero = inf if variant == "causal" else torch.tensor(0.0, dtype=torch.float64)
        bias = torch.where(exempt, torch.where(d >= 0, 0.0, zero), bias)
    return bias


def reference_module_attention(attn, x, bias, key_padding_mask=None):
    """What AlibiMultiheadAttention ``attn`` computes for ``x`` ``(T, B, C)`` with the float64
    ``bias`` ``(H, T, T)`` (-inf for hidden keys): softmax(QKᵀ/√d + bias) V, from its weights."""
    x = x.double()
    T, B, C = x.shape
    H, D = attn.num_heads, attn.head_dim
    w = {n: p.detach().double() for n, p in attn.named_parameters()}

    def proj(name):
        return (x @ w[f"{name}.weight"].T + w[f"{name}.bias"]).view(T, B, H, D)

    q, k, v = proj("q_proj"), proj("k_proj"), proj("v_proj")
    scores = torch.einsum("ibhd,jbhd->bhij", q, k) / D**0.5 + bias
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], MASKED)
    out = torch.einsum("bhij,jbhd->ibhd", torch.softmax(scores, -1), v).reshape(T, B, C)
    return out @ w["out_proj.weight"].T + w["out_proj.bias"]


def reference_scaled_attention(attn, x, scales, layer, variant, ratio, key_padding_mask=None):
    """:func:`reference_module_attention` with the bias ``s[layer, h]·bias_h`` of ``variant``;
    differentiable in ``scales``."""
    from fairseq_alibi.alibi import variant_slopes

    row = scales[layer if scales.size(0) > 1 else 0]
    slopes = variant_slopes(attn.num_heads, variant).double() * row
    bias = reference_bias(variant, slopes, slopes * ratio, x.size(0))
    return reference_module_attention(attn, x, bias, key_padding_mask)


# ---------------------------------------------------------------------------------------------
# alibi_transformer (translation) in process at test dimensions, and its float64 reference


TRANSLATION_DIM, TRANSLATION_HEADS = 32, 4
SRC_WORDS, TGT_WORDS = 20, 24
TINY_TRANSLATION = [
    "--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", TRANSLATION_DIM,
    "--decoder-embed-dim", TRANSLATION_DIM, "--encoder-ffn-embed-dim", 64,
    "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", TRANSLATION_HEADS,
    "--decoder-attention-heads", TRANSLATION_HEADS]


def write_translation_dictionaries(folder, src_words=SRC_WORDS, tgt_words=TGT_WORDS):
    """``dict.src.txt`` and ``dict.tgt.txt``: all the translation task reads to build a model."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang, words in (("src", src_words), ("tgt", tgt_words)):
        (folder / f"dict.{lang}.txt").write_text(
            "".join(f"{lang}{i} {100 - i}\n" for i in range(words)))
    return folder


def build_translation(data, *extra, arch="alibi_transformer", perturb=True, seed=0):
    """``(model in eval mode, task)``: the TINY_TRANSLATION model of ``arch`` with ``extra``
    flags; ``perturb`` moves its biases and layer-norm affines away from their init."""
    cfg, task = setup_from_command_line(
        data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
        "--arch", arch, *TINY_TRANSLATION, *extra)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    if perturb:  # non-zero biases and layer-norm affines, so that every term counts
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias") or "layer_norm" in name:
                    p.add_(torch.randn_like(p) * 0.1)
    return model.eval(), task


def token_sentences(task, lengths, side="src", seed=0):
    """Random sentences of the given lengths (token tensors, ``</s>`` appended)."""
    d = task.source_dictionary if side == "src" else task.target_dictionary
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(d.nspecial, len(d), (n,), generator=g),
                       torch.tensor([d.eos()])]) for n in lengths]


def translation_batch(task, sources, targets):
    """fairseq's translation batch: sources padded on the left, targets on the right."""
    from fairseq.data import data_utils

    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    src = data_utils.collate_tokens(sources, pad, eos, left_pad=True)
    prev = data_utils.collate_tokens(targets, pad, eos, left_pad=False,
                                     move_eos_to_beginning=True)
    lengths = torch.tensor([len(s) for s in sources])
    return src, lengths, prev


def reference_attention(x, keys, w, prefix, bias):
    """Multi-head attention in float64; ``bias`` (H, T, S) with -inf for hidden keys."""
    T, S = x.size(0), keys.size(0)
    H, D = TRANSLATION_HEADS, TRANSLATION_DIM // TRANSLATION_HEADS
    q = (x @ w[f"{prefix}.q_proj.weight"].T + w[f"{prefix}.q_proj.bias"]).view(T, H, D)
    k = (keys @ w[f"{prefix}.k_proj.weight"].T + w[f"{prefix}.k_proj.bias"]).view(S, H, D)
    v = (keys @ w[f"{prefix}.v_proj.weight"].T + w[f"{prefix}.v_proj.bias"]).view(S, H, D)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D) + bias
    out = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v).reshape(T, H * D)
    return out @ w[f"{prefix}.out_proj.weight"].T + w[f"{prefix}.out_proj.bias"]


def _layer_norm(x, w, name):
    return F.layer_norm(x, (TRANSLATION_DIM,), w[f"{name}.weight"], w[f"{name}.bias"])


def _ffn(x, w, p):
    return torch.relu(x @ w[f"{p}.fc1.weight"].T + w[f"{p}.fc1.bias"]) @ w[f"{p}.fc2.weight"].T \
        + w[f"{p}.fc2.bias"]


def translation_bias_matrix(variant, n_queries, n_keys, ratio=1.0):
    """The ALiBi bias from its definition, on positions 0..n-1 of an *unpadded* sentence."""
    heads = TRANSLATION_HEADS
    bias = torch.zeros(heads, n_queries, n_keys, dtype=torch.float64)
    slopes = naive_slopes("causal" if variant == "causal" else variant, heads)
    for h in range(heads):
        for i in range(n_queries):
            for j in range(n_keys):
                if variant == "causal":
                    b = -slopes[h] * (i - j) if j <= i else None
                else:
                    b = naive_bias(variant, h, heads, i, j, slopes[h], ratio)
                bias[h, i, j] = float("-inf") if b is None else b
    return bias


def stock_cross_attention(layer, y, x, w, prefix):
    """The stock cross-attention of the reference: no position bias."""
    return reference_attention(
        y, x, w, prefix, torch.zeros(TRANSLATION_HEADS, len(y), len(x), dtype=torch.float64))


def reference_translation_logits(model, source, prev_output, variant, ratio=1.0,
                                 cross_attention=stock_cross_attention):
    """Post-norm transformer (ReLU, scaled embeddings) written out in float64 for ONE sentence
    pair, no padding anywhere: (target length, vocabulary) logits. ``cross_attention(layer,
    y, x, w, prefix)``: decoder layer ``layer``'s attention of states ``y`` to the source ``x``."""
    w = {n: p.detach().double() for n, p in model.named_parameters()}
    w.update({n: b.double() for n, b in model.named_buffers()})
    x = math.sqrt(TRANSLATION_DIM) * w["encoder.embed_tokens.weight"][source]
    enc_bias = translation_bias_matrix(variant, len(source), len(source), ratio)
    for n in range(2):
        p = f"encoder.layers.{n}"
        x = _layer_norm(x + reference_attention(x, x, w, f"{p}.self_attn", enc_bias), w,
                        f"{p}.self_attn_layer_norm")
        x = _layer_norm(x + _ffn(x, w, p), w, f"{p}.final_layer_norm")
    y = math.sqrt(TRANSLATION_DIM) * w["decoder.embed_tokens.weight"][prev_output]
    dec_bias = translation_bias_matrix("causal", len(prev_output), len(prev_output))
    for n in range(2):
        p = f"decoder.layers.{n}"
        y = _layer_norm(y + reference_attention(y, y, w, f"{p}.self_attn", dec_bias), w,
                        f"{p}.self_attn_layer_norm")
        y = _layer_norm(y + cross_attention(n, y, x, w, f"{p}.encoder_attn"), w,
                        f"{p}.encoder_attn_layer_norm")
        y = _layer_norm(y + _ffn(y, w, p), w, f"{p}.final_layer_norm")
    return y @ w["decoder.output_projection.weight"].T


def assert_cached_decoding_matches_the_full_forward(model, task):
    """Decode 48 target tokens step by step (two sources of 30 and 12 tokens, a beam of 2 each,
    reordered at step 20) and compare every step's logits with the teacher-forced forward."""
    first, second = token_sentences(task, [30, 12])
    sources = [first, first, second, second]  # two sentences, a beam of 2 each
    targets = token_sentences(task, [47, 47, 47, 47], side="tgt", seed=2)
    src, lengths, prev = translation_batch(task, sources, targets)
    # beam search reorders within each sentence's beam, and may copy a hypothesis into two slots
    order = torch.tensor([1, 1, 3, 2])
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            if t == 20:
                model.decoder.reorder_incremental_state_scripting(state, order)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
                prev = prev[order]
                steps = [s[order] for s in steps]
            steps.append(model.decoder(prev[:, : t + 1], encoder_out=encoder_out,
                                       incremental_state=state)[0][:, -1])
        full = model(src[order], lengths[order], prev)[0]
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5, rtol=0)
