"""The ``retrieval`` tool: BM25 (Okapi, ``rank_bm25``) over a local JSONL corpus of ``{"id", "text"}`` rows.

Tokenisation is lower-cased ``\\w+`` words, for documents and queries alike. Scores come from
``rank_bm25.BM25Okapi`` (k1 = 1.5, b = 0.75, IDF floored at 0.25 x the mean IDF); documents whose
score is not positive are not returned.

Example::

    index = BM25Index.from_jsonl("wiki.jsonl")          # rows: {"id": "d1", "text": "..."}
    index.search("capital of france", top_k=2)           # [("d7", 5.12, "Paris is ..."), ...]
    tool = retrieval_tool(index)                         # for a ToolRegistry

Not covered: corpora that do not fit in memory (the whole index is a Python structure), stemming,
stop words, and incremental updates (build a new index).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rank_bm25 import BM25Okapi

from slime.errors import DataError
from slime.rollout.tools.registry import Tool

__all__ = ["BM25Index", "retrieval_tool", "tokenize"]

_WORD = re.compile(r"\w+", re.UNICODE)
MAX_TOP_K = 20


def tokenize(text: str) -> list[str]:
    """Lower-cased ``\\w+`` words."""
    return _WORD.findall(text.lower())


class BM25Index:
    """A BM25 index over ``docs`` (``[num_docs]`` of ``(id, text)``).

    Raises:
        ValueError: an empty corpus.
    """

    def __init__(self, docs: Sequence[tuple[str, str]]):
        if not docs:
            raise ValueError("BM25Index needs at least one document")
        self.ids = [d[0] for d in docs]
        self.texts = [d[1] for d in docs]
        # rank_bm25 divides by the mean document length; an all-empty corpus would divide by 0.
        self._bm25 = BM25Okapi([tokenize(t) or [""] for t in self.texts])

    @classmethod
    def from_jsonl(cls, path: str | Path, *, id_key: str = "id", text_key: str = "text") -> BM25Index:
        """Load rows ``{"id": str|int, "text": str}``, one per line; blank lines are skipped.

        Raises:
            DataError: naming ``path:line`` for bad JSON or a missing / non-string field.
        """
        path = Path(path)
        docs: list[tuple[str, str]] = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get(text_key), str) or row.get(id_key) is None:
                    raise DataError(f"{path}:{lineno}: expected an object with {id_key!r} and a string {text_key!r}")
                docs.append((str(row[id_key]), row[text_key]))
        if not docs:
            raise DataError(f"{path}: no documents")
        return cls(docs)

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, query: str, top_k: int = 3) -> list[tuple[str, float, str]]:
        """The ``top_k`` best documents as ``(id, score, text)``, best first; ties keep corpus order."""
        words = tokenize(query)
        if not words or top_k <= 0:
            return []
        scores = self._bm25.get_scores(words)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [(self.ids[i], float(scores[i]), self.texts[i]) for i in order[:top_k] if scores[i] > 0]


def retrieval_tool(index: BM25Index, *, default_top_k: int = 3, max_chars_per_doc: int = 1000) -> Tool:
    """The ``retrieval`` tool: ``{"query": str, "top_k": int}`` -> numbered passages (scoring runs in a thread)."""

    async def retrieve(arguments: dict[str, Any]) -> str:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ValueError("'query' must be a non-empty string")
        top_k = arguments.get("top_k", default_top_k)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
            raise ValueError(f"'top_k' must be an integer in [1, {MAX_TOP_K}], got {top_k!r}")
        hits = await asyncio.to_thread(index.search, query, top_k)
        if not hits:
            return "No matching documents."
        return "\n".join(
            f"[{n}] (id={doc_id}) {text[:max_chars_per_doc]}" for n, (doc_id, _, text) in enumerate(hits, 1)
        )

    return Tool(
        name="retrieval",
        description="Search the document collection; returns the best matching passages.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "search words"},
                "top_k": {
                    "type": "integer",
                    "description": f"number of passages, 1..{MAX_TOP_K}",
                    "default": default_top_k,
                },
            },
            "required": ["query"],
        },
        fn=retrieve,
    )
