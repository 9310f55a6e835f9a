"""Month closes on the ledger replicas share (tests/inprocess/ledger/test_closes.py's tests of each store): PostgreSQL,
this machine's, fresh from pg_dsn."""

from __future__ import annotations

from tests.inprocess.ledger.test_closes import (
    test_a_close_racing_a_reopen_of_the_month_before_is_withdrawn,
    test_a_closed_month_never_changes_and_late_records_are_carried_once,
    test_a_first_close_names_a_month_the_ledger_holds,
    test_the_latest_close_reopens_and_the_month_closes_again,
    test_two_closes_racing_leave_one_chain,
)

__all__ = [  # collected here, on this folder's ledger (conftest.py)
    "test_a_close_racing_a_reopen_of_the_month_before_is_withdrawn",
    "test_a_closed_month_never_changes_and_late_records_are_carried_once",
    "test_a_first_close_names_a_month_the_ledger_holds",
    "test_the_latest_close_reopens_and_the_month_closes_again",
    "test_two_closes_racing_leave_one_chain",
]

