"""One call on a GPU: device identity, measured ceilings, and TinyLLaMA V1 at the medium size.

    python benchmarks/gpu/foundation_gpu.py --out DIR

Writes foundation.json and foundation.md to DIR. V1 is the baseline every later version is compared
with; the original workshop's V1 took 245.8 ms a step at medium fp32 on an H200.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import pandas as pd

from tinyllama import device as dev
from tinyllama.costs.ceilings import measure_ceilings
from tinyllama.harness.bench import run_benchmark
from tinyllama.harness.records import markdown_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--preset", default="medium")
    parser.add_argument("--num-steps", type=int, default=20)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    env = dev.environment_summary()
    peaks = dev.device_peaks()
    print("device:", env, flush=True)
    ceilings = measure_ceilings()
    print({k: round(c.value, 2) for k, c in ceilings.items()}, flush=True)
    results = []
    for precision in ("fp32", "tf32", "bf16"):
        r = run_benchmark("v1", args.preset, precision=precision, num_steps=args.num_steps, progress=False)
        print(r.summary(), flush=True)
        results.append(r.to_dict())

    record = {"date": dt.date.today().isoformat(), "environment": env,
              "datasheet": None if peaks is None else peaks.__dict__,
              "ceilings": {k: {"value": c.value, "unit": c.unit, "size": c.size} for k, c in ceilings.items()},
              "v1": results}
    (out / "foundation.json").write_text(json.dumps(record, indent=1, default=str))
    ceiling_rows = [{"ceiling": key, "measured": f"{c.value:.1f} {c.unit}",
                     "datasheet": (None if peaks is None else peaks.memory_bandwidth_tbs if key == "copy"
                                   else peaks.tflops(c.precision)) or "n/a"} for key, c in ceilings.items()]
    step_rows = [{"precision": r["precision"], "step ms (median)": f"{r['step_ms_median']:.1f}",
                  "p10-p90": f"{r['step_ms_p10']:.1f}-{r['step_ms_p90']:.1f}", "fwd": f"{r['forward_ms_median']:.1f}",
                  "bwd": f"{r['backward_ms_median']:.1f}", "opt": f"{r['optimizer_ms_median']:.1f}",
                  "tokens/s": f"{r['tokens_per_s']:,.0f}", "peak MiB": f"{r['peak_memory_mib']:,.0f}",
                  "MFU (datasheet)": "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"} for r in results]
    lines = [f"# V1 at {args.preset}, {env['device']}, {record['date']} (torch {env['torch']})", "",
             markdown_table(pd.DataFrame(ceiling_rows), digits=4), "", markdown_table(pd.DataFrame(step_rows))]
    (out / "foundation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
