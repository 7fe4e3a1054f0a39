"""The client's view of requests: detokenization, stop strings and deltas, off the step thread.

The step thread hands over a `StepOutput` (the sequences sampled, their tokens, which of
them finished by a stop token, EOS or length) and moves on. `process_step` runs where
the client is: on the consumer's event loop for `AsyncEngine`, inline for the synchronous
`LLMEngine.step`; `process_steps` takes several steps at once (`AsyncEngine` hands a busy
loop its steps in batches). It advances one `RequestState` per request (core/request_state.py): an
incremental detokenizer per sample, the text not yet streamed (a suffix that could still
become a stop string is held back), and the token ids and logprobs the client has seen. A
stop string cuts the text before it (after it with `include_stop_str_in_output`) and
finishes the sample here; the engine is then told to stop that sequence (`stops`), and
tokens it made in the meantime are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.core.request_state import RequestState, SampleState, StreamOutput, held_back
from engine.core.sequence import Sequence
from engine.core.stats import EngineStats
from engine.sampling import SamplingParams, TokenLogprobs


@dataclass
class StepOutput:
    """One step's sampled tokens, built on the step thread (nothing here is mutated later)."""

    time: float  # when the tokens reached the host (time.monotonic)
    seqs: list[Sequence]  # sampled this step, one token each
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None  # None when nobody asked
    finished: dict[int, str]  # position in `seqs` -> "stop" | "length"


@dataclass
class RequestDelta:
    """A step's outputs of one request (the synchronous `LLMEngine.step` API)."""

    request_id: str
    num_prompt_tokens: int
    deltas: list[StreamOutput]
    finished: bool


def process_step(
    out: StepOutput, states: Mapping[str, RequestState], stats: EngineStats | None
) -> tuple[list[tuple[RequestState, list[StreamOutput]]], list[tuple[str, int]]]:
    """`process_steps` of one step."""
    return process_steps([out], states, stats)


def process_steps(
    outs: list[StepOutput], states: Mapping[str, RequestState], stats: EngineStats | None
) -> tuple[list[tuple[RequestState, list[StreamOutput]]], list[tuple[str, int]]]:
    """Turn steps' tokens into outputs for the requests in `states` (others are skipped).

    Returns each touched request's outputs (one per sample per step that gave it a token, in
    step order) and the (request id, index) of every sample a stop string finished, for the
    engine to stop.
    """
    touched: dict[RequestState, list[StreamOutput]] = {}
    stops: list[tuple[str, int]] = []
    first_token: list[float] = []
    inter_token: list[float] = []
    finished_requests: list[float] = []
    add_inter_token = inter_token.append
    for out in outs:
        now = out.time
        logprobs = out.logprobs
        finished = out.finished
        for position, (seq, token) in enumerate(zip(out.seqs, out.token_ids, strict=True)):
            request_id = seq.request.request_id
            state = states.get(request_id)
            if state is None:
                continue
            sample = state.samples[seq.index]
            if sample.finish_reason is not None:
                continue  # a stop string ended it; the engine has not heard yet
            sample.token_ids.append(token)
            entry = None if logprobs is None else logprobs[position]
            if entry is not None:
                sample.logprobs.append(entry)
            last_time = sample.last_time
            if last_time is None:
                first_token.append(now - state.arrival_time)
            else:
                add_inter_token(now - last_time)
            sample.last_time = now
            piece = sample.detokenizer.push(token)
            reason = finished.get(position) if finished else None
            params = state.params
            if params.stop:
                piece, stopped = _apply_stops(sample, piece, params, reason is not None)
                if stopped:
                    reason = "stop"
                    stops.append((request_id, seq.index))
            if piece:
                sample.pieces.append(piece)
            if reason is not None:
                sample.finish_reason = reason
                state.num_unfinished -= 1
                if not state.num_unfinished:
                    finished_requests.append(now - state.arrival_time)
            output = StreamOutput(
                request_id,
                seq.index,
                piece,
                [token],
                None if params.logprobs is None else ([entry] if entry else []),
                reason,
                len(state.prompt_token_ids),
                len(sample.token_ids),
                reason is not None and params.n == 1,
                now,
                seq.scheduled_at if last_time is None else None,
            )
            outputs = touched.get(state)
            if outputs is None:
                touched[state] = [output]
            else:
                outputs.append(output)
    for state, outputs in touched.items():
        if state.params.n > 1:  # the request's very last output says the request is done
            outputs[-1].finished = state.finished
    if stats is not None and (first_token or inter_token or finished_requests):
        stats.record_latencies(first_token, inter_token, finished_requests)
    return list(touched.items()), stops


def _apply_stops(
    sample: SampleState, piece: str, params: SamplingParams, finishing: bool
) -> tuple[str, bool]:
    """(text to stream now, whether a stop string ended the sample). The text ends before
    the earliest stop string, or after it with `include_stop_str_in_output`."""
    text = sample.held + piece
    if len(sample.token_ids) >= params.min_tokens:
        hits = [(i, stop) for stop in params.stop if (i := text.find(stop)) >= 0]
        if hits:
            index, stop = min(hits, key=lambda hit: hit[0])
            sample.held = ""
            return text[: index + len(stop) if params.include_stop_str_in_output else index], True
    if finishing:
        sample.held = ""
        return text, False
    keep = held_back(text, params.stop)
    sample.held = text[len(text) - keep :] if keep else ""
    return text[: len(text) - keep], False
