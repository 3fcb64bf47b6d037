"""`make test` does its own set-up: scripts/system-deps.sh installs the Debian packages the tests
need when root, and otherwise stops at once with one message naming them (issue 21)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "system-deps.sh"
BASH = shutil.which("bash") or "/bin/bash"
PACKAGES = ["redis-server", "prometheus", "chromium", "chromium-driver", "curl", "nodejs", "npm"]
# Runs the non-root cases as `nobody` when the suite runs as root (as CI does), directly otherwise.
NOBODY = ([shutil.which("setpriv") or "/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
           "--clear-groups"] if os.geteuid() == 0 else [])


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A scratch directory `nobody` can enter (pytest's own sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="system-deps-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _bin_dir(tmp_path: Path, *commands: str) -> Path:
    """A PATH directory holding only `commands` (links to the real ones or empty stand-ins)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in commands:
        real = shutil.which(name)
        target = bin_dir / name
        if real:
            target.symlink_to(real)
        else:
            target.write_text("#!/bin/sh\nexit 0\n")
            target.chmod(0o755)
    return bin_dir


def _fake_apt(bin_dir: Path, log: Path) -> None:
    """An apt-get that records its arguments and the service policy in force while it runs."""
    script = bin_dir / "apt-get"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "args: $*" >> {log}\n'
        f'if [ -x "$SYSTEM_DEPS_POLICY_RC" ]; then "$SYSTEM_DEPS_POLICY_RC" x start; '
        f'echo "policy: $?" >> {log}; else echo "policy: none" >> {log}; fi\n'
    )
    script.chmod(0o755)


def test_non_root_missing_everything_one_message_fast(tmp_path: Path) -> None:
    bin_dir = _bin_dir(tmp_path)
    started = time.monotonic()
    proc = subprocess.run([*NOBODY, BASH, str(SCRIPT)], env={"PATH": str(bin_dir)},
                          capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 10
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for package in PACKAGES:
        assert package in lines[0]
    assert "apt-get install" in lines[0]


def test_make_test_as_non_root_stops_before_the_virtualenv(tmp_path: Path) -> None:
    """The Makefile runs the check first: no venv is created, make fails with the message."""
    bin_dir = _bin_dir(tmp_path, "make", "env", "bash", "sh")
    venv = tmp_path / "venv"
    proc = subprocess.run(
        [*NOBODY, str(bin_dir / "make"), "-C", str(ROOT), "test", f"VENV={venv}"],
        env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "not installed: redis-server prometheus chromium chromium-driver curl nodejs npm" in proc.stderr
    assert not venv.exists()


def test_root_installs_only_what_is_missing_without_daemons(tmp_path: Path) -> None:
    bin_dir = _bin_dir(tmp_path, "redis-server", "chromium", "curl", "node", "chmod", "rm")
    log = tmp_path / "apt.log"
    policy = tmp_path / "policy-rc.d"
    _fake_apt(bin_dir, log)
    proc = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir), "SYSTEM_DEPS_POLICY_RC": str(policy)})
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "args: update -qq"
    assert calls[2] == "args: install -y -qq prometheus chromium-driver npm"
    # every service start is refused (101) while apt runs; the policy is gone afterwards
    assert calls[1] == calls[3] == "policy: 101"
    assert not policy.exists()


def test_root_keeps_an_existing_policy(tmp_path: Path) -> None:
    bin_dir = _bin_dir(tmp_path, "chmod", "rm")
    log = tmp_path / "apt.log"
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 104\n")
    policy.chmod(0o755)
    _fake_apt(bin_dir, log)
    proc = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir), "SYSTEM_DEPS_POLICY_RC": str(policy)})
    assert proc.returncode == 0, proc.stderr
    assert "policy: 104" in log.read_text()
    assert policy.read_text() == "#!/bin/sh\nexit 104\n"


def test_nothing_missing_is_a_silent_no_op(tmp_path: Path) -> None:
    bin_dir = _bin_dir(tmp_path, "redis-server", "promtool", "chromium", "chromedriver", "curl", "node", "npm")
    proc = subprocess.run([*NOBODY, BASH, str(SCRIPT)], env={"PATH": str(bin_dir)},
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_ci_is_the_one_line_call() -> None:
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines == ['cd "$(dirname "$0")/.." && exec make test']
