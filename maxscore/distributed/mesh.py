"""Device meshes, multi-process start-up, and how an eval is split across processes (docs/ARCHITECTURE.md section 8).

    initialize_distributed()                  # first thing in main(): flags, env, or SLURM/TPU auto-detect
    group = my_group(config.mesh)             # this process's data group
    scorer = Scorer.from_checkpoint(ckpt)     # mesh="auto" is group.mesh; params restored into it
    for r in range(num_rounds(len(todo), group.count)):      # every process, same count
      mine = ...todo[query_slice(len(todo), group.index, group.count)[r]] when it exists
      records = gather_to_process0(mine, contribute=group.is_leader)   # process 0: all of them; others: None

The mesh has axes ("data", "fsdp", "tensor"). Its data rows are split into *data groups*:
rows whose devices share a process belong to the same group. A group is an independent
model replica that scores its own slice of the queries; inside it, batches are split over
its data/fsdp devices and heads/mlp over tensor. Groups exchange nothing while scoring,
only at gathers (gather every few queries to make those rarer). The processes of one group
(a model sharded across hosts) make the same calls in lockstep.

Results reach process 0 through `process_allgather` of JSON bytes rather than per-process
files: it needs no shared filesystem (TPU pod workers each have their own disk), and a
dead peer makes the collective fail instead of leaving a silently short output.
"""

import dataclasses
import json
import math
import os
import sys
import threading
from typing import Any, Optional, Sequence

import jax
import numpy as np
from absl import logging
from jax._src import distributed as jax_distributed  # the runtime's client: JAX has no public handle to it
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import Mesh

from layers.sharding import BATCH_AXES, MESH_AXES
from maxscore.config import MeshConfig
from maxscore.distributed import peers

class MeshError(ValueError):
  """The mesh config does not match the devices."""


class DistributedError(RuntimeError):
  """The multi-process runtime could not start, or a peer process was lost."""


# --- meshes ---------------------------------------------------------------------------
def _fill(values: Sequence[int], total: int, keys: Sequence[str], what: str) -> list[int]:
  """Replaces one -1 with whatever makes the product `total`; errors name the keys and the count."""
  values = list(values)
  bad = [f"{k}={v}" for k, v in zip(keys, values) if v == 0 or v < -1]
  if bad:
    raise MeshError(f"{', '.join(bad)}: parallelism must be a positive integer or -1 (fill)")
  if values.count(-1) > 1:
    raise MeshError(f"at most one of {', '.join(keys)} may be -1 (fill); got "
                    + ", ".join(f"{k}={v}" for k, v in zip(keys, values)))
  known = math.prod(v for v in values if v != -1)
  desc = " x ".join(f"{k}={v}" for k, v in zip(keys, values))
  if -1 in values:
    if total % known:
      raise MeshError(f"{desc}: the fixed values (product {known}) do not divide the {total} {what}")
    values[values.index(-1)] = total // known
  elif known != total:
    raise MeshError(f"{desc} = {known}, but there are {total} {what}; the product must equal {total} "
                    f"(or set one of them to -1 to fill)")
  return values


def _granules(devices: Sequence[Any]) -> tuple[str, int]:
  """('slice', n) for multi-slice TPU devices, else ('process', number of processes)."""
  slices = {getattr(d, "slice_index", None) for d in devices}
  if None not in slices and len(slices) > 1:
    return "slice", len(slices)
  return "process", len({d.process_index for d in devices})


