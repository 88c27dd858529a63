"""Generate the embedded demo dataset ("Skyline Travel & Retail").

Writes, deterministically from one seed and without any model:

* ``catalog.json``: 25 catalog entries in all three accepted shapes (plain,
  OpenAI function tool, MCP ``tools/list``), one alias pair that collapses;
* ``org_a.jsonl``, ``org_b.jsonl``, ``org_c.jsonl``: non-IID experience logs of
  an airline support desk, an online retailer and a travel agency, with wrong-
  tool failures, tool errors, multi-step flows and planted cross-org
  contradictions;
* ``test.jsonl``: held-out queries (unseen paraphrases and fillers), including
  queries for documentation-only tools and a few with several acceptable golds;
* ``README.md``: what is in the folder, with the counts of this run.

Usage::

    python simulations/make_demo.py [--out DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger("make_demo")

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "synapse_flwr" / "data" / "demo"
DEFAULT_SEED = 20250901

Record = dict[str, Any]

# ------------------------------------------------------------------ catalog


def _schema(props: dict[str, tuple[Any, ...]], required: Sequence[str] = ()) -> Record:
    """A JSON Schema object from ``name -> (type, description[, enum])``."""
    properties: Record = {}
    for name, spec in props.items():
        prop: Record = {"type": spec[0], "description": spec[1]}
        if len(spec) > 2:
            prop["enum"] = list(spec[2])
        properties[name] = prop
    return {"type": "object", "properties": properties, "required": list(required)}


def _plain(name: str, description: str, params: Record) -> Record:
    """A catalog entry in the plain shape."""
    return {"name": name, "description": description, "parameters": params}


def _openai(name: str, description: str, params: Record) -> Record:
    """A catalog entry in the OpenAI function-tool shape."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


def _mcp(name: str, description: str, params: Record) -> Record:
    """A catalog entry in the MCP ``tools/list`` shape."""
    return {"name": name, "description": description, "inputSchema": params}


_REF = ("string", "Booking reference (6-character PNR, e.g. QX7B2K).")
_ORDER = ("string", "Retail order id: '#W' followed by 7 digits.")

# The alias table: the MCP server's spelling names the same tool as the plain entry.
ALIASES = {"GetWeather": "get_weather"}

