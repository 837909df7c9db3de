"""{{name}}: an acemq-host handler plugin, in Python.

Each message: a body that is not UTF-8 text, or is only whitespace, is
rejected (the host dead-letters it, with the reason); any other is logged
and accepted. With `forward_to = "EXCHANGE"` in the consumer's
[consumers.config] (and EXCHANGE in its `publish_to`), the body also goes
on to EXCHANGE in capitals, with the routing key it came with.

`wit_world` is the module componentize-py generates from wit/plugin.wit
when `acemq-host plugin build` makes the component; the tests use the
stand-in in acemq_testing.py. Code at module level runs once, at build
time, not in each host process: see README.md.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, types

# The [consumers.config] key naming the exchange the body goes on to.
FORWARD_TO = "forward_to"


class Handler(exports.Handler):
    def handle(self, msg: types.Message) -> types.Outcome:
        # The message is lent for this call only: read it, and release it.
        with msg:
            body = msg.body()
            routing_key = msg.delivery().routing_key
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            # Never readable, however often it is tried: reject.
            return types.Outcome_Reject(f"body is not UTF-8 text: {e}")
        if not text.strip():
            return types.Outcome_Reject("the body is empty")
        host.log(host.Level.INFO, f"{len(body)} bytes with routing key '{routing_key}'")
        exchange = host.config(FORWARD_TO)
        if exchange is not None:
            try:
                # Buffered: the host publishes it only if this call accepts.
                host.publish(types.Outgoing(
                    exchange=exchange,
                    routing_key=routing_key,
                    body=text.upper().encode("utf-8"),
                    content_type="text/plain; charset=utf-8",
                    headers=[],
                    # Every field None: the host's defaults (a derived id,
                    # message type = the routing key, version 1, the input's
                    # correlation, causation = the input's id).
                    envelope=types.EnvelopeFields(id=None, message_type=None, version=None,
                                                  correlation_id=None, causation_id=None),
                    persistent=True,
                    mandatory=None,  # the consumer's `mandatory_outputs` decides
                    deliver_at_ms=None,  # now, not through the scheduler
                ))
            except Err as e:
                # Refused: retry, as the Rust SDK's `?` does. (An exchange
                # outside `publish_to` parks the message whatever this
                # returns: see README.md.)
                return types.Outcome_Retry(
                    f"publish to exchange `{exchange}` with routing key `{routing_key}` "
                    f"failed: {e.value}")
        return types.Outcome_Accept()
