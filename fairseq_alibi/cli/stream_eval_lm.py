"""``fairseq-alibi eval-lm-stream``: fairseq-eval-lm that scores each token once, streaming.

    fairseq-alibi eval-lm-stream DATA --path CKPT [--gen-subset test] [--stream-chunk 64]
        [--model-overrides "{'alibi_window_cutoff': 8}"] [--cpu] [fairseq-eval-lm's options]

The split is read as one stream, exactly as ``fairseq-eval-lm --sample-break-mode none`` reads
it in blocks (fairseq's own dataset: the first input token is the end-of-sentence symbol, the
target of input ``t`` is token ``t + 1``, every token of the split is a target once), and goes
through the model ``--stream-chunk`` tokens per forward call under
:func:`fairseq_alibi.modules.streaming.stream_states`: every ALiBi self-attention keeps the
keys of the tokens before (all of them, or with ``--alibi-window-cutoff T`` the last
``max_h W_h``, those its windows reach, and with ``--alibi-window-sinks S`` the first ``S``), so each token is scored once with every earlier token
the model can see as its context, at the cost of cached decoding. The stride-1 sliding window
(``fairseq-eval-lm --tokens-per-sample 1 --context-window L-1``) scores the same tokens with
``L - 1`` earlier ones at one forward pass of ``L`` tokens per scored token.

Scoring is fairseq's own (``fairseq_cli.eval_lm.eval_lm``: ``--output-word-probs``,
``--output-word-stats``, ``--post-process`` work, per chunk), and so are the last lines, which
tools reading fairseq-eval-lm's output (:func:`fairseq_alibi.cli.sweep.parse_eval_output`)
read: ``Evaluated N tokens in Xs (Y tokens/s)`` (``N``: the split's tokens, as fairseq-eval-lm
counts them) and ``Loss (base 2): ..., Perplexity: ...``. Only causal ALiBi language models
stream (the stream is their definition); anything else is a one-line error.
"""

import contextlib
import logging
import os
import sys
from typing import Iterator, List, Optional

import torch

from fairseq_alibi.cli.checkpoint_io import not_a_language_model
from fairseq_alibi.config_access import overrides_dict
from fairseq_alibi.error_hints import (overrides_not_a_dict, raised_by_plugin,
                                       translation_dictionaries)
from fairseq_alibi.modules.streaming import stream_states, streamed_attentions
from fairseq_alibi.paths import user_dir

PROG = "fairseq-alibi eval-lm-stream"
#: tokens per forward call unless --stream-chunk says otherwise
DEFAULT_CHUNK = 64


class StreamError(SystemExit):
    """Bad input: exits with its one line (what is wrong and the fix) on stderr."""

    def __init__(self, message: str):
        super().__init__(f"{PROG}: error: {message}")


def build_parser():
    from fairseq import options

    parser = options.get_eval_lm_parser(default_task="language_modeling")
    parser.prog = PROG
    parser.add_argument("--stream-chunk", type=int, default=DEFAULT_CHUNK, metavar="N",
                        help="tokens per forward call of the stream (1: token by token, as a "
                        "decoder generates; the scores are the same for every N)")
    return parser


def parse_args(argv: Optional[List[str]] = None):
    """fairseq-eval-lm's arguments plus ``--stream-chunk``; ``--user-dir`` is this plugin's
    unless given."""
    from fairseq import options

    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--user-dir" or a.startswith("--user-dir=") for a in argv):
        argv += ["--user-dir", user_dir()]
    if any(a.startswith("--tokens-per-sample") for a in argv):
        raise StreamError("--tokens-per-sample: the split is scored as one stream, every token "
                          "with every earlier one; drop --tokens-per-sample")
    args = options.parse_args_and_arch(build_parser(), argv)
    check_args(args)
    return args


def check_args(args):
    """The options streaming cannot honour, each a one-line error naming the fix."""
    if args.stream_chunk < 1:
        raise StreamError(f"--stream-chunk must be at least 1 token, got {args.stream_chunk}")
    if getattr(args, "context_window", 0):
        raise StreamError("--context-window: the stream already gives each token every earlier "
                          "one the model sees; drop --context-window")
    if getattr(args, "sample_break_mode", "none") not in (None, "none"):
        raise StreamError(f"--sample-break-mode {args.sample_break_mode}: the split is scored "
                          "as one stream; drop --sample-break-mode (or give none)")
    if getattr(args, "add_bos_token", False):
        raise StreamError("--add-bos-token: the stream has one beginning, not one per block; "
                          "drop --add-bos-token")


def stream_samples(source, target, chunk: int) -> Iterator[dict]:
    """fairseq-eval-lm's samples of one stream (``source``/``target``: ``(N,)`` token ids), one
    chunk of ``chunk`` tokens each, in order."""
    for index, start in enumerate(range(0, source.numel(), chunk)):
        tokens = source[start:start + chunk][None]
        yield {"id": torch.tensor([index]), "nsentences": 1, "ntokens": tokens.numel(),
               "net_input": {"src_tokens": tokens,
                             "src_lengths": torch.tensor([tokens.numel()])},
               "target": target[start:start + chunk][None]}


