"""``--classification-pooler mean``: a sentence classification head that reads the mean of the
real tokens' features instead of the first token's (JinaBERT's pooling).

With ALiBi the first token ``<s>`` sees mostly its neighbours (its far keys are damped by the
bias), so a head that reads ``<s>`` alone may miss the second segment of a pair; the mean of
every real token's features reads all of them. fairseq builds the head
(``RobertaModel.register_classification_head``); :func:`pool_the_mean` changes only what it
reads, so its parameters and their names are the stock head's. The model tells the head which
tokens are real before each forward pass (:func:`set_real_tokens`), so the sentence_prediction
criterion and the hub's ``predict`` (which calls the head on the features itself) both work.
"""

import torch
from fairseq.models.roberta.model import RobertaClassificationHead

#: the values of ``--classification-pooler``
POOLERS = ("first", "mean")


def _name_tensor(name: str) -> torch.Tensor:
    return torch.tensor(list(name.encode("utf-8")), dtype=torch.uint8)


def saved_pooler(state_dict, head_prefix: str) -> str:
    """The pooler a checkpoint's head was trained with (heads without the record: ``first``)."""
    saved = state_dict.get(f"{head_prefix}pooler")
    return "first" if saved is None else bytes(saved.tolist()).decode("utf-8")


class MeanPooledClassificationHead(RobertaClassificationHead):
    """The stock head over ``mean_t(features[b, t])`` of the real tokens ``t`` of row ``b``."""

    def forward(self, features, **kwargs):
        real = getattr(self, "real_tokens", None)
        if real is None or tuple(real.shape) != tuple(features.shape[:2]):
            raise ValueError(
                "--classification-pooler mean averages the real tokens' features: call the model "
                "(model(tokens, classification_head_name=...), or the hub's predict), which "
                "tells the head where the padding is, not the head on features alone")
        weights = real.to(features.dtype).unsqueeze(-1)
        pooled = (features * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
        return super().forward(pooled.unsqueeze(1))  # the stock head reads position 0


def pool_the_mean(head: RobertaClassificationHead) -> MeanPooledClassificationHead:
    """Make a stock head (as fairseq built it) read the mean of the real tokens; recorded in
    its state (``pooler``, by name) so that a checkpoint says how its head pools."""
    head.__class__ = MeanPooledClassificationHead
    head.register_buffer("pooler", _name_tensor("mean"))
    return head


def set_real_tokens(heads, real: torch.Tensor):
    """Tell every mean-pooling head of ``heads`` which tokens of the next batch are real."""
    for head in heads:
        if isinstance(head, MeanPooledClassificationHead):
            head.real_tokens = real
