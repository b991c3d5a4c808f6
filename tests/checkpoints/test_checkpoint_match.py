"""One check of a checkpoint against the model being built, one error style, every family.

Each family (``alibi_transformer_lm``, ``alibi_roberta``, ``alibi_transformer``) and the bias
module on its own refuse a checkpoint trained with another variant, head count, ``--*-alibi-heads``
or learned scales with the same sentence (``modules/checkpoint_match.mismatch``), which names
the flag that builds the model the checkpoint needs; the model built with it loads.
"""

import re

import pytest
import torch

from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.checkpoint_match import StackRecord, scale_mode
from tests.helpers.building import build_model
from tests.helpers.translation import build_translation, write_translation_dictionaries

STYLE = re.compile(r"this checkpoint was trained with (?P<saved>.+); the model being built has "
                   r"(?P<built>.+): build it with (?P<fix>.+)")


@pytest.fixture(scope="module")
def translation_data(tmp_path_factory):
    return write_translation_dictionaries(tmp_path_factory.mktemp("translation_dicts"))


def _build(family, data, flags):
    if family == "translation":
        return build_translation(data, *flags)[0]
    return build_model(family, data, *flags)[0]


#: (family, trained with, built with, the flag the error must tell to pass)
CASES = [
    ("lm", ["--decoder-attention-heads", 2], [], "--decoder-attention-heads 2"),
    ("lm", ["--alibi-heads", 2], [], "--alibi-heads 2"),
    ("lm", [], ["--alibi-heads", 3], "no --alibi-heads"),
    ("lm", ["--alibi-learned-scales", "per_head"], [], "--alibi-learned-scales per_head"),
    ("lm", ["--alibi-learned-scales", "per_layer"], ["--alibi-learned-scales", "per_head"],
     "--alibi-learned-scales per_layer"),
    ("encoder", ["--alibi-variant", "one_sided"], [], "--alibi-variant one_sided"),
    ("encoder", ["--encoder-attention-heads", 2], [], "--encoder-attention-heads 2"),
    ("encoder", ["--alibi-learned-scales", "per_layer_head"], [],
     "--alibi-learned-scales per_layer_head"),
    ("encoder", ["--alibi-variant", "asymmetric", "--alibi-future-slope-ratio", 0.5],
     ["--alibi-variant", "asymmetric", "--alibi-future-slope-ratio", 3],
     "--alibi-future-slope-ratio 0.5"),
    ("translation", ["--encoder-alibi-variant", "one_sided"], [],
     "--encoder-alibi-variant one_sided"),
    ("translation", ["--encoder-alibi-variant", "asymmetric"], [],
     "--encoder-alibi-variant asymmetric"),
    ("translation", ["--decoder-alibi-heads", 1], [], "--decoder-alibi-heads 1"),
    ("translation", ["--decoder-alibi-learned-scales", "shared"], [],
     "--decoder-alibi-learned-scales shared"),
    ("translation", [], ["--decoder-alibi-variant", "none"], "--decoder-alibi-variant"),
]


@pytest.mark.parametrize("family,trained,built,fix", CASES,
                         ids=[f"{c[0]}-{' '.join(map(str, c[1] or c[2]))}" for c in CASES])
def test_every_family_refuses_a_mismatch_in_one_style(family, trained, built, fix,
                                                      tiny_lm_data, translation_data):
    data = translation_data if family == "translation" else tiny_lm_data
    state = _build(family, data, trained).state_dict()
    model = _build(family, data, built)
    with pytest.raises(ValueError) as raised:
        model.load_state_dict(state)
    message = str(raised.value)
    match = STYLE.fullmatch(message)
    assert match, message
    assert fix in match["fix"], message
    assert "\n" not in message
    _build(family, data, trained).load_state_dict(state)  # built as it says: it loads


def test_the_bias_module_alone_refuses_in_the_same_style():
    one_sided = AlibiBias(4, variant="one_sided").state_dict()
    with pytest.raises(ValueError, match=STYLE.pattern) as raised:
        AlibiBias(4, variant="symmetric").load_state_dict(one_sided)
    assert "--alibi-variant one_sided" in str(raised.value)
    with pytest.raises(ValueError, match="trained with 4 attention heads"):
        AlibiBias(8).load_state_dict(AlibiBias(4).state_dict())
    learned = AlibiBias(4, learned_scales="per_head").state_dict()
    with pytest.raises(ValueError, match="build it with --alibi-learned-scales per_head"):
        AlibiBias(4).load_state_dict(learned)


def test_what_the_tensors_cannot_tell_apart_loads_as_saved():
    """causal, symmetric and offset share Press's slopes; slopes set by hand stay as saved."""
    offset = AlibiBias(4, variant="offset")
    offset.load_state_dict(AlibiBias(4, variant="symmetric").state_dict())
    by_hand = AlibiBias(4).state_dict()
    by_hand["slopes"] = by_hand["slopes"] * 0.5
    loaded = AlibiBias(4)
    loaded.load_state_dict(by_hand)
    assert torch.equal(loaded.slopes, by_hand["slopes"])
    without_scales = AlibiBias(4).state_dict()  # learned scales start from their initial value
    AlibiBias(4, learned_scales="per_head").load_state_dict(without_scales)


def test_learned_future_slope_ratios_load_as_saved():
    """A learnable ratio's option is where it starts: the ratios it learned load over it; built
    fixed, the same checkpoint names the option that learns them."""
    trained = AlibiBias(4, variant="asymmetric", learnable_future_slopes=True)
    with torch.no_grad():
        trained.future_slope_ratio.copy_(torch.tensor([0.5, 0.75, 1.0, 2.0]))
    learnable = AlibiBias(4, variant="asymmetric", learnable_future_slopes=True,
                          future_slope_ratio=3.0)
    learnable.load_state_dict(trained.state_dict())
    assert learnable.future_slope_ratio.tolist() == [0.5, 0.75, 1.0, 2.0]
    with pytest.raises(ValueError, match=r"trained with future slope ratios 0\.5, 0\.75, 1, 2 "
                       r".*build it with --alibi-learnable-future-slopes$"):
        AlibiBias(4, variant="asymmetric").load_state_dict(trained.state_dict())


def test_the_record_of_a_stack():
    record = StackRecord.built(AlibiBias(8, variant="offset", heads=3,
                                         learned_scales="per_layer", num_layers=2))
    assert record == StackRecord(8, 3, "press", False, (2, 1))
    assert StackRecord.built(AlibiBias(8, variant="one_sided")).slopes == "one_sided"
    assert StackRecord.built(AlibiBias(8, variant="asymmetric")).asymmetric
    assert [scale_mode(s) for s in [(1, 1), (1, 4), (3, 1), (3, 4)]] == [
        "shared", "per_head", "per_layer", "per_layer_head"]
