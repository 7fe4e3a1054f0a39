"""A batch's lines in, its answers out: the JSONL of both APIs.

In: OpenAI's input file, one request a line: ``{"custom_id", "method": "POST", "url": <the
batch's endpoint>, "body": {...}}``; Anthropic's ``requests`` list, ``{"custom_id", "params"}``.
Every line is checked before any runs; the first problems (up to ``MAX_ERRORS``) refuse the
whole batch, each naming its line, as OpenAI's ``errors.data`` does.

Out: OpenAI's output and error files, a line per request: ``{"id": "batch_req_...",
"custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``; a request that
never ran (cancelled, expired) has ``"response": null`` and an ``error`` whose code is
``batch_cancelled`` or ``batch_expired``. An answer with a 2xx status goes to the output file,
any other to the error file. Anthropic's results: ``{"custom_id", "result": {"type":
"succeeded", "message"} | {"type": "errored", "error"} | {"type": "canceled"} | {"type":
"expired"}}``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from gateway.batches.records import NewLine, StoredLine, line_request_id

MAX_ERRORS = 20
MAX_CUSTOM_ID = 64
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # Anthropic's rule; OpenAI's is looser


class BatchError(TypedDict):
    """A reason a batch was refused, as OpenAI's ``errors.data`` shows it; the one for an input
    file gone before the batch ran has no ``param`` or ``line``."""

    code: str
    message: str
    param: NotRequired[str | None]
    line: NotRequired[int | None]


class BatchErrors(TypedDict):
    object: Literal["list"]
    data: list[BatchError]


@dataclass(frozen=True, slots=True)
class LineProblem:
    code: str
    message: str
    line: int | None = None  # 1-based, as OpenAI counts them
    param: str | None = None

    def view(self) -> BatchError:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


class InputRefused(ValueError):
    def __init__(self, problems: list[LineProblem]) -> None:
        super().__init__(problems[0].message)
        self.problems = problems


def openai_lines(data: bytes, endpoint: str, max_lines: int) -> list[NewLine]:
    """The lines of an OpenAI batch input file, checked; ``InputRefused`` lists what is wrong."""
    problems: list[LineProblem] = []
    lines: list[NewLine] = []
    seen: set[str] = set()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputRefused(
            [LineProblem("invalid_file", "the input file is not UTF-8 text")]
        ) from None
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            problems.append(
                LineProblem("too_many_requests", f"a batch may hold at most {max_lines} requests")
            )
            break
        problem, line = _openai_line(raw, number, endpoint, seen, len(lines))
        if problem is not None:
            problems.append(problem)
            if len(problems) >= MAX_ERRORS:
                break
        elif line is not None:
            lines.append(line)
    if not problems and not lines:
        problems.append(LineProblem("empty_file", "the input file holds no requests"))
    if problems:
        raise InputRefused(problems)
    return lines


def _openai_line(
    raw: str, number: int, endpoint: str, seen: set[str], index: int
) -> tuple[LineProblem | None, NewLine | None]:
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return LineProblem("invalid_json_line", "this line is not valid JSON", number), None
    if not isinstance(item, dict):
        return LineProblem("invalid_json_line", "each line must be a JSON object", number), None
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 512:
        return (
            LineProblem("missing_custom_id", "custom_id must be a string", number, "custom_id"),
            None,
        )
    if custom_id in seen:
        message = f"custom_id {custom_id[:64]!r} is used by an earlier line"
        return LineProblem("duplicate_custom_id", message, number, "custom_id"), None
    if item.get("method") != "POST":
        return LineProblem("invalid_method", "method must be POST", number, "method"), None
    if item.get("url") != endpoint:
        message = f"url must be the batch's endpoint {endpoint}"
        return LineProblem("mismatched_url", message, number, "url"), None
    body = item.get("body")
    if not isinstance(body, dict):
        return LineProblem("invalid_body", "body must be a JSON object", number, "body"), None
    extra = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if extra:
        message = f"unknown field {extra[0][:64]!r}"
        return LineProblem("invalid_request", message, number, extra[0][:64]), None
    seen.add(custom_id)
    return None, NewLine(index, custom_id, orjson.dumps(body).decode())


def anthropic_lines(requests: object, max_lines: int) -> list[NewLine]:
    """The ``requests`` of a Message Batches create, checked (``InputRefused``)."""
    if not isinstance(requests, list) or not requests:
        raise InputRefused([LineProblem("invalid_request", "requests: must be a non-empty list")])
    if len(requests) > max_lines:
        message = f"requests: at most {max_lines} requests per batch"
        raise InputRefused([LineProblem("invalid_request", message)])
    lines: list[NewLine] = []
    seen: set[str] = set()
    for index, item in enumerate(requests):
        where = f"requests.{index}"
        if not isinstance(item, dict):
            raise InputRefused([LineProblem("invalid_request", f"{where}: must be an object")])
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            message = f"{where}.custom_id: 1 to 64 letters, digits, - or _"
            raise InputRefused([LineProblem("invalid_request", message)])
        if custom_id in seen:
            message = f"{where}.custom_id: {custom_id!r} is used by an earlier request"
            raise InputRefused([LineProblem("invalid_request", message)])
        params = item.get("params")
        if not isinstance(params, dict):
            raise InputRefused(
                [LineProblem("invalid_request", f"{where}.params: must be an object")]
            )
        extra = sorted(set(item) - {"custom_id", "params"})
        if extra:
            message = f"{where}.{extra[0][:64]}: Extra inputs are not permitted"
            raise InputRefused([LineProblem("invalid_request", message)])
        seen.add(custom_id)
        lines.append(NewLine(index, custom_id, orjson.dumps(params).decode()))
    return lines


UNRUN_MESSAGES = {
    "cancelled": ("batch_cancelled", "This request was not run: the batch was cancelled."),
    "expired": (
        "batch_expired",
        "This request could not be run before the batch's completion window ended.",
    ),
}


@dataclass
class OpenAiFiles:
    """The output and error files of a closed OpenAI batch, built line by line."""

    output: bytearray
    errors: bytearray

    @classmethod
    def of(cls, batch_id: str, lines: Iterable[StoredLine]) -> OpenAiFiles:
        files = cls(bytearray(), bytearray())
        for line in lines:
            files.add(batch_id, line)
        return files

    def add(self, batch_id: str, line: StoredLine) -> None:
        item: dict[str, Any] = {
            "id": line.request_id or line_request_id(batch_id, line.index),
            "custom_id": line.custom_id,
        }
        if line.state == "done" and line.status_code is not None and line.response is not None:
            item["response"] = {
                "status_code": line.status_code,
                "request_id": item["id"],
                "body": orjson.loads(line.response),
            }
            item["error"] = None
            target = self.output if 200 <= line.status_code < 300 else self.errors
        else:
            code, message = UNRUN_MESSAGES.get(line.state, UNRUN_MESSAGES["expired"])
            item["response"] = None
            item["error"] = {"code": code, "message": message}
            target = self.errors
        target += orjson.dumps(item) + b"\n"


def anthropic_results(lines: Iterable[StoredLine]) -> Iterator[bytes]:
    """Anthropic's results, one JSONL line per request, in the batch's order."""
    for line in lines:
        result: dict[str, Any]
        if line.state == "done" and line.response is not None and line.status_code is not None:
            body = orjson.loads(line.response)
            if 200 <= line.status_code < 300:
                result = {"type": "succeeded", "message": body}
            else:
                result = {"type": "errored", "error": body}
        elif line.state == "cancelled":
            result = {"type": "canceled"}
        else:
            result = {"type": "expired"}
        yield orjson.dumps({"custom_id": line.custom_id, "result": result}) + b"\n"
