"""Read back the markdown tables of :func:`tinyllama.harness.records.markdown_table`, whose padding follows
the widest cell: a test states a row's cells, not its spacing."""

from __future__ import annotations


def table_rows(text: str) -> list[list[str]]:
    """The cells of each markdown table row in ``text`` (the header and the alignment row included), stripped."""
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
