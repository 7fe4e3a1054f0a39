"""The policy's per-model sampling defaults in each format's own field names."""

from __future__ import annotations

from gateway.formats.sampling_defaults import apply_defaults, unset_defaults

DEFAULTS = {"temperature": 0.2, "top_p": 0.9, "max_tokens": 64}


def test_a_field_the_client_set_under_any_of_its_names_is_not_defaulted() -> None:
    chat = {"max_completion_tokens": 5, "temperature": None}
    assert unset_defaults("openai_chat", chat, DEFAULTS) == {"temperature": 0.2, "top_p": 0.9}
    assert unset_defaults("openai_chat", {"max_tokens": 5}, DEFAULTS).keys() == {
        "temperature",
        "top_p",
    }
    responses = {"max_output_tokens": 9, "top_p": 1.0}
    assert unset_defaults("openai_responses", responses, DEFAULTS) == {"temperature": 0.2}
    assert unset_defaults("openai_chat", {}, {**DEFAULTS, "top_p": None}) == {
        "temperature": 0.2,
        "max_tokens": 64,
    }


def test_defaults_are_written_in_the_targets_names() -> None:
    values = {"temperature": 0.2, "max_tokens": 64}
    assert apply_defaults("openai_chat", {"model": "m"}, values) == {
        "model": "m",
        "temperature": 0.2,
        "max_completion_tokens": 64,
    }
    assert apply_defaults("openai_chat", {}, values, legacy=True) == {
        "temperature": 0.2,
        "max_tokens": 64,
    }
    assert apply_defaults("openai_responses", {}, values)["max_output_tokens"] == 64
    # an Anthropic render always carries max_tokens: the model's default replaces it
    assert apply_defaults("anthropic_messages", {"max_tokens": 4096}, values)["max_tokens"] == 64
    body = {"model": "m"}
    assert apply_defaults("openai_chat", body, {}) is body
