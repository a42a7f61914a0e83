"""scripts/<name>.py loaded as a module, for tests that call its `run(argv)` (fresh flags: no global state)."""

import importlib.util
import pathlib
import shlex
import subprocess
import types

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS_DIR = REPO / "scripts"


def load_script(name: str) -> types.ModuleType:
  """A new module object of scripts/<name>.py each call (scripts are not a package)."""
  spec = importlib.util.spec_from_file_location(f"_script_{name}", SCRIPTS_DIR / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def make_command(target: str, script: str) -> list[str]:
  """The arguments of the first scripts/<script>.py command that `make <target>` runs (its dry run, `make -n`;
  paths relative to the repository)."""
  printed = subprocess.run(["make", "-n", "-C", str(REPO), target], capture_output=True, text=True, check=True).stdout
  line = next(l for l in printed.replace("\\\n", " ").splitlines() if f"scripts/{script}.py" in l)
  return shlex.split(line)
