"""Errors raised by the inference layer.

Every message is written for the person at the keyboard: it says what went wrong
and what to do about it. The app shows ``str(error)`` as it is, without a traceback.
"""

from __future__ import annotations


class BackendError(Exception):
    """Base class for every error the inference layer reports to users."""


class ModelLoadError(BackendError):
    """A model file is missing, truncated, corrupt or of an unsupported kind."""


class RuntimeUnavailableError(BackendError):
    """The runtime a model needs (llama.cpp or MLX) is not installed here."""


class IncompatiblePairError(BackendError):
    """The draft model does not share the target model's tokenizer."""


class ContextOverflowError(BackendError):
    """The prompt (plus the requested output) does not fit in the context window."""


class DecodeError(BackendError):
    """The runtime failed while evaluating tokens."""
