"""The embedded corpus: built from Python's own documentation, split by document, deterministic."""

import hashlib

import pytest

from fairseq_alibi.cli.corpus import (
    SPLITS,
    Document,
    EmbeddedTextNotFound,
    build_corpus,
    collect_documents,
    split_documents,
    stdlib_documents,
)


def _file_hashes(folder):
    return {s: hashlib.sha256((folder / f"{s}.txt").read_bytes()).hexdigest() for s in SPLITS}


@pytest.mark.slow
def test_build_is_deterministic_and_split_by_document(tmp_path):
    first = build_corpus(tmp_path / "a")
    second = build_corpus(tmp_path / "b")
    assert first["sha256"] == second["sha256"]
    assert _file_hashes(tmp_path / "a") == _file_hashes(tmp_path / "b")
    assert first == second

    # the manifest describes the files, and the hash is the files' content
    digest = hashlib.sha256()
    for split in SPLITS:
        data = (tmp_path / "a" / f"{split}.txt").read_bytes()
        digest.update(split.encode() + b"\0" + data + b"\0")
        assert first["splits"][split]["bytes"] == len(data)
        assert first["splits"][split]["words"] == len(data.decode().split())
        assert first["splits"][split]["lines"] == data.count(b"\n")
        assert b"\n\n" not in data and not data.startswith(b"\n")
    assert digest.hexdigest() == first["sha256"]

    # an English corpus of the documented size, with test and valid about 5% of the words each
    words = {s: first["splits"][s]["words"] for s in SPLITS}
    total = sum(words.values())
    assert total > 200_000
    for held_out in ("valid", "test"):
        assert 0.05 <= words[held_out] / total < 0.10
        assert first["splits"][held_out]["documents"] >= 5


def test_split_is_by_whole_documents_and_independent_of_order():
    docs = [Document(f"doc{i}", " ".join(["word"] * (10 + i % 7))) for i in range(300)]
    splits = split_documents(docs, valid_fraction=0.1, test_fraction=0.05)
    again = split_documents(list(reversed(docs)), valid_fraction=0.1, test_fraction=0.05)
    assert {s: [d.name for d in splits[s]] for s in SPLITS} == \
        {s: [d.name for d in again[s]] for s in SPLITS}
    names = [d.name for s in SPLITS for d in splits[s]]
    assert sorted(names) == sorted(d.name for d in docs)  # each document once, whole
    total = sum(d.words for d in docs)
    for split, fraction in (("valid", 0.1), ("test", 0.05)):
        held = sum(d.words for d in splits[split])
        assert fraction * total <= held < fraction * total + 17  # stops after crossing it


def test_split_fractions_are_checked(tmp_path, capsys):
    from fairseq_alibi.cli.corpus import main

    with pytest.raises(ValueError, match="fraction"):
        split_documents([Document("a", "x")], valid_fraction=0.0)
    with pytest.raises(SystemExit) as exited:  # the command line: a usage error, not a traceback
        main([str(tmp_path / "out"), "--valid-fraction", "1.5"])
    assert exited.value.code == 2 and not (tmp_path / "out").exists()
    assert "--valid-fraction 1.5: a share of the words in (0, 0.5)" in capsys.readouterr().err


def test_missing_help_topics_fail_with_a_clear_message(tmp_path):
    with pytest.raises(EmbeddedTextNotFound, match=r"help topics .*--data DIR"):
        build_corpus(tmp_path / "out", topics_module="no_such_pydoc_data.topics")
    assert not (tmp_path / "out" / "train.txt").exists()


def test_missing_stdlib_sources_fail_with_a_clear_message(tmp_path):
    (tmp_path / "stdlib").mkdir()
    (tmp_path / "stdlib" / "compiled_only.pyc").write_bytes(b"\0")
    with pytest.raises(EmbeddedTextNotFound, match=r"no standard-library Python sources.*--data"):
        stdlib_documents(str(tmp_path / "stdlib"))


def test_a_stripped_stdlib_is_too_small(tmp_path):
    (tmp_path / "stdlib").mkdir()
    (tmp_path / "stdlib" / "tiny.py").write_text('"""A module docstring."""\n')
    with pytest.raises(EmbeddedTextNotFound, match="only .* words"):
        collect_documents(stdlib_dir=str(tmp_path / "stdlib"))


def test_docstrings_are_read_without_importing(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "mod.py").write_text(
        '"""First paragraph\nof the module.\n\nSecond paragraph."""\n'
        "raise SystemExit('imported!')\n"
        "def f():\n    '''Function docs.'''\n"
    )
    (tmp_path / "lib" / "test").mkdir()
    (tmp_path / "lib" / "test" / "skipped.py").write_text('"""Test suite, not prose."""\n')
    docs = stdlib_documents(str(tmp_path / "lib"))
    assert [d.name for d in docs] == ["stdlib:mod.py"]
    assert docs[0].text.splitlines() == [
        "First paragraph of the module.", "Second paragraph.", "Function docs."
    ]
