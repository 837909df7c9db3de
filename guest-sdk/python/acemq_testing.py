"""The test host of a Python plugin: in-memory stand-ins for the bindings
componentize-py generates from wit/plugin.wit (acemq:plugin@0.4.0, world
`handler-plugin`), so a plugin's `src/app.py` runs under plain CPython in
its unit tests, with no install.

The real `wit_world` exists only inside the component. `install()` puts
fakes of the modules a plugin imports (`wit_world.exports`,
`wit_world.imports.host`, `wit_world.imports.state`,
`wit_world.imports.types`, `componentize_py_types`) into `sys.modules`, with
the same class and field names; `FakeHost` answers the `host` functions and
records what the handler published, replied and logged, as the Rust SDK's
TestHost does. Its ids are stand-ins (`output-N`, `reply`), not the host's
derived UUIDs.

`FakeHost` also answers the `state` functions (docs/state.md) from a
`FakeNamespace` that outlives the calls: reads see the committed entries
plus the call's own writes, and the writes are committed only when the
handler accepts (see `FakeHost` and `FakeNamespace`).

It ships with acemq-host: `acemq-host plugin new NAME --lang python` writes
this file into the new plugin's folder (it is built into the binary), and
the Python plugins of the acemq-host repository (plugins/*-py) import it
from guest-sdk/python. Its own tests are test_acemq_testing.py beside it.

    import acemq_testing
    host, types, Err = acemq_testing.install()
    import app
"""

import dataclasses
import re
import sys
import unicodedata
import types as pytypes
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Dict, List, Optional, Tuple, Union

REPLY_TO_HEADER = "acemq-reply-to"
# The host's `[scheduler] max_delay` when its configuration sets none: 30 days.
DEFAULT_MAX_DELAY_MS = 30 * 24 * 3600 * 1000

# The state interface's limits (docs/state.md).
STATE_MAX_KEY_BYTES = 1024
STATE_MAX_VALUE_BYTES = 1_048_576
STATE_MAX_WRITES_PER_CALL = 1000
# What every state call of a consumer without `state` raises.
NO_STATE_STORE = 'this consumer has no state store: set state = "NAME" in its [[consumers]] entry'
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1


class Err(Exception):
    """componentize_py_types.Err: a WIT `result` error, its reason in `.value`."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value


class Level(Enum):
    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


@dataclass
class HeaderValue_Text:
    value: str


@dataclass
class HeaderValue_Int:
    value: int


@dataclass
class DeclaredRoute:
    steps: List[str]
    position: int
    id: Optional[str]


@dataclass
class Envelope:
    id: str = "test-message-1"
    message_type: str = "test"
    version: int = 1
    correlation_id: str = "test-correlation-1"
    causation_id: Optional[str] = None
    attempt: int = 1
    first_seen_ms: int = 1_700_000_000_000
    origin: Optional[str] = None
    route: Optional[DeclaredRoute] = None


@dataclass
class Delivery:
    queue: str = "test.queue"
    exchange: str = "test.exchange"
    routing_key: str = "test"
    redelivered: bool = False
    stream_offset: Optional[int] = None
    reply_to: Optional[str] = None
    amqp_correlation_id: Optional[str] = None


@dataclass
class EnvelopeFields:
    id: Optional[str]
    message_type: Optional[str]
    version: Optional[int]
    correlation_id: Optional[str]
    causation_id: Optional[str]


@dataclass
class Outgoing:
    exchange: str
    routing_key: str
    body: bytes
    content_type: Optional[str]
    headers: list
    envelope: EnvelopeFields
    persistent: bool
    mandatory: Optional[bool]
    deliver_at_ms: Optional[int]


@dataclass
class OutgoingReply:
    body: bytes
    content_type: Optional[str]
    headers: list
    envelope: EnvelopeFields


@dataclass
class Sent:
    id: str
    correlation_id: str


@dataclass
class Outcome_Accept:
    pass


@dataclass
class Outcome_Retry:
    value: str


@dataclass
class Outcome_Reject:
    value: str


@dataclass
class Outcome_Park:
    value: str


@dataclass
class Message:
    """The WIT resource `message`: its parts, and whether `with msg:` released it."""

    body_bytes: bytes = b""
    header_list: list = field(default_factory=list)
    the_envelope: Envelope = field(default_factory=Envelope)
    the_delivery: Delivery = field(default_factory=Delivery)
    the_content_type: Optional[str] = None
    released: bool = False

    def body(self):
        return self.body_bytes

    def headers(self):
        return list(self.header_list)

    def envelope(self):
        return self.the_envelope

    def delivery(self):
        return self.the_delivery

    def content_type(self):
        return self.the_content_type

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.released = True


def message(body, headers=None, reply_to=None, envelope=None):
    """A message with test defaults; `reply_to` makes it an AceMQ request
    (the `acemq-reply-to` header and the `reply-to` property)."""
    headers = [(name, HeaderValue_Text(value) if isinstance(value, str) else value)
               for name, value in (headers or {}).items()]
    delivery = Delivery()
    if reply_to is not None:
        headers.append((REPLY_TO_HEADER, HeaderValue_Text(reply_to)))
        delivery.reply_to = reply_to
    return Message(body_bytes=body.encode() if isinstance(body, str) else body,
                   header_list=headers, the_envelope=envelope or Envelope(),
                   the_delivery=delivery)


def _bytes(name, v):
    """A `list<u8>` argument as the bindings take it: bytes (or bytearray)."""
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    raise TypeError(f"{name} must be bytes (a WIT list<u8>), not {type(v).__name__}")


def _int(name, v, lo, hi, wit):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int (a WIT {wit}), not {type(v).__name__}")
    if not lo <= v <= hi:
        raise OverflowError(f"{name} {v} is out of the range of a WIT {wit}")
    return v


def _ttl(ttl_ms):
    return None if ttl_ms is None else _int("ttl_ms", ttl_ms, 0, U64_MAX, "u64")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def rust_debug(text: str) -> str:
    """`text` quoted as Rust's `{:?}` shows a str (near enough: quotes,
    backslashes and control characters escaped, the rest as it is)."""
    out = []
    for c in text:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp"):
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def show_key(key: bytes) -> str:
    """A key as the host's errors name it: `the key "text"` when it is
    UTF-8, else `the key 0x` and hex (host/src/state/call.rs)."""
    try:
        return "the key " + rust_debug(key.decode("utf-8"))
    except UnicodeDecodeError:
        return "the key 0x" + key.hex()


def _as_bytes(v):
    """The helpers' keys and values: bytes, or str (as UTF-8)."""
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


