"""A velocity check on orders, kept in plugin state: a customer who placed
`limit` orders within `window` has the next one parked. The Python twin of
plugins/velocity: the same decisions, reasons, state and log line.

- Body: a JSON order, `{"id": "o-1", "customer": "c-42", ...}`. Only
  `customer` is needed, non-empty text (at most 1015 bytes, so that its
  state key fits in 1024); `id`, text or a number, names the order in
  reasons and the log (`order o-1`, else `the order`). Anything else:
  reject, naming what is wrong.
- Config: `limit` (default 5, a whole number, 1 or more) and `window`
  (default `10m`: `500ms`, `30s`, `10m`, `1h`, `1d`, or a sum such as
  `1h 30m`). An order counts while it is less than `window` old. A value
  that cannot be read: retry, naming the key, until an operator fixes it.
- State (the consumer's `state` namespace): key `customer/{customer}`, value
  the JSON list of the epoch-ms times (the host's `now-ms`) of that
  customer's accepted orders still within the window. The list is read with
  `get-versioned`; the times `window` or more old are dropped; then
  - `limit` or more left: park, `customer c-42 placed 5 orders within 10m
    (limit 5)`, writing nothing (a parked order does not count);
  - else now is added and the list written back with `set-if-version` at
    the version read, with the window as its TTL (the key goes when its
    newest order leaves the window), and the order accepted. Two orders of
    one customer handled at once cannot both add to the same list: the host
    commits one and runs the other again on the new list.
  A state call the host refuses (no `state` configured, a limit): retry,
  with its reason. A stored value that is not a list of times (an
  operator's edit): park, for a person to look at.

Logs `order o-1 of customer c-42: 3 of 5 within 10m` for an accepted order;
the host reports the other outcomes with their reasons.

Built by build.sh with componentize-py against wit/plugin.wit, world
`handler-plugin`: `wit_world` is the bindings module it generates.
"""

import json
import re
import unicodedata

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, state, types

LIMIT_KEY, DEFAULT_LIMIT = "limit", 5
WINDOW_KEY, DEFAULT_WINDOW = "window", "10m"
# The state key of a customer's orders is this and the customer.
KEY_PREFIX = "customer/"
# The longest key the host takes, and so the longest customer.
MAX_KEY_BYTES = 1024
MAX_CUSTOMER_BYTES = MAX_KEY_BYTES - len(KEY_PREFIX)
U64_MAX = (1 << 64) - 1

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_SEGMENT = re.compile(r"([0-9]+)([A-Za-z]*)")


class Handler(exports.Handler):
    def handle(self, msg: types.Message) -> types.Outcome:
        # The message is lent for this call only: release it on the way out.
        with msg:
            body = msg.body()
        try:
            return check(body)
        except Decision as d:
            return d.outcome


class Decision(Exception):
    """An outcome other than accept, decided early."""

    def __init__(self, outcome):
        super().__init__(outcome.value)
        self.outcome = outcome


def check(body: bytes):
    """Decides for one order, or raises Decision."""
    limit, window_ms, window_text = read_settings()
    order_id, customer = read_order(body)
    named = order_named(order_id)
    key = KEY_PREFIX + customer
    now = host.now_ms()
    placed, version = read_placed(key)
    # Orders less than `window` old still count.
    since = max(now - window_ms, 0)
    placed = [at for at in placed if at > since]
    if len(placed) >= limit:
        raise Decision(types.Outcome_Park(
            f"customer {customer} placed {len(placed)} orders within {window_text} "
            f"(limit {limit})"))
    placed.append(now)
    # Committed only if no other input changed the list since it was read;
    # otherwise the host runs this call again on the new list.
    value = json.dumps(placed, separators=(",", ":")).encode("ascii")
    try:
        state.set_if_version(key.encode("utf-8"), value, version, window_ms)
    except Err as e:
        raise Decision(types.Outcome_Retry(state_failed("set_if_version", key, e.value)))
    host.log(host.Level.INFO,
             f"{named} of customer {customer}: {len(placed)} of {limit} within {window_text}")
    return types.Outcome_Accept()


