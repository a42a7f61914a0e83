"""Typed, validated config: configs/base.yml + configs/models/<name>.yml + key=value overrides.

The YAML files are flat (MaxText style); each key is a field of exactly one frozen section
dataclass below, so a component receives only its section. Unknown keys and ill-typed
values raise `ConfigError` naming the key and the nearest valid names.
"""

import dataclasses
import difflib
import os
import pathlib
import types
import typing
from typing import Any, Literal, Mapping, Optional, Sequence

import yaml

from layers import quantization
from layers.config import ModelConfig
from layers.kernels import KernelOptions

CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
  """A config key is unknown or its value is invalid."""


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  """Numerics, weights and compilation."""
  model_name: str = "tiny-qwen3"
  dtype: Literal["float32", "bfloat16"] = "float32"
  weight_dtype: Literal["float32", "bfloat16"] = "float32"
  matmul_precision: Literal["default", "high", "highest"] = "highest"
  quantization: Literal["none", "int8_weights", "int8"] = "none"  # layers/quantization.py
  quantization_group_size: int = 0  # int8_weights: a weight scale per group of this many along the contracting dim
  init_seed: int = 0
  checkpoint_dir: Optional[str] = None
  tokenizer_path: Optional[str] = None
  compilation_cache_dir: Optional[str] = "user"  # "user": a per-user cache directory; None or "none": off


@dataclasses.dataclass(frozen=True)
class ScoringConfig:
  """What a score is (docs/ARCHITECTURE.md section 1) and which algorithm computes it."""
  separator_token_id: Optional[int] = None
  label_token_ids: tuple[int, ...] = ()
  apply_softmax: bool = False
  algorithm: Literal["serial", "packed", "prefill_extend", "auto"] = "auto"
  extend_batch_size: int = 64
  extend_max_tokens: int = 16384
  serial_batch_size: int = 16
  prefix_cache_bytes: int = 1 << 30
  max_request_tokens: int = 1 << 20
  max_tokens_per_forward: int = 1 << 16
  max_stacked_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class KernelConfig(KernelOptions):
  """The attention kernel choice, plus the KernelOptions every kernel reads (block sizes, limits,
  interpret mode; layers/kernels/base.py) as keys of their own (docs/ARCHITECTURE.md section 4)."""
  attention: Literal["reference", "shared_prefix", "splash", "pallas_gpu", "auto"] = "auto"

  def options(self) -> KernelOptions:
    """The kernel settings without the choice: bound kernels compare equal whether `attention` named them or
    auto picked them."""
    return KernelOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(KernelOptions)})


