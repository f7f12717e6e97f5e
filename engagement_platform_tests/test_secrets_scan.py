"""The run's leak check finds a secret wherever a file holds it: in clear, hex-encoded, inside binary
content, across the border of two read chunks; and finds nothing in files that do not hold it."""

from engagement_platform_tests.support import secrets_scan
from engagement_platform_tests.support.secrets_scan import files_holding

SECRETS = {"KEY": "s3cr3t-value-123", "OTHER": "another-secret-456"}


def test_a_secret_is_found_in_clear_hex_and_binary_files_and_nowhere_else(tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "server.log").write_text("INFO starting\noptions={'key': 's3cr3t-value-123'}\n")
    (tmp_path / "plan.json").write_text('{"secret": "' + b"another-secret-456".hex() + '"}')
    (tmp_path / "events.db").write_bytes(b"\x00\x01SQLite" + b"s3cr3t-value-123" + b"\xff" * 10)
    (tmp_path / "clean.log").write_text("s3cr3t-value-12 and another-secret")
    monkeypatch.setattr(secrets_scan, "CHUNK", 16)  # so that the value crosses chunk borders
    (tmp_path / "long.bin").write_bytes(b"x" * 13 + b"s3cr3t-value-123" + b"y" * 40)
    hits, files, size = files_holding(SECRETS, [tmp_path, tmp_path / "missing"])
    assert sorted(hits) == sorted(
        [
            (str(tmp_path / "logs" / "server.log"), "KEY"),
            (str(tmp_path / "plan.json"), "OTHER"),
            (str(tmp_path / "events.db"), "KEY"),
            (str(tmp_path / "long.bin"), "KEY"),
        ]
    )
    assert files == 5 and size == sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
