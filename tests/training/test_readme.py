"""The README's and the docs guides' Python examples run (with a shorter training run)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
# the README's examples, then those the docs pages took over from it
PAGES = [README] + [page.read_text() for page in sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    b for page in PAGES for b in re.findall(r"```python\n(.*?)```", page, flags=re.S)
]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index):
    code = BLOCKS[index].replace("total_frames=60_000", "total_frames=480")
    code = code.replace(">= 1_000:", ">= 160:")  # replayed updates happen too
    exec(compile(code, f"README block {index}", "exec"), {})


def test_readme_has_examples():
    assert len(BLOCKS) >= 2
