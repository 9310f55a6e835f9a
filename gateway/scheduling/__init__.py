"""Premium, standard and batch queues in front of the workers: controller (admit/release, raising named
outcomes), queues (fairness inside a class, the per-pool counts), capacity learned from the engines. Imports
shared leaves (context, errors, policy, ops metrics, state) and the fleet's worker model; never upstream."""
