"""The Rust plugin's tests (plugins/slip-step), against app.py under plain
CPython: `python3 -m unittest test_app` here (plugins/slip-step-py). The
bindings are faked in memory by guest-sdk/python/acemq_testing.py.
"""

import json
import sys
import unittest
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[1] / "guest-sdk" / "python"))
import acemq_testing  # noqa: E402

host, types, Err = acemq_testing.install()
sys.path.insert(0, str(here / "src"))
import app  # noqa: E402

SLIP = json.dumps({"steps": [{"exchange": "work", "routingKey": "check", "name": "check"},
                             {"exchange": "work", "routingKey": "store", "name": "store"}],
                   "done": []})


class SlipStepTest(unittest.TestCase):
    def logged(self, msg, config=None):
        h = acemq_testing.FakeHost(config=config)
        self.assertEqual(h.handle(app.Handler(), msg), types.Outcome_Accept())
        self.assertEqual((h.published, h.replies), ([], []))
        [(level, line)] = h.logs
        self.assertEqual(level, host.Level.INFO)
        return line

    def test_logs_its_configured_name_and_the_message_id(self):
        msg = acemq_testing.message("x", envelope=acemq_testing.Envelope(id="m-42"))
        self.assertEqual(self.logged(msg, {"step": "enrich"}), "step enrich handled m-42")

    def test_without_a_name_it_uses_the_slips_current_step(self):
        on_slip = acemq_testing.message("x", headers={"acemq-routing-slip": SLIP})
        self.assertEqual(self.logged(on_slip), "step check handled test-message-1")
        route = acemq_testing.DeclaredRoute(steps=["a", "b"], position=1, id=None)
        on_route = acemq_testing.message("x", envelope=acemq_testing.Envelope(route=route))
        self.assertEqual(self.logged(on_route), "step b handled test-message-1")

    def test_accepts_anything_even_an_unreadable_slip(self):
        msg = acemq_testing.message(b"\xff", headers={"acemq-routing-slip": "not json"})
        self.assertEqual(self.logged(msg), "step unnamed handled test-message-1")


if __name__ == "__main__":
    unittest.main()
