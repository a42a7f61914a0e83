"""Ctrl-C at many moments of a real training run, from a parent process (the measurement behind docs/data-safety.md's
Ctrl-C figures; tests/test_ctrl_c.py plants the signal at named points instead):

    python -m maxscore.testing.ctrl_c_moments --moments=20 --output_dir=out/ctrl_c

One uninterrupted run of scripts/train_reranker.py (the embedded default, LoRA on the backbone, a checkpoint every
2 steps) is timed; then for each of `moments` times spread evenly over that wall time (start-up, the first
compile, steps, checkpoint saves, the end) a fresh run gets SIGINT from this process. Each interrupted run must
exit 130 with one line on stderr and no traceback, and the same command must then finish with the uninterrupted
run's losses and final params. A run that exits 0 is counted apart, with whether its work was done (its
summary.json written) before the signal was sent; after its work is done a script ignores SIGINT while the
interpreter winds down (maxscore/interrupt.ignore_from_now).
"""

import argparse
import json
import pathlib
import signal
import subprocess
import sys
import time

from maxscore.distributed import processes

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAIN_FLAGS = ["--train_backbone", "--lora_rank=4", "--lora_alpha=8", "--max_train_queries=8", "--max_dev_queries=3",
               "--max_query_tokens=8", "--max_item_tokens=24", "--batch_size=2", "--num_steps=8", "--eval_every=4",
               "--save_every=2", "--keep_checkpoints=2", "--warmup_steps=2", "--learning_rate=1e-3", "--noprogress"]


def _command(workdir: pathlib.Path) -> list[str]:
  return [sys.executable, str(REPO / "scripts" / "train_reranker.py"), f"--workdir={workdir}", *TRAIN_FLAGS]


def _finished(workdir: pathlib.Path) -> tuple[list, str]:
  """(the train losses by step, the final params digest) of a finished run."""
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = sorted({r["step"]: r["loss"] for r in rows if r["kind"] == "train"}.items())
  return losses, json.loads((workdir / "summary.json").read_text())["params_sha256"]


def measure(moments: int, root: pathlib.Path) -> dict:
  env = processes.subprocess_env(1)
  start = time.perf_counter()
  done = subprocess.run(_command(root / "uninterrupted"), env=env, capture_output=True, text=True, timeout=900)
  wall = time.perf_counter() - start
  if done.returncode != 0:
    raise RuntimeError(f"the uninterrupted run failed: {done.stderr[-2000:]}")
  want = _finished(root / "uninterrupted")
  rows = []
  for i in range(moments):
    at = wall * (i + 0.5) / moments
    workdir = root / f"moment_{i:02d}"
    proc = subprocess.Popen(processes.with_sigint(_command(workdir)), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(at)
    proc.send_signal(signal.SIGINT)
    signalled = time.time()
    _, err = proc.communicate(timeout=900)
    lines = err.strip().splitlines()
    row = {"moment_s": round(at, 2), "exit": proc.returncode, "stderr_lines": len(lines),
           "last_line": lines[-1] if lines else "", "traceback": "Traceback" in err}
    if proc.returncode == 0:  # whether the run's work was done (summary.json written) when the signal was sent
      row["finished_before_the_signal"] = (workdir / "summary.json").stat().st_mtime <= signalled
    if proc.returncode == 130:
      again = subprocess.run(_command(workdir), env=env, capture_output=True, text=True, timeout=900)
      row["resumed_exit"] = again.returncode
      row["resumed_equal"] = again.returncode == 0 and _finished(workdir) == want
    rows.append(row)
    print(json.dumps(row), flush=True)
  stopped = [r for r in rows if r["exit"] != 0]
  return {"uninterrupted_wall_s": round(wall, 1), "moments": moments, "rows": rows,
          "exited_0": sum(r["exit"] == 0 for r in rows),
          "ended_after_the_signal": sum(r["exit"] == 0 and not r["finished_before_the_signal"] for r in rows),
          "stopped_one_line_130": sum(r["exit"] == 130 and r["stderr_lines"] == 1 and not r["traceback"]
                                      for r in stopped),
          "stopped": len(stopped), "resumed_equal": sum(bool(r.get("resumed_equal")) for r in stopped)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--moments", type=int, default=20)
  parser.add_argument("--output_dir", required=True)
  args = parser.parse_args()
  root = pathlib.Path(args.output_dir)
  root.mkdir(parents=True, exist_ok=False)
  report = measure(args.moments, root)
  (root / "report.json").write_text(json.dumps(report, indent=2) + "\n")
  print(json.dumps({k: v for k, v in report.items() if k != "rows"}))


if __name__ == "__main__":
  main()
