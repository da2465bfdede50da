"""moto's fork server: one warm Python process that forks a moto_server per test.

A fresh moto_server costs about 3 s of CPU before it answers its first EC2
call: 0.7 s to import the server, 1.7 s to import moto's EC2 models, 0.7 s
to build the us-east-1 backends. The integration suite starts a few hundred,
and on two cores that CPU was the largest share of the suite's time. This
server pays it once: it imports moto and builds the backends the tests use,
then forks a child per request. A child starts with that state, exactly what
a fresh moto_server builds at its first calls, and answers within
milliseconds.

Written next to its socket and run by ccm-testkit (src/moto/fork.rs) with
the interpreter of moto_server:

    python aws-ccm-moto-<hash>.py SOCKET IDLE_SECONDS

A test connects to SOCKET and sends one JSON line:
    {"args": [moto_server arguments], "env": {the environment}, "log": PATH}
The server forks, answers {"pid": N} and closes its copy of the connection.
The child leads its own session, appends its stdout and stderr to PATH,
takes "env" as its environment and runs moto.server.main(args). Its copy of
the connection is its lifeline: when the test's end closes (drop, exit,
SIGKILL) it kills its process group, as the shell launcher's watchdog does
for a moto_server started directly. The server itself leaves after
IDLE_SECONDS without a request.
"""

import json
import os
import signal
import socket
import sys
import threading
import traceback

# What the tests call: EC2, both load balancer APIs, STS, IAM (the CCM's
# permission check), ECR (the credential provider).
WARM_SERVICES = ("ec2", "elb", "elbv2", "sts", "iam", "ecr")


def warm():
    """Imports the server and the services' models and builds each
    service's default-account backend, as the first call would."""
    import moto.server  # noqa: F401
    from moto.moto_server.werkzeug_app import create_backend_app

    for service in WARM_SERVICES:
        create_backend_app(service)


def read_line(conn):
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the test closed the connection before its request")
        data += chunk
    return data


def watch_lifeline(conn):
    """Kills the child's process group once the test's end closes."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os.killpg(0, signal.SIGKILL)


def run_child(conn, listener, request):
    listener.close()
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    sys.stdout.reconfigure(write_through=True)
    sys.stderr.reconfigure(write_through=True)
    os.environ.clear()
    os.environ.update(request["env"])
    print(f"moto-launcher: moto_server pid {os.getpid()}", file=sys.stderr)
    threading.Thread(target=watch_lifeline, args=(conn,), daemon=True).start()
    from moto.server import main

    status = 0
    try:
        main(request["args"])
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:
        traceback.print_exc()
        status = 1
    print(f"moto-launcher: moto_server exited with status {status}", file=sys.stderr)
    os._exit(status)


def handle(conn, listener):
    conn.settimeout(10)
    try:
        request = json.loads(read_line(conn))
    except (OSError, ValueError) as err:
        print(f"moto fork server: a bad request: {err}", file=sys.stderr)
        conn.close()
        return
    conn.settimeout(None)
    pid = os.fork()
    if pid == 0:
        try:
            run_child(conn, listener, request)
        finally:
            os._exit(1)
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        pass  # The test is gone: its child sees the lifeline closed.
    conn.close()


def main():
    path, idle = sys.argv[1], float(sys.argv[2])
    # Detach: the test that started this reaps the first process at once.
    if os.fork():
        os._exit(0)
    os.setsid()
    warm()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound = f"{path}.{os.getpid()}"
    listener.bind(bound)
    listener.listen(128)
    inode = os.stat(bound).st_ino
    # Bound and warm before it appears under its name: a test that can
    # connect is served at once.
    os.rename(bound, path)
    # Children are nobody's to wait for: the kernel reaps them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print(f"moto fork server {os.getpid()} serving on {path}", file=sys.stderr)
    listener.settimeout(idle)
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            break
        handle(conn, listener)
    # Leaving: take the name away first (unless a newer server holds it),
    # so new tests start another, then serve whoever already connected.
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            break
        conn.setblocking(True)
        handle(conn, listener)
    print(f"moto fork server {os.getpid()} idle for {idle} s: leaving", file=sys.stderr)


if __name__ == "__main__":
    main()
