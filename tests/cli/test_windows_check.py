"""``fairseq-alibi windows``: a head built to be an attention sink is named, its cutoff refused
without sinks and recommended with the first position kept (the same model without it needs
none; with the sinks loaded it is the dense model), a tiny LM's verdict follows the perplexity
change it printed, the verdict's rule, a model with a document mask tries the sinks of each
document, an encoder's windows (both sides) judged on its masked tokens, and bad input as one
line naming the argument."""

import csv
import hashlib
import math
import random
import re
import subprocess
import sys

import pytest
import torch

from fairseq_alibi.cli.windows_check import load_model, main
from fairseq_alibi.cli.windows_inputs import (Masking, Pairs, WindowsInputError,
                                              checkpoint_config, masked_token_nll, pair_nll,
                                              read_pairs, read_stream, sample_starts, token_nll)
from fairseq_alibi.cli.windows_report import (Candidate, CutoffRow, HeadRow, Judged, judge,
                                              kept_share, kept_share_two_way, verdict)
from tests.helpers.checkpoints import load, saved_in_process
from tests.helpers.cli import REPO, child_env, preprocess, run_cli, user_dir
from tests.helpers.training import STOCK

EOS = 2  # fairseq's </s>: the first input token of a split's stream
WORDS = 120
SAVED = REPO / "tests" / "fixtures" / "saved_models"  # tiny masked-LM encoders, their dict.txt


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as the subprocess tests run: a tiny model's ops are too small to share, and
    on a busy machine two threads wait on each other at every op."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def windows(capsys, *args):
    """``(exit status, stdout, stderr)`` of the tool run in this process."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def rows_of(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def one_line_data(tmp_path_factory, tiny_lm_data):
    """A ``valid`` split of one line of words (the tiny corpus's dictionary): its stream starts
    with </s> and holds no other, so a sequence starting at offset 0 has </s> first, only."""
    root = tmp_path_factory.mktemp("one_line")
    rng = random.Random(3)
    (root / "valid.txt").write_text(" ".join(f"w{rng.randrange(60)}" for _ in range(WORDS)) + "\n")
    preprocess("--only-source", "--srcdict", tiny_lm_data / "dict.txt", "--validpref",
               root / "valid.txt", "--destdir", root / "bin", "--workers", "1")
    return root / "bin"


def with_sink_head(checkpoint, path):
    """``checkpoint`` with layer 0's head 0 (slope 1/4) rebuilt as an attention sink: its query
    is a constant and its key the layer input's component along </s>'s (scaled) embedding, so
    every query gives </s> a logit 60 nats above any other token's, beyond any ALiBi distance
    penalty of a short sequence (1/4 per token). Layer 1's head 0 (slope 1/4 too: the other
    head whose window at T = 8, 32 keys, is shorter than the 121-token stream) gets zero values:
    what it attends to no longer changes the output, so windows change only what the sink head
    loses. Saved at ``path``."""
    state = load(checkpoint)
    weights = state["model"]
    inputs = weights["decoder.embed_tokens.weight"] * math.sqrt(32)  # the layer's input per token
    direction = inputs[EOS] / inputs[EOS].norm()
    along = inputs @ direction
    margin = float(along[EOS] - torch.cat([along[:EOS], along[EOS + 1:]]).max())
    assert margin > 0.5, margin
    head = slice(0, 8)  # head 0 of 4 heads of 32 dimensions
    attention = "decoder.layers.0.self_attn."
    for name in ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias"):
        weights[attention + name][head] = 0
    weights[attention + "q_proj.bias"][0] = 60 * math.sqrt(8) / margin  # q·k is scaled by 8^-1/2
    weights[attention + "k_proj.weight"][0] = direction
    for name in ("v_proj.weight", "v_proj.bias"):
        weights["decoder.layers.1.self_attn." + name][head] = 0
    torch.save(state, path)
    return path


def test_a_sink_head_is_named_refused_without_sinks_and_kept_with_them(
        trained_lm_checkpoint, one_line_data, tmp_path, capsys):
    sink = with_sink_head(trained_lm_checkpoint, tmp_path / "sink.pt")
    before = digest(sink)
    length = WORDS + 1  # the whole stream: the one sequence starts at offset 0, with </s>
    found = {}
    for name, checkpoint, sinks in (("sink", sink, "0,1,4"), ("plain", trained_lm_checkpoint,
                                                              "0,4")):
        code, out, err = windows(capsys, checkpoint, one_line_data, "--lengths", length,
                                 "--tokens", length, "--cutoffs", 8, "--sinks", sinks,
                                 "--out", tmp_path / name)
        assert code == 0, err[-3000:]
        heads = {(r["layer"], r["head"]): r for r in rows_of(tmp_path / name /
                                                             "windows_heads.csv")}
        found[name] = (out, out.splitlines()[-1], heads[("0", "0")], heads,
                       rows_of(tmp_path / name / "windows_cutoffs.csv"))
    out, last, head, heads, cutoffs = found["sink"]
    assert f"L={length} (1 × {length})" in out and f"attention mass on 1 × {length}" in out
    # T = 8 without sinks is refused: a change of tens of times the tolerance (on one sequence
    # of 121 tokens its 2σ is larger still: not within, undecided), the sink head named; its
    # mass sits on position 0 (</s>), so one sink is what it needs, and with it T = 8 passes
    assert last == "recommended: --alibi-window-cutoff 8 --alibi-window-sinks 1", out
    assert [r["sinks"] for r in cutoffs] == ["0", "1"], cutoffs
    assert cutoffs[0]["status"] in ("beyond", "undecided") and cutoffs[1]["status"] == "within"
    assert float(cutoffs[0]["change_pct_L121"]) > 1  # ten times the tolerance, 0.1 %
    assert float(cutoffs[1]["change_pct_L121"]) == 0 == float(cutoffs[1]["margin_pct_L121"])
    assert [r["decoding_cache_keys"] for r in cutoffs] == ["2048", "2049"]  # max W_h + S
    assert cutoffs[0]["sink_heads"] == "layer 0 head 0" and cutoffs[0]["sinks_needed"] == "1"
    assert ("sink head: layer 0 head 0 at T=8 (W=32)" in out
            and "it needs --alibi-window-sinks 1" in out), out
    assert "T=8: without sinks " in out and "; with --alibi-window-sinks 1 within (+0.000" in out
    assert head["window"] == "32" and head["sink_head"] == "True" and head["sinks_needed"] == "1"
    assert float(head["mass_beyond_mean"]) > 0.9 and float(head["share_on_first_1"]) > 0.99
    assert [k for k, r in heads.items() if r["sink_head"] == "True"] == [("0", "0")]
    assert digest(sink) == before  # the checkpoint is only read
    out, last, head, _, cutoffs = found["plain"]  # the same model without the sink: no sinks
    assert last == "recommended: --alibi-window-cutoff 8", out
    assert [r["sinks"] for r in cutoffs] == ["0"] and "sink head:" not in out, out
    assert head["sink_head"] == "False" and float(head["mass_beyond_mean"]) < 0.01


def test_the_verdict_follows_the_printed_perplexity_change(trained_lm_checkpoint, tiny_lm_data,
                                                           tmp_path, capsys):
    out_dir = tmp_path / "report"
    code, out, err = windows(capsys, trained_lm_checkpoint, tiny_lm_data, "--tokens", 256,
                             "--cutoffs", "16,1,4", "--out", out_dir)
    assert code == 0, err[-3000:]
    lines = out.splitlines()
    # the training length 16 times 16: one sequence of 256 tokens (--tokens 256); the
    # attention mass on the sequences of the shortest length, 1,024 tokens of them
    assert ("at most 256 tokens per cutoff, in whole sequences (at least one), at L=256 "
            "(1 × 256)") in lines[0], lines[0]
    assert "attention mass on 4 × 256 tokens" in lines[0], lines[0]
    cutoffs = rows_of(out_dir / "windows_cutoffs.csv")
    assert sorted({float(r["cutoff"]) for r in cutoffs}) == [1.0, 4.0, 16.0]
    start = next(i for i, line in enumerate(lines) if line.startswith("| T "))
    printed = {(cells[0], cells[1]): cells for cells in
               ([c.strip() for c in line.strip("|").split("|")] for line in
                lines[start + 2:lines.index("", start)])}
    expected, evaluated, tried = "not recommended: ", True, []
    for row in cutoffs:
        t, sinks = f"{float(row['cutoff']):g}", row["sinks"]
        assert printed[(t, sinks)][4] == row["status"], (printed, row)  # the verdict column
        if not evaluated:  # a smaller T passed: the later ones are not scored
            assert row["status"] == "not evaluated" and printed[(t, "")][3] == "not scored", row
            continue
        # S = 0 first, then each S > 0 of --sinks (default 0,4) where it did not pass
        assert (float(t), int(sinks)) == (
            (tried[-1][0], 4) if tried and tried[-1] == (float(t), 0) else (float(t), 0)), row
        tried.append((float(t), int(sinks)))
        change, margin = float(row["change_pct_L256"]), float(row["margin_pct_L256"])
        assert printed[(t, sinks)][3] == (f"{change:+.3f} ± {margin:.3f} "
                                          f"({int(row['tokens_L256'])})")
        assert float(row["worst_change_pct"]) == change
        rule = ("within" if abs(change) + margin <= 0.1 else
                "beyond" if abs(change) - margin > 0.1 else "undecided")
        short = rule == "within" and int(sinks) < int(row["sinks_needed"])
        assert row["status"] == ("within, sinks short" if short else rule), row
        assert int(row["tokens_L256"]) == 256  # one sequence: all there is to score
        if row["status"] == "within":
            expected, evaluated = (f"recommended: --alibi-window-cutoff {t}"
                                   + (f" --alibi-window-sinks {sinks}" if sinks != "0" else "")
                                   ), False
    assert lines[-1].startswith(expected), (lines[-1], cutoffs)
    assert lines[-1] in (out_dir / "windows.md").read_text()
    assert (out_dir / "windows.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    heads = rows_of(out_dir / "windows_heads.csv")
    assert len(heads) == 2 * 4 * 3  # layers x heads x cutoffs: measured for every T
    # head 0's slope 1/4: W = ceil(T / m) = 4 T, the mass beyond it about e^-T
    steep = {r["cutoff"]: r for r in heads if r["layer"] == "0" and r["head"] == "0"}
    assert [steep[t]["window"] for t in ("1.0", "4.0", "16.0")] == ["4", "16", "64"]
    assert 0 < float(steep["16.0"]["mass_beyond_max"]) < float(steep["1.0"]["mass_beyond_mean"])


def judged(change, margin=0.01, tokens=4096, status=None):
    status = status or ("within" if abs(change) + margin <= 0.1 else
                        "beyond" if abs(change) - margin > 0.1 else "undecided")
    return Judged(tokens, 10.0, 10.0, change, margin, status)


def cutoff_row(t, change, sink_heads=(), margin=0.01, evaluated=True, sinks=(), needs=4):
    """A row at ``T = t``: without sinks ``change`` (percent) at the longest length, then each
    ``(S, change)`` of ``sinks``; ``sink_heads`` ``(layer, head)`` need ``needs`` sinks."""
    heads = [HeadRow(layer, head, 0.25, t, 8, 10, 0.5, 0.9, 1.0, {0: 0.0, 4: 0.99},
                     {0: 0.0, 4: 0.5}, True, needs) for layer, head in sink_heads]
    tried = [Candidate(t, s, {256: judged(c / 2), 64: judged(c, margin)}, 8 + s)
             for s, c in [(0, change), *sinks]]
    return CutoffRow(t, [8], heads, tried if evaluated else [])


def test_the_verdict_is_the_first_cutoff_within_tolerance_that_keeps_its_sinks():
    rows = [cutoff_row(4.0, 0.5, sinks=[(4, 0.4)]), cutoff_row(8.0, -0.05, [(1, 2)]),
            cutoff_row(12.0, 0.02), cutoff_row(16.0, 0.0, evaluated=False)]
    assert verdict(rows, 0.1, [0, 4]) == "recommended: --alibi-window-cutoff 12"
    line = verdict(rows[:2], 0.1, [0, 4])  # T = 8 within without sinks, which it needs
    assert line.startswith("not recommended: at T=8 perplexity changes -0.050 ± 0.010 % on "
                           "4,096 tokens (within 0.1 %)"), line
    assert "layer 1 head 2 puts 0.50 of its attention" in line
    assert line.endswith("windows need the first 4 positions kept (--alibi-window-sinks 4), "
                         "not scored with them"), line
    # with them scored: the first (T, S) that passes is the verdict, sinks named
    rows[1] = cutoff_row(8.0, -0.05, [(1, 2)], sinks=[(4, 0.03)])
    assert verdict(rows, 0.1, [0, 4]) == ("recommended: --alibi-window-cutoff 8 "
                                          "--alibi-window-sinks 4")
    rows[1] = cutoff_row(8.0, -0.05, [(1, 2)], sinks=[(4, 0.3)])
    line = verdict(rows[:2], 0.1, [0, 4])  # with them: beyond
    assert line.endswith("windows need the first 4 positions kept (--alibi-window-sinks 4), and "
                         "with --alibi-window-sinks 4 perplexity changes +0.300 ± 0.010 % on "
                         "4,096 tokens (beyond)"), line
    # a head whose mass sits on fewer positions passes with those; one that needs 4 does not
    # pass with 1 (within, sinks short)
    for needs, passing in ((1, 1), (4, 4)):
        row = cutoff_row(8.0, 0.5, [(0, 0)], sinks=[(1, 0.02), (4, 0.03)], needs=needs)
        assert verdict([row], 0.1, [0, 1, 4]).endswith(f"--alibi-window-sinks {passing}")
    line = verdict(rows[:1], 0.1, [0, 4])  # neither with nor without sinks: the closest
    assert line == ("not recommended: no cutoff of 4 keeps perplexity within 0.1 % of dense at "
                    "every length, without sinks or with --alibi-window-sinks 4 (closest: T=4 "
                    "with 4 sinks, +0.400 ± 0.010 % on 4,096 tokens); try larger --cutoffs")
    line = verdict([cutoff_row(4.0, 0.5, [(0, 0)], sinks=[(4, 0.3)])], 0.1, [0, 4])
    assert line == ("not recommended: no cutoff of 4 keeps perplexity within 0.1 % of dense at "
                    "every length, without sinks or with --alibi-window-sinks 4 (closest: T=4 "
                    "with 4 sinks, +0.300 ± 0.010 % on 4,096 tokens); at T=4 layer 0 head 0 puts "
                    "0.50 of its attention (mean) beyond its window on the first 4 positions (an "
                    "attention sink): windows need the first 4 positions kept "
                    "(--alibi-window-sinks 4), and with --alibi-window-sinks 4 perplexity changes "
                    "+0.300 ± 0.010 % on 4,096 tokens (beyond)"), line
    line = verdict([cutoff_row(4.0, 0.5)], 0.1, [0])  # --sinks 0: none tried
    assert line == ("not recommended: no cutoff of 4 keeps perplexity within 0.1 % of dense at "
                    "every length (closest: T=4, +0.500 ± 0.010 % on 4,096 tokens); try larger "
                    "--cutoffs")
    line = verdict([cutoff_row(4.0, 0.5), cutoff_row(6.0, 0.08, margin=0.05)], 0.1, [0])
    assert line.endswith("(closest: T=6, +0.080 ± 0.050 % on 4,096 tokens); T=6 undecided on "
                         "the tokens scored: give more --tokens (or a longer --gen-subset), or try "
                         "larger --cutoffs"), line
    two = [cutoff_row(8.0, 0.3, [(0, 0), (1, 2)])]
    assert "2 heads put their attention beyond their windows" in verdict(two, 0.1, [0, 4])
    # windows as long as the sequences scored drop nothing: every score the same, no verdict
    idle = CutoffRow(4.0, [300, None], [], [Candidate(4.0, 0, {256: judged(0.0, 0.0)}, 300)])
    assert verdict([idle], 0.1, [0]) == (
        "not recommended: T=4 changes no score of the sequences scored (windows of up to 300 "
        "keys, sequences of 256 tokens): its windows drop no key there, and the check cannot "
        "tell whether it is safe: give --lengths longer than its windows")
    assert verdict([cutoff_row(4.0, 0.5), idle], 0.1, [0]).endswith(
        "try larger --cutoffs; T=4 changes no score of the sequences scored (windows of up to "
        "300 keys, sequences of 256 tokens): its windows drop no key there, and the check "
        "cannot tell whether it is safe: give --lengths longer than its windows")
    # a checkpoint saved with sinks: the verdict says how many to keep, none included
    saved = CutoffRow(8.0, [8], [], [Candidate(8.0, 0, {256: judged(0.0)}, 8, saved_sinks=2)])
    assert verdict([saved], 0.1, [0]) == ("recommended: --alibi-window-cutoff 8 "
                                          "--alibi-window-sinks 0")


def test_the_stopping_rule():
    """Within when |Δ| + 2σ is within the tolerance, beyond when |Δ| - 2σ is not, σ the
    standard error of the mean per-token change over blocks of 256 tokens."""
    noise = torch.randn(4096, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for shift, scale, status in ((0.0, 0.0, "within"), (0.0005, 0.001, "within"),
                                 (0.01, 0.001, "beyond"), (0.0009, 0.02, "undecided")):
        found = judge(shift + scale * noise, 4096 * 2.0, 0.1)
        means = (shift + scale * noise).view(16, 256).mean(1)
        assert found.margin == pytest.approx(
            2 * 100 * math.exp(shift + scale * float(noise.mean())) * float(means.std()) / 4)
        assert found.change == pytest.approx(100 * math.expm1(shift + scale * noise.mean()))
        assert found.status == status and found.tokens == 4096, (shift, scale, found)
        assert found.dense_ppl == pytest.approx(math.exp(2.0))
        assert found.ppl == pytest.approx(math.exp(2.0 + shift + scale * float(noise.mean())))
    short = judge(torch.full((40,), 0.02, dtype=torch.float64), 40.0, 0.1)  # 20 blocks of 2
    assert short.margin == 0 and short.status == "beyond"


def test_kept_keys_and_start_offsets():
    for window, length in ((0, 5), (3, 10), (9, 10), (20, 10), (None, 7)):
        for sinks in (0, 1, 4, 12):
            kept = sum(1 for i in range(length) for j in range(i + 1)
                       if window is None or i - j <= window or j < sinks)
            assert kept_share(window, length, sinks) == pytest.approx(
                kept / (length * (length + 1) / 2)), (window, length, sinks)
    starts = sample_starts(1000, 64, 4096, seed=1)
    assert starts == sample_starts(1000, 64, 4096, seed=1) != sample_starts(1000, 64, 4096, 2)
    # as many as fit without overlapping (15 of 64 tokens in 1000): no token is scored twice
    assert len(starts) == 15 and 0 <= min(starts) <= max(starts) <= 936
    assert all(b - a >= 64 for a, b in zip(sorted(starts), sorted(starts)[1:]))
    assert sample_starts(1000, 64, 128, seed=1) == starts[:2]  # a prefix of the same order
    assert sample_starts(121, 121, 4096, seed=1) == [0]  # as many as there are
    assert len(sample_starts(1158, 512, 100_000, seed=1)) == 2


def with_document_mask(checkpoint, path):
    """``checkpoint`` as if trained with ``--alibi-document-mask eos``, saved at ``path``."""
    state = load(checkpoint)
    state["cfg"]["model"]["alibi_document_mask"] = "eos"
    torch.save(state, path)
    return path


def test_a_model_with_a_document_mask_tries_sinks_like_any_other(trained_lm_checkpoint,
                                                                  tiny_lm_data, tmp_path,
                                                                  capsys):
    """Its sinks are each document's first positions: the default --sinks are tried and the
    share of the mass beyond the windows on them judged, as for any model."""
    masked = with_document_mask(trained_lm_checkpoint, tmp_path / "masked.pt")
    code, out, err = windows(capsys, masked, tiny_lm_data, "--tokens", 64, "--cutoffs", 8,
                             "--out", tmp_path / "out")
    assert code == 0, err[-3000:]
    heads = rows_of(tmp_path / "out" / "windows_heads.csv")
    assert "share_on_first_4" in heads[0]
    assert "document-mask" not in out


def test_the_sink_share_is_on_the_first_positions_of_the_querys_document():
    """Each query puts its weight on its document's first key (documents at 0 and 6 of 12
    positions, found as the model finds them: an ``</s>`` at 6, ``--alibi-document-mask
    eos``): with the documents known, all the mass beyond the window is on the first
    position; without a document mask, read as one sequence, only the first document's is.
    The queries with keys beyond the window are those with such keys in their own document:
    3 … 5 and 9 … 11 (a window of 2 keys), not 6 … 8, whose earlier keys are another's."""
    from fairseq_alibi.cli.windows_check import MassMeter
    from fairseq_alibi.modules.bias import AlibiBias

    CUTOFF = 2 / 256  # a window of 2 keys
    EOS = 2
    tokens = torch.full((1, 12), 5)
    tokens[0, 6] = EOS
    probs = torch.zeros(1, 12, 12)
    probs[0, torch.arange(12), torch.tensor([0] * 6 + [6] * 6)] = 1.0
    shares, queries = [], []
    for mode in ("eos", "none"):
        class Attention:  # what the meter reads of an attention: its layer's bias
            alibi = AlibiBias(1, variant="causal", document_mask=mode).layer(0)  # slope 1/256

        Attention.alibi.stack.read_tokens(tokens, EOS)  # what the stack's forward does
        meter = MassMeter([Attention()], [CUTOFF], [1])
        meter.add(0, probs)
        shares.append(meter.on_sinks[(0, 0, CUTOFF, 1)])
        masses = torch.cat(meter.beyond[(0, 0, CUTOFF)])
        assert float(masses.sum()) == 6.0
        queries.append(masses.numel())
    assert shares == [6.0, 3.0] and queries == [6, 9]


