"""Document breaks: each pipeline's ``--document-breaks`` writes one empty line between documents
and none inside one, which is where fairseq's ``--sample-break-mode complete_doc`` and
``--alibi-document-mask doc`` split; without it, the output is what it always was."""

import json

import numpy as np
import pytest
import torch

from fairseq_alibi import alibi
from fairseq_alibi.cli import corpus
from fairseq_alibi.preprocess import pile, wikitext
from fairseq_alibi.preprocess.encoders import Gpt2BpeEncoder
from tests.helpers import corpora
from tests.helpers.cli import SHARED_DATA, preprocess

BINARIES = ("dict.txt",) + tuple(f"{s}.{e}" for s in ("train", "valid", "test")
                                 for e in ("bin", "idx"))


def dataset(prefix, combine=False):
    """A binarized split as fairseq's tasks load it."""
    from fairseq.data import data_utils

    return data_utils.load_indexed_dataset(str(prefix), None, combine=combine)


def documents_found(ds, eos=2):
    """The documents ``--alibi-document-mask doc`` finds in the split's stream, each without the
    empty line (the ``</s>``) that opened it; a document that is only that empty line is none."""
    stream = torch.cat([ds[i] for i in range(len(ds))])
    ids = alibi.document_ids((stream == eos)[None], "doc")[0]
    found = []
    for doc in ids.unique().tolist():
        tokens = stream[ids == doc].tolist()
        tokens = tokens[1:] if doc else tokens  # every document but the first opens with </s>
        if tokens:
            found.append(tokens)
    return found


def assert_complete_doc_blocks_keep_to_one_document(ds, block_size, eos=2):
    """fairseq's TokenBlockDataset with ``complete_doc`` (what language_modeling and masked_lm
    build): every block lies in one document, and the blocks hold every document's tokens."""
    from fairseq.data import TokenBlockDataset

    stream = torch.cat([ds[i] for i in range(len(ds))])
    ids = alibi.document_ids((stream == eos)[None], "doc")[0]
    blocks = TokenBlockDataset(ds, ds.sizes, block_size, pad=1, eos=eos,
                               break_mode="complete_doc")
    for start, end in blocks.slice_indices:
        assert len(ids[start:end].unique()) == 1, (start, end)
    assert sum(int(e - s) for s, e in blocks.slice_indices) == len(stream) - int(
        alibi.document_starts((stream == eos)[None], "doc").sum())
    # the same blocks without complete_doc would mix documents: the check has teeth
    packed = TokenBlockDataset(ds, ds.sizes, block_size, pad=1, eos=eos, break_mode="complete")
    assert any(len(ids[s:e].unique()) > 1 for s, e in packed.slice_indices)


# --- WikiText -------------------------------------------------------------------------------

LINES = [
    " \n", " = Alpha = \n", " \n", " Alpha opens . \n", " \n", " = = History = = \n", " \n",
    " First paragraph . \n", " Second paragraph . \n", " \n", " \n",
    " = = = Detail = = = \n", " \n", " A formula : \n", " = 1 k and C = \n", " More . \n",
    " \n", " \n", " = Beta = \n", " \n", " Beta text . \n", " \n", " \n", " \n",
    " = Gamma ( film ) = \n", " \n", " Gamma text . \n", " \n",
]
ARTICLES = [
    [" = Alpha = \n", " Alpha opens . \n", " = = History = = \n", " First paragraph . \n",
     " Second paragraph . \n", " = = = Detail = = = \n", " A formula : \n", " = 1 k and C = \n",
     " More . \n"],
    [" = Beta = \n", " Beta text . \n"],
    [" = Gamma ( film ) = \n", " Gamma text . \n"],
]


def test_wikitext_article_lines_one_empty_line_between_articles():
    out = list(wikitext.article_lines(LINES))
    assert out == ARTICLES[0] + ["\n"] + ARTICLES[1] + ["\n"] + ARTICLES[2]
    assert list(wikitext.article_lines(iter([]))) == []


def write_articles(text, folder):
    """``article_lines`` of each split, as a text file for fairseq-preprocess."""
    folder.mkdir()
    for split in ("train", "valid", "test"):
        lines = (text / f"wiki.{split}.tokens").read_text(encoding="utf-8").splitlines(True)
        (folder / f"{split}.txt").write_text("".join(wikitext.article_lines(lines)),
                                             encoding="utf-8")
    return folder


