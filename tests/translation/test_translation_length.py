"""experiments/translation_length.py: the grid's bookkeeping in process (configurations this
checkout cannot train are refused, the figures over seeds, the hypothesis-count check, rescoring
from logs) and ``--smoke`` end to end through the real fairseq tools (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import translation_length as tl
from experiments import translation_runs as tr
from tests.helpers.cli import REPO


def test_a_configuration_whose_options_are_missing_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(tl, "model_options", lambda: {"--encoder-alibi-variant",
                                                      "--decoder-alibi-variant"})
    assert tl.missing_options(tl.CONFIGS["alibi"], tl.model_options()) == []
    assert tl.missing_options(tl.CONFIGS["pointer_eos"], tl.model_options()) == [
        "--cross-alibi-eos-guard", "--cross-alibi"]
    with pytest.raises(SystemExit):
        tl.parse(["--configs", "alibi,pointer"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("this checkout's alibi_transformer lacks the options of pointer "
                          "(--cross-alibi): pass --configs sinusoidal,alibi,alibi_start")
    with pytest.raises(SystemExit):
        tl.parse(["--configs", "alibi,nope"])
    assert "unknown configuration(s) nope" in capsys.readouterr().err


def test_data_figures_and_the_start_marker(tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    for split in ("train", "valid", "test"):
        (text / f"{split}.src").write_text("a b c\nd e f g h\n")
        (text / f"{split}.tgt").write_text("A b c .\nD e , f g h .\n")
    assert tr.data_figures(text, 4, ("src", "tgt")) == {"ratio": round(8 / 11, 4), "mean_source": 5.0,
                                          "shape_shift": 32}
    tr.add_start_marker(text, tmp_path / "marked", ("src", "tgt"))
    assert (tmp_path / "marked" / "test.src").read_text() == "@start@ a b c\n@start@ d e f g h\n"
    assert (tmp_path / "marked" / "test.tgt").read_text() == (text / "test.tgt").read_text()


def test_data_is_never_built_over_another_folder(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("x")
    with pytest.raises(SystemExit, match="exists but holds no data.json"):
        tl.main(["--data-only", "--data", str(theirs), "--out", str(tmp_path / "out")])
    assert [p.name for p in theirs.iterdir()] == ["keep.txt"]


def generate_log(hyps):
    """What fairseq-generate prints for the two test inputs of :func:`grid`."""
    sources, refs = ["a b c", "d e f g h"], ["A b c .", "D e f g h ."]
    lines = [f"S-{i}\t{s}\nT-{i}\t{r}\nH-{i}\t-0.1\t{h}\n"
             for i, (s, r, h) in enumerate(zip(sources, refs, hyps))]
    return "".join(lines) + f"Translated {len(lines)} sentences\n"


def grid(tmp_path):
    """An earlier run's folder: the data and the generate logs of alibi with seeds 1 and 2."""
    (tmp_path / "data" / "plain" / "text").mkdir(parents=True)
    (tmp_path / "data" / "plain" / "text" / "test.src").write_text("a b c\nd e f g h\n")
    (tmp_path / "data" / "data.json").write_text(json.dumps(
        {"corpus": "restoration", "N": 4, "langs": ["src", "tgt"], "plain_text": "plain/text"}))
    for seed, hyps in ((1, ["A b c .", "D e f g h ."]), (2, ["A b c .", "F g h ."])):
        where = tmp_path / "runs" / "alibi" / f"seed{seed}"
        where.mkdir(parents=True)
        (where / "generate.log").write_text(generate_log(hyps))
        (where / "generate.json").write_text(json.dumps({"wall_s": 2.0, "cpu_s": 1.5}))
        (where / "train.json").write_text(json.dumps({"wall_s": 10.0, "cpu_s": 9.0}))
    return tmp_path