def bad_inputs(ckpt, data, tmp_path):
    """``(arguments, what the one line names, part of it)`` for each kind of bad input."""
    stock = saved_in_process(tmp_path / "stock" / "checkpoint.pt", data, *STOCK["lm"])
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"PK\x03\x04 not a checkpoint")
    (tmp_path / "empty.txt").write_text("")
    preprocess("--only-source", "--srcdict", data / "dict.txt", "--testpref",
               tmp_path / "empty.txt", "--destdir", tmp_path / "empty", "--workers", "1")
    (tmp_path / "other.txt").write_text("x y z\n" * 20)  # another, smaller vocabulary
    preprocess("--only-source", "--trainpref", tmp_path / "other.txt", "--validpref",
               tmp_path / "other.txt", "--destdir", tmp_path / "other", "--workers", "1")
    translation = SAVED / "translation_pointer" / "checkpoint.pt"
    return [
        ([tmp_path / "missing.pt", data], "CKPT", "no checkpoint at"),
        ([corrupt, data], "CKPT", "cannot read"),
        ([stock, data], "CKPT", "TransformerLanguageModel has no ALiBi self-attention"),
        ([translation, data], "DATA", "dict.src.txt'; give the folder fairseq-preprocess "
         "wrote for this translation model"),
        ([ckpt, tmp_path / "nowhere"], "DATA", "no dict.txt"),
        ([ckpt, tmp_path / "other", "--lengths", "8"], "CKPT",
         "trained with a dictionary of 64 symbols, but the data directory"),
        ([ckpt, tmp_path / "empty", "--gen-subset", "test"], "--gen-subset", "holds no tokens"),
        ([ckpt, data, "--gen-subset", "valid7"], "--gen-subset", "no split 'valid7'"),
        ([ckpt, data, "--lengths", "16,5000"], "--lengths", "holds 1,085 tokens"),
        ([ckpt, data, "--lengths", "64,1"], "--lengths", "'1' is not a sequence length >= 2"),
        ([ckpt, data, "--sinks", "0,-1"], "--sinks", "'-1' is not a number of first positions"),
        ([ckpt, data, "--sinks", "257"], "--sinks", "more than the sequences the attention is "
         "measured on (256 tokens"),
        ([ckpt, data, "--lengths", "3"], "--gen-subset", "sequences of 3 tokens are too short "
         "to check windows (the default --sinks 0,4 keeps the first 4)"),
        ([ckpt, data, "--cutoffs", "0"], "--cutoffs", "'0' is not a positive finite number"),
        ([ckpt, data, "--cutoffs", "4,nan"], "--cutoffs", "'nan' is not a positive finite"),
        ([ckpt, data, "--cutoffs", "inf"], "--cutoffs", "'inf' is not a positive finite"),
        ([ckpt, data, "--cutoffs=-2"], "--cutoffs", "'-2' is not a positive finite"),
        ([ckpt, data, "--cutoffs", "8,x"], "--cutoffs", "'x' is not a positive finite"),
        ([ckpt, data, "--tokens", "0"], "--tokens", "'0' is not a number of tokens >= 1"),
        ([ckpt, data, "--tolerance", "nan"], "--tolerance", "is not a finite percentage"),
        ([ckpt, data, "--bleu", "0"], "--bleu", "'0' is not a number of sentence pairs >= 1"),
        ([ckpt, data, "--bleu", "5"], "--bleu", "BLEU needs a translation model, and CKPT"),
        ([ckpt], "DATA", "the following arguments are required: DATA"),
    ]


