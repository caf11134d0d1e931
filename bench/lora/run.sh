#!/usr/bin/env bash
# LoRA vs full fine-tune of the same model, side by side: peak memory and training tokens/s.
# Usage: bench/lora/run.sh BUILD_DIR [lora_bench options, e.g. --device cuda --precision bf16]
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [options]}
shift
bin="$build/bin/lora_bench"
full=$("$bin" --mode full "$@")
lora=$("$bin" --mode lora "$@")
python3 - "$full" "$lora" <<'PY'
import json, sys
f, l = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"LoRA vs full fine-tune ({f['device']}, {f['precision']}, batch {f['batch']} x seq {f['seq']})")
rows = [("parameters", "parameters", "{:,}"), ("trainable parameters", "trainable_parameters", "{:,}"),
        ("tokens/s", "tokens_per_s", "{:,.0f}"), ("peak RSS (MiB)", "peak_rss_mib", "{:,.0f}")]
if "peak_cuda_allocated_mib" in f:
    rows.append(("peak CUDA allocated (MiB)", "peak_cuda_allocated_mib", "{:,.0f}"))
print(f"{'':28}{'full':>16}{'LoRA':>16}{'LoRA/full':>12}")
for name, key, fmt in rows:
    print(f"{name:28}{fmt.format(f[key]):>16}{fmt.format(l[key]):>16}{l[key] / f[key]:>12.3f}")
PY
