"""The feedback loop: an organisation replays its traffic with the global compendium.

Each labelled event's query is routed with the current global compendium.
A query routed right teaches nothing new (the event itself already does), so
only misroutes are replayed, as failed calls of the chosen tool with the right
one as gold: next round's artifact says where the shared knowledge still
misroutes (``when_not`` with ``prefer``). A replayed outcome is a call that
never happened, and the builder counts it as one (the chosen tool's calls and
success rate), so it is replayed only onto a tool the global already knows
from experience (it has ``when`` scenarios), whose real calls it corrects.
Onto a tool known only from its documentation (such as every held-out tool)
it would invent a failure record: counterfactual failed calls, a
``low_success`` precaution and a success-prior penalty that push the router
off that tool for every query, its own included. A replayed event derives
from a private record, so replaying doubles what one record contributes:
build with ``BuildConfig(events_per_record=2)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from synapse_flwr.core.experience import Event, event_label
from synapse_flwr.core.router import Router


def replay_events(events: Sequence[Event], router: Router) -> list[Event]:
    """Route every event whose right tool is known; return its misroutes onto experienced tools.

    Parameters
    ----------
    events : sequence of Event
        The organisation's experience.
    router : Router
        Router over the current global compendium.

    Returns
    -------
    list of Event
        One failed call per misrouted event whose chosen tool has ``when``
        scenarios in the global: ``tool`` the router's choice, ``gold`` the
        right tool, ``success`` False.
    """
    labelled = [(e, right) for e in events if (right := event_label(e))]
    routed = router.route_many([e.query for e, _ in labelled])
    experienced = {t for t, entry in router.entries.items() if entry.when}
    return [
        Event(query=e.query, tool=r.tool, success=False, gold=right, org=e.org, ts=e.ts, prev_tool=e.prev_tool)
        for (e, right), r in zip(labelled, routed)
        if r.tool != right and r.tool in experienced
    ]
