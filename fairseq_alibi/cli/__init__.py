"""The command-line tools (``fairseq-alibi <tool>``): they import the library, never the reverse.

Each tool is one module here with a ``main(argv)``; which module is which tool, and what each
does, is ``TOOLS`` in :mod:`fairseq_alibi.__main__` (``fairseq-alibi --help`` prints it), the one
table. The other modules are what the tools share:

* :mod:`~fairseq_alibi.cli.fairseq_runs`: running fairseq's console scripts (their environment,
  their logs, CPU time), the machine the timings were measured on, ``--seeds``;
* :mod:`~fairseq_alibi.cli.preload_server`: the server ``fairseq_runs`` forks the scripts from
  (``FAIRSEQ_ALIBI_FORKSERVER=1``), run as a file: it imports none of the package;
* :mod:`~fairseq_alibi.cli.checkpoint_io`: what every converter shares (reading a checkpoint and
  its configuration of any era, ``ConversionError``, a model built without data, atomic writes);
* :mod:`~fairseq_alibi.cli.forks`: the ALiBi forks' checkpoint formats, for ``convert``.
* :mod:`~fairseq_alibi.cli.windows_inputs`: what ``windows`` reads, the kind of model and the
  split's sequences, one reader per kind (a stream, a masked stream, sentence pairs).
* :mod:`~fairseq_alibi.cli.windows_report`: what ``windows`` concludes from its measurements
  (the stopping rule, the rows per head and per ``T``, the verdict) and its report.

``tests/test_layout.py`` checks that every module here is a tool of ``TOOLS`` or listed above.
The offline data pipelines are in :mod:`fairseq_alibi.preprocess`.
"""