@dataclass
class StateEntry:
    """A key's committed value, its version and when it expires (epoch ms,
    None: never)."""

    value: bytes
    version: int
    expires_at_ms: Optional[int] = None

    def live_at(self, now_ms):
        return self.expires_at_ms is None or self.expires_at_ms > now_ms


class FakeNamespace:
    """A state namespace's committed entries, as the store keeps them
    between calls. Versions come from one counter of the namespace, so they
    are unique and never reused (a key deleted and written again has a new
    one); an entry whose expiry has passed on `clock` reads as absent.

    Its methods are the test's, not the plugin's: `seed` and `remove`
    change it directly (as an input committed before, or meanwhile), the
    rest read it. Keys and values may be given as str (UTF-8)."""

    def __init__(self, clock: Callable[[], int] = lambda: 0, name: str = "test"):
        self.name, self.clock = name, clock
        self._entries: Dict[bytes, StateEntry] = {}
        self.last_version = 0

    def _next_version(self):
        self.last_version += 1
        return self.last_version

    def entry(self, key) -> Optional[StateEntry]:
        """The live entry of `key`, or None."""
        e = self._entries.get(_as_bytes(key))
        return e if e is not None and e.live_at(self.clock()) else None

    def get(self, key) -> Optional[bytes]:
        e = self.entry(key)
        return None if e is None else e.value

    def version(self, key) -> int:
        """The version of `key`, 0 when it does not exist."""
        e = self.entry(key)
        return 0 if e is None else e.version

    def items(self) -> Dict[bytes, bytes]:
        """Every live key and its value."""
        now = self.clock()
        return {k: e.value for k, e in sorted(self._entries.items()) if e.live_at(now)}

    def keys(self) -> List[bytes]:
        return list(self.items())

    def seed(self, key, value, ttl_ms: Optional[int] = None) -> int:
        """Sets `key` as a committed input would have (expiring `ttl_ms`
        after the clock's now); returns its new version."""
        version = self._next_version()
        expires = None if ttl_ms is None else self.clock() + ttl_ms
        self._entries[_as_bytes(key)] = StateEntry(_as_bytes(value), version, expires)
        return version

    def remove(self, key):
        """Deletes `key` as a committed input would have."""
        self._entries.pop(_as_bytes(key), None)

    def _commit(self, writes, checks):
        """Applies one call's writes if every check holds: the key of the
        first check that failed (nothing applied), or None."""
        for key, expected in checks.items():
            if self.version(key) != expected:
                return key
        for key, write in writes.items():
            if write is None:
                self._entries.pop(key, None)
            else:
                value, expires = write
                self._entries[key] = StateEntry(value, self._next_version(), expires)
        return None


