"""Starting services as real processes on free ports, for tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

LISTENING = re.compile(r"listening on (\S+):(\d+)")
START_TIMEOUT_S = 180.0


class ServiceProcess:
    """A `python -m MODULE ARGS...` child that prints `... listening on HOST:PORT` once it serves."""

    def __init__(self, module: str, *args: str, log_dir: Path, env: dict[str, str] | None = None):
        self.log_path = log_dir / f"{module.replace('.', '_')}-{os.getpid()}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, env={**os.environ, **(env or {})})
        self.address = self._wait_listening()

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = LISTENING.search(line)
            if m:
                return f"{m.group(1)}:{m.group(2)}"
        self.stop()
        raise RuntimeError(f"service did not start; its log:\n{self.log_path.read_text()[-4000:]}")

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
