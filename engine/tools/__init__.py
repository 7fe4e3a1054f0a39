"""Tools around the engine, not used to serve: the workload bench and the tiny random
checkpoint writer that tests and benchmarks load.
"""
