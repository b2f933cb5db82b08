"""bench/report.py --check: the committed results pages and the README's results
table are what bench/results/*.json give, and a stale one is caught."""

import shutil
import sys
from pathlib import Path

import pytest
from builders import load_script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # report.py imports its neighbours
report = load_script("bench/report.py")


@pytest.fixture
def checkout(tmp_path):
    """A copy of the generated files (the README and docs/results/)."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs" / "results", tmp_path / "docs" / "results")
    return tmp_path


def test_committed_pages_match_the_data(checkout):
    assert report.main(["--check", "--root", str(checkout)]) == 0


def test_a_stale_page_fails_the_check_with_a_diff(checkout, capsys):
    page = checkout / "docs" / "results" / "learning.md"
    page.write_text(page.read_text().replace("5/5", "4/5", 1))
    assert report.main(["--check", "--root", str(checkout)]) == 1
    assert "learning.md (committed)" in capsys.readouterr().out
    assert report.main(["--write", "--root", str(checkout)]) == 0
    assert report.main(["--check", "--root", str(checkout)]) == 0


def test_a_stale_readme_table_fails_the_check(checkout):
    readme = checkout / "README.md"
    readme.write_text(readme.read_text().replace("| CartPole-v1 → 500 | ", "| x | ", 1))
    assert report.main(["--check", "--root", str(checkout)]) == 1