@dataclasses.dataclass(frozen=True)
class BucketConfig:
  """Static shapes that bound the number of compilations (docs/ARCHITECTURE.md section 5)."""
  prefix_buckets: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640, 768, 896,
      1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384,
      20480, 24576, 28672, 32768)
  item_buckets: tuple[int, ...] = (4, 6, 8, 10, 12, 14, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512,
      640, 768, 1024, 1280, 1536, 2048, 3072, 4096)
  item_count_buckets: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96,
      112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024)
  batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  length_group_ratio: float = 1.5


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Device mesh shape (docs/ARCHITECTURE.md section 8); -1 fills with the remaining devices."""
  ici_data_parallelism: int = -1
  ici_fsdp_parallelism: int = 1
  ici_tensor_parallelism: int = 1
  dcn_data_parallelism: int = 1
  dcn_fsdp_parallelism: int = 1
  dcn_tensor_parallelism: int = 1


@dataclasses.dataclass(frozen=True)
class Config:
  """The whole config; pass each component only its section."""
  model: ModelConfig = ModelConfig()
  runtime: RuntimeConfig = RuntimeConfig()
  scoring: ScoringConfig = ScoringConfig()
  kernel: KernelConfig = KernelConfig()
  buckets: BucketConfig = BucketConfig()
  mesh: MeshConfig = MeshConfig()

  def replace(self, **overrides: Any) -> "Config":
    """Returns a copy with flat `key=value` overrides applied and validated."""
    flat = to_flat_dict(self)
    flat.update(overrides)
    return from_flat_dict(flat)


_RUNTIME_SECTIONS = {"runtime": RuntimeConfig, "scoring": ScoringConfig, "kernel": KernelConfig,
                     "buckets": BucketConfig, "mesh": MeshConfig}
_MODEL_KEYS = tuple(f.name for f in dataclasses.fields(ModelConfig))
_KEY_TO_SECTION = {f.name: s for s, cls in _RUNTIME_SECTIONS.items() for f in dataclasses.fields(cls)}
_KEY_TO_SECTION.update({k: "model" for k in _MODEL_KEYS})
_SECTION_CLASSES = dict(_RUNTIME_SECTIONS, model=ModelConfig)
_BUCKET_KEYS = ("prefix_buckets", "item_buckets", "item_count_buckets", "batch_buckets")
_POSITIVE_KEYS = ("extend_batch_size", "extend_max_tokens", "serial_batch_size", "max_request_tokens", "max_tokens_per_forward",
                  "max_reference_len",
                  "splash_block_q", "splash_block_kv", "gpu_block_q", "gpu_block_kv", "gpu_num_stages")


def _unknown_key(key: str, valid: Sequence[str], where: str) -> ConfigError:
  near = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
  hint = f"; did you mean {', '.join(near)}?" if near else ""
  return ConfigError(f"unknown config key {key!r} in {where}{hint}")


def _coerce(key: str, value: Any, tp: Any) -> Any:
  """Checks `value` against the field type `tp`; converts lists to tuples and ints to floats."""
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin in (typing.Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    inner = [a for a in args if a is not type(None)]
    return _coerce(key, value, inner[0])
  if origin is Literal:
    if value not in args:
      near = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
      hint = f" (did you mean {near[0]!r}?)" if near else ""
      raise ConfigError(f"{key}={value!r} is not one of {list(args)}{hint}")
    return value
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      raise ConfigError(f"{key}={value!r} must be a list")
    return tuple(_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value))
  if tp is bool:
    if not isinstance(value, bool):
      raise ConfigError(f"{key}={value!r} must be true or false")
    return value
  if tp is int:
    if isinstance(value, bool) or not isinstance(value, int):
      raise ConfigError(f"{key}={value!r} must be an integer")
    return value
  if tp is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{key}={value!r} must be a number")
    return float(value)
  if tp is str:
    if not isinstance(value, str):
      raise ConfigError(f"{key}={value!r} must be a string")
    return value
  raise TypeError(f"unsupported config type {tp} for {key}")


def _validate(cfg: Config) -> None:
  for key in _BUCKET_KEYS:
    b = getattr(cfg.buckets, key)
    if not b or any(x <= 0 for x in b) or list(b) != sorted(set(b)):
      raise ConfigError(f"{key}={list(b)} must be a non-empty strictly increasing list of positive integers")
  for key in _POSITIVE_KEYS:
    section = getattr(cfg, _KEY_TO_SECTION[key])
    if getattr(section, key) <= 0:
      raise ConfigError(f"{key}={getattr(section, key)} must be positive")
  for key in ("prefix_cache_bytes", "max_stacked_tokens"):
    if getattr(cfg.scoring, key) < 0:
      raise ConfigError(f"{key}={getattr(cfg.scoring, key)} must be >= 0")
  group, runtime = cfg.runtime.quantization_group_size, cfg.runtime
  if group < 0 or (group and runtime.quantization != "int8_weights"):
    raise ConfigError(f"quantization_group_size={group} must be 0 (one weight scale per output channel), or a "
                      f"group size with quantization=int8_weights (quantization={runtime.quantization!r})")
  problem = quantization.group_size_problem("quantization_group_size", group, cfg.model)
  if problem:
    raise ConfigError(problem)
  if cfg.buckets.length_group_ratio < 1:
    raise ConfigError(f"length_group_ratio={cfg.buckets.length_group_ratio} must be >= 1")
  try:
    cfg.model.validate()
  except ValueError as e:
    raise ConfigError(f"model {cfg.runtime.model_name!r}: {e}") from None


def from_flat_dict(flat: Mapping[str, Any], where: str = "config") -> Config:
  """Builds a validated Config from flat keys (any subset; the rest keep their defaults)."""
  sections: dict[str, dict[str, Any]] = {s: {} for s in _SECTION_CLASSES}
  for key, value in flat.items():
    if key not in _KEY_TO_SECTION:
      raise _unknown_key(key, list(_KEY_TO_SECTION), where)
    section = _KEY_TO_SECTION[key]
    hints = typing.get_type_hints(_SECTION_CLASSES[section])
    sections[section][key] = _coerce(key, value, hints[key])
  cfg = Config(**{s: _SECTION_CLASSES[s](**kw) for s, kw in sections.items()})
  _validate(cfg)
  return cfg


def to_flat_dict(cfg: Config) -> dict[str, Any]:
  """The inverse of from_flat_dict (tuples stay tuples)."""
  out: dict[str, Any] = {}
  for section in _SECTION_CLASSES:
    out.update(dataclasses.asdict(getattr(cfg, section)))
  return out


def model_config_to_dict(model: ModelConfig) -> dict[str, Any]:
  """Plain dict of a ModelConfig (stored beside checkpoints)."""
  return dataclasses.asdict(model)


def model_config_from_dict(d: Mapping[str, Any], where: str = "model config") -> ModelConfig:
  """Validated ModelConfig from a plain dict; unknown keys are errors."""
  hints = typing.get_type_hints(ModelConfig)
  kw = {}
  for key, value in d.items():
    if key not in hints:
      raise _unknown_key(key, list(hints), where)
    kw[key] = _coerce(key, value, hints[key])
  try:
    return ModelConfig(**kw).validate()
  except ValueError as e:
    raise ConfigError(f"{where}: {e}") from None


def _read_yaml(path: pathlib.Path) -> dict[str, Any]:
  if not path.is_file():
    raise ConfigError(f"config file {path} does not exist")
  with open(path) as f:
    data = yaml.safe_load(f) or {}
  if not isinstance(data, dict):
    raise ConfigError(f"config file {path} must hold a mapping of key: value")
  return data


def parse_override(arg: str) -> tuple[str, Any]:
  """Parses one `key=value` command-line override; the value is read as YAML."""
  if "=" not in arg:
    raise ConfigError(f"override {arg!r} must have the form key=value")
  key, raw = arg.split("=", 1)
  return key.strip(), yaml.safe_load(raw) if raw.strip() else None


def model_yaml_path(name: str, config_dir: os.PathLike = CONFIG_DIR) -> pathlib.Path:
  """configs/models/<name>.yml, with the available names in the error when absent."""
  path = pathlib.Path(config_dir) / "models" / f"{name}.yml"
  if not path.is_file():
    names = sorted(p.stem for p in (pathlib.Path(config_dir) / "models").glob("*.yml"))
    near = difflib.get_close_matches(name, names, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(near)}?" if near else f"; available: {', '.join(names)}"
    raise ConfigError(f"model_name={name!r} has no file {path}{hint}")
  return path


def load_config(overrides: Sequence[str] | Mapping[str, Any] = (),
                base: os.PathLike = CONFIG_DIR / "base.yml") -> Config:
  """base.yml, then the model's yml, then overrides (`["k=v", ...]` or a dict), validated."""
  if isinstance(overrides, Mapping):
    over = dict(overrides)
  else:
    over = dict(parse_override(a) for a in overrides)
  flat = _read_yaml(pathlib.Path(base))
  for key in flat:
    if key not in _KEY_TO_SECTION or _KEY_TO_SECTION[key] == "model":
      raise _unknown_key(key, [k for k, s in _KEY_TO_SECTION.items() if s != "model"], str(base))
  model_name = over.get("model_name", flat.get("model_name", RuntimeConfig.model_name))
  model_path = model_yaml_path(model_name, pathlib.Path(base).parent)
  model_flat = _read_yaml(model_path)
  for key in model_flat:
    if key not in _MODEL_KEYS:
      raise _unknown_key(key, list(_MODEL_KEYS), str(model_path))
  flat.update(model_flat)
  flat.update(over)
  return from_flat_dict(flat, where="overrides")


