"""PII masking: planted canaries vanish, ordinary tool-use queries stay intact."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synapse_flwr.core.pii import KINDS, find_pii, mask_pii

# (sentence with planted PII, canary substrings that must vanish, placeholder expected)
CANARIES: list[tuple[str, tuple[str, ...], str]] = [
    # e-mail
    ("Send the receipt to omar.anderson3203@example.com please", ("omar.anderson3203",), "EMAIL"),
    ("my email is Jane_Doe+shop@mail.co.uk, update it", ("Jane_Doe+shop", "mail.co.uk"), "EMAIL"),
    ("cc: mia.li-3668@corp-mail.io and bob@x.org", ("mia.li-3668", "bob@x.org"), "EMAIL"),
    ("email omar_anderson_3203@example.com the invoice", ("omar_anderson_3203",), "EMAIL"),
    # phone
    ("call me at +1 (555) 123-4567 tomorrow", ("555) 123-4567", "123-4567"), "PHONE"),
    ("my number is 555-867-5309", ("867-5309",), "PHONE"),
    ("text (212) 555 0199 when ready", ("555 0199",), "PHONE"),
    ("UK office: +44 20 7946 0958", ("7946 0958",), "PHONE"),
    ("ring 020 7946 0958 after 5pm", ("7946 0958",), "PHONE"),
    ("mon portable est 06 12 34 56 78", ("12 34 56 78",), "PHONE"),
    ("whatsapp +33612345678 now", ("612345678",), "PHONE"),
    ("phone 415.555.2671 is mine", ("555.2671",), "PHONE"),
    # payment cards
    ("charge card 4111 1111 1111 1111 for the order", ("1111 1111",), "CARD"),
    ("use 5500-0000-0000-0004 exp 12/26", ("0000-0004",), "CARD"),
    ("my visa is 4012888888881881", ("4012888888881881",), "CARD"),
    ("amex 3782 822463 10005 please", ("822463",), "CARD"),
    # accounts / IBAN / payment ids
    ("wire it to IBAN DE89 3704 0044 0532 0130 00", ("3704 0044", "DE89"), "ACCOUNT"),
    ("iban GB82WEST12345698765432 is my account", ("GB82WEST12345698765432",), "ACCOUNT"),
    ("pay with credit_card_4190576 instead", ("4190576",), "ACCOUNT"),
    ("refund to paypal_3738584", ("3738584",), "ACCOUNT"),
    ("use gift_card_1725971 for the balance", ("1725971",), "ACCOUNT"),
    ("my bank account number is 12345678901", ("12345678901",), "ACCOUNT"),
    ("account #: 00928371 needs review", ("00928371",), "ACCOUNT"),
    ("routing 021000021 and acct 987654321", ("021000021", "987654321"), "ACCOUNT"),
    ("member id AB12345C, check my points", ("AB12345C",), "ACCOUNT"),
    # order / ticket ids
    ("where is my order #W6067464?", ("W6067464",), "ORDER_ID"),
    ("cancel order 123456 and order #W2378156", ("123456", "W2378156"), "ORDER_ID"),
    ("status of ticket #A-1234", ("A-1234",), "ORDER_ID"),
    ("escalate INC0012345 to tier 2", ("INC0012345",), "ORDER_ID"),
    ("reservation ZFA04Y needs a seat change", ("ZFA04Y",), "ORDER_ID"),
    ("orders 98765, 87654 and 76543 are late", ("98765", "87654", "76543"), "ORDER_ID"),
    ("my case number is CS-77821", ("CS-77821",), "ORDER_ID"),
    ("exchange items in W4817420 please", ("W4817420",), "ORDER_ID"),
    # URLs
    ("open https://internal.acme-corp.com/hr/payroll?id=42 for me", ("acme-corp", "payroll"), "URL"),
    ("visit www.janes-blog.net/about", ("janes-blog",), "URL"),
    ("summarise example.com/users/omar/profile", ("example.com", "omar/profile"), "URL"),
    ("is mycompany.io down?", ("mycompany.io",), "URL"),
    # street addresses
    ("ship to 123 Main Street, Springfield", ("123 Main",), "ADDRESS"),
    ("I live at 45 Elm St. Apt 5 in Boston", ("45 Elm", "Apt 5"), "ADDRESS"),
    ("directions to 1600 Amphitheatre Pkwy", ("1600 Amphitheatre",), "ADDRESS"),
    ("deliver to 445 Maple Drive, Suite 394, Fort Worth", ("445 Maple", "Suite 394"), "ADDRESS"),
    ("new address: 77 west 34th street", ("77 west",), "ADDRESS"),
    ("my home is 221B Baker Street", ("221B",), "ADDRESS"),
    ("pick up from 1600 Pennsylvania Avenue NW", ("1600 Pennsylvania",), "ADDRESS"),
    # IPs
    ("block 192.168.10.254 on the firewall", ("192.168.10.254",), "IP"),
    ("my server 2001:db8:85a3::8a2e:370:7334 is slow", ("85a3", "7334"), "IP"),
    # SSN-like ids
    ("my SSN is 123-45-6789", ("123-45-6789",), "SSN"),
    ("passport number X1234567 expires soon", ("X1234567",), "SSN"),
    ("social security number: 078051120", ("078051120",), "SSN"),
    # zip codes
    ("my zip code is 19122", ("19122",), "ZIP"),
    ("weather for zip 94103-1234", ("94103",), "ZIP"),
    ("postcode SW1A 1AA please", ("SW1A 1AA",), "ZIP"),
    ("Fort Worth, TX 76165", ("76165",), "ZIP"),
    # names
    ("Hi, my name is Yusuf Rossi and I need help", ("Yusuf", "Rossi"), "NAME"),
    ("Your name is Mei Kovacs and your zip code is 28236.", ("Mei", "Kovacs", "28236"), "NAME"),
    ("my name is john smith, can you help", ("john", "smith"), "NAME"),
    ("I'm Sofia Martinez-Lopez from sales", ("Sofia", "Martinez-Lopez"), "NAME"),
    ("You are Aarav McDonald in 90210", ("Aarav", "McDonald"), "NAME"),
    ("My name is José García.", ("José", "García"), "NAME"),
    # tau-bench style user ids
    ("You are omar_anderson_3203, check my orders", ("omar_anderson_3203",), "USER"),
    ("user id mia_li_3668 wants to cancel", ("mia_li_3668",), "USER"),
    ("look up sofia_van_der_berg_120 profile", ("berg_120",), "USER"),
]

ORDINARY = [
    "what's the weather in Paris tomorrow",
    "convert 5 USD to EUR",
    "top 10 movies of 2023",
    "call the calculate tool with 2+2",
    "what is 15% of 240?",
    "book a table for 4 at 7:30 pm",
    "set a timer for 25 minutes",
    "translate 'good morning' into Spanish",
    "show me flights from JFK to LAX on 2024-05-17",
    "how many calories in 2 eggs and 100 g of rice",
    "search for iPhone 15 Pro Max reviews",
    "compare the Galaxy S24 with the Pixel 8",
    "list files in the src directory with get_files",
    "run search_web for python 3.11 release notes",
    "what's the population of Tokyo in 2020",
    "remind me to buy milk at 6pm",
    "play the top 50 songs of the 1990s",
    "how far is the moon in km",
    "it's a 3 hour drive to the lake",
    "order 2 pizzas and 3 sodas",
    "order 100 units of widget",
    "find the 5 best ways to learn Rust",
    "what does HTTP status 404 mean",
    "generate a SQL query for sales in Q3",
    "read config.json and main.py",
    "schedule a meeting on March 3rd at 10:30",
    "is COVID-19 still a pandemic",
    "use GPT-4 to summarise the article",
    "weather in New York, NY this weekend",
    "the price is $19.99 for 3 months",
    "my name is not important, just answer",
    "version 2.0.1 of the library",
    "walk 3 blocks down the road",
    "get the stock price of AAPL and MSFT",
    "split 1,250,000 by 4",
]


@pytest.mark.parametrize(("text", "canaries", "kind"), CANARIES, ids=[c[0][:40] for c in CANARIES])
def test_canaries_are_masked(text: str, canaries: tuple[str, ...], kind: str) -> None:
    masked = mask_pii(text)
    for canary in canaries:
        assert canary not in masked, (text, masked)
    assert f"<{kind}>" in masked, (text, masked)


def test_canary_corpus_covers_every_kind() -> None:
    assert {kind for _, _, kind in CANARIES} == set(KINDS)
    assert len(CANARIES) >= 40


def test_canaries_in_one_long_text() -> None:
    text = " ; ".join(t for t, _, _ in CANARIES)
    masked = mask_pii(text)
    for _, canaries, _ in CANARIES:
        for canary in canaries:
            assert canary not in masked


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_unchanged(text: str) -> None:
    assert mask_pii(text) == text
    assert find_pii(text) == []


def test_keywords_are_kept() -> None:
    assert mask_pii("my zip code is 19122") == "my zip code is <ZIP>"
    assert mask_pii("Your name is Mei Kovacs.") == "Your name is <NAME>."
    assert mask_pii("cancel order #W6067464 now") == "cancel order <ORDER_ID> now"
    assert mask_pii("orders 98765 and 87654") == "orders <ORDER_ID> and <ORDER_ID>"


def test_find_pii_reports_kind_and_value() -> None:
    found = find_pii("mail a@b.com or call 555-867-5309, zip 94103")
    assert found == [("EMAIL", "a@b.com"), ("PHONE", "555-867-5309"), ("ZIP", "94103")]


def test_luhn_decides_card_or_account() -> None:
    assert mask_pii("4012888888881881") == "<CARD>"
    assert mask_pii("4012888888881882") == "<ACCOUNT>"


def test_fast_on_many_short_queries() -> None:
    queries = [t for t, _, _ in CANARIES] + ORDINARY
    batch = (queries * (20_000 // len(queries) + 1))[:20_000]
    start = time.process_time()  # CPU time: robust to other load on the machine
    for q in batch:
        mask_pii(q)
    assert time.process_time() - start < 1.0


_PIECES = st.sampled_from(
    [t for t, _, _ in CANARIES]
    + ORDINARY
    + ["my name is", "zip", "order", "#", "@", ".com", "www.", "http://", "<EMAIL>", "<NAME>",
       "4111", "1111", "-", " ", ".", ",", "123", "Main", "St", "Street", "_", "a", "Z", "12",
       "+1", "(555)", "ssn", "::", "IBAN", "DE89", "account", "I'm", "Ann", "Lee", "é"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_idempotent_on_pii_like_text(text: str) -> None:
    once = mask_pii(text)
    assert mask_pii(once) == once


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=200))
def test_idempotent_and_total_on_arbitrary_text(text: str) -> None:
    once = mask_pii(text)
    assert isinstance(once, str)
    assert mask_pii(once) == once
    assert all(kind in KINDS for kind, _ in find_pii(text))
