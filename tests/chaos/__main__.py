"""Long chaos run: python -m tests.chaos --minutes 30 [--seed N] [--work-dir DIR] [--protocol nakadi]"""

import argparse
import random
import tempfile
import time
from pathlib import Path

from .harness import ChaosRun

parser = argparse.ArgumentParser(prog="python -m tests.chaos")
parser.add_argument("--minutes", type=float, default=30)
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--work-dir", type=Path, default=None)
parser.add_argument(
    "--protocol",
    choices=("feedapi", "nakadi"),
    default="feedapi",
    help="the feed: a FeedAPI feed, or a Nakadi event type",
)
args = parser.parse_args()
seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
print(f"seed {seed} (reproduce with --seed {seed})", flush=True)
work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="feedapi-chaos-"))
if work_dir.exists() and any(work_dir.iterdir()):
    parser.error(f"--work-dir {work_dir} is not empty: a chaos run needs a fresh lakehouse and DAGSTER_HOME")
started = time.monotonic()
chaos = ChaosRun(seed, work_dir, protocol=args.protocol)
try:
    chaos.run(minutes=args.minutes)
    result = "PASSED"
except AssertionError as error:
    result = f"FAILED: {error}"
finally:
    print(chaos.summary())
    chaos.close()
print(f"duration {time.monotonic() - started:.0f} s; result {result}; work dir {work_dir}")
raise SystemExit(0 if result == "PASSED" else 1)
