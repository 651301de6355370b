"""The state file: round trips, corrupt content restarts the baseline, I/O failures are errors."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from conftest import load_states, save_states
from stallprobe import Sample, State, StateFileError, statefile
from stallprobe.judge import Memory
from stallprobe.statefile import FORMAT, default_path, load, read_boot_id, save

BOOT = "0b7a1f9e-1111-2222-3333-444455556666"
STATE = State(Sample(21, 9.5e6, 3675428, 1234.5678, 99), stall_since=1000.25)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    path = str(tmp_path / "s.state")
    save_states(path, {"0": STATE}, BOOT)
    assert load_states(path, BOOT) == ({"0": STATE}, "")
    text = Path(path).read_text()
    assert text.startswith(FORMAT + "\n")
    assert f"boot_id {BOOT}\n" in text


def test_round_trip_of_several_engines_with_signals_and_odd_names(tmp_path: Path) -> None:
    path = str(tmp_path / "s.state")
    states = {
        "": State(Sample(1, 2, 3, 4.5, signals={"vllm:kv_cache_usage_perc": 0.1 + 0.2})),
        "0": STATE,
        "dp rank 1 %\n\u00e9": State(Sample(0, 7, 8, 9), stall_since=None),
    }
    save_states(path, states, BOOT)
    assert load_states(path, BOOT) == (states, "")
    text = Path(path).read_text()
    assert "engine dp%20rank%201%20%25%0A%C3%A9\n" in text
    assert "signal vllm:kv_cache_usage_perc 0.30000000000000004\n" in text


def test_round_trip_without_a_stall_clock(tmp_path: Path) -> None:
    path = str(tmp_path / "s.state")
    state = State(Sample(0, 0, 0, 0.1))
    save_states(path, {"0": state}, "")
    assert load_states(path, "") == ({"0": state}, "")


def test_round_trip_of_a_pause_a_pending_request_an_unanswered_page_and_facts(tmp_path: Path) -> None:
    path = str(tmp_path / "s.state")
    states = {
        "0": State(Sample(4, 5, 6, 30, paused="asleep (level 1): weights offloaded"), paused_since=12.5),
        "1": State(Sample(0, 5, 6, 30, pending=1), stall_since=20),
        "2": State(Sample(0, 0, 0, 30, answered=False), stall_since=30),
    }
    save_states(path, states, BOOT, {"canary_at": 29.75})
    facts: dict[str, float] = {}
    assert load_states(path, BOOT, facts) == (states, "")
    assert facts == {"canary_at": 29.75}
    text = Path(path).read_text()
    assert "fact canary_at 29.75\n" in text
    assert "paused asleep%20%28level%201%29:%20weights%20offloaded\n" in text
    assert "answered 0\n" in text
    assert load_states(path, BOOT) == (states, "")  # facts are only read when asked for


def test_missing_file_is_a_first_run(tmp_path: Path) -> None:
    assert load_states(str(tmp_path / "absent"), BOOT) == (None, "")
    assert load(str(tmp_path / "absent"), BOOT) == (Memory(), "")


def test_round_trip_of_the_judges_whole_memory(tmp_path: Path) -> None:
    """The dialect that read the page, what each kind of run last said, the page's facts, the engines."""
    path = str(tmp_path / "s.state")
    memory = Memory(
        {"0": STATE},
        dialect="vllm",
        facts={"canary_at": 29.75, "health_silent_since": 12.0, "evidence_written": 1.0},
        said={"liveness": "stalled", "readiness": "not ready"},
    )
    save(path, memory, BOOT)
    assert load(path, BOOT) == (memory, "")
    text = Path(path).read_text()
    assert "dialect vllm\n" in text
    assert "said readiness not%20ready\n" in text
    # A run that could not read the page remembers what it said, and no engine.
    bare = Memory(said={"liveness": "unjudged"})
    save(path, bare, BOOT)
    assert load(path, BOOT) == (bare, "")
    assert load(path, BOOT)[0].states is None


