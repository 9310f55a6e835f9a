"""A statement's cost centres bounded, and the store's streamed sums (tests/inprocess/ledger/test_centres.py), over
the ledger replicas share: PostgreSQL, this machine's."""

from __future__ import annotations

from tests.inprocess.ledger.test_centres import (
    test_a_reader_of_a_few_columns_gets_those_with_time_and_id,
    test_a_statement_with_folded_cost_centres_reconciles_and_their_gpu_cost_goes_with_them,
    test_each_tenant_keeps_its_top_cost_centres_and_sums_the_rest_into_one_line,
    test_streamed_sums_are_the_stores_sums_in_its_order,
)

__all__ = [  # collected here, on this folder's ledger (conftest.py)
    "test_a_reader_of_a_few_columns_gets_those_with_time_and_id",
    "test_a_statement_with_folded_cost_centres_reconciles_and_their_gpu_cost_goes_with_them",
    "test_each_tenant_keeps_its_top_cost_centres_and_sums_the_rest_into_one_line",
    "test_streamed_sums_are_the_stores_sums_in_its_order",
]

