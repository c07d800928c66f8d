"""``ray start`` for the nodes of a multi-node cluster on one machine that keeps to loopback
(``python -m tests.e2e.ray_start_loopback start ...``).

The one setting that keeps Ray's processes on 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which
they inherit) also makes the command line refuse to join a node to a cluster, and makes it turn a
loopback node address into the machine's own. Here the command line is told joining is allowed and
that this machine's address is 127.0.0.1; every process it starts still inherits the setting.
"""

from __future__ import annotations

import sys

from ray._private import ray_constants, services
from ray.scripts.scripts import main

if __name__ == "__main__":
    ray_constants.ENABLE_RAY_CLUSTER = True
    services.get_node_ip_address = lambda address=None: "127.0.0.1"
    sys.argv = ["ray", *sys.argv[1:]]
    main()
