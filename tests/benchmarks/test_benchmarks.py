"""The benchmark suite runs end to end (``--quick``: toy sizes, one round), so it cannot rot.

No timing is asserted: the figures of a quick run mean nothing. What is checked is that every
benchmark runs through the real code paths (fairseq's Trainer and fairseq-eval-lm included)
and writes its tables with the command, machine and date they come from.
"""

import pytest
import torch
import os
import subprocess
import sys

from tests.helpers.cli import REPO

#: end to end through fairseq's real command lines
pytestmark = pytest.mark.slow

SECTIONS = [
    "### Attention forward (",
    "### Attention forward+backward and memory (",
    "### Attention modules, projections included (",
    "### Cached decoding, per step: ALiBi ÷ stock decoders (",
    "### Cached decoding, per step: identical decoders, copied or shared weights (",
    "### Training throughput and peak memory (",
    "### fairseq-eval-lm, sliding window (",
    "### Encoder variants, attention (",
    "### Encoder variants, masked-LM training (",
    "### Masked-LM heads, training (",
    "### Encoder bias options, training (",
    "### Translation training: alibi_transformer ÷ transformer (",
    "### Translation generation, beam 4: alibi_transformer ÷ transformer (",
    "### Translation training, cross-attention options ÷ alibi_transformer (",
    "### Cached decoding, per step: cross-attention options ÷ alibi_transformer (",
    "### Translation generation, whole sentences: cross-attention options ÷ alibi_transformer (",
]


def run_benchmarks(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "benchmarks.run", *args],
                          capture_output=True, text=True, env=env, timeout=900, cwd=REPO)


def test_quick_run_of_every_benchmark_writes_its_tables(tmp_path):
    out_md = tmp_path / "bench.md"
    proc = run_benchmarks("--quick", "--threads", "1", "--markdown", str(out_md))
    assert proc.returncode == 0, proc.stderr[-6000:]
    text = out_md.read_text()
    for title in SECTIONS:
        assert title in text, title
        assert title in proc.stdout, title
    assert text.count("Command: `python -m benchmarks.run --quick --threads 1 --markdown") == len(SECTIONS)
    assert text.count("Machine: ") == len(SECTIONS) and text.count("Date: ") == len(SECTIONS)
    # every method of the attention benchmark has a row, and flex is said to be forward-only
    for method in ["no bias", "fold", "sdpa", "original (B·H,L,L) mask",
                   "BLOOM baddbmm", "naive", "flex (compiled)"]:
        assert f"| {method} |" in text, method
    assert "| flex (compiled) | no CPU backward |" in text
    for option in ("offset, --alibi-global-tokens 1", "offset, --alibi-heads 2",
                   "offset, global token + 2 heads"):
        assert f"| {option} |" in text, option
    # the decoding benchmark has a ratio for every (decoder, sequences, cached tokens) case
    decoding = text.split("### Cached decoding")[1].split("###")[0]
    rows = [l.split("|")[1:-1] for l in decoding.splitlines() if l.startswith("| ")][1:]
    assert [tuple(c.strip() for c in r[:3]) for r in rows] == [
        (decoder, batch, cached) for decoder in ("language model", "translation decoder")
        for batch in ("1", "2") for cached in ("16", "64")]
    assert all(float(r[5]) > 0 for r in rows), rows
    # the cross-attention options' decoding table: the noise-floor row first, every option,
    # each with its three ratios (a later step, the first step, all steps)
    from benchmarks.cases import CROSS, SAME
    cross = text.split("### Cached decoding, per step: cross-attention options")[1].split("###")[0]
    rows = [[c.strip() for c in l.split("|")[1:-1]] for l in cross.splitlines()
            if l.startswith("| ")][1:]
    assert [r[0] for r in rows[::4]] == [SAME, *CROSS], rows
    assert all(len(r) == 8 and all(float(x) > 0 for x in r[3:]) for r in rows), rows
    # both models scored the same, non-zero, number of tokens with fairseq-eval-lm
    eval_section = text.split("### fairseq-eval-lm")[1].split("###")[0]
    rows = [l.split("|")[1:-1] for l in eval_section.splitlines() if l.startswith("| ")][1:]
    assert [r[0].strip() for r in rows] == ["transformer_lm (sinusoidal)", "alibi_transformer_lm"]
    scored = {r[1].strip() for r in rows}
    assert len(scored) == 1 and scored != {"0"}, rows