def test_a_file_of_version_3_still_reads(tmp_path: Path) -> None:
    """What the release before wrote: no dialect, nothing said. An upgrade keeps the stall clock."""
    path = tmp_path / "s.state"
    path.write_text(
        f"stallprobe-state 3\nboot_id {BOOT}\nfact canary_at 2.5\nengine 0\nrunning 21.0\ngeneration 9500000.0\n"
        "prompt 3675428.0\nt 1234.5678\nwaiting 99.0\npending 0.0\nowed 0.0\nstall_since 1000.25\n"
        "paused_since none\nanswered 1\n"
    )
    assert load(str(path), BOOT) == (Memory({"0": STATE}, facts={"canary_at": 2.5}), "")


# (name, file content, words the reason must contain)
HEAD = FORMAT.encode() + b"\nboot_id " + BOOT.encode() + b"\n"
CORRUPT: list[tuple[str, bytes, str]] = [
    ("empty", b"", "not a stallprobe state"),
    ("garbage", b"\x00\xff\x00garbage", "not text"),
    ("json", b'{"running": 1}', "not a stallprobe state"),
    ("older_version", b"stallprobe-state 1\nboot_id x\nrunning 1.0\n", "unknown version '1'"),
    ("newer_version", b"stallprobe-state 99\nboot_id x\n", "unknown version '99'"),
    ("no_boot_id", FORMAT.encode() + b"\nengine 0\n", "no boot id"),
    ("field_before_engine", HEAD + b"running 4.0\n", "field outside an engine"),
    ("truncated", HEAD + b"engine 0\nrunning 4.0\ngeneration 9", "invalid"),
    ("bad_number", HEAD + b"engine 0\nrunning many\n", "bad line 'running many'"),
    ("bad_signal", HEAD + b"engine 0\nsignal x\n", "bad line"),
    ("bad_escape", HEAD + b"engine %zz\n", "bad line"),
    ("unknown_field", HEAD + b"engine 0\nsignals 1\nsignal a 2\n", "unknown field 'signals'"),
    ("fact_after_engine", HEAD + b"engine 0\nfact canary_at 1\n", "unknown field 'fact'"),
    ("bad_fact", HEAD + b"fact canary_at soon\nengine 0\n", "bad line"),
    ("bad_answered", HEAD + b"engine 0\nanswered yes\n", "unknown field 'answered'"),
    (
        "pause_without_since",
        HEAD + b"engine 0\nrunning 1\ngeneration 1\nprompt 1\nt 1\nwaiting 0\npaused x\n",
        "invalid",
    ),
    ("nan", HEAD + b"engine 0\nrunning nan\ngeneration 1\nprompt 1\nt 1\nwaiting 0\n", "invalid"),
    ("other_boot", FORMAT.encode() + b"\nboot_id another\nengine 0\n", "another boot"),
    ("huge", b"x" * 100_000, "too large"),
]


