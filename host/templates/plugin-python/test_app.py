"""{{name}}'s tests, natively: `python3 -m unittest` in this folder (no
install needed; pytest runs them too). acemq_testing.py stands in for the
host: it answers the WIT imports and records what the handler logged and
published, so these test the decisions, not the build.
"""

import sys
import unittest
from pathlib import Path

here = Path(__file__).resolve().parent
# acemq_testing beside this file, app in src/, wherever the tests run from.
sys.path[:0] = [str(here), str(here / "src")]
import acemq_testing  # noqa: E402

host, types, Err = acemq_testing.install()
import app  # noqa: E402


class HandlerTest(unittest.TestCase):
    def test_forwards_the_body_in_capitals(self):
        h = acemq_testing.FakeHost(config={"forward_to": "out"}, publish_to=["out"])
        outcome = h.handle(app.Handler(), acemq_testing.message("hello"))
        self.assertEqual(outcome, types.Outcome_Accept())
        [out] = h.published
        self.assertEqual((out.exchange, out.routing_key, out.body), ("out", "test", b"HELLO"))
        self.assertEqual(h.logs, [(host.Level.INFO, "5 bytes with routing key 'test'")])

    def test_accepts_without_forwarding_when_not_configured(self):
        h = acemq_testing.FakeHost()
        self.assertEqual(h.handle(app.Handler(), acemq_testing.message("hello")),
                         types.Outcome_Accept())
        self.assertEqual(h.published, [])

    def test_rejects_an_empty_body(self):
        h = acemq_testing.FakeHost()
        self.assertEqual(h.handle(app.Handler(), acemq_testing.message("  ")),
                         types.Outcome_Reject("the body is empty"))


if __name__ == "__main__":
    unittest.main()
