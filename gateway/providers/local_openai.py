"""The local engine's requests and answers: a request -> prompts + SamplingParams, and the
engine's outputs back in OpenAI's shape.

``chat_request`` takes a chat request as ``formats/`` parsed it (the internal form, whatever the
client's format: nothing parses OpenAI JSON again here), ``completion_request`` a
``/v1/completions`` body; each becomes token-id prompts (the chat template renders the
conversation, ``local_chat.py``) and one ``SamplingParams``, and every bad value a 400 that
names the client's field. Every field a request sets is either honoured or refused: a field
the engine cannot honour (audio, reasoning effort, an unknown name) is a 400 naming it, unless
its value asks for nothing (``store: false``). Structured outputs (``response_format``
json_object/json_schema, vLLM's ``guided_*`` fields and ``structured_outputs`` object) become
the engine's ``StructuredOutput``, and ``logit_bias`` its token-id map. ``tools``,
``tool_choice`` and ``parallel_tool_calls`` are read by ``local_tools`` (a forced call is a
grammar too) and the output parsed into ``tool_calls`` by the request's parser. The
``*_response``/``*_chunk`` builders shape the engine's outputs exactly like OpenAI's (ids,
``created``, ``model``, ``finish_reason``, ``usage``, logprobs).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.formats.internal import ChatRequest, ResponseFormat
from gateway.formats.openai_chat.response import ChatUsage, render_tool_call
from gateway.providers.local_chat import chat_turns
from gateway.providers.local_errors import client_error
from gateway.providers.local_tools import ToolPlan, read_tools

Kind = Literal["chat", "completion"]
# vLLM extensions accepted alongside OpenAI's fields (sent by SDKs through ``extra_body``).
_EXTENSIONS = (
    "top_k",
    "min_p",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "repetition_penalty",
    "include_stop_str_in_output",
)
# Structured outputs: OpenAI's field, vLLM's older guided_* fields and their newer object.
# At most one of them per request.
_STRUCTURED = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
)
# the keys of vLLM's `structured_outputs` object and the constraint each one asks for
_STRUCTURED_OUTPUTS_KEYS = ("json", "regex", "choice", "grammar", "json_object")
# Fields honoured as asked. `user` and `metadata` identify or label the request (routing and
# usage read them) and do not change what is generated.
_HONOURED = {
    "model",
    "stream",
    "stream_options",
    "n",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "max_tokens",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "metadata",
    "logit_bias",
    *_EXTENSIONS,
    *_STRUCTURED,
}
_HONOURED_BY_KIND = {
    "chat": {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    },
    "completion": {"prompt", "best_of"},
}


def _asks_for_nothing(name: str, value: Any, has_tools: bool) -> bool:
    """True when a field the engine lacks is set to a value that needs no feature of it."""
    if value is None:
        return True
    if name in ("tools", "functions"):
        return not value
    if name in ("tool_choice", "function_call"):
        return value == "none" or (value == "auto" and not has_tools)
    if name == "parallel_tool_calls":
        return not has_tools
    if name in ("store", "echo"):
        return value is False
    if name == "suffix":
        return value == ""
    if name == "service_tier":
        return value in ("auto", "default")
    if name == "modalities":
        return value == ["text"]
    if name in ("skip_special_tokens", "spaces_between_special_tokens"):
        return value is True
    return False


@dataclass
class LocalRequest:
    kind: Kind
    model: str
    prompts: list[list[int]]
    params: Any  # engine.sampling.SamplingParams
    top_logprobs: int | None  # None = no logprobs asked
    structured_param: str | None = None  # the field that set params.structured (its 400s)
    tools: ToolPlan | None = None  # the offered functions, their parser and tool_choice
    # specs compiled before generating, each with the param its 400 names
    compile: list[tuple[Any, str | None]] = field(default_factory=list)
    id: str = field(default_factory=lambda: secrets.token_hex(16))
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id

    @property
    def n(self) -> int:
        return self.params.n


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _chat_prompt(
    provider: str, tokenizer: Any, request: ChatRequest, tools: ToolPlan | None
) -> list[int]:
    from engine import TokenizerError

    template = getattr(tokenizer, "chat_template", None)
    turns, variables = chat_turns(provider, request, tools, template)
    try:
        ids = tokenizer.apply_chat_template(
            turns, add_generation_prompt=True, tokenize=True, **variables
        )
    except TokenizerError as exc:
        raise client_error(provider, str(exc), "messages") from None
    return list(ids)


def _completion_prompts(provider: str, tokenizer: Any, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if all(_is_int(t) for t in prompt):
        return [list(prompt)]
    prompts = []
    for index, item in enumerate(prompt):
        if isinstance(item, str):
            prompts.append(tokenizer.encode(item))
        elif isinstance(item, list) and item and all(_is_int(t) for t in item):
            prompts.append(list(item))
        else:
            raise client_error(
                provider,
                f"prompt[{index}] must be a string or a non-empty array of token ids",
                f"prompt[{index}]",
            )
    return prompts


def _refuse_unsupported(
    provider: str, fields: dict[str, Any], kind: Kind, *, has_tools: bool
) -> None:
    honoured = _HONOURED | _HONOURED_BY_KIND[kind]
    for name, value in fields.items():
        if name in honoured or _asks_for_nothing(name, value, has_tools):
            continue
        if name in ("tools", "tool_choice", "parallel_tool_calls"):
            message = f"the local model serves tool calls on /v1/chat/completions only ({name})"
        elif name in ("functions", "function_call"):
            message = f"the local model does not support {name}: use tools and tool_choice"
        else:
            message = f"the local model does not support {name}"
        raise client_error(provider, message, name)
    if kind == "completion":
        best_of = fields.get("best_of")
        if best_of is not None and best_of != (fields.get("n") or 1):
            raise client_error(provider, "the local model supports only best_of = n", "best_of")


def _logprobs(provider: str, fields: dict[str, Any], kind: Kind) -> int | None:
    if kind == "chat":
        wanted = fields.get("logprobs")
        if wanted is not None and not isinstance(wanted, bool):
            raise client_error(provider, "logprobs must be a boolean", "logprobs")
        top = fields.get("top_logprobs")
        if top is not None and (not _is_int(top) or not 0 <= top <= 20):
            raise client_error(
                provider, "top_logprobs must be an integer from 0 to 20", "top_logprobs"
            )
        if top is not None and not wanted:
            raise client_error(provider, "top_logprobs needs logprobs: true", "top_logprobs")
        return (top or 0) if wanted else None
    value = fields.get("logprobs")
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= 20:
        raise client_error(provider, "logprobs must be an integer from 0 to 20", "logprobs")
    return value


def _json_schema(provider: str, value: Any, param: str) -> Any:
    """A schema given as an object or as its JSON text -> the engine's json_schema spec."""
    from engine import StructuredOutput

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise client_error(provider, f"{param} must be a JSON schema", param) from None
    if not isinstance(value, dict):
        raise client_error(provider, f"{param} must be a JSON schema object", param)
    return StructuredOutput.json_schema(value)