class StateCall:
    """One call's view of a namespace, as host/src/state/call.rs keeps it:
    the committed entries plus its own writes (`writes`: key -> (value,
    expires_at_ms), or None for a delete; the last write of a key wins), the
    versions its commit depends on (`checks`: key -> version, from an
    `increment` of a committed value and from `set-if-version`, the first
    check of a key kept; 0: the key must not exist), and how many writes it
    made. The limits and error texts are the host's."""

    def __init__(self, namespace: Optional[FakeNamespace], now_ms: int):
        self.namespace, self.now = namespace, now_ms
        self.writes: Dict[bytes, Optional[Tuple[bytes, Optional[int]]]] = {}
        self.checks: Dict[bytes, int] = {}
        self.write_count = 0

    def _store(self):
        if self.namespace is None:
            raise Err(NO_STATE_STORE)
        return self.namespace

    def _key(self, key):
        key = _bytes("key", key)
        if not key:
            raise Err("a state key must not be empty")
        if len(key) > STATE_MAX_KEY_BYTES:
            raise Err(f"a state key is at most {STATE_MAX_KEY_BYTES} bytes; this one is {len(key)}")
        return key

    def _value(self, value):
        value = _bytes("value", value)
        if len(value) > STATE_MAX_VALUE_BYTES:
            raise Err(f"a state value is at most {STATE_MAX_VALUE_BYTES} bytes; "
                      f"this one is {len(value)}")
        return value

    def _expiry(self, ttl_ms):
        ttl_ms = _ttl(ttl_ms)
        if ttl_ms == 0:
            raise Err("ttl-ms must be at least 1 (none: the key never expires)")
        return None if ttl_ms is None else self.now + ttl_ms

    def _write(self, key, write):
        if self.write_count >= STATE_MAX_WRITES_PER_CALL:
            raise Err(f"a call makes at most {STATE_MAX_WRITES_PER_CALL} state writes; "
                      f"this would be write {self.write_count + 1}")
        self.write_count += 1
        self.writes[key] = write

    def _seen(self, key):
        """(value, expires_at_ms, version) as this call sees `key`, or None.
        The version of a key this call wrote is that of the committed entry
        its write replaces (0 if none): what a commit checks it against."""
        committed = self.namespace.entry(key)
        base = 0 if committed is None else committed.version
        if key in self.writes:
            write = self.writes[key]
            return None if write is None else (write[0], write[1], base)
        if committed is None:
            return None
        return committed.value, committed.expires_at_ms, base

    def get(self, key):
        self._store()
        seen = self._seen(self._key(key))
        return None if seen is None else seen[0]

    def get_versioned(self, key):
        self._store()
        seen = self._seen(self._key(key))
        return None if seen is None else (seen[0], seen[2])

    def set(self, key, value, ttl_ms):
        self._store()
        key, value = self._key(key), self._value(value)
        self._write(key, (value, self._expiry(ttl_ms)))

    def delete(self, key):
        self._store()
        self._write(self._key(key), None)

    def increment(self, key, by, ttl_ms):
        self._store()
        key, by = self._key(key), _int("by", by, I64_MIN, I64_MAX, "s64")
        ttl = self._expiry(ttl_ms)
        seen = self._seen(key)
        if seen is None:
            current, expires = 0, None
        else:
            # As Rust's i64 parses it: a sign, then ASCII digits.
            if not re.fullmatch(rb"[+-]?[0-9]+", seen[0]) or not I64_MIN <= int(seen[0]) <= I64_MAX:
                raise Err(f'{show_key(key)} does not hold an integer (increment keeps decimal '
                          f'text such as "6"), so it cannot be incremented')
            current, expires = int(seen[0]), seen[1]
        total = current + by
        if not I64_MIN <= total <= I64_MAX:
            raise Err(f"incrementing {show_key(key)} by {by} overflows a 64-bit integer "
                      f"(it holds {current})")
        # Based on a committed value it is checked at commit; on this call's
        # own write it is not.
        depends = key not in self.writes
        self._write(key, (str(total).encode("ascii"), expires if ttl is None else ttl))
        if depends:
            self.checks.setdefault(key, 0 if seen is None else seen[2])
        return total

    def set_if_version(self, key, value, version, ttl_ms):
        self._store()
        key, value = self._key(key), self._value(value)
        version = _int("version", version, 0, U64_MAX, "u64")
        self._write(key, (value, self._expiry(ttl_ms)))
        # A second check of the same key keeps the first: the commit depends
        # on what the call read first.
        self.checks.setdefault(key, version)


