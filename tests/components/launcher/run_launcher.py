"""`python -m tests.components.launcher.run_launcher HOST`: run one job through the launcher against the
stand-in at HOST, as a component process would (the cancellation test sends it SIGTERM)."""

from __future__ import annotations

import logging
import sys

from tests.components.launcher.follow.test_launcher import launcher_for_host, manifest


def main(host: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    outcome = launcher_for_host(host).run(manifest(), timeout=120)
    print(f"finished: {outcome.phase}")


if __name__ == "__main__":
    main(sys.argv[1])