CATALOG: list[Record] = [
    _plain(
        "search_flights",
        "Search scheduled flights between two airports or cities on a date. Returns "
        "itineraries with flight numbers, times, stops and fares; it does not book anything.",
        _schema(
            {
                "origin": ("string", "Departure city or IATA airport code."),
                "destination": ("string", "Arrival city or IATA airport code."),
                "date": ("string", "Departure date, YYYY-MM-DD."),
                "return_date": ("string", "Return date for round trips, YYYY-MM-DD."),
                "passengers": ("integer", "Number of travellers."),
                "nonstop_only": ("boolean", "Only list direct flights."),
            },
            ["origin", "destination", "date"],
        ),
    ),
    _plain(
        "book_flight",
        "Book a seat on a specific flight for named passengers and issue an e-ticket. "
        "Usually follows search_flights; charges the stored payment method.",
        _schema(
            {
                "flight_number": ("string", "Flight number, e.g. SY482."),
                "date": ("string", "Departure date, YYYY-MM-DD."),
                "passengers": ("array", "Full names of the travellers."),
                "contact_email": ("string", "Where the e-ticket is sent."),
            },
            ["flight_number", "date", "passengers"],
        ),
    ),
    _plain(
        "get_booking_status",
        "Look up a flight or hotel reservation by booking reference: confirmation and "
        "ticketing state, itinerary, passengers and any schedule change.",
        _schema({"booking_reference": _REF, "last_name": ("string", "Lead traveller.")}, ["booking_reference"]),
    ),
    _plain(
        "cancel_booking",
        "Cancel a flight or hotel reservation by booking reference and report the refund "
        "or travel credit due under the fare rules. Not for retail orders (see cancel_order).",
        _schema(
            {"booking_reference": _REF, "reason": ("string", "Free-text reason, optional.")},
            ["booking_reference"],
        ),
    ),
    _openai(
        "change_seat",
        "Change the seat assignment of a passenger on a booked flight, e.g. to a window, "
        "aisle or exit-row seat, subject to availability.",
        _schema(
            {
                "booking_reference": _REF,
                "flight_number": ("string", "Flight number, e.g. SY482."),
                "seat": ("string", "Seat like 14A, or a preference.", ["window", "aisle", "exit_row", "any"]),
            },
            ["booking_reference", "seat"],
        ),
    ),
    _openai(
        "online_check_in",
        "Check passengers in online between 24 hours and 60 minutes before departure and "
        "return mobile boarding passes.",
        _schema(
            {"booking_reference": _REF, "email": ("string", "Where to send the boarding passes.")},
            ["booking_reference"],
        ),
    ),
    _plain(
        "search_hotels",
        "Find hotels with free rooms in a city for given dates, with price per night, "
        "star rating, distance to the centre and amenities.",
        _schema(
            {
                "city": ("string", "City or neighbourhood."),
                "check_in": ("string", "YYYY-MM-DD."),
                "nights": ("integer", "Number of nights."),
                "guests": ("integer", "Number of guests."),
                "max_price": ("number", "Upper bound per night, in the user's currency."),
            },
            ["city", "check_in"],
        ),
    ),
    _plain(
        "book_hotel",
        "Reserve a room at a specific hotel for given dates and guests; returns a booking "
        "reference. Usually follows search_hotels.",
        _schema(
            {
                "hotel_id": ("string", "Hotel id from search_hotels."),
                "check_in": ("string", "YYYY-MM-DD."),
                "nights": ("integer", "Number of nights."),
                "guest_name": ("string", "Lead guest."),
            },
            ["hotel_id", "check_in", "nights"],
        ),
    ),
    _plain(
        "get_weather",
        "Current conditions and a daily forecast of up to 7 days for a city or airport: "
        "temperature, rain and snow chance, wind.",
        _schema({"location": ("string", "City or IATA code."), "date": ("string", "YYYY-MM-DD, within 7 days.")}, ["location"]),
    ),
    _mcp(
        "GetWeather",
        "Weather for a location, served by the skyline-weather MCP server.",
        _schema({"location": ("string", "City or IATA code.")}, ["location"]),
    ),
    _plain(
        "convert_currency",
        "Convert an amount between two fiat currencies (ISO 4217 codes such as USD, EUR, "
        "JPY) at today's mid-market rate. Cryptocurrencies are not supported.",
        _schema(
            {
                "amount": ("number", "Amount to convert."),
                "from_currency": ("string", "ISO 4217 code."),
                "to_currency": ("string", "ISO 4217 code."),
            },
            ["amount", "from_currency", "to_currency"],
        ),
    ),
    _mcp(
        "get_crypto_price",
        "Current spot price of a cryptocurrency (BTC, ETH, SOL, DOGE, ...) in a fiat "
        "currency, optionally for a given quantity of coins.",
        _schema(
            {
                "symbol": ("string", "Coin ticker, e.g. BTC."),
                "quote_currency": ("string", "Fiat ISO 4217 code, default USD."),
                "quantity": ("number", "Number of coins to value."),
            },
            ["symbol"],
        ),
    ),
    _plain(
        "get_order_status",
        "Look up a retail order by order id: its state (pending, processing, shipped, "
        "delivered, cancelled), items, totals and payment status.",
        _schema({"order_id": _ORDER}, ["order_id"]),
    ),
    _plain(
        "track_package",
        "Live carrier tracking for a shipped package: last scan, current location and "
        "estimated delivery date. Takes an order id or a carrier tracking number.",
        _schema({"order_id": _ORDER, "tracking_number": ("string", "Carrier tracking number.")}),
    ),
    _plain(
        "cancel_order",
        "Cancel a retail order that has not shipped yet; the refund goes to the original "
        "payment method. Not for flight or hotel reservations (see cancel_booking).",
        _schema({"order_id": _ORDER, "reason": ("string", "Free-text reason, optional.")}, ["order_id"]),
    ),
    _plain(
        "return_item",
        "Start a return for refund of delivered items and issue a prepaid return label. "
        "The customer gets money back; to get another size or colour use exchange_item.",
        _schema(
            {
                "order_id": _ORDER,
                "item": ("string", "Product name or SKU."),
                "reason": ("string", "Why.", ["defective", "wrong_item", "no_longer_needed", "other"]),
            },
            ["order_id", "item"],
        ),
    ),
    _openai(
        "exchange_item",
        "Swap a delivered item for another size, colour or variant of the same product, "
        "with no refund. For money back use return_item.",
        _schema(
            {
                "order_id": _ORDER,
                "item": ("string", "Product name or SKU."),
                "new_variant": ("string", "Wanted size, colour or variant."),
            },
            ["order_id", "item", "new_variant"],
        ),
    ),
    _plain(
        "update_address",
        "Change the shipping or billing address on the customer profile, or the delivery "
        "address of an order that has not shipped yet.",
        _schema(
            {
                "address": ("string", "Full postal address."),
                "kind": ("string", "Which address.", ["shipping", "billing"]),
                "order_id": _ORDER,
            },
            ["address"],
        ),
    ),
    _mcp(
        "reset_password",
        "Send a password reset link to the e-mail address on the account.",
        _schema({"email": ("string", "Account e-mail address.")}, ["email"]),
    ),
    _plain(
        "get_invoice",
        "Produce the invoice or receipt (PDF, with VAT breakdown) for a retail order or a "
        "travel booking and e-mail it on request.",
        _schema(
            {
                "order_id": _ORDER,
                "booking_reference": _REF,
                "email": ("string", "Send the PDF here."),
                "company_vat_id": ("string", "For business invoices."),
            }
        ),
    ),
    _openai(
        "translate_text",
        "Translate a short text (up to 500 characters) between languages; detects the "
        "source language when not given.",
        _schema(
            {
                "text": ("string", "Text to translate, up to 500 characters."),
                "target_language": ("string", "Language name or ISO 639-1 code."),
                "source_language": ("string", "Optional."),
            },
            ["text", "target_language"],
        ),
    ),
    _mcp(
        "calculator",
        "Evaluate an arithmetic expression exactly: percentages, splits, sums, powers and roots.",
        _schema({"expression": ("string", "E.g. '17.5% of 2340' or '(1299-250)/3'.")}, ["expression"]),
    ),
    _plain(
        "get_baggage_policy",
        "Checked and carry-on baggage allowance for a fare class and route, with fees for "
        "extra, overweight and special items such as skis or instruments.",
        _schema(
            {
                "fare_class": ("string", "Fare.", ["basic_economy", "economy", "premium_economy", "business"]),
                "origin": ("string", "City or IATA code."),
                "destination": ("string", "City or IATA code."),
            },
            ["fare_class"],
        ),
    ),
    _mcp(
        "get_visa_requirements",
        "Entry and transit visa rules for a destination country given the traveller's "
        "passport: whether a visa or eVisa is needed, allowed stay and required documents.",
        _schema(
            {
                "destination_country": ("string", "Country to enter."),
                "passport_country": ("string", "Nationality of the passport."),
                "purpose": ("string", "Trip purpose.", ["tourism", "business", "transit"]),
            },
            ["destination_country", "passport_country"],
        ),
    ),
    _openai(
        "apply_promo_code",
        "Apply a discount or voucher code to an open retail order or travel booking and "
        "return the new total, or why the code is not valid.",
        _schema(
            {"code": ("string", "Promo code."), "order_id": _ORDER, "booking_reference": _REF},
            ["code"],
        ),
    ),
]

DOC_ONLY_TOOLS = ("get_baggage_policy", "get_visa_requirements", "apply_promo_code")

# ------------------------------------------------------------ query templates


