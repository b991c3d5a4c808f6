"""``lm_distillation``: train a language model against a frozen teacher (Hinton et al. 2015).

For every target token, with student logits ``s``, teacher logits ``t`` and temperature ``T``::

    loss = α · CE(s, y) + (1 - α) · T² · KL(softmax(t/T) ‖ softmax(s/T))

    KL(p ‖ q) = Σ_v p_v · (log p_v - log q_v)

summed over the non-padding target tokens (``CE`` is the usual ``-log softmax(s)_y``). ``T²``
keeps the gradient of the soft term the same size whatever ``T`` (its gradient scales as
``1/T²``). The typical use is to recover a stock model converted to ALiBi
(``fairseq-alibi convert``) with the original as teacher::

    fairseq-train DATA --user-dir $(python -m fairseq_alibi --user-dir) \\
        --arch alibi_transformer_lm ... --finetune-from-model alibi.pt \\
        --criterion lm_distillation --teacher-path stock.pt --distill-alpha 0.5 \\
        --distill-temperature 2

The teacher is loaded once, put in eval mode, frozen (``requires_grad=False``, run under
``no_grad``) and held outside the criterion's module tree, so the trainer never optimises it,
never moves or casts it (the criterion places it beside the student at the first batch) and
never saves it: checkpoints hold the student only (and the teacher's *path*, in the config, to
resume). The teacher must share the task's dictionary. The reported ``nll_loss``/``ppl`` are
the student's plain cross-entropy; ``kl`` is the soft term per token, in bits.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from omegaconf import II

from fairseq_alibi.config_access import cfg_get


def distillation_terms(student_logits, teacher_logits, target, temperature, ignore_index):
    """Per-token ``(ce, kl)``, each ``(N,)`` float32 and 0 at ignored targets.

    ``student_logits``/``teacher_logits`` are ``(N, V)``, ``target`` ``(N,)``;
    ``ce = -log softmax(s)_y`` and ``kl = KL(softmax(t/T) ‖ softmax(s/T))`` (see module).
    """
    student_logits = student_logits.float()
    keep = target.ne(ignore_index)
    ce = F.cross_entropy(student_logits, target, ignore_index=ignore_index, reduction="none")
    if teacher_logits is None:
        return ce, torch.zeros_like(ce)
    log_q = F.log_softmax(student_logits / temperature, dim=-1)
    log_p = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    p = log_p.exp()
    # p·(log p - log q) is 0 where p is (a teacher logit of -inf would otherwise give NaN)
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)
    return ce, kl.masked_fill(~keep, 0.0)


def combined(ce, kl, alpha, temperature):
    """The loss of the terms :func:`distillation_terms` gives: ``α·ce + (1-α)·T²·kl`` (see
    module), per token or summed alike."""
    return alpha * ce + (1.0 - alpha) * temperature**2 * kl


def distillation_loss(student_logits, teacher_logits, target, alpha, temperature, ignore_index):
    """``(loss, ce, kl)`` summed over tokens (:func:`combined`)."""
    ce, kl = distillation_terms(student_logits, teacher_logits, target, temperature, ignore_index)
    ce, kl = ce.sum(), kl.sum()
    return combined(ce, kl, alpha, temperature), ce, kl


@dataclass
class LmDistillationConfig(FairseqDataclass):
    teacher_path: str = field(
        default="",
        metadata={"help": "checkpoint of the frozen teacher (any fairseq language model with "
                  "the task's dictionary, e.g. the stock model an ALiBi student was converted "
                  "from); give --user-dir if it is an ALiBi model"},
    )
    distill_alpha: float = field(
        default=0.5,
        metadata={"help": "weight α of the cross-entropy with the data; 1-α goes to the "
                  "teacher's soft targets (1.0 = plain cross-entropy, no teacher needed)"},
    )
    distill_temperature: float = field(
        default=2.0,
        metadata={"help": "softmax temperature T of both models in the KL term (scaled by T²)"},
    )
    sentence_avg: bool = II("optimization.sentence_avg")


def load_teacher(path: str, task):
    """The frozen teacher: loaded with the task's dictionary, in eval mode, no gradients."""
    from fairseq import checkpoint_utils

    from fairseq_alibi.models.checks import refuse_unconverted_press_checkpoint, vocabulary_size

    if not Path(path).is_file():
        raise ValueError(f"--teacher-path {path}: no checkpoint there")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    refuse_unconverted_press_checkpoint(state, f"the teacher {path}")  # else a stock model
    vocab, expected = vocabulary_size(state["model"]), len(task.target_dictionary)
    if vocab != expected:
        raise ValueError(
            f"the teacher ({path}) was trained with a dictionary of {vocab} symbols, the task's "
            f"has {expected}: distil on data binarized with the teacher's dictionary"
        )
    models, _ = checkpoint_utils.load_model_ensemble([path], task=task, state=state)
    teacher = models[0]
    if getattr(teacher.decoder, "adaptive_softmax", None) is not None:
        raise ValueError("the teacher has an adaptive softmax: lm_distillation needs the full "
                         "vocabulary distribution of both models")
    teacher.eval()
    for param in teacher.parameters():
        param.requires_grad_(False)
    return teacher


