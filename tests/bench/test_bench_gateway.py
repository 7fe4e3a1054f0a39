"""The gateway bench's readings: wrk's report, and a process's CPU time."""

import os
import time

from bench.gateway import parse_wrk, process_cpu_s

WRK_REPORT = """Running 5s test @ http://127.0.0.1:8080/v1/chat/completions
  1 threads and 1 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   829.52us  301.10us  10.52ms   98.10%
    Req/Sec     1.21k    40.12     1.30k    72.00%
  Latency Distribution
     50%  812.00us
     75%  845.00us
     90%  901.00us
     99%    1.94ms
  6043 requests in 5.00s, 2.10MB read
  Non-2xx or 3xx responses: 3
Requests/sec:   1208.51
Transfer/sec:    430.12KB
"""


def test_wrk_report_gives_rate_latencies_count_and_errors() -> None:
    run, errors = parse_wrk(WRK_REPORT)
    assert run.rps == 1208.51
    assert run.p50_ms == 0.812
    assert run.p99_ms == 1.94
    assert run.requests == 6043
    assert errors == "Non-2xx or 3xx responses: 3"


def test_process_cpu_time_grows_with_work() -> None:
    before = process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert process_cpu_s(os.getpid()) - before >= 0.1
