"""What ``tool_choice: "auto"``'s lazy grammar costs per token of free text.

    PYTHONPATH=. python benchmarks/auto_grammar_cost.py [TARGET.gguf]

Loads the target (default: the starter target from the test models), compiles the auto
tool-call grammar for one tool on its vocabulary, and walks a plain-text reply token by
token twice: as sampling does (the whole mask, then consume) and as greedy decoding does
(the forced-token check, one ``allows`` of the chosen token, then consume). Prints
milliseconds per token. On a shared machine take them as an order of magnitude.
"""

from __future__ import annotations

import sys
import time

from backends.base import ToolSpec
from backends.output.call_syntax import HERMES
from backends.output.constraints import GrammarVocabulary, grammar_for
from backends.output.output_constraints import ConstraintSpec, ToolCallOutput
from backends.select import load_model

TEXT = (
    "Sure, let me look up the weather in Paris for you. It is usually mild in spring, "
    "with some rain and a few sunny days. "
) * 3
TOOL = ToolSpec(
    "get_weather",
    None,
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def main() -> None:
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        from tests.support.model_files import TARGET_KEY, require_model

        path = str(require_model(TARGET_KEY))
    model = load_model(path, runtime="llamacpp", n_ctx=512)
    vocabulary = GrammarVocabulary(model)
    grammar = vocabulary.compile(
        grammar_for(ConstraintSpec(tool_calls=ToolCallOutput((TOOL,), HERMES, "auto")))
    )
    tokens = model.tokenize(TEXT, add_special=False)
    for label, step in (
        ("sampled (mask + consume)", lambda state, token: state.allowed()),
        (
            "greedy (forced + allows + consume)",
            lambda state, token: (state.forced(), state.allows(token)),
        ),
    ):
        state = grammar.start()
        started = time.perf_counter()
        for token in tokens:
            step(state, token)
            state.consume([token])
        per_token = (time.perf_counter() - started) / len(tokens) * 1e3
        print(f"{label:36} {per_token:.4f} ms per token over {len(tokens)} tokens")
    model.close()


if __name__ == "__main__":
    main()
