"""Command-line options that several commands share, and what they turn into.

Model options (pair, context, runtime) and sampling/drafting options, defined once for
``chat``, ``generate``, ``bench`` and ``serve``; ``chat_settings`` and ``sampling_params``
turn parsed options into settings and :class:`~backends.sampling.filters.SamplingParams`.
"""

from __future__ import annotations

import argparse
import dataclasses

from app.errors import DraftpenError
from app.settings import Settings, load_settings
from backends.engine import DRAFTER_CHOICES
from backends.sampling.filters import SamplingParams
from backends.select import RUNTIMES


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that loads a pair."""
    parser.add_argument(
        "--pair", default=None, help="model pair from the catalog (default: from settings)"
    )
    parser.add_argument("--context", type=int, default=None, help="context length in tokens")
    parser.add_argument(
        "--runtime",
        default=None,
        choices=("auto", *RUNTIMES),
        help="inference runtime (default: best for this machine; see draftpen doctor)",
    )
    add_pair_file_options(parser)


def add_pair_file_options(parser: argparse.ArgumentParser) -> None:
    """``--target`` and ``--draft``: a pair of your own files instead of ``--pair``."""
    parser.add_argument(
        "--target",
        default=None,
        metavar="PATH|DIR|REPO:FILE",
        help="your own target model: a local .gguf file, a hub file REPO:FILENAME, or an "
        "MLX model's directory (instead of --pair; alone, it speculates with n-gram drafts)",
    )
    parser.add_argument(
        "--draft",
        default=None,
        metavar="PATH|DIR|REPO:FILE",
        help="your own draft model for --target (same tokenizer family), or a head for it: "
        "an EAGLE-3/DFlash/DSpark GGUF, an MTP head's own GGUF (Gemma 4's assistant), or "
        "an EAGLE-3/DFlash head's directory on MLX",
    )


def add_sampling_options(parser: argparse.ArgumentParser, *, temperature: float | None) -> None:
    """Sampling and drafting options shared by generate and chat.

    ``temperature=None`` makes every default None: the chat fills them from the
    user's settings, so a flag overrides a setting for this run only.
    """
    from_settings = temperature is None

    def default(value: object) -> object:
        return None if from_settings else value

    parser.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    parser.add_argument(
        "--top-k", type=int, default=default(0), help="keep the k likeliest tokens (0: off)"
    )
    parser.add_argument("--top-p", type=float, default=default(1.0), help="nucleus mass to keep")
    parser.add_argument(
        "--min-p", type=float, default=default(0.0), help="drop tokens below min-p x best"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    parser.add_argument(
        "--max-tokens", type=int, default=default(512), help="most tokens to generate"
    )
    parser.add_argument(
        "--draft-tokens",
        "-k",
        type=int,
        default=default(4),
        help="draft tokens per round (K) for a fixed drafter; auto chooses K itself",
    )
    parser.add_argument("--drafter", choices=DRAFTER_CHOICES, default=default("auto"))
    parser.add_argument(
        "--exact",
        dest="exact_output",
        action=argparse.BooleanOptionalAction,
        default=default(False),
        help="greedy output bit-identical to plain decoding: exact kernels (on a CPU "
        "~0.86x decoding, an 8k-token prompt up to 2x slower) and auto verifies only in "
        "batches that round like one-token decoding (on CUDA none do: plain decoding); "
        "--no-exact (default) uses the fastest kernels",
    )
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument(
        "--think",
        dest="thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let a model that reasons aloud (Qwen3, ...) think first; --no-think turns "
        "it off through the chat template's own switch (default: from settings, on)",
    )


# Chat flags that override the settings field of the same name for one run.
CHAT_SETTING_FLAGS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_tokens",
    "draft_tokens",
    "drafter",
    "exact_output",
    "thinking",
)


def chat_settings(args: argparse.Namespace) -> Settings:
    """The user's settings with this run's chat flags applied (never saved)."""
    settings = load_settings()
    overrides = {name: getattr(args, name) for name in CHAT_SETTING_FLAGS}
    overrides = {name: value for name, value in overrides.items() if value is not None}
    if getattr(args, "system", None) is not None:
        overrides["system_prompt"] = args.system
    if getattr(args, "context", None) is not None:
        overrides["context_length"] = args.context
    return dataclasses.replace(settings, **overrides)


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """SamplingParams from parsed options; a bad value is a one-line error."""
    try:
        return SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            seed=args.seed,
        )
    except ValueError as error:
        raise DraftpenError(f"invalid sampling option: {error}") from error
