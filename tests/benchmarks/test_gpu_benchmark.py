"""``python -m benchmarks.gpu``, the one command a GPU machine runs: its CPU form runs end to end
(the device side of each comparison on the CPU too), so the script cannot rot; and what decides
a GPU run's report is checked on made-up inputs: the time budget, the recorded test outcomes,
the comparison of beam-search hypotheses."""

import json
import math
import os
import subprocess
import sys
import time

import pytest

from benchmarks import gpu, gpu_decode, gpu_parts, gpu_supervisor
from benchmarks.gpu_supervisor import part_limit
from tests.helpers.cli import REPO


def generate_output(*sentences):
    """fairseq-generate's lines for ``(id, score, hypothesis, token scores)``."""
    return "\n".join(f"S-{i}\tsource {i}\nT-{i}\ttarget\nH-{i}\t{score}\t{text}\n"
                     f"D-{i}\t{score}\t{text}\nP-{i}\t{tokens}"
                     for i, score, text, tokens in sentences) + "\nGenerate test with beam=5"


def test_hypotheses_are_parsed_and_compared_sentence_by_sentence():
    reference = gpu_decode.parse_hypotheses(generate_output(
        (0, -1.25, "w1 w2", "-1.0000 -1.5000"), (1, -2.0, "w3", "-2.0000"),
        (2, -0.5, "w4 w5", "-0.2500 -0.7500")))
    assert reference[0] == gpu_decode.Hypothesis(-1.25, "w1 w2", (-1.0, -1.5))
    same = gpu_decode.compare(reference, reference)
    assert same["identical"] == 3 and same["max_score_diff"] == 0 and same["differing"] == []
    assert gpu_decode.verdict(same, 1e-4, all_identical=True)

    other = gpu_decode.parse_hypotheses(generate_output(
        (0, -1.25005, "w1 w2", "-1.0001 -1.5000"), (1, -2.1, "w6", "-2.1000"),
        (2, -0.5, "w4 w5", "-0.2500 -0.7500")))
    found = gpu_decode.compare(reference, other)
    assert found["identical"] == 2 and found["differing"] == [1]
    assert found["max_score_diff"] == pytest.approx(5e-5)
    assert found["max_token_score_diff"] == pytest.approx(1e-4)
    assert found["max_best_score_diff"] == pytest.approx(0.1)
    assert not gpu_decode.verdict(found, 1e-4, all_identical=True)  # float32: one differs
    assert gpu_decode.verdict(found, 1e-4, all_identical=False)  # fp16: scores count
    assert not gpu_decode.verdict(found, 1e-5, all_identical=False)

    broken = gpu_decode.parse_hypotheses(generate_output(
        (0, "nan", "w1 w2", "nan nan"), (2, -0.5, "w4 w5", "-0.2500 -0.7500")))
    found = gpu_decode.compare(reference, broken)
    assert found["produced"] == 2 and not found["finite"] and found["max_score_diff"] == math.inf
    assert not gpu_decode.verdict(found, 1.0, all_identical=False)
    assert not gpu_decode.verdict(gpu_decode.compare({}, {}), 1.0, all_identical=False)


def test_test_outcomes_are_counted_once_per_test_worst_first():
    records = [
        {"test": "t::a", "when": "call", "outcome": "passed", "seconds": 1.5, "message": None},
        {"test": "t::b", "when": "call", "outcome": "failed", "seconds": 0.2,
         "message": "RuntimeError: CUDA error: misaligned address\nCUDA kernel errors ..."},
        {"test": "t::b", "when": "???", "outcome": "failed", "seconds": 0,
         "message": "worker 'gw1' crashed while running 't::b'"},
        {"test": "t::c", "when": "setup", "outcome": "failed", "seconds": 0.1, "message": "x"},
        {"test": "t::d", "when": "call", "outcome": "skipped", "seconds": 0.0,
         "message": "Skipped: flash_attn is not installed"},
        {"test": "t::e", "when": "call", "outcome": "passed", "seconds": 3.0, "message": None},
        {"test": "t::e", "when": "teardown", "outcome": "failed", "seconds": 0, "message": "y"},
    ]
    output = "4 workers [188 items]\n...\n==== 2 failed, 2 passed, 1 skipped, 2 errors in 9s ===="
    found = gpu_parts.summarize_tests(records, output)
    assert (found["passed"], found["failed"], found["errors"], found["skipped"]) == (1, 1, 2, 1)
    assert found["reported"] == 5 and found["collected"] == 188
    assert found["first_failure"] == ("t::b: RuntimeError: CUDA error: misaligned address / "
                                      "CUDA kernel errors ...")
    assert found["pytest_summary"] == "2 failed, 2 passed, 1 skipped, 2 errors in 9s"
    assert found["skip_reasons"] == {"Skipped: flash_attn is not installed": 1}
    assert found["slowest"][0] == ["t::e", 3.0]
    assert gpu_parts.counts_line(found) == ("1 passed, 1 failed, 2 errors, 1 skipped "
                                      "(5 of 188 tests reported)")