@pytest.mark.parametrize(("content", "reason"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_corrupt_content_restarts_the_baseline(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "s.state"
    path.write_bytes(content)
    state, why = load_states(str(path), BOOT)
    assert state is None
    assert reason in why


def test_corrupt_table_is_not_empty() -> None:
    assert CORRUPT


def test_state_of_another_boot_is_not_used(tmp_path: Path) -> None:
    path = str(tmp_path / "s.state")
    save_states(path, {"0": STATE}, "boot-a")
    assert load_states(path, "boot-b") == (None, "state file is from another boot")


def test_symlink_is_not_followed_on_read_nor_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "s.state"
    link.symlink_to(victim)
    assert load_states(str(link), BOOT) == (None, "state file is a symlink (not followed)")
    save_states(str(link), {"0": STATE}, BOOT)
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink()
    assert load_states(str(link), BOOT) == ({"0": STATE}, "")


def test_directory_in_the_way_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "s.state"
    path.mkdir()
    with pytest.raises(StateFileError, match=r"cannot be read.*emptyDir"):
        load_states(str(path), BOOT)
    with pytest.raises(StateFileError, match="cannot be written"):
        save_states(str(path), {"0": STATE}, BOOT)


def test_unwritable_folder_is_an_error_and_leaves_no_temporary(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.raises(StateFileError, match=r"cannot be written: Not a directory; mount an emptyDir at /tmp"):
        save_states(str(blocker / "s.state"), {"0": STATE}, BOOT)
    with pytest.raises(StateFileError, match="No such file"):
        save_states(str(tmp_path / "missing" / "s.state"), {"0": STATE}, BOOT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-folder"]


def test_failed_replace_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "s.state"
    target.mkdir()
    (target / "keep").write_text("")  # a non-empty directory cannot be replaced by a file
    with pytest.raises(StateFileError):
        save_states(str(target), {"0": STATE}, BOOT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.state"]


def test_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "s.state"
    save_states(str(path), {"0": STATE}, BOOT)
    assert path.stat().st_mode & 0o777 == 0o600


def test_default_path_is_per_url_in_tmpdir() -> None:
    env = {"TMPDIR": "/scratch"}
    a = default_path("http://127.0.0.1:8000/metrics", env)
    b = default_path("http://127.0.0.1:8001/metrics", env)
    assert a.startswith("/scratch/stallprobe-127.0.0.1_8000_metrics-")
    assert a.endswith(".state")
    assert a != b
    # Characters that fold to "_" must not make two URLs share a file.
    assert default_path("http://h/a_b", env) != default_path("http://h/a-b", env) != default_path("http://h/a/b", env)
    assert default_path("http://h/x", {}).startswith("/tmp/stallprobe-h_x-")
    assert os.path.dirname(default_path("http://h/" + "x" * 500, {})) == "/tmp"
    assert len(os.path.basename(default_path("http://h/" + "x" * 500, {}))) < 120


def test_boot_id_is_read_where_the_kernel_has_one() -> None:
    """Linux, where the probe and its tests run, says which boot this is."""
    boot = read_boot_id()
    assert len(boot) == 36
    assert boot == read_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_no_boot_id_where_the_kernel_has_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(statefile, "_BOOT_ID_PATH", str(tmp_path / "no-boot-id"))
    assert read_boot_id() == ""


def test_a_device_at_the_path_is_never_replaced(tmp_path: Path) -> None:
    """--state-file /dev/null would replace the machine's /dev/null with a file: refused, the node kept. (A
    twin of /dev/null made here, where the tests run as root, as CI does; never the machine's own.)"""
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with pytest.raises(
        StateFileError, match=f"^state file {null} is a device, not a file; point --state-file at a file$"
    ):
        save_states(str(null), {"0": State(Sample(1, 2, 3, 4))}, "boot")
    assert stat.S_ISCHR(null.lstat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temporary file left behind


def test_round_trip_of_the_finished_and_preempted_counts_and_the_mark(tmp_path: Path) -> None:
    path = str(tmp_path / "s.state")
    mark = Sample(0, 29, 116760, 60.0, finished=100, preemptions=None)
    states = {
        "0": State(Sample(4, 58, 233520, 120.0, 487, finished=100, preemptions=0), mark=mark),
        "1": State(Sample(4, 1, 2, 120.0, finished=None, preemptions=3)),
    }
    save_states(path, states, BOOT)
    assert load_states(path, BOOT) == (states, "")
    text = Path(path).read_text()
    assert "mark 60.0 116760.0 29.0 100.0 none\n" in text
    assert "finished 100.0\npreemptions 0.0\n" in text
    broken = text.replace("mark 60.0 116760.0 29.0 100.0 none", "mark 60.0 none 29.0 100.0 none")
    Path(path).write_text(broken)
    assert load_states(path, BOOT)[0] is None
