"""The command line: typer commands over reindex.commands, and the terminal's progress and tables.

cli.py         the typer app: parse → commands.<verb>() → render; with progress.py, the only place that
               prints or exits
progress.py    on stderr while a verb works: a spinner, the run's progress bar; signals become a stop
consoles.py    the two consoles: results on stdout, progress and errors on stderr
terminal.py    each verb's summary for a person, from its typed result (plan_view.py: `reindex plan`'s)
screen.py      the layout those summaries share: headlines, facts, tables, warnings; plain off a terminal
"""

from __future__ import annotations