@dataclass(frozen=True)
class Templates:
    """Paraphrase templates of one tool.

    Parameters
    ----------
    train : tuple of str
        Paraphrases used in the experience logs.
    test : tuple of str
        Held-out paraphrases, used only in the test set.
    followup : tuple of str
        Second-step phrasings after another tool (``prev_tool`` set).
    errors : tuple of str
        Requests on which the tool itself errors (logged without gold).
    """

    train: tuple[str, ...]
    test: tuple[str, ...]
    followup: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


TEMPLATES: dict[str, Templates] = {
    "search_flights": Templates(
        train=(
            "find me a flight from {origin} to {dest} on {date}",
            "are there any flights {origin} to {dest} {date}?",
            "I need to fly to {dest} from {origin} around {date}, what's available",
            "show the cheapest flights {origin} -> {dest} for {date}",
            "any nonstop options from {origin} to {dest} on {date}",
            "looking for a return trip {origin}-{dest} leaving {date}",
        ),
        test=(
            "what flights go from {origin} to {dest} on {date}?",
            "can you check availability for flying {origin} to {dest} on {date}",
            "search flights, {origin} to {dest}, departing {date}",
        ),
        errors=("plan a round-the-world itinerary starting in {origin} with five stopovers",),
    ),
    "book_flight": Templates(
        train=(
            "book flight {flight_no} from {origin} to {dest} on {date} for {name}",
            "please reserve a seat on {flight_no} on {date}",
            "I'd like to book the {time} flight to {dest} on {date}",
            "go ahead and book {flight_no} for me, my email is {email}",
        ),
        test=(
            "purchase a ticket on {flight_no} for {name} on {date}",
            "lock in the {time} departure to {dest}",
            "I want to buy the flight to {dest} on {date}, passenger {name}",
        ),
        followup=(
            "great, book the {time} one",
            "ok, reserve the cheapest option for {name}",
            "let's go with {flight_no}, please book it",
            "book the second flight in that list for two adults",
        ),
    ),
    "get_booking_status": Templates(
        train=(
            "what's the status of booking {booking_ref}?",
            "is my reservation {booking_ref} confirmed",
            "can you check booking ref {booking_ref} for {name}",
            "has my flight booking {booking_ref} been ticketed yet",
            "show me the details of reservation {booking_ref}",
        ),
        test=(
            "look up confirmation {booking_ref} please",
            "did my booking {booking_ref} go through?",
            "I never got an email, is {booking_ref} still valid",
        ),
    ),
    "cancel_booking": Templates(
        train=(
            "cancel my reservation {booking_ref}",
            "I need to cancel booking {booking_ref}, plans changed",
            "please cancel the flight I booked for {date}, ref {booking_ref}",
            "how do I cancel my trip {booking_ref} and get a refund",
            "cancel the {dest} booking under {name}",
        ),
        test=(
            "we can't travel anymore, drop reservation {booking_ref}",
            "call off my trip to {dest}, booking {booking_ref}",
            "void booking {booking_ref} please",
        ),
        followup=("ok, cancel it", "yes please cancel that reservation", "cancel it and refund me"),
    ),
    "change_seat": Templates(
        train=(
            "can I move to {seat} on {flight_no}",
            "change my seat on booking {booking_ref} to {seat}",
            "I'd like {seat} instead of a middle seat",
            "switch my seat assignment for {date} to {seat}",
        ),
        test=(
            "swap my seat to {seat} for reservation {booking_ref}",
            "is {seat} free on {flight_no}? move me there",
            "reassign me to {seat} on the flight I booked for {name}",
        ),
        followup=("and give me {seat} on that flight", "can you put me in {seat}"),
        errors=("seat my family of five together on {flight_no}",),
    ),
    "online_check_in": Templates(
        train=(
            "check me in for {flight_no} tomorrow",
            "I want to check in online for booking {booking_ref}",
            "can you do web check-in for {name} on {flight_no}",
            "check me in for {flight_no} and send the boarding pass to {email}",
        ),
        test=(
            "get me my boarding pass for {flight_no}",
            "do the check-in for reservation {booking_ref}",
            "I'd like to check in now for my flight to {dest}",
        ),
        errors=("check me in for {flight_no}, it leaves in 30 minutes",),
    ),
    "search_hotels": Templates(
        train=(
            "find a hotel in {city} for {date}",
            "any hotels near the centre of {city} from {date} for 3 nights",
            "I need a cheap place to stay in {city} on {date}",
            "show me 4-star hotels in {city} with free breakfast",
            "looking for a room in {city} for two adults around {date}",
        ),
        test=(
            "where can I stay in {city} on {date}?",
            "list accommodation options in {city} for a weekend",
            "recommend some hotels in {city} under 150 a night",
        ),
    ),
    "book_hotel": Templates(
        train=(
            "book the {hotel} in {city} for {date}",
            "reserve a double room at {hotel} for 2 nights",
            "please book {hotel} for {name}, check-in {date}",
        ),
        test=(
            "make a reservation at {hotel} in {city} from {date}",
            "secure a room at {hotel} for {name}",
        ),
        followup=("book the first one", "reserve that hotel for 2 nights", "go with the one with breakfast included"),
    ),
    "get_weather": Templates(
        train=(
            "what's the weather in {city} on {date}",
            "will it rain in {city} tomorrow",
            "forecast for {city} this weekend",
            "how hot is it in {city} right now",
            "should I pack an umbrella for {city}",
        ),
        test=(
            "temperature in {city} today?",
            "is it going to snow in {city} on {date}",
            "weather outlook for {city} over the next few days",
        ),
        errors=("what will the weather be in {city} in 3 weeks", "weather in {city} next month"),
    ),
    "convert_currency": Templates(
        train=(
            "convert {amount} {cur} to {cur2}",
            "how much is {amount} {cur} in {cur2}",
            "what's the {cur} to {cur2} exchange rate today",
            "I have {amount} {cur}, what's that in {cur2}",
        ),
        test=(
            "exchange {amount} {cur} into {cur2}, how much do I get",
            "{cur} vs {cur2} rate right now?",
            "what would {amount} {cur} be worth in {cur2}",
        ),
    ),
    "get_crypto_price": Templates(
        train=(
            "what's the price of {coin} right now",
            "current {coin} price in {cur}",
            "how much is {coin} trading at today",
        ),
        test=("quote me {coin} in {cur}", "{coin} spot price?", "how much are 3 {coin} worth in {cur}"),
    ),
    "get_order_status": Templates(
        train=(
            "what's the status of order {order_id}",
            "has my order {order_id} shipped yet",
            "I ordered a {product} last week, order {order_id}, any update?",
            "is order {order_id} still processing",
            "check on my order {order_id} please, you can reach me at {phone}",
        ),
        test=(
            "can you pull up order {order_id}?",
            "status update on my {product} order {order_id}",
            "was my order {order_id} confirmed and paid",
        ),
    ),
    "track_package": Templates(
        train=(
            "where is my package for order {order_id}",
            "track my parcel, tracking number {tracking}",
            "when will my {product} be delivered? order {order_id}",
            "my package hasn't arrived, can you track {order_id}",
            "what's the delivery ETA for {order_id}",
        ),
        test=(
            "where's the courier with my {product} right now",
            "follow shipment {tracking} for me",
            "is my parcel {order_id} out for delivery today",
        ),
        errors=("track shipment {tracking} from a third-party marketplace seller",),
    ),
    "cancel_order": Templates(
        train=(
            "cancel order {order_id}",
            "I want to cancel my {product} order {order_id}",
            "please stop order {order_id} before it ships",
            "I ordered by mistake, cancel {order_id}",
        ),
        test=(
            "I no longer want the {product}, kill order {order_id}",
            "abort my purchase {order_id}",
            "don't ship order {order_id}, cancel it",
        ),
        followup=("ok, cancel it", "cancel that order please", "then please cancel it before it ships"),
        errors=("cancel order {order_id}, it already shipped yesterday",),
    ),
    "return_item": Templates(
        train=(
            "I want to return the {product} from order {order_id}",
            "how do I send back my {product}, it's defective",
            "start a return for order {order_id}, I want a refund",
            "the {product} doesn't fit, I'd like my money back",
            "return label for {order_id} please",
        ),
        test=(
            "refund me for the {product} in {order_id}, I'm sending it back",
            "the {product} arrived broken, I want to return it for a refund",
            "print a return shipping label for my {product}",
        ),
        followup=("I want to return it", "can I send it back for a refund"),
    ),
    "exchange_item": Templates(
        train=(
            "can I exchange my {product} for {size}",
            "swap the {product} from {order_id} for the {colour} one",
            "I need {size} instead, exchange order {order_id}",
            "exchange my {product} for a different colour",
        ),
        test=(
            "trade my {product} for {size}, no refund needed",
            "replace the {product} with the {colour} version",
            "I got the wrong size {product}, switch it for {size}",
        ),
        followup=("can I get it in {size} instead", "swap it for the {colour} one"),
    ),
    "update_address": Templates(
        train=(
            "change my shipping address to {address}",
            "update the delivery address on {order_id} to {address}",
            "I moved, my new address is {address}",
            "please update my billing address to {address}",
        ),
        test=(
            "ship order {order_id} to {address} instead",
            "my address changed, it is now {address}",
            "edit my profile address to {address}",
        ),
    ),
    "reset_password": Templates(
        train=(
            "I forgot my password",
            "reset my password, my login is {email}",
            "can't log in, send me a password reset link",
            "how do I change my password",
            "password reset for {email} please, or call me on {phone}",
        ),
        test=(
            "I can't remember my login password",
            "send a reset link to {email}",
            "help, I'm stuck at the sign-in page and need a new password",
        ),
    ),
    "get_invoice": Templates(
        train=(
            "send me the invoice for order {order_id}",
            "I need a receipt for booking {booking_ref}",
            "can I get a VAT invoice for {order_id} for my company",
            "email the invoice for {order_id} to {email}",
            "download the receipt for my purchase from last week",
        ),
        test=(
            "I need proof of purchase for {order_id} for expenses",
            "where can I find the bill for reservation {booking_ref}",
            "resend my tax invoice to {email}",
        ),
    ),
    "translate_text": Templates(
        train=(
            "translate '{phrase}' into {lang}",
            "how do you say '{phrase}' in {lang}",
            "can you translate this to {lang}: {phrase}",
            "what does '{phrase}' mean in {lang}",
        ),
        test=("render '{phrase}' in {lang} please", "I need '{phrase}' in {lang}", "{lang} translation of: {phrase}"),
    ),
    "calculator": Templates(
        train=("what is {expr}", "calculate {expr}", "quick math: {expr}", "can you work out {expr} for me"),
        test=("compute {expr}", "help me figure out {expr}"),
    ),
    "get_baggage_policy": Templates(
        train=(),
        test=(
            "how many checked bags can I bring on {fare}?",
            "what's the carry-on size limit for {fare} to {dest}",
            "how much does an extra suitcase cost on {fare}",
            "is a 25 kg bag overweight in {fare}?",
            "baggage allowance for {fare} from {origin} to {dest}",
            "can I bring skis as checked luggage on {fare}",
            "what are the fees for an overweight bag flying {fare}",
        ),
    ),
    "get_visa_requirements": Templates(
        train=(),
        test=(
            "do I need a visa to visit {country} with {passport}?",
            "entry requirements for {country} for holders of {passport}",
            "what documents do I need to travel to {country} on {passport}",
            "is an eVisa required for {country} if I hold {passport}",
            "can I transit through {country} without a visa on {passport}",
            "how long can I stay in {country} visa-free with {passport}",
            "visa rules for a business trip to {country}, I have {passport}",
        ),
    ),
    "apply_promo_code": Templates(
        train=(),
        test=(
            "apply code {promo} to my order {order_id}",
            "I have a discount code {promo}, use it on my cart",
            "does promo {promo} work for my booking {booking_ref}",
            "add voucher {promo} to my purchase",
            "redeem coupon {promo} on order {order_id}",
            "my {promo} code wasn't applied at checkout, can you add it",
            "use the promotion code {promo} please",
        ),
    ),
}