def test_bad_input_is_one_line_naming_the_argument(trained_lm_checkpoint, tiny_lm_data,
                                                   tmp_path, capsys):
    for args, names, message in bad_inputs(trained_lm_checkpoint, tiny_lm_data, tmp_path):
        code, out, err = windows(capsys, *args, "--out", tmp_path / "out")
        last = err.strip().splitlines()[-1]
        assert code == 2 and out == "", (args, out, err[-2000:])
        assert last.startswith("fairseq-alibi windows: error: "), (args, err[-2000:])
        assert names in last and message in last and "Traceback" not in err, (args, last)
    assert not (tmp_path / "out").exists()
    (tmp_path / "a-file").write_text("")  # refused before the work, not after it
    code, _, err = windows(capsys, trained_lm_checkpoint, tiny_lm_data, "--out",
                           tmp_path / "a-file")
    assert code == 2 and err.strip().endswith(f"--out {tmp_path / 'a-file'} is a file: give a "
                                              "folder for the report"), err[-2000:]
    (tmp_path / "earlier").mkdir()  # another model's report is not replaced without a word
    (tmp_path / "earlier" / "windows.md").write_text("an earlier report")
    code, _, err = windows(capsys, trained_lm_checkpoint, tiny_lm_data, "--out",
                           tmp_path / "earlier")
    assert code == 2 and err.strip().endswith(
        f"--out {tmp_path / 'earlier'} holds an earlier report (windows.md): give another "
        "--out, or pass --overwrite to replace it"), err[-2000:]
    assert (tmp_path / "earlier" / "windows.md").read_text() == "an earlier report"


