"""What operators read: metrics, the JSON log, tracing (OpenTelemetry), the scaling signal, the heap setting,
``tollgate diagnose``. Imports only shared leaves (context, policy, the fleet's worker model)."""
