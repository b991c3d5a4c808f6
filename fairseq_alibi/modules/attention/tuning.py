"""The attention backends' tuned numbers: every threshold and size fitted by timing, in one place.

These numbers were measured together: the thresholds of ``auto`` were timed with the chunk
sizes below, and a cost model was fitted to those timings. Change one and re-run the
benchmark its comment names, then re-fit what depends on it:

* :data:`WINDOWED_COST` was fitted to the chunks as they are (sizes and
  :data:`ONE_CHUNK_BYTES`): ``python -m benchmarks.windows --tables thresholds ... --json FILE``
  then ``python -m benchmarks.windows --fit FILE,...`` prints the constants from the keys each
  plan reads (docs/benchmarks.md, "auto's choice with windows", has the commands);
  :data:`WINDOWED_MAX_COST` is set from its scatter, and :data:`WINDOWED_MIN_LENGTH` is where
  it was fitted from. Re-fit after changing the chunk sizes or the limit: a test fails until
  :data:`WINDOWED_COST_FITTED_WITH` records the settings of the new fit.
* ``auto`` sends one-way windows to ``windowed`` from :data:`ONE_WAY_WINDOWED_MIN_LENGTH` keys
  on because the chunks were never slower than ``sdpa`` or the fold over every key there:
  re-run the same thresholds tables for causal and one_sided after changing the chunk sizes.
* The chunk sizes (:data:`MIN_CHUNK`, :data:`MAX_CHUNK`, :data:`CHUNK_FRACTION`) were timed
  with the chunks as views of one copy of the keys (``python -m benchmarks.windows --tables
  chunks``).
* :data:`FEW_QUERIES` is :data:`MIN_CHUNK` (a chunk of ``windowed.attention`` would hold them
  all anyway), and :data:`WINDOWED_STEP_MIN_SKIPPED` was timed on the calls it admits
  (``python -m benchmarks.decoding_windows --attention-steps``, docs/decoding.md, "Decoding
  step").
* :data:`CHUNK_BIAS_BYTES` is as large as :data:`DENSE_MASK_BUDGET` (the memory the kept chunk
  biases may take, as ``sdpa``'s one dense bias may).

The backends read them as ``tuning.NAME`` when called, so a test may patch one here. This
module imports nothing of the package: it is data.
"""

# --- auto's policy (dispatch.auto_backend) -----------------------------------------------------

#: from this many keys on, causal and one_sided attention is faster folded than with the dense
#: mask on the CPU (the fused kernel only skips masked blocks of long sequences); the
#: bidirectional variants, folded as two merged passes, were slower than the mask at every
#: length measured. Read by ``dispatch.auto_backend`` for calls without windows (with windows,
#: the one-way variants' threshold is :data:`ONE_WAY_WINDOWED_MIN_LENGTH`). docs/benchmarks.md,
#: "Attention forward"
FOLD_MIN_LENGTH = 640

#: the same where each layer has a dense bias of its own (learned scales with a row per layer,
#: which ``sdpa`` builds per layer call): causal and one_sided attention folds from this many
#: keys on (inference, 4 layers of 8 heads × 32, CPU, 1 thread: fold ÷ sdpa about 2 at 32-64
#: keys, 1.2-1.3 at 128, below 1 from 256), the bidirectional variants' two merged passes from
#: :data:`FOLD_PER_LAYER_MERGED_MIN_LENGTH` (slower at 256-512 keys, faster at 1,024-1,280).
#: Read by ``dispatch.auto_backend``. docs/learned_scales.md, "Scoring speed"
FOLD_PER_LAYER_MIN_LENGTH = 256
FOLD_PER_LAYER_MERGED_MIN_LENGTH = 1024

#: on CUDA, from this many keys on, causal attention over whole sequences in fp16/bf16 is faster
#: with compiled ``flex`` than with ``sdpa``'s dense float bias (H100, bf16, forward+backward:
#: flex ÷ sdpa 1.19-1.31 at D=64 and 1.24-1.38 at D=128 for 4096-8192 keys, 1.01-1.08 / 0.70 at
#: 1024-2048; fairseq training of a 6-layer LM at 8192 tokens: 1.17× stock vs sdpa's 0.99×).
#: Bidirectional variants were measured at 1024 keys only (flex slower there): they stay on
#: sdpa. Read by ``dispatch._flex_min_length``. docs/benchmarks.md, "GPU (H100)"
FLEX_MIN_LENGTH = 4096