def test_the_pytest_plugin_records_each_outcome(tmp_path):
    (tmp_path / "test_made_up.py").write_text(
        "import pytest\n"
        "def test_passes():\n    pass\n"
        "def test_fails():\n    assert 1 == 2, 'one is not two'\n"
        "def test_skips():\n    pytest.skip('not here')\n")
    (tmp_path / "test_broken.py").write_text("import no_such_module_here\n")
    record = tmp_path / "record.jsonl"
    env = dict(os.environ, PYTEST_RECORD=str(record), PYTHONPATH=str(REPO))
    env.pop("PYTEST_XDIST_WORKER", None)  # (this suite may itself run under xdist)
    for test_file in ("test_made_up.py", "test_broken.py"):  # (a broken file stops a session)
        subprocess.run([sys.executable, "-m", "pytest", test_file, "-q", "-p",
                        "no:cacheprovider", "-p", "benchmarks.pytest_record"], cwd=tmp_path,
                       env=env, capture_output=True, timeout=120)
    found = {r["test"].split("::")[-1]: r for r in gpu_parts.read_records(record)}
    assert {name: (r["when"], r["outcome"]) for name, r in found.items()} == {
        "test_passes": ("call", "passed"), "test_fails": ("call", "failed"),
        "test_skips": ("call", "skipped"), "test_broken.py": ("collect", "failed")}
    assert found["test_fails"]["message"].startswith("AssertionError: one is not two")
    assert found["test_skips"]["message"] == "Skipped: not here"
    assert "no_such_module_here" in found["test_broken.py"]["message"]
    assert gpu_parts.summarize_tests(gpu_parts.read_records(record), "")["errors"] == 1


def test_the_budget_goes_to_each_part_less_what_the_later_ones_need():
    full = {name: need for name, (need, _) in gpu_supervisor.NEEDS.items()}
    later = ["decode", "memory", "flex"]
    assert part_limit("tests", later, 420, False) == 420 - sum(full[p] for p in later)
    # squeezed by the later parts, a part still gets its own minimum
    assert part_limit("memory", ["flex"], full["memory"] + 10, False) == full["memory"]
    assert part_limit("flex", [], full["flex"] - 1, False) == 0  # does not fit: skipped
    assert part_limit("tests", later, math.inf, False) == math.inf  # no budget


def test_a_budget_too_small_skips_every_part_and_the_report_says_so(tmp_path):
    assert gpu.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--budget", "1"],
                    started=time.time()) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results["parts"]) == list(gpu.DEFAULT_PARTS)
    for part in results["parts"].values():
        assert part["status"] == "skipped"
        assert part["notes"][0].startswith("skipped: needs about")
    report = (tmp_path / "gpu.md").read_text()
    assert "| tests | skipped |" in report and "Budget: 1 s" in report


def test_a_process_past_its_limit_is_stopped():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    start = time.time()
    assert gpu_supervisor.wait_until(proc, 0.5) is True
    assert proc.returncode is not None and time.time() - start < 10


