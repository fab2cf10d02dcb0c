"""The short chaos run on a Nakadi event type (CI; a file of its own, so that pytest-xdist runs it
beside the FeedAPI one). The long form: `python -m tests.chaos --minutes 30 --seed N --protocol nakadi`."""

from .harness import ChaosRun


def test_short_chaos_run_on_a_nakadi_event_type_keeps_exactly_once(tmp_path, connect_server):
    chaos = ChaosRun(seed=11, work_dir=tmp_path, spark_port=connect_server.port, protocol="nakadi")
    try:
        tally = chaos.run(steps=6)
    finally:
        print(chaos.summary())
        chaos.close()
    assert tally.checks == 7
    assert chaos.chaos_runs >= 3 and chaos.chaos_faults > 0 and sum(tally.kills.values()) > 0
    assert tally.runs["killed"] >= 1  # a kill landed: a run died at a moment the harness drew
