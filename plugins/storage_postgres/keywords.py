"""Keyword ranking on PostgreSQL: Okapi BM25 computed in SQL the way SQLite's FTS5 ``bm25()``
computes it, so that both stores hand recall the same keyword candidates in the same order.

``ts_rank`` is not BM25: it has no inverse document frequency and divides by the logarithm of a
document's length, so rare words (names, places) counted no more than common ones and long rows
(scenes) were barely penalised. On the LoCoMo development split its top ten shared 59% of SQLite's
(R@10 0.733 against 0.770).

What is the same as FTS5's ``bm25()`` (k1 = 1.2, b = 0.75, an IDF of
``ln((N - n + 0.5) / (n + 0.5))`` floored at 1e-6, each query term counted on its own): the term
frequency is the body's count plus ``context_weight`` times the context's (weights A and B of the
``tsvector``), the length is every token of the row, the two scope tokens SQLite's index keeps
beside the words included (:data:`SCOPE_TOKENS`).

What differs, and why:

* N, the average length and each term's document count are those of the *scope* searched (the
  user's or the chat's memories), where FTS5 takes them over the whole table. Keeping them per
  scope needs no table of counters that every writer of every worker would update (a hot row), and
  a word common in other users' memories does not change this user's ranking. With one chat per
  database (the benchmark) they are the same numbers.
* Words are stemmed by the text-search configuration (``english``: Snowball's Porter2), FTS5 by
  the original Porter algorithm: a few words stem differently (``use`` stays ``use``). Words in
  ``english``'s stopword list are left out of documents and queries; their tokens still count in
  the length.
* A ``tsvector`` keeps at most 256 positions of one word and none past 16383: a word repeated more
  often than that in one memory counts 256 times.
* A query term the configuration splits into several lexemes (rare with narrmem's tokens) is
  matched as all of them, not as a phrase.

Accents are folded as FTS5's ``remove_diacritics 2`` folds them (``café`` is ``cafe``, ``Zürich``
``zurich``), in the documents and in the query terms (:func:`folded`): PostgreSQL's ``english``
configuration keeps them, and a person who typed "cafe" found nothing of their "café" here while
SQLite found it.
"""

from __future__ import annotations

import unicodedata

from narrmem.text import fts_document, keyword_terms

K1 = 1.2
B = 0.75
# SQLite's keyword rows hold two scope tokens (user and chat) beside the words, and FTS5 counts
# them in a row's length: counted here too, so that lengths (and so scores) are the same.
SCOPE_TOKENS = 2


def folded(text: str) -> str:
    """``text`` without the accents of its Latin letters (combining marks after a Latin letter);
    the marks of other scripts (Devanagari's vowel signs, Arabic's harakat) are part of their words
    and stay, as in FTS5."""
    if text.isascii():
        return text
    kept: list[str] = []
    latin = False
    for char in unicodedata.normalize("NFD", text):
        if unicodedata.combining(char):
            if latin:
                continue
        else:
            latin = _is_latin(char)
        kept.append(char)
    return unicodedata.normalize("NFC", "".join(kept))


def _is_latin(char: str) -> bool:
    code = ord(char)
    return code < 0x250 or 0x1E00 <= code <= 0x1EFF or 0x2C60 <= code <= 0x2C7F or 0xA720 <= code <= 0xA7FF


def keyword_document(text: str) -> str:
    """What goes into the ``tsvector``: the text's keyword terms, accents folded."""
    return folded(fts_document(text))


def keywords_sql(config: str, body: str, context: str) -> str:
    """The ``keywords`` column's value from SQL expressions of the text configuration, the body's
    words and the context's: the body at weight A, the context at B."""
    return (
        f"setweight(to_tsvector({config}::regconfig, {body}), 'A') "
        f"|| setweight(to_tsvector({config}::regconfig, {context}), 'B')"
    )


def keyword_tokens(index_text: str, context_text: str | None) -> int:
    """How many tokens a row's keyword document has (body and context), as BM25's length: its
    keyword terms, as FTS5 counts them too (since schema 8 it keeps a word's marks in it)."""
    return len(keyword_terms(index_text)) + len(keyword_terms(context_text or ""))


def bm25_sql(terms: int, where: str, kinds: str, scope_words: str) -> str:
    """The ranking statement for ``terms`` query terms. ``$1`` the context weight, ``$2`` k, ``$3``
    any term (a ``tsquery``), ``$4`` ... each term's own ``tsquery``; ``where`` is the scope,
    ``kinds`` the kind filter and ``scope_words`` the scope's words (a ``tsquery``, see
    ``memory_scope_query`` in schema.py), with placeholders numbered after those.

    The rows come from ``memory_words`` (schema.py, step 4): the GIN index finds the rows that hold
    a term *and* the scope's words, so neither a walk of the scope's btree nor a read of the wide
    memory rows is paid; the scope's columns are checked beside them. One pass over those rows
    (``hits``) gives, per term, whether the row holds it (``m``, for its document count) and its
    frequency (``f``): ``ts_rank_cd`` of a one-word query without normalisation is the sum of the
    weights of the word's positions, so with weights A = 1 (the body) and B = the context weight it
    is FTS5's weighted frequency (the scope's words have weight D, 0 here, and no positions). The
    scope's row count and average length come from the memories' scope index (``keyword_tokens``
    is in it), read from the index alone.
    """
    n = range(terms)
    match = [f"words @@ ${4 + i}::tsquery AS m{i}" for i in n]
    weights = "ARRAY[0, 0, $1::float4, 1]"  # D, C, B (context), A (body)
    freq = [
        f"CASE WHEN words @@ ${4 + i}::tsquery "
        f"THEN ts_rank_cd({weights}, words, ${4 + i}::tsquery, 0)::float8 ELSE 0 END AS f{i}"
        for i in n
    ]
    counts = ", ".join(f"COUNT(*) FILTER (WHERE m{i}) AS d{i}" for i in n)
    idf = ", ".join(f"GREATEST(ln((s.rows - d{i} + 0.5) / (d{i} + 0.5)), 1e-6) AS i{i}" for i in n)
    norm = f"{K1} * ({1 - B} + {B} * h.dl / s.avgdl)"
    score = " + ".join(f"i{i} * f{i} * {K1 + 1} / (f{i} + {norm})" for i in n)
    return f"""
    WITH scoped AS MATERIALIZED (
        SELECT COUNT(*)::float8 AS rows, AVG(keyword_tokens + {SCOPE_TOKENS})::float8 AS avgdl
        FROM memories WHERE {where}
    ),
    hits AS MATERIALIZED (
        SELECT id, kind, (tokens + {SCOPE_TOKENS})::float8 AS dl, {", ".join(match + freq)}
        FROM memory_words WHERE words @@ ($3::tsquery && {scope_words}) AND {where}
    ),
    idf AS MATERIALIZED (
        SELECT {idf} FROM (SELECT {counts} FROM hits) AS d, scoped AS s
    )
    SELECT h.id, {score} AS rank FROM hits AS h, idf, scoped AS s
    WHERE {kinds} ORDER BY rank DESC, h.id LIMIT $2
    """