def test_from_logs_summarises_the_seeds(tmp_path):
    out = grid(tmp_path)
    assert tl.main(["--from-logs", "--out", str(out), "--configs", "alibi",
                    "--seeds", "1,2"]) == 0
    saved = json.loads((out / "results.json").read_text())
    per_seed = saved["runs"]["alibi"]
    assert [r["sentences"] for r in per_seed["1"]] == [1, 1, 0, 0]  # buckets 3-4, 5-8, ...
    second = saved["summary"]["alibi"][1]  # the 5-8 bucket: seed 1 exact, seed 2 skips "d e"
    assert second["bleu"]["max"] == pytest.approx(100.0)
    assert second["bleu"]["min"] < 100.0
    assert second["bleu"]["mean"] == pytest.approx((100.0 + second["bleu"]["min"]) / 2)
    assert second["starts_at_start"] == [1, 0] and second["ends_at_end"] == [1, 1]
    assert saved["timing"]["alibi"]["2"] == {"train_wall_s": 10.0, "train_cpu_s": 9.0,
                                             "generate_wall_s": 2.0, "generate_cpu_s": 1.5}
    report = (out / "results.md").read_text()
    assert "| alibi | 100.0 (100.0–100.0) | " in report and "mean (min–max) over 2 seeds" in report
    assert "| alibi | 1, 1 of 1 | 1, 0 of 1 |" in report  # starts, seed by seed
    assert "Runs: 21.0 CPU-s in all" in report  # (9 + 1.5) x 2
    low = second["bleu"]["min"] / 100  # BLEU kept at 2N: 100 % (seed 1) and low (seed 2)
    assert f"| alibi | {(1 + low) / 2:.0%} ({low:.0%}–100%) | – | – |" in report
    rows = (out / "results.csv").read_text().splitlines()
    assert rows[0].startswith("model,seed,bucket,sentences,statistic,bleu")
    assert sum(r.startswith("alibi,all,5-8,1,") for r in rows) == 4  # mean, min, max, std


def test_from_logs_refuses_a_log_with_a_hypothesis_missing(tmp_path):
    out = grid(tmp_path)
    log = out / "runs" / "alibi" / "seed2" / "generate.log"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines()
                           if not line.startswith("H-1")))
    with pytest.raises(SystemExit, match=r"alibi seed 2: 1 hypotheses for 2 test inputs"):
        tl.main(["--from-logs", "--out", str(out), "--configs", "alibi", "--seeds", "1,2"])


@pytest.mark.slow
def test_smoke_runs_end_to_end_and_checks_the_hypotheses(tmp_path):
    out = tmp_path / "grid"
    # one run at a time, one thread each: under xdist the other core runs another test file
    proc = subprocess.run([sys.executable, "-m", "experiments.translation_length", "--smoke",
                           "--out", str(out), "--jobs", "1", "--threads", "1"],
                          capture_output=True, text=True, timeout=600, cwd=str(REPO),
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    for name in ("results.md", "results.csv", "results.json", "results.png"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "results.json").read_text())
    assert {"sinusoidal", "alibi", "alibi_start"} <= set(saved["runs"])
    for name, seeds in saved["runs"].items():
        assert list(seeds) == ["1"]
        assert [r["sentences"] for r in seeds["1"]] == [3, 3, 3, 3]
        assert f"{name} seed 1: translated all 12 test inputs" in proc.stdout
    assert saved["meta"]["total_wall_s"] > 0 and saved["meta"]["runs_cpu_s"] > 0
    # the pointer's trace on the same test pairs: one row per bucket and pointer layer
    from experiments import pointer_trace

    assert pointer_trace.main(["--out", str(out), "--config", "pointer"]) == 0
    rows = json.loads((out / "pointer_trace.json").read_text())
    assert [r["sentences"] for r in rows] == [3, 3, 3, 3]
    assert all(r["step"] > 0 and 0 < r["end"] < 100 and 0 <= r["on_pointer"] <= 1 for r in rows)
    assert (out / "pointer_trace.png").is_file()
    # a fairseq-generate that translated fewer inputs than there are is caught (the command's
    # main in this process: `python -m` exits with its message, status 1)
    log = out / "runs" / "alibi" / "seed1" / "generate.log"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines()
                           if not line.startswith("H-0\t")))
    with pytest.raises(SystemExit) as stopped:
        tl.main(["--from-logs", "--out", str(out)])
    assert str(stopped.value.code).strip().splitlines()[-1].startswith(
        "alibi seed 1: 11 hypotheses for 12 test inputs")


