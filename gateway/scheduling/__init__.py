"""Premium, standard and batch queues in front of the workers: controller (admit/release), queues (fairness
inside a class), saturation (what a pool can start now, learned from vLLM's metrics)."""
