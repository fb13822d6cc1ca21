"""How many tokens to draft: the K with the best expected tokens per second, for one
drafter or for a chain of an n-gram match and a head (the controller's arithmetic).

A round of K drafts brings ``E[tokens | K] = 1 + sum over i<K of P(positions 0..i
accepted)`` tokens and costs ``verify(K + 1)`` plus what its drafts cost
(``drafter_costs.py``: a step per token, or one forward per round); plain decoding
(K = 0) brings one token for ``verify(1)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.speculation.acceptance import AcceptanceEstimate
from backends.speculation.drafter_costs import DraftCost


def best_length(
    estimate: AcceptanceEstimate,
    verify: Sequence[float],
    cost: DraftCost,
    max_tokens: int,
    catch_up_per_token: float = 0.0,
) -> tuple[int, float]:
    """The K (1..``max_tokens``) with the best expected rate, and that rate.

    ``verify`` holds the target's forward time per batch size (index = batch); ``cost``
    what the drafts cost; ``catch_up_per_token`` (a draft model reading context it
    missed) is charged for every token a round brings.
    """
    best_k, best_rate = 0, 0.0
    expected, survive = 1.0, 1.0  # expected tokens per round, built up K by K
    for draft_tokens in range(1, max_tokens + 1):
        survive *= estimate.at(draft_tokens - 1)
        expected += survive
        seconds = (
            verify[draft_tokens + 1]
            + cost.per_round
            + cost.per_token * draft_tokens
            + catch_up_per_token * expected
        )
        rate = expected / seconds
        if rate > best_rate:
            best_k, best_rate = draft_tokens, rate
    return best_k, best_rate


def best_chain_length(
    matched: AcceptanceEstimate,
    headed: AcceptanceEstimate,
    free: int,
    verify: Sequence[float],
    cost: DraftCost,
    max_tokens: int,
) -> tuple[int, float]:
    """The K past an n-gram match of ``free`` tokens with the best expected rate, and
    that rate (0, 0: the match alone fills every round).

    Positions within the match are accepted as ``matched`` says, those after it as
    ``headed`` (the head's own estimate); only the head's part costs (``cost``).
    """
    best_k, best_rate = 0, 0.0
    expected, survive = 1.0, 1.0
    for draft_tokens in range(1, max_tokens + 1):
        position = draft_tokens - 1
        survive *= matched.at(position) if position < free else headed.at(position - free)
        expected += survive
        if draft_tokens <= free:
            continue  # the match alone: the n-gram drafter's own choice
        head = draft_tokens - free
        rate = expected / (verify[draft_tokens + 1] + cost.per_round + cost.per_token * head)
        if rate > best_rate:
            best_k, best_rate = draft_tokens, rate
    return best_k, best_rate