#: on CUDA, from this many keys on, a whole ``causal`` sequence in fp16/bf16 with slope windows
#: runs compiled ``flex`` (its block plan skips the blocks the windows hide) rather than
#: ``sdpa``'s dense windowed bias. H200, bf16, forward+backward, 16 heads of 64, 16,384 tokens
#: a batch, T = 8: sdpa ÷ flex 0.93 at 1,024 keys, 1.51 at 2,048, 2.64 at 4,096, 8.24 at
#: 16,384. Read by ``dispatch._flex_min_length`` (for ``auto_backend`` and
#: ``splits_documents``, as the two below). docs/benchmarks.md, "GPU (H200)"
FLEX_MASKS_MIN_LENGTH = 2048

#: the same for a ``causal`` sequence with document masks (with windows or without), masked in
#: flex's block plan rather than split into its documents: the fastest of ``sdpa``'s dense
#: bias and the split ÷ flex 1.76 at 1,024 keys, 3.02-3.12 at 2,048, 7.3-12.6 at 4,096,
#: 5.6-10.7 at 16,384 (as above, documents of 256-2,048 tokens)
FLEX_DOCUMENTS_MIN_LENGTH = 1024

#: the same for the other variants (windows or documents): measured for ``symmetric`` at
#: 4,096 keys only (sdpa ÷ flex 2.31 with T = 8, 4.36 with documents, 4.91 with both)
FLEX_MASKS_OTHERS_MIN_LENGTH = 4096

#: the most memory ``sdpa``'s dense float bias may take (one per batch, shared by the layers,
#: key padding or not): beyond it ``auto`` folds every variant (with windows: ``windowed``), a
#: limit on memory, at the time the bidirectional variants' two passes cost. Read by
#: ``dispatch.auto_backend``. docs/benchmarks.md, "Encoder variants, attention"
DENSE_MASK_BUDGET = 64 * 2**20

#: on the CPU, below this many keys a whole sequence with slope windows runs ``sdpa``'s dense
#: windowed bias whatever its windows: the chunks' fixed costs dominate (``windowed`` was
#: slower at 256 and 512 keys for every variant and T = 2…16, and at 768 for the bidirectional
#: ones; :data:`WINDOWED_COST` is fitted from 512 on). Read by ``dispatch.auto_backend`` for the
#: bidirectional variants. docs/benchmarks.md, "Slope windows" and "auto's choice with windows"
WINDOWED_MIN_LENGTH = 1024

#: on the CPU, from this many keys on a whole sequence of a one-way variant (causal, one_sided)
#: with slope windows runs ``windowed`` whatever its windows (never slower than ``sdpa``'s
#: dense windowed bias or the fold without a cutoff there); below, ``sdpa``: one_sided at 640
#: keys ran 1.12-1.25x ``sdpa`` at T = 8 (its heads whose window covers most of the sequence
#: read it all, with a bias), 0.81-0.92x at 768; causal 0.57-0.96x from 640. Read by
#: ``dispatch.auto_backend``. docs/benchmarks.md, "auto's choice with windows"
ONE_WAY_WINDOWED_MIN_LENGTH = 768

#: on the CPU, a decoding step with slope windows (a few queries against a KV cache:
#: ``windowed.few_queries``) is faster with ``windowed``, each head group reading only its
#: window, than with ``sdpa``'s dense windowed row where the keys the windows skip over the
#: batch (``dispatch.step_skipped_keys``) times the square root of the head size reach this:
#: the saving grows with the keys skipped, the cost is a kernel call per head group (causal,
#: 8 heads, T = 4, 8, 16, float32, head sizes 16 and 64, batches 1-40, 1-4,096 keys: no call
#: more than 6 % slower than the faster backend; checked after at 16 and 32 heads of 64 and
#: 128, likewise). Read by ``dispatch.auto_backend``.
#: docs/decoding.md, "Decoding step" (``python -m benchmarks.decoding_windows
#: --attention-steps --cutoff T``)
WINDOWED_STEP_MIN_SKIPPED = 96_000

#: ``dispatch.windowed_cost``'s constants ``(α₁, α₂, α₃, β)``: least absolute deviations over
#: the bidirectional variants (symmetric, offset, asymmetric), T = 2, 4, 8, 16 at 768…2048
#: keys, T = 2, 8, 16 at 4096 and T = 8, 12, 16 at 8192 (symmetric, offset), of the slower of
#: forward and forward+backward (8 heads, D = 64, float32, 1 thread), with the chunk sizes and
#: :data:`ONE_CHUNK_BYTES` as they are (2026-11-29; ``α₁`` from the groups whose window drops
#: no key). Read by ``dispatch.windowed_cost``. ``python -m benchmarks.windows --fit``,
#: docs/benchmarks.md, "auto's choice with windows"
WINDOWED_COST = (1.84, 1.12, 1.11, 0.27)