# Which wrong tool an agent plausibly calls instead of the right one.
CONFUSIONS: dict[str, tuple[str, ...]] = {
    "cancel_order": ("cancel_booking",),
    "cancel_booking": ("cancel_order",),
    "track_package": ("get_order_status",),
    "get_order_status": ("track_package",),
    "return_item": ("exchange_item",),
    "exchange_item": ("return_item",),
    "search_hotels": ("search_flights",),
    "book_hotel": ("book_flight",),
    "book_flight": ("search_flights",),
    "get_booking_status": ("get_order_status",),
    "change_seat": ("book_flight",),
    "online_check_in": ("get_booking_status",),
    "get_invoice": ("get_order_status", "get_booking_status"),
    "update_address": ("get_order_status",),
    "convert_currency": ("calculator",),
    "calculator": ("convert_currency",),
    "get_crypto_price": ("convert_currency",),
}

# Filler pools: slot -> (training values, held-out test values).
POOLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "city": (
        ("Lisbon", "Denver", "Osaka", "Nairobi", "Toronto", "Madrid", "Singapore", "Chicago",
         "Athens", "Seattle", "Dublin", "Bangkok", "Boston", "Cape Town", "Vienna", "Lima"),
        ("Reykjavik", "Porto", "Auckland", "Marrakesh", "Montreal", "Hanoi", "Prague", "Austin", "Oslo"),
    ),
    "date": (
        ("March 14", "next Friday", "the 22nd", "April 3", "this Saturday", "May 9", "June 1", "2025-10-12"),
        ("July 18", "next Tuesday", "August 30", "the 5th of October", "Sunday", "2025-12-02"),
    ),
    "product": (
        ("running shoes", "wireless earbuds", "denim jacket", "coffee grinder", "yoga mat",
         "hiking backpack", "desk lamp", "rain jacket", "phone case", "water bottle"),
        ("linen shirt", "bluetooth speaker", "cast iron pan", "trail sneakers", "wool scarf", "tablet stand"),
    ),
    "size": (("size 9", "a medium", "a large", "size 42"), ("size 10", "an XL", "a small")),
    "colour": (("black", "navy", "red", "olive"), ("grey", "white", "green")),
    "lang": (("Spanish", "French", "German", "Portuguese", "Japanese"), ("Italian", "Korean", "Dutch", "Polish")),
    "phrase": (
        ("where is the baggage claim", "my suitcase was damaged", "the hotel shuttle leaves at 7",
         "thank you for your patience", "the parcel is at the front desk"),
        ("the gate has changed", "is breakfast included", "please keep the receipt"),
    ),
    "cur": (("USD", "EUR", "GBP", "JPY", "CAD", "AUD"), ("CHF", "MXN", "SEK", "INR")),
    "coin": (("BTC", "ETH", "SOL", "DOGE"), ("LTC", "ADA", "XRP")),
    "seat": (("14A", "22C", "an aisle seat", "a window seat"), ("3F", "an exit row seat", "seat 9D")),
    "expr": (
        ("17.5% of 2,340", "(1299 - 250) / 3", "42 * 19", "the square root of 1764", "2^12"),
        ("a 12% tip on 86.40", "3.5 * 48 + 20", "1,250 split between 7 people"),
    ),
    "name": (
        ("Maria Gonzalez", "Tom Becker", "Aisha Khan", "Kenji Watanabe", "Laura Smith", "David Okafor"),
        ("Elena Petrova", "Sam Carter", "Noor Haddad", "Lucas Moreau"),
    ),
    "address": (
        ("42 Willow Street, Portland", "18 Harbour Road, Dublin", "7 Maple Avenue, Austin", "55 King Street, Leeds"),
        ("310 Cedar Lane, Boise", "9 Quay Street, Galway", "128 Birch Drive, Tampa"),
    ),
    "hotel": (
        ("Harbor View Inn", "Hotel Solmar", "Parkside Suites", "The Grand Alder"),
        ("Riverside Lodge", "Casa Lumen", "Northgate Hotel"),
    ),
    "fare": ((), ("basic economy", "premium economy", "business class", "an economy ticket")),
    "country": ((), ("Japan", "Brazil", "India", "Kenya", "Vietnam", "Turkey")),
    "passport": ((), ("a Canadian passport", "a German passport", "an Indian passport", "a Mexican passport")),
    "promo": ((), ("SPRING25", "WELCOME10", "FLYMORE", "SKYLINE15")),
}

