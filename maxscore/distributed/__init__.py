"""Meshes, multi-process start-up, and how an eval is split across processes and gathered (docs/ARCHITECTURE.md section 8)."""

from maxscore.distributed.mesh import DistributedError, MeshError, create_mesh, initialize_distributed

__all__ = ["DistributedError", "MeshError", "create_mesh", "initialize_distributed"]
