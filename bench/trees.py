"""Before and after, side by side: the same gateway load against the code of several checkouts.

``python -m bench.trees BEFORE AFTER [...]`` (each a checkout of the project, e.g.
``git worktree add /tmp/before <rev>``) starts one gateway per tree, each serving its tree's own
code on its own Redis database, behind one fake upstream and one policy (this tree's, as
``make bench`` runs them, pinned the same way). Then, round after round, it drives each gateway
in turn with wrk at each concurrency, so that drift on a shared box hits every tree alike, and
prints per run and as medians: req/s, p50, and the gateway's CPU time per request (the figure
least moved by the box's other load). The last lines give each tree against the first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import orjson

from bench.gateway import (
    BODY,
    PLAIN_POLICY,
    WRK_SCRIPT,
    Run,
    bench_rig,
    create_bench_key,
    ensure_wrk,
    process_cpu_s,
    run_wrk,
    wait_http,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path, help="checkouts to compare, before first")
    parser.add_argument("--rounds", type=int, default=3, help="runs per tree and concurrency")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--concurrency", default="1,64")
    args = parser.parse_args()
    for tree in args.trees:
        if not (tree / "gateway" / "__main__.py").is_file():
            parser.error(f"trees: {tree} is not a checkout of the gateway")
    levels = [int(c) for c in args.concurrency.split(",")]
    wrk = ensure_wrk()
    names = [str(tree) for tree in args.trees]
    results: dict[tuple[str, int], list[Run]] = {}
    with bench_rig("switchyard-bench-trees-", pinned=True) as rig:
        wait_http(rig.upstream + "/models")
        policy = rig.workdir / "plain_rules.yaml"
        policy.write_text(PLAIN_POLICY.format(base_url=rig.upstream))
        cells = []
        for db, (name, tree) in enumerate(zip(names, args.trees, strict=True)):
            gateway = rig.start_gateway(
                f"tree{db}", {}, tree=tree.resolve(), redis_db=db, policy=policy
            )
            try:
                wait_http(gateway + "/healthz")
            except RuntimeError:
                log = (rig.workdir / f"tree{db}" / "gateway.log").read_text(errors="replace")
                sys.exit(f"the gateway of {name} did not start; its log ends:\n{log[-2000:]}")
            script = rig.workdir / f"tree{db}.lua"
            auth = f'wrk.headers["Authorization"] = "Bearer {create_bench_key(gateway)}"'
            script.write_text(WRK_SCRIPT.format(body=orjson.dumps(BODY).decode(), auth=auth))
            url = gateway + "/v1/chat/completions"
            run_wrk(wrk, url, script, 16, 2)  # warm-up: pools, caches
            cells.append((name, rig.gateways[gateway].pid, url, script))
        for round_number in range(1, args.rounds + 1):
            for level in levels:
                for name, pid, url, script in cells:
                    cpu_before = process_cpu_s(pid)
                    run = run_wrk(wrk, url, script, level, args.duration)
                    if run.requests:
                        cpu_us = (process_cpu_s(pid) - cpu_before) / run.requests * 1e6
                        run = replace(run, cpu_us=cpu_us)
                    results.setdefault((name, level), []).append(run)
                    print(
                        f"round {round_number} c{level} {name}: {run.rps:,.0f} req/s, "
                        f"p50 {run.p50_ms:.3f} ms, {run.cpu_us:.0f} µs CPU/request",
                        flush=True,
                    )
    _report(names, levels, results)


def _report(names: list[str], levels: list[int], results: dict[tuple[str, int], list[Run]]) -> None:
    def median(name: str, level: int, field: str) -> float:
        return statistics.median(getattr(run, field) for run in results[(name, level)])

    print("\nmedians (req/s, p50, gateway CPU per request; ratio to the first tree)")
    for level in levels:
        first_rps, first_cpu = median(names[0], level, "rps"), median(names[0], level, "cpu_us")
        for name in names:
            rps, cpu = median(name, level, "rps"), median(name, level, "cpu_us")
            print(
                f"c{level:<4} {rps:>8,.0f} req/s ({rps / first_rps:.3f}x)  "
                f"p50 {median(name, level, 'p50_ms'):.3f} ms  "
                f"{cpu:>5.0f} µs CPU ({cpu / first_cpu:.3f}x)  {name}"
            )


if __name__ == "__main__":
    main()
