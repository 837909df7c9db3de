"""Routes orders: validates each JSON order and, for a valid one, publishes
an `order.accepted` event. The Python twin of plugins/order-router.

- Body `{"id": string, "customer": string, "total": number, ...}`; other
  fields are ignored.
- Not JSON, or a field missing or of the wrong type: reject, saying what was
  wrong (`body is not a valid Order: missing field `total` at line 1 column 24`).
- `total` zero or negative: reject, naming the order id.
- Otherwise: publish `{id, customer, total, routed_at_ms}` to the exchange in
  config key `events_exchange` (default `orders.events`) with routing key
  `order.accepted`, and accept. A publish the host refuses: retry.

One log line per decision.

Built by build.sh with componentize-py against wit/plugin.wit, world
`handler-plugin`: `wit_world` is the bindings module it generates.
"""

import json
from decimal import Decimal

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, types

# Consumer config key naming the exchange events are published to.
EVENTS_EXCHANGE_KEY = "events_exchange"
DEFAULT_EVENTS_EXCHANGE = "orders.events"
ACCEPTED_ROUTING_KEY = "order.accepted"


class Handler(exports.Handler):
    def handle(self, msg: types.Message) -> types.Outcome:
        # The message is lent for this call only: release it on the way out.
        with msg:
            outcome, level, line = route(msg)
        # One log line per decision.
        host.log(level, line)
        return outcome


def route(msg):
    """Decides for one message: (outcome, log level, log line)."""
    try:
        order_id, customer, total = parse_order(msg.body())
    except BodyError as e:
        return _reject(e.reason)
    # JSON has no NaN (and parse_order refuses Python's NaN and Infinity),
    # so `<=` catches every non-positive total.
    if total <= 0.0:
        return _reject(f"order {order_id}: total must be positive, got {f64_display(total)}")

    exchange = host.config(EVENTS_EXCHANGE_KEY)
    if exchange is None:
        exchange = DEFAULT_EVENTS_EXCHANGE
    # Written by hand to match the Rust plugin byte for byte: compact, in
    # field order, `total` always with a fraction or an exponent.
    event = (
        '{"id":' + json.dumps(order_id, ensure_ascii=False)
        + ',"customer":' + json.dumps(customer, ensure_ascii=False)
        + ',"total":' + f64_json(total)
        + ',"routed_at_ms":' + str(host.now_ms()) + "}"
    )
    try:
        # The Sent it returns names the id and correlation that will go on
        # the wire; the log line stays the Rust plugin's, which has none.
        host.publish(types.Outgoing(
            exchange=exchange,
            routing_key=ACCEPTED_ROUTING_KEY,
            body=event.encode("utf-8"),
            content_type="application/json",
            headers=[],
            # Every field None: the host's defaults (a derived id, message
            # type = the routing key, version 1, the input's correlation,
            # causation = the input's id).
            envelope=types.EnvelopeFields(id=None, message_type=None, version=None,
                                          correlation_id=None, causation_id=None),
            persistent=True,
            mandatory=None,  # the consumer's `mandatory_outputs` decides
            deliver_at_ms=None,  # now, not through the scheduler
        ))
    except Err as e:
        # A refusal usually comes from the consumer's configuration, which an
        # operator can fix while the retry policy holds the message.
        reason = (f"publish to exchange `{exchange}` with routing key "
                  f"`{ACCEPTED_ROUTING_KEY}` failed: {e.value}")
        return types.Outcome_Retry(reason), host.Level.WARN, f"retry: {reason}"
    line = (f"order {order_id} from {customer} (total {f64_display(total)}) "
            f"accepted: {ACCEPTED_ROUTING_KEY} to {exchange}")
    return types.Outcome_Accept(), host.Level.INFO, line


def _reject(reason):
    return types.Outcome_Reject(reason), host.Level.WARN, f"reject: {reason}"


class BodyError(Exception):
    def __init__(self, problem):
        super().__init__(problem)
        self.reason = f"body is not a valid Order: {problem}"


def _refuse_constant(name):
    # Python's json reads NaN, Infinity and -Infinity; JSON has none of them.
    raise ValueError(f"{name} is not JSON")


def parse_order(body: bytes):
    """(id, customer, total) from a JSON body, or BodyError.

    The problems are worded as the Rust plugin (serde_json) words them.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(f"invalid unicode code point at byte {e.start}") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise BodyError(f"{_serde_wording(e.msg)} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        raise BodyError(f"expected value ({e})") from None
    if not isinstance(value, dict):
        raise BodyError(f"invalid type: {_json_kind(value)}, expected struct Order")
    for field, check, expected in (("id", _is_str, "a string"),
                                   ("customer", _is_str, "a string"),
                                   ("total", _is_number, "f64")):
        if field in value and not check(value[field]):
            raise BodyError(f"invalid type: {_json_kind(value[field])}, expected {expected}")
    for field in ("id", "customer", "total"):
        if field not in value:
            # serde_json points after the closing brace of the object.
            end = len(text.rstrip(" \t\r\n"))
            before = text[:end].encode("utf-8")
            line = before.count(b"\n") + 1
            column = len(before) - (before.rfind(b"\n") + 1)
            raise BodyError(f"missing field `{field}` at line {line} column {column}")
    return value["id"], value["customer"], float(value["total"])


def _is_str(v):
    return isinstance(v, str)


def _is_number(v):
    # bool is an int in Python, not a number in JSON.
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json_kind(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{f64_display(v)}`"
    if isinstance(v, str):
        return "string " + json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "sequence"
    return "map"


_SERDE_WORDING = {
    "Expecting value": "expected value",
    "Extra data": "trailing characters",
    "Expecting property name enclosed in double quotes": "key must be a string",
    "Expecting ':' delimiter": "expected `:`",
    "Expecting ',' delimiter": "expected `,` or `}`",
    "Unterminated string starting at": "EOF while parsing a string",
    "Invalid control character at": "control character (\\u0000-\\u001F) found while parsing a string",
}


def _serde_wording(python_msg):
    return _SERDE_WORDING.get(python_msg, python_msg[:1].lower() + python_msg[1:])


def f64_display(x: float) -> str:
    """x as Rust's `{}` shows an f64: shortest digits, never an exponent,
    no `.0` on whole numbers (12.5, 1, -4.5, 0.00001, 1000000000000000000000)."""
    text = format(Decimal(repr(float(x))), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def f64_json(x: float) -> str:
    """x as serde_json writes an f64 (ryu's layout): the shortest digits
    that read back the same, positional with `.0` on whole numbers up to
    16 digits (`1.0`, `12.5`, `0.0001`), an exponent past that (`1e16`, `1e-7`)."""
    sign, digits, exponent = Decimal(repr(abs(float(x)))).normalize().as_tuple()
    d = "".join(map(str, digits))
    if d == "0":
        text = "0.0"
    else:
        n = len(d)
        point = n + exponent  # where the decimal point falls in d
        if 0 <= exponent and point <= 16:
            text = d + "0" * exponent + ".0"
        elif 0 < point <= 16:
            text = d[:point] + "." + d[point:]
        elif -5 < point <= 0:
            text = "0." + "0" * -point + d
        else:
            text = d[0] + ("." + d[1:] if n > 1 else "") + f"e{point - 1}"
    return ("-" if str(x).startswith("-") else "") + text
