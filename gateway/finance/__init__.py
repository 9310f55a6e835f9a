"""The figures and documents finance reads: the cost report's rows and totals and the ledger export's pages
(``reports``), monthly statements and their CSV, workbook and printable page, built from the data and closed
(``statements``; the closes' table and arithmetic are gateway.ledger.closes), the finance page drawn as HTML
(``page``, ``gpu_page``), what the GPUs cost (``gpu``: the attribution; ``gpu_costs``: the report as read from the
shared store, and the Prometheus gauges), the cheapest configuration (``sizing``), and the report thread every
build runs on, one at a time, into a spooled body (``heavy``). How finance is shown its figures: money and periods
(``money``, in the policy's currency), keys by name (``labels``), the words in English or Korean (``words``).

No HTTP here: the edge (gateway.http: reports, statements, gpu_reports, reports_page) parses the request, guards
it, hands the build to ``heavy.build`` and answers with what comes back. This package may import the ledger,
gateway.ops (metrics, the scaling rules), the policy and the shared leaves (errors); it never imports
gateway.http nor a web framework (no Starlette: tests/process/test_imports.py). Imported by the edge, and by the
runtime for the GPU gauges.
"""
