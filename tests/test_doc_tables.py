"""The docs' generated tables (``tvm-pesto bench report``) say what their JSON says."""
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tvm_pesto.bench.doc_tables import doc_tables, update_docs
from tvm_pesto.cli.main import cli
from tvm_pesto.errors import PestoError

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_generated_table_in_the_docs_is_current():
    tables = [t for doc in DOCS.rglob("*.md") for t in doc_tables(doc)]
    assert {t.kind for t in tables} >= {"placement", "peers"}
    stale = update_docs(DOCS, check=True)
    assert not stale, f"run `tvm-pesto bench report docs`: {[(str(t.doc), str(t.json)) for t in stale]}"


def test_a_table_edited_by_hand_is_found_and_written_again(tmp_path):
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    doc = tmp_path / "docs" / "backends.md"
    text = doc.read_text()
    block = text[text.index("<!-- bench report "):]
    row = next(line for line in block.splitlines() if line.startswith("| ") and "---" not in line
               and not line.startswith("| model"))  # the first figure row of the first table
    doc.write_text(text.replace(row, row.replace(" | ", " | 9", 1), 1))  # one cell edited by hand
    runner = CliRunner()
    res = runner.invoke(cli, ["bench", "report", str(tmp_path / "docs"), "--check"])
    assert res.exit_code == 1 and "backends.md" in res.output
    res = runner.invoke(cli, ["bench", "report", str(tmp_path / "docs")])
    assert res.exit_code == 0 and doc.read_text() == text


def test_a_block_naming_an_unknown_kind_or_a_missing_json_is_refused(tmp_path):
    (tmp_path / "a.md").write_text("<!-- bench report nosuch x.json -->\n<!-- end bench report -->\n")
    with pytest.raises(PestoError, match="names the kind 'nosuch'"):
        update_docs(tmp_path)
    (tmp_path / "a.md").write_text("<!-- bench report peers x.json -->\n<!-- end bench report -->\n")
    with pytest.raises(PestoError, match="cannot be read"):
        update_docs(tmp_path)
