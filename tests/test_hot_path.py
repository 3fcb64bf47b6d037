"""Issue 15 hot path: what keeps /shortlist lean stays in place."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_serve_caps_blas_threads_before_numpy_loads() -> None:
    # `shortlist serve` sets OPENBLAS_NUM_THREADS=1 in main(), which only works if nothing the
    # module imports has loaded numpy yet. When it had (a type-only import), each 4,000-tool
    # matrix-vector product ran on two BLAS threads and took ~17 ms instead of 0.7 ms under
    # load: 38 -> 13 ms of CPU per /shortlist at N = 4,000 once fixed.
    code = "import sys, service.cli; assert 'numpy' not in sys.modules, 'numpy imported early'"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_request_dependencies_run_on_the_event_loop() -> None:
    # A plain `def` dependency costs a worker-thread hop per request (py-spy, issue 15).
    from service import deps

    for dependency in (deps.get_core, deps.get_metrics, deps.get_settings, deps.get_caller_id):
        assert inspect.iscoroutinefunction(dependency), dependency.__name__
