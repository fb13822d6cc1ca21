"""Grammar constraints (llguidance) on a model's own vocabulary: masks, rollback, forced tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest

from backends.base import ToolSpec
from backends.output.call_syntax import HERMES, LLAMA3_JSON
from backends.output.constraints import (
    GrammarError,
    GrammarSpec,
    GrammarVocabulary,
    grammar_for,
    mask_logits,
)
from backends.output.output_constraints import ConstraintSpec, JsonOutput, ToolCallOutput
from tests.support.byte_model import EOS as EOS_BYTE_MODEL
from tests.support.byte_model import ScriptedByteModel
from tests.support.fakes import EOS, HashModel
from tests.support.model_files import TARGET_KEY, require_model

# Words of the fake vocabulary: "the" / "an" / "re" repeated, then "ing", then the end.
WORDS_REGEX = "(the|an|re)+ing"


@pytest.fixture(scope="module")
def vocabulary() -> GrammarVocabulary:
    return GrammarVocabulary(HashModel())


def tokens_of(text: str) -> list[int]:
    return HashModel().tokenize(text, add_special=False)


def test_the_mask_allows_exactly_the_tokens_the_grammar_accepts(vocabulary):
    state = vocabulary.compile(GrammarSpec("regex", WORDS_REGEX)).start()
    state.consume(tokens_of("the"))
    allowed = state.allowed()
    one_by_one = np.array([state.valid_prefix([token]) == 1 for token in range(allowed.size)])
    assert allowed.any() and not allowed.all()
    assert np.array_equal(allowed, one_by_one)
    assert not allowed[EOS]  # "the" alone does not match: the end is not allowed yet


def test_the_end_token_is_allowed_only_once_the_output_is_complete(vocabulary):
    state = vocabulary.compile(GrammarSpec("regex", WORDS_REGEX)).start()
    state.consume(tokens_of("anreing"))
    assert state.accepting
    assert state.allowed()[EOS]


def test_rollback_restores_the_mask_of_the_earlier_position(vocabulary):
    state = vocabulary.compile(GrammarSpec("regex", "an(the)+ing|anre")).start()
    state.consume(tokens_of("an"))
    before = state.allowed()
    state.consume(tokens_of("the"))
    assert not np.array_equal(state.allowed(), before)  # "re" is no longer allowed
    state.rollback(len(tokens_of("the")))
    assert np.array_equal(state.allowed(), before)
    assert state.consumed == len(tokens_of("an"))


def test_consuming_a_token_the_grammar_refuses_raises(vocabulary):
    state = vocabulary.compile(GrammarSpec("regex", WORDS_REGEX)).start()
    with pytest.raises(GrammarError):
        state.consume(tokens_of("ing"))


def test_a_single_continuation_is_reported_as_forced_tokens(vocabulary):
    state = vocabulary.compile(GrammarSpec("regex", "theing|thean")).start()
    forced = state.forced()
    assert forced and HashModel().token_text(forced[0]).startswith("the")


def test_masked_logits_keep_allowed_values_and_drop_the_rest():
    logits = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    masked = mask_logits(logits, np.array([True, False, True]))
    assert masked[0] == 1.0 and masked[2] == 3.0 and masked[1] == -np.inf
    assert logits[1] == 2.0  # the runtime's row is left as it was


def test_an_invalid_json_schema_is_a_grammar_error(vocabulary):
    with pytest.raises(GrammarError):
        vocabulary.compile(GrammarSpec.json_schema({"type": "no-such-type"}))


@pytest.mark.real_model
def test_a_json_schema_constrains_the_real_vocabulary_and_forces_its_keys():
    from backends.select import load_model

    model = load_model(require_model(TARGET_KEY), runtime="llamacpp", n_ctx=512)
    try:
        vocabulary = GrammarVocabulary(model)
        schema = {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        }
        state = vocabulary.compile(GrammarSpec.json_schema(schema)).start()
        forced_text = "".join(model.token_text(t) for t in state.forced())
        assert forced_text == '{"name":'
        answer = model.tokenize(json.dumps({"name": "Bo", "age": 3}), add_special=False)
        assert state.valid_prefix(answer) == len(answer)
        state.consume(answer)
        assert state.finished
        allowed = np.flatnonzero(state.allowed())
        assert allowed.size and all(model.is_end_of_generation(int(t)) for t in allowed)
    finally:
        model.close()


# -- grammars from a request's constraint -----------------------------------------------

WEATHER = ToolSpec(
    "get_weather",
    None,
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = ToolSpec("now", None, {"type": "object", "properties": {}})


@pytest.fixture(scope="module")
def byte_vocabulary() -> tuple[ScriptedByteModel, GrammarVocabulary]:
    model = ScriptedByteModel(["unused"])
    return model, GrammarVocabulary(model)


def test_a_required_hermes_call_forces_its_wrapper_and_checks_the_arguments(byte_vocabulary):
    model, vocabulary = byte_vocabulary
    spec = grammar_for(
        ConstraintSpec(tool_calls=ToolCallOutput((WEATHER, CLOCK), HERMES, "required"))
    )
    state = vocabulary.compile(spec).start()
    forced = b"".join(model.token_bytes(token) for token in state.forced())
    assert forced == b'<tool_call>\n{"name": "'
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    tokens = model.tokenize(good, add_special=False)
    assert state.valid_prefix(tokens) == len(tokens)
    missing_city = model.tokenize(
        '<tool_call>\n{"name": "get_weather", "arguments": {}}', add_special=False
    )
    assert state.valid_prefix(missing_city) < len(missing_city)
    unknown = model.tokenize('<tool_call>\n{"name": "get_time"', add_special=False)
    assert state.valid_prefix(unknown) < len(unknown)


def test_parallel_calls_off_allows_one_call_only(byte_vocabulary):
    model, vocabulary = byte_vocabulary
    output = ToolCallOutput((CLOCK,), HERMES, "required", parallel=False)
    state = vocabulary.compile(grammar_for(ConstraintSpec(tool_calls=output))).start()
    state.consume(
        model.tokenize(
            '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>', add_special=False
        )
    )
    # The end, or a newline and then the end: nothing else.
    allowed = set(np.flatnonzero(state.allowed()))
    assert allowed == {EOS_BYTE_MODEL, *model.tokenize("\n", add_special=False)}


def test_a_newline_after_the_last_required_call_may_end_the_reply(byte_vocabulary):
    # Qwen2.5 closes a call with the one token ">\n" meaning to end; were that newline
    # only a separator, the grammar would force another call after it (issue 41).
    model, vocabulary = byte_vocabulary
    call = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n'
    for parallel in (True, False):
        output = ToolCallOutput((CLOCK,), HERMES, "required", parallel=parallel)
        state = vocabulary.compile(grammar_for(ConstraintSpec(tool_calls=output))).start()
        state.consume(model.tokenize(call, add_special=False))
        assert state.accepting and state.allowed()[EOS_BYTE_MODEL], parallel
        another = model.tokenize("<tool_call>", add_special=False)
        assert (state.valid_prefix(another) == len(another)) is parallel


@pytest.mark.parametrize(
    "call",
    [
        'Let me check.\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
        '{{"name": "now", "arguments": {}}}',
        '{"name": "now", "arguments": {}}',
    ],
)
def test_auto_with_parallel_calls_off_ends_the_reply_after_its_one_call(byte_vocabulary, call):
    model, vocabulary = byte_vocabulary
    output = ToolCallOutput((WEATHER, CLOCK), HERMES, "auto", parallel=False)
    state = vocabulary.compile(grammar_for(ConstraintSpec(tool_calls=output))).start()
    tokens = model.tokenize(call, add_special=False)
    assert state.valid_prefix(tokens) == len(tokens)
    state.consume(tokens)
    assert state.accepting
    for more in ('\n<tool_call>\n{"name": "now"', " And more text."):
        following = model.tokenize(more, add_special=False)
        assert state.valid_prefix(following) < len(following), more


def test_llama3_calls_are_bare_json_objects_with_parameters(byte_vocabulary):
    model, vocabulary = byte_vocabulary
    output = ToolCallOutput((CLOCK,), LLAMA3_JSON, "required")
    state = vocabulary.compile(grammar_for(ConstraintSpec(tool_calls=output))).start()
    call = model.tokenize('{"name": "now", "parameters": {}}', add_special=False)
    assert state.valid_prefix(call) == len(call)


def test_json_response_formats_become_json_grammars():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert grammar_for(ConstraintSpec(text=JsonOutput(schema))) == GrammarSpec.json_schema(schema)
    assert grammar_for(ConstraintSpec(text=JsonOutput())) == GrammarSpec.json_schema(
        {"type": "object"}
    )
    auto_and_json = ConstraintSpec(
        text=JsonOutput(schema), tool_calls=ToolCallOutput((CLOCK,), HERMES, "auto")
    )
    assert grammar_for(auto_and_json) == GrammarSpec.json_schema(schema)
    assert grammar_for(None) is None


def auto_state(byte_vocabulary, syntax=HERMES):
    model, vocabulary = byte_vocabulary
    output = ToolCallOutput((WEATHER, CLOCK), syntax, "auto")
    return model, vocabulary.compile(grammar_for(ConstraintSpec(tool_calls=output))).start()


def test_auto_leaves_text_free_until_the_model_opens_a_call(byte_vocabulary):
    model, state = auto_state(byte_vocabulary)
    assert state.forced() == [] and state.accepting  # an empty reply is fine
    free = state.allowed()
    text = model.tokenize("Paris? Let me look: {not a call} <tool_ca", add_special=False)
    assert state.valid_prefix(text) == len(text)
    state.consume(text)
    # Still free text: the same tokens may follow as at the start (any valid UTF-8).
    assert np.array_equal(state.allowed(), free) and free.sum() > 150
    assert state.accepting  # and the reply may end here


def test_auto_holds_an_opened_call_to_the_tools_schemas(byte_vocabulary):
    model, state = auto_state(byte_vocabulary)
    state.consume(model.tokenize("Checking.\n<tool_call>", add_special=False))
    # Inside the call the wrapper's fixed text is forced, and only the tools' names fit.
    forced = b"".join(model.token_bytes(token) for token in state.forced())
    assert forced == b'\n{"name": "'
    assert not state.accepting  # an opened call must be finished
    for bad in (
        '\n{"name": "get_time"',  # not a tool
        '\n{"name": "get_weather", "arguments": {}}',  # the required city is missing
        '\n{"name": "get_weather", "arguments": {"city": 5}}',  # a number, not a string
        "\nI changed my mind",
    ):
        tokens = model.tokenize(bad, add_special=False)
        assert state.valid_prefix(tokens) < len(tokens), bad
    call = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    tokens = model.tokenize(call, add_special=False)
    assert state.valid_prefix(tokens) == len(tokens)
    state.consume(tokens)
    assert state.accepting  # the reply may end after the call, or go on
    more = model.tokenize(
        '\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>', add_special=False
    )
    assert state.valid_prefix(more) == len(more)


def test_auto_makes_a_reply_that_starts_with_a_brace_a_call_doubled_or_not(byte_vocabulary):
    # Small Qwen2.5 models write a bare {{...}} call instead of a <tool_call> block.
    model, state = auto_state(byte_vocabulary)
    for good in (
        '{{"name": "get_weather", "arguments": {"city": "Paris"}}}',
        '{"name": "now", "arguments": {}}',
    ):
        tokens = model.tokenize(good, add_special=False)
        assert state.valid_prefix(tokens) == len(tokens), good
    for bad in ('{{"name": "get_weather", "arguments": {}}}', '{"answer": 42}'):
        tokens = model.tokenize(bad, add_special=False)
        assert state.valid_prefix(tokens) < len(tokens), bad


def test_auto_for_llama3_makes_a_reply_that_starts_with_a_brace_a_call(byte_vocabulary):
    model, state = auto_state(byte_vocabulary, LLAMA3_JSON)
    text = model.tokenize("It is sunny {probably}.", add_special=False)
    assert state.valid_prefix(text) == len(text)
    call = model.tokenize('{"name": "now", "parameters": {}}', add_special=False)
    assert state.valid_prefix(call) == len(call)
    wrong = model.tokenize('{"name": "now", "arguments": {}}', add_special=False)
    assert state.valid_prefix(wrong) < len(wrong)
