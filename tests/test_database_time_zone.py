"""The service's "within the last N seconds" on PostgreSQL in a session time zone with
daylight saving (the server's default zone, the host's on Debian; `ALTER DATABASE ... SET
timezone`; PGTZ). A negative timedelta went to PostgreSQL as '-1 day +23:58:00', whose day
is a calendar day of that zone: 23 or 25 hours for a day after each change, so every worker
read silent (no worker live, `pipetune_workers_live` 0, `?state=live` empty) or a dead one
live an hour longer. A zone whose daylight saving began at today's midnight (UTC) makes the
change happen within the last day, whenever the test runs."""

from __future__ import annotations

import datetime as dt
from urllib.parse import quote

from service_support import client_for, metric_value, register
from sqlalchemy import func, select

from pipetune.service.db import Database, database_now_plus

pytest_plugins = ["service_fixtures"]


def daylight_saving_since_today() -> str:
    """A POSIX zone one hour ahead from today's 00:00 UTC (PostgreSQL reads POSIX zones):
    standard UTC+0 ("AAA"), daylight ("BBB") from today, 0-based day of the year, to half a
    year on."""
    today = dt.datetime.now(dt.UTC).timetuple().tm_yday - 1
    return f"AAA0BBB,{today}/0,{(today + 182) % 365}/0"


def with_time_zone(url: str, zone: str) -> str:
    return f"{url}?options={quote(f'-c TimeZone={zone}')}"


def test_seconds_ago_is_seconds_ago_across_a_daylight_saving_change(pg):
    db = Database(with_time_zone(pg, daylight_saving_since_today()), pool_size=1)
    try:
        with db.read() as s:
            assert s.scalar(select(func.current_setting("TimeZone"))).startswith("AAA0BBB")
            now, since, ahead = s.execute(  # (one statement: one statement_timestamp())
                select(
                    func.statement_timestamp(),
                    database_now_plus(False, -120),
                    database_now_plus(False, 90_000),
                )
            ).one()
    finally:
        db.dispose()
    assert (now - since).total_seconds() == 120
    assert (ahead - now).total_seconds() == 90_000


def test_a_worker_heard_from_just_now_is_live_in_such_a_zone(pg):
    with client_for(with_time_zone(pg, daylight_saving_since_today())) as client:
        register(client, "w1")
        listed = client.get("/v1/workers").json()
        assert listed["counts"]["live"] == 1, listed
        live = client.get("/v1/workers", params={"state": "live"}).json()["workers"]
        assert [w["name"] for w in live] == ["w1"]
        exposition = client.get("/metrics").text
        assert (
            metric_value(exposition, "pipetune_workers_live", gpu="h100", runner="simulated") == 1
        )
