"""Sharded meshes and multi-process runs (docs/ARCHITECTURE.md section 8).

Several devices need XLA_FLAGS before jax is imported, and conftest.py pins the test
process to one, so the multi-device checks run this file as a script in subprocesses:
`python tests/test_mesh.py devices` (one process, 4 CPU devices) and
`python tests/test_mesh.py worker ...` (one of several jax.distributed processes).
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
LABELS = [10, 20, 30]
MESHES = {  # name -> mesh overrides; tiny-qwen3 has 4 heads and 2 kv heads
    "data4": dict(ici_data_parallelism=4),
    "tensor2_data2": dict(ici_data_parallelism=2, ici_tensor_parallelism=2),
    "fsdp2_tensor2": dict(ici_data_parallelism=1, ici_fsdp_parallelism=2, ici_tensor_parallelism=2),
}


def requests(n: int = 4, small: bool = False) -> list[dict]:
  """Deterministic requests with empty, short and longer items; `small` ones share one shape bucket."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(7)
  out = []
  for i in range(n):
    lens = rng.integers(0, 5, 3) if small else rng.integers(0, 9, 3 + i % 3)
    items = [rng.integers(5, 500, int(k)).tolist() for k in lens]
    query = rng.integers(5, 500, 5 + i if small else 5 + 4 * i).tolist()
    out.append(dict(query=query, items=items, label_token_ids=LABELS))
  return out


def algorithm(qid: int) -> str:
  return ("packed", "prefill_extend")[qid % 2]


def score_config(**overrides):
  from maxscore.config import load_config  # pylint: disable=g-import-not-at-top
  return load_config({"attention": "shared_prefix", "separator_token_id": 3, **overrides})