_state = pytypes.ModuleType("wit_world.imports.state")


def _outside_a_call(*_args):
    raise RuntimeError("a state function was called outside FakeHost.handle")


for _name in ("get", "set", "delete", "increment", "get_versioned", "set_if_version"):
    setattr(_state, _name, _outside_a_call)


_host = pytypes.ModuleType("wit_world.imports.host")
# The FakeHost the fake modules answer from.
_bound = None
_host.Level = Level


def install():
    """Installs the fake modules; returns (host, types, Err)."""
    cpt = pytypes.ModuleType("componentize_py_types")
    cpt.Err = Err
    wt = pytypes.ModuleType("wit_world")
    exports = pytypes.ModuleType("wit_world.exports")
    exports.Handler = object
    imports = pytypes.ModuleType("wit_world.imports")
    wtypes = pytypes.ModuleType("wit_world.imports.types")
    for cls in (HeaderValue_Text, HeaderValue_Int, DeclaredRoute, Envelope, Delivery,
                EnvelopeFields, Outgoing, OutgoingReply, Sent, Message,
                Outcome_Accept, Outcome_Retry, Outcome_Reject, Outcome_Park):
        setattr(wtypes, cls.__name__, cls)
    wtypes.Outcome = object
    imports.host, imports.state, imports.types = _host, _state, wtypes
    wt.exports, wt.imports = exports, imports
    sys.modules.update({
        "componentize_py_types": cpt, "wit_world": wt,
        "wit_world.exports": exports, "wit_world.imports": imports,
        "wit_world.imports.host": _host, "wit_world.imports.state": _state,
        "wit_world.imports.types": wtypes,
    })
    return _host, wtypes, Err


def state_module():
    """The fake `wit_world.imports.state` (what `from wit_world.imports
    import state` gives a plugin once `install()` ran)."""
    return _state


