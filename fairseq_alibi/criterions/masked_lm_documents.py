"""``masked_lm_documents``: fairseq's masked-LM loss with every document boundary left in the
input, for packed masked-LM training with ``--alibi-document-mask``.

fairseq's ``masked_lm`` task masks ``</s>`` like any token (15 % of them: 80 % ``<mask>``, 10 %
a random token, 10 % unchanged). A document mask reads its boundaries from the model's input
(``doc``: an ``</s>`` right after an ``</s>``; ``eos``: every ``</s>``), so the masking hides
about a quarter of the ``doc`` boundaries, and attention crosses them there. This criterion
computes stock ``masked_lm``'s loss on the sample with every ``</s>`` that the masking chose
kept in the input (put back where it was replaced) and left out of the targets (a boundary
predicted from attention that the boundary itself cuts would be a give-away); no other token
changes. fairseq never puts a
random ``</s>`` in (its random tokens exclude the special ones), so the document mask then sees
exactly the boundaries of the text::

    fairseq-train DATA --user-dir $(python -m fairseq_alibi --user-dir) --task masked_lm \\
        --arch alibi_roberta_base --sample-break-mode complete --alibi-document-mask doc \\
        --criterion masked_lm_documents ...

It is Hugging Face's masked-LM practice for special tokens (never masked) applied to ``</s>``.
Without a document mask it trains the same objective minus the ``</s>`` targets, and warns.
"""

import logging
from dataclasses import dataclass

from fairseq.criterions import register_criterion
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss

from fairseq_alibi.config_access import task_name
from fairseq_alibi.options import OptionError

logger = logging.getLogger(__name__)


def boundaries_kept(sample: dict, eos: int, pad: int) -> dict:
    """``sample`` (a ``masked_lm`` batch) with every ``</s>`` that the masking chose (a target)
    put back in ``net_input.src_tokens`` and dropped from ``target`` (``pad``: not predicted).
    A new dict: the batch given is not changed. No test of whether any was chosen: on a GPU
    that would wait for the device every step (stock ``masked_lm`` avoids it too)."""
    target = sample["target"]
    chosen = target.eq(eos)
    net_input = dict(sample["net_input"])
    net_input["src_tokens"] = net_input["src_tokens"].masked_fill(chosen, eos)
    return dict(sample, net_input=net_input, target=target.masked_fill(chosen, pad))


@dataclass
class MaskedLmDocumentsConfig(MaskedLmConfig):
    pass


@register_criterion("masked_lm_documents", dataclass=MaskedLmDocumentsConfig)
class MaskedLmDocumentsLoss(MaskedLmLoss):
    """Stock ``masked_lm`` on :func:`boundaries_kept` of each batch (see the module)."""

    def __init__(self, cfg: MaskedLmDocumentsConfig, task):
        if getattr(task, "mask_idx", None) is None:  # an LM's targets are every next token
            raise OptionError(
                f"--criterion masked_lm_documents needs --task masked_lm (this is --task "
                f"{task_name(task)}): on another task it would drop every </s> from the targets")
        super().__init__(cfg, task)
        self.model_checked = False
        logger.info("masked_lm_documents: every </s> the masking chooses stays in the input and "
                    "is not predicted, so a document mask sees every boundary")

    def forward(self, model, sample, reduce=True):
        if not self.model_checked:  # the criterion meets the model here, not when it is built
            self.model_checked = True
            if not any(getattr(m, "document_mask", "none") != "none" for m in model.modules()):
                logger.warning("--criterion masked_lm_documents on a model without "
                               "--alibi-document-mask: there are no boundaries to keep, and "
                               "</s> is never predicted; use --criterion masked_lm, or add "
                               "--alibi-document-mask doc")
        eos = self.task.source_dictionary.eos()
        return super().forward(model, boundaries_kept(sample, eos, self.padding_idx), reduce)
