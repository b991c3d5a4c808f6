"""Everything importing the package does to the process, in one place.

``import fairseq_alibi`` (or fairseq's ``--user-dir``, which imports it) calls :func:`register`
once. Each side effect, and why:

1. **fairseq's registries** (models, architectures, the ``lm_distillation`` criterion, the
   ``hf_tokenizer`` BPE): importing :mod:`fairseq_alibi.models`, :mod:`~fairseq_alibi.criterions`
   and :mod:`~fairseq_alibi.hf_tokenizer` registers them (fairseq's decorators), including
   ``alibi_<arch>`` for every stock ``transformer_lm`` and ``transformer`` architecture.
2. **Stock architectures refuse the forks' checkpoints**
   (:func:`~fairseq_alibi.models.stock_guards.guard_stock_architectures`): fairseq's
   ``ARCH_CONFIG_REGISTRY`` entries of ``roberta``, ``transformer`` and ``transformer_lm`` are
   wrapped to stop an unconverted fork checkpoint with the convert command instead of a deep
   ``load_state_dict`` failure; after (1), so that the mirrors wrap the stock functions.
3. **Safe loading** (:func:`~fairseq_alibi.safe_loading.allow_fairseq_checkpoints`): the classes
   of argparse-era checkpoints join ``torch.load(weights_only=True)``'s allow-list; the safe
   loader stays on.
4. **The one-line fix after a failure** (:func:`~fairseq_alibi.error_hints.install`): a
   ``sys.excepthook`` that lets Python print the traceback, then adds the fix fairseq buries.
5. **Misspelt load-time overrides refused**
   (:func:`~fairseq_alibi.models.override_keys.guard_override_keys`): fairseq's
   ``checkpoint_utils.load_checkpoint_to_cpu`` is wrapped so that an ``arg_overrides`` key
   (``--model-overrides``, the hub's keyword arguments) that starts like one of the package's
   options but names none of the checkpoint model's is a one-line error instead of being
   silently dropped; other keys and stock models load as stock.
6. **A clean exit** (:func:`~fairseq_alibi.exit_cleanup.install`): an ``atexit`` handler that
   stops fairseq's batch-prefetch threads (Python 3.11 aborts a finished run otherwise).

7. **Sampling that ends at the EOS guard's floor**
   (:func:`~fairseq_alibi.modules.cross_position.let_sampling_end_at_the_floor`): fairseq's
   ``Sampling.step`` is wrapped so that a row whose every probability is 0 in float32 (the
   translation EOS guard's last step, EOS alone open at its floor) samples its best candidate
   instead of failing with ``invalid multinomial distribution``; every other row is unchanged.

8. **What ``fairseq-train`` would start wrongly without a word, refused**
   (:func:`~fairseq_alibi.train_guards.guard_training_start`): fairseq's
   ``checkpoint_utils.load_checkpoint``, which every worker calls before training, is wrapped
   so that a ``--restore-file`` that names no file (stock trains a random initialisation to the
   end, exit status 0), a checkpoint saved mid-epoch by another number of workers, and workers
   given different ALiBi options each stop the run with one line.

9. **fairseq's EMA of shared parameters**
   (:func:`~fairseq_alibi.modules.compact.let_ema_follow_shared_parameters`): fairseq's
   ``EMA.__init__`` (``--store-ema``) is wrapped so that its copy of one of the package's
   models gives each shared layer (``--share-decoder-layers``) and tied embedding a tensor of
   its own: fairseq's update, once per state-dict key, decayed a shared tensor once per key.

Not here: the hydra resolver ``fairseq_alibi.user_dir``, registered when hydra imports
:mod:`fairseq_alibi.hydra_support` (the shipped configs' callback), never by ``import
fairseq_alibi``.
"""

_registered = False


def register():
    """Make the side effects above (idempotent)."""
    global _registered
    if _registered:
        return
    from fairseq_alibi import criterions, error_hints, exit_cleanup, hf_tokenizer, models  # noqa: F401
    from fairseq_alibi.models.override_keys import guard_override_keys
    from fairseq_alibi.models.stock_guards import guard_stock_architectures
    from fairseq_alibi.modules.compact import let_ema_follow_shared_parameters
    from fairseq_alibi.modules.cross_position import let_sampling_end_at_the_floor
    from fairseq_alibi.train_guards import guard_training_start
    from fairseq_alibi.safe_loading import allow_fairseq_checkpoints

    guard_stock_architectures()
    guard_override_keys()
    allow_fairseq_checkpoints()
    error_hints.install()
    exit_cleanup.install()
    let_sampling_end_at_the_floor()
    guard_training_start()
    let_ema_follow_shared_parameters()
    _registered = True
