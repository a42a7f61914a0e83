"""scripts/<name>.py loaded as a module, for tests that call its `run(argv)` (fresh flags: no global state)."""

import importlib.util
import pathlib
import types

SCRIPTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> types.ModuleType:
  """A new module object of scripts/<name>.py each call (scripts are not a package)."""
  spec = importlib.util.spec_from_file_location(f"_script_{name}", SCRIPTS_DIR / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
