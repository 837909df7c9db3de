"""Probes the sandbox a Python plugin runs in, one probe per message, so a
test can check what the host's locked-down WASI grants:

- `file:PATH`: opens and reads PATH;
- `env:NAME`: reads the environment variable NAME;
- `socket:HOST:PORT`: opens a TCP connection;
- `print:TEXT`: prints TEXT to stdout and accepts;
- `spin`: loops for ever (the host's deadline must end it);
- `sleep:SECONDS`: sleeps that long through WASI, then accepts (no wasm
  runs while it sleeps: the host's own timer must end it at the deadline);
- `hog:MB`: keeps MB megabytes (the host's memory limit must end it);
- `raise`: uses a name that is not defined, so an uncaught `NameError`
  ends the call (the host must name it, with its line, in the fault);
- `accept`: accepts.

A probe the sandbox denies is rejected with what Python said
(`denied: <exception>`); one it allows is rejected with `allowed: ...`, so
the set-aside reason tells the test which happened. Anything else is
rejected, naming the body.

Built by build.sh with componentize-py against wit/plugin.wit, world
`handler-plugin`, keeping its WASI imports.
"""

import os
import socket
import time

from wit_world import exports
from wit_world.imports import types


class Handler(exports.Handler):
    def handle(self, msg: types.Message) -> types.Outcome:
        with msg:
            body = msg.body().decode("utf-8", "replace").strip()
        verb, _, rest = body.partition(":")
        if verb == "accept":
            return types.Outcome_Accept()
        if verb == "print":
            print(rest)
            return types.Outcome_Accept()
        if verb == "raise":
            return undefined_name  # noqa: F821 - the NameError is the probe
        if verb == "spin":
            while True:
                pass
        if verb == "sleep":
            time.sleep(float(rest))
            return types.Outcome_Accept()
        if verb == "hog":
            kept = bytearray(int(rest) * 1024 * 1024)
            return types.Outcome_Reject(f"allowed: kept {len(kept)} bytes")
        probe = PROBES.get(verb)
        if probe is None:
            return types.Outcome_Reject(f"unknown probe: {body!r}")
        try:
            what = probe(rest)
        except Exception as e:  # the denial is what the probe is for
            return types.Outcome_Reject(f"denied: {type(e).__name__}: {e}")
        return types.Outcome_Reject(f"allowed: {what}")


def read_file(path):
    with open(path, "rb") as f:
        return f"read {len(f.read())} bytes of {path}"


def read_env(name):
    value = os.environ[name]
    return f"{name}={value}"


def connect(address):
    # An IP address, not a name: a name lookup is denied before any socket.
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.connect((host, int(port)))
        return f"connected to {address}"


PROBES = {"file": read_file, "env": read_env, "socket": connect}