@pytest.mark.slow
def test_a_model_saved_with_a_backend_that_cannot_drop_keys_is_checked_with_one_that_can(
        trained_lm_checkpoint, tiny_lm_data, tmp_path, capsys):
    """Saved with ``--alibi-attention fold``, a cutoff at load is refused; the tool measures
    each cutoff with ``auto`` (the same perplexity as the model saved with ``auto``), says so,
    and names it in the verdict, which then loads."""
    state = load(trained_lm_checkpoint)
    state["cfg"]["model"]["alibi_attention"] = "fold"
    torch.save(state, tmp_path / "fold.pt")
    found = {}
    for name, path in (("auto", trained_lm_checkpoint), ("fold", tmp_path / "fold.pt")):
        code, out, err = windows(capsys, path, tiny_lm_data, "--tokens", 64, "--cutoffs", 8,
                                 "--sinks", 0, "--out", tmp_path / name)
        assert code == 0, err[-3000:]
        found[name] = out.splitlines()
    assert found["fold"][-1] == found["auto"][-1] + " --alibi-attention auto", found["fold"][-1]
    assert "CKPT saved with --alibi-attention fold, which cannot drop keys" in "\n".join(
        found["fold"])
    auto, fold = (rows_of(tmp_path / name / "windows_cutoffs.csv") for name in ("auto", "fold"))
    assert [r["status"] for r in auto] == [r["status"] for r in fold]  # dense: fold's rounding
    assert [float(r["ppl_L256"]) for r in fold] == pytest.approx(
        [float(r["ppl_L256"]) for r in auto], rel=1e-6)
    flags = found["fold"][-1].split(": ", 1)[1].split()
    overrides = {flag[2:].replace("-", "_"): value for flag, value in zip(flags[::2], flags[1::2])}
    load_model(tmp_path / "fold.pt", read_stream(checkpoint_config(tmp_path / "fold.pt")[0],
                                                 tiny_lm_data, "valid")[0],
               {k: float(v) if k.endswith("cutoff") else v for k, v in overrides.items()},
               torch.device("cpu"))


