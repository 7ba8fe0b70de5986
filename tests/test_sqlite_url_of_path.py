"""A SQLite URL made from a file path names that file, whatever the path holds: SQLAlchemy
reads `?` as the start of the URL's query and decodes `%XX`, so a data folder such as
`my%20data` or `what?` made the default database another file than the one it was under."""

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from pipetune.service.settings import default_database_url, sqlite_path, sqlite_url

AWKWARD_NAMES = ["my%20data", "what?now", "a#b", "50%", "at@host:1", "plain"]


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_the_url_of_a_path_names_that_path(tmp_path: Path, name: str) -> None:
    path = tmp_path / name / "pipetune.db"
    path.parent.mkdir()
    url = sqlite_url(path)
    assert sqlite_path(url) == path
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
    finally:
        engine.dispose()
    # The engine made its file where the path says, and nowhere else.
    assert path.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_the_default_database_is_under_the_data_folder_whatever_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_home = tmp_path / "data%20home?x"
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    assert sqlite_path(default_database_url()) == data_home / "pipetune" / "pipetune.db"