def test_wikitext_document_breaks_split_at_articles(tmp_path):
    text = corpora.write_wikitext(tmp_path / "wikitext", paragraphs=(60, 24, 24))
    wikitext.main([str(a) for a in ("--text-dir", text, "--destdir", tmp_path / "breaks",
                                    "--workers", 2, "--document-breaks")])
    wikitext.prepare(text, tmp_path / "plain", workers=1)

    # byte-identical to fairseq-preprocess of the text with one empty line between articles
    articles = write_articles(text, tmp_path / "articles")
    preprocess("--only-source", "--trainpref", articles / "train.txt", "--validpref",
               articles / "valid.txt", "--testpref", articles / "test.txt",
               "--destdir", tmp_path / "fairseq", "--workers", "1")
    for name in BINARIES:
        assert (tmp_path / "breaks" / name).read_bytes() == \
            (tmp_path / "fairseq" / name).read_bytes(), name
    # the same dictionary as without breaks; the recorded option and the empty lines
    assert (tmp_path / "breaks" / "dict.txt").read_bytes() == \
        (tmp_path / "plain" / "dict.txt").read_bytes()
    saved = json.loads((tmp_path / "breaks" / "stats.json").read_text())
    assert saved["document_breaks"] is True
    assert not json.loads((tmp_path / "plain" / "stats.json").read_text())["document_breaks"]
    stats = saved["splits"]

    for split in ("valid", "test"):
        written = (articles / f"{split}.txt").read_text(encoding="utf-8").split("\n\n")
        assert stats[split]["empty_lines"] == len(written) - 1 == 3  # 24 paragraphs, 6 an article
        ds = dataset(tmp_path / "breaks" / split)
        found = documents_found(ds)
        assert len(found) == len(written)
        assert [len(d) for d in found] == [
            len(a.split()) + a.strip("\n").count("\n") + 1 for a in written]
        assert_complete_doc_blocks_keep_to_one_document(ds, block_size=48)
    # without breaks, WikiText's blank lines around every heading are the empty lines: each
    # heading, and the paragraphs after it, is a document
    assert len(documents_found(dataset(tmp_path / "plain" / "test"))) == 2 * len(found)


@pytest.mark.skipif(not (SHARED_DATA / "wikitext-2").is_dir(), reason="no ../shared/data")
def test_real_wikitext2_has_sixty_articles_per_split():
    """WikiText-2's valid and test splits (the same articles as WikiText-103's): 60 each."""
    for split, first in (("valid", " = Homarus gammarus = "), ("test", " = Robert <unk> = ")):
        lines = (SHARED_DATA / "wikitext-2" / f"wiki.{split}.tokens").read_text(
            encoding="utf-8").splitlines(True)
        out = list(wikitext.article_lines(lines))
        assert [line for line in out if line.strip()] == [line for line in lines if line.strip()]
        articles = "".join(out).split("\n\n")
        assert len(articles) == 60 and out.count("\n") == 59
        assert articles[0].startswith(first + "\n")
        assert all(a.startswith(" = ") and not a.startswith(" = = ") for a in articles)
        assert all(line.strip() for a in articles for line in a.rstrip("\n").split("\n"))


# --- The Pile -------------------------------------------------------------------------------


def test_pile_document_breaks_an_empty_line_after_every_document(tmp_path):
    bpe = corpora.write_tiny_bpe(tmp_path / "bpe")
    encoder = Gpt2BpeEncoder.from_dir(bpe)
    shards = [corpora.pile_documents(30, seed=1), corpora.pile_documents(20, seed=2)]
    shards[0][2]["text"] = "the cat sat\n\n\nthe dog ran\n  \nwhere is it"  # blank lines inside
    shards[1][0]["text"] = " \n "  # an empty document: skipped, no empty line written for it
    paths = [corpora.write_pile_shard(tmp_path / f"0{i}.jsonl", docs)
             for i, docs in enumerate(shards)]
    pile.main([str(a) for a in ("--train", *paths, "--destdir", tmp_path / "breaks",
                                "--gpt2-bpe", bpe, "--document-breaks")])
    pile.prepare(tmp_path / "plain", paths, encoder=encoder)
    eos = encoder.dictionary.eos()

    written = [[encoder.encode(d["text"]).tolist() for d in docs if d["text"].strip()]
               for docs in shards]
    for name, docs in zip(("train", "train1"), written):
        plain = dataset(tmp_path / "plain" / name)
        assert [plain[i].tolist() for i in range(len(plain))] == docs  # as before: no breaks
        breaks = dataset(tmp_path / "breaks" / name)
        samples = [breaks[i].tolist() for i in range(len(breaks))]
        assert samples[0::2] == docs and samples[1::2] == [[eos]] * len(docs)
        assert all(d.count(eos) == 1 for d in docs)  # a document's blank lines are no </s>
    saved = json.loads((tmp_path / "breaks" / "stats.json").read_text())
    assert saved["document_breaks"]
    loaded = [dataset(tmp_path / "breaks" / name) for name in ("train", "train1")]
    written_tokens = sum(int(d.sizes.sum()) for d in loaded)  # (sizes: a view of d's mmap)
    assert saved["splits"]["train"]["counts"]["tokens"] == written_tokens  # breaks counted

    # train + train1, loaded as one split: every document found, blocks never mix two
    combined = dataset(tmp_path / "breaks" / "train", combine=True)
    assert documents_found(combined, eos) == written[0] + written[1]
    assert_complete_doc_blocks_keep_to_one_document(combined, block_size=64, eos=eos)
    assert len(documents_found(dataset(tmp_path / "plain" / "train", combine=True), eos)) == 1


