"""Running a HumanEval candidate so that it passes only when the dataset's tests, run where the
candidate cannot reach them, accepted its answers: the parent of ``sandbox_runner``'s harness and
child. The threat model and what each guard protects against: ``docs/grading.md``."""
from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HUMANEVAL_TIMEOUT_S = 10.0
MEM_BYTES = 2 << 30          # address space of the child
FSIZE_BYTES = 1 << 20        # largest file the child may write (its stdout and stderr included)
ISOLATIONS = ("bwrap", "rlimits")
ENV_VAR = "CSD_SANDBOX"      # auto (default): bwrap when it runs here, else rlimits
_NONCE_BYTES = 32
_HARNESS_GRACE_S = 5.0       # how long past the timeout the parent waits for the harness's verdict

log = logging.getLogger(__name__)


class SandboxError(ValueError):
    """The requested isolation cannot be honoured here; the message says why and what to install."""


# -- which isolation -----------------------------------------------------------------------------
def isolation(mode: str | None = None) -> str:
    """The isolation a run gets here: "bwrap" or "rlimits". ``mode`` (else ``$CSD_SANDBOX``) may
    force one; "auto" (the default) takes bwrap when it can start a sandbox on this machine."""
    mode = (mode or os.environ.get(ENV_VAR) or "auto").strip().lower()
    if mode not in ("auto",) + ISOLATIONS:
        raise SandboxError(f"{ENV_VAR} must be auto, bwrap or rlimits, got {mode!r}")
    if mode == "rlimits":
        return "rlimits"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if mode == "bwrap":
        raise SandboxError(f"the bwrap sandbox was asked for, but {problem}")
    _warn_fallback(problem)
    return "rlimits"


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """``None`` when bubblewrap can run a sandboxed Python here, else why not (checked once)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap is not installed (install Debian's bubblewrap: apt-get install bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="csd-humaneval-probe-") as tmp:
        workdir = os.path.realpath(tmp)
        try:
            probe = subprocess.run(_bwrap_prefix(exe, workdir) + [sys.executable, "-I", "-S", "-c", "pass"],
                                   stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap ({exe}) could not start: {e}"
    if probe.returncode != 0:
        why = probe.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bwrap ({exe}) cannot create its sandbox here: {why[-1] if why else probe.returncode}"
    return None


@functools.lru_cache(maxsize=1)
def _warn_fallback(problem: str) -> None:
    log.warning("HumanEval programs run without the bwrap sandbox (only rlimits and an in-process "
                "guard): %s", problem)


def _bwrap_prefix(exe: str, workdir: str) -> list[str]:
    """The bwrap command line up to the sandboxed command: everything read-only but ``workdir``."""
    args = [exe, "--ro-bind", "/", "/", "--tmpfs", "/tmp"]
    pythons = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                             os.path.dirname(os.path.realpath(sys.executable)))}
    for path in sorted(d for d in pythons if d == "/tmp" or d.startswith("/tmp/")):   # kept visible over the tmpfs
        args += ["--ro-bind", path, path]
    # the working directory is bound last, so that no later mount (/dev, /proc) can cover it
    return args + ["--proc", "/proc", "--dev", "/dev", "--bind", workdir, workdir, "--unshare-all",
                   "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--chdir", workdir, "--"]


# -- the parent ------------------------------------------------------------------------------------
def run_humaneval(program: str, test: str, entry_point: str, timeout: float = HUMANEVAL_TIMEOUT_S,
                  mem_bytes: int = MEM_BYTES, mode: str | None = None, context: str = "") -> tuple[bool, str]:
    """Run ``test``'s ``check`` on ``program``'s ``entry_point``: the program in a sandboxed child, ``context``
    (the problem's prompt, trusted) and ``test`` in the harness. Returns ``(passed, detail)``; the detail says
    why a run failed and ends with the isolation used ("passed (bwrap)")."""
    if not entry_point.isidentifier():
        raise ValueError(f"entry point {entry_point!r} is not a Python identifier")
    iso = isolation(mode)
    nonce = secrets.token_hex(_NONCE_BYTES)
    with tempfile.TemporaryDirectory(prefix="csd-humaneval-") as tmp, \
            tempfile.TemporaryDirectory(prefix="csd-harness-") as harness_dir, \
            tempfile.TemporaryFile(prefix="csd-humaneval-out-") as out, \
            tempfile.TemporaryFile(prefix="csd-humaneval-err-") as err:
        workdir = os.path.realpath(tmp)
        script = Path(workdir) / "candidate.py"
        script.write_text(f"{program}\n", encoding="utf-8")
        child = [sys.executable, "-I", "-B", "-c", _runner_source(), "child", str(script), entry_point, workdir,
                 str(int(timeout) + 1), str(mem_bytes), str(FSIZE_BYTES)]
        cmd = _bwrap_prefix(shutil.which("bwrap") or "bwrap", workdir) + child if iso == "bwrap" else child
        job = {"nonce": nonce, "context": context, "test": test, "entry_point": entry_point, "timeout": timeout,
               "cmd": cmd, "env": _env(workdir), "workdir": workdir}
        # the harness and the child share one new process group: killing it ends both, and
        # whatever the child started (the child's sandbox also dies with bwrap)
        proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", _runner_source(), "harness"],
                                cwd=harness_dir, env=_env(harness_dir), stdin=subprocess.PIPE, stdout=out,
                                stderr=err, start_new_session=True)
        try:
            proc.communicate(json.dumps(job).encode("utf-8"), timeout=timeout + _HARNESS_GRACE_S)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:g} s: no verdict within {timeout + _HARNESS_GRACE_S:g} s ({iso})"
        finally:
            _kill_group(proc)
            proc.wait()
        out.seek(0)
        lines = out.read(1 << 20).decode("utf-8", "replace").splitlines()
        err.seek(max(0, err.seek(0, os.SEEK_END) - 4096))
        last = err.read().decode("utf-8", "replace").strip().splitlines()
    return _verdict(nonce, lines, proc.returncode, last[-1].strip() if last else "", iso)


def _env(home: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "HOME": home, "TMPDIR": home}


def _verdict(nonce: str, lines: list[str], rc: int, last_line: str, iso: str) -> tuple[bool, str]:
    """The harness's verdict, read only from the line that starts with this run's nonce."""
    for line in lines:
        if line.startswith(nonce + " "):
            try:
                verdict = json.loads(line[len(nonce) + 1:])
            except ValueError:
                break
            if verdict.get("passed") is True and rc == 0:
                return True, f"passed ({iso})"
            return False, f"{str(verdict.get('why'))[:300]} ({iso})"
    why = last_line[:300] if last_line else f"exit status {rc}"
    return False, f"the test harness gave no verdict: {why} ({iso})"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass                          # the group is already gone: nothing left to kill
    except PermissionError as e:      # a member changed its credentials; the group id was reused
        log.warning("could not kill the sandbox's process group %d: %s", proc.pid, e)


@functools.lru_cache(maxsize=1)
def _runner_source() -> str:
    return (Path(__file__).parent / "sandbox_runner.py").read_text(encoding="utf-8")
