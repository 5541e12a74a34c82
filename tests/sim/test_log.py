"""The log reader: real logs parse; a malformed line is rejected with its line number and the reason."""

from __future__ import annotations

import io
import json
import pathlib

import pytest

from torch_dtr.sim import log

LOGS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "dtr-logs"
SHARED = sorted(LOGS.glob("*.log"))


def _lines(*objs) -> list[str]:
    return [json.dumps(o) for o in objs]


CALL = {"INSTRUCTION": "CALL", "NAME": "relu", "ARGS": ["a"], "RESULT": ["b"], "TIME": "10"}
CONST = [{"INSTRUCTION": "CONSTANT", "NAME": "a"}, {"INSTRUCTION": "MEMORY", "NAME": "a", "MEMORY": "8"}]
MEM_B = {"INSTRUCTION": "MEMORY", "NAME": "b", "MEMORY": "8"}
ALIAS_B = {"INSTRUCTION": "ALIAS", "NAME": "b", "ALIAS": "-1"}


def test_minimal_log_folds_memory_and_alias_lines():
    lg = log.parse(_lines({"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"}, *CONST, CALL, MEM_B, ALIAS_B,
                          {"INSTRUCTION": "ANNOTATE", "ANNOTATION": "BACKWARD"},
                          {"INSTRUCTION": "MUTATE", "NAME": "add_", "ARGS": ["b", "a"], "MUTATE": [0], "TIME": "5"},
                          {"INSTRUCTION": "COPY", "DST": "c", "SRC": "b"},
                          {"INSTRUCTION": "COPY_FROM", "DST": "c", "SRC": "a"},
                          {"INSTRUCTION": "RELEASE", "NAME": "b"}))
    assert lg.instrs == (
        log.Constant("a", 8),
        log.Call("relu", ("a",), (log.Result("b", 8, -1),), 10),
        log.Mutate("add_", ("b", "a"), (0,), 5),
        log.Copy("c", "b"),
        log.Copy("c", "a", rebind=True),
        log.Release("b"),
    )
    assert (lg.start, lg.backward) == (0, 2)
    assert lg.op_count() == 2 and lg.op_time_ns() == 15


@pytest.mark.parametrize("bad,line,words", [
    (["{not json"], 1, "not JSON"),
    ([json.dumps([1, 2])], 1, "INSTRUCTION"),
    (_lines({"INSTRUCTION": "JUMP"}), 1, "unknown INSTRUCTION 'JUMP'"),
    (_lines(*CONST, MEM_B), 3, "does not follow a CALL"),
    (_lines(*CONST, CALL, MEM_B, {"INSTRUCTION": "RELEASE", "NAME": "a"}), 5, "before ALIAS of 'b'"),
    (_lines(*CONST, CALL, MEM_B, dict(ALIAS_B, ALIAS="3")), 5, "not an argument index"),
    (_lines(*CONST, CALL, dict(MEM_B, MEMORY="-4")), 4, "MEMORY of 'b' must be >= 0"),
    (_lines(*CONST, dict(CALL, TIME="fast")), 3, "TIME must be an integer"),
    (_lines(*CONST, dict(CALL, ARGS="a")), 3, "'ARGS' as a list of tensor names"),
    (_lines({"INSTRUCTION": "MUTATE", "NAME": "add_", "ARGS": ["a"], "MUTATE": [1], "TIME": "1"}), 1,
     "argument indices below 1"),
    (_lines({"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"}, *CONST,
            {"INSTRUCTION": "ANNOTATE", "ANNOTATION": "START"}), 4, "second START"),
    (_lines({"INSTRUCTION": "ANNOTATE", "ANNOTATION": "MIDDLE"}), 1, "ANNOTATION must be"),
])
def test_malformed_line_names_line_and_reason(bad, line, words):
    with pytest.raises(log.LogError) as e:
        log.parse(bad, "t.log")
    assert f"t.log:{line}:" in str(e.value)
    assert words in str(e.value)


def test_truncated_log_is_rejected():
    with pytest.raises(log.LogError, match="ends before the MEMORY/ALIAS lines of line 3"):
        log.parse(_lines(*CONST, CALL, MEM_B), "t.log")


def test_writer_round_trips():
    buf = io.StringIO()
    w = log.Writer(buf)
    w.annotate("START")
    w.constant("a", 8)
    w.call("mm", ["a", "a"], [log.Result("b", 16, -1), log.Result("c", 0, 1)], 123, EXTRA="ignored")
    w.annotate("BACKWARD")
    w.mutate("add_", ["b", "a"], [0], 7)
    w.copy("d", "b")
    w.release("b")
    lg = log.parse(buf.getvalue().splitlines())
    assert lg.instrs == (log.Constant("a", 8), log.Call("mm", ("a", "a"), (log.Result("b", 16, -1),
                         log.Result("c", 0, 1)), 123), log.Mutate("add_", ("b", "a"), (0,), 7),
                         log.Copy("d", "b"), log.Release("b"))
    assert lg.backward == 2


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no log file"):
        log.read(tmp_path / "nope.log")


@pytest.mark.skipif(not SHARED, reason="shared DTR logs not beside the checkout")
@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.stem)
def test_shared_logs_parse(path):
    lg = log.read(path)
    calls = sum(1 for i in lg.instrs if type(i) is log.Call)
    assert calls > 200 and lg.backward is not None and lg.start == 0
