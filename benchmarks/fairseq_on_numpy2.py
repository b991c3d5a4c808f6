"""A fairseq command line on numpy 2: ``python -m benchmarks.fairseq_on_numpy2 MODULE ARGS...``.

fairseq-fixed 0.12.3.1 still reads ``np.compat.long``, which numpy 2 removed: in
``TokenBlockDataset`` with ``break_mode="eos"`` (every prompt ``fairseq-interactive`` gives a
language model, the hub's ``sample``, training with ``--sample-break-mode eos``) and in
``LanguagePairDataset`` with ``--num-batch-buckets``; those fail with ``AttributeError: module
'numpy' has no attribute 'compat'``. The GPU machine's numpy is 2.x and is not ours to change
(this repository's own environment pins numpy<2). This runs ``MODULE`` (``fairseq_cli.interactive``,
...) as ``python -m`` would, after putting back ``numpy.compat.long`` as ``numpy.int64``, what it
was on 64-bit Linux; with numpy 1 it changes nothing.
"""

import runpy
import sys
import types


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m benchmarks.fairseq_on_numpy2 MODULE [ARGS...]")
    import numpy

    if not hasattr(numpy, "compat"):
        numpy.compat = types.SimpleNamespace(long=numpy.int64)
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
