"""The idle-streams benchmark runs and finds a place for the new client (with a short stream life)."""

from __future__ import annotations

import pytest

from bench import idle_streams_bench


async def test_bench_runs_and_a_new_client_gets_a_place(capsys: pytest.CaptureFixture[str]) -> None:
    await idle_streams_bench.run(4, 0.5, 10.0)
    assert "4 idle clients: a new client got a place after " in capsys.readouterr().out
