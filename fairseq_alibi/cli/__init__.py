"""The command-line tools (``python -m fairseq_alibi.<tool>``): they import the library, never the reverse.

* :mod:`~fairseq_alibi.cli.quickstart`: train short, test long on the embedded corpus (the main job);
* :mod:`~fairseq_alibi.cli.sweep`: perplexity of any checkpoints at several evaluation lengths;
* :mod:`~fairseq_alibi.cli.corpus`: the embedded English corpus built from Python's own documentation;
* :mod:`~fairseq_alibi.cli.convert`: other checkpoints into this plugin's models: stock fairseq
  ``transformer_lm`` and the ALiBi forks' LMs, RoBERTa and translation models
  (:mod:`~fairseq_alibi.cli.forks` reads the forks' formats);
* :mod:`~fairseq_alibi.cli.checkpoints`: check, repair and re-shard a ``--save-dir``.

The offline data pipelines are in :mod:`fairseq_alibi.preprocess`.
"""