class FakeHost:
    """Answers the `host` functions for one test and records what the
    handler did: `logs` [(level, text)], `published` [Outgoing], `replies`
    [(OutgoingReply, reply queue or None)]. A `publish_to` list refuses
    publishes to any other exchange, as the consumer's setting does.

    A delayed output keeps its due time in `published[i].deliver_at_ms`
    (epoch ms; `now_ms` is the clock the handler reads). As the host does,
    `publish_delayed=False` (the consumer's `publish_delayed` unset) refuses
    any delayed output, and one due more than `max_delay_ms` after `now_ms`
    is refused; by default delayed outputs are allowed, up to the host's
    default limit.

    State (docs/state.md): `state` is the consumer's namespace, a
    `FakeNamespace` kept across calls (`h.state`): True (the default) makes
    one on this host's clock, a `FakeNamespace` shares one (two consumers
    naming the same namespace), None is a consumer without `state`, whose
    every state call raises `Err(NO_STATE_STORE)`. During `handle` the
    state functions answer from a `StateCall` (`h.last_call` afterwards):
    committed entries plus the call's own writes, expiry on `now`, the
    limits of docs/state.md raised as `Err` naming them. When the handler
    accepts, its writes are committed if every version its `increment` and
    `set_if_version` calls depended on is still the namespace's; otherwise
    nothing is committed and `h.conflict` names the key (the host runs the
    call again: `handle(..., reruns=N)` does too). Any other outcome commits
    nothing. `h.committed` says whether the last call committed.

    `h.concurrently(change)` simulates another input committing while a
    call runs: `change(namespace)` is applied once the next call has
    returned and before its commit (e.g. `lambda ns: ns.seed(b"k", b"v")`).

    Not modelled: done records (a redelivery of a done input is acked
    without a call) and claims, which need envelope ids of their own, and
    the namespace quotas (`max_keys`, `max_bytes`)."""

    def __init__(self, config=None, now_ms=1_700_000_000_000, publish_to=None,
                 publish_delayed=True, max_delay_ms=DEFAULT_MAX_DELAY_MS,
                 state: Union[bool, FakeNamespace, None] = True):
        self.config, self.now = dict(config or {}), now_ms
        # The consumer's `publish_to`; None allows every exchange.
        self.publish_to = publish_to
        self.publish_delayed, self.max_delay_ms = publish_delayed, max_delay_ms
        self.logs, self.published, self.replies = [], [], []
        if state is True:
            state = FakeNamespace(clock=lambda: self.now)
        self.state: Optional[FakeNamespace] = state or None
        # The call in progress (during `handle`), then the last one.
        self._call: Optional[StateCall] = None
        self.last_call: Optional[StateCall] = None
        self.committed, self.conflict, self.runs = False, None, 0
        self._concurrent: List[Callable[[FakeNamespace], object]] = []
        self._input = Envelope()
        self._reply_to = None
        self._bind()

    def _bind(self):
        """Makes the fake modules answer from this host: the newest one, and
        the one running `handle` when another was made since (so two hosts
        may take turns; a test's own replacement of a function, such as
        `host.reply = refuse` after making its host, stays)."""
        global _bound
        _bound = self
        _host.log = lambda level, text: self.logs.append((level, text))
        _host.config = self.config.get
        _host.now_ms = lambda: self.now
        _host.publish = self._publish
        _host.reply = self._reply
        for name in ("get", "set", "delete", "increment", "get_versioned", "set_if_version"):
            setattr(_state, name, self._state_function(name))

    def _state_function(self, name):
        def call(*args):
            if self._call is None:
                _outside_a_call()
            return getattr(self._call, name)(*args)
        call.__name__ = name
        return call

    def concurrently(self, change: Callable[[FakeNamespace], object]):
        """Applies `change(self.state)` after the next call returns and
        before its commit, as another input committing meanwhile."""
        self._concurrent.append(change)

    def handle(self, handler, msg, reruns=0):
        """Runs `handler.handle(msg)` as the host would; checks that the
        handler released the message. An accepted call's state writes are
        then committed, unless a version it depended on changed: then up to
        `reruns` more runs on fresh state (a fresh copy of `msg`), the
        outputs and reply of a conflicted run dropped, as the host does."""
        self.runs = 0
        while True:
            published, replies = len(self.published), len(self.replies)
            fresh = dataclasses.replace(msg, released=False)
            outcome = self._run(handler, msg)
            if self.conflict is None or self.runs > reruns:
                return outcome
            del self.published[published:], self.replies[replies:]
            msg = fresh

    def _run(self, handler, msg):
        if _bound is not self:
            self._bind()
        self.runs += 1
        self._input = msg.the_envelope
        header = dict(msg.header_list).get(REPLY_TO_HEADER)
        header = header.value if isinstance(header, HeaderValue_Text) and header.value else None
        self._reply_to = header or msg.the_delivery.reply_to or None
        self.committed, self.conflict = False, None
        self._call = self.last_call = StateCall(self.state, self.now)
        try:
            outcome = handler.handle(msg)
        finally:
            self._call = None
        assert msg.released, "the handler must release the message (`with msg:`)"
        concurrent, self._concurrent = self._concurrent, []
        for change in concurrent:
            change(self.state)
        if isinstance(outcome, Outcome_Accept) and self.state is not None:
            self.conflict = self.state._commit(self.last_call.writes, self.last_call.checks)
            self.committed = self.conflict is None
        return outcome

    def _sent(self, fields, slot):
        correlation = fields.correlation_id or self._input.correlation_id
        return Sent(id=fields.id or f"{self._input.id}/{slot}", correlation_id=correlation)

    def _publish(self, out):
        if self.publish_to is not None and out.exchange not in self.publish_to:
            raise Err(f"exchange `{out.exchange}` is not in this consumer's publish_to")
        if out.deliver_at_ms is not None:
            self._check_delay(out.deliver_at_ms)
        self.published.append(out)
        return self._sent(out.envelope, f"output-{len(self.published) - 1}")

    def _check_delay(self, deliver_at_ms):
        if not self.publish_delayed:
            raise Err("delayed publishing (deliver-at-ms) is not allowed for this consumer: "
                      "set publish_delayed = true in its [[consumers]] entry")
        if deliver_at_ms - self.now > self.max_delay_ms:
            raise Err(f"deliver-at-ms {deliver_at_ms} is {deliver_at_ms - self.now} ms from now, "
                      f"beyond the longest delay this host schedules "
                      f"([scheduler] max_delay = {self.max_delay_ms} ms)")

    def _reply(self, out):
        if self.replies:
            raise Err("this call has already replied: a request gets one answer")
        if out.envelope.correlation_id is not None or out.envelope.causation_id is not None:
            raise Err("a reply's correlation and causation are the request's; they cannot be set")
        self.replies.append((out, self._reply_to))
        return Sent(id=out.envelope.id or f"{self._input.id}/reply",
                    correlation_id=self._input.correlation_id)
