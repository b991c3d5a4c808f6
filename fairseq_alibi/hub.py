"""``from_pretrained`` of the ALiBi models: offline, of the class asked for, at any length.

Stock ``from_pretrained`` (``fairseq.hub_utils``) has three surprises for ALiBi checkpoints:

* RoBERTa's default BPE is GPT-2's, whose files default to URLs: offline, building it fails deep
  inside (``No module named 'requests'``), online it downloads. Here ``encoder.json`` and
  ``vocab.bpe`` are taken from the checkpoint's folder or the data folder when they are there
  (as fairseq already does for ``sentencepiece.bpe.model``, ``merges.txt``, ...); otherwise a
  one-line error names the files and the arguments, and nothing is downloaded.
* it builds whatever model the checkpoint names, so a stock checkpoint silently comes back as a
  stock model: here that is a :class:`WrongCheckpointError` naming the class to use (or, for an
  unconverted checkpoint of Press's ALiBi fork, the convert command), shown as one line.
* the language-model hub batches with the training run's ``--max-tokens`` and asserts that no
  sentence is longer; an ALiBi model scores any length, so a longer sentence gets a batch of its
  own (:class:`AlibiLanguageModelHubInterface`).
"""

import os
import zipfile
from typing import Dict, Iterable, Optional

import torch
from fairseq import hub_utils
from omegaconf import open_dict

from fairseq_alibi.config_access import cfg_get
from fairseq_alibi.error_hints import OneLineError, raised_by_plugin

#: ``from_pretrained`` argument -> the GPT-2 BPE file it names
GPT2_BPE_FILES = {"gpt2_encoder_json": "encoder.json", "gpt2_vocab_bpe": "vocab.bpe"}


def _is_url(path) -> bool:
    return "://" in str(path)


def local_gpt2_bpe(folders: Iterable[Optional[str]]) -> Dict[str, str]:
    """``{argument: path}`` of the first folder holding both GPT-2 BPE files (else ``{}``)."""
    for folder in folders:
        if not folder or _is_url(folder):
            continue
        found = {arg: os.path.join(folder, name) for arg, name in GPT2_BPE_FILES.items()}
        if all(os.path.isfile(path) for path in found.values()):
            return found
    return {}


class MissingBpeFilesError(OneLineError):
    """The GPT-2 BPE's files are not local (nothing is downloaded); the message is the fix."""


def check_gpt2_bpe(bpe_cfg, searched, given=()):
    """A one-line error unless a ``gpt2`` BPE config names local files (nothing downloads).

    ``given``: the arguments the caller passed explicitly (a URL there is their choice).
    """
    if bpe_cfg is None or cfg_get(bpe_cfg, "_name") != "gpt2":
        return
    for arg, name in GPT2_BPE_FILES.items():
        path = cfg_get(bpe_cfg, arg)
        if arg in given and _is_url(path):
            continue
        if path and not _is_url(path) and os.path.isfile(path):
            continue
        folders = list(dict.fromkeys(os.path.normpath(str(f)) for f in searched if f))
        where = (f"neither {' nor '.join(folders)} holds" if len(folders) > 1
                 else f"{folders[0]} does not hold") if folders else "no folder holds"
        raise MissingBpeFilesError(
            f"the GPT-2 BPE needs {name} (found {path!r}, not a local file; {where} both "
            f"encoder.json and vocab.bpe): put them beside the checkpoint, or pass "
            f"gpt2_encoder_json='.../encoder.json', gpt2_vocab_bpe='.../vocab.bpe' to "
            f"from_pretrained (or bpe='sentencepiece', sentencepiece_model='.../spm.model')"
        )


class WrongCheckpointError(OneLineError):
    """``from_pretrained`` was given a checkpoint of another model; the message is the fix."""


def check_model_class(model, expected_class, expected_name: str, checkpoint: str):
    """A clear error when the checkpoint built a model of another class (a stock checkpoint)."""
    if isinstance(model, expected_class):
        return
    built = type(model).__name__
    raise WrongCheckpointError(
        f"{checkpoint} holds a {built}, not an {expected_name} model (it was trained by another "
        f"architecture): load it with {built}.from_pretrained, or give an {expected_name} "
        f"checkpoint"
    )


def refuse_unconverted_press_file(checkpoint: str):
    """The Press-fork error (:func:`~fairseq_alibi.models.checks.is_unconverted_press_config`)
    if ``checkpoint`` is an unconverted checkpoint of that fork.

    Read again from the file: building the stock model drops the fork's ``max_tokens`` from the
    loaded config. Only on the error path, memory-mapped where the file allows it.
    """
    from fairseq_alibi.models.checks import refuse_unconverted_press_checkpoint

    if not os.path.isfile(checkpoint):
        return
    try:
        state = torch.load(checkpoint, map_location="cpu", mmap=zipfile.is_zipfile(checkpoint))
    except Exception:  # noqa: BLE001 - unreadable here: the caller's error stands
        return
    refuse_unconverted_press_checkpoint(state, checkpoint)


def load_pretrained(model_class, expected_name, model_name_or_path, checkpoint_file,
                    data_name_or_path, **kwargs) -> dict:
    """``hub_utils.from_pretrained`` for an ALiBi model class, offline; see the module doc."""
    model_dir = str(model_name_or_path)
    data_dir = str(data_name_or_path)
    if data_dir.startswith("."):  # as hub_utils: relative to the checkpoint's folder
        data_dir = os.path.join(model_dir, data_dir)
    searched = [model_dir, data_dir]
    given = {arg for arg in GPT2_BPE_FILES if arg in kwargs}
    if not given:
        kwargs.update(local_gpt2_bpe(searched))
    checkpoint = os.path.join(model_dir, checkpoint_file)
    try:
        loaded = hub_utils.from_pretrained(
            model_name_or_path, checkpoint_file, data_name_or_path,
            archive_map=model_class.hub_models(), **kwargs,
        )
        check_model_class(loaded["models"][0], model_class, expected_name, checkpoint)
    except WrongCheckpointError:
        try:
            refuse_unconverted_press_file(checkpoint)  # the more precise error, if it is one
        except ValueError as press:
            raise WrongCheckpointError(str(press)) from None
        raise
    except ValueError as refused:
        # the plugin's checks refuse a fork's checkpoint from deep inside fairseq's loader:
        # the message is the fix, the loader's frames would only bury it (a OneLineError, such
        # as a misspelt ALiBi option among the keyword arguments, already is one: kept as is)
        if not raised_by_plugin(refused) or isinstance(refused, OneLineError):
            raise
        raise WrongCheckpointError(str(refused)) from None
    check_gpt2_bpe(loaded["args"].bpe, searched, given)
    return loaded


class AlibiLanguageModelHubInterface(hub_utils.GeneratorHubInterface):
    """fairseq's language-model hub interface, scoring and generating at any length.

    Sentences are batched with the training run's ``--max-tokens`` as usual; one longer than
    that (which stock fairseq refuses with ``Sentences lengths should not exceed max_tokens``)
    gets a batch sized to it, since an ALiBi model has no maximum length.
    """

    def _build_batches(self, tokens, skip_invalid_size_inputs):
        limit = self.cfg.dataset.max_tokens
        longest = max((t.numel() for t in tokens), default=0)
        if limit is None or longest <= limit:
            return super()._build_batches(tokens, skip_invalid_size_inputs)
        with open_dict(self.cfg):
            self.cfg.dataset.max_tokens = longest  # the batches are made right here
            try:
                return super()._build_batches(tokens, skip_invalid_size_inputs)
            finally:
                self.cfg.dataset.max_tokens = limit