def test_unknown_benchmark_name_is_a_clear_error():
    proc = run_benchmarks("--only", "attention,speed")
    assert proc.returncode != 0
    assert "unknown benchmark(s) speed; choose from attention, decoding, train, eval, encoder" in proc.stderr


def test_quick_run_of_the_slope_window_tables(tmp_path, capsys):
    """benchmarks/windows.py's three tables: the targets, time and peak memory per
    cutoff, auto's choice against the measured times with its check line."""
    import json

    from benchmarks import windows

    records = tmp_path / "thresholds.json"
    text = windows.main(["--quick", "--tables", "targets,cutoffs,thresholds", "--lengths", "64",
                         "--variants", "causal,symmetric", "--json", str(records)])
    assert text == capsys.readouterr().out.strip()
    assert text.startswith("Command: `python -m benchmarks.windows --quick") and "Machine: " in text
    assert "| 64 | forward |" in text and "| 64 | fwd+bwd |" in text  # the targets
    for variant in ("causal", "symmetric"):  # per cutoff: time ratio and peak MiB, T = 2 and 8
        assert f"| {variant} | 64 | time ÷ dense auto |" in text
        assert f"| {variant} | 64 | peak MiB |" in text
    assert "| figure | dense auto | T=2 | T=8 |" in text
    found = json.loads(records.read_text())
    assert {(r["variant"], r["pass_name"], r["cutoff"]) for r in found} == {
        (v, p, c) for v in ("causal", "symmetric") for p in ("forward", "fwd+bwd")
        for c in (2.0, 8.0)}
    assert {r["chosen"] for r in found} == {"sdpa"}  # 64 keys: below tuning.WINDOWED_MIN_LENGTH
    assert "Check: auto with a cutoff was never slower than the dense choice" in text


def test_the_cost_fit_recovers_the_constants_the_timings_follow(tmp_path, capsys):
    """``--fit``: records whose ``windowed ÷ sdpa`` is exactly a cost model's (the slower pass)
    give back its constants, and the check says what auto would pick with them; causal records
    are not the model's to fit, and a file without a bidirectional record is a one-line
    error."""
    import ast
    import json

    from benchmarks import windows
    from fairseq_alibi.modules.attention import dispatch, tuning

    truth = (0.9, 1.1, 1.6, 0.3)
    records = []
    for variant in ("symmetric", "offset", "asymmetric", "causal"):
        for L in (768, 1024, 2048, 4096):
            for c in (2.0, 4.0, 8.0, 16.0):
                q = torch.empty(1, 8, L, 1)
                call = dispatch.call_of(q, q, q, windows.layer_of(8, variant, c))
                keys = dispatch.windowed_keys(call.windows, variant, L)
                cost = sum(a * k for a, k in zip(truth, keys)) + truth[3] * 1000 / L
                for pass_name, ratio in (("forward", cost / 2), ("fwd+bwd", cost)):
                    records.append(dict(variant=variant, length=L, cutoff=c, heads=8,
                                        pass_name=pass_name, windowed_over_sdpa=ratio))
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records))
    text = windows.main(["--fit", str(path)])
    printed = capsys.readouterr()
    assert (printed.out + printed.err).count("Check:") == 1  # once, not logged too
    constants = ast.literal_eval(text.split("WINDOWED_COST re-fitted: ", 1)[1].splitlines()[0])
    assert constants == pytest.approx(truth, abs=0.011)
    assert constants != tuning.WINDOWED_COST  # read, not copied
    assert "| causal |" not in text and "| offset | 4096 | 16 |" in text
    assert f"and WINDOWED_MAX_COST={tuning.WINDOWED_MAX_COST:g}, auto would send" in text
    path.write_text(json.dumps([r for r in records if r["variant"] == "causal"]))
    with pytest.raises(SystemExit):
        windows.main(["--fit", str(path)])
    assert "--fit: no thresholds record of a bidirectional variant" in capsys.readouterr().err


