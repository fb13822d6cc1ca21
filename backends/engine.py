"""A loaded target (+ optional draft) and the one way to generate with it.

The TUI, the server, ``generate`` and ``bench`` all go through :meth:`Engine.generate`,
which picks a drafter policy for the request and runs the shared speculative loop.
An engine is not thread-safe: one generation at a time (the server queues).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.base import ChatMessage, Model, SavePoint, ToolSpec, rollback_limit
from backends.caches.cache_preparation import cache_preparer, then_save_draft
from backends.caches.conversation_cache import ConversationCache
from backends.caches.disk_prefixes import DiskPrefixes
from backends.caches.draft_history import DraftHistory, HistorySettings
from backends.engine_drafters import EngineDrafters
from backends.generation_events import MAX_TOP_LOGPROBS, GenerationEvent
from backends.output.chat_template import model_chat_template
from backends.output.constraints import GrammarState, GrammarVocabulary, grammar_for
from backends.output.output_constraints import ConstraintSpec
from backends.output.reasoning import ReasoningFormat, reasoning_format, thinking_variables
from backends.output.repeated_calls import RepeatedCallStop
from backends.pair_check import check_pair
from backends.sampling.filters import SamplingParams
from backends.speculation.acceptance import AcceptanceEstimate, ConfidenceFloor
from backends.speculation.calibration import measure_costs
from backends.speculation.chained_drafter import ChainedDrafter
from backends.speculation.controller import AdaptiveDraftPolicy
from backends.speculation.cost_model import CostModel, SharedForwardCosts
from backends.speculation.draft_policy import DraftPolicy, FixedDraftPolicy
from backends.speculation.head_drafters import HeadDrafters
from backends.speculation.history_index import HistoryIndex, capacity_for
from backends.speculation.loop import speculative_generate
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.mtp_drafter import MtpDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.prediction_drafter import PredictionDrafter
from backends.speculation.proposal import Drafter
from backends.speculation.reply_spec import LoopHooks, ReplySpec
from backends.speculation.text_lookup import TextLookup

DRAFTER_CHOICES = ("auto", "model", "mtp", "eagle3", "dflash", "dspark", "ngram", "none")


@dataclass(frozen=True)
class GenerationRequest:
    """Everything one generation needs besides the models."""

    prompt_tokens: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 512
    drafter: str = "auto"
    draft_tokens: int = 4
    stop: tuple[str, ...] = ()
    prediction: str | None = None
    # "auto" keeps verify batches to the sizes this machine computes bit for bit like
    # one-token decoding; False lets it use any size (faster on some machines; greedy
    # output may then differ from plain decoding where two tokens nearly tie).
    exact: bool = False
    # What the reply must look like (response_format, tool_choice): the grammar the
    # loop decodes under, and with parallel tool calls, the stop at a repeated call.
    # None is plain text.
    constraint: ConstraintSpec | None = None
    # None: no log-probabilities. N >= 0: each emitted token's log-probability under
    # the target, with its N most likely alternatives (N <= 20).
    logprobs: int | None = None
    # How a thinking model's chat reply marks its reasoning (None: it has none), so
    # what reads the reply's tool calls in the loop reads the answer only.
    reasoning: ReasoningFormat | None = None
    # Draft the next round during each verify where the target is split over workers
    # (its verify waits on the network); see backends/speculation/overlap.py.
    overlap_drafting: bool = True

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTER_CHOICES:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTER_CHOICES)}")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.draft_tokens < 0:
            raise ValueError("draft_tokens must be >= 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}")


def repeated_call_stop(
    constraint: ConstraintSpec | None, reasoning: ReasoningFormat | None = None
) -> RepeatedCallStop | None:
    """What ends a reply at a repeated tool call, where the request allows several calls.

    With parallel calls off the grammar allows one call and ends the reply after it,
    so there is nothing to repeat.
    """
    calls = constraint.tool_calls if constraint is not None else None
    if calls is None or not calls.parallel:
        return None
    return RepeatedCallStop(calls.syntax, [tool.name for tool in calls.tools], reasoning)


class Engine(EngineDrafters):
    """A target model, an optional draft model that passed the pair check, and the loop.

    With ``conversations`` (a :class:`ConversationCache`) the engine keeps several
    conversations' KV state: a request that continues a kept conversation reads only
    its new tokens, whatever ran in between. With ``prefixes`` (:class:`DiskPrefixes`)
    prompts' prefixes are saved to disk and loaded by later engines. With ``history``
    (:class:`DraftHistory`, over the target's tokenizer) every reply is remembered and
    the n-gram drafter drafts from earlier sessions' replies too.
    """

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        costs: CostModel | None = None,
        conversations: ConversationCache | None = None,
        prefixes: DiskPrefixes | None = None,
        history: DraftHistory | None = None,
        checked: bool = False,
    ) -> None:
        if draft is not None and not checked:
            check_pair(target, draft).raise_if_incompatible(target.name, draft.name)
        self.target = target
        self.draft = draft
        self.costs = costs
        self.conversations = conversations
        self.prefixes = prefixes
        self.history = history
        self._model_drafter = ModelDrafter(draft) if draft is not None else None
        # The target's own multi-token-prediction head, where its file and runtime have one.
        own_head = getattr(target, "mtp_head", None)
        head = own_head() if own_head is not None else None
        self._mtp_drafter = MtpDrafter(target, head) if head is not None else None
        self._file_heads = HeadDrafters(target)  # EAGLE-3, DFlash or DSpark: attach_*_head
        self._ngram_drafter = NgramDrafter(
            text=TextLookup(target.token_bytes, _tokens_of(target)),
            history=history.index if history is not None else None,
        )
        self._acceptance: dict[str, AcceptanceEstimate] = {}
        self._confidence_floor = ConfidenceFloor()
        # Each draft head's floor, by its drafter's name (kept across generations).
        self._head_floors: dict[str, ConfidenceFloor] = {}
        self._grammar_vocabulary: GrammarVocabulary | None = None
        # A sequence's engine (see sibling) asks its parent for what they share.
        self._parent: Engine | None = None
        self._close_first: list[Callable[[], None]] = []
        # How many sequences share each forward (a parallel engine's slot; None: one).
        self.sharing: Callable[[], int] | None = None

    def grammar_state(self, constraint: ConstraintSpec | None) -> GrammarState | None:
        """A fresh grammar state for a request's constraint (None when it asks for none).

        The target's vocabulary is read for llguidance once, on the first constrained
        request. Raises :class:`GrammarError` for a schema llguidance refuses.
        """
        grammar = grammar_for(constraint)
        if grammar is None:
            return None
        if self._parent is not None:
            return self._parent.grammar_state(constraint)
        if self._grammar_vocabulary is None:
            self._grammar_vocabulary = GrammarVocabulary(self.target)
        return self._grammar_vocabulary.compile(grammar).start()

    def use_acceptance_memory(
        self,
        memory: dict[str, AcceptanceEstimate],
        confidence_floor: ConfidenceFloor | None = None,
    ) -> None:
        """Make "auto" learn acceptance into ``memory`` (bench: one per compared mode).

        By default one memory serves every generation, so what was learned about a
        conversation carries over to the next reply; so does the draft model's
        confidence floor (a fresh one unless ``confidence_floor`` is given).
        """
        self._acceptance = memory
        self._confidence_floor = (
            confidence_floor if confidence_floor is not None else ConfidenceFloor()
        )
        self._head_floors = {}

    def sibling(self, target: Model, draft: Model | None) -> Engine:
        """An engine over other sequences of this engine's models (a parallel
        context's views), sharing its costs, caches and what "auto" has learned."""
        other = Engine(
            target,
            draft,
            costs=self.costs,
            conversations=self.conversations,
            prefixes=self.prefixes,
            history=self.history,
            checked=True,
        )
        other._parent = self
        other._acceptance = self._acceptance
        other._confidence_floor = self._confidence_floor
        other._head_floors = self._head_floors
        other._file_heads = self._file_heads.for_sequence(target)
        return other

    def on_close(self, close: Callable[[], None]) -> None:
        """Run ``close`` when this engine closes, before its models are freed."""
        self._close_first.append(close)

    def calibrate(self) -> CostModel:
        """Measure forward costs and exactness on this machine (seconds); used by "auto"."""
        self.costs = measure_costs(self.target, self.draft)
        return self.costs

    def chat_prompt(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        *,
        thinking: bool | None = None,
    ) -> list[int]:
        """Token ids for a conversation (and the tools it may call), in the chat template."""
        return self.text_prompt(self.chat_prompt_text(messages, tools, thinking=thinking))

    def chat_prompt_text(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        *,
        thinking: bool | None = None,
    ) -> str:
        """The conversation rendered by the target's chat template, as text.

        ``thinking`` False turns reasoning off through the template's own switch where it
        has one (None: the template's default); see :mod:`backends.output.reasoning`.
        """
        options: dict[str, Any] = {}
        if tools:
            options["tools"] = tools
        variables = thinking_variables(model_chat_template(self.target), thinking)
        if variables:
            options["template_variables"] = variables
        # Without either, the call is the one every runtime (and every fake) has always had.
        return self.target.apply_chat_template(messages, **options)

    def reasoning_format(self, prompt_text: str) -> ReasoningFormat | None:
        """How the reply to ``prompt_text`` marks reasoning (None: this model does not think)."""
        return reasoning_format(model_chat_template(self.target), prompt_text)

    def text_prompt(self, text: str) -> list[int]:
        """Token ids for raw prompt text (BOS added once, where the model wants it)."""
        info = self.target.vocab_info()
        bos_text = self.target.token_text(info.bos_id) if info.add_bos and info.bos_id >= 0 else ""
        add_special = not (bos_text and text.startswith(bos_text))
        return self.target.tokenize(text, add_special=add_special)

    def policy_for(self, request: GenerationRequest) -> DraftPolicy:
        """The drafter policy a request asks for.

        "auto" is the adaptive controller over every drafter available (the caller's
        prediction, n-gram lookup, the draft model) with K up to 16; any other choice
        is that drafter with a fixed K = ``draft_tokens``.
        """
        # A seeded sampled reply is the same reply each time (draws and all) only if
        # its drafts are: rejection sampling draws by them. So it drafts from its own
        # context, not from the history index, whose contents grow with every reply.
        self._ngram_drafter.uses_history = request.params.greedy or request.params.seed is None
        prediction = None
        if request.prediction and request.drafter != "none":
            prediction_tokens = self.target.tokenize(request.prediction, add_special=False)
            prediction = PredictionDrafter(prediction_tokens)
        # A hybrid target's snapshots bound how many drafts a round can undo for free.
        limit = rollback_limit(self.target)
        if request.drafter != "auto":
            draft_tokens = (
                request.draft_tokens if limit is None else min(request.draft_tokens, limit)
            )
            # K as asked; under exact, forced tokens stay within the measured batches.
            measured = self.costs if request.exact else None
            exact_limit = measured.exact_batch_limit if measured is not None else None
            drafter = prediction if prediction is not None else self.drafter_named(request.drafter)
            return FixedDraftPolicy(drafter, draft_tokens, exact_limit)
        costs = self.costs if self.costs is not None else self.calibrate()
        if self.sharing is not None:
            # Decided as one of the sequences whose forwards are batched together.
            costs = SharedForwardCosts(costs, self.sharing)  # type: ignore[assignment]
        drafters: list[Drafter] = [self._ngram_drafter]
        if prediction is not None:
            drafters.insert(0, prediction)
        if self._model_drafter is not None:
            drafters.append(self._model_drafter)
        # The draft heads, each alone and chained behind the n-gram's match.
        for head in self._draft_heads():
            drafters += [head, ChainedDrafter(self._ngram_drafter, head)]
            self._head_floors.setdefault(head.name, ConfidenceFloor())
        return AdaptiveDraftPolicy(
            drafters,
            costs,
            params=request.params,
            acceptance=self._acceptance,
            confidence_floor=self._confidence_floor,
            exact=request.exact,
            rollback_limit=limit,
            head_floors=self._head_floors,
            max_reply_tokens=request.max_tokens,
        )

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        """Run the speculative loop for ``request`` (under its grammar, if it has one).

        With a conversation cache or a prefix cache on disk, the models' caches are
        prepared first: the state left by the last generation is kept if this prompt
        would overwrite it, and the kept or saved state this prompt continues is
        brought back. After the reply the draft's state may be saved to disk.
        """
        reply = ReplySpec(
            request.params,
            request.max_tokens,
            request.stop,
            self.grammar_state(request.constraint),
            request.logprobs,
            repeated_call_stop(request.constraint, request.reasoning),
        )
        hooks = LoopHooks(
            cancel,
            self._cache_preparer(request),
            request.overlap_drafting and self.overlaps(),
        )
        events = speculative_generate(
            self.target, request.prompt_tokens, self.policy_for(request), reply, hooks
        )
        if self.history is not None:
            # The reply is queued for the index when it ends; indexed off this thread.
            events = self.history.remembering(events, request.prompt_tokens)
        draft = self._draft_in_use(request)
        if self.prefixes is None or draft is None:
            return events
        return then_save_draft(events, self.prefixes, draft)

    def overlaps(self) -> bool:
        """Whether the loop may draft the next round during each verify: the target has
        layers on workers (its verify mostly waits on the network), a draft model is
        loaded, and this engine runs one sequence at a time (a parallel engine's slots
        hand every forward to the one runtime thread, which would run the two in turn).
        Not with a head: the target's decode feeds the head, whose own graphs would
        then compute on the verify's thread beside the draft model's."""
        return (
            self.draft is not None
            and self._mtp_drafter is None
            and not self._file_heads
            and self.sharing is None
            and self._parent is None
            and bool(getattr(self.target, "splits_over_workers", False))
        )

    def _draft_in_use(self, request: GenerationRequest) -> Model | None:
        """The draft model, where this request may draft with it (a caller's
        prediction replaces the drafter when one is named)."""
        uses_draft = self.draft is not None and (
            request.drafter == "auto" or (request.drafter == "model" and not request.prediction)
        )
        return self.draft if uses_draft else None

    def _cache_preparer(
        self, request: GenerationRequest
    ) -> Callable[[Sequence[int]], SavePoint | None] | None:
        """What brings kept or saved states back before the loop reads ``request``'s
        prompt, and says where reading it should pause to save the target's state."""
        if self.conversations is None and self.prefixes is None:
            return None
        draft = self._draft_in_use(request)
        roles = [("target", self.target)] + ([("draft", draft)] if draft is not None else [])
        return cache_preparer(self.conversations, self.prefixes, roles)

    def close(self) -> None:
        """Finish writing prefixes and the history index to disk, then free both models
        and the conversations kept for them (a sibling frees nothing: its parent owns it
        all)."""
        if self._parent is not None:
            return
        for close in self._close_first:
            close()
        self._close_first.clear()
        if self.prefixes is not None:
            self.prefixes.close()
        if self.history is not None:
            self.history.close()
        if self.conversations is not None:
            self.conversations.clear()
        self.target.close()
        if self.draft is not None:
            self.draft.close()


def draft_history(settings: HistorySettings, target: Model) -> DraftHistory:
    """The history index for an engine over ``target`` (its tokenizer's earlier
    replies loaded in the background), sized for ``settings.budget_bytes`` of RAM."""
    return DraftHistory(settings, target, HistoryIndex(capacity_for(settings.budget_bytes)))


def _tokens_of(model: Model) -> Callable[[str], list[int]]:
    """``model``'s tokenizer for text inside a reply: no BOS added."""

    def tokenize(text: str) -> list[int]:
        return model.tokenize(text, add_special=False)

    return tokenize
