"""``fairseq-alibi <tool> ...`` (or ``python -m fairseq_alibi <tool> ...``): every tool of the
package behind one command, as fairseq has ``fairseq-*``; ``--user-dir`` prints the directory to
pass to fairseq's ``--user-dir``.

``python -m fairseq_alibi.<tool>`` still runs the five tools that were spelled so before
(``quickstart``, ``sweep``, ``corpus``, ``convert``, ``checkpoints``: users' scripts, the forks'
users' commands); the docs, the error messages and the help say ``fairseq-alibi <tool>``, and a
new tool gets no such alias. Each alias module is the same two lines, :func:`run_alias`, which
finds its tool here by the module's own name, so :data:`TOOLS` stays the one table of the tools
(``fairseq_alibi/cli/__init__.py`` points here rather than listing them again)."""

import argparse
import importlib
import sys

from fairseq_alibi.paths import user_dir

#: subcommand -> (module, its main, what it does); modules are imported only when run
TOOLS = {
    "quickstart": ("fairseq_alibi.cli.quickstart", "main", "train short, test long, end to end"),
    "sweep": ("fairseq_alibi.cli.sweep", "main", "evaluate checkpoints over lengths"),
    "convert": ("fairseq_alibi.cli.convert_checkpoints", "main",
                "stock transformer_lm and ALiBi-fork checkpoints -> this plugin"),
    "eval-lm-stream": ("fairseq_alibi.cli.stream_eval_lm", "main",
                       "fairseq-eval-lm scoring each token once, streaming (causal ALiBi LMs)"),
    "windows": ("fairseq_alibi.cli.windows_check", "main",
                "is a slope-window cutoff safe for this model (LM, encoder, translation)? "
                "perplexity, sink heads, one verdict"),
    "checkpoints": ("fairseq_alibi.cli.checkpoints", "main", "inspect or repair a save folder"),
    "corpus": ("fairseq_alibi.cli.corpus", "main", "build the quickstart corpus"),
    "glue": ("fairseq_alibi.cli.glue_finetune", "main",
             "fine-tune an encoder on GLUE, N seeds a task, collapsed runs flagged"),
    "export-hf": ("fairseq_alibi.cli.hf_export_import", "export_main",
                  "fairseq ALiBi LM -> Hugging Face BLOOM/MPT folder"),
    "import-hf": ("fairseq_alibi.cli.hf_export_import", "import_main",
                  "Hugging Face BLOOM/MPT folder -> fairseq checkpoint"),
}


def run_alias(name: str, spec) -> None:
    """What ``python -m fairseq_alibi.<tool>`` runs: ``fairseq-alibi <tool>`` with the same
    arguments (the tool named by the alias module, ``spec.name``, ``_`` read as ``-``).
    Importing an alias module runs nothing."""
    if name != "__main__":
        return
    tool = spec.name.rsplit(".", 1)[-1].replace("_", "-")
    if tool not in TOOLS:
        raise SystemExit(f"{spec.name}: no tool {tool!r} in fairseq_alibi's TOOLS")
    sys.exit(main([tool, *sys.argv[1:]]))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOLS:
        import fairseq_alibi

        if fairseq_alibi.missing_dependency is not None:
            raise SystemExit(f"fairseq-alibi {argv[0]}: error: {fairseq_alibi.install_line()}")
        module, function, _ = TOOLS[argv[0]]
        return getattr(importlib.import_module(module), function)(argv[1:]) or 0
    width = max(map(len, TOOLS)) + 1
    parser = argparse.ArgumentParser(
        prog="fairseq-alibi",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="ALiBi for stock fairseq. Use with: fairseq-train --user-dir "
        '"$(fairseq-alibi --user-dir)" --arch alibi_transformer_lm ...\n\ntools '
        "(fairseq-alibi <tool> --help):\n"
        + "\n".join(f"  {name:<{width}} {about}" for name, (_, _, about) in TOOLS.items()),
    )
    parser.add_argument("--user-dir", action="store_true", help="print the --user-dir path")
    parser.add_argument("--version", action="store_true", help="print the package version")
    args = parser.parse_args(argv)
    if args.version:
        from fairseq_alibi.version import __version__

        print(__version__)
    elif args.user_dir:
        print(user_dir())
    else:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
