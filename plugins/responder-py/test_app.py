"""The Rust plugin's tests (plugins/responder), against app.py under plain
CPython: `python3 -m unittest test_app` here (plugins/responder-py). The
bindings are faked in memory by guest-sdk/python/acemq_testing.py, so this
tests the decisions and texts, not the build.
"""

import sys
import unittest
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[1] / "guest-sdk" / "python"))
import acemq_testing  # noqa: E402

host, types, Err = acemq_testing.install()
sys.path.insert(0, str(here / "src"))
import app  # noqa: E402


class ResponderTest(unittest.TestCase):
    def test_answers_with_the_body_echoed_as_json(self):
        h = acemq_testing.FakeHost()
        msg = acemq_testing.message("hello", reply_to="caller.replies")
        self.assertEqual(h.handle(app.Handler(), msg), types.Outcome_Accept())
        [(answer, to)] = h.replies
        self.assertEqual(to, "caller.replies")
        self.assertEqual(answer.body, b'{"echo":"hello"}')
        self.assertEqual(answer.content_type, "application/json")
        self.assertEqual(answer.envelope.message_type, "echo.reply")
        self.assertEqual((answer.envelope.correlation_id, answer.envelope.causation_id), (None, None))
        self.assertEqual(h.logs, [(host.Level.INFO, "answered test-message-1 with test-message-1/reply")])
        self.assertEqual(h.published, [])

    def test_answers_a_plain_amqp_client_through_the_property(self):
        h = acemq_testing.FakeHost()
        msg = acemq_testing.message("ping")
        msg.the_delivery.reply_to = "amq.gen-abc"
        msg.the_delivery.amqp_correlation_id = "rpc-7"
        self.assertEqual(h.handle(app.Handler(), msg), types.Outcome_Accept())
        self.assertEqual(h.replies[0][1], "amq.gen-abc")

    def test_text_is_echoed_as_is(self):
        h = acemq_testing.FakeHost()
        h.handle(app.Handler(), acemq_testing.message('  "ünïcode"\n', reply_to="q"))
        self.assertEqual(h.replies[0][0].body, '{"echo":"  \\"ünïcode\\"\\n"}'.encode())

    def test_rejects_fail_without_replying(self):
        h = acemq_testing.FakeHost()
        outcome = h.handle(app.Handler(), acemq_testing.message("fail", reply_to="q"))
        self.assertEqual(outcome, types.Outcome_Reject("the request asked to fail (body `fail`)"))
        self.assertEqual(h.replies, [], "the host answers with acemq-error")

    def test_rejects_a_body_that_is_not_text(self):
        h = acemq_testing.FakeHost()
        outcome = h.handle(app.Handler(), acemq_testing.message(b"\xff", reply_to="q"))
        self.assertIsInstance(outcome, types.Outcome_Reject)
        self.assertTrue(outcome.value.startswith("body is not UTF-8 text: "), outcome.value)
        self.assertEqual(h.replies, [])

    def test_a_refused_reply_is_retried_with_the_hosts_reason(self):
        h = acemq_testing.FakeHost()

        def refuse(_):
            raise Err("no")

        host.reply = refuse
        outcome = h.handle(app.Handler(), acemq_testing.message("hi", reply_to="q"))
        self.assertEqual(outcome, types.Outcome_Retry("reply failed: no"))


if __name__ == "__main__":
    unittest.main()
