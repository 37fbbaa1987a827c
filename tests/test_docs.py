"""The documentation runs as written: README.md and every page of docs/.

- ```python blocks run one after another in ONE interpreter (one TensorFlow import for all pages),
  each in fresh globals with a fresh default graph; what each prints is checked against the ```text
  block right after it, or against the inline `prints ...` that follows it.
- ```console blocks: their `$ graphsync ...` commands run in this process, page by page and in order
  (a page's later commands may read what its earlier ones wrote), each command's output checked
  line by line.
- A ```console block with a command in the background (ending in `&`) is a shell session: its
  commands run as written in one bash, in their own process group (stopped at the end), with free
  ports the test picks for 2222 and 2223.
- ```text blocks are the output of the block before them; README's first block (```bash, the set-up
  commands) is what CI runs. Any other kind of block fails `test_every_block_runs`.
- `mkdocs build --strict` builds the site (the API reference from the docstrings) without a warning.

Only what changes from run to run is masked before comparing: relative changes printed as 1.2e-03
(float rounding differs between machines), event file names (time and host), the temporary directory,
and in shell sessions TensorFlow's own start-up lines (absl, oneDNN, CUDA: they depend on the machine).
When the library's output changes on purpose, refresh the pages with

    GRAPHSYNC_UPDATE_DOCS=1 python -m pytest -q tests/test_docs.py
"""
from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
WALKTHROUGH_DIR = "/tmp/walkthrough"
_BLOCK = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```\n(?P<after>(?:(?!^```).)*)", re.S | re.M)
# 1.2e-07, or a table's exact 0, with the padding that right-aligns it (its width varies)
_FIGURE = re.compile(r" *\b\d\.\de[+-]\d\d\b| {2,}0(?=  |\n|$)")
_EVENT_FILE = re.compile(r"events\.out\.tfevents\.\S+")
UPDATE = bool(os.environ.get("GRAPHSYNC_UPDATE_DOCS") or os.environ.get("GRAPHSYNC_UPDATE_README"))
REFRESH = "run GRAPHSYNC_UPDATE_DOCS=1 python -m pytest -q tests/test_docs.py to refresh the page"
RUNNABLE = ("python", "console", "text")


def relative(page: str) -> str:
    return os.path.relpath(page, ROOT)


