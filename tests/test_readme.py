"""The README runs as written: every ```python block in a fresh interpreter (its output checked
against the ```text block or the inline `prints ...` that follows it), every ```console block's
commands in order, their output checked line by line. A ```console block with a command in the
background (ending in `&`) is a shell session: its commands run as written in one bash, in their
own process group (stopped at the end), with the free ports the test picks for 2222 and 2223.

Only what changes from run to run is masked before comparing: relative changes printed as 1.2e-03
(float rounding differs between machines), event file names (time and host), the temporary directory,
and in shell sessions TensorFlow's own start-up lines (absl, oneDNN, CUDA: they depend on the machine).
When the library's output changes on purpose, refresh the README with

    GRAPHSYNC_UPDATE_README=1 python -m pytest -q tests/test_readme.py
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
WALKTHROUGH_DIR = "/tmp/walkthrough"
_BLOCK = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```\n(?P<after>(?:(?!^```).)*)", re.S | re.M)
# 1.2e-07, or a table's exact 0, with the padding that right-aligns it (its width varies)
_FIGURE = re.compile(r" *\b\d\.\de[+-]\d\d\b| {2,}0(?=  |\n|$)")
_EVENT_FILE = re.compile(r"events\.out\.tfevents\.\S+")
UPDATE = bool(os.environ.get("GRAPHSYNC_UPDATE_README"))
REFRESH = "run GRAPHSYNC_UPDATE_README=1 python -m pytest -q tests/test_readme.py to refresh the README"


def _replace_in_readme(old: str, new: str) -> None:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert text.count(old) == 1, "cannot tell which README block to refresh"
    with open(README, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))


def _blocks():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks = [(m.group("lang"), m.group("body"), m.group("after"), text[:m.start()].count("\n") + 1)
              for m in _BLOCK.finditer(text)]
    return blocks


def _expected_output(blocks, index):
    """The output shown for blocks[index]: the next block when it is ```text and only a short
    sentence lies between, else the inline `…` after 'prints'."""
    _, _, after, _ = blocks[index]
    if index + 1 < len(blocks) and blocks[index + 1][0] == "text" and len(after.strip()) < 20:
        return "exact", blocks[index + 1][1]
    found = re.match(r"\s*prints `([^`]+)`", after)
    return ("contains", found.group(1)) if found else (None, None)


def _normalize(text: str, tmp: str | None = None) -> list[str]:
    if tmp:
        text = text.replace(tmp, WALKTHROUGH_DIR)
    text = _EVENT_FILE.sub("events.out.tfevents.<time>.<host>", _FIGURE.sub(" <figure>", text))
    return [line.rstrip() for line in text.strip().splitlines()]


PYTHON = [(i, line) for i, (lang, _, _, line) in enumerate(_blocks()) if lang == "python"]


def test_readme_has_the_walkthrough():
    blocks = _blocks()
    assert len(PYTHON) >= 2 and sum(lang == "console" for lang, *_ in blocks) >= 3
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("# graphsync\n\n```bash\npip install . && ")   # the set-up commands come first
    assert "(docs/tensorboard.png)" in text and os.path.isfile(os.path.join(ROOT, "docs", "tensorboard.png"))


@pytest.mark.parametrize("index", [i for i, _ in PYTHON], ids=[f"line{line}" for _, line in PYTHON])
def test_python_block_runs_as_written(index, tmp_path):
    blocks = _blocks()
    _, body, _, line = blocks[index]
    script = tmp_path / f"readme_line{line}.py"
    script.write_text(body)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"README line {line}:\n{done.stderr[-3000:]}"
    how, expected = _expected_output(blocks, index)
    if how == "exact" and UPDATE and _normalize(done.stdout) != _normalize(expected):
        _replace_in_readme("```text\n" + expected + "```", "```text\n" + done.stdout.strip() + "\n```")
    elif how == "exact":
        assert _normalize(done.stdout) == _normalize(expected), f"README line {line} prints:\n{done.stdout}\n{REFRESH}"
    elif how == "contains":
        assert expected in done.stdout, f"README line {line} prints:\n{done.stdout}"


def _is_shell_session(body: str) -> bool:
    return any(text.startswith("$ ") and text.rstrip().endswith("&") for text in body.splitlines())


def _console_commands(shell_sessions: bool = False):
    """(README line, command, shown output) of every `$ command` in ```console blocks (the shell
    sessions' only, or all others), in order."""
    commands = []
    for lang, body, _, line in _blocks():
        if lang != "console" or _is_shell_session(body) != shell_sessions:
            continue
        current = None
        for offset, text in enumerate(body.splitlines()):
            if text.startswith("$ "):
                current = [line + 1 + offset, text[2:], []]
                commands.append(current)
            elif current is not None:
                current[2].append(text)
    return [(n, command, "\n".join(output)) for n, command, output in commands]


def _invoke(args):
    """One command in this process; `graphsync run` runs a script here, so what it changes of the
    interpreter (sys.argv, sys.path[0], __main__) is put back."""
    saved = sys.argv[:], sys.path[:], sys.modules["__main__"]
    try:
        return CliRunner().invoke(main, args, catch_exceptions=False)
    finally:
        sys.argv[:], sys.path[:], sys.modules["__main__"] = saved


def test_console_commands_print_what_the_readme_shows(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    tmp = str(tmp_path / "walkthrough")
    os.makedirs(tmp)
    commands = _console_commands()
    assert [c.split()[:2] for _, c, _ in commands][:4] == [["graphsync", "run"], ["graphsync", "inspect"],
                                                           ["graphsync", "rewrite"], ["graphsync", "verify"]]
    for line, command, shown in commands:
        args = shlex.split(command.replace(WALKTHROUGH_DIR, tmp))
        assert args[0] == "graphsync", f"README line {line}: only graphsync commands run here"
        result = _invoke(args[1:])
        # `run`: the script's lines and graphsync's, in the order a terminal shows them
        printed = result.output if args[1] == "run" else result.stdout + result.stderr
        if UPDATE and _normalize(printed, tmp) != _normalize(shown):
            fresh = printed.replace(tmp, WALKTHROUGH_DIR).strip()
            _replace_in_readme(f"$ {command}\n{shown}\n", f"$ {command}\n{fresh}\n")
            continue
        assert _normalize(printed, tmp) == _normalize(shown), \
            f"README line {line}: `{command}` prints (exit {result.exit_code}):\n{printed}\n{REFRESH}"
        failing = "graphsync: error:" in shown
        assert (result.exit_code != 0) == failing, f"README line {line}: exit {result.exit_code}"


_TF_STARTUP = re.compile(r"^(WARNING: All log messages before absl::InitializeLog|[IWEF]\d{4} \d\d:\d\d:\d\d"
                         r"|To enable the following instructions)")
_PORTS = ("2222", "2223")


def test_shell_sessions_print_what_the_readme_shows(tmp_path):
    """E.g. two between-graph workers, one in the background: each command's output as shown."""
    import cluster as cl
    commands = _console_commands(shell_sessions=True)
    assert any(c.rstrip().endswith("&") for _, c, _ in commands)
    tmp = str(tmp_path / "walkthrough")
    ports = [str(p) for p in cl.free_ports(len(_PORTS))]
    marker = "@@README-COMMAND@@"
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
        if UPDATE and _normalize(printed, tmp) != _normalize(shown):
            fresh = printed.replace(tmp, WALKTHROUGH_DIR).strip()
            _replace_in_readme(f"$ {command}\n{shown}\n" if shown else f"$ {command}\n",
                               f"$ {command}\n{fresh}\n" if fresh else f"$ {command}\n")
            continue
        assert _normalize(printed, tmp) == _normalize(shown), \
            f"README line {line}: `{command}` prints:\n{printed}\n{REFRESH}"
    assert shell.returncode == 0, out
