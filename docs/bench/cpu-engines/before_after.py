"""The eager lean path before (caba356) and after the static engine's refactor of LeanLM.forward, on
the embedded int8 target (per-pass activations, as the command line loads it): 60 interleaved rounds
of 3 passes of 1 and of 7 tokens each. Run from the repository root:
    PYTHONPATH=. python docs/bench/cpu-engines/before_after.py > docs/bench/cpu-engines/before_after.json
"""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from csd.models import load_pair
from csd.profile import machine_name
from tools.engines_cpu import time_engines  # tools/engines_cpu.py at commit cbc7ebb (since removed)

BEFORE = "caba356"
old = subprocess.run(["git", "show", f"{BEFORE}:csd/lm.py"], capture_output=True, text=True, check=True).stdout
where = Path(tempfile.mkdtemp())
(where / "old_lm.py").write_text(old.replace("from .quant import", "from csd.quant import"))
sys.path.insert(0, str(where))
from old_lm import LeanLM as OldLeanLM  # noqa: E402

pair = load_pair(int8_activations="pass", engine="eager")
prompt = pair.encode_prompt("Write a Python function that returns the n-th Fibonacci number, and explain it.")
res = {"command": "PYTHONPATH=. python docs/bench/cpu-engines/before_after.py", "before": BEFORE,
       "cpu": machine_name(pair.device), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
res["target"] = time_engines({"after": pair.target_lm, "before": OldLeanLM(pair.target)}, (1, 7), prompt, 60)
res["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
print(json.dumps(res, indent=1))
