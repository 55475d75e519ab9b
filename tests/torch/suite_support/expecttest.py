"""A stand-in for the expecttest package, which torch's test utilities import and Debian does
not ship. torch's distributed tests never call it: a test that did would be skipped, saying
why, rather than pass or fail on our word."""

import unittest

# Whether expected output is rewritten (torch sets it from --accept).
ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, *args, **kwargs):  # noqa: N802 (the package's name)
        raise unittest.SkipTest("expecttest is not installed (assertExpectedInline)")
