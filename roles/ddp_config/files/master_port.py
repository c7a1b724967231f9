"""Is the rendezvous port free on this (rank-0) node, or which port from a range is?

Run on the node by roles/ddp_config with the node's own Python (standard library only):
    python3 master_port.py PORT          -> {"port": PORT, "free": true|false}
    python3 master_port.py PORT --search N -> the first free port of PORT..PORT+N-1 (free false if none)
"""

from __future__ import annotations

import argparse
import json
import socket


def is_free(port: int) -> bool:
    """True when a listening socket could take ``port`` on every address, as the trainer's TCP store does.

    SO_REUSEADDR ignores connections of an earlier run still in TIME_WAIT (the store sets it too), while a
    socket that listens on the port, on any address, still makes the bind fail.
    """
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this node
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
                sock.listen(1)
            except OSError:
                return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description="check or find a free TCP port on this node")
    parser.add_argument("port", type=int, help="the port to check (first port of the search)")
    parser.add_argument("--search", type=int, default=1, help="how many ports from PORT to try")
    args = parser.parse_args()
    for port in range(args.port, min(args.port + max(args.search, 1), 65536)):
        if is_free(port):
            print(json.dumps({"port": port, "free": True}))
            return
    print(json.dumps({"port": args.port, "free": False}))


if __name__ == "__main__":
    main()