def read_placed(key: str):
    """The times of the customer's orders in the state, and the version to
    write them back with (0: none yet)."""
    try:
        found = state.get_versioned(key.encode("utf-8"))
    except Err as e:
        raise Decision(types.Outcome_Retry(state_failed("get_versioned", key, e.value)))
    if found is None:
        return [], 0
    value, version = found
    # Only this plugin writes these keys; an operator's edit that broke one
    # is for a person to look at (`acemq-host state get|delete`).
    try:
        placed = json.loads(value.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError is one
        problem = str(e)
    else:
        if isinstance(placed, list) and all(_is_time(at) for at in placed):
            return placed, version
        problem = "expected a list of whole numbers of milliseconds"
    raise Decision(types.Outcome_Park(
        f"the state key `{key}` does not hold a JSON list of epoch-ms times: {problem}"))


def _is_time(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= U64_MAX


def state_failed(operation: str, key: str, problem: str) -> str:
    """How the Rust SDK words a state call the host refused."""
    shown = key.encode("utf-8")
    more = "..." if len(shown) > 64 else ""
    shown = shown[:64].decode("utf-8", errors="ignore")
    return f"state {operation} of key `{shown}{more}` failed: {problem}"


def read_settings():
    """(limit, window in ms, the window as configured) from the consumer's
    config, or a retry Decision naming the key."""
    text = host.config(LIMIT_KEY)
    if text is None:
        limit = DEFAULT_LIMIT
    else:
        # As Rust parses a usize: an optional `+`, then ASCII digits.
        digits = text.strip()
        if not re.fullmatch(r"\+?[0-9]+", digits) or not 1 <= int(digits) <= U64_MAX:
            raise Decision(types.Outcome_Retry(
                f"the consumer's config `{LIMIT_KEY}` must be a whole number, 1 or more, "
                f"got {rust_debug(text)}"))
        limit = int(digits)
    window_text = host.config(WINDOW_KEY)
    if window_text is None:
        window_text = DEFAULT_WINDOW
    window_ms = parse_duration(window_text)
    if window_ms is None:
        raise Decision(types.Outcome_Retry(
            f"the consumer's config `{WINDOW_KEY}` must be a duration such as 10m, 30s, 1h "
            f"or 500ms, got {rust_debug(window_text)}"))
    return limit, window_ms, window_text.strip()


def parse_duration(text: str):
    """A duration as config writes it, in ms: one or more `<whole
    number><unit>`, the units `ms`, `s`, `m`, `h` and `d`, spaces allowed
    between them (`10m`, `1h 30m`, `1h30m`). None for anything else, and
    for zero."""
    rest = text.strip()
    if not rest:
        return None
    total = 0
    while rest:
        m = _SEGMENT.match(rest)
        if m is None or m.group(2) not in _UNITS_MS:
            return None
        total += int(m.group(1)) * _UNITS_MS[m.group(2)]
        if total > U64_MAX:
            return None
        rest = rest[m.end():].lstrip()
    return total or None


def read_order(body: bytes):
    """(id or None, customer) from a JSON order, or a reject Decision."""
    try:
        order = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _reject(f"the body is not JSON: invalid UTF-8 at byte {e.start}") from None
    except ValueError as e:
        raise _reject(f"the body is not JSON: {e}") from None
    if not isinstance(order, dict):
        raise _reject('the body is not a JSON object (an order: {"id": ..., "customer": ...})')
    order_id = order.get("id")
    if isinstance(order_id, bool) or not isinstance(order_id, (str, int, float)):
        order_id = None
    elif not isinstance(order_id, str):
        order_id = json_text(order_id)
    named = order_named(order_id)
    customer = order.get("customer")
    if customer is None:
        raise _reject(f"{named} has no `customer` (the text naming who placed it)")
    if not isinstance(customer, str):
        raise _reject(f"{named} has a `customer` that is not text: {json_text(customer)}")
    if not customer:
        raise _reject(f"{named} has an empty `customer`")
    size = len(customer.encode("utf-8"))
    if size > MAX_CUSTOMER_BYTES:
        raise _reject(f"{named} has a `customer` of {size} bytes; at most {MAX_CUSTOMER_BYTES} "
                      f"fit in a state key")
    return order_id, customer


def order_named(order_id):
    """`order o-1`, or `the order` when it has no id."""
    return "the order" if order_id is None else f"order {order_id}"


def json_text(value) -> str:
    """A JSON value written compactly, as serde_json shows one."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _reject(reason):
    return Decision(types.Outcome_Reject(reason))


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def rust_debug(text: str) -> str:
    """`text` quoted as Rust's `{:?}` shows a str (quotes, backslashes and
    control characters escaped)."""
    out = []
    for c in text:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp"):
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'
