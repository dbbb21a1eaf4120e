"""Time README.md's install commands, each in a fresh clone, and record them in
bench/results/install_times.json (README.md renders the table from it).

Each timed command is a README install line without its final
``&& localargmax-bench``: ``git clone`` of this checkout into a temporary
folder, then ``bash -c COMMAND`` there. The build's own time is the one
setup.py prints (``localargmax: built in M:SS``). Rows are matched by their
``what``; a row not timed in this run keeps its earlier figures (and its own
``measured`` date and load).

    python bench/time_install.py --list                 # the README's install commands
    python bench/time_install.py --only gpu-9.0a --write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "install_times.json"
README = ROOT / "README.md"
TAIL = " && localargmax-bench"
BUILT = re.compile(r"localargmax: built in (\d+):(\d+)")

# what each README install line builds, by a phrase of the line
KINDS = {
    "gpu-9.0a": ("TORCH_CUDA_ARCH_LIST=9.0a", "GPU build for one architecture: torch 2.14.1 (CUDA 13.0), sm_90a only"),
    "gpu": ("torch==2.14.1", "GPU build: torch 2.14.1 (CUDA 13.0), CUDA kernels for sm_80, sm_90a, sm_100"),
    "cpu": ("LOCALARGMAX_CUDA=0", "CPU only: torch 2.13.0+cpu, LOCALARGMAX_CUDA=0"),
}


def readme_commands() -> dict[str, str]:
    """``{kind: command}`` of the README's install lines (those ending in ``&& localargmax-bench``)."""
    found = {}
    for line in README.read_text().splitlines():
        if line.startswith("python3 -m venv") and line.endswith(TAIL):
            command = line[: -len(TAIL)]
            kind = next(k for k, (phrase, _) in KINDS.items() if phrase in command)
            found.setdefault(kind, command)
    return found


def time_one(command: str, log: Path) -> tuple[float, float | None, float]:
    """(seconds, build seconds or None, 1-minute load average at the end) of ``command`` in a fresh clone."""
    with tempfile.TemporaryDirectory(prefix="localargmax-install-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=600)
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        start = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.run(["bash", "-c", command], cwd=clone, stdout=out, stderr=subprocess.STDOUT, env=env)
        seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"time_install: exit {proc.returncode}; see {log}")
    m = BUILT.findall(text)
    build = 60 * int(m[-1][0]) + int(m[-1][1]) if m else None
    return seconds, build, os.getloadavg()[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="print the README's install commands and exit")
    p.add_argument("--only", help=f"comma-separated kinds to time ({', '.join(KINDS)}); default: all")
    p.add_argument("--write", action="store_true", help=f"merge the rows into {RESULTS.relative_to(ROOT)}")
    p.add_argument("--note", help="a word on the machine's state (recorded in env.note)")
    args = p.parse_args(argv)
    commands = readme_commands()
    if args.list:
        for kind, command in commands.items():
            print(f"{kind}: {command}")
        return 0
    kinds = [k.strip() for k in args.only.split(",")] if args.only else list(commands)
    unknown = [k for k in kinds if k not in commands]
    if unknown:
        p.error(f"--only: {unknown} is not among the README's install lines ({', '.join(commands)})")
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": []}
    rows = {r["what"]: r for r in doc["rows"]}
    for kind in kinds:
        what = KINDS[kind][1]
        print(f"time_install: {kind}: {commands[kind]}", file=sys.stderr, flush=True)
        seconds, build, load = time_one(commands[kind], Path(tempfile.gettempdir()) / f"time_install_{kind}.log")
        print(f"time_install: {kind}: {seconds:.0f} s (build {build} s), load {load:.1f}", file=sys.stderr)
        rows[what] = {
            "what": what,
            "command": commands[kind],
            "seconds": round(seconds),
            "build_seconds": build,
            "loadavg": round(load, 1),
            "measured": datetime.date.today().isoformat(),
        }
    order = [KINDS[k][1] for k in KINDS]
    doc["rows"] = sorted(rows.values(), key=lambda r: order.index(r["what"]) if r["what"] in order else len(order))
    doc["command"] = "python bench/time_install.py --write (each row: git clone, then bash -c COMMAND, timed)"
    doc["env"] = {
        "cpu": doc.get("env", {}).get("cpu") or platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "note": args.note or doc.get("env", {}).get("note", ""),
    }
    text = json.dumps(doc, indent=2) + "\n"
    if args.write:
        RESULTS.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
