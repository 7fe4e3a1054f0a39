"""The Responses API front door: ``POST /v1/responses``, stateless.

The gateway keeps nothing between requests: ``store`` is false whatever the client says
(``store: true``, ``previous_response_id``, ``conversation``, ``background`` and
``item_reference`` items get a 400 that says so and asks for the whole conversation in
``input``). Input items, function tools, ``function_call_output`` and streaming events are the
Responses API's own. The request goes through the one pipeline: to a provider that serves the
Responses API (an ``openai_compatible`` one with ``formats: [..., openai_responses]``)
untouched with ``store: false``, to any other translated (``gateway/formats``).
"""

from __future__ import annotations

from gateway.api.v1.doors import RESPONSES
from gateway.api.v1.pipeline import door_route

routes = [door_route(RESPONSES)]