def blocks(page: str) -> list[tuple[str, str, str, int]]:
    """(language, body, text up to the next block, line) of every fenced block of `page`."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    return [(m.group("lang"), m.group("body"), m.group("after"), text[:m.start()].count("\n") + 1)
            for m in _BLOCK.finditer(text)]


def _replace_in(page: str, old: str, new: str) -> None:
    with open(page, encoding="utf-8") as f:
        text = f.read()
    assert text.count(old) == 1, f"cannot tell which block of {relative(page)} to refresh"
    with open(page, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))


def _expected_output(page_blocks, index):
    """The output shown for page_blocks[index]: the next block when it is ```text and only a short
    sentence lies between, else the inline `…` after 'prints'."""
    _, _, after, _ = page_blocks[index]
    if index + 1 < len(page_blocks) and page_blocks[index + 1][0] == "text" and len(after.strip()) < 20:
        return "exact", page_blocks[index + 1][1]
    found = re.match(r"\s*prints `([^`]+)`", after)
    return ("contains", found.group(1)) if found else (None, None)


def normalize(text: str, tmp: str | None = None) -> list[str]:
    if tmp:
        text = text.replace(tmp, WALKTHROUGH_DIR)
    text = _EVENT_FILE.sub("events.out.tfevents.<time>.<host>", _FIGURE.sub(" <figure>", text))
    return [line.rstrip() for line in text.strip().splitlines()]


def test_every_block_runs():
    """No block the tests would not run: python and console run, text is the output before it."""
    for page in PAGES:
        page_blocks = blocks(page)
        for i, (lang, _, _, line) in enumerate(page_blocks):
            if page == README and i == 0:
                assert lang == "bash", "README's set-up commands come first, in a bash block (CI runs them)"
                continue
            where = f"{relative(page)} line {line}"
            assert lang in RUNNABLE, f"{where}: a ```{lang} block does not run in the tests"
            if lang == "text":
                assert i > 0 and page_blocks[i - 1][0] == "python" and _expected_output(page_blocks, i - 1)[0] \
                    == "exact", f"{where}: a ```text block must show the output of the python block before it"


# ---- python blocks: one interpreter for all of them ------------------------------------------------

PYTHON = [(page, i, line) for page in PAGES for i, (lang, _, _, line) in enumerate(blocks(page)) if lang == "python"]

_RUNNER = r'''
import contextlib, io, json, sys, traceback
blocks = json.load(open(sys.argv[1]))
results = {}
for key, code in blocks:
    if "tensorflow" in sys.modules:
        import tensorflow as tf
        tf.compat.v1.reset_default_graph()
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, key, "exec"), {"__name__": "__main__"})
        error = None
    except BaseException:   # noqa: BLE001 - reported for that block, the others still run
        error = traceback.format_exc()
    results[key] = {"stdout": printed.getvalue(), "error": error}
json.dump(results, open(sys.argv[2], "w"))
'''


def _key(page: str, line: int) -> str:
    return f"{relative(page)}:{line}"


@pytest.fixture(scope="module")
def python_results(tmp_path_factory):
    """Every python block of every page, run once in one interpreter."""
    tmp = tmp_path_factory.mktemp("doc_blocks")
    (tmp / "blocks.json").write_text(json.dumps([(_key(page, line), blocks(page)[i][1]) for page, i, line in PYTHON]))
    (tmp / "runner.py").write_text(_RUNNER)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(tmp / "runner.py"), str(tmp / "blocks.json"), str(tmp / "results.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp / "results.json").read_text())


@pytest.mark.parametrize("page,index,line", PYTHON, ids=[_key(p, line) for p, _, line in PYTHON])
def test_python_block_runs_as_written(page, index, line, python_results):
    result = python_results[_key(page, line)]
    assert result["error"] is None, f"{_key(page, line)}:\n{result['error'][-3000:]}"
    page_blocks = blocks(page)
    how, expected = _expected_output(page_blocks, index)
    printed = result["stdout"]
    if how == "exact" and UPDATE and normalize(printed) != normalize(expected):
        _replace_in(page, "```text\n" + expected + "```", "```text\n" + printed.strip() + "\n```")
    elif how == "exact":
        assert normalize(printed) == normalize(expected), f"{_key(page, line)} prints:\n{printed}\n{REFRESH}"
    elif how == "contains":
        assert expected in printed, f"{_key(page, line)} prints:\n{printed}"


# ---- console blocks: graphsync commands, in this process -------------------------------------------

def is_shell_session(body: str) -> bool:
    return any(text.startswith("$ ") and text.rstrip().endswith("&") for text in body.splitlines())


def console_commands(page: str, shell_sessions: bool = False):
    """(line, command, shown output) of every `$ command` in the ```console blocks of `page` (the
    shell sessions' only, or all others), in order."""
    commands = []
    for lang, body, _, line in blocks(page):
        if lang != "console" or is_shell_session(body) != shell_sessions:
            continue
        current = None
        for offset, text in enumerate(body.splitlines()):
            if text.startswith("$ "):
                current = [line + 1 + offset, text[2:], []]
                commands.append(current)
            elif current is not None:
                current[2].append(text)
    return [(n, command, "\n".join(output)) for n, command, output in commands]


def _refresh_command(page: str, command: str, shown: str, fresh: str) -> None:
    _replace_in(page, f"$ {command}\n{shown}\n" if shown else f"$ {command}\n",
                f"$ {command}\n{fresh}\n" if fresh else f"$ {command}\n")


def _invoke(args):
    """One command in this process; `graphsync run` runs a script here, so what it changes of the
    interpreter (sys.argv, sys.path[0], __main__) is put back."""
    from click.testing import CliRunner

    from cli.main import main
    saved = sys.argv[:], sys.path[:], sys.modules["__main__"]
    if args[0] == "run" and "tensorflow" in sys.modules:   # a script builds into the default graph:
        sys.modules["tensorflow"].compat.v1.reset_default_graph()   # a fresh one, as in a new process
    try:
        return CliRunner().invoke(main, args, catch_exceptions=False)
    finally:
        sys.argv[:], sys.path[:], sys.modules["__main__"] = saved


CONSOLE_PAGES = [p for p in PAGES if console_commands(p)]


@pytest.mark.parametrize("page", CONSOLE_PAGES, ids=[relative(p) for p in CONSOLE_PAGES])
def test_console_commands_print_what_the_page_shows(page, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    tmp = str(tmp_path / "walkthrough")
    os.makedirs(tmp)
    for line, command, shown in console_commands(page):
        args = shlex.split(command.replace(WALKTHROUGH_DIR, tmp))
        assert args[0] == "graphsync", f"{relative(page)} line {line}: only graphsync commands run here"
        result = _invoke(args[1:])
        # `run`: the script's lines and graphsync's, in the order a terminal shows them
        printed = result.output if args[1] == "run" else result.stdout + result.stderr
        if UPDATE and normalize(printed, tmp) != normalize(shown):
            _refresh_command(page, command, shown, printed.replace(tmp, WALKTHROUGH_DIR).strip())
            continue
        assert normalize(printed, tmp) == normalize(shown), \
            f"{relative(page)} line {line}: `{command}` prints (exit {result.exit_code}):\n{printed}\n{REFRESH}"
        failing = "graphsync: error:" in shown
        assert (result.exit_code != 0) == failing, f"{relative(page)} line {line}: exit {result.exit_code}"


# ---- shell sessions: e.g. two between-graph workers, one in the background -------------------------

_TF_STARTUP = re.compile(r"^(WARNING: All log messages before absl::InitializeLog|[IWEF]\d{4} \d\d:\d\d:\d\d"
                         r"|To enable the following instructions)")
_PORTS = ("2222", "2223")
SESSION_PAGES = [p for p in PAGES if console_commands(p, shell_sessions=True)]


@pytest.mark.parametrize("page", SESSION_PAGES, ids=[relative(p) for p in SESSION_PAGES])
def test_shell_sessions_print_what_the_page_shows(page, tmp_path):
    import cluster as cl
    commands = console_commands(page, shell_sessions=True)
    tmp = str(tmp_path / "walkthrough")
    ports = [str(p) for p in cl.free_ports(len(_PORTS))]
    marker = "@@DOCS-COMMAND@@"
    script = ["exec 2>&1"]
    for _, command, _ in commands:
        for port, free in zip(_PORTS, ports):
            command = command.replace(f":{port}", f":{free}")
        script += [f"echo {marker}", command.replace(WALKTHROUGH_DIR, tmp)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    shell = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        out, _ = shell.communicate(timeout=600)
    finally:
        try:
            os.killpg(shell.pid, 9)   # whatever the session left running
        except ProcessLookupError:
            pass
    outputs = out.split(marker + "\n")[1:]
    assert len(outputs) == len(commands), out
    for (line, command, shown), printed in zip(commands, outputs):
        printed = "\n".join(l for l in printed.splitlines() if not _TF_STARTUP.match(l))
        for port, free in zip(_PORTS, ports):
            printed = printed.replace(f":{free}", f":{port}")
        if UPDATE and normalize(printed, tmp) != normalize(shown):
            _refresh_command(page, command, shown, printed.replace(tmp, WALKTHROUGH_DIR).strip())
            continue
        assert normalize(printed, tmp) == normalize(shown), \
            f"{relative(page)} line {line}: `{command}` prints:\n{printed}\n{REFRESH}"
    assert shell.returncode == 0, out


# ---- the site ----------------------------------------------------------------------------------------

def test_docs_build_strictly(tmp_path):
    """`mkdocs build --strict`: every page, link and API entry resolves, and no docstring warns.
    mkdocs and mkdocstrings are test requirements: without them this fails, it does not skip."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           os.path.join(ROOT, "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert os.path.isfile(tmp_path / "site" / "api" / "index.html")
