"""Representative phrases: what leaves an organisation instead of raw queries.

A query contributes a bounded number of candidate phrases (content-word
unigrams and bigrams, after PII masking); phrases are counted per tool by
distinct supporting queries and released only above a noised threshold (see
:mod:`synapse_flwr.core.privacy`). Released phrases are then grouped into scenarios,
which is post-processing of released data and so costs no privacy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# Function words plus the politeness and request boilerplate of agent queries,
# which say nothing about which tool is right.
STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do
    does doesn't doing don't down during each few for from further had hadn't has hasn't
    have haven't having he he'd he'll he's her here here's hers herself him himself his how
    how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most
    mustn't my myself no nor not of off on once only or other ought our ours ourselves out
    over own same shan't she she'd she'll she's should shouldn't so some such than that
    that's the their theirs them themselves then there there's these they they'd they'll
    they're they've this those through to too under until up very was wasn't we we'd we'll
    we're we've were weren't what what's when when's where where's which while who who's
    whom why why's with won't would wouldn't you you'd you'll you're you've your yours
    yourself yourselves please help want need like know tell give show let would also
    just really any anything something some could maybe thanks thank hi hello hey tool
    use using able possible way ways get getting go going make sure one
    """.split()
)

# Letters and digits of every script ("münchen", "москве"), not ASCII alone: a
# benchmark in another language must not lose its queries as "no words".
_TOKEN = re.compile(r"<[a-z_]+>|[^\W_]+(?:['\-][^\W_]+)*")
_PLACEHOLDER = re.compile(r"^<[a-z_]+>$")
# Scripts written without spaces (Han, kana): a run of them is one "word" to the
# pattern above, i.e. a whole query; overlapping character bigrams are the usual
# indexing unit instead (a lone character stays itself).
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def _bigrams(run: re.Match[str]) -> str:
    chars = run.group()
    return " " + " ".join(chars[i : i + 2] for i in range(max(len(chars) - 1, 1))) + " "


def spaced(text: str) -> str:
    """``text`` lower-cased, each run of a script written without spaces as its character bigrams."""
    return _UNSPACED.sub(_bigrams, text.lower())


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens; PII placeholders such as ``<email>`` stay one token.

    Words are runs of letters and digits of any script, joined by ``'`` or ``-``;
    text in scripts without spaces (Chinese, Japanese) gives its character bigrams.
    """
    return _TOKEN.findall(spaced(text))


def content_tokens(text: str) -> list[str | None]:
    """Tokens with stop words, placeholders and single characters replaced by None.

    The None entries keep bigrams from bridging a removed PII span.
    """
    out: list[str | None] = []
    for tok in tokens(text):
        if _PLACEHOLDER.match(tok):
            out.append(None)
        elif tok in STOPWORDS or len(tok) < 2:
            continue
        else:
            out.append(tok)
    return out


def candidate_phrases(text: str, max_unigrams: int = 5, max_bigrams: int = 3) -> list[str]:
    """The bounded set of phrases one query may contribute, in a fixed order.

    Parameters
    ----------
    text : str
        A PII-masked query.
    max_unigrams, max_bigrams : int
        Contribution bound: at most this many distinct unigrams and bigrams
        (the first ones in reading order). Their sum bounds the number of
        text partitions one event touches, which the privacy accounting uses.
    """
    seq = content_tokens(text)
    unigrams = list(dict.fromkeys(t for t in seq if t))[:max_unigrams]
    bigrams = list(
        dict.fromkeys(f"{a} {b}" for a, b in zip(seq, seq[1:]) if a and b and a != b)
    )[:max_bigrams]
    return unigrams + bigrams


def token_set(text: str) -> frozenset[str]:
    """A phrase's token set (tokenise once, compare many times with :func:`set_jaccard`)."""
    return frozenset(tokens(text))


def set_jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two token sets (0 when either is empty)."""
    if not a or not b:
        return 0.0
    common = len(a & b)
    return common / (len(a) + len(b) - common)


def token_jaccard(a: str, b: str) -> float:
    """Jaccard similarity of two phrases' token sets."""
    return set_jaccard(token_set(a), token_set(b))


@dataclass(frozen=True)
class PhraseGroup:
    """A representative phrase with the near-identical ones grouped under it.

    Parameters
    ----------
    text : str
        The representative (highest support).
    support : float
        The representative's support (members share queries, so not summed).
    variants : tuple of str
        Grouped phrases, by decreasing support.
    """

    text: str
    support: float
    variants: tuple[str, ...]


def group_phrases(
    phrases: Iterable[tuple[str, float]],
    threshold: float = 0.5,
    max_groups: int = 64,
    max_variants: int = 8,
) -> list[PhraseGroup]:
    """Greedily group near-identical phrases; deterministic and order-independent.

    Phrases are visited by decreasing support (ties by text); each joins the
    first representative whose token Jaccard similarity reaches ``threshold``,
    or becomes a representative. Representatives are therefore pairwise
    dissimilar, so grouping the output again changes nothing.

    Parameters
    ----------
    phrases : iterable of (str, float)
        Phrase and support.
    threshold : float
        Jaccard similarity at which two phrases count as near-identical.
    max_groups : int
        Keep at most this many groups (highest support first).
    max_variants : int
        Keep at most this many variants per group.
    """
    ordered = sorted(phrases, key=lambda p: (-p[1], p[0]))
    reps: list[tuple[str, float, list[str]]] = []
    for text, support in ordered:
        for rep_text, _, variants in reps:
            if token_jaccard(text, rep_text) >= threshold:
                if len(variants) < max_variants and text != rep_text:
                    variants.append(text)
                break
        else:
            reps.append((text, support, []))
    return [PhraseGroup(t, s, tuple(v)) for t, s, v in reps[:max_groups]]


def normalize_text(text: str) -> str:
    """Case- and whitespace-insensitive key for exact de-duplication."""
    return " ".join(tokens(text))


def is_text(query: object) -> bool:
    """A query worth keeping: a string with at least one word (letters or digits: ``"17*23"`` is a request)."""
    return isinstance(query, str) and bool(tokens(query))

