#!/usr/bin/env python3
"""N distinct loopback ports that nothing listens on now, picked together.

Picking ports one at a time by binding a socket and closing it can return the same
port twice: the kernel hands a just-closed ephemeral port out again (CI saw a
cluster config refused because a node's `port` and `http_port` were one port). Here
all N sockets stay bound until every port is known, so the N are distinct; the
caller writes them into its config and starts the processes that bind them.

    python3 tools/ci/free_ports.py 9        # nine ports, one per line
    from free_ports import free_ports    # (tools/ on sys.path) free_ports(9) -> [int]
"""
import socket
import sys


def free_ports(n):
    """n distinct loopback ports, each free when this returns."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        sys.exit("usage: free_ports.py N")
    print("\n".join(str(p) for p in free_ports(int(sys.argv[1]))))