# --- subprocess entry points ---------------------------------------------------------------
def run_devices() -> None:
  """4 CPU devices, one process: scores on each mesh vs one device, and errors before compiling."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from layers.sharding import ShardingError  # pylint: disable=g-import-not-at-top
  from maxscore.distributed.mesh import MeshError  # pylint: disable=g-import-not-at-top
  from maxscore.scoring.scorer import Scorer  # pylint: disable=g-import-not-at-top
  assert jax.device_count() == 4
  reqs, report = requests(4, small=True), {"errors": {}, "specs": {}, "diff": {}}
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, *_, **__: compiles.append(name) if name.endswith("backend_compile_duration") else None)
  for name, over in {"product": dict(ici_data_parallelism=3), "kv_heads": dict(ici_tensor_parallelism=4)}.items():
    try:  # first thing in a fresh process: nothing may be compiled before the error
      Scorer.from_config(score_config(**over))
      report["errors"][name] = None
    except (MeshError, ShardingError) as e:
      report["errors"][name] = f"{type(e).__name__}: {e}"
  report["compiles_before_errors"] = len(compiles)
  one = Scorer.from_config(score_config(), mesh=None)
  ref = {a: [r.scores for r in one.score_batch(reqs, algorithm=a)] for a in ("packed", "prefill_extend")}
  for name, over in MESHES.items():
    scorer = Scorer.from_config(score_config(**over))
    report["specs"][name] = [dict(scorer.mesh.shape),
                             str(tuple(scorer.runner.params["embed"]["embedding"].sharding.spec)),
                             str(tuple(scorer.runner.params["layers"]["attn"]["k"].sharding.spec))]
    for a, want in ref.items():  # ahead-of-time warmup on the mesh, then scoring compiles nothing new
      geometries = [(len(r["query"]) + 1, len(r["items"]), 4) for r in reqs] + [(6, 3, 4, len(reqs))]
      scorer.warmup(geometries, algorithm=a, num_labels=len(LABELS))
      before = scorer.runner.num_executables
      got = [r.scores for r in scorer.score_batch(reqs, algorithm=a)]
      report["diff"][f"{name}/{a}"] = float(max(np.abs(g - w).max() for g, w in zip(got, want)))
      report["specs"][name].append(scorer.runner.num_executables - before)
  for kernel in ("splash", "pallas_gpu"):  # Pallas kernels (interpreted on CPU) run per shard under shard_map
    kw = dict(attention=kernel, kernel_interpret=True)
    want = [r.scores for r in Scorer.from_config(score_config(**kw), mesh=None).score_batch(reqs, algorithm="packed")]
    scorer = Scorer.from_config(score_config(**kw, **MESHES["tensor2_data2"]))
    got = [r.scores for r in scorer.score_batch(reqs, algorithm="packed")]
    report["diff"][f"tensor2_data2/packed/{kernel}"] = float(max(np.abs(g - w).max() for g, w in zip(got, want)))
  print("REPORT " + json.dumps(report), flush=True)


def run_worker(args) -> None:
  """One of `num_processes` processes: scores its data group's slice; process 0 appends results to a JSONL."""
  from maxscore.distributed import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  info = mesh_lib.initialize_distributed(f"127.0.0.1:{args.port}", args.num_processes, args.process_id,
                                         initialization_timeout_s=args.init_timeout, heartbeat_timeout_s=20)
  from maxscore.scoring.scorer import Scorer  # pylint: disable=g-import-not-at-top
  cfg = score_config(**json.loads(args.mesh))
  group = mesh_lib.my_group(cfg.mesh)
  print(f"process {info.index}/{info.count}: group {group.index}/{group.count} processes {group.processes} "
        f"mesh {dict(group.mesh.shape)}", flush=True)
  scorer = Scorer.from_checkpoint(args.ckpt, attention="shared_prefix", separator_token_id=3, **json.loads(args.mesh))
  assert scorer.mesh.devices.tolist() == group.mesh.devices.tolist()  # mesh="auto" is this process's group
  out = pathlib.Path(args.out)
  done = None
  if info.index == 0:  # resume: process 0 owns the output and tells the others what is done
    done = [json.loads(line)["qid"] for line in out.read_text().splitlines()] if out.exists() else []
  done = set(mesh_lib.broadcast_from_process0(done))
  reqs = requests(args.num_queries)
  todo = [q for q in range(len(reqs)) if q not in done]
  mine = [todo[i] for i in mesh_lib.query_slice(len(todo), group.index, group.count)]
  for r in range(mesh_lib.num_rounds(len(todo), group.count)):
    records = []
    if r < len(mine):
      q = mine[r]
      result = scorer.score_batch([reqs[q]], algorithm=algorithm(q))[0]
      records.append({"qid": q, "scores": result.scores.tolist(), "group": group.index})
    gathered = mesh_lib.gather_to_process0(records, contribute=group.is_leader)
    if gathered is not None:
      with open(out, "a") as f:
        for rec in sorted(gathered, key=lambda x: x["qid"]):
          f.write(json.dumps(rec) + "\n")
    print(f"process {info.index}: round {r} done", flush=True)
  mesh_lib.sync("worker_done")
  print(f"process {info.index}: finished", flush=True)


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("mode", choices=["devices", "worker"])
  parser.add_argument("--process_id", type=int, default=0)
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--port", type=int, default=0)
  parser.add_argument("--ckpt", default="")
  parser.add_argument("--out", default="")
  parser.add_argument("--mesh", default="{}")
  parser.add_argument("--num_queries", type=int, default=4)
  parser.add_argument("--init_timeout", type=int, default=120)
  a = parser.parse_args()
  sys.path.insert(0, str(ROOT))
  run_devices() if a.mode == "devices" else run_worker(a)
  sys.exit(0)


# --- tests ---------------------------------------------------------------------------------
import jax  # noqa: E402  (after the script part: the subprocesses set XLA_FLAGS first)
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AbstractMesh  # noqa: E402

from layers.config import ModelConfig  # noqa: E402
from layers.sharding import MESH_AXES, ShardingError, batch_axes, check_divisible, rules_for_batch  # noqa: E402
from maxscore.distributed import mesh as mesh_lib  # noqa: E402
from maxscore.config import MeshConfig  # noqa: E402
from maxscore.distributed.processes import free_port as _free_port  # noqa: E402
from maxscore.distributed.processes import subprocess_env as _env  # noqa: E402


def test_mesh_must_match_the_device_count():
  devices = jax.devices()[:1]
  with pytest.raises(mesh_lib.MeshError, match=r"ici_data_parallelism=2 .* = 2, but there are 1 devices"):
    mesh_lib.create_mesh(MeshConfig(ici_data_parallelism=2), devices)
  with pytest.raises(mesh_lib.MeshError, match="at most one of"):
    mesh_lib.create_mesh(MeshConfig(ici_data_parallelism=-1, ici_tensor_parallelism=-1), devices)
  with pytest.raises(mesh_lib.MeshError, match="ici_fsdp_parallelism=0"):
    mesh_lib.create_mesh(MeshConfig(ici_fsdp_parallelism=0), devices)
  mesh = mesh_lib.create_mesh(MeshConfig(), devices)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
  assert mesh_lib.data_group(mesh).count == 1


