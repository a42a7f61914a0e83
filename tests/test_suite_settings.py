"""The suite's own settings (pytest.ini): what a reader of its log must not miss."""

import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_an_exception_in_a_finalizer_or_a_thread_fails_the_test_it_happened_in(tmp_path):
  """A KeyboardInterrupt raised in a finalizer (what a Ctrl-C landing there gives) and an exception that ends a
  thread each fail their own test by the repository's pytest.ini, named with the test; a test beside them
  passes. Without the filters both would pass, with a traceback in the warnings summary."""
  (tmp_path / "test_leaks.py").write_text(textwrap.dedent("""
      import gc, threading

      class Finalized:
        def __del__(self):
          raise KeyboardInterrupt("in a finalizer")

      def test_finalizer():
        Finalized()
        gc.collect()

      def test_thread():
        t = threading.Thread(target=lambda: 1 / 0)
        t.start()
        t.join()

      def test_quiet():
        pass
      """))
  done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                         "-c", str(REPO / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_leaks.py")],
                        capture_output=True, text=True, timeout=120, cwd=tmp_path,
                        env={**os.environ, "COLUMNS": "400"})  # the summary's lines whole
  assert done.returncode == 1, done.stdout[-3000:]
  assert "FAILED test_leaks.py::test_finalizer - pytest.PytestUnraisableExceptionWarning" in done.stdout
  assert "FAILED test_leaks.py::test_thread - pytest.PytestUnhandledThreadExceptionWarning" in done.stdout
  assert "2 failed, 1 passed" in done.stdout
