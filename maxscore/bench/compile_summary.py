"""The text of a compile report (compile_report.run's dict): where it compiled for, the weights each device holds,
each workload's programs with their fit and roofline, and the largest geometries that fit. The training compile
report (train_compile.py) writes its head and searches with the same lines."""

from typing import Any


def gb(x: float) -> str:
  return f"{x / 1e9:.2f}"


def header_lines(report: dict[str, Any], mesh_name: str, settings: str) -> list[str]:
  """The head of a report's text: where it compiled for (the chip's HBM, peak and bandwidth); the mesh, the model
  and `settings`; the report's note; a blank line."""
  c = report["chip"]
  gpu = c["platform"] == "gpu"
  where = (f"GPU {report['topology']}: {report['devices']} GPU(s) on one host" if gpu else
           f"TPU {report['topology']} x{report['num_slices']} slice(s): {report['devices']} devices")
  mesh = " ".join(f"{k}={v}" for k, v in report["mesh"].items())
  int8 = f", {c['peak_int8_ops'] / 1e12:.0f} TOP/s int8" if report.get("quantization") == "int8" else ""
  return [f"{where} ({c['name']}: {c['hbm_bytes'] / 1e9:.0f} GB HBM, "
          f"{c['peak_bf16_flops'] / 1e12:.0f} TFLOP/s bf16{int8}, "
          f"{c['hbm_bytes_per_s'] / 1e9:.0f} GB/s per {'GPU' if gpu else 'chip'}; {c['source']})",
          f"{mesh_name}: {mesh}; model {report['model']} {report['num_layers']} layers "
          f"({report['params'] / 1e6:.0f}M params){settings}",
          f"{report['note']}.", ""]


def weights_line(report: dict[str, Any]) -> str:
  """The weights each device holds (in the compiler's argument bytes): int8 projections and their float32 scales
  under quantization, float embeddings and norms."""
  what = ("int8 projections + float32 scales + the float rest" if report["quantization"] != "none" else
          report["weight_dtype"])
  return f"weights per device: {gb(report['weights_bytes'])} GB ({what})"


def search_line(what: str, search: dict[str, Any]) -> str:
  """One largest-fit search as a line: `largest <what>: N`, whether N is the search's limit, and why the next
  size probed failed."""
  text = (f"largest {what}: {search['largest']:,}"
          + (f" (the search limit {search['limit']:,})" if search["at_limit"] else ""))
  if search["first_failure"]:
    text += f"; {search['first_failure']:,} does not: {search['failure']}"
  return text


def _workload_lines(w: dict[str, Any]) -> list[str]:
  g = "x".join(str(x) for x in w["geometry"])
  lines = [f"workload {g} (query_len x items x item_len x batch), requested {w['requested']}: "
           f"algorithm={w.get('algorithm', '?')} ({w.get('reason', '')})"]
  if w["programs"]:
    lines.append(f"  {'program':<16}{'B':>3}{'P':>7}{'L':>6}{'N':>6}{'calls':>7}  {'HBM GB/dev':>10}"
                 f"{'of':>7}{'fits':>6}{'pallas':>7}{'GFLOP/dev':>11}{'GB r+w/dev':>11}{'roofline ms':>12}")
  for r in w["programs"]:
    lines.append(f"  {r['entry']:<16}{r['batch']:>3}{r['prefix_len']:>7}{r['slot_len']:>6}{r['num_slots']:>6}"
                 f"{r['calls']:>7}  {gb(r['hbm_bytes']):>10}{gb(r['hbm_capacity']):>7}"
                 f"{'yes' if r['fits'] else 'NO':>6}{'yes' if r['pallas'] else 'no':>7}"
                 f"{r['flops_per_device'] / 1e9:>11.1f}{gb(r['bytes_per_device']):>11}"
                 f"{r['roofline_s'] * 1e3:>9.3f} {r['bound'][:3]}")
  if w["error"]:
    lines.append(f"  compile error: {w['error']}")
  verdict = "FITS" if w["fits"] else "DOES NOT FIT / DID NOT COMPILE"
  tail = f"  => {verdict}: peak {gb(w['peak_hbm_bytes'])} GB per device"
  if w["items_per_s"]:
    tail += (f"; roofline {w['roofline_s'] * 1e3:.2f} ms per batch = {w['items_per_s']:,.0f} items/s bound "
             f"(useful {w['useful_flops'] / 1e12:.2f} TFLOP, compiled {w['program_flops'] / 1e12:.2f} TFLOP)")
  lines.append(tail)
  return lines


def summary(report: dict[str, Any]) -> str:
  """The report as a table: one block per workload, then the largest-fit searches."""
  lines = header_lines(report, "scoring mesh (process 0's data group)",
                       f", dtype={report['dtype']} weight_dtype={report['weight_dtype']} quantization="
                       f"{report['quantization']}, attention={report['attention']}")
  lines.insert(-2, weights_line(report))
  for w in report["workloads"]:
    lines += _workload_lines(w) + [""]
  for s in report["searches"]:
    g = "x".join(str(x) for x in s["base_geometry"])
    lines.append(search_line(f"{s['dimension']} that fits with {s['algorithm']} (from {g})", s))
  return "\n".join(lines).rstrip() + "\n"
