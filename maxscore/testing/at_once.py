"""Several child processes that do the same thing at the same moment: each imports what it needs, says it is
ready and waits for a go file, so the part under test starts in all of them together. The processes of one job on
one host share the user cache, and these races are between them."""

import pathlib
import subprocess
import sys
import time
from typing import Mapping, Sequence

from maxscore.distributed.processes import REPO

# Between a child's imports and the part under test: the go file is its first argument.
_GATE = """
import os as _os, pathlib as _pathlib, sys as _sys, time as _time
_go = _pathlib.Path(_sys.argv[1])
(_go.parent / f"ready.{_os.getpid()}").touch()
while not _go.exists():
  _time.sleep(0.001)
"""


def run_at_once(imports: str, body: str, args: Sequence[str], count: int, env: Mapping[str, str],
                gate_dir: pathlib.Path, timeout_s: float = 300) -> list[tuple[int, str, str]]:
  """Runs `count` Pythons of `imports`, then the gate, then `body` (its arguments: sys.argv[2:] = `args`), in
  `gate_dir` (which must hold no ready files); `body` starts in all of them once all are ready. Returns each
  one's (exit status, stdout, stderr)."""
  gate_dir = pathlib.Path(gate_dir)
  go = gate_dir / "go"
  procs = [subprocess.Popen([sys.executable, "-c", imports + _GATE + body, str(go), *map(str, args)], env=dict(env),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(count)]
  try:
    while len(list(gate_dir.glob("ready.*"))) < count and all(p.poll() is None for p in procs):
      time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=timeout_s) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]
