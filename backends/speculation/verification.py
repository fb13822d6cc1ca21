"""One round's verification: which drafts the target accepts, and the token after them.

Greedy: a draft is accepted where it is the argmax of the target's (penalised, masked)
row. Sampling: each draft is accepted with probability min(1, p/q), the first
rejection replaced by a draw from the residual (``backends/speculation/rejection.py``), and a bonus
token drawn from p where every draft passed. Each emitted token moves the grammar and
the penalty counts on, and carries the target's logprobs when they are asked for.

A tree of one-hot drafts (several continuations, ``draft_tree.py``) is judged by
:func:`verify_tree`: at each node the target's own token is drawn (the argmax, or a
sample of its filtered p); where a child holds that token the walk descends into it,
else that token is the correction and the round ends. Each emitted token is the one the
target alone would have drawn there, so the output is exact under greedy decoding and
distributed as the target's under sampling (with one-hot q, accepting x with
probability p(x) and else drawing from the residual is drawing from p itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from backends.base import DraftTree, Model
from backends.generation_events import TokenLogprob
from backends.output.constraints import GrammarState, mask_logits
from backends.sampling.filters import SamplingParams, distribution, greedy_token
from backends.sampling.penalties import TokenCounts
from backends.sampling.row_scans import log_normaliser, top_ids
from backends.sampling.rows import LogitRows
from backends.sampling.sparse_distribution import SparseDistribution
from backends.speculation.proposal import DraftProposal
from backends.speculation.rejection import verify_draft_token
from backends.speculation.round_sampling import RoundSampling


class VerifiedRound(NamedTuple):
    """What the target made of a round's drafts."""

    # The accepted drafts, then the correction or bonus token (none after an
    # end-of-generation token among the drafts).
    emitted: list[int]
    from_draft: list[bool]
    # Aligned with ``emitted`` when logprobs are asked for; else empty.
    logprobs: list[TokenLogprob]
    accepted: int
    # A tree's round: the accepted nodes, from a child of the pending token down.
    path: tuple[int, ...] = ()


def verify_round(
    target: Model,
    rows: LogitRows,
    drafts: Sequence[int],
    proposal: DraftProposal,
    sampling: RoundSampling,
    logprobs: int | None,
) -> VerifiedRound:
    """Judge ``drafts`` against the target's ``rows``: the accepted ones, then one more.

    Greedy: drafts are kept while each is its row's argmax, then the next row's argmax
    follows. Sampling: each is kept with probability min(1, p/q); the first rejected
    one is replaced by a draw from the residual, or where all pass a bonus token is
    drawn from p. Nothing follows an end-of-generation token.
    """
    params, rng = sampling.params, sampling.rng
    constraint, penalties = sampling.constraint, sampling.penalties
    emitted: list[int] = []
    from_draft: list[bool] = []
    # Aligned with ``emitted`` when logprobs are asked for. Each is read before
    # ``_advance``: the grammar's mask is the one in force before the token.
    emitted_logprobs: list[TokenLogprob] = []
    accepted = 0
    hit_end = False
    if sampling.greedy:
        # Only the argmax of each row, and only of rows up to the first mismatch.
        for position, draft_token in enumerate(drafts):
            if _greedy_under(rows, position, constraint, penalties) != draft_token:
                break
            accepted += 1
            emitted.append(draft_token)
            from_draft.append(True)
            if logprobs is not None:
                row = rows.row(position)
                emitted_logprobs.append(
                    _raw_logprob(row, constraint, penalties, draft_token, logprobs)
                )
            _advance(constraint, penalties, draft_token, target)
            if target.is_end_of_generation(draft_token):
                hit_end = True
                break
        if not hit_end:
            emitted.append(_greedy_under(rows, accepted, constraint, penalties))
            from_draft.append(False)
            if logprobs is not None:
                row = rows.row(accepted)
                emitted_logprobs.append(
                    _raw_logprob(row, constraint, penalties, emitted[-1], logprobs)
                )
            _advance(constraint, penalties, emitted[-1], target)
    else:
        replacement: int | None = None
        p: SparseDistribution | None = None
        for position, draft_token in enumerate(drafts):
            p = _target_distribution(rows, position, params, constraint, penalties)
            q = _draft_distribution(proposal, position, draft_token)
            replacement = verify_draft_token(p, q, draft_token, rng)
            if replacement is not None:
                break
            accepted += 1
            emitted.append(draft_token)
            from_draft.append(True)
            if logprobs is not None:
                row = _penalised(rows.row(position), penalties)
                emitted_logprobs.append(_sampled_logprob(p, row, draft_token, logprobs))
            _advance(constraint, penalties, draft_token, target)
            if target.is_end_of_generation(draft_token):
                hit_end = True
                break
        if not hit_end:
            if replacement is None:
                p = _target_distribution(rows, accepted, params, constraint, penalties)
                replacement = p.sample(rng)
            # Else p is still this position's distribution (the rejected draft's):
            # the token emitted here is distributed as p, whichever path chose it.
            emitted.append(replacement)
            from_draft.append(False)
            if logprobs is not None:
                assert p is not None
                row = _penalised(rows.row(accepted), penalties)
                emitted_logprobs.append(_sampled_logprob(p, row, replacement, logprobs))
            _advance(constraint, penalties, replacement, target)
    return VerifiedRound(emitted, from_draft, emitted_logprobs, accepted)


