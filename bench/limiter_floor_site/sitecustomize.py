"""Python imports this at start-up when this folder is on ``PYTHONPATH``: the gateway that
``bench.parts`` serves as "key without limits + one round trip" (``bench/limiter_floor.py``)."""

from bench.limiter_floor import install

install()