def test_the_slope_window_benchmark_names_a_bad_table():
    from benchmarks import windows

    with pytest.raises(SystemExit):
        windows.main(["--tables", "speed"])


def test_a_bad_length_or_a_json_without_its_table_is_a_usage_error(capsys):
    """Each was a traceback, a crash (SIGFPE at 0) or rows of L = 0; --json was ignored."""
    from benchmarks import gpu, run, windows

    for main, argv in ((run.parse_args, ["--lengths", "0"]), (gpu.parse_args, ["--lengths", "x"]),
                       (windows.main, ["--tables", "cutoffs", "--lengths", "12x"]),
                       (windows.main, ["--lengths", "-5"])):
        with pytest.raises(SystemExit):
            main(argv)
        assert "comma-separated whole numbers >= 2" in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        windows.main(["--quick", "--json", "x.json"])
    assert "--json writes the thresholds' records" in capsys.readouterr().err


def test_quick_run_of_the_document_mask_tables(tmp_path, capsys):
    """benchmarks/documents.py: the attention table (no mask and documents, with and without
    windows) and the training table (none, documents, complete_doc's useful tokens/s)."""
    import json

    from benchmarks import documents

    records = tmp_path / "documents.json"
    assert documents.main(["--quick", "--work", str(tmp_path), "--json", str(records)]) == 0
    text = capsys.readouterr().out
    assert "Command: `python -m benchmarks.documents --quick --work" in text
    assert "| 512 |" in text and "| fwd+bwd |" in text and "| 128 |" in text
    found = json.loads(records.read_text())
    assert {r["pass"] for r in found["attention"]} == {"forward", "fwd+bwd"}
    assert sum(found["attention"][0]["documents"]) == 512  # the row's pieces fill it
    training = found["training"][0]
    assert set(training["useful_tokens_per_second"]) == {"none", "documents", "complete_doc"}
    from fairseq_alibi.modules.attention import tuning

    kept = tuning.GRANULE_BITS
    assert documents.main(["--quick", "--tables", "granules", "--json", str(records)]) == 0
    granules = json.loads(records.read_text())["granules"]
    assert [set(r["ratios"]) for r in granules] == [{"1", "2", "3", "4", "5"}] * 2
    assert all(r["ratios"]["3"] == 1.0 for r in granules) and tuning.GRANULE_BITS == kept
    # each setting timed its own cut of the row (a call keeps the first cut it makes)
    assert granules[0]["buckets"]["1"] != granules[0]["buckets"]["3"]
    with pytest.raises(SystemExit):
        documents.main(["--doc-lengths", "9,3"])
    with pytest.raises(SystemExit):  # half precision trains on a GPU only
        documents.main(["--precision", "bf16"])


def test_document_lengths_of_a_binarized_corpus(tmp_path):
    """``--corpus DIR``: the documents of a binarized split whose text has an empty line
    between documents, each the tokens of its lines (the empty line's </s> opens the next)."""
    from benchmarks import documents
    from benchmarks.packing import binarized_lengths, describe
    from tests.helpers.cli import preprocess

    (tmp_path / "train.txt").write_text("a b c\nd e\n\nf g h i\n\nj\n")
    preprocess("--only-source", "--trainpref", tmp_path / "train.txt", "--destdir",
               tmp_path / "bin", "--workers", "1")
    assert binarized_lengths(tmp_path / "bin") == [4 + 3, 1 + 5, 1 + 2]
    assert "3 training documents (median 6 tokens" in describe(str(tmp_path / "bin"), None)
    with pytest.raises(SystemExit):
        documents.main(["--corpus", str(tmp_path / "nothing")])


