"""Running a HumanEval candidate program in an isolated, time-limited child process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HUMANEVAL_TIMEOUT_S = 10.0

# itself (not in a preexec_fn) keeps the fork safe while torch's and the store's threads run.
_SANDBOX = """\
import resource, runpy, sys
cpu, mem = int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="candidate")  # not __main__: examples under a main guard stay off
"""


def run_humaneval(program: str, test: str, entry_point: str, timeout: float = HUMANEVAL_TIMEOUT_S,
                  mem_bytes: int = 2 << 30) -> tuple[bool, str]:
    """Run ``program + test + check(entry_point)`` with ``python -I`` in a temporary directory (its
    cwd), under a wall-clock limit, CPU, memory and file-size limits, with a minimal environment
    (no proxies, no PYTHON* variables) and stdin closed; its whole process group is killed when
    the time is up. Returns (passed, detail)."""
    source = f"{program}\n\n{test}\n\ncheck({entry_point})\n"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0", "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="csd-humaneval-") as tmp:
        script = Path(tmp) / "candidate.py"
        script.write_text(source, encoding="utf-8")
        cmd = [sys.executable, "-I", "-B", "-c", _SANDBOX, str(script), str(int(timeout) + 1), str(mem_bytes)]
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return False, f"timed out after {timeout:g} s"
        finally:
            _kill_group(proc)   # whatever the program left running in its own process group
    if proc.returncode == 0:
        return True, "passed"
    last = err.decode("utf-8", "replace").strip().splitlines()
    return False, (last[-1] if last else f"exit status {proc.returncode}")[:300]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


