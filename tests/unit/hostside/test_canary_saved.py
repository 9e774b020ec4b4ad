"""The canary's keeper of previous configurations, on real files (the rollback's systemd part
runs in tests/e2e/test_endpoints_e2e.py)."""

from __future__ import annotations

from pathlib import Path

from hostside import canary_saved


def _files(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    live, saved = tmp_path / "vllm-a.service", tmp_path / "previous-vllm-a.service"
    return live, saved, ["--restore", f"{live}={saved}"]


def test_kept_copies_outlive_the_restart_and_go_back_in_place(tmp_path: Path) -> None:
    live, saved, pairs = _files(tmp_path)
    saved.write_text("old unit\n")
    live.write_text("new unit\n")
    assert canary_saved.main(["keep", *pairs]) == 0
    saved.unlink()  # what restart-or-restore does once the new configuration started
    assert canary_saved.put_back([[str(live), str(saved)]]) == 1
    assert live.read_text() == "old unit\n"
    assert not Path(f"{saved}.canary").exists()


def test_forget_removes_the_kept_copies(tmp_path: Path) -> None:
    _, saved, pairs = _files(tmp_path)
    saved.write_text("old unit\n")
    canary_saved.main(["keep", *pairs])
    assert Path(f"{saved}.canary").exists()
    assert canary_saved.main(["forget", *pairs]) == 0
    assert not Path(f"{saved}.canary").exists()
    assert canary_saved.main(["forget", *pairs]) == 0  # nothing left: still fine


def test_a_rollback_with_nothing_kept_says_so_and_touches_nothing(tmp_path: Path, capsys) -> None:
    live, _, pairs = _files(tmp_path)
    live.write_text("new unit\n")
    args = ["rollback", "--label", "t/a/x", "--unit", "vllm-a.service",
            "--url", "http://127.0.0.1:1", "--model", "tiny",
            "--env-file", str(tmp_path / "env"), *pairs]  # fmt: skip
    assert canary_saved.main(args) == 2
    assert live.read_text() == "new unit\n"
    assert "nothing kept to roll back to" in capsys.readouterr().out
