"""Runs mpi4py's own test suite (its ``test/main.py``) in one MPI rank and
records every test's outcome, for ``tests/tests/mpi4py.rs``.

    python runsuite.py TESTDIR OUTDIR [main.py options and test names ...]

This is ``main.py`` itself (its option parser, exclusions, loader and
banner), with one change: the runner's result class also writes one line per
event to ``OUTDIR/rank-<R>.log``, flushed at once, so a rank that hangs or
dies still leaves the tests it finished and the one it was in:

    begin pid=<pid> size=<n>
    start <test id>
    end <outcome> <test id> <seconds>      outcome: pass fail error skip xfail xpass
    sub <outcome> <subtest id>              a subtest that did not pass (fail error skip)
    fixture <outcome> <id>                  a class or module fixture (setUpClass ...)
    done run=<n> failures=<n> errors=<n> skipped=<n> xfail=<n> xpass=<n> success=<0|1>

A test's outcome is the worst of its parts (error, then fail); `skip` only
when the test itself was skipped, a skipped subtest is a `sub skip` line.
The `done` figures are unittest's own (subtests counted one by one).
"""

import os
import sys
import time
import unittest


def main():
    testdir, outdir = sys.argv[1], sys.argv[2]
    sys.dont_write_bytecode = True
    sys.path.insert(0, testdir)
    import main as suite  # noqa: PLC0415  (test/main.py)

    class Recorder(unittest.TextTestResult):
        log = None

        def _write(self, line):
            if Recorder.log is None:
                from mpi4py import MPI  # noqa: PLC0415  (imported by main.py)

                world = MPI.COMM_WORLD
                path = os.path.join(outdir, f"rank-{world.Get_rank()}.log")
                Recorder.log = open(path, "w", encoding="utf-8")  # noqa: SIM115
                Recorder.log.write(f"begin pid={os.getpid()} size={world.Get_size()}\n")
            Recorder.log.write(line + "\n")
            Recorder.log.flush()

        def startTestRun(self):
            super().startTestRun()
            self._current = None

        def startTest(self, test):
            super().startTest(test)
            self._current = test
            self._outcome_now = "pass"
            self._t0 = time.monotonic()
            self._write(f"start {test.id()}")

        def stopTest(self, test):
            super().stopTest(test)
            dt = time.monotonic() - self._t0
            self._write(f"end {self._outcome_now} {test.id()} {dt:.3f}")
            self._current = None

        def _set(self, test, outcome):
            rank = {"pass": 0, "skip": 1, "xfail": 2, "xpass": 3, "fail": 4, "error": 5}
            if test is self._current:
                if rank[outcome] > rank[self._outcome_now]:
                    self._outcome_now = outcome
            else:
                # setUpClass/setUpModule and friends: no startTest.
                self._write(f"fixture {outcome} {test.id()}")

        def addError(self, test, err):
            super().addError(test, err)
            self._set(test, "error")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._set(test, "fail")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            if isinstance(test, unittest.case._SubTest):  # noqa: SLF001
                self._write(f"sub skip {test.id()}")
            else:
                self._set(test, "skip")

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._set(test, "xfail")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._set(test, "xpass")

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                kind = "fail" if issubclass(err[0], test.failureException) else "error"
                self._write(f"sub {kind} {subtest.id()}")
                self._set(test, kind)

        def stopTestRun(self):
            super().stopTestRun()
            self._write(
                f"done run={self.testsRun} failures={len(self.failures)} "
                f"errors={len(self.errors)} skipped={len(self.skipped)} "
                f"xfail={len(self.expectedFailures)} "
                f"xpass={len(self.unexpectedSuccesses)} "
                f"success={int(self.wasSuccessful())}"
            )

    class Runner(unittest.TextTestRunner):
        resultclass = Recorder

    sys.argv = [os.path.join(testdir, "main.py"), *sys.argv[3:]]
    suite.main(module=None, testRunner=Runner)


if __name__ == "__main__":
    main()