# Slots drawing from another slot's pool (distinct values within one query).
SLOT_POOL = {"origin": "city", "dest": "city", "cur2": "cur"}

_REF_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def _email(rng: random.Random, split: int) -> str:
    first, last = rng.choice(POOLS["name"][split]).lower().split()
    return f"{first}.{last}{rng.randint(10, 99)}@{rng.choice(('example.com', 'mail.example.org'))}"


def _phone(rng: random.Random, _split: int) -> str:
    if rng.random() < 0.5:
        return f"+1 (555) {rng.randint(200, 999)}-{rng.randint(1000, 9999)}"
    return f"+44 20 7946 {rng.randint(1000, 9999)}"


GENERATED: dict[str, Callable[[random.Random, int], str]] = {
    "order_id": lambda rng, _s: f"#W{rng.randint(1000000, 9999999)}",
    "booking_ref": lambda rng, _s: "".join(rng.choice(_REF_CHARS) for _ in range(6)),
    "tracking": lambda rng, _s: "1Z" + "".join(rng.choice(string.digits) for _ in range(14)),
    "flight_no": lambda rng, _s: f"SY{rng.randint(100, 2999)}",
    "amount": lambda rng, _s: str(rng.choice((25, 40, 80, 120, 250, 600, 1000, 1500))),
    "time": lambda rng, _s: f"{rng.randint(6, 21)}:{rng.choice((0, 15, 25, 40, 55)):02d}",
    "email": _email,
    "phone": _phone,
}

