"""The documented commands as written (docs/reliability.md, catalogue of bad inputs): what a
user copying them hit, fixed in the docs, and checked on the docs' own text.

``# row N`` marks a row of issue 12 (what an experienced fairseq user hit on first contact).
Tests that run fairseq's command lines are marked ``slow``.
"""

from pathlib import Path

import pytest

from tests.helpers.checkpoints import saved_in_process
from tests.helpers.cli import REPO, run_cli
from tests.helpers.training import MODELS


# row 2: fairseq-validate of a masked LM on longer blocks


@pytest.mark.slow
def test_documented_validate_recipe_scores_every_block(tiny_lm_data, alibi_user_dir, tmp_path):
    """Stock fairseq-validate rounds batches to --required-batch-size-multiple (8): blocks are
    dropped, or nothing is scored. The documented recipe scores them all, and its last line
    says how many (bsz: blocks, wpb: tokens, summed over the split by fairseq-validate)."""
    import re

    recipe = (REPO / "docs" / "encoders.md").read_text()
    command = next(b for b in re.findall(r"```bash\n(.*?)```", recipe, re.S)
                   if "fairseq-validate" in b)
    assert "--required-batch-size-multiple 1" in command
    checkpoint = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["encoder"])
    common = [tiny_lm_data, "--user-dir", alibi_user_dir, "--path", checkpoint, "--cpu",
              "--task", "masked_lm", "--valid-subset", "valid", "--batch-size", 8,
              "--model-overrides", "{'tokens_per_sample': 256}"]
    out = run_cli("fairseq-validate", *common, "--required-batch-size-multiple", 1)
    blocks = int(re.search(r"loaded (\d+) blocks from", out).group(1))
    assert 1 < blocks < 8  # fewer than one stock batch: the case that divided by zero
    scored = re.search(r"valid on 'valid' subset \|.*\| bsz (\d+)", out)
    assert scored, out[-2000:]
    assert int(scored.group(1)) == blocks
    stock = run_cli("fairseq-validate", *common, expect_ok=False)  # what the issue hit
    assert "ZeroDivisionError" in stock


# row 8: documented hydra commands work from any folder


def test_documented_config_dirs_work_from_any_folder():
    """Every ``--config-dir`` in the docs points into the installed package, and the config it
    names is there."""
    import re

    from fairseq_alibi.paths import config_dir

    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
             *sorted((REPO / "examples").glob("*/README.md"))]
    found = 0
    for page in pages:
        text = page.read_text()
        for match in re.finditer(
                r'--config-dir\s+("[^"]*"|\S+)\s+(?:\\\s+)?--config-name\s+(\w+)', text):
            folder, name = match.groups()
            if folder == "DIR":  # "your own folder" in prose
                continue
            found += 1
            family = re.fullmatch(
                r'"?\$\(python -m fairseq_alibi --user-dir\)/config/(\w+)"?', folder)
            assert family, f"{page.name}: --config-dir {folder} only works from the repo root"
            assert (Path(config_dir(family.group(1))) / f"{name}.yaml").is_file(), match.group(0)
    assert found >= 6


# row 13: the quickstart's time


def test_quickstart_header_gives_the_measured_time():
    header = "".join(l for l in (REPO / "examples" / "quickstart.sh").read_text().splitlines(True)
                     if l.startswith("#"))
    measured = (REPO / "docs" / "quickstart.md").read_text()
    for figure in ("3 min 35 s", "443 CPU-seconds"):
        assert figure in " ".join(header.split()) and figure in measured
    assert "About 10 minutes" not in header
