"""BM25 retrieval over a JSONL corpus ranks the right document first."""

from __future__ import annotations

import json

import pytest

from slime.errors import DataError
from slime.rollout.tools.registry import ToolRegistry
from slime.rollout.tools.retrieval import BM25Index, retrieval_tool

DOCS = [
    {"id": "paris", "text": "Paris is the capital and largest city of France, on the Seine."},
    {"id": "berlin", "text": "Berlin is the capital of Germany and its largest city."},
    {"id": "seine", "text": "The Seine is a river that flows through Paris into the English Channel."},
    {"id": "python", "text": "Python is a programming language created by Guido van Rossum."},
    {"id": "bm25", "text": "Okapi BM25 is a ranking function used by search engines."},
]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n")
    return path


def test_right_document_ranks_first(corpus):
    index = BM25Index.from_jsonl(corpus)
    assert index.search("capital of Germany", top_k=1)[0][0] == "berlin"
    assert index.search("who created the Python language", top_k=2)[0][0] == "python"


async def test_tool_returns_numbered_passages_best_first(corpus):
    reg = ToolRegistry([retrieval_tool(BM25Index.from_jsonl(corpus))])
    result = await reg.call("retrieval", {"query": "river through Paris", "top_k": 2})
    assert result.error is None and result.content.startswith("[1] (id=seine)")
    assert (await reg.call("retrieval", {"query": "zzz"})).content == "No matching documents."


def test_bad_corpus_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(DOCS[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        BM25Index.from_jsonl(path)
