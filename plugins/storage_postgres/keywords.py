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
"""

from __future__ import annotations

from narrmem.text import keyword_terms

K1 = 1.2
B = 0.75
# SQLite's keyword rows hold two scope tokens (user and chat) beside the words, and FTS5 counts
# them in a row's length: counted here too, so that lengths (and so scores) are the same.
SCOPE_TOKENS = 2


def keyword_tokens(index_text: str, context_text: str | None) -> int:
    """How many tokens a row's keyword document has (body and context), as BM25's length."""
    return len(keyword_terms(index_text)) + len(keyword_terms(context_text or ""))


def bm25_sql(where: str, kinds: str) -> str:
    """The ranking statement. ``$1`` text-search configuration, ``$2`` the query terms, ``$3`` the
    context weight, ``$4`` k; ``where`` is the scope (and ``kinds`` the kind filter) on ``memories``.

    ``terms`` holds each query term's lexemes, numbered by term; ``hits`` every in-scope row that
    matches any of them (of any kind: the counts are the scope's); ``freq`` the weighted frequency
    of each term in each hit; ``df`` each term's IDF over the scope.
    """
    return f"""
    WITH terms AS (
        SELECT t.n, lexeme FROM unnest($2::text[]) WITH ORDINALITY AS t (term, n),
        LATERAL unnest(tsvector_to_array(to_tsvector($1::regconfig, t.term))) AS lexeme
    ),
    q AS (
        SELECT NULLIF(array_to_string(array_agg(x), ' | '), '')::tsquery AS q
        FROM (SELECT plainto_tsquery($1::regconfig, t)::text AS x FROM unnest($2::text[]) AS t) AS p
        WHERE x <> ''
    ),
    scoped AS (
        SELECT COUNT(*)::float8 AS rows, AVG(keyword_tokens + {SCOPE_TOKENS})::float8 AS avgdl
        FROM memories WHERE {where}
    ),
    hits AS (
        SELECT id, kind, keywords, (keyword_tokens + {SCOPE_TOKENS})::float8 AS dl
        FROM memories, q WHERE keywords @@ q.q AND {where}
    ),
    freq AS (
        SELECT h.id, h.kind, h.dl, t.n,
            COUNT(*) FILTER (WHERE w = 'A') + $3::float8 * COUNT(*) FILTER (WHERE w = 'B') AS f
        FROM hits h
        CROSS JOIN LATERAL unnest(h.keywords) AS u (lexeme, positions, weights)
        JOIN terms t ON t.lexeme = u.lexeme
        CROSS JOIN LATERAL unnest(u.weights) AS w
        GROUP BY h.id, h.kind, h.dl, t.n
    ),
    df AS (
        SELECT freq.n, GREATEST(ln((s.rows - COUNT(*) + 0.5) / (COUNT(*) + 0.5)), 1e-6) AS idf
        FROM freq CROSS JOIN scoped s GROUP BY freq.n, s.rows
    )
    SELECT f.id, SUM(df.idf * f.f * {K1 + 1} / (f.f + {K1} * ({1 - B} + {B} * f.dl / s.avgdl))) AS rank
    FROM freq f JOIN df ON df.n = f.n CROSS JOIN scoped s
    WHERE {kinds}
    GROUP BY f.id ORDER BY rank DESC, f.id LIMIT $4
    """