@pytest.mark.slow
@pytest.mark.skipif(not any(Path(d, "fr", "LC_MESSAGES").is_dir() for d in
                            ("/usr/share/locale", "/usr/local/share/locale")),
                    reason="no French gettext catalogs on this machine")
def test_gettext_data_is_built_plain_and_marked(tmp_path):
    out = tmp_path / "grid"
    proc = subprocess.run([sys.executable, "-m", "experiments.translation_length", "--smoke",
                           "--corpus", "gettext", "--data-only", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=str(REPO),
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    meta = json.loads((out / "data" / "data.json").read_text())
    assert meta["langs"] == ["fr", "en"] and meta["corpus"] == "gettext" and meta["N"] == 8
    plain, marked = meta["figures"]["plain"], meta["figures"]["marked"]
    assert plain["ratio"] > 0 and plain["mean_source"] > 1 and plain["shape_shift"] == 64
    assert marked["mean_source"] == pytest.approx(plain["mean_source"] + 1, abs=0.01)
    sources = tr.test_sources(out / "data", meta)
    assert len(sources) == meta["test_pairs"] > 0
    marked = (out / "data" / "marked" / "text" / "test.fr").read_text().splitlines()
    assert marked == [f"@start@ {line}" for line in sources]
    assert "@start@ " in (out / "data" / "marked" / "bin" / "dict.fr.txt").read_text()
    assert not (out / "runs").exists()


# ------------------------------------------------------------------ the selection (--select)


def rows(bleu, length=(1.0, 1.0, 1.0, 1.0)):
    """One run's per-bucket figures, as evaluate() gives them (BLEU and length only)."""
    return [{"bucket": b, "bleu": x, "length_ratio": r}
            for b, x, r in zip(("9-16", "17-32", "33-64", "65-128"), bleu, length)]


def test_the_last_update_at_an_epoch_end_is_found(tmp_path):
    """When --max-update ends an epoch, fairseq writes no checkpoint_<epoch>_<update>.pt (it
    saves update-numbered checkpoints inside an epoch only): the last checkpoint is that update's;
    a run recorded with --no-last-checkpoints (which left nothing then) is the same command."""
    from experiments.seq2seq_runs import final_checkpoint, same_command, train_command

    save = tmp_path / "checkpoints"
    save.mkdir()
    with pytest.raises(SystemExit, match="no checkpoint of update 2000"):
        final_checkpoint(save, 2000, "run")
    (save / "checkpoint_last.pt").write_bytes(b"x")
    assert final_checkpoint(save, 2000, "run") == save / "checkpoint_last.pt"
    (save / "checkpoint_3_2000.pt").write_bytes(b"x")
    assert final_checkpoint(save, 2000, "run") == save / "checkpoint_3_2000.pt"
    cmd = [str(c) for c in train_command("bin", "save", [], layers=1, dim=8, lr=1e-3,
                                         max_tokens=64, max_update=2000, seed=1)]
    assert "--no-last-checkpoints" not in cmd
    assert same_command(cmd[:-1] + ["--no-last-checkpoints", cmd[-1]], cmd)
    assert not same_command(cmd + ["--seed", "2"], cmd)


def test_the_rule_scores_admits_and_chooses():
    from experiments import translation_selection_rule as ts

    # kept 2N-4N 0.66 -> 1.1, kept 4N-8N 0.48 -> 1.2: the score is the worse, 1.1
    assert ts.seed_score(rows((50, 45, 33, 24))) == pytest.approx(1.1)
    good = {1: rows((50, 45, 33, 24)), 2: rows((48, 40, 30, 20))}
    verdict = ts.judge(good, baseline_in_range=49.5)
    assert verdict["failed"] == [] and verdict["in_range"] == 49.0
    assert verdict["score"] == pytest.approx(min(1.1, (30 / 48) / 0.6, (20 / 48) / 0.4))
    short = {1: rows((50, 45, 33, 24), (1.0, 0.95, 0.9, 0.85)), 2: good[2]}
    assert ts.judge(short, 49.5)["failed"] == ["length seed 1"]
    assert ts.judge(good, 50.5)["failed"] == ["in-range BLEU"]  # 49.0 < 50.5 - 1

    sizes = {"small": ts.Size(2, 64, 256, 4, 10), "large": ts.Size(2, 256, 512, 8, 10)}
    grid = {"margins": (2,), "layers": ("min",)}
    best_but_short = {1: rows((50, 50, 50, 50), (1, 1, 1, 0.5)), 2: rows((50, 50, 50, 50))}
    scores = {
        "small": {("pointer_x4_k2", "noguard"): best_but_short,
                  ("pointer_x4_k2", "min_2"): good,
                  ("pointer_x16_k2", "noguard"): {1: rows((50, 20, 10, 5)),
                                                  2: rows((50, 20, 10, 5))},
                  ("pointer_x16_k2", "min_2"): {1: rows((50, 40, 31, 21)),
                                                2: rows((50, 40, 31, 21))}},
        "large": {("pointer_x4_k2", "noguard"): good, ("pointer_x4_k2", "min_2"): good,
                  ("pointer_x4_k4", "noguard"): good,
                  ("pointer_x4_k4", "min_2"): {1: rows((50, 45, 25, 24)),
                                               2: rows((50, 45, 25, 24))}}}
    baselines = {"small": 49.0, "large": 49.0}
    # the scales at the small size: 4's best admissible decoding (min_2) beats 16's
    assert ts.rank_scales(scores, baselines, (4, 16), grid) == [4, 16]
    table = ts.choose(scores, baselines, (4,), grid, sizes)
    candidate = table[0].candidate
    assert candidate == (4, "2", "min_2")  # the inadmissible noguard scores higher, ranks last
    assert table[0].runs == {"small": ("pointer_x4_k2", "min_2"),
                             "large": ("pointer_x4_k2", "min_2")}
    assert {row.candidate for row in table[-2:]} == {(4, "2", "noguard"), (4, "half", "noguard")}
    assert all(row.key[0] < 0 for row in table[-2:])  # short on seed 1: not admissible
    assert ts.flags_of(candidate) == ("--cross-alibi pointer --cross-alibi-slope-scale 4 "
                                      "--cross-alibi-heads 2 --cross-alibi-eos-guard 2 "
                                      "--cross-alibi-eos-guard-layer min")
    # at the small size alone, K = 2 and half the heads are the same runs: listed once
    small_only = ts.choose(scores, baselines, (4, 16), grid, {"small": sizes["small"]})
    assert len(small_only) == 4 and {row.candidate[1] for row in small_only} == {"2"}


def test_the_decode_time_slope_scale_is_chosen_by_the_same_rule():
    """Step 5: the chosen checkpoints decoded at other slope scales beyond the training length
    compete with the choice by the rule (an inadmissible one ranks below it however high it
    scores); the overrides and the flags of a candidate decoded at another scale."""
    from experiments import translation_selection_rule as ts

    grid = {"margins": (2,), "layers": ("min",)}
    at = {"small": ("pointer_x16_k2", "min_2"), "large": ("pointer_x16_k2", "min_2")}
    plain = {1: rows((50, 40, 25, 18)), 2: rows((50, 40, 26, 19))}
    sharper = {1: rows((50, 45, 32, 22)), 2: rows((49, 44, 31, 21))}
    too_sharp = {1: rows((40, 40, 40, 30)), 2: rows((40, 40, 40, 30))}  # in range: -10
    scores = {size: {("pointer_x16_k2", "min_2"): plain,
                     ("pointer_x16_k2", ts.sharpened("min_2", 32, 17)): sharper,
                     ("pointer_x16_k2", ts.sharpened("min_2", 64, 17)): too_sharp,
                     # decoded without the gate: not a candidate of a gated step 5
                     ("pointer_x16_k2", ts.sharpened("min_2", 24)): too_sharp}
              for size in at}
    baselines = {"small": 49.0, "large": 49.0}
    verdicts, key = ts.judged(scores, baselines, at)
    chosen = ts.Ranked(key, (16, "2", "min_2"), at, verdicts)
    table = ts.choose_decode_scale(scores, baselines, chosen, (16, 24, 32, 64), 17)
    # 16 is the choice itself, 24 was never decoded with the gate: three rows, 32 first
    assert [row.candidate for row in table] == [(16, "2", "min_2", 32, 17),
                                                (16, "2", "min_2", 16, 0),
                                                (16, "2", "min_2", 64, 17)]
    assert table[0].runs == {s: ("pointer_x16_k2", "min_2_decode_x32_over17") for s in at}
    assert table[-1].key[0] < 0  # in-range BLEU 10 below alibi: not admissible
    final = table[0].candidate
    assert ts.describe(final).endswith(", decoded at slope scale 32 beyond 17 source tokens")
    assert ts.flags_of(final) == ts.flags_of(chosen.candidate).replace(
        "scale 16", "scale 16 --cross-alibi-inference-slope-scale 32 "
                    "--cross-alibi-inference-longer-than 17")
    assert ts.decode_flags_of(final) == ("--model-overrides \"{'cross_alibi_inference_slope_scale'"
                                         ": 32, 'cross_alibi_inference_longer_than': 17}\"")
    assert ts.decode_flags_of((16, "2", "min_2", 16, 0)) == "" == ts.decode_flags_of(
        chosen.candidate)
    assert ts.overrides_of("pointer_x16_k2", "min_2_decode_x32_over17", grid) == {
        "cross_alibi_eos_guard": 2.0, "cross_alibi_eos_guard_layer": "min",
        "cross_alibi_inference_slope_scale": 32.0, "cross_alibi_inference_longer_than": 17}
    assert ts.overrides_of("pointer_x16_k2", "min_2_decode_x32", grid) == {
        "cross_alibi_eos_guard": 2.0, "cross_alibi_eos_guard_layer": "min",
        "cross_alibi_inference_slope_scale": 32.0, "cross_alibi_inference_longer_than": 0}
    assert ts.overrides_of("pointer_x16_k2", "noguard", grid) == {}
    assert ts.overrides_of("alibi", "plain", grid) == {}


def test_decodings_and_trained_settings():
    from experiments import translation_selection_rule as ts

    grid = {"margins": (1, 3), "layers": ("last", "first", "min")}
    assert ts.decodings("alibi", grid) == {"plain": {}}
    pointer = ts.decodings("pointer_x16_k4", grid)
    assert len(pointer) == 7 and pointer["noguard"] == {}
    assert pointer["first_3"] == {"cross_alibi_eos_guard": 3.0,
                                  "cross_alibi_eos_guard_layer": "first"}
    assert ts.trained_flags("pointer_x16_k4")[-4:] == ["--cross-alibi-slope-scale", "16",
                                                      "--cross-alibi-heads", "4"]
    assert ts.trained_flags("sinusoidal") == list(tr.SINUSOIDAL)
    assert ts.heads_of("half", ts.SIZES["large"]) == 4 and ts.heads_of("2", ts.SIZES["large"]) == 2


def test_select_refuses_the_options_of_the_plain_grid(capsys):
    with pytest.raises(SystemExit):
        tl.parse(["--select", "--configs", "alibi", "--dim", "32"])
    assert "--select trains the grid of experiments/translation_selection.py (its sizes, " \
           "settings and decodings): drop --configs, --dim" in capsys.readouterr().err
    assert tl.parse(["--select"]).corpus == "gettext"
    assert tl.parse([]).corpus == "restoration"


def ts_label(name="STEP4_LABEL"):
    from experiments import translation_selection_rule as ts

    return getattr(ts, name)


GETTEXT = bool(list(Path("/usr/share/locale/fr/LC_MESSAGES").glob("*.mo")))


@pytest.mark.slow
def test_select_smoke_chooses_on_validation_reads_the_test_once_and_confirms(tmp_path, capsys):
    """The whole selection in one run: every candidate decoded on validation, the test read
    only for the choices and the baselines, restoration's own decode-time scale, everything
    reused by --from-logs; with gettext catalogs installed (the recipe's corpus), step 7 too: the
    final setting and alibi trained again without a second test split, disjoint from
    everything the selection read, decoded on it once."""
    corpus = "gettext" if GETTEXT else "restoration"
    out, docs = tmp_path / "select", tmp_path / "docs" / "figures"  # made by the run
    proc = subprocess.run([sys.executable, "-m", "experiments.translation_length", "--select",
                           "--smoke", "--corpus", corpus, "--out", str(out), "--jobs", "1",
                           "--docs", str(docs)],
                          capture_output=True, text=True, timeout=1200, cwd=str(REPO),
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    saved = json.loads((out / "selection.json").read_text())
    assert saved["complete"] and saved["choice"]["flags"].startswith("--cross-alibi pointer")
    assert saved["ranked_scales"] and saved["large_scales"] == saved["ranked_scales"][:1]
    runs = out / "runs" / corpus
    # every candidate decoded on validation, and step 4's choice at the decode-time scale;
    # the test read only for the choices and the baselines
    valid_logs = sorted(runs.glob("*/*/seed1/valid/*.log"))
    # (pointers x decodings + baselines) x 2 sizes, + 1 decode-time scale x 2 sizes
    assert len(valid_logs) == 2 * 2 + 2 + 2 * 2 + 2 + 2
    # every decode-time scale of step 5 was gated at the training length (smoke: N = 8)
    assert len([p for p in valid_logs if p.stem.endswith("_decode_x32_over9")]) == 2
    assert all(p.stem.endswith("_over9") for p in valid_logs if "_decode_x" in p.stem)
    step4 = {size: tuple(at) for size, at in saved["step4_choice"]["runs"].items()}
    chosen = {size: tuple(at) for size, at in saved["choice"]["runs"].items()}
    assert all(chosen[s][0] == step4[s][0] for s in chosen)  # the same checkpoints
    assert [row["candidate"][3] for row in saved["decode_scales"]] != []
    test_logs = {(p.parts[-5], p.parts[-4], p.stem) for p in runs.glob("*/*/seed1/test/*.log")}
    assert test_logs == {(size, name, decoding) for size in ("small", "large")
                         for name, decoding in {chosen[size], step4[size], ("alibi", "plain"),
                                                ("sinusoidal", "plain")}}
    moved = chosen != step4
    assert set(saved["test"]["small"]) == {"chosen", "alibi", "sinusoidal"} | (
        {ts_label()} if moved else set())
    # restoration: its own inference slope scale, and the others read when it differs
    assert {"chosen", "alibi"} <= set(saved["restoration"]) <= {
        "chosen", "alibi", ts_label(), ts_label("GETTEXT_LABEL")}
    assert saved["restoration_choice"]["candidate"][:3] == saved["step4_choice"]["candidate"]
    for name in ("translation_selection.md", "translation_selection_validation.csv",
                 "translation_selection_test_restoration_small.csv"):
        assert (docs / name).is_file(), name
    report = (docs / "translation_selection.md").read_text()
    assert "## The rule" in report and "Chosen: **slope scale" in report
    assert "## The goals, per size and seed" in report
    assert "## The decode-time slope scale (step 5)" in report
    if GETTEXT:
        confirmed = out / "runs" / "gettext_confirmation"
        for size in ("small", "large"):
            assert set(saved["confirmation"][size]) == {"chosen", "alibi"}
            logs = {(p.parts[-4], p.stem) for p in (confirmed / size).glob("*/seed1/test/*.log")}
            assert logs == {chosen[size], ("alibi", "plain")}
            assert not list((confirmed / size).glob("*/seed1/valid"))

        def pairs(name, *splits):
            text = out / "data" / name / "plain" / "bin"
            return {pair for split in splits for pair in zip(
                (text / f"{split}.fr").read_text().splitlines(),
                (text / f"{split}.en").read_text().splitlines())}

        fresh = pairs("gettext_confirmation", "test")
        assert fresh and not fresh & pairs("gettext", "test", "valid")
        assert not fresh & pairs("gettext_confirmation", "train")
        report = (out / "selection.md").read_text()
        assert "## Confirmation, small size: a fresh test split, read once (step 7)" in report
        assert "## The goals on the confirmation split" in report
        assert (out / "test_gettext_confirmation_large.csv").is_file()
        differences = saved["in_range_differences"]
        assert set(differences) == {f"{split} {size}" for split in ("test", "confirmation")
                                    for size in ("small", "large")}
        assert all(low <= high for _, low, high, _ in differences.values())
        assert "95 % paired bootstrap interval" in report
    # everything is reused: scoring again (the command's main, in this process) trains and
    # decodes nothing
    capsys.readouterr()
    assert tl.main(["--select", "--smoke", "--corpus", corpus, "--out", str(out),
                    "--from-logs"]) == 0
    printed = capsys.readouterr().out
    assert "Chosen: **" in printed  # the report, written again from the logs
    assert "trained in" not in printed and "translated all" not in printed
    assert json.loads((out / "selection.json").read_text())["choice"] == saved["choice"]


def test_the_in_range_difference_and_its_paired_bootstrap(tmp_path):
    """The in-range BLEU difference of two decodings (mean over seeds) and a paired bootstrap
    interval around it: 0 and [0, 0] for the same outputs, the corpus BLEU difference when they
    differ, the interval holding it; ``None`` while a run is missing."""
    from types import SimpleNamespace

    from experiments import translation_selection as ts

    data = tmp_path / "data"
    (data / "plain").mkdir(parents=True)
    sources = [f"s{i} a b" for i in range(30)] + ["a long source of nine words each here"]
    (data / "plain" / "test.fr").write_text("".join(s + "\n" for s in sources))
    meta = {"plain_text": "plain", "langs": ["fr", "en"], "N": 4}
    grid = ts.Grid(tmp_path / "out", "gettext", data, meta, SimpleNamespace(), {})
    refs = [f"the cat number {i} sat on the mat" for i in range(len(sources))]
    outputs = {"good": refs, "bad": [r.replace("sat", "lay") if i % 2 else r
                                     for i, r in enumerate(refs)]}

    def write(name, seed, hyps):
        log = grid.where("small", name, seed) / "test" / "plain.log"
        log.parent.mkdir(parents=True)
        log.write_text("".join(f"S-{i}\t{s}\nT-{i}\t{r}\nH-{i}\t-0.1\t{h}\n"
                               for i, (s, r, h) in enumerate(zip(sources, refs, hyps)))
                       + f"Translated {len(sources)} sentences\n")

    for seed in (1, 2):
        write("good", seed, outputs["good"])
        write("bad", seed, outputs["bad"])
    same = ts.in_range_difference(grid, "small", ("good", "plain"), ("good", "plain"), (1, 2))
    assert same == (0.0, 0.0, 0.0, 30)  # the nine-word source is not in (2, 4]
    value, low, high, n = ts.in_range_difference(grid, "small", ("good", "plain"),
                                                 ("bad", "plain"), (1, 2))
    import sacrebleu
    want = 100.0 - sacrebleu.corpus_bleu(outputs["bad"][:30], [refs[:30]],
                                         tokenize="none").score
    assert value == pytest.approx(want) and 0 < low <= value <= high and n == 30
    assert ts.in_range_difference(grid, "small", ("good", "plain"), ("bad", "plain"),
                                  (1, 2, 3)) is None
    from experiments.translation_selection_report import difference_line

    assert "+" in difference_line((value, low, high, n), "chosen", "alibi")


def test_from_logs_names_a_log_cut_before_its_summary(tmp_path):
    """A log whose fairseq-generate has not finished (every hypothesis, no summary line): the
    error says so, not that a hypothesis is missing."""
    out = grid(tmp_path)
    log = out / "runs" / "alibi" / "seed2" / "generate.log"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines()
                           if not line.startswith("Translated")))
    with pytest.raises(SystemExit, match=r"alibi seed 2: .* ends before fairseq-generate's "
                                         r"summary \(a run still going, or one stopped\)"):
        tl.main(["--from-logs", "--out", str(out), "--configs", "alibi", "--seeds", "1,2"])


def test_a_summary_with_thousands_separators_is_read():
    """fairseq-generate prints ``Translated 1,329 sentences``: a test of 1,329 inputs is whole."""
    from experiments.seq2seq_runs import read_generate_log

    lines = "".join(f"S-{i}\ts\nT-{i}\tr\nH-{i}\t-0.1\th\n" for i in range(1329))
    hyps, refs, _ = read_generate_log(
        "big", lines + "INFO:fairseq_cli.generate:Translated 1,329 sentences (39,312 tokens)\n",
        "log", 1329)
    assert len(hyps) == len(refs) == 1329
