#!/usr/bin/env bash
# gamma auto on a busy machine (issue 52): the same prompts, SD and CSD at the defaults (gamma auto, the
# shipped memory), quiet and then with two processes taking the cores in random bursts (0.2-1.4 s on,
# 0.2-1.4 s off), as a compile or a browser does. Each run's target passes and tokens are the decode loop's
# own counts. Usage, from the checkout: bash docs/bench/contention-xeon/run.sh > docs/bench/contention-xeon/results.json
set -euo pipefail
python - "$@" <<'PY'
import json, os, signal, subprocess, sys, time
from csd.config import CSDConfig
from csd.decode import Decoder
from csd.memory import default_memory
from csd.runtime.models import load_pair
from csd.runtime.profile import machine_name

PROMPTS = ["Write a Python function that reverses a string.",
           "A farmer has 17 sheep and buys 23 more, then sells 9. How many sheep does he have? Explain briefly.",
           "Describe in a short paragraph why the sky looks blue in the daytime."]
pair = load_pair()
out = {"machine": machine_name("cpu"), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "draft": pair.draft_dtype, "target": f"{pair.target_repr} ({pair.int8_activations})", "runs": []}

def runs(load):
    for method in ("sd", "csd"):
        decoder = Decoder(pair)                        # online costs, as the app and the command line
        for p in PROMPTS:
            run = decoder.run(pair.encode_prompt(p), CSDConfig(method=method, max_new_tokens=128), default_memory(pair))
            list(run)
            m = run.metrics
            out["runs"].append({"load": load, "method": method, "prompt": p[:40], "tokens": m.new_tokens,
                                "target_passes": m.target_forwards, "drafted": m.drafted, "rescued": m.rescued,
                                "tok_s": round(m.new_tokens / m.wall_s, 2)})
            print(load, method, out["runs"][-1], file=sys.stderr, flush=True)

runs("quiet")
BURST = ('end=$((SECONDS + 3600)); while [ $SECONDS -lt $end ]; do '
         'timeout 0.$((RANDOM % 13 + 2)) sh -c "while :; do :; done"; sleep 0.$((RANDOM % 13 + 2)); done')
burners = [subprocess.Popen(["bash", "-c", BURST], start_new_session=True) for _ in range(2)]
try:
    runs("busy")
finally:
    for b in burners:
        os.killpg(b.pid, signal.SIGKILL)
tot = {}
for r in out["runs"]:
    k = (r["load"], r["method"])
    t = tot.setdefault(k, [0, 0, 0])
    t[0] += r["target_passes"]
    t[1] += r["tokens"]
    t[2] += r["rescued"]
out["totals"] = {f"{ld} {m}": {"target_passes": t[0], "tokens": t[1], "rescued": t[2],
                               "passes_per_token": round(t[0] / t[1], 3)} for (ld, m), t in tot.items()}
T = out["totals"]
out["busy_over_quiet_csd_passes_per_token"] = round(T["busy csd"]["passes_per_token"] / T["quiet csd"]["passes_per_token"], 3)
out["busy_over_quiet_sd_passes_per_token"] = round(T["busy sd"]["passes_per_token"] / T["quiet sd"]["passes_per_token"], 3)
out["quiet_csd_over_sd_passes_per_token"] = round(T["quiet csd"]["passes_per_token"] / T["quiet sd"]["passes_per_token"], 3)
print(json.dumps(out, indent=1))
PY
