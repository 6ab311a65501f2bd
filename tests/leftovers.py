"""What a killed test run leaves behind, found and removed at the next run's start.

Fixtures stop what they start in their ``finally`` blocks, and a SIGTERM or Ctrl-C of pytest runs those
(``install_interrupt_handler`` turns SIGTERM into KeyboardInterrupt). A ``kill -9`` of pytest, or of one
xdist worker, runs nothing: brokers, PostgreSQL servers and Spark JVMs go on, tmpfs and loop mounts stay
mounted, network namespaces stay (nine PostgreSQL servers were once found running). So every pytest process
marks what it starts:

- processes inherit ``LEVERET_TEST_OWNER=<pid of the pytest process>`` in their environment (set at
  ``pytest_configure``; a broker, ``pg_ctl``'s postmaster and Spark's JVMs all inherit it);
- mounts and namespaces are written down in ``/tmp/leveret-test-owners/<pid>/`` as they are made.

At the start of a run, whatever an owner that is no longer alive left is removed: its processes killed,
its mounts unmounted (lazily), its namespaces deleted. A run that is still going on (another terminal, a
parallel worker) is alive, so nothing of it is touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

OWNER_VARIABLE = "LEVERET_TEST_OWNER"
REGISTRY = Path("/tmp/leveret-test-owners")


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie. (A dead owner's pid reused by another process counts as alive:
    its leftovers are then kept until that process ends, which is harmless.)"""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def mark_owner() -> None:
    """Make this process the owner of what it starts from now on (pytest_configure of every process)."""
    os.environ[OWNER_VARIABLE] = str(os.getpid())


def _record(kind: str, value: str) -> None:
    folder = REGISTRY / str(os.getpid())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / kind, "a") as f:
            f.write(value + "\n")
    except OSError:
        pass  # best effort: the registry only helps the next run clean up


def record_mount(path: str | os.PathLike[str]) -> None:
    _record("mounts", str(path))


def record_namespace(name: str) -> None:
    _record("namespaces", name)


def _owners_of_processes() -> dict[int, list[int]]:
    """{owner pid: [pids of processes carrying it]}, read from /proc/*/environ."""
    owners: dict[int, list[int]] = {}
    needle = f"{OWNER_VARIABLE}=".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(needle):
                try:
                    owners.setdefault(int(item[len(needle):]), []).append(int(entry.name))
                except ValueError:
                    pass
                break
    return owners


def clean_up_after_dead_runs() -> list[str]:
    """Remove what dead owners left; a line per thing removed (pytest prints them)."""
    done: list[str] = []
    me = os.getpid()
    for owner, pids in _owners_of_processes().items():
        if owner == me or _alive(owner):
            continue
        for pid in pids:
            if pid == me:
                continue
            try:
                name = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:80].decode(errors="replace")
                os.kill(pid, signal.SIGKILL)
                done.append(f"killed {pid} ({name.strip()}) left by test run {owner}")
            except OSError:
                pass
    if REGISTRY.is_dir():
        for folder in REGISTRY.iterdir():
            if not folder.name.isdigit() or int(folder.name) == me or _alive(int(folder.name)):
                continue
            mounts = (folder / "mounts").read_text().split() if (folder / "mounts").exists() else []
            for m in reversed(mounts):
                if os.path.ismount(m):
                    subprocess.run(["umount", "-l", m], capture_output=True, check=False)
                    done.append(f"unmounted {m}")
            names = (folder / "namespaces").read_text().split() if (folder / "namespaces").exists() else []
            for n in names:
                if subprocess.run(["ip", "netns", "del", n], capture_output=True, check=False).returncode == 0:
                    done.append(f"deleted network namespace {n}")
            shutil.rmtree(folder, ignore_errors=True)
    return done


def forget_own_records() -> None:
    """At a normal end of the run: its fixtures cleaned up, its record is not needed."""
    shutil.rmtree(REGISTRY / str(os.getpid()), ignore_errors=True)


def install_interrupt_handler() -> None:
    """SIGTERM (a CI time-out, ``kill``) runs the fixtures' clean-up as Ctrl-C does."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        pass  # not the main thread
