"""A driver that launches workers, starts a long call, then ends as told.

    python driver_program.py TEMP_DIR MODE     (MODE: exit | interrupt | close | hang)
Prints the worker pids and the Ray session dir before ending.
"""

import os
import sys
import time

from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker


class Sleeper(Worker):
    def __init__(self):
        super().__init__()

    def pid(self):
        return os.getpid()

    def sleep(self, seconds):
        time.sleep(seconds)


def main():
    import ray

    cluster = Cluster(temp_dir=sys.argv[1], log_to_driver=False)
    group = Sleeper.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="sleepers")
    pids = group.pid().wait()
    session = ray._private.worker._global_node.get_session_dir_path()
    print("STATE", " ".join(map(str, pids)), session, flush=True)
    group.sleep(300)  # pending while the driver ends
    mode = sys.argv[2]
    if mode == "exit":
        sys.exit(3)
    if mode == "interrupt":
        raise KeyboardInterrupt
    if mode == "close":
        cluster.shutdown()
        print("CLOSED", flush=True)
        time.sleep(300)
    time.sleep(300)


if __name__ == "__main__":
    main()
