"""Click options shared by several commands."""

from __future__ import annotations

import click

set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a profile key (TOML value syntax; repeatable).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
