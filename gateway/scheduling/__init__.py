"""Premium, standard and batch queues in front of the workers: controller (admit/release, raising named
outcomes; it keeps each pool's queues and counts by pool name, as the pools tell it), flows (one per class and
tenant, and the fairness policy between them), queues (a pool's counts and their read-only view), capacity learned
from the engines. Imports shared leaves (context, errors, policy, ops metrics, state) and the fleet's worker model;
never upstream. Why, with figures: docs/decisions/003-scheduler-fairness.md."""