def verify_tree(
    target: Model,
    rows: LogitRows,
    tree: DraftTree,
    sampling: RoundSampling,
    logprobs: int | None,
) -> VerifiedRound:
    """Judge a tree of one-hot drafts against ``rows`` (row 0: the pending token's, row
    ``1 + i``: node i's): the longest path the target's own draws follow, then one more.

    At each node, from the pending token on, the target's token is drawn from its row
    (the argmax when greedy); a child holding it is accepted and the walk goes on from
    there, else the drawn token is the correction (the bonus, at a leaf) and the round
    ends. Nothing follows an end-of-generation token.
    """
    params, rng = sampling.params, sampling.rng
    constraint, penalties = sampling.constraint, sampling.penalties
    emitted: list[int] = []
    emitted_logprobs: list[TokenLogprob] = []
    path: list[int] = []
    node = -1
    while True:
        index = node + 1  # the row of the node the walk stands on
        p: SparseDistribution | None = None
        if sampling.greedy:
            token = _greedy_under(rows, index, constraint, penalties)
        else:
            p = _target_distribution(rows, index, params, constraint, penalties)
            token = p.sample(rng)
        if logprobs is not None:
            if p is None:
                row = rows.row(index)
                emitted_logprobs.append(_raw_logprob(row, constraint, penalties, token, logprobs))
            else:
                row = _penalised(rows.row(index), penalties)
                emitted_logprobs.append(_sampled_logprob(p, row, token, logprobs))
        _advance(constraint, penalties, token, target)
        emitted.append(token)
        child = next((c for c in tree.children(node) if tree.tokens[c] == token), None)
        if child is None or target.is_end_of_generation(token):
            # The correction or bonus; an accepted end-of-generation token ends it too.
            if child is not None:
                path.append(child)
            break
        path.append(child)
        node = child
    from_draft = [True] * len(path) + [False] * (len(emitted) - len(path))
    return VerifiedRound(emitted, from_draft, emitted_logprobs, len(path), tuple(path))


def _draft_distribution(proposal: DraftProposal, position: int, token: int) -> SparseDistribution:
    if proposal.distributions is not None and position < len(proposal.distributions):
        return proposal.distributions[position]
    return SparseDistribution.point(token)


def _penalised(row: np.ndarray, penalties: TokenCounts | None) -> np.ndarray:
    """``row`` with the reply's presence/frequency penalties applied (as it is without)."""
    return row if penalties is None else penalties.apply(row)


def _masked(row: np.ndarray, constraint: GrammarState | None) -> np.ndarray:
    """``row`` with the tokens the grammar refuses here at -inf (as it is without one)."""
    if constraint is None:
        return row
    return mask_logits(row, constraint.allowed())


