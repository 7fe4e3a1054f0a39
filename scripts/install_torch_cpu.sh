#!/usr/bin/env bash
# `make venv` on a machine without a GPU: torch's CPU wheel, not PyPI's Linux torch (the CUDA
# build, which pulls several GB of nvidia-* wheels). Usage: install_torch_cpu.sh PYTHON PIN INDEX
#   PIN    e.g. torch==2.13.0
#   INDEX  the PyTorch CPU index (https://download.pytorch.org/whl/cpu); torch comes from there,
#          the rest from PyPI (PYPI_INDEX) as the extra index. Empty: skip it.
# Where INDEX cannot be reached within a few seconds (an offline mirror, a firewall), the pin is
# installed from pip's configured index instead, saying so: that may be the CUDA build.
set -euo pipefail
python="$1" pin="$2" index="${3:-}"
pypi="${PYPI_INDEX:-https://pypi.org/simple}"

if "$python" - "$pin" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
from packaging.requirements import Requirement
req = Requirement(sys.argv[1])
sys.exit(0 if req.specifier.contains(version(req.name), prereleases=True) else 1)
PY
  echo "==> torch: $pin already installed"
  exit 0
fi
reachable() {
  "$python" - "$1" <<'PY' 2>/dev/null
import sys, threading, urllib.request
answered = []
def probe():  # a thread: the socket timeout does not bound a DNS lookup that hangs
    try:
        urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
        answered.append(True)
    except Exception:
        pass
thread = threading.Thread(target=probe, daemon=True)
thread.start()
thread.join(6)
sys.exit(0 if answered else 1)
PY
}
if [ -n "$index" ] && reachable "$index"; then
  echo "==> torch: $pin, the CPU build, from $index (a few hundred MB)"
  "$python" -m pip install -q --index-url "$index" --extra-index-url "$pypi" "$pin"
else
  echo "==> torch: $index not reachable; $pin from pip's configured index instead" \
    "(on Linux from PyPI that is the CUDA build: several GB)"
  "$python" -m pip install -q "$pin"
fi
