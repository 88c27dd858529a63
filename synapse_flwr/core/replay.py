"""The feedback loop: an organisation replays its traffic with the global compendium.

Each labelled event's query is routed with the current global compendium;
the outcome (right or wrong tool, and which tool was right) becomes a new
event, so next round's artifact also says where the shared knowledge still
misroutes (``when_not`` with ``prefer``). A replayed event derives from a
private record, so replaying doubles what one record contributes: build with
``BuildConfig(events_per_record=2)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from synapse_flwr.core.experience import Event, event_label
from synapse_flwr.core.router import Router


def replay_events(events: Sequence[Event], router: Router) -> list[Event]:
    """Route every event whose right tool is known; return the outcomes as events.

    Parameters
    ----------
    events : sequence of Event
        The organisation's experience.
    router : Router
        Router over the current global compendium.
    """
    labelled = [(e, right) for e in events if (right := event_label(e))]
    routed = router.route_many([e.query for e, _ in labelled])
    return [
        Event(query=e.query, tool=r.tool, success=r.tool == right, gold=right, org=e.org,
              ts=e.ts, prev_tool=e.prev_tool)
        for (e, right), r in zip(labelled, routed)
    ]
