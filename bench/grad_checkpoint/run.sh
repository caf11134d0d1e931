#!/usr/bin/env bash
# Activation (gradient) checkpointing per decoder layer (train.gradient_checkpointing) off vs on,
# side by side: peak memory and training tokens/s of the trainer's exact step (bench/lora's
# lora_bench, one process per setting since peak RSS is per process).
# Usage: bench/grad_checkpoint/run.sh BUILD_DIR [lora_bench options, e.g. --mode lora --seq 512]
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [options]}
shift
bin="$build/bin/lora_bench"
off=$("$bin" --mode full "$@" --gradient-checkpointing 0)
on=$("$bin" --mode full "$@" --gradient-checkpointing 1)
python3 - "$off" "$on" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"gradient checkpointing off vs on ({a['mode']}, {a['device']}, {a['precision']}, "
      f"batch {a['batch']} x seq {a['seq']}, {a['parameters']:,} parameters)")
rows = [("tokens/s", "tokens_per_s", "{:,.0f}"), ("peak RSS (MiB)", "peak_rss_mib", "{:,.0f}")]
print(f"{'':20}{'off':>12}{'on':>12}{'on/off':>10}")
for name, key, fmt in rows:
    print(f"{name:20}{fmt.format(a[key]):>12}{fmt.format(b[key]):>12}{b[key] / a[key]:>10.3f}")
PY
