"""The router's worker control: a router that does not answer in time fails the step (it never
reads as "nothing to do"); a router that is not listening has nothing to take out."""

from __future__ import annotations

import socket
import threading
import time

from hostside import router_workers


def test_a_router_that_takes_the_call_but_never_answers_fails_within_the_timeout(capsys) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        accepted: list[socket.socket] = []
        threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
        start = time.monotonic()
        code = router_workers.main([
            "--router", f"http://127.0.0.1:{port}", "--label", "tiny/h/a", "add",
            "--worker", "http://127.0.0.1:1", "--timeout", "1",
        ])  # fmt: skip
        took = time.monotonic() - start
    assert code == 1
    assert took < 5
    err = capsys.readouterr().err
    assert "tiny/h/a: the router at http://127.0.0.1:" in err
    assert "did not answer the add in 1 s" in err


def test_a_router_not_listening_has_nothing_to_take_out(capsys) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    code = router_workers.main([
        "--router", f"http://127.0.0.1:{port}", "--label", "tiny/h/a", "remove",
        "--worker", "http://127.0.0.1:1",
    ])  # fmt: skip
    assert code == 0
    assert "does not answer" in capsys.readouterr().out
