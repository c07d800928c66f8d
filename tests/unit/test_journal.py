"""The durable state's journal: a base folded with the changes written after it is the last state
written, exactly (content and order), whatever changed between writes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from fairgate.core import journal
from fairgate.core.journal import JournalWriter

names = st.sampled_from([f"t{i}" for i in range(8)])
numbers = st.one_of(st.integers(-5, 5), st.floats(-1e6, 1e6, allow_nan=False))


@st.composite
def states(draw: st.DrawFn) -> dict:
    """A durable-state-like object: rows by name, rows by id, a mapping, and plain fields."""
    tenants = draw(st.lists(names, unique=True, max_size=6))
    charged = draw(st.lists(names, unique=True, max_size=6))
    state = {
        "tenants": [{"name": n, "counter": draw(numbers)} for n in tenants],
        "charged": [[rid, draw(numbers), [["root", 1.0]]] for rid in charged],
        "usage": {n: [draw(numbers), 0] for n in draw(st.lists(names, unique=True, max_size=4))},
        "next_seq": draw(st.integers(0, 100)),
        "waiting": sorted(draw(st.lists(names, unique=True, max_size=3))),
    }
    if draw(st.booleans()):
        state["saved_at"] = draw(numbers)
    return state


@given(st.lists(states(), min_size=1, max_size=12), st.integers(64, 2048))
def test_a_base_folded_with_its_changes_is_the_last_state_written(sequence, threshold):
    writer = JournalWriter(min_journal_bytes=threshold)
    stored: list[dict] = []
    for state in sequence:
        write = writer.next(state)
        if write is None:
            assert json.loads(json.dumps(state)) == journal.fold(*stored)
            continue
        is_base, encoded = write
        stored = [json.loads(encoded)] if is_base else [*stored, json.loads(encoded)]
        writer.wrote()
        folded = journal.fold(*stored)
        assert folded == json.loads(json.dumps(state))
        for field in ("tenants", "charged", "usage"):  # the order of rows, not only their set
            assert list(folded[field]) == list(json.loads(json.dumps(state))[field])


def test_unchanged_rows_are_not_written_again():
    rows = [{"name": f"t{i}", "counter": float(i)} for i in range(100)]
    before = {"tenants": rows, "next_seq": 1}
    after = {"tenants": [*rows[:99], {"name": "t99", "counter": 1.5}], "next_seq": 2}
    change = journal.changes(before, after)
    t99 = {"name": "t99", "counter": 1.5}
    assert change == {"put": {"next_seq": 2}, "rows": {"tenants": ["name", {"t99": t99}, []]}}
    assert journal.changes(after, after) is None


def test_a_row_that_moved_writes_its_section_whole():
    before = {"tenants": [{"name": n, "counter": 0} for n in "abcd"]}
    after = {"tenants": [{"name": n, "counter": 0} for n in "bacd"]}
    assert journal.changes(before, after) == {"put": after}
    assert journal.fold(before, journal.changes(before, after)) == after


def test_a_failed_write_makes_the_next_one_a_base():
    writer = JournalWriter(min_journal_bytes=10_000)
    first = {"tenants": [{"name": f"t{i}", "counter": i} for i in range(10)]}
    assert writer.next(first)[0] is True
    writer.wrote()
    second = {"tenants": [*first["tenants"][:9], {"name": "t9", "counter": 99}]}
    assert writer.next(second)[0] is False
    writer.failed()
    assert writer.next(second)[0] is True


def test_changes_past_the_base_size_start_a_fresh_base():
    writer = JournalWriter(min_journal_bytes=0)
    state = {"tenants": [{"name": f"t{i}", "counter": 0} for i in range(20)]}
    kinds = []
    for n in range(40):
        state = {"tenants": [*state["tenants"][:19], {"name": "t19", "counter": n}]}
        write = writer.next(state)
        kinds.append(write[0])
        writer.wrote()
    assert kinds[0] is True and kinds.count(True) > 1 and kinds.count(False) > kinds.count(True)