TRAIN, TEST = 0, 1


def fill(template: str, split: int, rng: random.Random) -> str:
    """Fill a template's slots from the training or test pools."""
    used: dict[str, list[str]] = {}
    values: dict[str, str] = {}
    for _, slot, _, _ in string.Formatter().parse(template):
        if slot is None or slot in values:
            continue
        if slot in GENERATED:
            values[slot] = GENERATED[slot](rng, split)
            continue
        pool_name = SLOT_POOL.get(slot, slot)
        taken = used.setdefault(pool_name, [])
        value = rng.choice([v for v in POOLS[pool_name][split] if v not in taken])
        taken.append(value)
        values[slot] = value
    return template.format_map(values)


# ---------------------------------------------------------------- experience

# Planted cross-org contradictions: the same phrasings, opposite outcomes.
CRYPTO_QUERIES = (
    "what is 0.25 BTC worth in USD right now",
    "convert 2 ETH to euros",
    "how much is one bitcoin in pounds today",
    "price of 100 SOL in dollars",
    "convert 500 DOGE to EUR",
    "what's 1.5 ETH in Canadian dollars",
)
DOCUMENT_TRANSLATIONS = (
    "translate this passenger complaint into English",
    "translate the attached email from the customer into Spanish",
    "translate the message below from Japanese to English",
    "can you translate this review into French",
    "translate this whole letter into German",
)
LOCKED_ACCOUNT_QUERIES = (
    "my account is locked after too many login attempts",
    "I'm locked out, please unlock my account",
    "it says my account is locked, help me get back in",
    "locked account, can't sign in",
)


@dataclass(frozen=True)
class OrgSpec:
    """How one organisation's log is generated.

    Parameters
    ----------
    org : str
        Organisation id written into each event.
    start : datetime
        Timestamp of the first event.
    weights : dict
        Tool id to relative frequency of single-step requests.
    singles : int
        Number of single-step episodes.
    flows : tuple
        ``(first_tool, second_tool, count)`` two-step episodes.
    wrong_rate : float
        Chance that the agent calls a confusable wrong tool.
    error_rate : float
        Chance that a request is one the tool errors on (where it has such).
    tool_error_rate : dict
        Per-tool chance that an ordinary request errors (no gold logged).
    spelling : dict
        Tool id to the name this org's logs use for it.
    """

    org: str
    start: datetime
    weights: dict[str, int]
    singles: int
    flows: tuple[tuple[str, str, int], ...]
    wrong_rate: float = 0.08
    error_rate: float = 0.05
    tool_error_rate: dict[str, float] = field(default_factory=dict)
    spelling: dict[str, str] = field(default_factory=dict)


def _utc(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, 8, 0, tzinfo=UTC)


ORGS: tuple[OrgSpec, ...] = (
    OrgSpec(
        org="org_a",
        start=_utc(2025, 9, 1),
        weights={
            "search_flights": 14, "get_booking_status": 14, "cancel_booking": 12, "change_seat": 10,
            "online_check_in": 10, "get_weather": 5, "reset_password": 6, "get_invoice": 6,
            "translate_text": 8, "update_address": 3, "calculator": 2,
        },
        singles=150,
        flows=(("search_flights", "book_flight", 14), ("get_booking_status", "cancel_booking", 5),
               ("book_flight", "change_seat", 3)),
        tool_error_rate={"translate_text": 0.45},
    ),
    OrgSpec(
        org="org_b",
        start=_utc(2025, 9, 3),
        weights={
            "get_order_status": 16, "track_package": 16, "cancel_order": 12, "return_item": 12,
            "exchange_item": 10, "update_address": 8, "reset_password": 7, "get_invoice": 8,
            "convert_currency": 4, "calculator": 4, "translate_text": 4,
        },
        singles=165,
        flows=(("get_order_status", "cancel_order", 9), ("get_order_status", "return_item", 6),
               ("track_package", "exchange_item", 4)),
        wrong_rate=0.12,
        error_rate=0.15,
    ),
    OrgSpec(
        org="org_c",
        start=_utc(2025, 9, 2),
        weights={
            "search_flights": 12, "search_hotels": 14, "get_booking_status": 6, "cancel_booking": 8,
            "get_weather": 10, "convert_currency": 8, "get_crypto_price": 4, "translate_text": 6,
            "calculator": 3, "get_invoice": 4,
        },
        singles=125,
        flows=(("search_flights", "book_flight", 10), ("search_hotels", "book_hotel", 12),
               ("get_booking_status", "cancel_booking", 3)),
        wrong_rate=0.1,
        error_rate=0.15,
        spelling={"get_weather": "GetWeather"},
    ),
)

Step = Record  # one event without org/ts
Episode = list[Step]


def _step(query: str, tool: str, success: bool, gold: str | None, prev_tool: str | None = None) -> Step:
    """One event body; ``gold`` and ``prev_tool`` left out when None."""
    step: Step = {"query": query, "tool": tool, "success": success}
    if gold is not None:
        step["gold"] = gold
    if prev_tool is not None:
        step["prev_tool"] = prev_tool
    return step


def _routed(spec: OrgSpec, tool: str, query: str, rng: random.Random, prev: str | None) -> Step:
    """The event for a request whose right tool is ``tool``: success, wrong tool or error."""
    if tool in CONFUSIONS and rng.random() < spec.wrong_rate:
        return _step(query, rng.choice(CONFUSIONS[tool]), False, tool, prev)
    if rng.random() < spec.tool_error_rate.get(tool, 0.0):
        return _step(query, tool, False, None, prev)
    return _step(query, tool, True, tool, prev)