def split_tokens(data, subset: str, error=StreamError) -> int:
    """The tokens of split ``subset`` of the binarized folder ``data``; a missing or empty split
    is ``error(message)`` (the calling tool's one line)."""
    from fairseq_alibi.cli.sweep import split_token_count

    first_shard = os.path.join(str(data).split(os.pathsep)[0], subset)
    # fairseq cannot map an empty split's file (it fails with "cannot mmap an empty file")
    empty = os.path.isfile(first_shard + ".bin") and os.path.getsize(first_shard + ".bin") == 0
    tokens = 0 if empty else split_token_count(data, subset)
    if tokens is None:
        pairs = translation_dictionaries(str(data).split(os.pathsep)[0])
        if pairs:
            raise error(f"{data} is a translation folder ({', '.join(pairs)}, splits such as "
                        f"{subset}.SRC-TGT.SRC.bin): give the folder of a language model's "
                        "data (fairseq-preprocess --only-source: dict.txt)")
        raise error(f"no split {subset!r} in {data}: give --gen-subset a split "
                    "that fairseq-preprocess wrote there")
    if tokens == 0:
        raise error(f"the split {subset!r} of {data} holds no tokens: give "
                    "--gen-subset a split with text")
    return tokens


def split_as_one_block(cfg, subset: str, error=StreamError):
    """``(task, source, target)``: the task, and split ``subset`` read by its dataset as one
    block of all its tokens (``--sample-break-mode none``), of which fairseq-eval-lm's blocks
    are pieces. A missing or empty split is ``error(message)`` (the calling tool's one line)."""
    from fairseq import tasks

    cfg.task.tokens_per_sample = split_tokens(cfg.task.data, subset, error)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(subset)
    item = task.dataset(subset)[0]
    return task, item["source"], item["target"]


#: what eval-lm-stream scores, said when a checkpoint holds something else
STREAMED_MODELS = ("streaming scores causal ALiBi language models (alibi_transformer_lm); give "
                   "one with --path")


def load_models(cfg, task):
    """The ensemble of ``--path``, loaded as fairseq-eval-lm loads it, each checked to be a
    causal ALiBi language model."""
    from fairseq import checkpoint_utils

    paths = cfg.common_eval.path.split(":")
    overrides = overrides_dict(cfg.common_eval.model_overrides)  # read, never run
    if overrides is None:
        raise StreamError(overrides_not_a_dict(cfg.common_eval.model_overrides))
    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            paths, arg_overrides=overrides,
            suffix=cfg.checkpoint.checkpoint_suffix, task=task)
    except Exception as exc:  # a checkpoint of another kind fails deep in fairseq: name it
        for path in paths:
            wrong = not_a_language_model(path, STREAMED_MODELS)
            if wrong:
                raise StreamError(wrong) from exc
        if isinstance(exc, ValueError) and raised_by_plugin(exc):
            # the plugin's own option check (e.g. a bad load-time override): its line is the fix
            raise StreamError(str(exc)) from exc
        raise
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    for model in models:
        try:
            streamed_attentions(model)
        except ValueError as exc:
            fork = next(filter(None, (not_a_language_model(p, STREAMED_MODELS, forks=True)
                                       for p in paths)),
                        None)
            raise StreamError(fork or f"{cfg.common_eval.path}: {exc}; score it with "
                              "fairseq-eval-lm") from None
        if cfg.common.fp16:
            model.half()
        if use_cuda:
            model.cuda()
        model.prepare_for_inference_(cfg)
    return models, task


def main(argv=None):
    from fairseq import utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import eval_lm as fairseq_eval_lm  # its logging: fairseq-eval-lm's lines

    args = parse_args(argv)
    chunk = args.stream_chunk  # not a field of fairseq's config
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    logger = logging.getLogger("fairseq_cli.eval_lm")
    subset = cfg.dataset.gen_subset
    for path in cfg.common_eval.path.split(":"):  # the model's kind before its data's
        wrong = not_a_language_model(path, STREAMED_MODELS, forks=True)
        if wrong:
            raise StreamError(wrong)
    task, source, target = split_as_one_block(cfg, subset)
    models, task = load_models(cfg, task)
    logger.info(f"{cfg.task.data} {subset}: {target.numel():,} tokens as one stream, "
                f"{chunk} per forward call")
    with contextlib.ExitStack() as streams:
        for model in models:
            streams.enter_context(stream_states(model))
        try:
            results = fairseq_eval_lm.eval_lm(
                models=models, source_dictionary=task.source_dictionary,
                batch_iterator=stream_samples(source, target, chunk),
                post_process=cfg.common_eval.post_process,
                output_word_probs=cfg.eval_lm.output_word_probs,
                output_word_stats=cfg.eval_lm.output_word_stats,
                target_dictionary=task.target_dictionary,
                softmax_batch=cfg.eval_lm.softmax_batch)
        except ValueError as exc:  # the plugin's refusal of a call (e.g. a named backend that
            if not raised_by_plugin(exc):  # serves no KV cache): its line is the fix
                raise
            raise StreamError(f"{cfg.common_eval.path}: {exc}") from None
    logger.info("Loss (base 2): {:.4f}, Perplexity: {:.2f}".format(results["loss"],
                                                                 results["perplexity"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
