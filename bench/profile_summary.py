#!/usr/bin/env python3
"""Per-op self time from a chrome trace written by `train_throughput --profile PREFIX`.

usage: bench/profile_summary.py TRACE.json STEPS [TOP]
"""
import collections
import json
import sys


def main():
    path, steps = sys.argv[1], int(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    data = json.load(open(path))
    events = [e for e in (data["traceEvents"] if isinstance(data, dict) else data) if e.get("ph") == "X"]
    by_thread = collections.defaultdict(list)
    for e in events:
        by_thread[e.get("tid")].append(e)
    self_us, count = collections.Counter(), collections.Counter()
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                self_us[stack[-1]["name"]] -= e["dur"]
            self_us[e["name"]] += e["dur"]
            count[e["name"]] += 1
            stack.append(e)
    total = sum(self_us.values())
    print(f"{'ms/step':>9} {'share':>6} {'calls/step':>10}  op")
    for name, us in self_us.most_common(top):
        print(f"{us / steps / 1000:9.2f} {100 * us / total:5.1f}% {count[name] / steps:10.0f}  {name}")
    print(f"{total / steps / 1000:9.2f}  total self time per step")


if __name__ == "__main__":
    main()