# --- entry points: configs/<entry>.yml into typed sections, the same strict rules -------------

def read_comments(path: os.PathLike) -> dict[str, str]:
  """The one-line comment beside each top-level key of a flat YAML file (its documentation)."""
  out = {}
  for line in pathlib.Path(path).read_text().splitlines():
    if line and not line[0].isspace() and not line.startswith("#") and ":" in line:
      key, _, rest = line.partition(":")
      out[key.strip()] = rest.partition("#")[2].strip() if "#" in rest else ""
  return out


def section_keys(cls: type) -> dict[str, tuple[Any, Mapping[str, Any]]]:
  """A section's keys: name -> (type, field metadata). A section whose settings sit in sections of its own (the
  reranker recipe's TrainConfig) lists its flat keys itself (`entry_fields`) and is built from them by its
  `from_entry`; any other section's keys are its fields."""
  if hasattr(cls, "entry_fields"):
    return cls.entry_fields()
  hints = typing.get_type_hints(cls)
  return {f.name: (hints[f.name], f.metadata) for f in dataclasses.fields(cls)}


def build_section(cls: type, values: Mapping[str, Any], where: str = "config") -> Any:
  """A frozen section dataclass from `values` (any subset of its keys), typed as strictly as
  base.yml's keys; its `validate()` runs when it has one, and a ValueError becomes a ConfigError."""
  keys = section_keys(cls)
  kw = {}
  for key, value in values.items():
    if key not in keys:
      raise _unknown_key(key, list(keys), where)
    kw[key] = _coerce(key, value, keys[key][0])
  try:
    section = cls.from_entry(kw) if hasattr(cls, "from_entry") else cls(**kw)
    return section.validate() if hasattr(section, "validate") else section
  except ConfigError:
    raise
  except ValueError as e:
    raise ConfigError(f"{where}: {' '.join(str(e).split())}") from None