def test_the_command_line(trained_lm_checkpoint, tiny_lm_data, tmp_path):
    """``python -m fairseq_alibi windows``: the verdict is the last line of stdout, and a bad
    input exits with status 2 and its one line, no traceback."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "fairseq_alibi", "windows",
                               *map(str, args)], cwd=REPO, env=child_env(), text=True,
                              capture_output=True, timeout=300)

    done = run(trained_lm_checkpoint, tiny_lm_data, "--tokens", 64, "--cutoffs", 8,
               "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith(("recommended: --alibi-window-cutoff 8",
                                                    "not recommended: ")), done.stdout
    bad = run(trained_lm_checkpoint, tiny_lm_data, "--cutoffs", "nan")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert bad.stderr.strip().splitlines()[-1] == (
        "fairseq-alibi windows: error: argument --cutoffs: 'nan' is not a positive finite "
        "number of nats (e.g. --cutoffs 4,8)")


def perplexities(checkpoint, data, *overrides):
    """The perplexity of ``data``'s whole ``valid`` stream (one sequence, </s> first) under
    ``checkpoint`` loaded with each of ``overrides`` (load-time overrides), as the tool loads
    and scores it."""
    task, source, target = read_stream(checkpoint_config(checkpoint)[0], data, "valid")
    found = []
    with torch.no_grad():
        for override in overrides:
            model = load_model(checkpoint, task, override, torch.device("cpu"))
            found.append(token_nll(model, source, target))
    return found


def test_the_sink_model_with_its_sinks_loaded_is_the_dense_model(trained_lm_checkpoint,
                                                                one_line_data, tmp_path):
    """What the tool recommends for the sink model, run as a user runs it (the load-time
    overrides T = 8, S = 4): every token's log-probability within 1e-5 of the dense model's, so
    its perplexity too; without the sinks, 1 % or more off. Only the sink head's window can
    matter: at T = 8 the windows shorter than the 121 tokens are head 0's of each layer (slope
    1/4: 32 keys), and layer 1's has no output (:func:`with_sink_head`); as trained, its window
    alone moves a token's log-probability by up to 2e-4."""
    sink = with_sink_head(trained_lm_checkpoint, tmp_path / "sink.pt")
    cut = {"alibi_window_cutoff": 8.0}
    dense, windowed, kept = perplexities(sink, one_line_data, {}, dict(cut, alibi_window_sinks=0),
                                         dict(cut, alibi_window_sinks=4))
    assert dense.numel() == WORDS + 1
    torch.testing.assert_close(kept, dense, atol=1e-5, rtol=0)
    assert math.exp(float(kept.mean())) == pytest.approx(math.exp(float(dense.mean())), rel=1e-5)
    assert math.exp(float(windowed.mean() - dense.mean())) > 1.01


