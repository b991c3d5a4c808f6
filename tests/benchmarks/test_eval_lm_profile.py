"""benchmarks/eval_lm_profile.py: the parts of fairseq-eval-lm's scoring add up to the scorer's
time, and ``--smoke`` runs end to end (a toy model, one round). No timing is asserted."""

import pytest

from benchmarks import eval_lm_profile


@pytest.mark.slow
def test_smoke_times_every_part_of_both_settings(tmp_path, capsys, caplog):
    summary = eval_lm_profile.main(["--smoke", "--work", str(tmp_path), "--cutoff", "2"])
    printed = capsys.readouterr().out
    assert "Command: `python -m benchmarks.eval_lm_profile --smoke" in printed
    assert "more than the model's" not in caplog.text  # the warning it would tell a user to fix
    for part in eval_lm_profile.PARTS + ("scorer", "data loading"):
        assert f"| {part}" in printed
    assert summary["tokens"] > 0
    for name in ("dense", "T=2"):
        seconds = summary["seconds"][name]
        assert seconds["attention backend"] > 0 and seconds["output layer"] > 0
        # the parts are a partition of the scorer's time ("scorer, other" is what is left)
        assert sum(seconds[p] for p in eval_lm_profile.PARTS) == pytest.approx(seconds["scorer"])
    assert 0 < summary["backend_share_dense"] < summary["attention_share_dense"] < 1
    assert summary["amdahl_attention"] == pytest.approx(
        1 / (1 - summary["attention_share_dense"]))


def test_bad_flags_are_refused():
    with pytest.raises(SystemExit):
        eval_lm_profile.main(["--cutoff", "0"])
