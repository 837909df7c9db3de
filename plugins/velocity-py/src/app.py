"""A velocity check on orders, kept in plugin state: a customer who placed
`limit` orders within `window` has the next one parked. The Python twin of
plugins/velocity.

- Body `{"id": "...", "customer": "...", ...}` (JSON); only `customer`, a
  non-empty string, is needed (`id`, when a string, names the order in the
  log). Not JSON, not an object, or no such `customer`: reject, saying what
  was wrong.
- Config: `limit` (default 5, a positive integer) and `window` (default
  `10m`; a positive whole number of `ms`, `s`, `m` or `h`: `500ms`, `30s`,
  `10m`, `1h`). A value it cannot read: retry, naming it (an operator can
  fix the config while the retry policy holds the order).
- State (the consumer's `state` namespace): key `customer/{customer}`, value
  the JSON list of the epoch-ms times of that customer's accepted orders
  still within the window, e.g. `[1700000000000,1700000012000]`. It reads
  the key with `get-versioned`, drops the times `window` or more before the
  host's `now-ms`, and:
  - if `limit` or more remain: park, `customer {c} placed {n} orders within
    {window} (limit {limit})`, and write nothing (a parked order does not
    count);
  - else appends now, writes the list back with `set-if-version` (so two
    orders of one customer handled at once cannot both take the last place:
    the host runs the second again on the first's list) and a TTL of the
    window (the key goes when its newest time leaves the window), and
    accepts.
  A state call the host refuses (no `state` configured, a limit): retry with
  its reason.

One log line per decision.

Built by build.sh with componentize-py against wit/plugin.wit, world
`handler-plugin`: `wit_world` is the bindings module it generates.
"""

import json
import re

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, state, types

LIMIT_KEY, DEFAULT_LIMIT = "limit", 5
WINDOW_KEY, DEFAULT_WINDOW = "window", "10m"
KEY_PREFIX = "customer/"

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}
_WINDOW = re.compile(r"([0-9]+)(ms|s|m|h)")


class Handler(exports.Handler):
    def handle(self, msg: types.Message) -> types.Outcome:
        # The message is lent for this call only: release it on the way out.
        with msg:
            body = msg.body()
        outcome, level, line = check(body)
        # One log line per decision.
        host.log(level, line)
        return outcome


class Decision(Exception):
    """A decision other than accept: (outcome, log line)."""

    def __init__(self, outcome, word):
        super().__init__(outcome.value)
        self.outcome, self.line = outcome, f"{word}: {outcome.value}"


def _reject(reason):
    return Decision(types.Outcome_Reject(reason), "reject")


def _retry(reason):
    return Decision(types.Outcome_Retry(reason), "retry")


def check(body: bytes):
    """Decides for one order: (outcome, log level, log line)."""
    try:
        limit, (window, window_ms) = read_limit(), read_window()
        order_id, customer = parse_order(body)
        key = (KEY_PREFIX + customer).encode("utf-8")
        now = host.now_ms()
        try:
            found = state.get_versioned(key)
        except Err as e:
            raise _retry(f"state get-versioned of `{KEY_PREFIX}{customer}` failed: {e.value}")
        times, version = ([], 0) if found is None else (parse_times(key, found[0]), found[1])
        recent = [t for t in times if now - t < window_ms]
        if len(recent) >= limit:
            reason = (f"customer {customer} placed {len(recent)} orders within {window} "
                      f"(limit {limit})")
            raise Decision(types.Outcome_Park(reason), "park")
        recent.append(now)
        value = json.dumps(recent, separators=(",", ":")).encode("ascii")
        try:
            state.set_if_version(key, value, version, window_ms)
        except Err as e:
            raise _retry(f"state set-if-version of `{KEY_PREFIX}{customer}` failed: {e.value}")
    except Decision as d:
        return d.outcome, host.Level.WARN, d.line
    line = (f"order {order_id} from {customer} accepted: {len(recent)} of {limit} "
            f"within {window}")
    return types.Outcome_Accept(), host.Level.INFO, line


def read_limit() -> int:
    text = host.config(LIMIT_KEY)
    if text is None:
        return DEFAULT_LIMIT
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < 1:
        raise _retry(f"config `{LIMIT_KEY}` = {json.dumps(text)} is not a positive integer")
    return int(text)


def read_window():
    """(the window as written, in ms) from config `window`."""
    text = host.config(WINDOW_KEY)
    if text is None:
        text = DEFAULT_WINDOW
    ms = window_ms(text.strip())
    if ms is None:
        raise _retry(f"config `{WINDOW_KEY}` = {json.dumps(text)} is not a duration "
                     f"such as 500ms, 30s, 10m or 1h")
    return text.strip(), ms


def window_ms(text: str):
    """`500ms`, `30s`, `10m`, `1h` in milliseconds; None for anything else
    (and for zero)."""
    m = _WINDOW.fullmatch(text)
    if m is None or int(m.group(1)) == 0:
        return None
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def parse_order(body: bytes):
    """(id or `(no id)`, customer) from a JSON body, or a reject Decision."""
    try:
        order = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _reject(f"body is not JSON: invalid UTF-8 at byte {e.start}") from None
    except ValueError as e:
        raise _reject(f"body is not JSON: {e}") from None
    if not isinstance(order, dict):
        raise _reject(f"body is not a JSON object but {_kind(order)}")
    if "customer" not in order:
        raise _reject("order has no `customer`")
    customer = order["customer"]
    if not isinstance(customer, str) or not customer:
        raise _reject(f"order's `customer` must be a non-empty string, not {_kind(customer)}")
    order_id = order.get("id")
    return (order_id if isinstance(order_id, str) else "(no id)"), customer


def parse_times(key: bytes, value: bytes):
    """The stored list of epoch-ms times, or a retry Decision naming the key."""
    try:
        times = json.loads(value.decode("utf-8"))
    except ValueError:
        times = None
    if not isinstance(times, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in times):
        raise _retry(f"state key `{key.decode('utf-8')}` does not hold a JSON list of epoch-ms "
                     f"times (delete it with `acemq-host state delete`)")
    return times


def _kind(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "an empty string" if not v else "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"