@pytest.fixture(scope="module")
def encoder_data(tmp_path_factory):
    """A ``valid`` split of lines of the saved encoders' words (their dict.txt)."""
    root = tmp_path_factory.mktemp("encoder_data")
    rng = random.Random(5)
    (root / "valid.txt").write_text("".join(
        " ".join(f"w{rng.randrange(28)}" for _ in range(rng.randrange(5, 40))) + "\n"
        for _ in range(40)))
    preprocess("--only-source", "--srcdict", SAVED / "dict.txt", "--validpref",
               root / "valid.txt", "--destdir", root / "bin", "--workers", "1")
    return root / "bin"


def scored_at_half_a_nat(capsys, checkpoint, data, out, length, tokens, sinks):
    """``(stdout, last line, heads CSV, cutoffs CSV)`` of the tool on ``checkpoint`` with the
    one cutoff T = 0.5 and a tolerance nothing meets (each sequence is scored until the change
    is beyond it): the checkpoint is only read."""
    before = digest(checkpoint)
    code, stdout, err = windows(capsys, checkpoint, data, "--lengths", length, "--tokens",
                                tokens, "--cutoffs", "0.5", "--sinks", sinks, "--tolerance",
                                "1e-9", "--out", out)
    assert code == 0, err[-3000:]
    assert digest(checkpoint) == before
    return (stdout, stdout.splitlines()[-1], rows_of(out / "windows_heads.csv"),
            rows_of(out / "windows_cutoffs.csv"))


def test_an_encoders_windows_are_judged_on_its_masked_tokens(encoder_data, tmp_path, capsys):
    """An asymmetric encoder (its own future slopes): each head's window is back/ahead, and
    the change the tool prints is the change in the masked tokens' perplexity that its
    sequences give when scored here, dense against the override."""
    checkpoint = SAVED / "roberta_asymmetric_learnable" / "checkpoint.pt"
    out, last, heads, (row,) = scored_at_half_a_nat(capsys, checkpoint, encoder_data,
                                                    tmp_path / "out", 128, 512, "0")
    assert last.startswith("not recommended: no cutoff of 0.5"), out
    assert all("/" in h["window"] for h in heads) and any(float(h["queries"]) for h in heads)
    # the same sequences, masked alike, scored here
    cfg, encoder = checkpoint_config(checkpoint)
    task, source, _ = read_stream(cfg, encoder_data, "valid", encoder)
    words = task.source_dictionary
    masking = Masking(words.bos(), words.index("<mask>"), words.pad(), seed=1)
    dense = load_model(checkpoint, task, {}, "cpu")
    cut = load_model(checkpoint, task, {"alibi_window_cutoff": 0.5}, "cpu")
    diffs, dense_nll = [], []
    with torch.no_grad():
        scored = 0
        for start in sample_starts(source.numel(), 128, 512, seed=1):
            if scored == int(row["tokens_L128"]):
                break
            sequence, target = masking(source[start:start + 128], start)
            assert sequence[0] == words.bos() and (sequence == words.index("<mask>")).sum() == 19
            reference = masked_token_nll(dense, sequence, target, words.pad())
            diffs.append(masked_token_nll(cut, sequence, target, words.pad()) - reference)
            dense_nll.append(reference)
            scored += reference.numel()
    change = 100 * math.expm1(float(torch.cat(diffs).mean()))
    assert change != 0 and float(row["change_pct_L128"]) == pytest.approx(change, rel=1e-6)
    assert float(row["dense_ppl_L128"]) == pytest.approx(
        math.exp(float(torch.cat(dense_nll).mean())), rel=1e-9)
    fine_tuned = load(checkpoint)
    fine_tuned["cfg"]["task"]["_name"] = "sentence_prediction"
    torch.save(fine_tuned, tmp_path / "fine_tuned.pt")
    for refused, message in (
            (SAVED / "roberta_learned_positions" / "checkpoint.pt",
             "AlibiRobertaModel has no ALiBi self-attention"),
            (tmp_path / "fine_tuned.pt", "trained with the sentence_prediction task: the windows "
             "check scores an encoder's masked-token predictions; give its masked_lm")):
        code, out, err = windows(capsys, refused, encoder_data, "--out", tmp_path / "none")
        assert code == 2 and out == "" and "Traceback" not in err
        assert message in err.strip().splitlines()[-1], err[-2000:]


@pytest.mark.parametrize("variant,global_tokens", [
    ("symmetric", 0), ("offset", 0), ("one_sided", 0), ("symmetric", 2), ("offset", 1)])
