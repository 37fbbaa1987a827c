"""The README's shape: the set-up commands first (CI runs them), short, the four ways in, one table
of what graphsync does and refuses, links that resolve, and nothing cited from outside the
repository. Its code blocks run in tests/test_docs.py, with every page of docs/.
"""
from __future__ import annotations

import glob
import os
import re

import pytest

import test_docs

pytestmark = pytest.mark.plumbing   # tiers.py: no kernel of its own

ROOT = test_docs.ROOT
README = test_docs.README
SET_UP = ("pip install '.[tensorflow]' && graphsync rewrite fixtures/cifar10_2towers.meta -o /tmp/cifar10_2towers_synced.meta\n"
          "python tests/install.py && python -m pytest -q -n 2\n")
MAX_WORDS = 2100   # "about 2,000": read in ten minutes
_LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")


def _text(path: str = README) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_set_up_commands_come_first():
    assert _text().startswith("# graphsync\n\n```bash\n" + SET_UP + "```\n")


def test_readme_reads_in_ten_minutes():
    words = len(_text().split())
    assert words <= MAX_WORDS, f"README.md has {words} words; move detail to docs/"


def test_readme_shows_the_four_ways_in():
    text = _text()
    commands = [command.split()[:2] for _, command, _ in test_docs.console_commands(README)]
    for way in (["graphsync", "run"], ["graphsync", "rewrite"], ["graphsync", "inspect"], ["graphsync", "verify"]):
        assert way in commands, f"README shows no `{' '.join(way)}`"
    python = [body for lang, body, _, _ in test_docs.blocks(README) if lang == "python"]
    assert any("rewrite_towers(" in body for body in python) and "SyncBatchNormHook()" in text
    assert "graphsync.autosync()" in text   # TF2 steps, and scripts not started by graphsync run
    assert "(docs/training_run.png)" in text and os.path.isfile(os.path.join(ROOT, "docs", "training_run.png"))
    assert "## Glossary" in text


def test_one_table_lists_every_refusal():
    """Every GraphsyncError and GraphsyncWarning the library raises has its row: each message's
    first words (up to its first formatted value) appear in the README's table."""
    text = _text()
    table = text[text.index("## What it synchronizes"):]
    table = table[:table.index("\n## ", 1)]
    missing = []
    for path in glob.glob(os.path.join(ROOT, "graphsync", "**", "*.py"), recursive=True):
        if os.sep + "verification" + os.sep in path:
            continue   # verify's own input errors: docs/verify.md
        for found in re.finditer(r"(?:GraphsyncError|NoTowersError)\(\s*f?\"([^\"\n]*)", _text(path)):
            message = found.group(1)
            if message.startswith("internal"):
                continue   # a bug of graphsync's, not a refusal
            # the message's longest literal stretch (between its {formatted values}), its first 24 characters
            words = max(re.split(r"\{[^}]*\}", message), key=len).strip(" :;,()")[:24]
            if words not in table:
                missing.append(f"{os.path.relpath(path, ROOT)}: {message}")
    assert not missing, "refusals missing from the README's table:\n" + "\n".join(missing)


def test_links_resolve_and_stay_in_the_repository():
    pages = [README] + glob.glob(os.path.join(ROOT, "docs", "*.md")) + \
        [os.path.join(ROOT, name) for name in ("CONTRIBUTING.md", "BENCHMARKS.md")] + \
        glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.md"))
    for page in pages:
        text = _text(page)
        assert "shared/docs" not in text and "syncbn-math" not in text, f"{page} cites a document outside the repository"
        assert not re.search(r"(?<![\w.])/work/", text), f"{page} names a path of one machine"
        for link in _LINK.finditer(text):
            target = link.group("target")
            if re.match(r"\w+://", target):
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), target))
            assert resolved.startswith(ROOT + os.sep), f"{page}: link {target} leaves the repository"
            assert os.path.exists(resolved), f"{page}: link {target} resolves to nothing"
