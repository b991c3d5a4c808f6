"""The benchmarks' flags and wording, in process (nothing is timed): a flag given beside
``--quick`` wins over its preset, the attention's share is said only where it was measured, and
the ``Command:`` line pastes back into a shell."""

from benchmarks import block_masks, documents, end_to_end, windowed_revision
from benchmarks.tables import command_line


def test_a_flag_given_beside_quick_wins_over_its_preset(tmp_path):
    """``--quick --corpus DIR`` timed the uniform corpus and ``--quick --lengths 1024`` L = 256,
    while the output named the flags given."""
    (tmp_path / "train.idx").touch()  # what --corpus checks a binarized folder by
    given = end_to_end.parse_args(["--quick", "--corpus", str(tmp_path), "--rounds", "2"])
    assert (given.corpus, given.rounds, given.vocab) == (str(tmp_path), 2, 500)
    quick = end_to_end.parse_args(["--quick"])
    assert (quick.corpus, quick.doc_lengths, quick.train_length) == ("uniform", (16, 64), 128)
    assert end_to_end.parse_args(["--corpus", "uniform"]).vocab == 20000
    parse = windowed_revision.parse_args
    assert parse(["--against", "HEAD", "--quick", "--lengths", "1024"]).lengths == [1024]
    assert (parse(["--against", "HEAD", "--quick"]).lengths,
            parse(["--against", "HEAD"]).lengths) == ([256], [4096, 8192])
    for module in (block_masks, documents):
        assert module.parse_args(["--quick", "--lengths", "1024"]).lengths == [1024]
        quick, full = module.parse_args(["--quick"]), module.parse_args([])
        assert (quick.lengths, quick.rounds, full.lengths, full.rounds) == (
            [512], 1, [4096, 8192], 3)
    assert documents.parse_args(["--quick", "--rounds", "2"]).train_lengths == [128]


def test_an_attention_share_below_the_noise_is_said_so():
    """A stubbed step timed slower than the dense one gave "the attention is -50% of the dense
    step (at most 0.67× ...)"."""
    assert end_to_end.share_words("training", 0.25) == (
        "training: the attention is 25% of the dense step (at most 1.33× from any attention)")
    for share in (-0.5, 0.0, 1.0):
        words = end_to_end.share_words("scoring", share)
        assert "not measurable above the noise" in words and "%" not in words, share


def test_the_command_line_quotes_what_a_shell_would_split():
    assert command_line("benchmarks.end_to_end", ["--quick", "--corpus", "my data"]) == (
        "Command: `python -m benchmarks.end_to_end --quick --corpus 'my data'`  ")
