"""The same backend-conformance tests on every runtime: llama.cpp and MLX.

Real models (marked ``real_model``): the starter pair and SmolLM2, as GGUF files for
llama.cpp and as their MLX conversions (packaging/test.sh converts them once per
machine). The runtime mechanics (forward, rollback, prefill, tokens) are checked on
SmolLM2, which is cheap everywhere; the starter pair carries the pair check and greedy
speculative == plain. MLX runs on the CPU on Linux at ~2 s per token of the 1.5B
target (its Linux wheel uses reference BLAS), so its greedy budget is smaller: one
short prompt, fewer tokens and configurations; the assertions are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from backends.base import ChatMessage, IncrementalDetokenizer, Model
from backends.engine import Engine, GenerationRequest
from backends.errors import IncompatiblePairError
from backends.generation_events import FINISH_STOP, GenerationEvent
from backends.output.reasoning import ReasoningSplit, ReasoningSplitter
from backends.pair_check import check_pair
from backends.speculation.cost_model import CostModel
from tests.support.model_files import DRAFT_KEY, SMOLLM2_KEY, TARGET_KEY
from tests.support.real_runtimes import (
    NEAR_TIE_LOGIT_GAP,
    assert_parts_only_at_a_near_tie,
    generate,
    load_model,
    plain_logits_at,
)
from tests.support.thinking_model import QWEN3_TEMPLATE

pytestmark = pytest.mark.real_model

GREEDY_PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is in three sentences.",
    "Return a JSON object describing a book with title, author, year and tags.",
    "Rewrite this loop as a list comprehension: result = []\nfor x in range(10):\n"
    "    if x % 2 == 0:\n        result.append(x * x)",
    "List five sorting algorithms and their average time complexity.",
)


@dataclass(frozen=True)
class RuntimeBudget:
    """How much greedy decoding a runtime's tests can afford on a 2-core CPU."""

    prompts: tuple[str, ...]
    chat: bool  # apply the chat template (a longer prompt) or send the text raw
    tokens: int
    configurations: tuple[tuple[str, int], ...]  # (drafter, K)


BUDGETS = {
    # Four prompts (prose, code, JSON, a code edit) and every K the drafters differ at:
    # K = 4 verifies inside the calibrated exact batch (7 here), K = 8 past it; K = 1 is
    # a batch of 2 inside it as K = 4's is, and n-gram K = 1 guesses as K = 4 does, one
    # token of it (both left out for the suite's time).
    "llamacpp": RuntimeBudget(
        GREEDY_PROMPTS[:4],
        True,
        128,
        (("model", 4), ("model", 8), ("ngram", 4), ("ngram", 8), ("auto", 0)),
    ),
    # MLX's Linux CPU wheel computes a 1.5B token in ~2.1 s and a batch of n in ~n times
    # that (reference BLAS, no batching gain), and a chat-templated prompt takes over a
    # minute to prefill: one short raw code prompt, 12 tokens, K = 2 and n-gram K = 4.
    "mlx": RuntimeBudget(("def is_prime(n):\n",), False, 12, (("model", 2), ("ngram", 4))),
}


