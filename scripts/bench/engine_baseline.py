#!/usr/bin/env python3
"""The engine's own work for one sandbox, through its API on its Unix socket
(one process, no CLI): create, start, wait, remove a container of IMAGE
running `sh -c 'date +%s%N'` with no network; prints per round the
milliseconds from the create request to the first instruction (the clock
the container printed) and to the end of the remove. Used by
scripts/bench-first-instruction.sh as the baseline.

    engine_baseline.py IMAGE ROUNDS
"""
import http.client
import json
import socket
import sys
import time

SOCK = "/var/run/docker.sock"


class Conn(http.client.HTTPConnection):
    def __init__(self):
        super().__init__("localhost")

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(SOCK)


def call(c, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    c.request(method, path, body=data, headers=headers)
    r = c.getresponse()
    out = r.read()
    if r.status >= 300:
        raise SystemExit(f"{method} {path}: {r.status} {out[:200]!r}")
    return out


def first_line(raw):
    # The multiplexed log stream: 8-byte frame headers, then the payload.
    payload = b""
    while len(raw) >= 8:
        size = int.from_bytes(raw[4:8], "big")
        payload += raw[8 : 8 + size]
        raw = raw[8 + size :]
    return payload.decode().splitlines()[0]


def main():
    image, rounds = sys.argv[1], int(sys.argv[2])
    c = Conn()
    for _ in range(rounds):
        t0 = time.time_ns()
        created = json.loads(
            call(
                c,
                "POST",
                "/containers/create",
                {
                    "Image": image,
                    "Cmd": ["sh", "-c", "date +%s%N"],
                    "User": "1000:1000",
                    "NetworkDisabled": True,
                    "HostConfig": {"NetworkMode": "none"},
                },
            )
        )
        cid = created["Id"]
        call(c, "POST", f"/containers/{cid}/start")
        call(c, "POST", f"/containers/{cid}/wait")
        logs = call(c, "GET", f"/containers/{cid}/logs?stdout=1")
        call(c, "DELETE", f"/containers/{cid}?force=1")
        t1 = time.time_ns()
        first = int(first_line(logs))
        print((first - t0) // 1_000_000, (t1 - t0) // 1_000_000)


main()
