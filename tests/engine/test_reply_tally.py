"""What a whole reply's ``draftpen`` field says about its drafters."""

from __future__ import annotations

from app.engine.tally import GenerationTally
from backends.generation_events import GenerationEvent, SpeculativeStats


def round_event(
    drafter: str, drafted: int, accepted: int, finish: str | None = None
) -> GenerationEvent:
    """One round's event, with the running totals it would carry."""
    return GenerationEvent(
        text="x",
        segments=(),
        tokens=(1,),
        from_draft=(False,),
        drafter=drafter,
        draft_length=0,
        stats=SpeculativeStats(drafted=drafted, accepted=accepted),
        finish_reason=finish,
    )


def test_a_whole_reply_says_what_each_drafter_drafted_not_only_the_last_round() -> None:
    tally = GenerationTally()
    # Running totals: the draft model drafts 4 (3 taken), n-grams 5 (5), the draft
    # model 4 more (1), and the reply ends on a plain round.
    for event in (
        round_event("model", 4, 3),
        round_event("ngram", 9, 8),
        round_event("none", 9, 8),
        round_event("model", 13, 9),
        round_event("none", 13, 9, finish="stop"),
    ):
        tally.add(event)
    field = tally.draftpen()
    assert field["drafter"] == "none"  # the latest round's choice, as streamed
    assert field["drafted_by"] == {
        "model": {"drafted": 8, "accepted": 4},
        "ngram": {"drafted": 5, "accepted": 5},
    }
    assert sum(d["drafted"] for d in field["drafted_by"].values()) == field["drafted"]
