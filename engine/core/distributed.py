"""Tensor parallelism: one worker process per rank, driven and supervised by the engine.

The engine process keeps the scheduler, the block manager and the block tables (it is the
control plane's rank 0, as in vLLM V1's multiprocess executor). Each step it broadcasts the
same `StepInputs` to every rank over that rank's pipe; the ranks run their shards with
torch.distributed collectives between them (NCCL on CUDA, gloo on the CPU — nothing else
differs), every rank writes its own paged KV cache for its heads, and rank 0 sends back the
sampled tokens.

The engine process never joins the process group, so a rank that dies or wedges cannot
block it: it waits on rank 0's reply and on every worker's liveness at once, and the first
death or error fails the step with `EngineDeadError`, kills the remaining ranks (they may
be stuck in a collective) and leaves the engine unhealthy. Collectives carry a timeout, so
a rank whose peer vanished gives up on its own as well.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core.input_batch import StepInputs
from engine.core.model_runner import ModelRunner, StepResult
from engine.errors import ConfigError, EngineDeadError, LoaderError
from engine.loader import load_model_args
from engine.models.llama import ModelArgs, ParallelSpec

log = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_S = 120.0  # backstop for a wedged (not dead) peer; deaths are seen at once
STARTUP_TIMEOUT_S = 900.0  # loading and profiling a large shard can take minutes
STEP_TIMEOUT_S = 2 * COLLECTIVE_TIMEOUT_S  # last resort; deaths are noticed at once
SHUTDOWN_GRACE_S = 5.0

# errors a rank can hit while loading that mean "bad input", not "broken engine"
_LOAD_ERRORS: tuple[type[Exception], ...] = (LoaderError, ConfigError)


@dataclass
class WorkerSpec:
    config: EngineConfig
    model_path: str
    rank: int
    world_size: int
    init_method: str
    dist_backend: str  # "nccl" on CUDA, "gloo" on the CPU
    progress: bool


@dataclass
class WorkerReady:
    num_blocks: int
    max_model_len: int
    kv_bytes_per_block: int
    weight_bytes: int
    attention_backend: str


def run_worker(spec: WorkerSpec, conn: Connection) -> None:
    """A rank's whole life: join the group, load its shard, then run every step it is sent."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # ranks share the cores; more threads each only thrash
    clean_exit = False
    try:
        if spec.dist_backend == "nccl":
            torch.cuda.set_device(spec.rank)
        dist.init_process_group(
            spec.dist_backend,
            init_method=spec.init_method,
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        runner = ModelRunner(
            spec.config,
            Path(spec.model_path),
            progress=spec.progress and spec.rank == 0,
            tp=ParallelSpec(spec.world_size, spec.rank),
        )
        ready = WorkerReady(
            num_blocks=runner.num_blocks,
            max_model_len=runner.max_model_len,
            kv_bytes_per_block=runner.kv_bytes_per_block,
            weight_bytes=runner.weight_bytes,
            attention_backend=runner.backend,
        )
        conn.send(("ready", ready))
        while True:
            try:
                inputs = conn.recv()
            except EOFError:  # the engine process is gone
                break
            if inputs is None:
                clean_exit = True
                break
            tokens = runner.execute(inputs)
            if spec.rank == 0:
                conn.send(("ok", tokens))
    except BaseException as exc:  # report why, then die: the group cannot continue anyway
        with contextlib.suppress(OSError):
            conn.send(("error", (type(exc).__name__, str(exc))))
        raise SystemExit(1) from exc
    finally:
        if clean_exit and dist.is_initialized():
            dist.destroy_process_group()


class TensorParallelExecutor:
    """Drop-in for `ModelRunner` on the engine side: `execute(StepInputs)` over N ranks."""

    def __init__(self, config: EngineConfig, model_path: Path, progress: bool = True) -> None:
        self.config = config
        self.device = config.resolve_device()
        self.args: ModelArgs = load_model_args(model_path)
        a = self.args
        config.validate_tensor_parallel(
            a.num_heads, a.num_kv_heads, a.intermediate_size, self.device
        )
        self.world_size = config.tensor_parallel_size
        self.block_size = config.block_size
        self._error: EngineDeadError | None = None
        self._closed = False
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._rendezvous = tempfile.mkdtemp(prefix="switchyard-tp-")
        dist_backend = "nccl" if self.device.type == "cuda" else "gloo"
        context = torch.multiprocessing.get_context("spawn")
        try:
            for rank in range(self.world_size):
                spec = WorkerSpec(
                    config=config,
                    model_path=str(model_path),
                    rank=rank,
                    world_size=self.world_size,
                    init_method=f"file://{self._rendezvous}/rendezvous",
                    dist_backend=dist_backend,
                    progress=progress,
                )
                ours, theirs = context.Pipe()
                proc = context.Process(
                    target=run_worker, args=(spec, theirs), name=f"tp-rank-{rank}", daemon=True
                )
                proc.start()
                theirs.close()
                self._conns.append(ours)
                self._procs.append(proc)
            ready = self._collect(set(range(self.world_size)), STARTUP_TIMEOUT_S, "start-up")
        except BaseException:
            self.shutdown()
            raise
        first: WorkerReady = ready[0]
        self.num_blocks = first.num_blocks
        self.max_model_len = first.max_model_len
        self.kv_bytes_per_block = first.kv_bytes_per_block
        self.backend = first.attention_backend
        self.weight_bytes_per_rank = [ready[r].weight_bytes for r in range(self.world_size)]

    # --- health ------------------------------------------------------------------------

    @property
    def worker_pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    @property
    def healthy(self) -> bool:
        """False once any rank has died or failed (checked without waiting)."""
        return (
            self._error is None
            and not self._closed
            and all(proc.is_alive() for proc in self._procs)
        )

    @property
    def error(self) -> EngineDeadError | None:
        if self._error is None and not self._closed:
            dead = [r for r, proc in enumerate(self._procs) if not proc.is_alive()]
            if dead:
                return EngineDeadError(self._death_message(dead[0]))
        return self._error

    # --- one step ----------------------------------------------------------------------

    def execute(self, inputs: StepInputs) -> StepResult:
        if self._closed:
            raise EngineDeadError("the tensor-parallel workers were shut down")
        if self._error is not None:
            raise EngineDeadError(f"the engine is dead: {self._error}")
        dead = [r for r, proc in enumerate(self._procs) if not proc.is_alive()]
        if dead:
            self._fail(self._death_message(dead[0]))
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(inputs)
            except OSError as exc:
                self._fail(f"rank {rank} cannot be reached ({exc}); {self._death_message(rank)}")
        return self._collect({0}, STEP_TIMEOUT_S, "step")[0]

    def _collect(self, ranks: set[int], timeout: float, what: str) -> dict[int, Any]:
        """Wait for one message from each of `ranks`; any death or error fails the engine."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self._procs)}
        while len(got) < len(ranks):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(ranks - set(got))
                self._fail(f"rank {missing[0]} did not answer within {timeout:.0f} s ({what})")
            ready = wait([*self._conns, *sentinels], timeout=remaining)
            for rank, conn in enumerate(self._conns):
                if conn in ready:
                    kind, payload = self._receive(rank, what)
                    if kind == "error":
                        self._fail_with(rank, what, *payload)
                    if rank not in ranks or rank in got:
                        self._fail(f"rank {rank} sent an unexpected {kind!r} during {what}")
                    got[rank] = payload
            for sentinel, rank in sentinels.items():
                if sentinel in ready:
                    if self._conns[rank].poll():  # its last words explain the death
                        kind, payload = self._receive(rank, what)
                        if kind == "error":
                            self._fail_with(rank, what, *payload)
                    self._fail(self._death_message(rank) + f" during {what}")
        return got

    def _receive(self, rank: int, what: str) -> tuple[str, Any]:
        try:
            return self._conns[rank].recv()
        except (EOFError, OSError):
            self._fail(self._death_message(rank) + f" during {what}")
            raise  # unreachable: _fail raises

    def _death_message(self, rank: int) -> str:
        proc = self._procs[rank]
        proc.join(0.1)
        code = proc.exitcode
        how = "is gone" if code is None else f"exited with code {code}"
        if code is not None and code < 0:
            how = f"was killed by signal {-code}"
        return f"tensor-parallel rank {rank} (pid {proc.pid}) {how}"

    def _fail_with(self, rank: int, what: str, error_type: str, message: str) -> None:
        """A rank reported an exception. A bad checkpoint or setting found while loading
        raises the same type as with one rank (`LoaderError`, `ConfigError`)."""
        load_error = next((e for e in _LOAD_ERRORS if e.__name__ == error_type), None)
        if what == "start-up" and load_error is not None:
            self._kill_workers()
            self._error = EngineDeadError(f"rank {rank}: {error_type}: {message}")
            raise load_error(message)
        failed = f"rank {rank} failed during {what}: {error_type}: {message}"
        dead = self._dead_peer(rank)
        if dead is not None:  # a collective fails on the survivors once a peer dies: name the cause
            self._fail(f"{self._death_message(dead)} during {what} ({failed})")
        self._fail(failed)

    def _dead_peer(self, rank: int, grace_s: float = 1.0) -> int | None:
        """Another rank that died, waiting up to ``grace_s`` for its exit to show (a survivor's
        collective can report the broken connection before the dead rank's exit is seen)."""
        others = {proc.sentinel: r for r, proc in enumerate(self._procs) if r != rank}
        for sentinel in wait(list(others), timeout=grace_s):
            return others[sentinel]
        return None

    def _fail(self, message: str) -> None:
        """Mark the engine dead, stop every rank (survivors may sit in a collective), raise."""
        log.error("tensor-parallel engine failed: %s", message)
        if self._error is None:
            self._error = EngineDeadError(message)
        self._kill_workers()
        raise self._error

    # --- shutdown ----------------------------------------------------------------------

    def _kill_workers(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(SHUTDOWN_GRACE_S)

    def shutdown(self) -> None:
        """Ask every rank to exit, kill what does not within the grace period. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a dead rank cannot be asked
                conn.send(None)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._kill_workers()
        for conn in self._conns:
            conn.close()
        shutil.rmtree(self._rendezvous, ignore_errors=True)