def _single(spec: OrgSpec, rng: random.Random) -> Episode:
    """A one-step request drawn from the org's tool mix."""
    tools = list(spec.weights)
    tool = rng.choices(tools, weights=[spec.weights[t] for t in tools])[0]
    templates = TEMPLATES[tool]
    if templates.errors and rng.random() < spec.error_rate:
        return [_step(fill(rng.choice(templates.errors), TRAIN, rng), tool, False, None)]
    return [_routed(spec, tool, fill(rng.choice(templates.train), TRAIN, rng), rng, None)]


def _flow(spec: OrgSpec, first: str, second: str, rng: random.Random) -> Episode:
    """A two-step request: the first tool's query, then a follow-up for the second."""
    opener = _step(fill(rng.choice(TEMPLATES[first].train), TRAIN, rng), first, True, first)
    phrasing = TEMPLATES[second].followup or TEMPLATES[second].train
    return [opener, _routed(spec, second, fill(rng.choice(phrasing), TRAIN, rng), rng, first)]


def _planted(org: str, rng: random.Random) -> list[Episode]:
    """The episodes that contradict other orgs (see README)."""
    if org == "org_a":
        locked = [[_step(q, "reset_password", True, "reset_password")] for q in LOCKED_ACCOUNT_QUERIES * 2]
        docs = [[_step(q, "translate_text", False, None)] for q in DOCUMENT_TRANSLATIONS * 2]
        return locked + docs
    if org == "org_b":
        crypto = [*CRYPTO_QUERIES, *rng.sample(CRYPTO_QUERIES, 3)]
        return (
            [[_step(q, "convert_currency", True, "convert_currency")] for q in crypto]
            + [[_step(q, "reset_password", False, None)] for q in LOCKED_ACCOUNT_QUERIES]
            + [[_step(q, "translate_text", True, "translate_text")] for q in DOCUMENT_TRANSLATIONS[:3]]
        )
    return [
        [_step(q, "convert_currency", False, "get_crypto_price"),
         _step(q, "get_crypto_price", True, "get_crypto_price", "convert_currency")]
        for q in CRYPTO_QUERIES
    ] + [[_step(q, "translate_text", True, "translate_text")] for q in DOCUMENT_TRANSLATIONS[2:]]


def _respell(step: Step, spelling: dict[str, str]) -> Step:
    """Write tool names as this org's logs spell them."""
    return {k: spelling.get(v, v) if k in ("tool", "gold", "prev_tool") else v for k, v in step.items()}


def build_experience(spec: OrgSpec, rng: random.Random) -> list[Record]:
    """All events of one org, shuffled into episodes and time-stamped in order."""
    episodes = [_single(spec, rng) for _ in range(spec.singles)]
    for first, second, count in spec.flows:
        episodes += [_flow(spec, first, second, rng) for _ in range(count)]
    episodes += _planted(spec.org, rng)
    rng.shuffle(episodes)
    events: list[Record] = []
    clock = spec.start
    for episode in episodes:
        clock += timedelta(minutes=rng.randint(7, 300), seconds=rng.randint(0, 59))
        for i, step in enumerate(episode):
            if i:
                clock += timedelta(minutes=rng.randint(1, 4), seconds=rng.randint(0, 59))
            events.append({**_respell(step, spec.spelling), "org": spec.org, "ts": clock.strftime("%Y-%m-%dT%H:%M:%SZ")})
    return events


# ------------------------------------------------------------------ test set

TEST_PER_TOOL = 5

# Fixed test items whose request fits several tools (or uses an alias spelling).
MULTI_GOLD: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("where is order {order_id} right now, has it left the warehouse?", ("get_order_status", "track_package")),
    ("this {product} order doesn't fit, I want to send it back or get a bigger size", ("return_item", "exchange_item")),
    ("I need the receipt for booking {booking_ref} and to know if it is confirmed", ("get_invoice", "get_booking_status")),
    ("what's 15% of 80 {cur} in {cur2}", ("calculator", "convert_currency")),
    ("will it be cold in {city} when I land, should I pack a coat", ("GetWeather",)),
)


def _test_item(query: str, gold: Sequence[str]) -> Record:
    """A test record; a single gold is written as a string."""
    return {"query": query, "gold": gold[0] if len(gold) == 1 else list(gold)}


def _unseen(templates: Sequence[str], seen: set[str], rng: random.Random) -> str:
    """Fill one of the held-out templates so the query is new to training and test.

    Raises
    ------
    RuntimeError
        If 100 draws give only queries already seen (templates too few).
    """
    for _ in range(100):
        query = fill(rng.choice(templates), TEST, rng)
        if query not in seen:
            seen.add(query)
            return query
    raise RuntimeError(f"no unseen query from {templates!r}")


def build_testset(train_queries: set[str], rng: random.Random) -> list[Record]:
    """Held-out queries: unseen paraphrases per tool, doc-only tools, multi-gold items."""
    seen = set(train_queries)
    items: list[Record] = []
    for tool, templates in TEMPLATES.items():
        if tool in DOC_ONLY_TOOLS:
            items += [_test_item(_unseen([t], seen, rng), [tool]) for t in templates.test]
        else:
            items += [_test_item(_unseen(templates.test, seen, rng), [tool]) for _ in range(TEST_PER_TOOL)]
    items += [_test_item(_unseen([t], seen, rng), gold) for t, gold in MULTI_GOLD]
    rng.shuffle(items)
    return items


# -------------------------------------------------------------------- output


