"""Operator tools run with ``python -m``: the gateway benchmark, the validation benchmark, the
soak run and the fake upstream they drive."""
