"""Every exception the engine raises on purpose, in one place.

Each message names what is wrong (the setting, the limit, the tensor). The `ValueError`
subclasses are the caller's fault (bad settings, a bad checkpoint, a bad request); the
`RuntimeError` subclasses are the engine's state (not started, a failed step, a dead rank).
Nothing here imports the rest of the engine, so every layer may import it.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is out of range or inconsistent; the message names it."""


class SamplingParamsError(ValueError):
    """A sampling setting is out of range; the message names it."""


class TokenizerError(ValueError):
    """The tokenizer files are missing or a chat template cannot be rendered."""


class LoaderError(ValueError):
    """The checkpoint cannot be loaded; the message names what is wrong."""


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its settings is not implemented."""


class WeightShapeError(ValueError):
    """A checkpoint tensor does not fit the parameter it is loaded into."""


class InvalidPromptError(ValueError):
    """The prompt is empty or holds token ids outside the vocabulary."""


class RequestTooLargeError(ValueError):
    """The request can never be scheduled; the message names the limit it exceeds."""


class GrammarError(ValueError):
    """A structured output constraint (schema, regex, grammar) that cannot be compiled."""


class EngineNotRunningError(RuntimeError):
    """generate() was called before start() or after shutdown()."""


class EngineStepError(RuntimeError):
    """A model step failed; the requests in flight are aborted with this error."""


class EngineDeadError(RuntimeError):
    """A tensor-parallel rank died or failed: the engine cannot serve until it is rebuilt."""