def _jsonl(records: Sequence[Record]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def _rate(events: Sequence[Record], tool: str) -> str:
    """Success rate of calls to ``tool``, as text."""
    calls = [e for e in events if e["tool"] == tool]
    return f"{sum(e['success'] for e in calls)}/{len(calls)}" if calls else "-"


def _org_table(logs: dict[str, list[Record]]) -> str:
    """Markdown rows: per-org counts and failure mix."""
    rows = ["| org | events | failures (wrong tool / tool error) | with prev_tool | top tools |", "|---|---|---|---|---|"]
    for org, events in logs.items():
        wrong = sum(1 for e in events if not e["success"] and "gold" in e)
        errored = sum(1 for e in events if not e["success"] and "gold" not in e)
        chained = sum(1 for e in events if "prev_tool" in e)
        top = ", ".join(t for t, _ in Counter(e["tool"] for e in events).most_common(4))
        rows.append(f"| {org} | {len(events)} | {wrong + errored} ({wrong} / {errored}) | {chained} | {top} |")
    return "\n".join(rows)


def render_readme(logs: dict[str, list[Record]], test: list[Record], seed: int) -> str:
    """The demo folder's README, with this run's counts."""
    doc_only = sum(1 for t in test if t["gold"] in DOC_ONLY_TOOLS)
    multi = sum(1 for t in test if isinstance(t["gold"], list))
    shapes = Counter("openai" if "function" in e else "mcp" if "inputSchema" in e else "plain" for e in CATALOG)
    a, b, c = logs["org_a"], logs["org_b"], logs["org_c"]
    return f"""# Demo dataset: Skyline Travel & Retail

The embedded default dataset of `synapse-flwr`: a fictional company whose LLM
agents handle flights, hotels and an online shop. Everything is synthetic:
names, e-mails (`example.com`), phone numbers (`555`, `7946` ranges), order ids
and booking references are made up, and exist so PII masking has work to do.

Generated by `python simulations/make_demo.py --seed {seed}` (templates and word
lists, no model); rerunning it reproduces these files byte for byte, and
`tests/test_demo_data.py` checks that.

## Files

| file | content |
|---|---|
| `catalog.json` | {len(CATALOG)} entries ({shapes['plain']} plain, {shapes['openai']} OpenAI `function`, {shapes['mcp']} MCP `inputSchema`); `GetWeather` (MCP) is declared an alias of `get_weather`, so {len(CATALOG) - 1} tools |
| `aliases.json` | the alias table: `{{"GetWeather": "get_weather"}}` |
| `org_a.jsonl` | {len(a)} events of an airline support desk |
| `org_b.jsonl` | {len(b)} events of an online retailer |
| `org_c.jsonl` | {len(c)} events of a travel agency |
| `test.jsonl` | {len(test)} held-out queries with `gold` ({multi} with a list of acceptable tools) |

Experience events are `{{query, tool, success, gold?, org, ts, prev_tool?}}`:

{_org_table(logs)}

* Non-IID: each org draws from its own tool mix; `translate_text`, `calculator`,
  `get_invoice`, `reset_password`, `update_address`, `get_weather`,
  `convert_currency` and the flight tools are shared by two or three orgs.
* Failures with `gold`: the agent called a confusable wrong tool
  (`cancel_order`/`cancel_booking`, `track_package`/`get_order_status`,
  `return_item`/`exchange_item`, `search_hotels`/`search_flights`, ...).
  Failures without `gold`: the tool errored (forecast beyond 7 days, check-in
  30 minutes before departure, an already shipped order, ...).
* Multi-step flows carry `prev_tool`: `search_flights -> book_flight`,
  `search_hotels -> book_hotel`, `get_order_status -> cancel_order`,
  `get_order_status -> return_item`, `get_booking_status -> cancel_booking`,
  `book_flight -> change_seat`, `track_package -> exchange_item`.
* org_c's logs spell the weather tool `GetWeather`; it resolves to `get_weather`.

## Test set

Paraphrase templates and slot fillers (cities, products, names, ...) of the test
set never occur in training, and no test query equals a training query.
{doc_only} queries target tools that are in the catalog but in no org's
experience, so only their documentation can route them:
`{'`, `'.join(DOC_ONLY_TOOLS)}`.
One gold is spelled `GetWeather` (the alias).

## Planted contradictions

Identical phrasings with opposite outcomes across orgs:

1. **Crypto prices through `convert_currency`.** org_b logs
   {len(CRYPTO_QUERIES)} crypto-price phrasings ("convert 2 ETH to euros", ...)
   as successes of `convert_currency`; org_c logs the same queries as failures
   with gold `get_crypto_price`, each followed by a successful retry of
   `get_crypto_price` (`prev_tool: convert_currency`). The catalog sides with
   org_c ("Cryptocurrencies are not supported"), and so does `test.jsonl`.
2. **`translate_text` on whole documents.** org_a logs
   {len(DOCUMENT_TRANSLATIONS)} document-translation phrasings ("translate this whole
   letter into German", ...) as tool errors, where org_b and org_c log the
   same phrasings as successes; org_a's agent also errors often on short
   texts. Success of `translate_text` calls:
   org_a {_rate(a, 'translate_text')}, org_b {_rate(b, 'translate_text')}, org_c {_rate(c, 'translate_text')}.
3. **Locked accounts through `reset_password`.** org_a logs
   {len(LOCKED_ACCOUNT_QUERIES)} locked-account phrasings ("I'm locked out, please
   unlock my account", ...) as successes of `reset_password`; org_b logs them
   as tool errors (no gold).
"""


def build(seed: int) -> dict[str, str]:
    """File name to content of the whole demo dataset."""
    rng = random.Random(seed)
    logs = {spec.org: build_experience(spec, rng) for spec in ORGS}
    train_queries = {e["query"] for events in logs.values() for e in events}
    test = build_testset(train_queries, rng)
    files = {"catalog.json": json.dumps(CATALOG, indent=2, ensure_ascii=False) + "\n"}
    files["aliases.json"] = json.dumps(ALIASES, indent=2) + "\n"
    files.update({f"{org}.jsonl": _jsonl(events) for org, events in logs.items()})
    files["test.jsonl"] = _jsonl(test)
    files["README.md"] = render_readme(logs, test, seed)
    return files


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: write the demo dataset into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, content in build(args.seed).items():
        (args.out / name).write_text(content, encoding="utf-8")
        log.info("wrote %s (%d bytes)", args.out / name, len(content.encode("utf-8")))


if __name__ == "__main__":
    main()