def create_mesh(cfg: MeshConfig, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """The ("data", "fsdp", "tensor") mesh from ici_* (within a slice/host) and dcn_* (across them).

  With every dcn_* equal to 1 the ici_* values lay out all devices (one slice, or CPU/GPU
  processes treated as one pool). Otherwise dcn_* splits the granules (TPU slices, or
  processes on CPU/GPU) and ici_* the devices within one. -1 fills either level.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  ici_keys = ("ici_data_parallelism", "ici_fsdp_parallelism", "ici_tensor_parallelism")
  dcn_keys = ("dcn_data_parallelism", "dcn_fsdp_parallelism", "dcn_tensor_parallelism")
  ici = [getattr(cfg, k) for k in ici_keys]
  dcn = [getattr(cfg, k) for k in dcn_keys]
  kind, granules = _granules(devices)
  if all(d == 1 for d in dcn):
    if kind == "slice":
      raise MeshError(f"the {n} devices span {granules} TPU slices, but dcn_data_parallelism x dcn_fsdp_parallelism"
                      f" x dcn_tensor_parallelism = 1; set them (e.g. dcn_data_parallelism={granules})")
    shape = _fill(ici, n, ici_keys, "devices")
    array = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  else:
    dcn = _fill(dcn, granules, dcn_keys, f"{kind}es" if kind == "process" else "slices")
    per = n // granules
    if per * granules != n:
      raise MeshError(f"{n} devices are not spread evenly over {granules} {kind}es")
    ici = _fill(ici, per, ici_keys, f"devices per {kind}")
    array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=kind == "process",
                                                 allow_split_physical_axes=True)
  return Mesh(array, MESH_AXES)


# --- data groups -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DataGroup:
  """One model replica: its sub-mesh, its index among `count` groups, and the processes that run it."""
  index: int
  count: int
  mesh: Optional[Mesh]  # None: a single device
  processes: tuple[int, ...]

  @property
  def leader(self) -> int:
    return self.processes[0]

  @property
  def is_leader(self) -> bool:
    """True on the one process per group whose results are gathered (the others hold copies)."""
    return jax.process_index() == self.leader

  @property
  def batch_devices(self) -> int:
    """How many ways the group's batch axes (data, fsdp) split a call's rows: a call whose row count they do
    not divide is computed whole on each of them (layers/sharding.batch_axes)."""
    return math.prod(self.mesh.shape[a] for a in BATCH_AXES) if self.mesh is not None else 1


def data_groups(mesh: Mesh) -> list[DataGroup]:
  """Splits the mesh's data rows into groups that share no process (ordered by first row)."""
  rows = [{d.process_index for d in mesh.devices[i].flat} for i in range(mesh.devices.shape[0])]
  parent = list(range(len(rows)))

  def root(i):
    while parent[i] != i:
      i = parent[i]
    return i
  owner: dict[int, int] = {}
  for i, procs in enumerate(rows):
    for p in procs:
      if p in owner:
        parent[root(i)] = root(owner[p])
      else:
        owner[p] = i
  members: dict[int, list[int]] = {}
  for i in range(len(rows)):
    members.setdefault(root(i), []).append(i)
  ordered = sorted(members.values())
  return [DataGroup(g, len(ordered), Mesh(mesh.devices[idx], mesh.axis_names),
                    tuple(sorted(set().union(*(rows[i] for i in idx))))) for g, idx in enumerate(ordered)]


def data_group(mesh: Mesh, process_index: Optional[int] = None) -> DataGroup:
  """The data group this process (or `process_index`) belongs to."""
  p = jax.process_index() if process_index is None else process_index
  for g in data_groups(mesh):
    if p in g.processes:
      return g
  raise MeshError(f"process {p} owns no device of the mesh {dict(mesh.shape)}")


def my_group(cfg: MeshConfig) -> DataGroup:
  """This process's data group for `cfg`; on one device a group of one with no mesh."""
  if jax.device_count() == 1:
    return DataGroup(0, 1, None, (0,))
  return data_group(create_mesh(cfg))


def default_scoring_mesh(cfg: MeshConfig) -> Optional[Mesh]:
  """The Scorer's default: this process's data-group mesh when there is more than one device, else None.

  A one-device group in a multi-process run still gets its mesh, so a checkpoint is restored
  onto this process's device rather than onto global device 0.
  """
  if jax.device_count() == 1:
    return None
  return data_group(create_mesh(cfg)).mesh


def query_slice(num_queries: int, group_index: int, group_count: int) -> range:
  """The query indices group `group_index` of `group_count` scores: every group_count-th, from group_index.

  Strided rather than contiguous so groups get similar mixes when the data is sorted by size;
  pass the indices still to do (after resume) and index into them with this range.
  """
  if not 0 <= group_index < group_count:
    raise ValueError(f"group_index={group_index} must be in [0, group_count={group_count})")
  return range(group_index, num_queries, group_count)


def num_rounds(num_queries: int, group_count: int) -> int:
  """Gather rounds every process runs so that each group's slice is covered: ceil(num / count)."""
  return -(-num_queries // group_count)


# --- gathering results -----------------------------------------------------------------
def _json_default(x: Any) -> Any:
  if isinstance(x, (np.ndarray, np.generic)):
    return x.tolist()
  raise TypeError(f"{type(x).__name__} is not JSON serializable")


def _collective(fn, *args, what: str):
  try:
    return fn(*args)
  except (jax.errors.JaxRuntimeError, ValueError) as e:  # gloo's lost connection is a ValueError on CPU
    peers.stop_if_peer_lost()  # a peer died: the watchdog names it and ends this process
    raise DistributedError(f"{what} across {jax.process_count()} processes failed; a peer process most likely "
                           f"died or became unreachable (restart every process to resume): {e}") from None


def gather_to_process0(records: Sequence[Any], contribute: bool = True) -> Optional[list[Any]]:
  """All processes call this together; process 0 gets every contributed record (in process order), others None.

  `records` must be JSON-serializable (numpy values are converted); pass contribute=False on
  the non-leader processes of a group so each result arrives once.
  """
  mine = list(records) if contribute else []
  if jax.process_count() == 1:
    return mine
  payload = np.frombuffer(json.dumps(mine, default=_json_default).encode(), np.uint8)
  lengths = _collective(multihost_utils.process_allgather, np.asarray([payload.size], np.int32),
                        what="gathering result sizes")
  lengths = np.asarray(lengths).reshape(-1)
  buf = np.zeros(int(lengths.max()), np.uint8)
  buf[:payload.size] = payload
  everything = np.asarray(_collective(multihost_utils.process_allgather, buf, what="gathering results"))
  if jax.process_index() != 0:
    return None
  out: list[Any] = []
  for p, n in enumerate(lengths):
    out.extend(json.loads(everything[p, :n].tobytes()))
  return out


def broadcast_from_process0(obj: Any) -> Any:
  """Process 0's JSON-serializable `obj` on every process (e.g. the query ids a resumed run already has)."""
  if jax.process_count() == 1:
    return obj
  payload = np.frombuffer(json.dumps(obj if jax.process_index() == 0 else None, default=_json_default).encode(),
                          np.uint8)
  n = int(_collective(multihost_utils.broadcast_one_to_all, np.asarray(payload.size, np.int32),
                      what="broadcasting a size"))
  buf = np.zeros(n, np.uint8)
  if jax.process_index() == 0:
    buf[:] = payload
  data = np.asarray(_collective(multihost_utils.broadcast_one_to_all, buf, what="broadcasting from process 0"))
  return json.loads(data.tobytes())


def sync(name: str) -> None:
  """A barrier across all processes (no-op in one process)."""
  if jax.process_count() > 1:
    _collective(multihost_utils.sync_global_devices, name, what=f"barrier {name!r}")


# --- start-up ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Processes:
  """Where this process stands after initialize_distributed."""
  index: int
  count: int
  source: str  # "flags", "env", a cluster name, or "single process"


_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


def detect_cluster() -> Optional[str]:
  """The multi-process environment jax.distributed.initialize() can configure itself from, or None."""
  if all(v in os.environ for v in _SLURM_VARS) and int(os.environ["SLURM_NTASKS"]) > 1:
    return "SLURM"
  if "OMPI_MCA_orte_hnp_uri" in os.environ:
    return "Open MPI"
  if os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1:
    return "Cloud TPU (GKE)"
  try:
    from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top  (no public API says "TPU VM")
    if cloud_tpu_init.running_in_cloud_tpu_vm and "TPU_SKIP_MDS_QUERY" not in os.environ:
      return "Cloud TPU VM"
  except ImportError:
    pass
  return None


_JAX_TIMEOUT_MARGIN_S = 10  # jax's own deadline comes this much after ours
_MIN_HEARTBEAT_TIMEOUT_S = 6  # the watchdog decides at a third of it


def _watchdog(seconds: float, message: str) -> threading.Event:
  """Unless the returned event is set within `seconds`, prints `message` and exits the process with status 1."""
  done = threading.Event()

  def fire():
    if not done.wait(seconds):
      sys.stderr.write(message + "\n")
      sys.stderr.flush()
      os._exit(1)  # pylint: disable=protected-access  (the main thread is stuck inside JAX's C++ client)
  threading.Thread(target=fire, name="maxscore-init-watchdog", daemon=True).start()
  return done


def initialize_distributed(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
                           process_id: Optional[int] = None, *, initialization_timeout_s: int = 300,
                           heartbeat_timeout_s: int = 30, shutdown_timeout_s: int = 300) -> Processes:
  """Starts JAX's multi-controller runtime before any other JAX call; single process when nothing asks for more.

  Arguments, else JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, else an
  environment JAX detects itself (SLURM, Open MPI, Cloud TPU). A peer that has not joined
  within `initialization_timeout_s` is an error naming the coordinator; once running, a
  peer that stops heartbeating makes every other process exit with one line naming it, within
  `heartbeat_timeout_s` (maxscore/distributed/peers.py), so a lost host never hangs the job.
  """
  if jax.distributed.is_initialized():
    return Processes(jax.process_index(), jax.process_count(), "already initialized")
  env = os.environ
  source = "flags"
  if coordinator_address is None and num_processes is None and process_id is None:
    if "JAX_COORDINATOR_ADDRESS" in env or "JAX_NUM_PROCESSES" in env:
      source = "env"  # what the env leaves out, jax.distributed.initialize auto-detects or reports
      coordinator_address = env.get("JAX_COORDINATOR_ADDRESS")
      num_processes = int(env["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in env else None
      process_id = int(env["JAX_PROCESS_ID"]) if "JAX_PROCESS_ID" in env else None
    else:
      source = detect_cluster()
      if source is None:
        logging.debug("single process: no coordinator given and no SLURM/MPI/TPU environment detected")
        return Processes(0, 1, "single process")
  if num_processes == 1 and process_id in (None, 0):
    return Processes(0, 1, "single process")
  if heartbeat_timeout_s < _MIN_HEARTBEAT_TIMEOUT_S:
    raise DistributedError(f"heartbeat_timeout_s={heartbeat_timeout_s} is too short: a busy host would be taken "
                           f"for a lost one; use at least {_MIN_HEARTBEAT_TIMEOUT_S}")
  if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
    raise DistributedError(f"process_id={process_id} must be in [0, num_processes={num_processes}) ({source})")
  where = (f"process {'?' if process_id is None else process_id} of {num_processes or '?'} with coordinator "
           f"{coordinator_address or 'auto'} ({source})")
  advice = ("Start every process with the same coordinator_address and num_processes and a distinct process_id, "
            "make the coordinator port reachable, and call this before any other JAX function.")
  # A peer that never joins makes JAX's client abort the process from C++ (no Python exception), with a
  # terse DEADLINE_EXCEEDED; a watchdog that fires first says what happened instead.
  joined = _watchdog(initialization_timeout_s, f"maxscore.distributed.DistributedError: {where}: not every process joined "
                     f"within {initialization_timeout_s}s; a peer process is missing or cannot reach the coordinator. "
                     + advice)
  try:
    with peers.coordinator_hook(jax_distributed._jax):  # pylint: disable=protected-access  (see peers.py)
      jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                 initialization_timeout=int(initialization_timeout_s) + _JAX_TIMEOUT_MARGIN_S,
                                 heartbeat_timeout_seconds=int(heartbeat_timeout_s),
                                 shutdown_timeout_seconds=int(shutdown_timeout_s))
  except Exception as e:  # jax raises RuntimeError, ValueError or XlaRuntimeError here
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise DistributedError(f"jax.distributed.initialize failed for {where}: {first}. {advice}") from e
  finally:
    joined.set()
  logging.info("process %d of %d (%s), %d local / %d global devices", jax.process_index(), jax.process_count(),
              source, jax.local_device_count(), jax.device_count())
  if jax.process_count() > 1:
    peers.watch(jax_distributed.global_state.client, jax.process_index(), jax.process_count(), heartbeat_timeout_s)
    peers.name_lost_coordinator(jax_distributed.global_state.coordinator_address, jax.process_index(),
                                jax.process_count())
  return Processes(jax.process_index(), jax.process_count(), source)


def define_flags(flag_values: Any = None) -> None:
  """Defines --coordinator_address --num_processes --process_id --distributed_timeout_s --heartbeat_timeout_s."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS if flag_values is None else flag_values
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0 for jax.distributed; default: "
                      "JAX_COORDINATOR_ADDRESS or SLURM/Open MPI/Cloud TPU auto-detection", flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "number of processes (default: from env/cluster)", flag_values=fv)
  flags.DEFINE_integer("process_id", None, "this process's id in [0, num_processes)", flag_values=fv)
  flags.DEFINE_integer("distributed_timeout_s", 300, "seconds to wait for every process to join", flag_values=fv)
  flags.DEFINE_integer("heartbeat_timeout_s", 30, "a process silent this long is lost: the others name it and exit "
                       f"{peers.LOST_PEER_EXIT_CODE} within it",
                       flag_values=fv)


def initialize_from_flags(flag_values: Any = None) -> Processes:
  """initialize_distributed with the flags of define_flags()."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS if flag_values is None else flag_values
  return initialize_distributed(f.coordinator_address, f.num_processes, f.process_id,
                                initialization_timeout_s=f.distributed_timeout_s,
                                heartbeat_timeout_s=f.heartbeat_timeout_s)
