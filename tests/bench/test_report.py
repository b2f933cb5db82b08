"""bench/report.py --check: the committed results pages, the README's results table
and the tables in the hand-written pages are what bench/results/*.json give, and a
stale one is caught."""

import shutil
import sys
from pathlib import Path

import pytest
from builders import load_script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # report.py imports its neighbours
report = load_script("bench/report.py")


@pytest.fixture
def checkout(tmp_path):
    """A copy of the generated files (the README and the docs' pages)."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(
        ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("_build")
    )
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


def test_a_stale_table_in_a_hand_written_page_fails_the_check(checkout, capsys):
    page = checkout / "docs" / "recurrent.md"
    text = page.read_text()
    assert "<!-- report: recurrent_cartpole -->" in text
    page.write_text(text.replace("| 5/5 |", "| 4/5 |", 1))
    assert report.main(["--check", "--root", str(checkout)]) == 1
    assert "recurrent.md (committed)" in capsys.readouterr().out
    assert report.main(["--write", "--root", str(checkout)]) == 0
    assert page.read_text() == text


def test_every_block_named_in_the_pages_is_known_and_every_block_is_used():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    used = {
        m[2]
        for page in pages
        if "_build" not in page.parts
        for m in report.BLOCK.finditer(page.read_text())
    }
    assert used == set(report.BLOCKS)


def test_an_unknown_block_is_an_error_naming_it(checkout):
    page = checkout / "docs" / "atari.md"
    page.write_text(page.read_text() + "\n<!-- report: nope -->\n<!-- /report -->\n")
    with pytest.raises(KeyError, match="nope"):
        report.main(["--check", "--root", str(checkout)])
