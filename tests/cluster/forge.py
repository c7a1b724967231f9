"""A host on the cluster network that is not a node of the job attacks its watch (run by tests/cluster/test_launch.py
inside another node's network namespace, with the system's Python): failure reports and stops claiming to be node1,
unsealed or sealed with a guessed key, thousands of connections, a 100 MB line. Prints what it did as JSON.

    python3 forge.py HUB_ADDR MEMBER_ADDR       (host:port, IPv6 in brackets)
"""

import json
import socket
import sys


def connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=10)


def say(address: str, line: bytes) -> str:
    """Read the listener's hello, send one line, read whatever it answers (it hangs up); what happened."""
    try:
        with connect(address) as sock:
            hello = sock.recv(256)
            sock.sendall(line)
            sock.settimeout(6)
            return f"hello {hello[:12]!r}, answer {sock.recv(1024)[:40]!r}"
    except OSError as exc:
        return f"error {exc!r}"


def main(hub: str, member: str) -> dict:
    report = {"type": "report", "node": "node1", "term": 0, "nonce": "0" * 32, "failure": None,
              "trainer": {"attempt": 0, "state": "exited", "rc": -9}}
    stop = {"type": "record", "record": {"end": {"state": "stopped", "reason": "forged stop"}, "version": 10**9}}
    forged = [
        b'{"node": "node1", "failure": {"kind": "killed", "reason": "forged"}}\n',  # the old watch's report
        b'{"stop": "forged stop"}\n',
        json.dumps({"body": report, "mac": "0" * 64}).encode() + b"\n",  # sealed with a guessed key
        json.dumps({"body": stop, "mac": "f" * 64}).encode() + b"\n",
    ]
    said = [say(address, line) for address in (hub, member) for line in forged]
    opened, held = 0, []
    for _ in range(3000):  # thousands of connections, 200 held open at once
        try:
            held.append(connect(hub))
            opened += 1
        except OSError:
            continue
        if len(held) >= 200:
            for sock in held:
                sock.close()
            held = []
    for sock in held:
        sock.close()
    sent = 0
    try:
        with connect(hub) as sock:
            sock.recv(256)
            chunk = b"x" * (1 << 20)
            for _ in range(100):
                sock.sendall(chunk)
                sent += 1
            sock.sendall(b"\n")
    except OSError:
        pass  # the hub hung up long before the end of the line
    return {"attempted": 3000, "connections": opened, "line_mib": 100, "line_mib_taken": sent, "said": said}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
