"""docs/options.md, the table of every ALiBi flag, generated from the declarations of
:mod:`fairseq_alibi.options`: ``python -m fairseq_alibi.options_page`` writes it, and
``tests/options/test_options_page.py`` fails when the page differs from what this generates.

Nothing in it is written by hand: a flag's names come from the :class:`~fairseq_alibi.options.Side`
of each family, where it applies from the field's ``needs`` and ``side``, the default and the
help from the field.
"""

import argparse
from pathlib import Path

from fairseq_alibi.options import (
    BIASED,
    FAMILIES,
    CrossOptions,
    StackOptions,
    default_of,
    either,
    field_of,
    flag_of,
    option_fields,
)

#: the page, relative to the repository
PAGE = Path("docs") / "options.md"

INTRODUCTION = """\
# Every ALiBi flag

Generated from the declarations in `fairseq_alibi/options.py` by
`python -m fairseq_alibi.options_page`; do not edit by hand (`tests/options/test_options_page.py`
fails when this page is stale). Each stack option is one field of `StackOptions`, declared
under the prefix of each family's side: `—` where the side does not declare it (none of its
variants uses it). Every flag is also a hydra field, the flag's name with underscores
(`--encoder-alibi-heads` is `model.encoder_alibi_heads`; on the command line of
`fairseq-hydra-train`, `++model.encoder_alibi_heads=2`: a shipped config that does not set it
holds no such key, and hydra adds one only with `++`), and a checkpoint saves it; the
options the help calls load-time or decoding options can be changed when a model is loaded
(`--model-overrides "{'alibi_slope_scale': 0.5}"`). A value set where it does nothing (the
`applies to` or `needs` column) is a one-line error naming the flag (under
`fairseq-hydra-train`, naming the key: `model.alibi_window_sinks needs
model.alibi_window_cutoff`). A load-time override
that takes away what a saved option needs resets that option to its default, with a
warning naming it: `--model-overrides "{'alibi_window_cutoff': 0}"` evaluates a model saved
with windows and sinks dense, and `{'cross_alibi_eos_guard': -1}` turns a saved guard off
whatever layer it read. An override of what the weights learned with is refused: the heads,
which the tensors show, and the variant, `--alibi-global-tokens` and the learned scales, at
another value than the checkpoint's.
"""


def _cell(value) -> str:
    text = "unset" if value is None else str(value)
    return text.replace("|", "\\|")


def _applies_to(f) -> str:
    """Where a :class:`StackOptions` field does something, from its declaration."""
    if f.metadata.get("model_wide"):
        return "the whole model (one flag for every stack)"
    if f.name == "variant":
        return "; ".join(f"{family}: {', '.join(side.variants)}" for family, side in FAMILIES
                         if side.has("variant")) + " (the LM is causal)"
    needs = f.metadata.get("needs")
    where = "every variant" if needs is None else \
        f"where `{needs.other}` is on" if needs.other != "variant" else \
        "every variant but none" if needs.values == BIASED else f"variant {either(needs.values)}"
    if f.metadata.get("side"):
        where += f"; sides with {f.metadata['side'].replace('_', ' ')}"
    return where


def stack_table():
    families = [family for family, _ in FAMILIES]
    yield "| option | " + " | ".join(families) + " | default | applies to | help |"
    yield "|" + "---|" * (len(families) + 4)
    for f in option_fields(StackOptions):
        declared = [(family, side) for family, side in FAMILIES
                    if f.metadata.get("model_wide") or side.has(f.name)]
        flags = [f"`{flag_of(f, side.prefix)}`" if (family, side) in declared else "—"
                 for family, side in FAMILIES]
        defaults = {family: default_of(f.name, side) for family, side in declared}
        if len(set(defaults.values())) == 1:
            default = _cell(next(iter(defaults.values())))
        else:
            default = "; ".join(f"{family}: {_cell(value)}" for family, value in defaults.items())
        yield (f"| `{f.name}` | " + " | ".join(flags) + f" | {default} | {_applies_to(f)} | "
               f"{_cell(f.metadata['help'])} |")


def cross_table():
    yield "| flag | default | needs | help |"
    yield "|---|---|---|---|"
    for f in option_fields(CrossOptions):
        needs = f.metadata.get("needs")
        needed = "" if needs is None else f"`{flag_of(field_of(CrossOptions, needs.other))}`" + (
            "" if needs.values is None else f" {either(needs.values)}")
        yield (f"| `{flag_of(f)}` | {_cell(f.default)} | {needed} | "
               f"{_cell(f.metadata['help'])} |")


def options_page() -> str:
    """The text of docs/options.md."""
    return "\n".join([
        INTRODUCTION,
        "## Stack options (`StackOptions`)",
        "",
        *stack_table(),
        "",
        "## Cross-attention options of `alibi_transformer` (`CrossOptions`)",
        "",
        "Unprefixed. `needs`: the option that must be on (or have one of these values) for this "
        "one to do anything.",
        "",
        *cross_table(),
        "",
    ])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fairseq_alibi.options_page",
                                     description="write docs/options.md, the table of every "
                                                 "ALiBi flag, from the declarations")
    parser.add_argument("page", nargs="?", type=Path,
                        default=Path(__file__).resolve().parent.parent / PAGE,
                        help="where to write it (default: the repository's %(default)s)")
    page = parser.parse_args(argv).page
    page.write_text(options_page())
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
