"""Reading an optimized HLO module's text (`compiled.as_text()`): which dots ran on which element types, and
where the float -> int8 conversions sit. It answers "did XLA run the w8a8 dots as int8 x int8 -> int32, and is
the activation quantization fused into a neighbour or a kernel of its own" from the program XLA compiled, on
any backend (GPU: cuBLAS custom calls and Triton GEMM fusions; CPU: dots and their fusions).

    module = parse(compiled.as_text())
    dots(module)              # [{"computation", "name", "kind", "result", "operands": ["s8", "s8"]}, ...]
    int8_conversions(module)  # [{"computation", "called_by": [{"name", "kind"}], "ops": [...]}, ...]
"""

import dataclasses
import re
from typing import Any, Optional

# GEMM library calls XLA's GPU backend emits for a dot (cuBLAS, cuBLASLt, cuDNN); a Triton GEMM is a fusion
# whose computation holds the dot itself.
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cudnn$matmul", "__cudnn$fusion")
_NAME = r"%?([\w.\-]+)"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?" + _NAME + r"\s*=\s*")
_DTYPE = re.compile(r"^\(?\s*([a-z]+[0-9]*)\[")


@dataclasses.dataclass
class Instruction:
  name: str
  dtype: str              # the result's element type (a tuple's first element): bf16, s8, s32, f32, ...
  shape: str              # the result's type as printed, e.g. s8[64,32]{1,0}
  opcode: str
  operands: list[str]     # operand instruction names
  attrs: str              # the text after the operand list (calls=..., custom_call_target=..., backend_config)


@dataclasses.dataclass
class Computation:
  name: str
  entry: bool
  instructions: list[Instruction]

  def by_name(self) -> dict[str, Instruction]:
    return {i.name: i for i in self.instructions}


def _balanced(text: str, start: int) -> int:
  """The index just past the bracket group that opens at text[start]."""
  depth, pairs = 0, {"(": ")", "[": "]", "{": "}"}
  closing = set(pairs.values())
  for i in range(start, len(text)):
    if text[i] in pairs:
      depth += 1
    elif text[i] in closing:
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


def _instruction(line: str) -> Optional[Instruction]:
  m = _INSTRUCTION.match(line)
  if not m:
    return None
  rest = line[m.end():]
  end = _balanced(rest, 0) if rest.startswith("(") else rest.find(" ")
  if end < 0:
    return None
  shape, rest = rest[:end], rest[end:].lstrip()
  op = re.match(r"([\w\-$]+)\(", rest)
  if not op:
    return None
  close = _balanced(rest, op.end() - 1)
  operands = re.findall(r"%([\w.\-]+)", rest[op.end():close - 1])
  dtype = _DTYPE.match(shape)
  return Instruction(m.group(1), dtype.group(1) if dtype else "", shape, op.group(1), operands, rest[close:])


def parse(text: str) -> list[Computation]:
  """The module's computations (fused ones, loop bodies, the entry), each with its instructions."""
  out: list[Computation] = []
  for line in text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      m = re.match(r"(ENTRY\s+)?" + _NAME, line)
      if m and not line.startswith("HloModule"):
        out.append(Computation(m.group(2), bool(m.group(1)), []))
      continue
    if out and line.startswith(" "):
      inst = _instruction(line)
      if inst:
        out[-1].instructions.append(inst)
  return out


def _callers(module: list[Computation]) -> dict[str, list[dict[str, str]]]:
  """{computation: [{"name": calling instruction, "kind": fusion kind or opcode, "backend": ...}]}."""
  out: dict[str, list[dict[str, str]]] = {}
  for comp in module:
    for inst in comp.instructions:
      for callee in re.findall(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)", inst.attrs):
        kind = re.search(r"kind=(k\w+)", inst.attrs)
        backend = re.search(r'"kind":"([^"]+)"', inst.attrs)
        out.setdefault(callee, []).append(dict(name=inst.name, kind=kind.group(1) if kind else inst.opcode,
                                               backend=backend.group(1) if backend else ""))
  return out


def _operand_dtypes(comp: Computation, inst: Instruction) -> list[str]:
  table = comp.by_name()
  return [table[o].dtype if o in table else "?" for o in inst.operands]


def dots(module: list[Computation]) -> list[dict[str, Any]]:
  """Every dot and GEMM library call: where it is, how it runs ("dot" in a computation, "triton" when its
  computation is a Triton GEMM fusion's, or the custom call's target), its result and operand element types."""
  callers = _callers(module)
  out = []
  for comp in module:
    triton = any("triton" in c["backend"] for c in callers.get(comp.name, []))
    for inst in comp.instructions:
      target = re.search(r'custom_call_target="([^"]+)"', inst.attrs)
      if inst.opcode == "dot":
        kind = "triton" if triton else "dot"
      elif inst.opcode == "custom-call" and target and target.group(1) in GEMM_TARGETS:
        kind = target.group(1)
      else:
        continue
      out.append(dict(computation=comp.name, name=inst.name, kind=kind, result=inst.dtype,
                      operands=_operand_dtypes(comp, inst)[:2], shape=inst.shape))
  return out


def int8_dots(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The dots of `dots(...)` whose two operands are both int8."""
  return [d for d in found if d["operands"][:2] == ["s8", "s8"]]


def int8_conversions(module: list[Computation]) -> list[dict[str, Any]]:
  """Each float -> s8 convert (a quantization), with the computation it is in, the instructions that call that
  computation (a fusion's kind: kLoop, kInput for a reduction fusion, kCustom for a GEMM fusion) and the
  opcodes the computation holds besides parameters and constants: what the conversion is fused with."""
  callers = _callers(module)
  out = []
  for comp in module:
    table = comp.by_name()
    for inst in comp.instructions:
      if inst.opcode != "convert" or inst.dtype != "s8" or not inst.operands:
        continue
      source = table.get(inst.operands[0])
      if source is not None and source.dtype in ("s8", "s32", "u8", "pred"):
        continue
      ops = sorted({i.opcode for i in comp.instructions} - {"parameter", "constant", "broadcast"})
      out.append(dict(computation=comp.name, entry=comp.entry, shape=inst.shape,
                      called_by=callers.get(comp.name, []), ops=ops,
                      fused_with=_fused_with(ops)))
  return out


def _fused_with(ops: list[str]) -> str:
  """A word on what a quantizing computation also does (from its opcodes)."""
  if "dot" in ops:
    return "the dot"
  if "rsqrt" in ops:
    return "a normalization"
  if "reduce" in ops:
    return "its absmax reduction"
  if "custom-call" in ops:
    return "a custom call"
  return "elementwise ops only (no reduction, normalization or dot)"


def kernel_count(module: list[Computation]) -> int:
  """Instructions that launch work in the entry computation and loop bodies (fusions, custom calls, dots, ...):
  a rough count of kernels per program, without bookkeeping (parameters, tuples, bitcasts, loop plumbing)."""
  bodies = {b for comp in module for inst in comp.instructions for b in re.findall(r"body=%?([\w.\-]+)", inst.attrs)}
  plumbing = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
              "copy-start", "copy-done", "after-all", "partition-id", "replica-id", "opt-barrier"}
  return sum(1 for comp in module if comp.entry or comp.name in bodies
             for inst in comp.instructions if inst.opcode not in plumbing)
