"""How a verb's output is laid out for a person: `Screen`'s headlines, label/value facts, small tables,
warnings and next step. On a terminal with colour the tables have light rules; with NO_COLOR set or stdout
not a terminal the output is plain text with no box drawing, so logs and pipes stay readable. Also
`problems`, a target's shortfall in words, which the plan and the coverage renderers both print."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from reindex.prove.verify import Coverage

LISTED = 20  # rows of a long list shown before "… and N more"


@dataclass(frozen=True)
class Screen:
    """One verb's output: headlines, label/value facts, small tables, warnings, the next step."""

    console: Console
    config: str  # the -c path, for the commands suggested next

    @property
    def fancy(self) -> bool:
        return self.console.is_terminal and not self.console.no_color

    def headline(self, text: str, ok: bool | None = None) -> None:
        style = "bold" if ok is None else ("bold green" if ok else "bold red")
        self.console.print(Text(text, style=style), soft_wrap=not self.fancy)

    def facts(self, rows: Iterable[tuple[str, str]]) -> None:
        """Label/value lines; on a terminal long values wrap under themselves, elsewhere they do not wrap."""
        rows = list(rows)
        if not self.fancy:
            width = max((len(label) for label, _ in rows), default=0)
            for label, shown in rows:
                self.line(f"  {label:<{width}}  {shown}")
            return
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        for label, shown in rows:
            grid.add_row(Text("  " + label), Text(shown))
        self.console.print(grid)

    def table(
        self, title: str, headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()
    ) -> None:
        table = Table(
            title=Text(title, style="bold") if title else None,
            title_justify="left",
            box=box.SIMPLE_HEAD if self.fancy else None,
            show_edge=False,
            pad_edge=False,
            padding=(0, 2),
        )
        for i, header in enumerate(headers):
            table.add_column(header, justify="right" if i in numeric else "left", overflow="fold")
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        if self.fancy:
            self.console.print(table)
            return
        wide = Console(width=100_000, no_color=True, file=io.StringIO())  # plain: no wrapping, no padding
        with wide.capture() as captured:
            wide.print(table)
        for line in captured.get().splitlines():
            self.line(line.rstrip())

    def warn(self, text: str) -> None:
        line = Text("warning: ", style="bold yellow")
        line.append(text)
        self.console.print(line, soft_wrap=not self.fancy)

    def line(self, text: str = "") -> None:
        self.console.print(Text(text), soft_wrap=not self.fancy)

    def next(self, *commands: str) -> None:
        self.line("Next: " + "; then ".join(f"{c} -c {self.config}" for c in commands))


def problems(c: dict[str, Any]) -> str:
    """Every count that keeps the target from complete, as refusals name them (`Coverage.problems`)."""
    return Coverage(**c).problems()