# Field metadata of a setting that code passes but no YAML key or flag holds: the configs/base.yml
# overrides a bench or check takes from its trailing key=value arguments (the one way scripts take them).
CODE_ONLY = {"entry_key": False}


def choices(names: Sequence[str]) -> dict[str, Any]:
  """Field metadata of a string setting whose allowed values live in a registry (`names`, e.g. the prompt
  templates): its flag's --help lists them, so the list is never written by hand."""
  return {"choices": tuple(names)}


def entry_keys(sections: Mapping[str, type]) -> dict[str, str]:
  """key -> section name over an entry point's sections (a key belongs to exactly one section); fields
  marked CODE_ONLY are not keys."""
  out: dict[str, str] = {}
  for name, cls in sections.items():
    for key, (_, metadata) in section_keys(cls).items():
      if not metadata.get("entry_key", True):
        continue
      if key in out:
        raise TypeError(f"config key {key!r} is in both section {out[key]} and {name}")
      out[key] = name
  return out


def load_entry(entry: str, sections: Mapping[str, type], values: Mapping[str, Any] = (),
               config_dir: os.PathLike = CONFIG_DIR) -> dict[str, Any]:
  """configs/<entry>.yml, then `values` (`key: value`), into one validated dataclass per section.

  The YAML must hold every key of every section (it documents them), nothing else."""
  path = pathlib.Path(config_dir) / f"{entry}.yml"
  flat = _read_yaml(path)
  keys = entry_keys(sections)
  for key in flat:
    if key not in keys:
      raise _unknown_key(key, list(keys), str(path))
  missing = sorted(set(keys) - set(flat))
  if missing:
    raise ConfigError(f"{path} does not document the keys {missing}")
  for key in dict(values):
    if key not in keys:
      raise _unknown_key(key, list(keys), f"the {entry} settings")
  flat.update(dict(values))
  by_section: dict[str, dict[str, Any]] = {name: {} for name in sections}
  for key, value in flat.items():
    by_section[keys[key]][key] = value
  return {name: build_section(cls, by_section[name], where=f"{entry} settings") for name, cls in sections.items()}
