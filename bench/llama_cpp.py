"""llama.cpp on the same GGUF file, run in its own Python (where `llama-cpp-python` is built),
driven from the engine's bench so both take turns in one sitting.

`LlamaCpp(python, model_file, threads)` starts `python bench/llama_cpp.py WORKER model` as a
subprocess that keeps the model loaded and answers one JSON line per request on stdin:

- `{"op": "generate", "prompt": [ids], "new_tokens": n}`: greedy decode of n tokens (EOS
  ignored: the generator never stops on it), timed from the first prompt token to the last
  token; returns the wall and CPU seconds (all threads) and the tokens.
- `{"op": "prefill", "prompt": [ids]}`: the prompt's evaluation alone, timed likewise.

The worker imports only `llama_cpp` and the standard library. `n_batch`/`n_ubatch` are
settings: with `llama-cpp-python` 0.3.36 built on an Intel Xeon, decoding several tokens in one
batch crashed and `n_batch=1, n_ubatch=1` worked; prefill then runs token by token, which
the bench reports beside the figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKER = "--worker"


class LlamaCpp:
    """The worker process, seen from the bench."""

    def __init__(
        self, python: str, model_file: Path, threads: int, n_batch: int, n_ubatch: int
    ) -> None:
        self.settings = {"threads": threads, "n_batch": n_batch, "n_ubatch": n_ubatch}
        self.process = subprocess.Popen(
            # -P: not this folder on sys.path, where this file would shadow `llama_cpp`
            [python, "-P", __file__, WORKER, str(model_file), json.dumps(self.settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.info = self._read()  # the worker's first line: its version, once loaded

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker exited ({self.process.wait()})")
        return json.loads(line)

    def request(self, **message: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def _serve(model_file: str, settings: dict[str, int]) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=model_file,
        n_ctx=2048,
        n_threads=settings["threads"],
        n_threads_batch=settings["threads"],
        n_batch=settings["n_batch"],
        n_ubatch=settings["n_ubatch"],
        verbose=False,
    )
    print(json.dumps({"llama_cpp": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        prompt = message["prompt"]
        llm.reset()
        start, cpu_start = time.perf_counter(), time.process_time()
        if message["op"] == "prefill":
            llm.eval(prompt)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            print(json.dumps({"seconds": seconds, "cpu_seconds": cpu}), flush=True)
            continue
        tokens = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            tokens.append(int(token))
            if len(tokens) == message["new_tokens"]:
                break
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens}), flush=True)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == WORKER:
    _serve(sys.argv[2], json.loads(sys.argv[3]))
