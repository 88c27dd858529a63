"""PII masking for user queries: typed placeholders, precompiled regexes.

All rules are alternatives of one compiled regex. A match starting further left
wins; at the same start, rules are tried most specific first. Rules introduced
by a keyword ("my name is", "zip code", "order", "SSN", ...) keep the keyword
and mask only the value. Placeholders are ``<KIND>`` for the kinds in
:data:`KINDS`. Payment-card-shaped numbers are ``<CARD>`` when they pass the
Luhn check and ``<ACCOUNT>`` otherwise, so none is left in clear.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

KINDS = (
    "EMAIL", "URL", "IP", "ACCOUNT", "USER", "CARD", "ORDER_ID", "SSN", "ZIP", "NAME",
    "ADDRESS", "PHONE",
)  # fmt: skip

# ---------------------------------------------------------------- fragments
_TLD = (
    r"(?:com|org|net|edu|gov|mil|int|io|co|ai|app|dev|info|biz|me|us|uk|de|fr|ca|au|jp|cn|"
    r"ru|nl|es|ch|se|eu|xyz|tv|ly|gg|online|site|shop|store|tech|cloud)"
)
_URL_TAIL = r"(?:[^\s<>\"'`]*[^\s<>\"'`.,;:!?)\]}])?"
_STREET_SUFFIX = (
    r"(?:(?i:street|avenue|boulevard|parkway|st|ave|blvd|pkwy)"
    r"|Road|Rd|Lane|Ln|Drive|Dr|Court|Ct|Place|Pl|Terrace|Ter|Way|Circle|Cir|Highway|Hwy|"
    r"Square|Sq|Trail|Trl|Plaza|Alley|Crescent|Close|Row|Loop)"
)
_STOPWORDS = (
    r"(?i:the|a|an|of|for|to|in|on|at|and|or|but|my|your|our|his|her|their|more|less|than|"
    r"by|with|from|per|each|every|down|up|is|are|was|were|be|it|this|that|these|those|"
    r"not|so|please|here|i|im|also|just|calling|looking|trying|new)\b"
)
_STREET_WORD = rf"(?!{_STOPWORDS})(?:[A-Za-z][A-Za-z'-]*|\d+(?i:st|nd|rd|th))\.?"
_NAME_END = r"(?![A-Za-zÀ-ÿ0-9_'-]|[@.][A-Za-z0-9])"
_NAME_WORD = rf"[A-ZÀ-Ý][a-zà-ÿ]+(?:['-]?[A-ZÀ-Ý][a-zà-ÿ]+)?{_NAME_END}"
_ANY_NAME_WORD = rf"(?!{_STOPWORDS})[A-Za-zÀ-ÿ][A-Za-zÀ-ÿ'-]*{_NAME_END}"
# Order/ticket/account ids: >= 5 digits, or >= 4 chars of capitals, digits and
# dashes with at least one capital and one digit (so "10kg", "100 units" pass).
_ID = r"(?:\d{5,}|(?=[A-Z0-9-]*\d)(?=[0-9-]*[A-Z])[A-Z0-9][A-Z0-9-]{3,})\b"
_KW_TAIL = r"(?:\s+(?i:id|number|no\.?|num|code))?\s*(?:(?i:is)\s+)?:?\s*"
_HASH = r"(?:#\s*:?\s*)?"
_ID_RE = re.compile(rf"{_HASH}{_ID}", re.ASCII)
# Digit runs: not inside a longer number, a decimal or an amount of money. The
# start guard is a lookbehind placed after the run's first digit.
_NUM_START = r"(?<![\d$€£¥-]\d)(?<!\d[.,]\d)"
_NUM_END = r"(?![\d-]|[.,]\d)"
_US_STATES = (
    "AL|AK|AZ|AR|CA|CO|CT|DE|DC|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV|"
    "NH|NJ|NM|NY|NC|ND|OH|OK|OR|PA|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY"
)


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_kind(value: str) -> str:
    digits = re.sub(r"\D", "", value)
    return "CARD" if _luhn_ok(digits) else "ACCOUNT"


# A rule is (kind, keyword prefix kept verbatim or None, value pattern); the
# kind may be a callable deciding it from the matched value. Word rules all
# start at a word boundary (one shared ``\b``); free rules start with a literal
# or a character class (lookbehinds come after the first character) so the
# regex engine skips them cheaply wherever they cannot start. At one position
# word rules are tried before free rules, each list in order: earlier wins.
_Rule = tuple[str | Callable[[str], str], str | None, str]
_WORD_RULES: tuple[_Rule, ...] = (
    ("EMAIL", None, r"[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b"),
    ("URL", None, rf"(?i:https?://|www\.)[^\s<>\"'`]+{_URL_TAIL}"),
    (
        "URL",
        None,
        rf"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?\.)+{_TLD}\b(?![.-]?\w)"
        rf"(?::\d{{2,5}})?(?:/{_URL_TAIL})?",
    ),
    ("IP", None, r"(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b(?!\.\d)"),
    (
        "IP",
        None,
        r"(?<!:)(?:(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}"
        r"|(?:[0-9A-Fa-f]{1,4}:){1,6}:(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,5})?)(?![\w:])",
    ),
    ("ACCOUNT", None, r"[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b"),  # IBAN
    (
        "ACCOUNT",
        None,
        r"(?:credit_card|debit_card|gift_card|paypal|bank_account|certificate|apple_pay|"
        r"google_pay|venmo|card)_\d{3,}\b",
    ),
    ("USER", None, r"[a-z]+(?:_[a-z]+){1,3}_\d{3,}\b"),
    (
        "ORDER_ID",
        rf"(?i:orders?|tickets?|cases?|bookings?|reservations?|confirmations?|tracking|"
        rf"invoices?|incidents?|reference|ref|claims?|requests?|shipments?|returns?){_KW_TAIL}",
        rf"{_HASH}{_ID}(?:\s*(?:,|and|&|or)\s*{_HASH}{_ID})*",
    ),
    ("ORDER_ID", None, r"(?:INC|REQ|RITM|CHG|PRB|TASK|SR|TKT|CS)\d{5,}\b|[A-Z]{1,2}\d{6,}\b"),
    (
        "SSN",
        r"(?i:ssn|social security(?: number| no\.?)?|passport(?: number| no\.?)?|"
        r"driver'?s licen[cs]e(?: number| no\.?)?|national id(?: number)?|tax id|tin|sin)"
        r"\s*(?:(?i:is)\s+)?[:#]?\s*",
        r"(?=[A-Za-z0-9-]*\d)[A-Za-z0-9][A-Za-z0-9-]{4,}\b",
    ),
    (
        "ZIP",
        r"(?i:zip(?:\s*code)?|postal\s*code|post\s*code)\s*(?:(?i:is)\s+)?[:#]?\s*",
        r"(?:\d{5}(?:-\d{4})?|[A-Z]\d[A-Z] ?\d[A-Z]\d|[A-Z]{1,2}\d[A-Z\d]? ?\d[A-Z]{2})\b",
    ),
    ("ZIP", rf"(?:{_US_STATES}),?\s+", r"\d{5}(?:-\d{4})?\b"),
    (
        "NAME",
        r"(?i:my\s+name\s+is|your\s+name\s+is|my\s+name's|name\s*:)\s+",
        rf"{_ANY_NAME_WORD}(?:\s+{_ANY_NAME_WORD}){{0,2}}",
    ),
    ("NAME", r"(?i:i\s+am|i'm|you\s+are)\s+", rf"{_NAME_WORD}(?:\s+{_NAME_WORD}){{1,2}}"),
    (
        "ADDRESS",
        None,
        rf"\d{{1,6}}[A-Za-z]?\s+(?:{_STREET_WORD}\s+){{1,3}}{_STREET_SUFFIX}\b\.?"
        r"(?:\s+(?:N|S|E|W|NE|NW|SE|SW)\b)?"
        r"(?:,?\s*(?i:apt|apartment|suite|ste|unit|floor|fl)\.?\s*#?\s*[A-Za-z0-9-]+|,?\s*#\s*\d+\w*)?",
    ),
    (
        "ACCOUNT",
        rf"(?i:account|acct|iban|routing|member(?:ship)?|customer|policy|loyalty){_KW_TAIL}",
        rf"{_HASH}{_ID}",
    ),
)
_FREE_RULES: tuple[_Rule, ...] = (
    ("ORDER_ID", None, r"#(?<![\w#]#)(?:[A-Z]{1,3}-?\d{3,}|\d{5,})\b"),
    ("SSN", None, r"\d(?<![\d-]\d)\d{2}-\d{2}-\d{4}(?![\d-])"),
    (
        _card_kind,
        None,
        rf"\d{_NUM_START}(?:\d{{3}}(?P<csep>[ -])\d{{4}}(?P=csep)\d{{4}}(?P=csep)\d{{1,7}}"
        rf"|\d{{3}}[ -]\d{{6}}[ -]\d{{4,5}}|\d{{12,18}}){_NUM_END}",
    ),
    (
        "PHONE",
        None,
        r"\+(?<![\w+]\+)(?=(?:[ .()-]*\d){7})\d{1,3}(?:[ .-]?\(\d{1,4}\)|[ .-]?\d{1,4}){2,6}(?!\d)",
    ),
    ("PHONE", None, r"\((?<![\w(]\()\d{3}\)\s?\d{3}[-. ]\d{4}(?![\w-])"),
    ("PHONE", None, r"\d(?<![\w.-]\d)\d{2}[-. ]\d{3}[-. ]\d{4}(?![\w-])"),
    ("PHONE", None, r"0(?<![\w.-]0)\d(?:[ .-]\d{2}){4}(?![\w-])"),
    ("PHONE", None, r"0(?<![\w.-]0)\d{2,4}[ -]\d{3,4}[ -]\d{3,4}(?![\w-])"),
    ("ACCOUNT", None, rf"\d{_NUM_START}\d{{7,}}{_NUM_END}"),
)
_RULES = _WORD_RULES + _FREE_RULES


def _alternative(i: int, prefix: str | None, value: str) -> str:
    # Empty marker groups (none first, to keep the fast skip): ``r{i}p`` where
    # the value starts, ``r{i}`` closes last so ``match.lastgroup`` names the rule.
    if prefix:
        return f"(?:{prefix})(?P<r{i}p>)(?:{value})(?P<r{i}>)"
    return f"(?:{value})(?P<r{i}>)"


_PATTERN = re.compile(
    r"\b(?:"
    + "|".join(_alternative(i, p, v) for i, (_, p, v) in enumerate(_WORD_RULES))
    + ")|"
    + "|".join(
        _alternative(i, p, v) for i, (_, p, v) in enumerate(_FREE_RULES, start=len(_WORD_RULES))
    ),
    re.ASCII,
)
_GROUP_RULE = {f"r{i}": rule for i, rule in enumerate(_RULES)}


def _spans(text: str) -> Iterator[tuple[int, int, str]]:
    """Yield ``(start, end, kind)`` of every PII value, left to right, disjoint."""
    for m in _PATTERN.finditer(text):
        group = m.lastgroup or ""
        kind, prefix, _ = _GROUP_RULE[group]
        start = m.end(f"{group}p") if prefix else m.start()
        value = text[start : m.end()]
        if callable(kind):
            yield start, m.end(), kind(value)
        elif kind == "ORDER_ID" and prefix:  # a list of ids: mask each one
            for idm in _ID_RE.finditer(value):
                yield start + idm.start(), start + idm.end(), kind
        else:
            yield start, m.end(), kind


def _mask_once(text: str) -> str:
    parts: list[str] = []
    pos = 0
    for start, end, kind in _spans(text):
        parts.append(text[pos:start])
        parts.append(f"<{kind}>")
        pos = end
    if not parts:
        return text
    parts.append(text[pos:])
    return "".join(parts)


def mask_pii(text: str) -> str:
    """Replace PII in ``text`` by typed placeholders such as ``<EMAIL>``.

    Parameters
    ----------
    text : str
        Free text (a user query).

    Returns
    -------
    str
        ``text`` with every detected PII value replaced by ``<KIND>``
        (``KIND`` in :data:`KINDS`); unchanged if none is found. Idempotent.
    """
    # Repeat to a fixpoint (masking can expose a new match next to a
    # placeholder). It terminates: no rule consumes "<" or ">" or matches inside
    # a placeholder, so each changing pass strictly shrinks the unmasked text.
    while True:
        masked = _mask_once(text)
        if masked == text:
            return text
        text = masked


def find_pii(text: str) -> list[tuple[str, str]]:
    """List the PII values :func:`mask_pii` would replace in one pass.

    Parameters
    ----------
    text : str
        Free text (a user query).

    Returns
    -------
    list of (str, str)
        ``(kind, matched value)`` pairs, left to right.
    """
    return [(kind, text[start:end]) for start, end, kind in _spans(text)]
