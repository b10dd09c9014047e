"""`python -m pdjax.serve` as a subprocess on a free loopback port, for the tests that need the
real server process (its signals, its exit code, its own resident memory)."""

import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_server(args: list[str], workdir: str, log, timeout_s: float = 300.0,
                 poll_s: float = 0.5) -> tuple[subprocess.Popen, str]:
  """Starts the server with `args` (besides --port and --workdir), its output to the open file
  `log`, and waits until /health answers 200; (process, base URL)."""
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  proc = subprocess.Popen([sys.executable, "-m", "pdjax.serve", *args, f"--port={port}",
                           f"--workdir={workdir}"], stdout=log, stderr=subprocess.STDOUT)
  deadline = time.monotonic() + timeout_s
  while True:
    assert proc.poll() is None, open(log.name).read()[-3000:]
    try:
      if httpx.get(f"{url}/health", timeout=2).status_code == 200:
        return proc, url
    except httpx.HTTPError:
      pass
    assert time.monotonic() < deadline, f"the server did not come up in {timeout_s:g} s"
    time.sleep(poll_s)