def check_teacher_length(teacher, length: int):
    """Refuse samples of ``length`` tokens that a teacher with learned position embeddings
    cannot read (past its table); sinusoidal and ALiBi teachers read any length."""
    positions = getattr(getattr(teacher, "decoder", None), "embed_positions", None)
    if not isinstance(positions, torch.nn.Embedding):  # fairseq's learned ones are Embeddings
        return
    max_len = teacher.max_positions()
    if isinstance(max_len, int) and length > max_len:
        raise ValueError(
            f"the teacher reads at most {max_len} tokens (learned position embeddings), and "
            f"samples have up to {length}: distil with --tokens-per-sample {max_len} or less")


@register_criterion("lm_distillation", dataclass=LmDistillationConfig)
class LmDistillationCriterion(FairseqCriterion):
    """``α · cross-entropy + (1-α) · T² · KL(teacher ‖ student)``; see the module docstring."""

    def __init__(self, task, teacher_path, distill_alpha, distill_temperature, sentence_avg):
        super().__init__(task)
        if not 0.0 <= distill_alpha <= 1.0:
            raise ValueError(f"--distill-alpha must lie in [0, 1], got {distill_alpha}")
        if not distill_temperature > 0:
            raise ValueError(f"--distill-temperature must be positive, got {distill_temperature}")
        self.alpha = float(distill_alpha)
        self.temperature = float(distill_temperature)
        self.sentence_avg = sentence_avg
        teacher = None
        if self.alpha < 1.0:
            if not teacher_path:
                raise ValueError("lm_distillation needs --teacher-path TEACHER.pt (or "
                                 "--distill-alpha 1.0 for plain cross-entropy)")
            teacher = load_teacher(teacher_path, task)
            args = getattr(task, "args", None)
            block = cfg_get(args, "tokens_per_sample", None)
            # every sample is a whole block with break mode none: refused before training
            if isinstance(block, int) and cfg_get(args, "sample_break_mode", None) == "none":
                check_teacher_length(teacher, block + bool(cfg_get(args, "add_bos_token", False)))
        # a plain attribute, not a submodule: never optimised, moved, cast or saved
        object.__setattr__(self, "teacher", teacher)

    def _teacher_logits(self, sample, like: torch.Tensor):
        teacher = self.teacher
        param = next(teacher.parameters())
        if param.device != like.device or (like.is_floating_point() and param.dtype != like.dtype):
            teacher.to(device=like.device, dtype=like.dtype)
        check_teacher_length(teacher, sample["net_input"]["src_tokens"].size(1))
        with torch.no_grad():
            return teacher(**sample["net_input"])[0]

    def forward(self, model, sample, reduce=True):
        decoder = getattr(model, "decoder", None)
        if getattr(decoder, "adaptive_softmax", None) is not None:
            raise ValueError("the student has an adaptive softmax: lm_distillation needs the "
                             "full vocabulary distribution of both models")
        net_output = model(**sample["net_input"])
        logits = net_output[0]
        target = model.get_targets(sample, net_output)
        teacher_logits = None
        if self.teacher is not None:
            teacher_logits = self._teacher_logits(sample, logits)
        vocab = logits.size(-1)
        ce, kl = distillation_terms(
            logits.reshape(-1, vocab),
            None if teacher_logits is None else teacher_logits.reshape(-1, vocab),
            target.reshape(-1), self.temperature, self.padding_idx,
        )
        per_token = combined(ce, kl, self.alpha, self.temperature)
        loss = per_token.sum() if reduce else per_token
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data if reduce else per_token.sum().data,
            "nll_loss": ce.sum().data,
            "kl": kl.sum().data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        nll_sum = sum(log.get("nll_loss", 0) for log in logging_outputs)
        kl_sum = sum(log.get("kl", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss_sum / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", nll_sum / ntokens / math.log(2), ntokens, round=3)
        metrics.log_scalar("kl", kl_sum / ntokens / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
