"""A fleet of engine replicas behind one provider: who they are, how busy, which one to ask.

The parts, each usable and tested on its own, data flowing one way:

- ``discovery``: the replicas' base URLs, from a static list or a DNS name (a headless Service)
  re-resolved on the event loop;
- ``members``: the membership table (joins, draining leavers, in-flight counts);
- ``scrape``: each replica's Prometheus ``/metrics`` read into a ``ReplicaLoad`` (vLLM, SGLang
  and Switchyard names);
- ``health``: eject an unreachable replica and probe it back with backoff;
- ``prefix``: the prompt's prefix key (first blocks, in tokens or characters, a stable hash);
- ``affinity``: the consistent-hash ring and the bounded-load walk;
- ``picker``: the routing strategy (affinity, round robin, least loaded) over eligible replicas;
- ``explain``: the record every pick returns, for headers and the admin explain endpoint;
- ``fleet``: the running whole (discovery and scrape loops, picks, leases).

Nothing here imports the rest of the gateway: the provider that wires a ``Fleet`` into dispatch
lives beside it.
"""
