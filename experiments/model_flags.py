"""Which command-line flags this checkout's models accept: what the experiments check before a
grid starts, so that a configuration whose options this checkout lacks is named at once (with
the configurations that can run) instead of failing in its ``fairseq-train`` hours later."""

import argparse
from typing import Iterable, List, Set


def accepted_flags(model_class) -> Set[str]:
    """Every option string (``--alibi-variant``, ...) ``model_class.add_args`` declares."""
    parser = argparse.ArgumentParser(add_help=False)
    model_class.add_args(parser)
    return {option for action in parser._actions for option in action.option_strings}


def lacking_flags(wanted: Iterable[str], known: Set[str]) -> List[str]:
    """The flags of ``wanted`` (once each, in order) that ``known`` lacks."""
    return [option for option in dict.fromkeys(wanted) if option not in known]