def test_quick_run_of_the_block_mask_table(capsys):
    """benchmarks/block_masks.py: flex's block masks from the plan and from create_block_mask,
    timed and measured side by side, and checked to read the same blocks."""
    from benchmarks import block_masks
    from fairseq_alibi.modules.attention import flex

    if not flex.available():
        pytest.skip("this torch has no flex_attention")
    assert block_masks.main(["--quick"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Command: `python -m benchmarks.block_masks --quick`")
    assert "| windows | 512 |" in text and "| documents | 512 |" in text
    assert "Check: both read the same blocks" in text
    with pytest.raises(SystemExit):
        block_masks.main(["--sinks", "-1"])


def test_quick_run_of_the_learned_scales_scoring_table(capsys):
    """benchmarks/learned_scales.py --scoring: the same weights with fixed slopes and learned
    scales of 1.0, scored side by side."""
    from benchmarks import learned_scales

    assert learned_scales.main(["--scoring", "--lengths", "64", "--rounds", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Command: `python -m benchmarks.learned_scales --scoring")
    assert "| 64 | auto |" in text and "| 64 | windowed, cutoff 8 |" in text
    with pytest.raises(SystemExit):
        learned_scales.main(["--scoring", "--lengths", "0"])


def test_quick_run_of_the_end_to_end_table(tmp_path, capsys):
    """benchmarks/end_to_end.py: training and scoring in the four settings, the windowed two
    with sinks (their cost), and with the attention stubbed out (its share), every figure a
    measured positive number."""
    import json

    from benchmarks import end_to_end

    records = tmp_path / "end_to_end.json"
    assert end_to_end.main(["--quick", "--sinks", "2", "--work", str(tmp_path),
                            "--json", str(records)]) == 0
    text = capsys.readouterr().out
    assert "Command: `python -m benchmarks.end_to_end --quick --sinks 2" in text
    # a share or, below the timing noise, that there is none to say
    assert "training: the attention" in text and "scoring: the attention" in text
    assert "| documents + windows + 2 sinks |" in text
    assert "time with sinks ÷ without: training windows + 2 sinks" in text
    found = json.loads(records.read_text())
    for part in ("training", "scoring"):
        assert set(found[part]["tokens_per_second"]) == {
            "dense", "windows", "documents", "documents + windows", "windows + 2 sinks",
            "documents + windows + 2 sinks", "attention stubbed"}
        assert all(v > 0 for v in found[part]["tokens_per_second"].values())
        assert set(found[part]["sinks_cost"]) == {"windows + 2 sinks",
                                                  "documents + windows + 2 sinks"}
        assert all(v > 0 for v in found[part]["sinks_cost"].values())
    assert found["training"]["tokens"] == 128 and found["scoring"]["tokens"] == 256
    for bad in (["--cutoff", "0"], ["--sinks", "-1"]):
        with pytest.raises(SystemExit):
            end_to_end.main(bad)


def test_quick_run_of_the_allocation_table(tmp_path, capsys, monkeypatch):
    """benchmarks/allocation.py: end_to_end in a process per allocation setting, each process
    given its setting's variables and none of the others' (a variable the caller set too), the
    ratios and peak memory side by side."""
    import json

    from benchmarks import allocation

    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    assert "THP_MEM_ALLOC_ENABLE" not in allocation.setting_env("default", 1)
    keep = allocation.setting_env("glibc_keep", 1)
    assert keep["MALLOC_TRIM_THRESHOLD_"] == str(2**31) and "THP_MEM_ALLOC_ENABLE" not in keep
    records = tmp_path / "allocation.json"
    assert allocation.main(["--quick", "--settings", "default,huge_pages", "--json",
                            str(records)]) == 0
    text = capsys.readouterr().out
    assert "Command: `python -m benchmarks.allocation --quick --settings" in text
    assert "| scoring | documents + windows |" in text and "×) |" in text
    assert "| peak memory |" in text
    found = json.loads(records.read_text())["rounds"]
    assert set(found) == {"default", "huge_pages"}
    assert all(r["rss_mib"] > 0 and r["record"]["scoring"]["tokens_per_second"]["dense"] > 0
               for runs in found.values() for r in runs)
    with pytest.raises(SystemExit):
        allocation.main(["--settings", "default,jemalloc"])
    with pytest.raises(SystemExit):
        allocation.main(["--", "--rounds", "2"])
