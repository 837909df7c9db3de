"""In-memory stand-ins for the bindings componentize-py generates from
wit/plugin.wit (acemq:plugin@0.4.0, world `handler-plugin`), so a Python
plugin's `src/app.py` runs under plain CPython in its unit tests.

The real `wit_world` exists only inside the component. `install()` puts
fakes of the modules a plugin imports (`wit_world.exports`,
`wit_world.imports.host`, `wit_world.imports.types`,
`componentize_py_types`) into `sys.modules`, with the same class and field
names; `FakeHost` answers the `host` functions and records what the handler
published, replied and logged, as the Rust SDK's TestHost does. Its ids are
stand-ins (`output-N`, `reply`), not the host's derived UUIDs.

Used by the tests of plugins/order-router-py, plugins/responder-py and
plugins/slip-step-py (and its own, test_fake_wit.py here):

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python-testing"))
    import fake_wit
    host, types, Err = fake_wit.install()
    import app
"""

import sys
import types as pytypes
from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

REPLY_TO_HEADER = "acemq-reply-to"
# The host's `[scheduler] max_delay` when its configuration sets none: 30 days.
DEFAULT_MAX_DELAY_MS = 30 * 24 * 3600 * 1000


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


_host = pytypes.ModuleType("wit_world.imports.host")
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
    imports.host, imports.types = _host, wtypes
    wt.exports, wt.imports = exports, imports
    sys.modules.update({
        "componentize_py_types": cpt, "wit_world": wt,
        "wit_world.exports": exports, "wit_world.imports": imports,
        "wit_world.imports.host": _host, "wit_world.imports.types": wtypes,
    })
    return _host, wtypes, Err


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
    default limit."""

    def __init__(self, config=None, now_ms=1_700_000_000_000, publish_to=None,
                 publish_delayed=True, max_delay_ms=DEFAULT_MAX_DELAY_MS):
        self.config, self.now = dict(config or {}), now_ms
        # The consumer's `publish_to`; None allows every exchange.
        self.publish_to = publish_to
        self.publish_delayed, self.max_delay_ms = publish_delayed, max_delay_ms
        self.logs, self.published, self.replies = [], [], []
        self._input = Envelope()
        self._reply_to = None
        _host.log = lambda level, text: self.logs.append((level, text))
        _host.config = self.config.get
        _host.now_ms = lambda: self.now
        _host.publish = self._publish
        _host.reply = self._reply

    def handle(self, handler, msg):
        """Runs `handler.handle(msg)` as the host would; checks that the
        handler released the message."""
        self._input = msg.the_envelope
        header = dict(msg.header_list).get(REPLY_TO_HEADER)
        header = header.value if isinstance(header, HeaderValue_Text) and header.value else None
        self._reply_to = header or msg.the_delivery.reply_to or None
        outcome = handler.handle(msg)
        assert msg.released, "the handler must release the message (`with msg:`)"
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