def test_unknown_part_and_bad_budget_are_clear_errors(capsys):
    for argv, message in ((["--only", "tests,speed"], "unknown part(s) speed; choose from"),
                          (["--budget", "0"], "--budget must be a positive number")):
        with pytest.raises(SystemExit):
            gpu.parse_args(argv + ["--device", "cpu"])
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_quick_cpu_run_of_the_default_parts_writes_every_figure(tmp_path):
    """The command the GPU machine runs, at toy sizes on the CPU, within a budget: every part
    runs in its own process, the report and results say what each measured."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--quick", "--device", "cpu",
                           "--budget", "3000", "--out", str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=3300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-6000:]
    parts = json.loads((tmp_path / "results.json").read_text())["parts"]
    assert {name: p["status"] for name, p in parts.items()} == {
        name: "done" for name in gpu.DEFAULT_PARTS}
    tests = parts["tests"]["results"]["tests"]
    assert tests["collected"] and tests["reported"] == tests["collected"]
    assert tests["failed"] == tests["errors"] == 0
    decode = parts["decode"]["results"]["decode"]
    for model in ("lm", "translation"):
        same = decode[f"{model}: cpu fp32 vs CPU fp32"]
        assert same["ok"] and same["identical"] == same["sentences"] > 0, same
        half = decode[f"{model}: cpu fp16 vs cpu fp32"]
        assert half["ok"] and half["produced"] == half["sentences"], half
    memory = parts["memory"]["results"]["memory"]
    assert {r["L"] for r in memory} == {64, 128}
    assert all(r["tokens_per_s"] > 0 and r["peak_bytes"] > 0 for r in memory)
    flex = parts["flex"]["results"]["flex D=64"]
    assert flex["alibi_vs_no_bias"] > 0 and flex["pass"] == "forward"
    report = (tmp_path / "gpu.md").read_text()
    for title in ("### CUDA correctness against float64", "### Beam search on cpu against the CPU",
                  "### Peak memory and tokens/s of Trainer steps", "### Eager flex (CPU)"):
        assert title in report, title
    assert report.count("Command: `python -m benchmarks.gpu --quick --device cpu") == 5
    assert report.count("Machine: ") == 5 and report.count("Date: ") == 5
    for line in ("[tests] ", "[decode] lm: cpu fp32 vs CPU fp32: ", "[memory] L=128 ",
                 "[flex] L=128 D=64: "):
        assert line in proc.stderr and line in (tmp_path / "log.txt").read_text(), line


def test_fairseq_tools_run_with_np_compat_long_put_back_where_numpy_2_removed_it(
        tmp_path, monkeypatch):
    import numpy

    from benchmarks import fairseq_on_numpy2

    (tmp_path / "made_up_tool.py").write_text(
        "import sys, numpy\n"
        "open(sys.argv[1], 'w').write(numpy.dtype(numpy.compat.long).name + ' ' + sys.argv[0])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delattr(numpy, "compat", raising=False)  # as in numpy 2
    out = tmp_path / "out.txt"
    fairseq_on_numpy2.main(["made_up_tool", str(out)])
    assert out.read_text() == f"int64 {tmp_path / 'made_up_tool.py'}"


def test_quick_cpu_run_of_the_masks_part_times_each_backend_and_names_autos_choice(tmp_path):
    """``--only masks`` at a toy size on the CPU: every mask case through the dense bias, flex
    and (with documents) the split, and what ``auto`` picks, in the results and the report."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--quick", "--device", "cpu",
                           "--only", "masks", "--lengths", "128", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = json.loads((tmp_path / "results.json").read_text())["parts"]["masks"]["results"]
    rows = rows["masks"]
    assert [r["mask"] for r in rows] == ["no mask", "T=8", "documents", "documents, T=8"]
    for r in rows:
        assert set(r["ms"]) == ({"sdpa", "flex", "split"} if "documents" in r["mask"]
                                else {"sdpa", "flex"}), r
        assert all(t > 0 for t in r["ms"].values()) and r["others_vs_flex"] > 0
        assert r["auto"] == ("split" if "documents" in r["mask"] else "sdpa")  # the CPU: no flex
    assert "| causal | 128 | forward | documents | " in (tmp_path / "gpu.md").read_text()
