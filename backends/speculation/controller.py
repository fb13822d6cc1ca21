"""The adaptive draft policy: which drafter and how many tokens, round by round.

Speculation pays only when accepted tokens cost less than plain ones, and that
depends on the machine. On a compute-bound CPU a verify of n tokens costs nearly n
single steps, so short drafts cannot win and a draft model that costs 2/3 of a
target step loses outright; on a GPU a verify of a few tokens costs about one step
and the same draft model wins. So the controller measures instead of assuming:

- a :class:`CostModel` (backends/speculation/cost_model.py): the time of a target forward of n
  tokens (measured at load for a few n, interpolated, refined by every round) and of
  one draft-model step;
- acceptance per drafter and per draft position (exponentially smoothed, so recent
  text weighs more; backends/speculation/acceptance.py);

and before each round picks the drafter and K that maximise expected tokens per
second, ``E[tokens | K] / (verify(K + 1) + draft(K))``, with K = 0 (plain decoding)
as the baseline it must beat. A draft model whose cache lags the context (a new
prompt, or rounds it sat out) is charged for reading what it missed, spread over the
reply still to come. With ``exact`` K stays below the largest
verify batch that calibration found bit-identical to one-token decoding, so greedy
output equals plain decoding exactly, not just up to rounding. The n-gram drafter is
also *shadowed* while it is not used: its proposal is compared with what plain
decoding then wrote, which costs nothing, so speed comes back when the text turns
repetitive (backends/speculation/ngram_shadow.py). Draft-model rounds stop early where
the draft's confidence in its next token falls below a floor learned from what the
target accepted (:class:`ConfidenceFloor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from backends.sampling.filters import SamplingParams
from backends.speculation.acceptance import PRIOR_ACCEPTANCE, AcceptanceEstimate, ConfidenceFloor
from backends.speculation.chained_drafter import ChainedDrafter
from backends.speculation.cost_model import CostModel
from backends.speculation.draft_lengths import best_chain_length, best_length
from backends.speculation.draft_policy import RoundOutcome, RoundPlan
from backends.speculation.drafter_costs import (
    DraftCost,
    break_even_acceptance,
    draft_cost,
    is_head,
    longest_draft,
)
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.ngram_shadow import NgramShadow
from backends.speculation.proposal import Drafter
from backends.speculation.tree_round import tree_room
from backends.token_prefix import common_prefix_length

DEFAULT_MAX_DRAFT = 16
MIN_PAYING_SPEEDUP = 1.02  # choose speculation only when it is expected to pay this much
MODEL_PROBE_INTERVAL = 64  # rounds without the draft model before trying it again
MODEL_PROBE_LENGTH = 2
MODEL_PROBE_MAX_CATCH_UP = 8  # a probe may cost at most this many plain steps of catch-up
PLAIN_CHECK_REASON = "timing a one-token step: auto checks the figures it decides with"
# A draft model that sat out (or a new prompt) must first read what it has not seen.
# That is paid once and then serves every later round, so the choice spreads it over
# about this many tokens of the reply still to come.
CATCH_UP_HORIZON_TOKENS = 128


@dataclass(frozen=True)
class Decision:
    """What the controller chose and why, for the UI and the API."""

    drafter: str
    draft_tokens: int
    estimated_speedup: float
    reason: str


class AdaptiveDraftPolicy:
    """Chooses drafter and K per round from measured costs and running acceptance."""

    # The first round never waits for a drafter to read the prompt (draft_policy.py's
    # FirstRound): the first token is the target's own, and later rounds charge the
    # reading to the choice that needs it.
    FIRST_TOKEN_NEVER_WAITS = True
    # It learns acceptance and costs from every round.
    LEARNS = True

    def __init__(
        self,
        drafters: Sequence[Drafter],
        costs: CostModel,
        *,
        max_draft_tokens: int = DEFAULT_MAX_DRAFT,
        params: SamplingParams | None = None,
        acceptance: dict[str, AcceptanceEstimate] | None = None,
        confidence_floor: ConfidenceFloor | None = None,
        exact: bool = False,
        rollback_limit: int | None = None,
        head_floors: dict[str, ConfidenceFloor] | None = None,
        max_reply_tokens: int | None = None,
    ) -> None:
        self.drafters = {drafter.name: drafter for drafter in drafters}
        self.costs = costs
        # Exact output: verify only in batches this machine computes bit for bit like
        # one-token decoding, so greedy output equals plain decoding exactly.
        self.max_draft_tokens = max_draft_tokens
        # The loop keeps the grammar's forced tokens within the same batches.
        self.exact_batch_limit = costs.exact_batch_limit if exact else None
        if self.exact_batch_limit is not None:
            self.max_draft_tokens = min(max_draft_tokens, self.exact_batch_limit - 1)
        # A target with a recurrent state rolls back for free only as deep as its
        # snapshots reach (backends/base.py rollback_limit): never draft deeper.
        if rollback_limit is not None:
            self.max_draft_tokens = min(self.max_draft_tokens, rollback_limit)
        self.params = params or SamplingParams()
        # Shared across generations when the caller passes its own dict: what was
        # learned about this conversation carries over to the next reply.
        self.acceptance = acceptance if acceptance is not None else {}
        self._rounds_without_model = 0
        # The draft model and each draft head (MTP, EAGLE-3) through a view whose
        # confidence floor this policy learns; a head's confidence means otherwise than
        # the model's, so each keeps a floor of its own, shared across generations like
        # ``acceptance`` where the caller passes them.
        self.confidence_floor = (
            confidence_floor if confidence_floor is not None else ConfidenceFloor()
        )
        self.floors: dict[str, ConfidenceFloor] = {"model": self.confidence_floor}
        self._floored: dict[str, Drafter] = {}
        for name, drafter in self.drafters.items():
            view = getattr(drafter, "with_confidence_floor", None)
            if view is None:
                continue
            self._floored[name] = view()
            if name != "model":
                floor = (head_floors or {}).get(name)
                self.floors[name] = floor if floor is not None else ConfidenceFloor()
        # Chains of the n-gram's match and a head (chained_drafter.py), priced beside
        # the match they extend.
        self._chains = {
            name: drafter
            for name, drafter in self.drafters.items()
            if isinstance(drafter, ChainedDrafter)
        }
        self.decision = Decision("none", 0, 1.0, "not started")
        self._model_can_pay_at = -1  # the costs' version _model_could_pay was worked out at
        self._model_could_pay = False
        self._round_key = ""  # the acceptance estimate the current round draws on
        self._shadow = NgramShadow()
        self._corrections_before = 0  # the costs' corrections made before this reply
        self._note_made, self._note = 0, ""  # _costs_note's, as of that many corrections
        # The reply's max_tokens (None: unbounded): a catch-up is spread over no more
        # tokens than the reply may still write (``_catch_up_tokens``).
        self.max_reply_tokens = max_reply_tokens
        self._prompt_length = 0
        self._catch_up_horizon = CATCH_UP_HORIZON_TOKENS

    # -- DraftPolicy ---------------------------------------------------------

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """A new generation: reset drafters; keep what was learned about the text."""
        for drafter in self.drafters.values():
            drafter.begin(prompt_tokens)
        self._shadow.reset()
        self._corrections_before = self._note_made = len(self.costs.corrections)
        self._note = ""
        self._prompt_length = len(prompt_tokens)

    def plan(self, context: Sequence[int]) -> RoundPlan:
        """Pick the drafter and K with the best expected tokens per second.

        Runs before every round, so on a GPU its cost is paid on top of each step:
        what depends only on the costs (the verify times for each K, whether the draft
        model could pay at all) is derived once per observation, not per drafter.
        """
        self._shadow.score(context, self._estimate)
        verify = self.costs.verify_table(self.max_draft_tokens + 1)
        plain_seconds = verify[1]
        plain_rate = 1.0 / plain_seconds
        best: Decision | None = None  # None: plain decoding, its reason said below
        best_rate = plain_rate * MIN_PAYING_SPEEDUP
        best_key = ""
        catch_up_reason = ""
        # What the draft model has not read yet: counted once, used by both choices below.
        missed = self._catch_up_tokens(context)
        catch_up_seconds = self._catch_up_seconds(missed)
        ngram_key: str | None = None
        free = 0  # the n-gram match's tokens, where it has one
        for name in self.drafters:
            if name in self._chains:
                continue  # priced below, beside the match it extends
            key = self._estimate_key(name, context)
            if key is None:
                continue
            longest = longest_draft(self.drafters[name], self.max_draft_tokens)
            if name == "ngram":
                # A match drafts no further than its continuation reaches.
                ngram_key, free = key, self._match_length(context)
                longest = min(longest, free)
            catch_up = catch_up_seconds if name == "model" else 0.0
            draft_tokens, rate = self._best_length(name, key, verify, catch_up, longest)
            if (
                catch_up > 0
                and best is None
                and rate <= best_rate
                and self._best_length(name, key, verify)[1] > best_rate
            ):
                # Say why when the catch-up alone keeps the draft model out.
                catch_up_reason = (
                    f"speculation off: the draft model would first have to read "
                    f"{missed} tokens it missed"
                )
            if draft_tokens > 0 and rate > best_rate:
                best_rate, best_key = rate, key
                best = _decision(name, draft_tokens, rate / plain_rate)
        for name, chain in self._chains.items() if ngram_key is not None else ():
            assert ngram_key is not None
            head = chain.head.name
            draft_tokens, rate = best_chain_length(
                self._estimate(ngram_key),
                self._estimate(head),
                free,
                verify,
                self._draft_cost(head),
                longest_draft(chain.head, self.max_draft_tokens - free) + free,
            )
            if draft_tokens > 0 and rate > best_rate:
                best_rate, best_key = rate, ngram_key
                best = _decision(name, draft_tokens, rate / plain_rate)
        if best is not None and best.drafter == "model":
            self._rounds_without_model = 0
        else:
            self._rounds_without_model += 1
            if (
                self._rounds_without_model >= MODEL_PROBE_INTERVAL
                and self._model_can_pay()
                and catch_up_seconds < MODEL_PROBE_MAX_CATCH_UP * plain_seconds
            ):
                # Acceptance may have changed since the model was last tried.
                self._rounds_without_model = 0
                probe_length = min(MODEL_PROBE_LENGTH, self.max_draft_tokens)
                best = Decision("model", probe_length, 1.0, "probing the draft model")
                best_key = "model"
        if best is not None and self.costs.take_plain_check():
            # The stored figures are only as good as the machine was quiet when they were
            # taken: a plain round now and then times what drafting is weighed against.
            best, best_key = Decision("none", 0, 1.0, PLAIN_CHECK_REASON), ""
        if best is None:
            best = Decision("none", 0, 1.0, catch_up_reason or self._plain_reason())
        self.decision = best
        self._round_key = best_key
        note = self._costs_note()
        if best.drafter == "none":
            self._shadow.start(self.drafters.get("ngram"), context, self.max_draft_tokens)
            return RoundPlan(None, 0, 1.0, best.reason, note)
        drafter = self.drafters[best.drafter]
        reason = best.reason
        floored = self._floored.get(best.drafter)
        if floored is not None:
            floor = self.floors[best.drafter].floor(
                break_even_acceptance(self.costs, best.draft_tokens, self._draft_cost(best.drafter))
            )
            floored.min_confidence = floor  # type: ignore[attr-defined]
            drafter = floored
            if floor > 0:
                reason += f", stops below p {floor:.1f}"
        # Other continuations in the same batch, where a larger batch is cheap (n-gram
        # drafts only: they are one-hot, tree_round.py).
        tree_nodes = 0
        if best.drafter == "ngram":
            tree_nodes = tree_room(self.costs, best.draft_tokens, self.exact_batch_limit)
        return RoundPlan(
            drafter, best.draft_tokens, best.estimated_speedup, reason, note, tree_nodes
        )

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn acceptance and costs from a finished round."""
        # Grammar-forced tokens ride in the same batch and cost like any other.
        batch = outcome.drafted + outcome.other_verified + 1
        self.costs.observe_verify(batch, outcome.verify_seconds)
        if not (outcome.drafted and outcome.drafter == self.decision.drafter and self._round_key):
            return
        chain = self._chains.get(outcome.drafter)
        if chain is not None:
            self._observe_chain(chain, outcome)
            return
        self._estimate(self._round_key).observe(outcome.drafted, outcome.accepted)
        self._observe_step(outcome.drafter, outcome.draft_step_seconds)
        floor = self.floors.get(outcome.drafter)
        if floor is not None and outcome.draft_confidences:
            floor.observe(outcome.draft_confidences, outcome.accepted)

    def _observe_chain(self, chain: ChainedDrafter, outcome: RoundOutcome) -> None:
        """Credit a chain's round to its parts: the match's positions to the n-gram's
        estimate, the head's (reached only past a wholly accepted match) to the head's."""
        free = min(chain.last_free_tokens, outcome.drafted)
        self._estimate(self._round_key).observe(free, min(outcome.accepted, free))
        if outcome.accepted >= free and outcome.drafted > free:
            head = chain.head.name
            self._estimate(head).observe(outcome.drafted - free, outcome.accepted - free)
        self._observe_step(chain.head.name, outcome.draft_step_seconds)

    def _observe_step(self, name: str, seconds: float | None) -> None:
        """A draft step's time, where the drafter ``name`` runs a model for one."""
        if seconds is None:
            return
        if name == "model":
            self.costs.observe_draft_step(seconds)
        elif is_head(self.drafters.get(name)):
            self.costs.observe_head_step(name, seconds)

    # -- internals -------------------------------------------------------------

    def _costs_note(self) -> str:
        """The figures corrected during this reply, in words (worked out again only
        when another correction is made)."""
        made = len(self.costs.corrections)
        if made != self._note_made:
            self._note_made = made
            self._note = self.costs.audit.since(self._corrections_before)
        return self._note

    def _estimate(self, key: str) -> AcceptanceEstimate:
        if key not in self.acceptance:
            self.acceptance[key] = AcceptanceEstimate(PRIOR_ACCEPTANCE.get(key, 0.5))
        return self.acceptance[key]

    def _estimate_key(self, name: str, context: Sequence[int]) -> str | None:
        """Which acceptance estimate applies to this drafter now (None: it has nothing)."""
        drafter = self.drafters[name]
        if isinstance(drafter, NgramDrafter):
            _, size = drafter.lookup(context, 1)
            if size < drafter.min_match:
                return None
            return drafter.last_match_key
        return name

    def _match_length(self, context: Sequence[int]) -> int:
        """How many tokens the n-gram drafter's match offers here (its lookups are
        remembered for the round, so asking again costs nothing)."""
        lookup = getattr(self.drafters["ngram"], "lookup", None)
        return (
            self.max_draft_tokens
            if lookup is None
            else len(lookup(context, self.max_draft_tokens)[0])
        )

    def _best_length(
        self,
        name: str,
        key: str,
        verify: Sequence[float],
        catch_up_seconds: float = 0.0,
        longest: int | None = None,
    ) -> tuple[int, float]:
        """The K with the best expected tokens per second, and that rate
        (draft_lengths.py); ``catch_up_seconds`` (the draft model reading context it
        missed) is spread over the horizon it serves."""
        return best_length(
            self._estimate(key),
            verify,
            self._draft_cost(name),
            self.max_draft_tokens if longest is None else longest,
            catch_up_seconds / self._catch_up_horizon,
        )

    def _draft_cost(self, name: str) -> DraftCost:
        """What drafting with ``name`` costs on the current figures (drafter_costs.py)."""
        return draft_cost(name, self.drafters[name], self.costs)

    def _catch_up_seconds(self, missing: int) -> float:
        """Estimated time for the idle draft model to evaluate what it has not seen.

        While the draft model sits out, its cache falls behind; the next round that uses
        it first pays for evaluating the missing tokens (in batches, so at the target's
        batch efficiency).
        ``missing`` comes from :meth:`_catch_up_tokens`.
        """
        if missing == 0:
            return 0.0
        batch_efficiency = self.costs.verify(16) / (16 * self.costs.verify(1))
        step = self.costs.draft_step_seconds or self.costs.verify(1)
        return missing * step * batch_efficiency

    def _catch_up_tokens(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` the draft model has not read, beyond the pending one.

        The pending token is read by every round's first draft step, so it is no catch-up.
        Also sets the horizon the reading is spread over for this plan: the reply's
        tokens still to come, at most CATCH_UP_HORIZON_TOKENS (a title request of a
        few dozen tokens cannot earn back reading an agent's prompt).
        """
        self._catch_up_horizon = CATCH_UP_HORIZON_TOKENS
        if self.max_reply_tokens is not None:
            left = self.max_reply_tokens - (len(context) - self._prompt_length)
            self._catch_up_horizon = max(1, min(CATCH_UP_HORIZON_TOKENS, left))
        drafter = self.drafters.get("model")
        model = getattr(drafter, "model", None)
        if model is None:
            return 0
        return max(0, len(context) - 1 - common_prefix_length(model.cached_tokens, context))

    def _model_can_pay(self) -> bool:
        """Would the draft model pay here even if every draft token were accepted?

        It depends on the costs alone: worked out again only after they change.
        """
        if "model" not in self.drafters or self.max_draft_tokens < 1:
            return False
        if self._model_can_pay_at == self.costs.version:
            return self._model_could_pay
        step = self.costs.draft_step_seconds or 0.0
        verify = self.costs.verify_table(self.max_draft_tokens + 1)
        always_right = max(
            (k + 1) / (verify[k + 1] + k * step) for k in range(1, self.max_draft_tokens + 1)
        )
        self._model_could_pay = always_right * verify[1] > MIN_PAYING_SPEEDUP
        self._model_can_pay_at = self.costs.version
        return self._model_could_pay

    def _plain_reason(self) -> str:
        if self.max_draft_tokens < 1:
            return (
                "speculation off: no verify batch rounds like one-token decoding with "
                "these kernels (load with exact_output = true, or turn exact off)"
            )
        if "model" in self.drafters and not self._model_can_pay():
            return "speculation off: draft model too slow on this machine"
        return "speculation off: drafts not accepted often enough to pay here"


# The n-gram drafter ignores randomness; the controller never samples with this.
_NO_RANDOMNESS = np.random.default_rng(0)


def _decision(name: str, draft_tokens: int, speedup: float) -> Decision:
    """A choice to draft with ``name``, K tokens, expected ``speedup`` over plain."""
    return Decision(
        name, draft_tokens, speedup, f"{name}: {speedup:.2f}x expected at K={draft_tokens}"
    )