def test_divisibility_names_the_dimension_and_the_axis():
  model = ModelConfig(num_heads=4, num_kv_heads=2)
  with pytest.raises(ShardingError, match="num_kv_heads=2 is not divisible by tensor=4"):
    check_divisible(model, AbstractMesh((1, 1, 4), MESH_AXES))
  with pytest.raises(ShardingError, match="hidden_size=64 is not divisible by fsdp=3"):
    check_divisible(model, AbstractMesh((1, 3, 1), MESH_AXES))
  check_divisible(model, AbstractMesh((8, 2, 2), MESH_AXES))
  check_divisible(model, None)


def test_batches_split_over_the_data_axes_that_divide_them():
  mesh = AbstractMesh((2, 2, 2), MESH_AXES)
  assert batch_axes(8, mesh) == ("data", "fsdp") and batch_axes(2, mesh) == ("data",) and batch_axes(1, mesh) is None
  assert dict(rules_for_batch(1, mesh))["activation_batch"] is None
  assert dict(rules_for_batch(4, mesh))["activation_batch"] == ("data", "fsdp")
  assert batch_axes(4, None) is None


def test_query_slices_cover_every_query_once():
  for n, groups in [(0, 3), (7, 3), (8, 2), (3, 5)]:
    slices = [list(mesh_lib.query_slice(n, g, groups)) for g in range(groups)]
    assert sorted(sum(slices, [])) == list(range(n))
    assert max(map(len, slices)) == mesh_lib.num_rounds(n, groups)
  with pytest.raises(ValueError, match="group_index=2"):
    mesh_lib.query_slice(5, 2, 2)


def test_a_groups_batch_devices_are_its_data_by_fsdp_devices():
  """How many ways a data group's mesh splits a call's rows (an eval warns when it is more than one)."""
  group = lambda shape: mesh_lib.DataGroup(0, 1, None if shape is None else types.SimpleNamespace(shape=shape), (0,))
  assert group(None).batch_devices == 1
  assert group({"data": 1, "fsdp": 1, "tensor": 2}).batch_devices == 1
  assert group({"data": 4, "fsdp": 1, "tensor": 2}).batch_devices == 4
  assert group({"data": 2, "fsdp": 2, "tensor": 1}).batch_devices == 4


def test_single_process_helpers_are_local(monkeypatch):
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri",
            "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(k, raising=False)
  assert mesh_lib.initialize_distributed() == mesh_lib.Processes(0, 1, "single process")
  assert mesh_lib.initialize_distributed(num_processes=1, process_id=0).count == 1
  recs = [{"qid": 1, "scores": np.float32([0.5, 0.25])}]
  assert mesh_lib.gather_to_process0(recs) == recs
  assert mesh_lib.gather_to_process0(recs, contribute=False) == []
  assert mesh_lib.broadcast_from_process0([1, 2]) == [1, 2]


def test_a_heartbeat_timeout_too_short_is_refused():
  with pytest.raises(mesh_lib.DistributedError, match=r"heartbeat_timeout_s=2 is too short.*at least 6"):
    mesh_lib.initialize_distributed("127.0.0.1:1", 2, 0, heartbeat_timeout_s=2)


def test_missing_peer_is_a_clear_error_not_a_hang():
  code = ("from maxscore.distributed import mesh\n"
          f"mesh.initialize_distributed('127.0.0.1:{_free_port()}', 2, 0, initialization_timeout_s=3)\n")
  t = time.time()
  p = subprocess.run([sys.executable, "-c", code], env=_env(1), capture_output=True, text=True, timeout=120)
  assert p.returncode != 0 and time.time() - t < 60
  assert "DistributedError: process 0 of 2" in p.stderr and "a peer process is missing" in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
