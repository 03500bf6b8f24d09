"""The agent's history store as the post-mortem commands (``export``, ``report``) find it
and read it: one place that says where it is, that it is missing, or that it cannot be
read, in one line each."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import click

from tpumon.common.config import ConfigError, load_config

if TYPE_CHECKING:
    from tpumon.store.database import HistoryDB


def history_path(config_path: str | None, state_dir: str | None, purpose: str) -> Path:
    """The store's database under ``--state-dir`` (else the configuration's); an error if
    there is none. ``purpose`` ends the message for an empty state_dir ("to export")."""
    from tpumon.store.database import database_path

    config = load_config(config_path, {"store.state_dir": state_dir})
    if not config["store.state_dir"]:
        raise ConfigError(f"store.state_dir is empty: no history store {purpose}")
    path = database_path(config["store.state_dir"])
    if not path.exists():
        raise click.ClickException(f"{path}: no history store here (is --state-dir right?)")
    return path


@contextlib.contextmanager
def reading_history(path: Path) -> Iterator[HistoryDB]:
    """The store, read only (the agent may be writing it); a database error while it is
    open becomes one error line naming the file."""
    from tpumon.store.database import HistoryDB, Retention

    try:
        db = HistoryDB(path, Retention(), read_only=True)
        try:
            yield db
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise click.ClickException(f"{path}: cannot read it: {exc}") from None
