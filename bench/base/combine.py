"""One table from the per-method BERT-base CPU runs in this folder (each run: SimCSE + one method,
timed in the same process; see BENCHMARKS.md for the command). Usage: python bench/base/combine.py"""

import json
from pathlib import Path

here = Path(__file__).parent
rows = [
    "| method | step ms | SimCSE step ms (same run) | ÷ SimCSE | ops/step | ops ÷ SimCSE "
    "| graphs/breaks (explain) | load avg at start |",
    "|---|---:|---:|---:|---:|---:|---|---|",
]
for path in sorted(here.glob("*.json")):
    data = json.loads(path.read_text())
    train, capture = data["train"]["batch_16"], data["capture"]["methods"]
    name = path.stem
    m, s = train[name], train["simcse"]
    explain = ", ".join(
        f"{kind} {e['graphs']}/{e['breaks']}" for kind, e in capture[name]["explain"].items()
    )
    load = data["meta"].get("load_average_at_start", ["?"])[0]
    rows.append(
        f"| {name} | {m['step_ms']:,.0f} | {s['step_ms']:,.0f} | {m['ratio']:.3f} | "
        f"{m['ops_per_step']:,} | {m['ops_ratio']:.2f} | {explain} | {load:.2f} |"
    )
print("\n".join(rows))