def test_an_encoder_heads_mass_beyond_is_on_both_sides(variant, global_tokens):
    """The meter's masses, and their part on the first S positions, against a sum over every
    (query, key) of random attention probabilities. Global tokens are never beyond a window:
    every query reads them (as keys), and they read every key (as queries)."""
    from fairseq_alibi.alibi import variant_windows
    from fairseq_alibi.cli.windows_check import MassMeter
    from fairseq_alibi.modules.bias import AlibiBias

    class Attention:  # slopes 1/4 … 1/256
        alibi = AlibiBias(4, variant=variant, global_tokens=global_tokens).layer(0)

    length, cutoff, sinks = 40, 2.0, 3
    probs = torch.rand(4, length, length, generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64)
    probs /= probs.sum(-1, keepdim=True)
    meter = MassMeter([Attention()], [cutoff], [0, sinks])
    meter.add(0, probs)
    backs, aheads = variant_windows(meter.slopes[0], cutoff, variant)
    for head, (back, ahead) in enumerate(zip(backs, aheads)):
        expected, on_sinks = [], 0.0
        for i in range(global_tokens, length):
            left = [j for j in range(global_tokens, length) if back and j < i - back]
            right = [j for j in range(length) if ahead and j > i + ahead]
            if left or right:
                expected.append(float(probs[head, i, left + right].sum()))
                on_sinks += float(probs[head, i, [j for j in left if j < sinks]].sum())
        found = meter.beyond.get((0, head, cutoff))
        found = torch.cat(found).tolist() if found else []
        assert found == pytest.approx(expected, abs=1e-12), (variant, head, back, ahead)
        assert meter.on_sinks.get((0, head, cutoff, sinks), 0.0) == pytest.approx(on_sinks)


def test_an_encoder_heads_kept_share():
    for back, ahead in ((3, 3), (3, 0), (0, 4), (2, 5), (None, 2), (0, None), (12, 12)):
        for length, sinks in ((10, 0), (10, 2), (7, 5)):
            seen = kept = 0
            for i in range(length):
                for j in range(length):
                    if (j < i and back == 0) or (j > i and ahead == 0):
                        continue  # the side the variant hides
                    seen += 1
                    kept += ((back is None or i - j <= back) and (ahead is None or j - i <= ahead)
                             or (back is not None and j < sinks and j < i - back))
            assert kept_share_two_way(back, ahead, length, sinks) == pytest.approx(
                kept / seen), (back, ahead, length, sinks)


@pytest.fixture(scope="module")
def translation_data(tmp_path_factory):
    """A ``valid`` split of sentence pairs of the saved translation models' words."""
    root = tmp_path_factory.mktemp("translation_data")
    rng = random.Random(7)
    sources, targets = [], []
    for _ in range(60):
        length = rng.randrange(3, 12)
        sources.append(" ".join(f"w{rng.randrange(28)}" for _ in range(length)))
        targets.append(" ".join(f"w{rng.randrange(28)}" for _ in range(length + 1)))
    (root / "valid.src").write_text("\n".join(sources) + "\n")
    (root / "valid.tgt").write_text("\n".join(targets) + "\n")
    preprocess("-s", "src", "-t", "tgt", "--srcdict", SAVED / "dict.src.txt", "--tgtdict",
               SAVED / "dict.tgt.txt", "--validpref", root / "valid", "--destdir", root / "bin",
               "--workers", "1")
    return root / "bin"


def test_a_translation_models_windows_are_judged_on_its_targets(translation_data, tmp_path,
                                                                 capsys):
    """An offset encoder and a causal decoder: the cutoff goes on both sides' self-attention,
    the verdict names both flags, the encoder's windows are back/ahead and the decoder's W_h,
    the cache is the decoder's, and the change printed is the one its sequences (consecutive
    pairs end to end) give when scored here."""
    checkpoint = SAVED / "translation_pointer" / "checkpoint.pt"
    out, last, heads, rows = scored_at_half_a_nat(capsys, checkpoint, translation_data,
                                                  tmp_path / "out", 48, 192, "0,2")
    assert last.startswith("not recommended: no cutoff of 0.5 keeps perplexity within 1e-09 % "
                           "of dense at every length, without sinks or with "
                           "--encoder-alibi-window-sinks 2 --decoder-alibi-window-sinks 2"), last
    assert "the encoder's self-attention layers, then the decoder's" in out
    assert {h["layer"] for h in heads} == {"0", "1", "2", "3"}
    assert all(("/" in h["window"]) == (h["layer"] in ("0", "1")) for h in heads), heads
    assert [r["sinks"] for r in rows] == ["0", "2"]
    decoder_windows = [int(h["window"]) for h in heads if h["layer"] in ("2", "3")]
    assert [r["decoding_cache_keys"] for r in rows] == [str(max(decoder_windows)),
                                                       str(max(decoder_windows) + 2)]
    cfg, kind = checkpoint_config(checkpoint)
    task, pairs = read_pairs(cfg, translation_data, "valid")
    reader = Pairs(pairs, task.target_dictionary.eos())
    dense = load_model(checkpoint, task, {}, "cpu")
    cut = load_model(checkpoint, task, {"encoder_alibi_window_cutoff": 0.5,
                                        "decoder_alibi_window_cutoff": 0.5}, "cpu")
    diffs, scored = [], 0
    with torch.no_grad():
        for start in reader.starts(48, 192, seed=1):
            if scored == int(rows[0]["tokens_L48"]):
                break
            source, previous, target = reader.inputs(48, start)
            assert source.numel() >= 48 or start + 1 == len(pairs) or source.numel() == int(
                reader.ends[-1] - (reader.ends[start - 1] if start else 0))
            assert previous[0] == task.target_dictionary.eos()
            assert torch.equal(previous[1:], target[:-1])
            reference = pair_nll(dense, source, previous, target)
            diffs.append(pair_nll(cut, source, previous, target) - reference)
            scored += reference.numel()
    change = 100 * math.expm1(float(torch.cat(diffs).mean()))
    assert change != 0 and float(rows[0]["change_pct_L48"]) == pytest.approx(change, rel=1e-6)
    # by default each pair as it is; short pairs whose windows drop nothing change by exactly
    # 0, so the rule decides only on 4,096 tokens or, here, the whole split's 60 pairs
    code, out, err = windows(capsys, checkpoint, translation_data, "--cutoffs", "2",
                             "--sinks", "0", "--out", tmp_path / "pairs")
    assert code == 0, err[-3000:]
    (row,) = rows_of(tmp_path / "pairs" / "windows_cutoffs.csv")
    assert int(row["tokens_L1"]) == sum(target.numel() for _, target in pairs)
    assert "L=1 (60 × 1)" in out
    # a language model's folder for a translation model saved without its languages (fairseq
    # infers them from the folder): the tool's line, not fairseq's bare exception
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "dict.txt").write_text("a 1\n")
    cfg.task.source_lang = cfg.task.target_lang = None
    with pytest.raises(WindowsInputError, match=re.escape(
            f"DATA {tmp_path / 'lm'}: no translation data there (no <split>.<src>-<tgt>.* "
            "files, from which fairseq finds the languages of a model saved without them); "
            "give the folder fairseq-preprocess wrote for this translation model")):
        read_pairs(cfg, tmp_path / "lm", "valid")


