"""docs/options.md, the table of every ALiBi flag, is what the declarations generate
(``python -m fairseq_alibi.options_page`` rewrites it), and says what the parsers accept."""

import argparse

import pytest

from fairseq_alibi import options
from fairseq_alibi.models.checks import is_refused_flag
from fairseq_alibi.options_page import PAGE, options_page
from tests.helpers.cli import REPO


def test_the_options_page_is_current():
    """Fails when a declaration changed and the page was not regenerated: run
    ``python -m fairseq_alibi.options_page``."""
    assert (REPO / PAGE).read_text() == options_page(), \
        "docs/options.md is stale: run python -m fairseq_alibi.options_page"


@pytest.mark.parametrize("model", ["alibi_transformer_lm", "alibi_roberta", "alibi_transformer"])
def test_every_flag_of_the_page_is_a_flag_of_its_model(model):
    """The page's flags of a family are exactly the ALiBi flags its parser has."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = argparse.ArgumentParser()
    cls = ARCH_MODEL_REGISTRY[model]
    if getattr(cls, "__dataclass", None) is not None:  # the LM declares a config dataclass
        from fairseq.dataclass.utils import gen_parser_from_dataclass

        gen_parser_from_dataclass(parser, cls.__dataclass())
    else:
        cls.add_args(parser)
    accepted = {flag for action in parser._actions for flag in action.option_strings
                if not is_refused_flag(action)}  # the forks' flags, refused
    sides = [side for family, side in options.FAMILIES if family.split()[0] == model]
    listed = {options.flag_of(f, side.prefix) for side in sides
              for f in options.option_fields(options.StackOptions)
              if f.metadata.get("model_wide") or side.has(f.name)}
    if model == "alibi_transformer":
        listed |= {options.flag_of(f) for f in options.option_fields(options.CrossOptions)}
    page = (REPO / PAGE).read_text()
    assert listed <= accepted and all(f"`{flag}`" in page for flag in listed)
    ours = {flag for flag in accepted if "alibi" in flag and flag not in listed}
    assert not ours, ours  # an ALiBi flag the page does not list