def _text(provider: str, value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise client_error(provider, f"{param} must be a non-empty string", param)
    return value


def _choices(provider: str, value: Any, param: str) -> Any:
    from engine import StructuredOutput

    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise client_error(provider, f"{param} must be a non-empty array of strings", param)
    return StructuredOutput.choice(value)


def _chat_response_format(spec: ResponseFormat | None) -> tuple[Any, str] | None:
    """A chat request's ``response_format`` (read by ``formats/``) as the engine's constraint."""
    from engine import StructuredOutput

    if spec is None or spec.kind == "text":
        return None
    if spec.kind == "json_object":
        return StructuredOutput.json_object(), "response_format"
    if spec.schema is None:  # OpenAI allows it: any JSON object then
        return StructuredOutput.json_object(), "response_format.json_schema"
    return StructuredOutput.json_schema(spec.schema), "response_format.json_schema.schema"


def _response_format(provider: str, value: Any) -> tuple[Any, str] | None:
    """A completions body's ``response_format`` as the engine's constraint."""
    from engine import StructuredOutput

    if not isinstance(value, dict):
        raise client_error(provider, "response_format must be an object", "response_format")
    kind = value.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return StructuredOutput.json_object(), "response_format"
    if kind != "json_schema":
        raise client_error(
            provider,
            "response_format.type must be text, json_object or json_schema",
            "response_format.type",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        param = "response_format.json_schema"
        raise client_error(provider, f"{param} must be an object", param)
    param = "response_format.json_schema.schema"
    if spec.get("schema") is None:  # OpenAI allows it: any JSON object then
        return StructuredOutput.json_object(), "response_format.json_schema"
    return _json_schema(provider, spec["schema"], param), param


def _structured_outputs(provider: str, value: Any) -> tuple[Any, str]:
    """vLLM's ``structured_outputs``: exactly one of json, regex, choice, grammar, json_object."""
    from engine import StructuredOutput

    if not isinstance(value, dict):
        raise client_error(provider, "structured_outputs must be an object", "structured_outputs")
    set_keys = [key for key, item in value.items() if item is not None and item is not False]
    for key in set_keys:
        if key not in _STRUCTURED_OUTPUTS_KEYS:
            param = f"structured_outputs.{key}"
            raise client_error(provider, f"the local model does not support {param}", param)
    if len(set_keys) != 1:
        raise client_error(
            provider,
            "structured_outputs must set exactly one of " + ", ".join(_STRUCTURED_OUTPUTS_KEYS),
            "structured_outputs",
        )
    key = set_keys[0]
    param, item = f"structured_outputs.{key}", value[key]
    if key == "json":
        return _json_schema(provider, item, param), param
    if key == "regex":
        return StructuredOutput.regex(_text(provider, item, param)), param
    if key == "choice":
        return _choices(provider, item, param), param
    if key == "grammar":
        return StructuredOutput.grammar(_text(provider, item, param)), param
    if item is not True:
        raise client_error(provider, f"{param} must be true", param)
    return StructuredOutput.json_object(), param


def _structured(
    provider: str, fields: dict[str, Any], response_format: tuple[Any, str] | None
) -> tuple[Any, str | None]:
    """The request's structured-output constraint and the field that asked for it:
    ``response_format`` (already read) or one of vLLM's fields."""
    from engine import StructuredOutput

    found: list[tuple[Any, str]] = [response_format] if response_format is not None else []
    for name in _STRUCTURED:
        value = fields.get(name)
        if value is None or name == "response_format":
            continue
        if name == "structured_outputs":
            parsed = _structured_outputs(provider, value)
        elif name == "guided_json":
            parsed = _json_schema(provider, value, name), name
        elif name == "guided_regex":
            parsed = StructuredOutput.regex(_text(provider, value, name)), name
        elif name == "guided_choice":
            parsed = _choices(provider, value, name), name
        else:
            parsed = StructuredOutput.grammar(_text(provider, value, name)), name
        found.append(parsed)
    if len(found) > 1:
        names = " and ".join(param.split(".")[0] for _, param in found)
        raise client_error(
            provider, f"set one structured output constraint, not {names}", found[1][1]
        )
    return found[0] if found else (None, None)


def _logit_bias(provider: str, value: Any) -> dict[int, float]:
    """OpenAI's map of token ids (JSON object keys, so strings) to a bias in [-100, 100]."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise client_error(provider, "logit_bias must be an object", "logit_bias")
    bias: dict[int, float] = {}
    for key, item in value.items():
        text = str(key)
        if not text.isdigit():
            raise client_error(
                provider, f"logit_bias keys must be token ids, got {text!r}", "logit_bias"
            )
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise client_error(provider, "logit_bias values must be numbers", "logit_bias")
        bias[int(text)] = float(item)
    return bias


@dataclass(frozen=True)
class EngineLimits:
    """What every request on this engine is held to, and filled in with: the context length,
    the ``max_tokens`` of a request that sets none (clipped to the context left), the
    checkpoint's sampling for what a request leaves out, and how its model writes tool calls."""

    max_model_len: int
    default_max_tokens: int | None
    sampling_defaults: Mapping[str, Any]
    tool_parser: str = "hermes"


def _chat_fields(provider: str, request: ChatRequest) -> dict[str, Any]:
    """A chat request's sampling fields under their Chat Completions names: those ``formats/``
    reads, and the rest of a Chat Completions body (the engine's extensions, logprobs,
    ``logit_bias``, vLLM's structured outputs), each checked first: one the engine cannot
    honour is a 400 naming it."""
    extras = request.extras if request.same_format("openai_chat") else {}
    _refuse_unsupported(provider, extras, "chat", has_tools=bool(request.tools))
    if request.reasoning is not None and request.reasoning.effort is not None:
        name = request.field_name("reasoning")
        raise client_error(provider, f"the local model does not support {name}", name)
    modelled = {
        "n": request.n,
        "seed": request.seed,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "max_tokens": request.max_tokens,
        "stop": request.stop or None,
    }
    return {**extras, **{name: value for name, value in modelled.items() if value is not None}}


def chat_request(
    provider: str, request: ChatRequest, tokenizer: Any, limits: EngineLimits
) -> LocalRequest:
    """A chat request (the internal form) for the engine; a 400 ``UpstreamError`` naming the
    client's field for what it cannot honour."""
    fields = _chat_fields(provider, request)
    tools = read_tools(provider, request, limits.tool_parser)
    prompts = [_chat_prompt(provider, tokenizer, request, tools)]
    response_format = _chat_response_format(request.response_format)
    return _sampled(
        provider, "chat", request.model, fields, prompts, limits, response_format, tools
    )


def completion_request(
    provider: str, body: dict[str, Any], tokenizer: Any, limits: EngineLimits
) -> LocalRequest:
    """A ``/v1/completions`` body for the engine; a 400 ``UpstreamError`` naming the bad
    param."""
    _refuse_unsupported(provider, body, "completion", has_tools=bool(body.get("tools")))
    prompts = _completion_prompts(provider, tokenizer, body["prompt"])
    value = body.get("response_format")
    response_format = _response_format(provider, value) if value is not None else None
    model = body.get("model") or provider
    return _sampled(provider, "completion", model, body, prompts, limits, response_format, None)


def _sampled(
    provider: str,
    kind: Kind,
    model: str,
    fields: dict[str, Any],
    prompts: list[list[int]],
    limits: EngineLimits,
    response_format: tuple[Any, str] | None,
    tools: ToolPlan | None,
) -> LocalRequest:
    """The engine request of ``prompts`` with one ``SamplingParams`` from ``fields``; the
    checkpoint's sampling fills what they leave out."""
    from engine import SamplingParams, SamplingParamsError

    prompt_param = "messages" if kind == "chat" else "prompt"
    longest = max(len(p) for p in prompts)
    if any(not p for p in prompts):
        raise client_error(provider, f"{prompt_param} encodes to no tokens", prompt_param)
    max_tokens = fields.get("max_completion_tokens") or fields.get("max_tokens")
    if max_tokens is None:
        room = limits.max_model_len - longest
        if room < 1:
            raise client_error(
                provider,
                f"the prompt ({longest} tokens) leaves no room under the model's context length "
                f"({limits.max_model_len})",
                prompt_param,
                "context_length_exceeded",
            )
        default = limits.default_max_tokens
        max_tokens = min(room, default) if default else room
    seed = fields.get("seed")
    if seed is not None and not _is_int(seed):
        raise client_error(provider, "seed must be an integer", "seed")
    stop = fields.get("stop")
    defaults = {"temperature": 1.0, "top_p": 1.0, **limits.sampling_defaults}
    values: dict[str, Any] = {
        **defaults,
        "n": fields.get("n") or 1,
        "seed": seed,
        "stop": [stop] if isinstance(stop, str) else list(stop or []),
        "max_tokens": max_tokens,
        "logprobs": _logprobs(provider, fields, kind),
        "presence_penalty": fields.get("presence_penalty") or 0.0,
        "frequency_penalty": fields.get("frequency_penalty") or 0.0,
    }
    for name in ("temperature", "top_p", *_EXTENSIONS):
        if fields.get(name) is not None:
            values[name] = fields[name]
    values["logit_bias"] = _logit_bias(provider, fields.get("logit_bias"))
    structured, structured_param = _structured(provider, fields, response_format)
    forced = tools.grammar() if tools is not None else None
    if forced is not None:
        if structured is not None:
            raise client_error(
                provider,
                f"set one structured output constraint, not {str(structured_param).split('.')[0]} "
                f"and tool_choice {tools.choice}",
                "tool_choice",
            )
        structured, structured_param = forced, "tool_choice"
    values["structured"] = structured
    try:
        params = SamplingParams(**values)
    except (SamplingParamsError, TypeError) as exc:
        param = str(exc).split(" ", 1)[0]
        raise client_error(provider, str(exc), param if param in values else None) from None
    return LocalRequest(
        kind,
        model,
        prompts,
        params,
        values["logprobs"],
        structured_param=structured_param,
        tools=tools,
        compile=[
            *(tools.parameter_specs() if tools is not None else []),
            *([(structured, structured_param)] if structured is not None else []),
        ],
    )


# --- responses -----------------------------------------------------------------------------


def _token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprobs(tokenizer: Any, entries: list[Any], top: int) -> list[dict[str, Any]]:
    """OpenAI's ``choices[].logprobs.content`` items for the engine's ``TokenLogprobs``."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = _token_text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    rows = []
    for entry in entries:
        alternatives = sorted(entry.top.items(), key=lambda kv: -kv[1])[:top]
        row = item(entry.token_id, entry.logprob)
        row["top_logprobs"] = [item(t, lp) for t, lp in alternatives]
        rows.append(row)
    return rows


def completion_logprobs(
    tokenizer: Any, entries: list[Any], top: int, offset: int = 0
) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object (tokens, token_logprobs, top, offsets)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for entry in entries:
        text = _token_text(tokenizer, entry.token_id)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        alternatives = sorted(entry.top.items(), key=lambda kv: -kv[1])[:top]
        tops.append({_token_text(tokenizer, t): lp for t, lp in alternatives})
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> ChatUsage:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass
class Choice:
    """One finished sample, gathered from the stream for a non-stream response."""

    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    logprobs: list[Any] = field(default_factory=list)


def full_response(
    request: LocalRequest, tokenizer: Any, choices: list[Choice], prompt_tokens: int
) -> dict[str, Any]:
    top = request.top_logprobs
    rows = []
    for index, choice in enumerate(choices):
        finish = "stop" if choice.finish_reason == "stop" else "length"
        if request.kind == "chat":
            logprobs = (
                {"content": chat_logprobs(tokenizer, choice.logprobs, top), "refusal": None}
                if top is not None
                else None
            )
            message: dict[str, Any] = {
                "role": "assistant",
                "content": choice.text,
                "refusal": None,
            }
            if request.tools is not None:
                content, calls = request.tools.parser.parse(choice.text)
                if calls:
                    message["content"] = content
                    message["tool_calls"] = [render_tool_call(call) for call in calls]
                    finish = tool_finish(choice.finish_reason)
            rows.append(
                {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
            )
        else:
            logprobs = (
                completion_logprobs(tokenizer, choice.logprobs, top) if top is not None else None
            )
            rows.append(
                {"index": index, "text": choice.text, "logprobs": logprobs, "finish_reason": finish}
            )
    completion_tokens = sum(c.num_tokens for c in choices)
    kind = "chat.completion" if request.kind == "chat" else "text_completion"
    return _envelope(request, kind, rows, usage=usage(prompt_tokens, completion_tokens))


def tool_finish(engine_finish: str | None) -> str:
    """A choice that made calls ends with ``tool_calls`` (unless cut at max_tokens)."""
    return "tool_calls" if engine_finish == "stop" else "length"


def tool_call_deltas(number: int, call: Any) -> list[dict[str, Any]]:
    """One call as OpenAI streams it: its id, type and name, then its arguments."""
    head = {
        "index": number,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    return [head, {"index": number, "function": {"arguments": call.arguments}}]


def chunk(request: LocalRequest, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    kind = "chat.completion.chunk" if request.kind == "chat" else "text_completion"
    return _envelope(request, kind, choices, **extra)


def _envelope(
    request: LocalRequest, kind: str, choices: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """What a whole answer and each stream chunk carry around their choices."""
    return {
        "id": request.response_id,
        "object": kind,
        "created": request.created,
        "model": request.model,
        "system_fingerprint": None,
        "choices": choices,
        **extra,
    }


def delta_choice(
    request: LocalRequest,
    tokenizer: Any,
    index: int,
    text: str,
    logprobs: list[Any] | None,
    finish_reason: str | None,
    *,
    role: bool = False,
    tool_call: dict[str, Any] | None = None,
) -> dict[str, Any]:
    top = request.top_logprobs
    if request.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        if tool_call is not None:
            delta["tool_calls"] = [tool_call]
        return {
            "index": index,
            "delta": delta,
            "logprobs": (
                {"content": chat_logprobs(tokenizer, logprobs, top), "refusal": None}
                if top is not None and logprobs
                else None
            ),
            "finish_reason": finish_reason,
        }
    return {
        "index": index,
        "text": text,
        "logprobs": (
            completion_logprobs(tokenizer, logprobs, top) if top is not None and logprobs else None
        ),
        "finish_reason": finish_reason,
    }
