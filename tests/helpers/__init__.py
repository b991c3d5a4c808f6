"""What the tests share, one module per kind of helper (a test imports from the module that says
what it needs, e.g. ``from tests.helpers.references import reference_bias``):

* :mod:`tests.helpers.cli`: fairseq's real command lines, run in this environment;
* :mod:`tests.helpers.training`: tiny fairseq-train runs (one process or distributed), their logs;
* :mod:`tests.helpers.building`: models built in process from fairseq-train flags, hydra configs;
* :mod:`tests.helpers.checkpoints`: checkpoints written in process, loaded, compared;
* :mod:`tests.helpers.corpora`: tiny inputs in the real formats of the public corpora;
* :mod:`tests.helpers.references`: float64 references of the bias and of one attention layer;
* :mod:`tests.helpers.translation`: alibi_transformer at test dimensions and its reference.

Fixtures (the session-wide tiny corpora and trained LM) are in ``tests/conftest.py``; a test file
imports from here, never from another test file (tests/architecture/test_layout.py checks).
"""

# For the transition only: tests written against the single tests/helpers.py (``from tests.helpers
# import X``) keep working while they move to the modules above; new code imports the module.
from tests.helpers.building import (  # noqa: F401
    build_from_command_line, build_model, compose, decode_token_by_token,
    setup_from_command_line, training_config, write_dictionary,
)
from tests.helpers.checkpoints import (  # noqa: F401
    load, max_weight_difference, saved_in_process, train_loss,
)
from tests.helpers.cli import (  # noqa: F401
    BIN, REPO, SHARED_DATA, child_env, last_line, preprocess, python_module, run_cli, snapshot,
    user_dir,
)
from tests.helpers.corpora import (  # noqa: F401
    MERGES, PILE_SETS, WORDS, pile_documents, sentence, write_glue, write_pile_shard,
    write_tiny_bpe, write_tiny_corpus, write_wikitext,
)
from tests.helpers.references import (  # noqa: F401
    MASKED, naive_bias, naive_slopes, reference_bias, reference_module_attention,
    reference_scaled_attention, scaled_bias,
)
from tests.helpers.training import (  # noqa: F401
    COMMON, MODELS, STOCK, distributed_flags, free_port, loaded_at, logged_losses, train,
    train_args, train_distributed,
)
from tests.helpers.translation import (  # noqa: F401
    SRC_WORDS, TGT_WORDS, TINY_TRANSLATION, TRANSLATION_DIM, TRANSLATION_HEADS,
    assert_cached_decoding_matches_the_full_forward, build_translation, reference_attention,
    reference_translation_logits, stock_cross_attention, token_sentences, translation_batch,
    translation_bias_matrix, write_translation_dictionaries,
)
