"""Offline preprocessing: public corpora into fairseq binaries, each module a command-line tool.

* :mod:`fairseq_alibi.preprocess.wikitext`: WikiText-103 (or -2), word level as in the ALiBi paper,
  or GPT-2 BPE as in fairseq's RoBERTa pretraining tutorial;
* :mod:`fairseq_alibi.preprocess.pile`: the Pile's ``.jsonl``/``.jsonl.zst`` shards, streamed, with
  GPT-2 BPE or a sentencepiece model, one document per sample;
* :mod:`fairseq_alibi.preprocess.glue`: the GLUE tasks, as fairseq's ``preprocess_GLUE_tasks.sh``;
* :mod:`fairseq_alibi.preprocess.parallel`: a parallel corpus given as local text files (or a
  punctuation-restoration corpus made from plain text) for the ``translation`` task;
* :mod:`fairseq_alibi.preprocess.gettext`: a real translation corpus (a language → English) from
  the machine's gettext catalogs, split by source length for "train short, test long".

Run ``python -m fairseq_alibi.preprocess.<name> --help``. Nothing here is imported by the models.
"""