@pytest.fixture(scope="module", params=["llamacpp", "mlx"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def target(runtime: str) -> Iterator[Model]:
    """The starter target with exact kernels: its small verify batches round like plain decoding."""
    model = load_model(runtime, TARGET_KEY, exact_kernels=True)
    yield model
    model.close()


@pytest.fixture(scope="module")
def draft(runtime: str) -> Iterator[Model]:
    model = load_model(runtime, DRAFT_KEY)
    yield model
    model.close()


@pytest.fixture(scope="module")
def target_costs(runtime: str, target: Model, draft: Model) -> CostModel | None:
    """The pair's measured costs and exact batch limit (llama.cpp only).

    Calibrating MLX on this CPU would take minutes; its budget runs no auto.
    """
    return Engine(target, draft).calibrate() if runtime == "llamacpp" else None


@pytest.fixture(scope="module")
def smollm2(runtime: str) -> Iterator[Model]:
    model = load_model(runtime, SMOLLM2_KEY)
    yield model
    model.close()


def assert_stats_invariants(tokens: list[int], events: list[GenerationEvent]) -> None:
    """Counters that must agree with each other and with the tokens produced."""
    stats = events[-1].stats
    assert stats.generated_tokens == len(tokens)
    assert stats.target_passes == stats.rounds
    assert stats.accepted <= stats.drafted
    histogram = stats.accepted_length_histogram
    assert sum(histogram) == stats.speculative_rounds
    assert sum(length * count for length, count in enumerate(histogram)) == stats.accepted
    # Every round adds its accepted drafts plus one target token, the last possibly cut.
    assert stats.generated_tokens <= stats.accepted + stats.rounds
    assert all(event.finish_reason is None for event in events[:-1])
    assert events[-1].finish_reason is not None


def test_forward_then_rollback_then_forward_equals_fresh_evaluation(smollm2: Model):
    prompt = smollm2.tokenize("The quick brown fox jumps over the lazy dog because")
    smollm2.rollback(0)
    smollm2.prefill(prompt)
    smollm2.forward([1234, 5678, 9101])  # a detour that must leave no trace
    smollm2.rollback(len(prompt))
    assert list(smollm2.cached_tokens) == prompt
    after_rollback = smollm2.forward([13, 279, 5562]).copy()

    smollm2.rollback(0)
    smollm2.prefill(prompt)
    fresh = smollm2.forward([13, 279, 5562]).copy()
    smollm2.rollback(0)
    np.testing.assert_array_equal(after_rollback, fresh)


def test_forward_returns_one_float32_row_per_token_and_last_only_returns_one(smollm2: Model):
    smollm2.rollback(0)
    tokens = smollm2.tokenize("one two three four")
    rows = smollm2.forward(tokens).copy()
    assert rows.shape == (len(tokens), smollm2.n_vocab)
    assert rows.dtype == np.float32
    assert list(smollm2.cached_tokens) == tokens
    smollm2.rollback(0)
    last = smollm2.forward(tokens, last_only=True)
    assert last.shape == (1, smollm2.n_vocab)
    assert list(smollm2.cached_tokens) == tokens
    # The last row is the same position either way (prefill + one token vs one batch).
    assert int(np.argmax(last[0])) == int(np.argmax(rows[-1]))
    smollm2.rollback(0)


def test_prefill_fills_the_cache_like_forward_does(smollm2: Model):
    prompt = smollm2.tokenize("def fibonacci(n):")
    smollm2.rollback(0)
    smollm2.prefill(prompt[:-1])
    after_prefill = smollm2.forward(prompt[-1:]).copy()
    smollm2.rollback(0)
    smollm2.forward(prompt[:-1])
    after_forward = smollm2.forward(prompt[-1:]).copy()
    smollm2.rollback(0)
    np.testing.assert_allclose(after_prefill, after_forward, atol=1e-3)


def test_chat_template_comes_from_the_model(smollm2: Model):
    text = smollm2.apply_chat_template([ChatMessage("user", "hi")])
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_the_thinking_switch_reaches_the_template_on_a_real_runtime(
    smollm2: Model, monkeypatch: pytest.MonkeyPatch
):
    # SmolLM2 does not think (no small thinking model is on PyPI); with Qwen3's template
    # in its place, the runtime renders the switch, and its reply, read through the
    # reasoning splitter, is all answer: no tag, nothing lost.
    monkeypatch.setattr(smollm2, "chat_template", QWEN3_TEMPLATE)
    engine = Engine(smollm2)
    question = [ChatMessage("user", "Say hello.")]
    off = engine.chat_prompt_text(question, thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert engine.chat_prompt_text(question).endswith("<|im_start|>assistant\n")
    reasoning = engine.reasoning_format(off)
    assert reasoning is not None and not reasoning.starts_inside
    request = GenerationRequest(
        prompt_tokens=tuple(engine.text_prompt(off)), drafter="none", max_tokens=12
    )
    splitter = ReasoningSplitter(reasoning)
    split = ReasoningSplit()
    events = list(engine.generate(request))
    for event in events:
        split = split + splitter.feed(event.segments, len(event.tokens))
    split = split + splitter.finish()
    assert split.reasoning_text == "" and split.reasoning_tokens == 0
    assert split.answer_text == "".join(event.text for event in events)
    assert split.answer_tokens == events[-1].stats.generated_tokens


def test_end_of_generation_tokens_come_from_the_vocabulary(smollm2: Model):
    im_end = smollm2.tokenize("<|im_end|>", add_special=False)
    assert len(im_end) == 1
    assert smollm2.is_end_of_generation(im_end[0])
    assert not smollm2.is_end_of_generation(smollm2.tokenize("hello", add_special=False)[0])


def test_incremental_detokenizer_never_emits_a_broken_character(smollm2: Model):
    text = "naïve café: 日本語のテキスト 🚀🎉 ok"
    tokens = smollm2.tokenize(text, add_special=False)
    detokenizer = IncrementalDetokenizer(smollm2)
    pieces = [detokenizer.push(token) for token in tokens]
    pieces.append(detokenizer.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    # Some token really did split a character, or the test proves nothing.
    assert any(_is_partial_utf8(smollm2.token_bytes(t)) for t in tokens)


def _is_partial_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_pair_check_accepts_the_starter_pair(target: Model, draft: Model):
    verdict = check_pair(target, draft)
    assert verdict.compatible, verdict.problem


def test_pair_check_refuses_smollm2_as_draft_naming_the_mismatch(target: Model, smollm2: Model):
    verdict = check_pair(target, smollm2)
    assert not verdict.compatible
    assert "BOS differs" in verdict.problem or "vocabulary" in verdict.problem
    with pytest.raises(IncompatiblePairError, match="cannot draft for"):
        Engine(target, smollm2)


def test_stop_string_ends_generation_and_is_not_shown(runtime: str):
    # Exact kernels: the n-gram run's verify batches (K + 1 = 5) round like plain
    # decoding, so its text is plain's, cut at the stop string (the default kernels may
    # flip a near-tie before it: that promise is tested on the starter pair, below).
    model = load_model(runtime, SMOLLM2_KEY, exact_kernels=True)
    try:
        engine = Engine(model)
        prompt = engine.chat_prompt([ChatMessage("user", "Count from one to twenty in words.")])
        plain, events = generate(engine, prompt, "none", 0, 24)
        text = "".join(event.text for event in events)
        stop = text[len(text) // 2 : len(text) // 2 + 4]
        assert stop.strip(), f"no stop string to cut out of {text!r}"
        stopped, stop_events = generate(engine, prompt, "ngram", 4, 24, stop=[stop])
        assert "".join(event.text for event in stop_events) == text[: text.index(stop)]
        assert stop_events[-1].finish_reason == FINISH_STOP
        assert stopped == plain[: len(stopped)]
    finally:
        model.close()


def assert_near_tie(
    runtime: str,
    target: Model,
    prompt: list[int],
    plain: list[int],
    speculative: list[int],
    drafter: str,
    k: int,
) -> str:
    """Where two greedy runs first differ, plain decoding must have been near a tie there."""

    def gap_at(index: int, token: int) -> float:
        row = plain_logits_at(target, prompt + plain[:index])
        return float(row[plain[index]] - row[token])

    label = f"{runtime} {drafter} K={k}"
    shorter = min(len(plain), len(speculative))
    if len(plain) != len(speculative) and plain[:shorter] == speculative[:shorter]:
        # One run wrote an end-of-generation token where the other went on (the token
        # is not in either list): a flip to or from the end token, near a tie as well.
        index = shorter
        row = plain_logits_at(target, prompt + plain[:index])
        ends = [token for token in range(target.n_vocab) if target.is_end_of_generation(token)]
        end_logit = float(np.max(row[ends]))
        went_on = (plain if len(plain) > index else speculative)[index]
        gap = abs(end_logit - float(row[went_on]))
        assert gap < NEAR_TIE_LOGIT_GAP, (
            f"{label} ended apart from plain decoding at token {index} where plain decoding "
            f"was not near a tie between the end token and {went_on} (gap {gap:.3f})"
        )
        return f"{label}: token {index} flipped to or from the end, plain logit gap {gap:.3f}"
    return assert_parts_only_at_a_near_tie(plain, speculative, gap_at, label)


def test_greedy_speculative_output_equals_plain_decoding(
    runtime: str, target: Model, draft: Model, target_costs: CostModel | None
):
    """SD == AR token for token, with the model and n-gram drafters at several K.

    auto, and any fixed K whose verify batches calibration found to round exactly like
    one-token decoding, must match plain decoding exactly. Beyond that, where the two
    diverge, the plain run's logits there must show a near tie between the two tokens
    (and the report says so); anything else fails.
    """
    budget = BUDGETS[runtime]
    engine = Engine(target, draft, costs=target_costs)
    # Verify batches up to this size were measured bit-identical to one-token decoding:
    # rounds that stay within it (auto always does) must reproduce plain decoding exactly.
    exact_limit = (target_costs.exact_batch_limit or 1) if target_costs else 1
    ties: list[str] = []
    for prompt_text in budget.prompts:
        if budget.chat:
            prompt = engine.chat_prompt([ChatMessage("user", prompt_text)])
        else:
            prompt = engine.text_prompt(prompt_text)
        plain, plain_events = generate(engine, prompt, "none", 0, budget.tokens)
        assert len(plain) >= min(16, budget.tokens)
        assert_stats_invariants(plain, plain_events)
        for drafter, k in budget.configurations:
            speculative, events = generate(engine, prompt, drafter, k, budget.tokens)
            assert_stats_invariants(speculative, events)
            if drafter == "model":
                assert events[-1].stats.drafted > 0
            if speculative == plain:
                continue
            assert drafter != "auto" and k + 1 > exact_limit, (
                f"{runtime} {drafter} K={k} differs from plain decoding although its verify "
                f"batches stay within the {exact_limit} tokens measured to round exactly"
            )
            ties.append(assert_near_tie(runtime, target, prompt, plain, speculative, drafter, k))
    if ties:
        print(f"{runtime} near-tie flips (batched vs single-token kernels):", *ties, sep="\n  ")


def long_edit_prompt() -> str:
    """A code-editing request of about 700 tokens: past 512 cache cells, where llama.cpp's
    CPU attention decodes one token differently from a batch unless it is kept from doing so.
    """
    functions = "\n\n".join(
        f"def scale_{index}(values):\n    return [value * {index} for value in values]"
        for index in range(1, 31)
    )
    return f"Add a docstring to every function in this module:\n\n{functions}"


def test_greedy_speculation_equals_plain_decoding_deep_into_a_long_context(
    runtime: str, target: Model, draft: Model, target_costs: CostModel | None
):
    """Past 512 tokens of context, auto and a fixed K within the exact limit still
    reproduce plain decoding token for token."""
    if target_costs is None:
        pytest.skip("MLX on this CPU cannot afford a 700-token prompt")
    exact_limit = target_costs.exact_batch_limit or 1
    # The calibration checks this position too; with llama.cpp's default F16 V cache
    # it finds no exact batch there and exact speculation would be off altogether.
    assert exact_limit > 1, "no verify batch rounds like one-token decoding past 512 tokens"
    engine = Engine(target, draft, costs=target_costs)
    prompt = engine.chat_prompt([ChatMessage("user", long_edit_prompt())])
    assert len(prompt) > 600
    plain, _ = generate(engine, prompt, "none", 0, 48)
    for drafter, k in (("auto", 0), ("ngram", exact_limit - 1)):
        speculative, events = generate(engine, prompt, drafter, k, 48)
        assert speculative == plain, f"{drafter} K={k} differs from plain decoding"
        if drafter == "ngram":
            assert events[-1].stats.drafted > 0  # its rounds really verified batches


def test_with_the_fastest_kernels_greedy_speculation_differs_only_at_near_ties(runtime: str):
    """The default load (exact_output = false): llama.cpp's own kernels, any batch size.

    Speculative greedy output equals plain decoding except where plain decoding's two best
    tokens were within rounding of each other.
    """
    if runtime != "llamacpp":
        pytest.skip("MLX has no kernel choice to make")
    target = load_model(runtime, TARGET_KEY)
    draft = load_model(runtime, DRAFT_KEY)
    try:
        engine = Engine(target, draft)
        engine.calibrate()
        ties: list[str] = []
        for prompt_text in GREEDY_PROMPTS[:3]:
            prompt = engine.chat_prompt([ChatMessage("user", prompt_text)])
            plain, _ = generate(engine, prompt, "none", 0, 96)
            for drafter, k in (("auto", 0), ("ngram", 8)):
                speculative, events = generate(engine, prompt, drafter, k, 96, exact=False)
                assert_stats_invariants(speculative, events)
                if speculative != plain:
                    ties.append(
                        assert_near_tie(runtime, target, prompt, plain, speculative, drafter, k)
                    )
        print("fastest kernels, near-tie flips:", *ties, sep="\n  ")
    finally:
        target.close()
        draft.close()
