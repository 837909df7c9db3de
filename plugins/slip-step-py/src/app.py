"""One step of a routing slip, in Python, the twin of plugins/slip-step:
accepts every message and logs `step <name> handled <message id>`, with the
name from the consumer's `[consumers.config] step`.

It does nothing else on purpose: the host forwards a message on a slip (the
JSON `acemq-routing-slip` header, or Java's declared route in the envelope)
to its next step after the accept, marking this one done. Without a `step`
key, the name is the slip's current step, else `unnamed`.

Built by build.sh with componentize-py against wit/plugin.wit, world
`handler-plugin`: `wit_world` is the bindings module it generates.
"""

import json

from wit_world import exports
from wit_world.imports import host, types

ROUTING_SLIP_HEADER = "acemq-routing-slip"


class Handler(exports.Handler):
    def handle(self, msg: types.Message) -> types.Outcome:
        with msg:
            envelope = msg.envelope()
            name = host.config("step") or current_step(envelope, msg.headers()) or "unnamed"
        host.log(host.Level.INFO, f"step {name} handled {envelope.id}")
        return types.Outcome_Accept()


def current_step(envelope, headers):
    """The name of the step handling the message now, read from either form
    of its slip (the declared route first, as the Rust SDK reads it), or
    None. An unreadable slip is the host's to refuse: None here."""
    route = envelope.route
    if route is not None:
        return route.steps[route.position] if route.position < len(route.steps) else None
    for name, value in headers:
        if name == ROUTING_SLIP_HEADER and hasattr(value, "value"):
            text = value.value
            try:
                steps = json.loads(text if isinstance(text, str) else bytes(text))["steps"]
                return steps[0].get("name") if steps else None
            except (ValueError, TypeError, KeyError, AttributeError):
                return None
    return None