def test_bleu_with_and_without_the_recommended_cutoff_is_fairseq_generates(translation_data,
                                                                          tmp_path, capsys):
    """``--bleu N`` translates the split's first N sources with the recommended cutoff and
    without it: each BLEU is what ``fairseq-generate`` (beam 5, sacrebleu on the dictionary's
    tokens) gives for the same checkpoint and load-time overrides, and the translations are
    in windows_bleu.tsv (refused on a language model: bad_inputs)."""
    checkpoint = SAVED / "translation_pointer" / "checkpoint.pt"
    code, out, err = windows(capsys, checkpoint, translation_data, "--cutoffs", "0.5",
                             "--sinks", "0", "--tolerance", "1000", "--bleu", "60",
                             "--out", tmp_path / "out")
    assert code == 0, err[-3000:]
    flags = "--encoder-alibi-window-cutoff 0.5 --decoder-alibi-window-cutoff 0.5"
    assert out.splitlines()[-1] == f"recommended: {flags}"
    (line,) = [x for x in out.splitlines() if x.startswith("BLEU on the first 60 ")]
    found = re.search(rf"dense ([\d.]+); with {flags}: ([\d.]+) \([+-][\d.]+\); (\d+) of 60 "
                      r"translations differ", line)
    assert found, line
    rows = list(csv.reader(open(tmp_path / "out" / "windows_bleu.tsv"), delimiter="\t"))
    assert rows[0] == ["reference", "dense", "windowed"] and len(rows) == 61
    assert sum(r[1] != r[2] for r in rows[1:]) == int(found.group(3)) > 0
    for score, overrides in ((found.group(1), "{}"), (found.group(2), str(
            {"encoder_alibi_window_cutoff": 0.5, "decoder_alibi_window_cutoff": 0.5}))):
        generated = run_cli("fairseq-generate", translation_data, "--path", checkpoint,
                            "--user-dir", user_dir(), "--gen-subset", "valid", "--beam", "5",
                            "--max-tokens", "4096", "--scoring", "sacrebleu",
                            # stock's default 8 drops a last batch of fewer (fairseq #5036)
                            "--required-batch-size-multiple", "1",
                            "--sacrebleu-tokenizer", "none", "--model-overrides", overrides,
                            "--cpu")
        assert "Translated 60 sentences" in generated
        assert re.search(rf"BLEU = {score} ", generated), (score, generated[-500:])


def test_a_translation_models_sinks_are_each_sides_documents(translation_data):
    """Saved with a document mask on the decoder, each of its self-attentions' sinks are the
    first positions of the documents of the target it reads (pairs end to end, ``eos``: every
    ``</s>`` opens a document); the encoder's, without one, the sequence's (``eos`` there is
    refused: a source's ``</s>`` ends it); without a mask, the sequence's."""
    from fairseq_alibi.cli.windows_check import alibi_attentions, document_firsts
    from fairseq_alibi.cli.windows_inputs import TRANSLATION

    checkpoint = SAVED / "translation_pointer" / "checkpoint.pt"
    cfg, _ = checkpoint_config(checkpoint)
    task, pairs = read_pairs(cfg, translation_data, "valid")
    eos = task.target_dictionary.eos()
    source, lengths, previous = Pairs(pairs, eos).forward_args(24, 0)

    def firsts(tokens):  # each position's document's first: the last </s> at or before it
        found, first = [], 0
        for i, token in enumerate(tokens.tolist()):
            first = i if token == eos else first
            found.append(first)
        return found

    masks = {"decoder_alibi_document_mask": "eos"}
    for overrides in (masks, {}):
        model = load_model(checkpoint, task, overrides, "cpu")
        with torch.no_grad():
            model(source, lengths, previous)
        encoder = set(model.encoder.modules())
        for m in alibi_attentions(model, checkpoint, TRANSLATION):
            found = document_firsts(m.alibi, previous.size(1))
            if overrides and m not in encoder:
                assert found.tolist() == firsts(previous[0]) and len(set(found.tolist())) > 2
            else:
                assert found is None
    with pytest.raises(Exception, match="--encoder-alibi-document-mask eos: a source ends"):
        load_model(checkpoint, task, {"encoder_alibi_document_mask": "eos"}, "cpu")


def test_a_translation_sequence_is_whole_pairs_end_to_end():
    pairs = [(torch.tensor([5, 6, 2]), torch.tensor([7, 2])),
             (torch.tensor([8, 2]), torch.tensor([9, 10, 2])),
             (torch.tensor([11, 12, 13, 2]), torch.tensor([14, 2]))]
    reader = Pairs(pairs, eos=2)
    assert reader.total == 9 and reader.default_lengths(None) == [1]
    assert [reader.inputs(1, i)[0].numel() for i in range(3)] == [3, 2, 4]  # a pair each
    source, previous, target = reader.inputs(4, 0)  # 3 tokens, then the next pair reaches 4
    assert source.tolist() == [5, 6, 2, 8, 2] and target.tolist() == [7, 2, 9, 10, 2]
    assert previous.tolist() == [2, 7, 2, 9, 10]
    source, _, target = reader.inputs(2, 1)  # one pair holds 2 source tokens
    assert source.tolist() == [8, 2] and target.tolist() == [9, 10, 2]
    source, _, _ = reader.inputs(100, 1)  # the split ends first
    assert source.tolist() == [8, 2, 11, 12, 13, 2]
    starts = reader.starts(4, 8, seed=1)  # 8 source tokens in sequences of 4: 2
    assert len(starts) == 2 == len(set(starts)) and starts == reader.starts(4, 8, seed=1)
    assert len(reader.starts(1, 6, seed=1)) == 2  # pairs of 3 source tokens on average