def test_meshes_on_four_devices_match_one_device():
  p = subprocess.run([sys.executable, str(ROOT / "tests" / "test_mesh.py"), "devices"], env=_env(4),
                     capture_output=True, text=True, timeout=900)
  lines = [l for l in p.stdout.splitlines() if l.startswith("REPORT ")]
  assert p.returncode == 0 and lines, p.stderr[-3000:]
  report = json.loads(lines[0][len("REPORT "):])
  assert len(report["diff"]) == 2 * len(MESHES) + 2
  for key, diff in report["diff"].items():
    assert diff <= 1e-5, key
  assert report["specs"]["fsdp2_tensor2"][:3] == [{"data": 1, "fsdp": 2, "tensor": 2}, "('tensor', 'fsdp')",
                                                  "(None, 'fsdp', 'tensor', None)"]
  assert report["specs"]["data4"][0] == {"data": 4, "fsdp": 1, "tensor": 1}
  assert all(spec[3:] == [0, 0] for spec in report["specs"].values()), report["specs"]  # warmup covered all
  assert "ici_data_parallelism=3" in report["errors"]["product"] and "4 devices" in report["errors"]["product"]
  assert "num_kv_heads=2 is not divisible by tensor=4" in report["errors"]["kv_heads"]
  assert report["compiles_before_errors"] == 0


# --- several processes ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint_and_reference(tmp_path_factory):
  """A tiny checkpoint and its single-process, one-device scores per query id."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from layers.decoder import Decoder, init_params  # pylint: disable=g-import-not-at-top
  from layers.kernels import get_kernel  # pylint: disable=g-import-not-at-top
  from maxscore.checkpoints.storage import save_checkpoint  # pylint: disable=g-import-not-at-top
  from maxscore.scoring.scorer import Scorer  # pylint: disable=g-import-not-at-top
  model = score_config().model
  params = nn.unbox(init_params(Decoder(model, get_kernel("reference")), jax.random.PRNGKey(5)))
  ckpt = save_checkpoint(tmp_path_factory.mktemp("mesh") / "ckpt", params, model)
  scorer = Scorer.from_checkpoint(ckpt, mesh=None, attention="shared_prefix", separator_token_id=3)
  reqs = requests(5)
  return ckpt, {q: scorer.score_batch([reqs[q]], algorithm=algorithm(q))[0].scores for q in range(len(reqs))}


def _launch(ckpt, out, mesh, port, num_queries=5):
  cmd = lambda pid: [sys.executable, "-u", str(ROOT / "tests" / "test_mesh.py"), "worker", "--process_id", str(pid),
                     "--num_processes", "2", "--port", str(port), "--ckpt", str(ckpt), "--out", str(out),
                     "--mesh", json.dumps(mesh), "--num_queries", str(num_queries)]
  logs = [open(f"{out}.p{pid}.log", "a") for pid in range(2)]
  return [subprocess.Popen(cmd(pid), env=_env(2), stdout=logs[pid], stderr=subprocess.STDOUT) for pid in range(2)]


def _wait(procs, timeout):
  t = time.time()
  try:
    return [p.wait(timeout=max(1.0, timeout - (time.time() - t))) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


def _check_output(out, reference):
  rows = [json.loads(l) for l in pathlib.Path(out).read_text().splitlines()]
  assert sorted(r["qid"] for r in rows) == sorted(reference), rows
  for r in rows:
    np.testing.assert_allclose(np.asarray(r["scores"], np.float32), reference[r["qid"]], atol=1e-5, rtol=0)
  return rows


@pytest.mark.slow
@pytest.mark.parametrize("mesh,groups", [
    ({}, 2),  # data=4 over 2 processes: each process is its own data group and scores half the queries
    (dict(ici_data_parallelism=1, ici_fsdp_parallelism=2, ici_tensor_parallelism=2), 1),  # one group across both
    (dict(dcn_data_parallelism=2, ici_data_parallelism=1, ici_tensor_parallelism=2), 2),  # hybrid: tensor per host
], ids=["two_groups", "one_group_across_processes", "dcn_data2_tensor2"])
def test_two_processes_match_one_process(tmp_path, checkpoint_and_reference, mesh, groups):
  ckpt, reference = checkpoint_and_reference
  out = tmp_path / "run.jsonl"
  t = time.time()
  codes = _wait(_launch(ckpt, out, mesh, _free_port()), timeout=600)
  logs = "".join(pathlib.Path(f"{out}.p{pid}.log").read_text()[-3000:] for pid in range(2))
  assert codes == [0, 0], logs
  rows = _check_output(out, reference)
  assert {r["group"] for r in rows} == set(range(groups)), logs
  print(f"two-process run ({groups} group(s)): {time.time() - t:.1f}s wall")