#: the chunk settings :data:`WINDOWED_COST` was fitted with (its timings' conditions, below):
#: ``tests/attention/test_dispatch.py`` fails while any differs from today's, so a changed
#: chunk size cannot leave the price stale unnoticed. Re-fit (the commands above; ``--fit``
#: prints these settings beside the constants), then write both here
WINDOWED_COST_FITTED_WITH = {"MIN_CHUNK": 64, "MAX_CHUNK": 256, "CHUNK_FRACTION": 8,
                             "ONE_CHUNK_BYTES": 4 * 2**20}

#: ``auto`` picks ``windowed`` for a whole sequence where ``dispatch.windowed_cost`` predicts at
#: most this fraction of ``sdpa``'s time (below 1 by the model's scatter: no call it picks
#: was measured slower than ``sdpa``). Read by ``dispatch.auto_backend``. docs/benchmarks.md,
#: "auto's choice with windows"
WINDOWED_MAX_COST = 0.75

# --- windowed: query chunks (windowed.py) ------------------------------------------------------

#: the fewest queries a chunk holds: smaller chunks make each kernel call's query block too
#: small to pay for itself. Read by ``windowed.chunk_size`` (single heads at 8,192 keys, CPU,
#: float32, forward and forward+backward per window and chunk size: docs/benchmarks.md,
#: "Chunk sizes", ``python -m benchmarks.windows --tables chunks``)
MIN_CHUNK = 64

#: the most queries a chunk holds: the backward runs per key block of a chunk's size, and
#: larger blocks were slower for every window measured (as :data:`MIN_CHUNK`)
MAX_CHUNK = 256

#: a chunk holds about ``1 / CHUNK_FRACTION`` of its window: each query reads
#: ``back + c + ahead`` keys, ``1 + 1/8`` times its window; smaller chunks made the forward
#: faster and the backward slower (as :data:`MIN_CHUNK`)
CHUNK_FRACTION = 8

#: the largest bias of one chunk of every query (a group whose window covers most of the
#: sequence); beyond it the group runs as chunks, which read keys past the sequence's ends (a
#: two-way window at 8,192 keys: one chunk with a 256 MiB bias was 1.03-1.10× dense ``auto``,
#: chunks 4.6× faster for that head). Read by ``windowed.attention`` and
#: ``dispatch.windowed_cost``. docs/benchmarks.md, "auto's choice with windows"
ONE_CHUNK_BYTES = 4 * 2**20

#: the most memory the kept chunk biases take together (``windowed._chunk_bias``), as
#: :data:`DENSE_MASK_BUDGET` for ``sdpa``'s one dense bias. Read by ``windowed._chunk_bias``.
#: docs/benchmarks.md, "auto's choice with windows"
CHUNK_BIAS_BYTES = 64 * 2**20

#: the most queries a call against a KV cache may hold to run as ``windowed.few_queries`` (one
#: chunk of ``windowed.attention`` would hold them all anyway: at most :data:`MIN_CHUNK`). Read
#: by ``windowed.run`` and ``dispatch.auto_backend``
FEW_QUERIES = MIN_CHUNK

# --- fold (fold.py) ----------------------------------------------------------------------------

#: a fold kernel call's augmented tensors stay under max(this, an eighth of q): calls over fewer
#: heads at long lengths keep the copies (4 in forward, 8 in backward) near the size of q (the
#: fold's peak within 10 % of the unbiased attention's). Read by ``fold._heads_per_chunk``.
#: docs/benchmarks.md, "Attention forward+backward and memory". ``windowed``'s backward computes
#: the shared bias's gradient a few chunks at a time under the same budget
#: (``windowed._Chunks._bias_grad``)
CHUNK_BYTES = 4 * 2**20

# --- document masks (documents.py) -------------------------------------------------------------

#: a bucket's length is a document's ``l`` rounded up to a multiple of
#: ``2^(floor(log2 l) - GRANULE_BITS)`` (at most 1/8 more) or of :data:`MIN_GRANULE`: few
#: distinct shapes (few backend calls) for little padding. Read by ``documents.bucket_length``.
#: 1 and 2 bits were 1.05-1.29x slower (their padding), 4 and 5 within about 5 % (rows of
#: 3-14 documents, 4,096-8,192 keys): docs/benchmarks.md, "Document masks" (``python -m
#: benchmarks.documents --tables granules``)
GRANULE_BITS = 3

#: the smallest granule of a bucket's length (see :data:`GRANULE_BITS`). Read by
#: ``documents.bucket_length``
MIN_GRANULE = 16
