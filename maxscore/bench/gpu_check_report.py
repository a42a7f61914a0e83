"""The digest `make gpu-check` prints of its report (maxscore/bench/gpu_check.py): device, each kernel case,
the parity checks, the training step, each speed and seed workload's best rows, the attention sweep and the int8
part."""

from typing import Any

from maxscore.bench import train_bench
from maxscore.bench.report import summary


def summary_lines(report: dict[str, Any]) -> list[str]:
  """A readable digest: device, each kernel case, the parity checks, each speed workload's best rows."""
  lines = [f"backend {report['backend']} ({', '.join(report['devices'])}), jax {report['jax_version']}, "
           f"torch {report.get('torch_version')} cuda={report.get('torch_cuda')} {report.get('torch_device') or ''}, "
           f"torch and transformers imported in {report.get('import_torch_transformers_s', 0.0):.1f} s"]
  kernels = report.get("kernels")
  if isinstance(kernels, dict):
    lines.append(f"kernels: ERROR {kernels['error']}")
  else:
    for r in kernels or []:
      detail = r.get("error") or f"max |diff| {r['max_abs_diff']:.2e}, first call {r['first_call_s']:.2f} s"
      lines.append(f"kernel {r['name']:<20} {'ok ' if r['ok'] else 'BAD'} {detail}")
  grads = report.get("kernel_grads")
  if isinstance(grads, dict):
    lines.append(f"kernel_grads: ERROR {grads['error']}")
  else:
    for r in grads or []:
      detail = r.get("error") or (", ".join(f"{k} {v:.1e}" for k, v in r["relative_error"].items())
                                  + f" (relative), first call {r['first_call_s']:.2f} s"
                                  + (f", {r['triton_calls']['lowered']} Triton calls" if "triton_calls" in r else ""))
      lines.append(f"backward {r['name']:<18} {'ok ' if r['ok'] else 'BAD'} {detail}")
  train = report.get("train")
  if train is not None:
    lines.append("== train")
    if "error" in train:
      lines.append(f"ERROR {train['error']}\n{train.get('traceback', '')}")
    else:
      for kernel, run in train["runs"].items():
        lines.append(train_bench.summary(dict(options=dict(train["options"], remat="per_layer"), params=0,
                                              dtype=train["dtype"], runs=[run], loadavg="", note=kernel)).rstrip())
      for mode, c in train["shared_prefix_over_pallas_gpu"].items():
        lines.append(f"{mode}: shared_prefix step / pallas_gpu step {c['step_s_ratio']:.2f}; "
                     f"loss relative diff {c['loss_relative_diff']:.1e}")
  for name in ["scorer_parity"] + report.get("speed_parts", []) + report.get("seed_parts", []):
    r = report.get(name)
    if r is None:
      continue
    lines.append(f"== {name}")
    lines.append(f"ERROR {r['error']}\n{r.get('traceback', '')}" if "error" in r else summary(r))
  if "attention" in report:
    lines += ["== attention"] + attention_lines(report["attention"])
  if "int8" in report:
    lines += ["== int8"] + int8_lines(report["int8"])
  return lines


def attention_lines(r: dict[str, Any]) -> list[str]:
  """The attention part's digest: each pallas_gpu setting's time on the packed row, then the scorer's items/s
  with the default and the fastest agreeing setting."""
  if "error" in r:
    return [f"ERROR {r['error']}\n{r.get('traceback', '')}"]
  lines = [f"{r['workload']}: pallas_gpu settings BLOCK_QxBLOCK_KVxWARPSxSTAGES on one packed row, heads {r['heads']}"]
  for row in r["rows"]:
    lines.append(f"  {row['setting']:<12} " + (f"ERROR {row['error']}" if "error" in row else
                 f"{row['ms']:.3f} ms, {row['tflop_s']:.1f} TFLOP/s, max abs diff vs the first "
                 f"{row['max_abs_diff_vs_first']:.2e}, compile {row['compile_s']:.1f} s"))
  for setting, scored in r["scored"].items():
    if "error" in scored:
      lines.append(f"scorer with {setting}: ERROR {scored['error']}")
      continue
    lines.append(f"scorer with {setting}: " + ", ".join(
        f"{x['name']} {x['items_per_s']:.1f} items/s" for x in scored["rows"] if "items_per_s" in x))
  return lines


def int8_lines(r: dict[str, Any]) -> list[str]:
  """The int8 part's digest: each projection's parts against bf16, the program's dots and quantizations, and
  the model's items/s in bf16, int8_weights and int8."""
  if "error" in r:
    return [f"ERROR {r['error']}\n{r.get('traceback', '')}"]
  lines = [f"{r['workload']}, {r['kernel']}: one packed row of {r['packed_row_tokens']} tokens"]
  proj = r["projections"]
  if "error" in proj:
    lines.append(f"projections: ERROR {proj['error']}")
  else:
    for p in proj["projections"]:
      ms = ", ".join(f"{k} {v:.3f}" for k, v in p["ms"].items())
      kinds = sorted({f"{d['kind']} {'x'.join(d['operands'])}->{d['result']}" for d in p["hlo"]["w8a8"]["dots"]})
      lines.append(f"{p['name']:<8} ms: {ms}; w8a8 / bf16 {p['x_bf16']['w8a8']:.2f}x; w8a8 dots: {kinds}")
      lines += [f"  {k}: ERROR {v}" for k, v in p.get("errors", {}).items()]
    lines.append("one layer's projections, ms: " + ", ".join(f"{k} {v:.3f}" for k, v in proj["layer_ms"].items()))
    lines.append("  against bf16 (> 1 faster): " + ", ".join(f"{k} {v:.2f}x" for k, v in proj["layer_x_bf16"].items()))
  program = r["program"]
  if "error" in program:
    lines.append(f"program: ERROR {program['error']}")
  else:
    for name, facts in program.items():
      fused = sorted({f"{q['fused_with']} ({','.join(c['kind'] for c in q['called_by'])})"
                      for q in facts["quantizations"]})
      lines.append(f"program {name}: dots {facts['dots']}; {len(facts['quantizations'])} activation quantizations, "
                   f"fused with: {fused}; {facts['kernels']} kernels")
  model = r["model"]
  if "error" in model:
    lines.append(f"model: ERROR {model['error']}")
  else:
    for row in model["rows"]:
      lines.append(f"model {row['name']}: " + (row.get("error") or f"{row['items_per_s']:.1f} items/s"
                   + (f", {row['x_float']:.2f}x bf16" if "x_float" in row else "")))
  return lines
