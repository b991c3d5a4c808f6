"""The ``masks`` part of a GPU run (``python -m benchmarks.gpu --only masks``): slope windows,
document masks and both on CUDA, each through the dense bias (``sdpa``), the split into
documents and compiled ``flex``, and what ``auto`` picks for it (its
``FLEX_MASKS_MIN_LENGTH``, ``FLEX_DOCUMENTS_MIN_LENGTH`` and ``FLEX_MASKS_OTHERS_MIN_LENGTH``
come from these tables)."""

import statistics

import torch

from benchmarks import tables
from benchmarks.gpu_parts import allow_many_flex_graphs, timed_rounds
from benchmarks.gpu_report import log
from benchmarks.packing import EOS, document_lengths, packed_rows
from fairseq_alibi.modules.attention import dispatch, documents
from fairseq_alibi.modules.bias import AlibiBias


#: the cases of :func:`run_masks`: ``(label, window cutoff, document mask)``
MASK_CASES = (("no mask", 0.0, "none"), ("T=8", 8.0, "none"), ("documents", 0.0, "eos"),
              ("documents, T=8", 8.0, "eos"))


def mask_calls(tokens, heads, variant, cutoff, mode, device):
    """``({backend: f(q, k, v)}, auto's choice)`` for a bias of ``variant`` with ``cutoff`` and
    document mask ``mode`` over the rows ``tokens``: ``sdpa`` (the dense bias, the documents'
    mask in it), ``flex`` (the block plan as its ``BlockMask``) and, with documents, ``split``
    (each document its own sequence, through ``sdpa``: what ``auto`` runs where it does not
    take ``flex``)."""
    B, L = tokens.shape
    bias = AlibiBias(heads, variant=variant, window_cutoff=cutoff, document_mask=mode)
    bias = bias.to(device)
    bias.read_tokens(tokens.to(device), EOS)
    call = bias.layer(0).for_call(None, B, L, L, False)
    found = {name: (lambda q, k, v, name=name: dispatch.attend(name, q, k, v, call))
             for name in ("sdpa", "flex")}
    if mode != "none":
        found["split"] = lambda q, k, v: documents.attention(
            lambda *part: dispatch.attend("sdpa", *part), q, k, v, call.base,
            call.documents.layout(), None)

    def choice(q, k, v):
        judged = dispatch.call_of(q, k, v, call)
        return ("split" if dispatch.splits_documents("auto", judged)
                else dispatch.resolve("auto", judged))
    return found, choice


def run_masks(part, quick, device, lengths=None, variants=None, passes=None, rounds=3):
    """Slope windows (T = 8) and document masks on CUDA, bf16, forward+backward and forward
    (on the CPU: float32, forward, a smoke run), each variant of ``variants`` (causal): the
    dense bias (``sdpa``), each document its own sequence (``split``, what ``auto`` runs where
    it does not take flex) and compiled
    ``flex`` (the block plan as its ``BlockMask``, documents as its ``mask_mod``), and what
    ``auto`` picks. Documents of 256-2,048 tokens (uniform, seeded), packed."""
    allow_many_flex_graphs()
    cuda = device == "cuda"
    lengths = lengths or ((256,) if quick else (4096, 16384))
    passes = passes or (("fwd+bwd",) if cuda else ("forward",))
    rows = []
    for variant in variants or ("causal",):
        for L in lengths:
            for which in passes:
                # the first always runs (the part's minimum is its budget); each later one
                # compiles flex afresh: about 35-45 s on an H200
                if rows and part.left() < (45 if cuda else 5):
                    part.note(f"masks: {variant} L = {L} {which} not run: "
                              f"{part.left():.0f} s left")
                    break
                rows += _masks_at(variant, L, which, quick, device, rounds)
                part.record("masks", rows)
                _masks_section(part, rows, quick, device, rounds)


def _masks_at(variant, L, which, quick, device, rounds):
    """The rows of :func:`run_masks` of one variant, length and pass."""
    cuda = device == "cuda"
    H, D = (4, 16) if quick else (16, 64)
    B = max(1, (512 if quick else 16384) // L)
    dtype = torch.bfloat16 if cuda else torch.float32
    tokens, _ = packed_rows(B, L, document_lengths("uniform", 256, 2048, seed=L))
    torch.manual_seed(0)
    grads = which == "fwd+bwd"  # PyTorch has no CPU backward for flex
    q, k, v = (torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=grads)
               for _ in range(3))
    grad = torch.randn_like(q)
    timed, chosen = {}, {}
    for label, cutoff, mode in MASK_CASES:
        found, choice = mask_calls(tokens, H, variant, cutoff, mode, device)
        chosen[label] = choice(q, k, v)
        for name, fn in found.items():
            timed[(label, name)] = (lambda fn: lambda: torch.autograd.grad(
                fn(q, k, v), (q, k, v), grad) if grads else fn(q, k, v))(fn)
    with torch.set_grad_enabled(grads):
        times = timed_rounds(timed, device, rounds, f"[masks] {variant} L={L} {which}")
    rows = []
    for label, _, _ in MASK_CASES:
        ms = {n: statistics.median(t) * 1e3 for (c, n), t in times.items() if c == label}
        # the fastest other backend ÷ flex, per round
        ratio = statistics.median(min(times[(label, n)][r] for n in ms if n != "flex")
                                  / times[(label, "flex")][r] for r in range(rounds))
        rows.append({"variant": variant, "L": L, "B": B, "H": H, "D": D, "pass": which,
                     "dtype": str(dtype).replace("torch.", ""), "mask": label, "ms": ms,
                     "others_vs_flex": ratio, "auto": chosen[label]})
        log(f"[masks] {variant} L={L} {which} {label}: "
            + ", ".join(f"{n} {t:.2f} ms" for n, t in ms.items())
            + f"; fastest other ÷ flex {ratio:.2f}; auto: {chosen[label]}")
    if cuda:
        torch.cuda.empty_cache()
    return rows


def _masks_section(part, rows, quick, device, rounds):
    cuda = device == "cuda"
    first = rows[0]
    part.section(
        f"Windows and documents: the dense bias, the split into documents and flex "
        f"({first['dtype']}, H = {first['H']}, D = {first['D']}, B·L = {first['B'] * first['L']})",
        tables.table(["variant", "L", "pass", "mask", "sdpa ms", "split ms", "flex ms",
                      "fastest other ÷ flex", "auto picks"],
                     [[r["variant"], r["L"], r["pass"], r["mask"], f"{r['ms']['sdpa']:.2f}",
                       f"{r['ms']['split']:.2f}" if "split" in r["ms"] else "–",
                       f"{r['ms']['flex']:.2f}", f"{r['others_vs_flex']:.2f}", r["auto"]]
                      for r in rows]),
        f"Documents of 256-2,048 tokens (uniform, seeded), packed; T = 8 slope windows. "
        f"Median of {rounds} paired rounds, each the median of CUDA-event timings. sdpa reads "
        f"the dense bias with the mask in it; split attends each document as its own sequence "
        f"through sdpa; flex skips the blocks its block plan hides." if cuda else
        "A smoke run: CPU timings of eager flex mean nothing.")
