"""The README's Python API example runs as written (in a fresh interpreter,
since it creates a process group) and its own assertion holds."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_api_example_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    example = next(b for b in blocks if "lm_head_argmax(" in b and "init_process_group" in b)
    script = tmp_path / "example.py"
    script.write_text(example)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
