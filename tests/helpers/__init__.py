"""What the tests share, one module per kind of helper (a test imports from the module that says
what it needs, e.g. ``from tests.helpers.references import reference_bias``):

* :mod:`tests.helpers.cli`: fairseq's real command lines, run in this environment;
* :mod:`tests.helpers.training`: tiny fairseq-train runs (one process or distributed), their logs;
* :mod:`tests.helpers.building`: models built in process from fairseq-train flags, hydra configs;
* :mod:`tests.helpers.checkpoints`: checkpoints written in process, loaded, compared;
* :mod:`tests.helpers.corpora`: tiny inputs in the real formats of the public corpora;
* :mod:`tests.helpers.documents`: packed rows of documents (document masks);
* :mod:`tests.helpers.references`: float64 references of the bias and of one attention layer;
* :mod:`tests.helpers.translation`: alibi_transformer at test dimensions and its reference.

Fixtures (the session-wide tiny corpora and trained LM) are in ``tests/conftest.py``; a test file
imports from here, never from another test file (tests/architecture/test_layout.py checks).
"""
