"""A window cutoff given to a side without a distance bias of its own: a translation model whose
decoder's only position signal is the cross-attention's (``--cross-alibi pointer`` on a stock
decoder: ``StockCrossPositionDecoder``), its stock encoder, a masked LM with learned positions,
and the unprefixed LM/encoder key on a translation model. Each is a one-line error naming the
flag, from the option's declaration (its ``needs``), at training and at load time."""

import pytest
from fairseq import checkpoint_utils

from fairseq_alibi import options
from tests.helpers.building import build_tiny_translation, write_dictionary
from tests.helpers.cli import REPO

FIXTURES = REPO / "tests" / "fixtures" / "saved_models"
#: the decoder has no self-attention bias; the cross-attention is the only position signal
CROSS_ONLY = ["--encoder-alibi-variant", "none", "--decoder-alibi-variant", "none",
              "--cross-alibi", "pointer"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = write_dictionary(tmp_path_factory.mktemp("sides"), 20)
    for side in ("src", "tgt"):
        (folder / f"dict.{side}.txt").write_text((folder / "dict.txt").read_text())
    return folder


def build_translation(pair, *flags):
    return build_tiny_translation(pair, *flags)


def one_line(raised) -> str:
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_the_declaration_says_why_a_side_without_its_own_bias_has_nothing_to_window():
    needs = options.field_of(options.StackOptions, "window_cutoff").metadata["needs"]
    assert needs.other == "variant" and "none" not in needs.values
    assert "--cross-alibi bias has no window" in needs.why
    # declared for the sides with a distance bias only: the decoder's variants are causal, none
    assert options.TRANSLATION_DECODER.variants_for(
        options.field_of(options.StackOptions, "window_cutoff")) == ("causal",)


@pytest.mark.parametrize("flag,side", [("--decoder-alibi-window-cutoff", "decoder"),
                                       ("--encoder-alibi-window-cutoff", "encoder")])
def test_a_cutoff_with_cross_attention_only_position_options_is_a_one_line_error(pair, flag,
                                                                                 side):
    with pytest.raises(ValueError) as raised:
        build_translation(pair, *CROSS_ONLY, flag, 8)
    message = one_line(raised)
    assert message.startswith(f"{flag} needs --{side}-alibi-variant ")
    assert message.endswith("not none: it shapes the ALiBi bias of this side's self-attention "
                            "(a --cross-alibi bias has no window)")
    # the same model without the cutoff builds: the pointer decoder is what is refused nothing
    model = build_translation(pair, *CROSS_ONLY)
    assert type(model.decoder).__name__ == "StockCrossPositionDecoder"


def test_the_side_with_a_bias_takes_it_beside_a_cross_attention_bias(pair):
    model = build_translation(pair, "--cross-alibi", "pointer", "--decoder-alibi-window-cutoff",
                              8, "--encoder-alibi-variant", "none")
    assert model.decoder.alibi.window_cutoff == 8.0


def _load(name, **overrides):
    return checkpoint_utils.load_model_ensemble(
        [str(FIXTURES / name / "checkpoint.pt")],
        arg_overrides={"data": str(FIXTURES), **overrides})[0][0]


@pytest.mark.parametrize("name,key,flag", [
    ("translation_stock_positions_pointer", "decoder_alibi_window_cutoff",
     "--decoder-alibi-window-cutoff needs --decoder-alibi-variant causal, not none"),
    ("translation_stock_positions_pointer", "encoder_alibi_window_cutoff",
     "--encoder-alibi-window-cutoff needs --encoder-alibi-variant "),
    ("roberta_learned_positions", "alibi_window_cutoff",
     "--alibi-window-cutoff needs --alibi-variant "),
    ("translation_pointer", "alibi_window_cutoff",
     "ALiBi option 'alibi_window_cutoff' in --model-overrides is "),
])
def test_a_load_time_cutoff_on_a_side_without_a_bias_is_a_one_line_error(name, key, flag):
    """``--model-overrides "{'<key>': 8}"`` of a saved model whose side has no distance bias
    (or, for the unprefixed key of the LM and the encoder, of a translation model: the valid
    names are listed)."""
    with pytest.raises(ValueError) as raised:
        _load(name, **{key: 8})
    message = one_line(raised)
    assert message.startswith(flag)
    if key == "alibi_window_cutoff" and name.startswith("translation"):
        assert "encoder_alibi_window_cutoff" in message  # the names it takes
    assert _load(name) is not None  # the model itself loads
