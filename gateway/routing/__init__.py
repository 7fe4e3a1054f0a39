"""Routing: the policy (parsed, stored, reloaded), the router that turns a request into ordered
candidates, and the dispatcher that tries them with retries, fallbacks and circuit breakers."""