# --- The embedded corpus --------------------------------------------------------------------

DOCS = [corpus.Document(f"doc{i}", "\n".join(f"paragraph {j} of document {i} ."
                                             for j in range(1 + i % 3))) for i in range(40)]


def test_corpus_default_is_unchanged_and_breaks_are_opt_in(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "collect_documents", lambda *args: DOCS)
    splits = corpus.split_documents(DOCS, 0.1, 0.1)
    default = corpus.build_corpus(tmp_path / "default", 0.1, 0.1)
    corpus.main([str(tmp_path / "breaks"), "--valid-fraction", "0.1", "--test-fraction", "0.1",
                 "--document-breaks"])
    breaks = json.loads((tmp_path / "breaks" / "corpus.json").read_text())
    assert default["document_breaks"] is False and breaks["document_breaks"] is True
    with pytest.raises(SystemExit):  # the other variant over it: refused, nothing replaced
        corpus.main([str(tmp_path / "breaks"), "--valid-fraction", "0.1"])
    assert json.loads((tmp_path / "breaks" / "corpus.json").read_text()) == breaks
    assert default["sha256"] != breaks["sha256"]
    for split in corpus.SPLITS:
        # the default: each document's paragraphs, one a line, documents back to back
        data = (tmp_path / "default" / f"{split}.txt").read_text(encoding="utf-8")
        assert data == "".join(d.text + "\n" for d in splits[split]) and "\n\n" not in data
        # with breaks: one empty line after every document, none inside one
        data = (tmp_path / "breaks" / f"{split}.txt").read_text(encoding="utf-8")
        assert data.endswith("\n\n") and "\n\n\n" not in data and not data.startswith("\n")
        assert data[:-2].split("\n\n") == [d.text for d in splits[split]]
        assert breaks["splits"][split]["lines"] == data.count("\n")

    # fairseq-preprocess of the text: --alibi-document-mask doc finds each document
    text = tmp_path / "breaks"
    preprocess("--only-source", "--trainpref", text / "train.txt", "--validpref",
               text / "valid.txt", "--testpref", text / "test.txt",
               "--destdir", tmp_path / "bin", "--workers", "1")
    ds = dataset(tmp_path / "bin" / "train")
    found = documents_found(ds)
    assert len(found) == len(splits["train"])
    assert [len(d) for d in found] == [
        len(d.text.split()) + d.text.count("\n") + 1 for d in splits["train"]]
    assert_complete_doc_blocks_keep_to_one_document(ds, block_size=16)


@pytest.mark.slow
def test_corpus_default_is_the_measured_one(tmp_path):
    """The quickstart's corpus (docs/quickstart.md, "The corpus, measured") is unchanged."""
    import platform

    if platform.python_version() != "3.11.7" or platform.python_implementation() != "CPython":
        pytest.skip("the recorded SHA-256 is CPython 3.11.7's")
    splits = corpus.split_documents(corpus.collect_documents())
    default = corpus.write_corpus(tmp_path / "default", splits)
    assert default["sha256"] == \
        "289922821d4ae2d91d0f86a5e5771ebaf7c628ebbac220e8dc43ec774baaa115"
    breaks = corpus.write_corpus(tmp_path / "breaks", splits, document_breaks=True)
    for split in corpus.SPLITS:
        lines = breaks["splits"][split]["lines"]
        assert lines == default["splits"][split]["lines"] + len(splits[split])
