"""The request/reply example in Python, the twin of plugins/responder:
answers each request with the JSON `{"echo": "<the request body as text>"}`,
message type `echo.reply`.

The host does the wire work: it sends the reply when the handler accepts,
to the request's reply queue (`acemq-reply-to`, else the `reply-to`
property) through the default exchange, paired on the request's
correlation with causation = the request's id. A request whose body is
`fail` (or is not UTF-8 text) is rejected: the host sets it aside and
answers the caller with the header `acemq-error`.

Built by build.sh with componentize-py against wit/plugin.wit, world
`handler-plugin`: `wit_world` is the bindings module it generates.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, types

# The message type of every answer.
REPLY_TYPE = "echo.reply"


class Handler(exports.Handler):
    def handle(self, msg: types.Message) -> types.Outcome:
        # The message is lent for this call only: release it on the way out.
        with msg:
            body = msg.body()
            request_id = msg.envelope().id
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            return types.Outcome_Reject(f"body is not UTF-8 text: {e}")
        if text.strip() == "fail":
            return types.Outcome_Reject("the request asked to fail (body `fail`)")
        # Compact, as serde_json writes it in the Rust plugin.
        answer = json.dumps({"echo": text}, ensure_ascii=False, separators=(",", ":"))
        try:
            sent = host.reply(types.OutgoingReply(
                body=answer.encode("utf-8"),
                content_type="application/json",
                headers=[],
                # The correlation and causation are the request's (setting
                # them is refused); the id is derived by the host.
                envelope=types.EnvelopeFields(id=None, message_type=REPLY_TYPE, version=None,
                                              correlation_id=None, causation_id=None),
            ))
        except Err as e:
            return types.Outcome_Retry(f"reply failed: {e.value}")
        # `sent.id` is the id the reply carries on the wire: the one to log.
        host.log(host.Level.INFO, f"answered {request_id} with {sent.id}")
        return types.Outcome_Accept()
