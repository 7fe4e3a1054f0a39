"""One key cannot take a model offline for every other key (issue 26, item 1).

The attack: a key pins a model and sends it to operations its provider has no path for (the
loopback providers serve only /v1/chat/completions, so every other path is an upstream 404).
On a gateway that counted those 404s against the breaker every tenant shares, a few of them
opened it and the next tenant's chat got ``503 no_healthy_upstream``. Now a model that names
its operations is refused at the door, and an upstream 404 of a model that names none no
longer counts, so the victim's chat is served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import yaml
from route_rig import BREAKER, RouteRig

ATTACKS = BREAKER.consecutive_failures * 2  # well past what opens a breaker


def _apply(rig: RouteRig, data: dict[str, Any]) -> None:
    with rig.admin() as admin:
        response = admin.put(
            "/admin/policy",
            content=yaml.safe_dump(data, sort_keys=False),
            headers={"content-type": "application/yaml"},
        )
    assert response.status_code == 200, response.text


def _client(rig: RouteRig, name: str) -> openai.OpenAI:
    _, key = rig.gateway.create_key(name=name)
    return openai.OpenAI(base_url=rig.gateway.v1, api_key=key, max_retries=0, timeout=20)


def _attack(call: Callable[[], Any]) -> list[tuple[int, str | None]]:
    """``ATTACKS`` refused requests: (status, code) of each."""
    answers = []
    for _ in range(ATTACKS):
        try:
            call()
        except openai.APIStatusError as error:
            answers.append((error.status_code, error.response.json()["error"].get("code")))
        else:
            raise AssertionError("the provider has no such path: the request cannot succeed")
    return answers


def _victim_chat(rig: RouteRig, model: str) -> str | None:
    with _client(rig, "victim") as victim:
        reply = victim.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
    return reply.choices[0].message.content


def test_a_chat_model_sent_to_moderations_stays_up_for_every_other_key(rig: RouteRig) -> None:
    data = rig.policy_data()
    data["models"]["m-alpha"]["capabilities"] = ["chat", "tools"]
    _apply(rig, data)
    failed_before = rig.metric(
        "switchyard_upstream_attempts_total", provider="alpha", model="m-alpha", outcome="failed"
    )
    with _client(rig, "attacker") as attacker:
        answers = _attack(lambda: attacker.moderations.create(model="m-alpha", input="hi"))
    assert _victim_chat(rig, "m-alpha") is not None
    assert rig.gateway.services.router.state.breakers.state_of("alpha", "m-alpha") == "closed"
    # Refused by the gateway itself: not one of them was sent to the provider.
    assert answers == [(404, "model_not_supported")] * ATTACKS
    failed_after = rig.metric(
        "switchyard_upstream_attempts_total", provider="alpha", model="m-alpha", outcome="failed"
    )
    assert failed_after == failed_before


def test_upstream_404s_of_a_model_naming_no_operation_do_not_open_its_breaker(
    rig: RouteRig,
) -> None:
    # m-gamma names no operation (served everywhere, as before operations were declared): its
    # provider answers 404 to /v1/embeddings, which now moves on but counts for nothing.
    with _client(rig, "attacker") as attacker:
        answers = _attack(lambda: attacker.embeddings.create(model="m-gamma", input="hi"))
    assert _victim_chat(rig, "m-gamma") is not None
    assert rig.gateway.services.router.state.breakers.state_of("gamma", "m-gamma") == "closed"
    assert [status for status, _ in answers] == [404] * ATTACKS
