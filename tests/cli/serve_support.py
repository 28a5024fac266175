"""granule-cli serve for the Python serve tests: started on a free port, stopped after."""

import contextlib
import re
import subprocess


def start_serve(cli, model, *options, stderr=subprocess.PIPE):
    """Starts `cli serve model --port 0 --device cpu *options`; returns (process, port).

    Raises AssertionError (the tests' failure), the process killed, when serve does not report
    its port.
    """
    proc = subprocess.Popen([cli, "serve", model, "--port", "0", "--device", "cpu", *options],
                            stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
    if not match:
        proc.kill()
        said = proc.stderr.read()[:500] if proc.stderr else ""
        proc.wait()
        raise AssertionError(f"serve did not report its port: {line!r} {said}")
    return proc, int(match.group(1))


def stop_serve(proc, on_hang=None):
    """SIGTERM, then SIGKILL after 20 s (on_hang(proc) first, if given); True when SIGTERM did."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
        return True
    except subprocess.TimeoutExpired:
        if on_hang:
            on_hang(proc)
        proc.kill()
        proc.wait()
        return False


@contextlib.contextmanager
def granule_serve(cli, model, *options, stderr=subprocess.PIPE):
    """start_serve as a context: yields the port; stops the server after."""
    proc, port = start_serve(cli, model, *options, stderr=stderr)
    try:
        yield port
    finally:
        stop_serve(proc)