def _greedy_under(
    rows: LogitRows, index: int, constraint: GrammarState | None, penalties: TokenCounts | None
) -> int:
    """The argmax of the penalised row ``index`` among the tokens the grammar allows here.

    Without penalties the runtime answers the argmax itself (on its device, if it
    has one); the whole row is read only where the reply's penalties change it or the
    grammar refuses that argmax.
    """
    if penalties is None:
        token = rows.greedy(index)
        if constraint is None or constraint.allows(token):
            return token  # the unmasked argmax is allowed, so it is the masked one too
        return greedy_token(_masked(rows.row(index), constraint))
    row = _penalised(rows.row(index), penalties)
    token = greedy_token(row)
    if constraint is None or constraint.allows(token):
        return token
    return greedy_token(_masked(row, constraint))


def _target_distribution(
    rows: LogitRows,
    index: int,
    params: SamplingParams,
    constraint: GrammarState | None,
    penalties: TokenCounts | None,
) -> SparseDistribution:
    """p at row ``index``: the target's row, penalised and masked, then filtered.

    Without penalties or a grammar the runtime filters the row itself; plain and
    speculative decoding both come here, so they sample the same p.
    """
    if penalties is None and constraint is None:
        return rows.distribution(index, params)
    return distribution(_masked(_penalised(rows.row(index), penalties), constraint), params)


def _advance(
    constraint: GrammarState | None, penalties: TokenCounts | None, token: int, target: Model
) -> None:
    """Move the grammar and the penalty counts past an emitted token; an
    end-of-generation token ends the output instead (the grammar allowed it only where
    the output is complete)."""
    if target.is_end_of_generation(token):
        return
    if constraint is not None:
        constraint.consume([token])
    if penalties is not None:
        penalties.add([token])


def _raw_logprob(
    row: np.ndarray,
    constraint: GrammarState | None,
    penalties: TokenCounts | None,
    token: int,
    top_n: int,
) -> TokenLogprob:
    """``token``'s log-softmax in the (penalised, masked) raw row at temperature 1
    (greedy decoding), with exactly ``top_n`` alternatives."""
    penalised = _penalised(row, penalties)
    values = _masked(penalised, constraint)
    log_total = log_normaliser(values)
    logprob = float(values[token]) - log_total
    alternatives = [
        (int(index), float(values[index]) - log_total)
        for index in top_ids(values, top_n)
        if np.isfinite(values[index])  # a token the grammar refuses comes last, below
    ]
    return TokenLogprob(token, logprob, _filled(alternatives, penalised, top_n))


def _sampled_logprob(
    p: SparseDistribution, row: np.ndarray, token: int, top_n: int
) -> TokenLogprob:
    """``token``'s log-probability under ``p``, the distribution the loop sampled from,
    with exactly ``top_n`` alternatives (``row``: p's penalised, unmasked logits)."""
    probability = p.prob_of(token)
    logprob = float(np.log(probability)) if probability > 0.0 else -np.inf
    alternatives = [
        (int(p.ids[index]), float(np.log(p.probs[index])))
        for index in top_ids(p.probs, top_n)
        if p.probs[index] > 0.0
    ]
    return TokenLogprob(token, logprob, _filled(alternatives, row, top_n))


def _filled(
    alternatives: list[tuple[int, float]], row: np.ndarray, top_n: int
) -> tuple[tuple[int, float], ...]:
    """``alternatives`` padded to ``top_n`` entries, as OpenAI always lists N.

    Where the filters or the grammar left fewer possible tokens, the next likeliest
    tokens of ``row`` (the logits before those filters) follow at -inf: they could not
    be chosen here, and the API writes them as -9999.
    """
    wanted = min(top_n, row.shape[0])
    if len(alternatives) >= wanted:
        return tuple(alternatives)
    listed = {token for token, _ in alternatives}
    for index in top_ids(row, wanted + len(listed)):
        if len(alternatives) == wanted:
            break
        if int(index) not in listed:
            alternatives.append((int(index), -np.inf))
    return tuple(alternatives)
