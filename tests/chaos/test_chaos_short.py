"""The short chaos run (CI). The long form: `python -m tests.chaos --minutes 30 --seed N`."""

from .harness import ChaosRun


def test_short_chaos_run_keeps_exactly_once(tmp_path, connect_server):
    chaos = ChaosRun(seed=7, work_dir=tmp_path, spark_port=connect_server.port)
    try:
        tally = chaos.run(steps=8)
    finally:
        print(chaos.summary())
        chaos.close()
    # the run was not empty: runs under faults, kills, and a check after every step
    assert tally.checks == 9
    assert chaos.chaos_runs >= 3 and chaos.chaos_faults > 0 and sum(tally.kills.values()) > 0
    assert tally.runs["killed"] >= 1  # a kill landed: a run died at a moment the harness drew
